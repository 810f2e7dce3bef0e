//! The shape of a hot prefix's traffic: how its requests reached the engine, so that every call
//! that warms it (the gateway's prefills, keep-warm, a joining pod's warm-up, the filter's
//! direct calls) computes the KV blocks those requests will look up.
//!
//! Identity is ours, what reaches an engine is the traffic's. The canonical rendering
//! ([`crate::canonical`]) names and routes a prefix everywhere; an engine caches the tokens *it*
//! renders — for chat, the model's chat template over the messages, the `tools` and the
//! `chat_template_kwargs`, with the adapter and `cache_salt` in the block hashes
//! (`ENGINE-FACTS.md`). So a prefix keeps, beside its canonical text, a [`WarmShape`]:
//!
//! - **Chat**: one [`MessageSpan`] per message the prefix covers — its role, how many bytes of
//!   its text the prefix covers (the last is usually cut), whether its content came as parts.
//!   The spans lay the messages over the canonical text (`<|role|>\n` + text + `\n` each), so
//!   the text is carried once: a warm call rebuilds the messages from the canonical prefix
//!   ([`WarmShape::messages`]) and sends them with `continue_final_message` (the last, cut
//!   message left open). [`WarmShape::check`] refuses spans that do not lie on the text.
//! - **tools, chat_template_kwargs, tool_choice**: as the request sent them (JSON text), at most
//!   [`MAX_SHAPE_JSON_BYTES`] together: they change the rendered tokens (`tool_choice` decides
//!   whether the engine accepts and renders the tools).
//! - **cache_salt**: as sent, at most [`MAX_SALT_BYTES`]. A client's secret: it travels in a
//!   signal and lives in the gateway's memory, and is never logged, shown or snapshotted.
//!
//! What is assumed: a chat template renders a prefix of the messages (the last one cut) as a
//! token prefix of the full conversation's rendering, up to the cut. Llama 3's and ChatML's
//! layouts do; a template that moves the system prompt to the last user turn (Mistral's) does
//! not, and only the part before the first moved text is shared (docs/routing.md says so).

use serde::{Deserialize, Serialize};

use crate::request::{InferenceRequest, JsonText, Prompt};

/// Most messages a shape lays over a prefix.
pub const MAX_SHAPE_MESSAGES: usize = 256;
/// Longest role a shape keeps, bytes (OpenAI's roles are at most 9).
pub const MAX_ROLE_BYTES: usize = 32;
/// Most bytes of `tools` and `chat_template_kwargs` together a shape keeps: 32 KiB holds some
/// dozens of function definitions; a request with more is observed, unshaped, and counted.
pub const MAX_SHAPE_JSON_BYTES: usize = 32 << 10;
/// Longest `cache_salt` a shape keeps, bytes.
pub const MAX_SALT_BYTES: usize = 256;

/// One message a chat prefix covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageSpan {
    pub role: String,
    /// Bytes of the message's text the prefix covers (the last message's may be fewer than it
    /// had).
    pub len: usize,
    /// Its content came as a list of parts.
    #[serde(default, skip_serializing_if = "is_false")]
    pub parts: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How a prefix's requests reached the engine. See the module docs. Its `Debug` hides the salt.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WarmShape {
    /// Chat: the messages the prefix covers, in order; empty for completions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageSpan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<JsonText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<JsonText>,
    /// Chat `tool_choice`, as sent (it decides whether the engine accepts and renders tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<JsonText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

impl std::fmt::Debug for WarmShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmShape")
            .field("messages", &self.messages)
            .field("tools", &self.tools)
            .field("chat_template_kwargs", &self.chat_template_kwargs)
            .field(
                "cache_salt",
                &self.cache_salt.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// How a `cache_salt` shows in `Debug` output: whether there is one, never its value.
pub fn redacted(salt: &Option<String>) -> Option<&'static str> {
    salt.as_ref().map(|_| "<redacted>")
}

/// Why a shape was not taken or not kept; the field it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("shape.messages: more than {MAX_SHAPE_MESSAGES} messages")]
    TooManyMessages,
    #[error("shape.messages[{0}].role: empty or longer than {MAX_ROLE_BYTES} bytes")]
    Role(usize),
    #[error("shape.messages[{0}]: does not lie on the prefix's canonical text")]
    OffText(usize),
    #[error("shape.messages: leave more than a role header of the text uncovered")]
    Uncovered,
    #[error("shape.tools: tools and chat_template_kwargs above {MAX_SHAPE_JSON_BYTES} bytes")]
    JsonTooLarge,
    #[error("shape.chat_template_kwargs: must be a JSON object")]
    KwargsNotObject,
    #[error("shape.tools: tools or tool_choice not one JSON value")]
    ToolsNotJson,
    #[error("shape.cache_salt: empty or longer than {MAX_SALT_BYTES} bytes")]
    Salt,
}

