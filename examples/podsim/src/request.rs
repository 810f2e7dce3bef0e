//! What the pod model needs of a request, built from an OpenAI body as the engine's front end
//! builds it: prewarm-core's parser for the common fields; a completion's prompt as prewarm's
//! canonical prompt (so podsim's token counts agree with the filter's and the gateway's
//! fingerprints); a chat request's prompt as the served model's chat template renders it
//! ([`crate::chat`]); and the `cache_salt` that isolates its cached blocks.

use prewarm_core::request::{parse_request, Endpoint, InferenceRequest, ParseError};

use crate::chat::{cache_salt, render_chat, ChatError, ChatTemplate, EngineFields};
use crate::config::Engine;

/// One inference request as the pod model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// The `model` field: the base model's served name or an adapter (`base:adapter` on SGLang).
    pub model: String,
    /// The prompt the engine tokenizes; 4 bytes make a token. For a completion, prewarm-core's
    /// canonical prompt of its `prompt`; for a chat request, the rendered chat template (the
    /// field keeps its name for the pod model's other users, which feed completions).
    pub canonical_prompt: String,
    /// `max_tokens` (or `max_completion_tokens`); `None` takes the pod's default.
    pub max_tokens: Option<u64>,
}

/// A request ready for [`crate::Pod::submit_salted`].
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedRequest {
    pub request: InferenceRequest,
    pub spec: RequestSpec,
    /// The key that isolates the request's cached blocks (`cache_salt`; on SGLang with
    /// `extra_key` appended). A secret of the client: never logged.
    pub cache_salt: Option<String>,
}

/// Why a body did not become a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Chat(#[from] ChatError),
}

impl RequestSpec {
    /// The spec of a parsed request, its prompt rendered canonically (prewarm-core's
    /// `canonical_prompt`): what a completion's prompt is. Chat requests go through
    /// [`RequestSpec::prepare`] instead.
    pub fn of(request: &InferenceRequest) -> Self {
        Self {
            model: request.model.clone(),
            canonical_prompt: prewarm_core::canonical_prompt(request),
            max_tokens: request.max_tokens,
        }
    }

    /// Parses an OpenAI body for `endpoint` (at most `limit` bytes) as `engine` does: the cache
    /// salt checked, and a chat request's prompt rendered with `template`.
    pub fn prepare(
        endpoint: Endpoint,
        body: &[u8],
        limit: usize,
        template: &ChatTemplate,
        engine: Engine,
    ) -> Result<PreparedRequest, PrepareError> {
        let fields = if body.len() <= limit {
            EngineFields::of(body)
        } else {
            EngineFields::default()
        };
        let cache_salt = cache_salt(&fields, engine)?;
        let request = parse_request(endpoint, body, limit)?;
        let spec = match endpoint {
            Endpoint::ChatCompletions => Self {
                model: request.model.clone(),
                canonical_prompt: render_chat(template, &fields, engine)?,
                max_tokens: request.max_tokens,
            },
            _ => Self::of(&request),
        };
        Ok(PreparedRequest {
            request,
            spec,
            cache_salt,
        })
    }

    /// Prompt length in tokens (the 4-bytes-a-token stand-in).
    pub fn prompt_tokens(&self) -> usize {
        prewarm_core::tokens::token_count(self.canonical_prompt.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(endpoint: Endpoint, body: &str) -> PreparedRequest {
        RequestSpec::prepare(
            endpoint,
            body.as_bytes(),
            1 << 20,
            &ChatTemplate::builtin(),
            Engine::Vllm,
        )
        .unwrap()
    }

    #[test]
    fn a_completion_keeps_its_canonical_prompt() {
        let p = prepare(
            Endpoint::Completions,
            r#"{"model":"m","prompt":"<|system|>\nS\n","max_tokens":1,"cache_salt":"t"}"#,
        );
        assert_eq!(p.spec.canonical_prompt, "<|system|>\nS\n");
        assert_eq!(p.spec.max_tokens, Some(1));
        assert_eq!(p.spec.prompt_tokens(), 4); // 13 bytes
        assert_eq!(p.cache_salt.as_deref(), Some("t"));
    }

    #[test]
    fn a_chat_request_is_rendered_by_the_chat_template_not_canonically() {
        let p = prepare(
            Endpoint::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}"#,
        );
        assert_eq!(
            p.spec.canonical_prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
             Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_ne!(
            p.spec.canonical_prompt,
            prewarm_core::canonical_prompt(&p.request)
        );
    }

    #[test]
    fn an_oversized_body_is_refused_unread() {
        let err = RequestSpec::prepare(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[]}"#,
            4,
            &ChatTemplate::builtin(),
            Engine::Vllm,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            PrepareError::Parse(ParseError::TooLarge { .. })
        ));
    }
}
