//! Error replies, in vLLM's formats: nested `{"error": {message, type, param, code}}` (0.10.1 and
//! later, the default) or flat `{"object": "error", message, type, param, code}` (older, behind
//! `--error-format flat`). All error statuses leave the server through [`ApiError`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

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

    /// The reply in `format`.
    pub fn into_reply(self, format: ErrorFormat) -> Response {
        let code = self.status.as_u16();
        let body = match format {
            ErrorFormat::Nested => json!({"error": {
                "message": self.message, "type": self.kind, "param": self.param, "code": code}}),
            ErrorFormat::Flat => json!({"object": "error",
                "message": self.message, "type": self.kind, "param": self.param, "code": code}),
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::UnknownModel { .. } => Self {
                param: Some("model"),
                ..Self::not_found(e.to_string())
            },
            RequestError::InvalidMaxTokens { .. } => Self {
                param: Some("max_tokens"),
                ..Self::bad_request(e.to_string())
            },
            RequestError::ContextTooLong { .. } => Self::bad_request(e.to_string()),
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
