//! The request model: what prewarm reads from an OpenAI-compatible inference body.
//!
//! Parses `/v1/completions` (`prompt` as a string, a list of strings, or token ids),
//! `/v1/chat/completions` (`messages`, content as a string or as parts; text parts count, other
//! parts are recorded as modalities) and `/v1/embeddings` (`input`). Unknown fields are ignored.
//! Bodies over the caller's limit are refused before any parsing, and nothing panics on any
//! input (serde_json bounds recursion; the property tests feed arbitrary bytes).

use serde::Deserialize;

/// The inference endpoints prewarm understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/embeddings`
    Embeddings,
}

impl Endpoint {
    /// The endpoint a request path names, ignoring any query string; `None` for other paths.
    pub fn from_path(path: &str) -> Option<Self> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        match path {
            "/v1/completions" => Some(Self::Completions),
            "/v1/chat/completions" => Some(Self::ChatCompletions),
            "/v1/embeddings" => Some(Self::Embeddings),
            _ => None,
        }
    }

    /// The path of this endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Self::Completions => "/v1/completions",
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Embeddings => "/v1/embeddings",
        }
    }
}

/// One chat message reduced to what prewarm fingerprints: its role and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    /// The message's text parts, joined by `\n`.
    pub text: String,
    /// Whether the content came as a list of parts rather than a string (a warm call repeats
    /// the form: a chat template may render the two differently).
    pub parts: bool,
}

/// A JSON value a request carried that prewarm does not read but must repeat (a chat request's
/// `tools`, its `chat_template_kwargs`), kept as its JSON text, byte for byte (key order
/// included: a template renders tools in the order they were sent). It travels as a JSON
/// string (a raw value cannot pass through an internally tagged enum such as a signal).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonText(pub String);

impl JsonText {
    /// The JSON text.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty (never, for a parsed value).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the text is one JSON value.
    pub fn is_json(&self) -> bool {
        serde_json::from_str::<serde::de::IgnoredAny>(&self.0).is_ok()
    }
}

/// What a request carries beyond its prompt that changes the tokens or the cache keys an engine
/// computes for it (`ENGINE-FACTS.md`, chat requests and the prefix cache): kept so a warm call
/// can repeat them, never part of the prefix's identity.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RequestExtras {
    /// Chat `tools` (rendered into the prompt by most chat templates).
    pub tools: Option<JsonText>,
    /// Chat `chat_template_kwargs` (template variables).
    pub chat_template_kwargs: Option<JsonText>,
    /// Chat `tool_choice`: vLLM refuses `tools` under its default (`auto`) unless the server
    /// runs with automatic tool choice, and SGLang renders only a named tool; a warm call
    /// repeats it so the engine accepts and renders the tools as it did for the traffic.
    pub tool_choice: Option<JsonText>,
    /// `cache_salt` (vLLM mixes it into the first block's hash). A secret of the client: never
    /// logged, counted by value or shown.
    pub cache_salt: Option<String>,
}

impl std::fmt::Debug for RequestExtras {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestExtras")
            .field("tools", &self.tools)
            .field("chat_template_kwargs", &self.chat_template_kwargs)
            .field("cache_salt", &crate::warm_shape::redacted(&self.cache_salt))
            .finish()
    }
}

impl RequestExtras {
    /// Whether the request carried none of them.
    pub fn is_empty(&self) -> bool {
        self.tools.is_none()
            && self.chat_template_kwargs.is_none()
            && self.tool_choice.is_none()
            && self.cache_salt.is_none()
    }
}

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Completions `prompt` or embeddings `input`: one entry per prompt of the batch. Token-id
    /// prompts are rendered as decimal ids separated by spaces.
    Texts(Vec<String>),
    /// Chat `messages`, in order.
    Chat(Vec<ChatMessage>),
}

/// What prewarm knows of one inference request.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest {
    pub endpoint: Endpoint,
    /// The `model` field: the base model, or the LoRA adapter name when the request targets one.
    pub model: String,
    pub stream: bool,
    /// `max_tokens`, or chat's `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// The body's `user` field.
    pub user: Option<String>,
    pub prompt: Prompt,
    /// `tools`, `chat_template_kwargs` and `cache_salt`, when present.
    pub extras: RequestExtras,
    /// Kinds of non-text content parts seen (`image_url`, `input_audio`, ...), each once, in
    /// order of first appearance; at most [`MAX_MODALITIES`].
    pub modalities: Vec<String>,
}

/// The most distinct modalities recorded for one request.
pub const MAX_MODALITIES: usize = 8;