/// Bytes of `<|role|>\n` before a message's text in the canonical rendering.
fn header_len(role: &str) -> usize {
    role.len().saturating_add(5)
}

impl WarmShape {
    /// The shape of `request`'s traffic over the first `prefix_len` bytes of its canonical
    /// rendering (the prefix a signal carries): `None` when there is nothing to repeat (a
    /// completion without a salt); an error when the request is past a bound.
    pub fn of(request: &InferenceRequest, prefix_len: usize) -> Result<Option<Self>, ShapeError> {
        let extras = &request.extras;
        let mut shape = WarmShape {
            messages: Vec::new(),
            tools: extras.tools.clone(),
            chat_template_kwargs: extras.chat_template_kwargs.clone(),
            tool_choice: extras.tool_choice.clone(),
            cache_salt: extras.cache_salt.clone(),
        };
        if let Prompt::Chat(messages) = &request.prompt {
            let mut offset = 0usize;
            for m in messages {
                let start = offset.saturating_add(header_len(&m.role));
                if start >= prefix_len {
                    break;
                }
                if shape.messages.len() == MAX_SHAPE_MESSAGES {
                    return Err(ShapeError::TooManyMessages);
                }
                let len = m.text.len().min(prefix_len - start);
                shape.messages.push(MessageSpan {
                    role: m.role.clone(),
                    len,
                    parts: m.parts,
                });
                if len < m.text.len() {
                    break;
                }
                offset = start.saturating_add(m.text.len()).saturating_add(1);
            }
            // an open message with no text would close nothing the traffic shares
            while shape.messages.last().is_some_and(|m| m.len == 0) {
                shape.messages.pop();
            }
        }
        if shape == WarmShape::default() {
            return Ok(None);
        }
        shape.check_bounds()?;
        Ok(Some(shape))
    }

    /// Whether a warm call of this shape goes to the chat endpoint.
    pub fn is_chat(&self) -> bool {
        !self.messages.is_empty()
    }

    /// Bytes the shape holds beyond the prefix's text (for memory accounting).
    pub fn bytes(&self) -> usize {
        let spans: usize = self
            .messages
            .iter()
            .map(|m| m.role.len().saturating_add(24))
            .fold(0, usize::saturating_add);
        spans
            .saturating_add(self.tools.as_ref().map_or(0, JsonText::len))
            .saturating_add(self.chat_template_kwargs.as_ref().map_or(0, JsonText::len))
            .saturating_add(self.tool_choice.as_ref().map_or(0, JsonText::len))
            .saturating_add(self.cache_salt.as_ref().map_or(0, String::len))
    }

    fn check_bounds(&self) -> Result<(), ShapeError> {
        if self.messages.len() > MAX_SHAPE_MESSAGES {
            return Err(ShapeError::TooManyMessages);
        }
        if let Some(i) = self
            .messages
            .iter()
            .position(|m| m.role.is_empty() || m.role.len() > MAX_ROLE_BYTES)
        {
            return Err(ShapeError::Role(i));
        }
        let json = self
            .tools
            .as_ref()
            .map_or(0, JsonText::len)
            .saturating_add(self.chat_template_kwargs.as_ref().map_or(0, JsonText::len))
            .saturating_add(self.tool_choice.as_ref().map_or(0, JsonText::len));
        if json > MAX_SHAPE_JSON_BYTES {
            return Err(ShapeError::JsonTooLarge);
        }
        if self
            .chat_template_kwargs
            .as_ref()
            .is_some_and(|k| !k.get().trim_start().starts_with('{') || !k.is_json())
        {
            return Err(ShapeError::KwargsNotObject);
        }
        if [&self.tools, &self.tool_choice]
            .iter()
            .any(|j| j.as_ref().is_some_and(|t| !t.is_json()))
        {
            return Err(ShapeError::ToolsNotJson);
        }
        if self
            .cache_salt
            .as_ref()
            .is_some_and(|s| s.is_empty() || s.len() > MAX_SALT_BYTES)
        {
            return Err(ShapeError::Salt);
        }
        Ok(())
    }

