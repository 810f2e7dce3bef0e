//! What the pod model needs of a request, built from an OpenAI body with prewarm-core's parser
//! and canonical prompt, so podsim's token counts agree with the filter's and the gateway's.

use prewarm_core::request::{parse_request, Endpoint, InferenceRequest, ParseError};

/// One inference request as the pod model sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// The `model` field: the base model's served name or an adapter (`base:adapter` on SGLang).
    pub model: String,
    /// The canonical prompt (`prewarm_core::canonical_prompt`); 4 bytes make a token.
    pub canonical_prompt: String,
    /// `max_tokens` (or `max_completion_tokens`); `None` takes the pod's default.
    pub max_tokens: Option<u64>,
}

impl RequestSpec {
    /// The spec of a parsed request.
    pub fn of(request: &InferenceRequest) -> Self {
        Self {
            model: request.model.clone(),
            canonical_prompt: prewarm_core::canonical_prompt(request),
            max_tokens: request.max_tokens,
        }
    }

    /// Parses an OpenAI body for `endpoint` (at most `limit` bytes) into the parsed request and
    /// its spec.
    pub fn from_body(
        endpoint: Endpoint,
        body: &[u8],
        limit: usize,
    ) -> Result<(InferenceRequest, Self), ParseError> {
        let request = parse_request(endpoint, body, limit)?;
        let spec = Self::of(&request);
        Ok((request, spec))
    }

    /// Prompt length in tokens (the 4-bytes-a-token stand-in).
    pub fn prompt_tokens(&self) -> usize {
        prewarm_core::tokens::token_count(self.canonical_prompt.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_of_a_chat_prefix_renders_the_same_bytes() {
        let (_, chat) = RequestSpec::from_body(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}]}"#,
            1 << 20,
        )
        .unwrap();
        let (_, prefill) = RequestSpec::from_body(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"<|system|>\nS\n","max_tokens":1}"#,
            1 << 20,
        )
        .unwrap();
        assert!(chat.canonical_prompt.starts_with(&prefill.canonical_prompt));
        assert_eq!(prefill.max_tokens, Some(1));
        assert_eq!(prefill.prompt_tokens(), 4); // 13 bytes
    }
}