/// Why a body was not parsed. The filter counts these as skips; the gateway answers them with a
/// 400 naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("body: {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("body: not valid JSON for {endpoint:?}: {message}")]
    Malformed { endpoint: Endpoint, message: String },
    #[error("{field}: missing")]
    MissingField { field: &'static str },
    #[error("{field}: {rule}")]
    InvalidField {
        field: &'static str,
        rule: &'static str,
    },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawPrompt {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct RawPart {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawContent {
    Text(String),
    Parts(Vec<RawPart>),
}

#[derive(Deserialize)]
struct RawMessage {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<RawContent>,
}

#[derive(Deserialize)]
struct RawBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    prompt: Option<RawPrompt>,
    #[serde(default)]
    input: Option<RawPrompt>,
    #[serde(default)]
    messages: Option<Vec<RawMessage>>,
    #[serde(default)]
    tools: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    chat_template_kwargs: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    tool_choice: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    cache_salt: Option<String>,
}

/// Parses an inference body for `endpoint`. Bodies longer than `limit` bytes are refused
/// without being read.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    limit: usize,
) -> Result<InferenceRequest, ParseError> {
    if body.len() > limit {
        return Err(ParseError::TooLarge {
            len: body.len(),
            limit,
        });
    }
    let raw: RawBody = serde_json::from_slice(body).map_err(|e| ParseError::Malformed {
        endpoint,
        message: e.to_string(),
    })?;
    let model = raw
        .model
        .ok_or(ParseError::MissingField { field: "model" })?;
    if model.is_empty() || model.len() > crate::wire::MAX_NAME_BYTES {
        return Err(ParseError::InvalidField {
            field: "model",
            rule: "must be 1 to 256 bytes (wire::MAX_NAME_BYTES)",
        });
    }
    let mut modalities = Vec::new();
    let prompt = match endpoint {
        Endpoint::Completions => Prompt::Texts(texts(
            raw.prompt
                .ok_or(ParseError::MissingField { field: "prompt" })?,
        )),
        Endpoint::Embeddings => Prompt::Texts(texts(
            raw.input
                .ok_or(ParseError::MissingField { field: "input" })?,
        )),
        Endpoint::ChatCompletions => {
            let messages = raw
                .messages
                .ok_or(ParseError::MissingField { field: "messages" })?;
            Prompt::Chat(
                messages
                    .into_iter()
                    .map(|m| chat_message(m, &mut modalities))
                    .collect(),
            )
        }
    };
    Ok(InferenceRequest {
        endpoint,
        model,
        stream: raw.stream.unwrap_or(false),
        max_tokens: raw.max_tokens.or(raw.max_completion_tokens),
        user: raw.user.filter(|u| !u.is_empty()),
        prompt,
        extras: RequestExtras {
            tools: raw.tools.map(|t| JsonText(t.get().to_string())),
            chat_template_kwargs: raw
                .chat_template_kwargs
                .map(|k| JsonText(k.get().to_string())),
            tool_choice: raw.tool_choice.map(|c| JsonText(c.get().to_string())),
            cache_salt: raw.cache_salt,
        },
        modalities,
    })
}

fn texts(raw: RawPrompt) -> Vec<String> {
    fn ids(tokens: &[u32]) -> String {
        let mut out = String::with_capacity(tokens.len().saturating_mul(6));
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&t.to_string());
        }
        out
    }
    match raw {
        RawPrompt::One(s) => vec![s],
        RawPrompt::Many(v) => v,
        RawPrompt::Tokens(t) => vec![ids(&t)],
        RawPrompt::TokenBatches(b) => b.iter().map(|t| ids(t)).collect(),
    }
}

