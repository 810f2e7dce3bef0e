//! Error replies, in vLLM's formats: nested `{"error": {message, type, param, code}}` (0.10.1 and
//! later, the default) or flat `{"object": "error", message, type, param, code}` (older, behind
//! `--error-format flat`). All error statuses leave the server through [`ApiError`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::chat::ChatError;
use crate::pod::{AdapterError, RequestError};

/// Which error body vLLM version to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ErrorFormat {
    /// `{"error": {"message", "type", "param", "code"}}` (vLLM ≥ 0.10.1).
    #[default]
    Nested,
    /// `{"object": "error", "message", "type", "param", "code"}` (older vLLM).
    Flat,
}

/// An error reply before formatting.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// vLLM's `type`: `BadRequestError`, `NotFoundError`, `InvalidUserInput`, ...
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: message.into(),
            param: None,
        }
    }

    /// FastAPI's request-validation reply (vLLM 0.32): type `Bad Request`, and for a field
    /// problem a `param` of `body.<field>`. Wrong content types and undecodable JSON get it too.
    pub fn validation(param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            kind: "Bad Request",
            param,
            ..Self::bad_request(message)
        }
    }

    /// A required body field that is absent, worded as pydantic reports it.
    pub fn missing_body_field(param: &'static str) -> Self {
        Self::validation(
            Some(param),
            format!("1 validation error:\n  {{'type': 'missing', 'loc': '{param}', 'msg': 'Field required'}}"),
        )
    }

    pub fn invalid_user_input(message: impl Into<String>) -> Self {
        Self {
            kind: "InvalidUserInput",
            ..Self::bad_request(message)
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "NotFoundError",
            message: message.into(),
            param: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "InternalServerError",
            message: message.into(),
            param: None,
        }
    }

    /// The reply in `format`. File paths under the system roots are replaced by `<path>`, as
    /// vLLM's error handler does (so a reply never shows where adapters live).
    pub fn into_reply(self, format: ErrorFormat) -> Response {
        let code = self.status.as_u16();
        let message = sanitize_paths(&self.message);
        let body = match format {
            ErrorFormat::Nested => json!({"error": {
                "message": message, "type": self.kind, "param": self.param, "code": code}}),
            ErrorFormat::Flat => json!({"object": "error",
                "message": message, "type": self.kind, "param": self.param, "code": code}),
        };
        (self.status, Json(body)).into_response()
    }
}

/// Roots whose paths vLLM's `sanitize_message` hides.
const SANITIZED_ROOTS: [&str; 9] = [
    "home", "usr", "opt", "var", "tmp", "root", "lib", "mnt", "srv",
];

fn is_path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Replaces every `/<root>/<component>[/<component>...]` (a root from [`SANITIZED_ROOTS`]) by
/// `<path>`, like vLLM's first sanitising pattern; other paths stay.
pub fn sanitize_paths(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(slash) = rest.find('/') {
        let (before, from_slash) = rest.split_at(slash);
        out.push_str(before);
        let after_root = SANITIZED_ROOTS.iter().find_map(|root| {
            let tail = from_slash.strip_prefix('/')?.strip_prefix(root)?;
            tail.strip_prefix('/')
                .filter(|t| t.starts_with(is_path_char))
                .map(|_| tail)
        });
        match after_root {
            Some(mut tail) => {
                // Consume `/component` runs.
                while let Some(t) = tail.strip_prefix('/') {
                    let end = t.find(|c: char| !is_path_char(c)).unwrap_or(t.len());
                    if end == 0 {
                        break;
                    }
                    tail = &t[end..];
                }
                out.push_str("<path>");
                rest = tail;
            }
            None => {
                out.push('/');
                rest = &from_slash[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::UnknownModel { .. } => Self {
                param: Some("model"),
                ..Self::not_found(e.to_string())
            },
            RequestError::InvalidMaxTokens { .. } | RequestError::MaxTokensOverModelLen { .. } => {
                Self {
                    param: Some("max_tokens"),
                    ..Self::bad_request(e.to_string())
                }
            }
            RequestError::PromptTooLong { .. } => Self {
                param: Some("input_tokens"),
                ..Self::bad_request(e.to_string())
            },
        }
    }
}

impl From<ChatError> for ApiError {
    /// vLLM answers template and flag errors with a plain `BadRequestError` (param null); a
    /// field of the wrong type gets FastAPI's validation reply naming it.
    fn from(e: ChatError) -> Self {
        match &e {
            ChatError::Field { field, .. } => {
                Self::validation(Some(field), format!("1 validation error:\n  {e}"))
            }
            ChatError::InvalidMessage { .. } => {
                Self::validation(Some("messages"), format!("1 validation error:\n  {e}"))
            }
            ChatError::EmptyTools => Self {
                param: Some("tools"),
                ..Self::bad_request(e.to_string())
            },
            ChatError::CacheSalt(_) => Self {
                param: Some("cache_salt"),
                ..Self::bad_request(e.to_string())
            },
            ChatError::BothGenerationFlags
            | ChatError::Template(_)
            | ChatError::ContinueFinalMessage(_)
            | ChatError::UnexpectedKwargs(_) => Self::bad_request(e.to_string()),
        }
    }
}

impl From<AdapterError> for ApiError {
    fn from(e: AdapterError) -> Self {
        match e {
            AdapterError::LoraDisabled | AdapterError::AlreadyLoaded { .. } => {
                Self::invalid_user_input(e.to_string())
            }
            AdapterError::NotFound { .. } => Self::not_found(e.to_string()),
            AdapterError::RankTooHigh { .. } | AdapterError::TooManyLoaded { .. } => {
                Self::internal(e.to_string())
            }
        }
    }
}

/// FastAPI's reply to a path no route serves.
pub async fn route_not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::sanitize_paths;

    #[test]
    fn paths_under_system_roots_are_hidden_as_vllm_does() {
        assert_eq!(
            sanitize_paths("Loading lora a failed: No adapter found for /tmp/x/adapters/a"),
            "Loading lora a failed: No adapter found for <path>"
        );
        assert_eq!(
            sanitize_paths("at /home/u/a-b.c/d, then"),
            "at <path>, then"
        );
        // Not a sanitised root, a root with no component, a root as a prefix of a name.
        assert_eq!(sanitize_paths("/no/such/dir"), "/no/such/dir");
        assert_eq!(sanitize_paths("/tmp/ and /tmpfoo/x"), "/tmp/ and /tmpfoo/x");
        assert_eq!(sanitize_paths("no slash é"), "no slash é");
    }
}