    /// Whether the shape is within its bounds and its spans lie on `text`, the prefix's
    /// canonical text: each message's `<|role|>\n` header where the spans put it, each covered
    /// text inside `text`, consecutive messages separated by `\n`, and what follows the last
    /// span at most the start of another message's header.
    pub fn check(&self, text: &str) -> Result<(), ShapeError> {
        self.check_bounds()?;
        let mut offset = 0usize;
        let last = self.messages.len().saturating_sub(1);
        for (i, m) in self.messages.iter().enumerate() {
            let header = ["<|", &m.role, "|>\n"].concat();
            let rest = text.get(offset..).ok_or(ShapeError::OffText(i))?;
            if !rest.starts_with(&header) {
                return Err(ShapeError::OffText(i));
            }
            let end = offset.saturating_add(header.len()).saturating_add(m.len);
            if end > text.len() || !text.is_char_boundary(end) {
                return Err(ShapeError::OffText(i));
            }
            offset = end;
            if i < last {
                if text.get(offset..offset.saturating_add(1)) != Some("\n") {
                    return Err(ShapeError::OffText(i));
                }
                offset = offset.saturating_add(1);
            }
        }
        if self.is_chat() && text.len().saturating_sub(offset) > MAX_ROLE_BYTES + 6 {
            return Err(ShapeError::Uncovered);
        }
        Ok(())
    }

    /// The chat messages a warm call sends, rebuilt from the prefix's canonical `text`: each
    /// span's role and covered text, as a string or as one text part. `None` when the spans do
    /// not lie on `text` ([`WarmShape::check`]).
    pub fn messages(&self, text: &str) -> Option<Vec<serde_json::Value>> {
        let mut out = Vec::with_capacity(self.messages.len());
        let mut offset = 0usize;
        for m in &self.messages {
            let start = offset.checked_add(header_len(&m.role))?;
            let end = start.checked_add(m.len)?;
            let content = text.get(start..end)?;
            let content = if m.parts {
                serde_json::json!([{"type": "text", "text": content}])
            } else {
                serde_json::Value::String(content.to_string())
            };
            out.push(serde_json::json!({"role": m.role, "content": content}));
            offset = end.checked_add(1)?;
        }
        Some(out)
    }

    /// The shape as a snapshot may keep it: without its salt (a secret is never written to
    /// disk). [`WarmShape::salted`] of the original says whether one was dropped.
    pub fn without_salt(&self) -> Self {
        WarmShape {
            cache_salt: None,
            ..self.clone()
        }
    }

    /// Whether the traffic carried a `cache_salt`.
    pub fn salted(&self) -> bool {
        self.cache_salt.is_some()
    }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use crate::canonical::canonical_prompt;
    use crate::request::{parse_request, Endpoint};
    use crate::tokens::truncate_to_tokens;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat(body: &str) -> InferenceRequest {
        parse_request(Endpoint::ChatCompletions, body.as_bytes(), 1 << 20).unwrap()
    }