fn chat_message(m: RawMessage, modalities: &mut Vec<String>) -> ChatMessage {
    let role = m.role.unwrap_or_default();
    let parts = matches!(m.content, Some(RawContent::Parts(_)));
    let text = match m.content {
        None => String::new(),
        Some(RawContent::Text(s)) => s,
        Some(RawContent::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_deref(), part.text) {
                    (Some("text") | None, Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&t);
                    }
                    (Some(kind), _) => {
                        if kind != "text"
                            && modalities.len() < MAX_MODALITIES
                            && !modalities.iter().any(|m| m == kind)
                        {
                            modalities.push(kind.to_string());
                        }
                    }
                    (None, None) => {}
                }
            }
            text
        }
    };
    ChatMessage { role, text, parts }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const LIMIT: usize = 1 << 20;

    #[test]
    fn endpoints_from_paths() {
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions?x=1"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/completions"),
            Some(Endpoint::Completions)
        );
        assert_eq!(
            Endpoint::from_path("/v1/embeddings"),
            Some(Endpoint::Embeddings)
        );
        assert_eq!(Endpoint::from_path("/v1/models"), None);
        assert_eq!(Endpoint::from_path("/v1/completions/x"), None);
    }

    #[test]
    fn parses_chat_with_parts_and_modalities() {
        let body = br#"{"model":"sql-lora","stream":true,"max_completion_tokens":7,"user":"u1",
            "messages":[{"role":"system","content":"You are terse."},
                        {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]},
                        {"role":"assistant","content":null,"tool_calls":[]}],
            "unknown_field":{"deep":[1,2,3]}}"#;
        let r = parse_request(Endpoint::ChatCompletions, body, LIMIT).unwrap();
        assert_eq!(r.model, "sql-lora");
        assert!(r.stream);
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.user.as_deref(), Some("u1"));
        assert_eq!(r.modalities, vec!["image_url".to_string()]);
        let Prompt::Chat(m) = r.prompt else {
            panic!("chat expected")
        };
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].text, "a\nb");
        assert!(m[1].parts && !m[0].parts);
        assert_eq!(m[2].text, "");
    }

    #[test]
    fn keeps_tools_kwargs_and_salt_as_sent() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"q"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
            "chat_template_kwargs":{"enable_thinking":false},"cache_salt":"s3cret"}"#;
        let r = parse_request(Endpoint::ChatCompletions, body, LIMIT).unwrap();
        assert_eq!(
            r.extras.tools.as_ref().map(JsonText::get),
            Some(r#"[{"type":"function","function":{"name":"f","parameters":{}}}]"#)
        );
        assert_eq!(
            r.extras.chat_template_kwargs.as_ref().map(JsonText::get),
            Some(r#"{"enable_thinking":false}"#)
        );
        assert_eq!(r.extras.cache_salt.as_deref(), Some("s3cret"));
        let Prompt::Chat(m) = r.prompt else {
            panic!("chat expected")
        };
        assert!(!m[0].parts);
        let plain = parse_request(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"x","tools":null}"#,
            LIMIT,
        )
        .unwrap();
        assert!(plain.extras.is_empty());
    }

    #[test]
    fn parses_completion_prompt_forms() {
        for (body, want) in [
            (r#"{"model":"m","prompt":"hi"}"#, vec!["hi"]),
            (r#"{"model":"m","prompt":["a","b"]}"#, vec!["a", "b"]),
            (r#"{"model":"m","prompt":[1,2,3]}"#, vec!["1 2 3"]),
            (r#"{"model":"m","prompt":[[1],[2,3]]}"#, vec!["1", "2 3"]),
        ] {
            let r = parse_request(Endpoint::Completions, body.as_bytes(), LIMIT).unwrap();
            assert_eq!(
                r.prompt,
                Prompt::Texts(want.into_iter().map(String::from).collect())
            );
        }
        let r =
            parse_request(Endpoint::Embeddings, br#"{"model":"e","input":"x"}"#, LIMIT).unwrap();
        assert_eq!(r.prompt, Prompt::Texts(vec!["x".into()]));
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_request(Endpoint::Completions, br#"{"prompt":"x"}"#, LIMIT).unwrap_err();
        assert_eq!(e.to_string(), "model: missing");
        let e = parse_request(Endpoint::ChatCompletions, br#"{"model":"m"}"#, LIMIT).unwrap_err();
        assert_eq!(e.to_string(), "messages: missing");
        let e = parse_request(
            Endpoint::Completions,
            br#"{"model":"","prompt":"x"}"#,
            LIMIT,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("model:"));
        let long = format!(r#"{{"model":"{}","prompt":"x"}}"#, "m".repeat(257));
        let e = parse_request(Endpoint::Completions, long.as_bytes(), LIMIT).unwrap_err();
        assert!(
            e.to_string().starts_with("model:"),
            "names above the cap: {e}"
        );
        let at_cap = format!(r#"{{"model":"{}","prompt":"x"}}"#, "m".repeat(256));
        assert!(parse_request(Endpoint::Completions, at_cap.as_bytes(), LIMIT).is_ok());
        let e = parse_request(Endpoint::Completions, b"{", LIMIT).unwrap_err();
        assert!(matches!(e, ParseError::Malformed { .. }));
        let e = parse_request(Endpoint::Completions, &[b' '; 11], 10).unwrap_err();
        assert_eq!(e, ParseError::TooLarge { len: 11, limit: 10 });
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut body = String::from(r#"{"model":"m","prompt":"x","extra":"#);
        body.push_str(&"[".repeat(100_000));
        let e = parse_request(Endpoint::Completions, body.as_bytes(), usize::MAX).unwrap_err();
        assert!(matches!(e, ParseError::Malformed { .. }));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            for e in [Endpoint::Completions, Endpoint::ChatCompletions, Endpoint::Embeddings] {
                let _ = parse_request(e, &body, LIMIT);
            }
        }

        #[test]
        fn never_panics_on_json_like_input(body in r#"\{("(model|prompt|messages|input|content|role|type|text)"|[:,\[\]\{\}0-9"a-z ]){0,60}\}"#) {
            for e in [Endpoint::Completions, Endpoint::ChatCompletions, Endpoint::Embeddings] {
                let _ = parse_request(e, body.as_bytes(), LIMIT);
            }
        }
    }
}