    fn system_and_question() -> InferenceRequest {
        let system = "You answer questions about the billing API. ".repeat(20);
        chat(&format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},
            {{"role":"user","content":[{{"type":"text","text":"What is an invoice?"}}]}}],
            "tools":[{{"type":"function","function":{{"name":"lookup"}}}}],"cache_salt":"tenant-7"}}"#
        ))
    }

    #[test]
    fn a_prefix_inside_the_system_message_covers_it_alone_cut_where_the_prefix_ends() {
        let r = system_and_question();
        let canonical = canonical_prompt(&r);
        let prefix = truncate_to_tokens(&canonical, 100);
        let shape = WarmShape::of(&r, prefix.len()).unwrap().unwrap();
        assert_eq!(shape.messages.len(), 1);
        assert_eq!(shape.messages[0].role, "system");
        assert_eq!(shape.messages[0].len, 400 - "<|system|>\n".len());
        shape.check(prefix).unwrap();
        let messages = shape.messages(prefix).unwrap();
        let Prompt::Chat(sent) = &r.prompt else {
            unreachable!()
        };
        let content = messages[0]["content"].as_str().unwrap();
        assert!(sent[0].text.starts_with(content));
        assert_eq!(shape.tools, r.extras.tools);
        assert_eq!(shape.cache_salt.as_deref(), Some("tenant-7"));
    }

    #[test]
    fn a_prefix_past_a_message_rebuilds_it_whole_and_the_next_cut_in_its_form() {
        let r = system_and_question();
        let canonical = canonical_prompt(&r);
        let cut = canonical.len() - 5;
        let prefix = &canonical[..cut];
        let shape = WarmShape::of(&r, prefix.len()).unwrap().unwrap();
        shape.check(prefix).unwrap();
        let messages = shape.messages(prefix).unwrap();
        let Prompt::Chat(sent) = &r.prompt else {
            unreachable!()
        };
        assert_eq!(messages[0]["content"], sent[0].text.as_str());
        assert_eq!(messages[1]["content"][0]["type"], "text");
        let cut_text = messages[1]["content"][0]["text"].as_str().unwrap();
        assert!(sent[1].text.starts_with(cut_text) && cut_text.len() < sent[1].text.len());
    }

    #[test]
    fn a_prefix_ending_in_a_header_leaves_the_previous_message_last() {
        let r = system_and_question();
        let canonical = canonical_prompt(&r);
        let Prompt::Chat(sent) = &r.prompt else {
            unreachable!()
        };
        let end = "<|system|>\n".len() + sent[0].text.len() + 1 + 3; // "\n<|u"
        let prefix = &canonical[..end];
        let shape = WarmShape::of(&r, prefix.len()).unwrap().unwrap();
        assert_eq!(shape.messages.len(), 1);
        shape.check(prefix).unwrap();
    }

    #[test]
    fn a_plain_completion_has_no_shape_and_a_salted_one_keeps_its_salt() {
        let plain = parse_request(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hello"}"#,
            1 << 20,
        )
        .unwrap();
        assert_eq!(WarmShape::of(&plain, 5).unwrap(), None);
        let salted = parse_request(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"hello","cache_salt":"x"}"#,
            1 << 20,
        )
        .unwrap();
        let shape = WarmShape::of(&salted, 5).unwrap().unwrap();
        assert!(!shape.is_chat() && shape.salted());
        assert!(!shape.without_salt().salted());
        shape.check("hello").unwrap();
    }

    #[test]
    fn spans_that_do_not_lie_on_the_text_are_refused_naming_the_message() {
        let r = system_and_question();
        let canonical = canonical_prompt(&r);
        let prefix = truncate_to_tokens(&canonical, 100);
        let shape = WarmShape::of(&r, prefix.len()).unwrap().unwrap();
        let mut wrong_role = shape.clone();
        wrong_role.messages[0].role = "user".into();
        assert_eq!(wrong_role.check(prefix), Err(ShapeError::OffText(0)));
        let mut too_long = shape.clone();
        too_long.messages[0].len += 1;
        assert_eq!(too_long.check(prefix), Err(ShapeError::OffText(0)));
        assert!(too_long.messages(prefix).is_none());
        let mut short = shape.clone();
        short.messages[0].len -= 100;
        assert_eq!(short.check(prefix), Err(ShapeError::Uncovered));
        let mut salted = shape;
        salted.cache_salt = Some("s".repeat(MAX_SALT_BYTES + 1));
        assert_eq!(salted.check(prefix), Err(ShapeError::Salt));
    }

    #[test]
    fn debug_output_never_shows_the_salt() {
        let shape = WarmShape::of(&system_and_question(), 300).unwrap().unwrap();
        let shown = format!("{shape:?} {:?}", system_and_question().extras);
        assert!(!shown.contains("tenant-7"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn tools_past_the_bound_are_an_error_not_a_cut() {
        let tools = format!(r#"[{{"d":"{}"}}]"#, "x".repeat(MAX_SHAPE_JSON_BYTES));
        let r = chat(&format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hello there"}}],"tools":{tools}}}"#
        ));
        assert_eq!(WarmShape::of(&r, 12), Err(ShapeError::JsonTooLarge));
        let r = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"hello there"}],"chat_template_kwargs":[1]}"#,
        );
        assert_eq!(WarmShape::of(&r, 12), Err(ShapeError::KwargsNotObject));
    }

    #[test]
    fn a_shape_round_trips_inside_a_signal_keeping_the_tools_text_byte_for_byte() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hello there, friend"}],
            "tools":[{"type":"function","function":{"name":"z","description":"d","parameters":{"b":1,"a":2}}}]}"#;
        let r = chat(body);
        let shape = WarmShape::of(&r, 20).unwrap().unwrap();
        let signal = crate::wire::Signal::Prefill(crate::wire::PrefillSignal {
            model: "m".into(),
            tenant: None,
            endpoint: Endpoint::ChatCompletions,
            prefix: vec![crate::BlockHash(1)],
            prefix_tokens: 64,
            prefix_text: "x".into(),
            state: crate::wire::PatternState::New,
            priority: 0,
            keep_warm: true,
            shape: Some(shape.clone()),
        });
        let json = serde_json::to_string(&signal).unwrap();
        let back: crate::wire::Signal = serde_json::from_str(&json).unwrap();
        let crate::wire::Signal::Prefill(back) = back else {
            unreachable!()
        };
        assert_eq!(back.shape.as_ref(), Some(&shape));
        assert!(shape
            .tools
            .unwrap()
            .get()
            .contains(r#""parameters":{"b":1,"a":2}"#));
    }

    #[test]
    fn tools_or_kwargs_that_are_not_json_are_refused() {
        let mut shape = WarmShape {
            tools: Some(JsonText("[1,".into())),
            ..WarmShape::default()
        };
        assert_eq!(shape.check(""), Err(ShapeError::ToolsNotJson));
        shape.tools = None;
        shape.chat_template_kwargs = Some(JsonText("{\"a\":".into()));
        assert_eq!(shape.check(""), Err(ShapeError::KwargsNotObject));
    }
}
