//! One streamed request: send it, time the first token, read the usage chunk.
//!
//! `--api completions` posts `{target}/v1/completions` with the prompt text; `--api chat` posts
//! `{target}/v1/chat/completions` with the messages ([`super::chat`]) and, when the request has
//! tool definitions, `tools` and `tool_choice: "none"` ([`super::tools`]). Both carry the same
//! `model`, `max_tokens`, `user` (none when the trace's client sends none), `stream: true` and
//! `stream_options: {include_usage: true}`; the reply is Server-Sent Events. TTFT is the time from sending to the first `data:` event
//! carrying a choice — for chat, a choice with output: a `delta` that only names the role (which
//! OpenAI sends before generating, vLLM with the first token) does not count, unless nothing
//! else comes. The last event's `usage.prompt_tokens` and
//! `usage.prompt_tokens_details.cached_tokens` (when the server returns it) are the prompt and
//! cached tokens. The pod is the `pod_header` response header.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use super::chat::Message;
use super::tools::ToolDefinition;

/// Most bytes of event stream read from one reply (a runaway server cannot exhaust memory).
const MAX_REPLY_BYTES: usize = 16 << 20;

/// What one request measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The pod that served it (header value), if the reply named one.
    pub pod: Option<String>,
    pub ttft_s: f64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// What a request asks the model for.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A completion's prompt text.
    Text(String),
    /// Chat messages and tools (empty: no `tools` sent).
    Chat(Vec<Message>, Vec<ToolDefinition>),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: u64,
    /// `None`: the body carries no `user`.
    pub user: Option<String>,
    /// `(header, tenant)` sent when the request has a tenant.
    pub tenant: Option<(String, String)>,
}

impl Outgoing {
    /// The path and JSON body it is sent as (the prompt is moved out).
    pub fn take_body(&mut self) -> (&'static str, Value) {
        let mut tools = Vec::new();
        let (path, field, prompt) =
            match std::mem::replace(&mut self.prompt, Prompt::Text(String::new())) {
                Prompt::Text(text) => ("/v1/completions", "prompt", Value::String(text)),
                Prompt::Chat(messages, defined) => {
                    tools = defined;
                    (
                        "/v1/chat/completions",
                        "messages",
                        serde_json::to_value(messages).unwrap_or_default(),
                    )
                }
            };
        let mut body = json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(map) = body.as_object_mut() {
            if let Some(user) = &self.user {
                map.insert("user".into(), Value::String(user.clone()));
            }
            map.insert(field.into(), prompt);
            if !tools.is_empty() {
                map.insert(
                    "tools".into(),
                    serde_json::to_value(tools).unwrap_or_default(),
                );
                map.insert("tool_choice".into(), Value::String("none".into()));
            }
        }
        (path, body)
    }
}

/// What the events of one reply said so far.
#[derive(Debug, Default)]
struct ReplyReading {
    /// Seconds to the first event with output.
    ttft_s: Option<f64>,
    /// Seconds to the first event with a choice (chat's role-only delta included).
    first_choice_s: Option<f64>,
    usage: Option<Value>,
}

impl ReplyReading {
    /// Reads one event's `data:` payload, which arrived `elapsed_s` after sending.
    fn event(&mut self, data: &str, elapsed_s: f64) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let choices = v.get("choices").and_then(Value::as_array);
        if choices.is_some_and(|c| !c.is_empty()) {
            self.first_choice_s.get_or_insert(elapsed_s);
            if choices.is_some_and(|c| c.iter().any(has_output)) {
                self.ttft_s.get_or_insert(elapsed_s);
            }
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
    }

    fn measured(self, pod: Option<String>) -> Option<Measured> {
        let usage = self.usage.as_ref();
        Some(Measured {
            pod,
            ttft_s: self.ttft_s.or(self.first_choice_s)?,
            prompt_tokens: usage
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(Value::as_u64),
            cached_tokens: usage
                .and_then(|u| u.get("prompt_tokens_details"))
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64),
        })
    }
}

/// Whether a streamed choice carries output: any completion choice; a chat `delta` with
/// content, reasoning or tool calls, or a finish reason.
fn has_output(choice: &Value) -> bool {
    let Some(delta) = choice.get("delta") else {
        return true;
    };
    let non_empty = |key: &str| match delta.get(key) {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    };
    ["content", "reasoning_content", "reasoning", "tool_calls"]
        .into_iter()
        .any(non_empty)
        || choice.get("finish_reason").is_some_and(|f| !f.is_null())
}

/// Sends `req` to `target` and reads the reply to its end.
pub async fn send(
    client: &reqwest::Client,
    target: &str,
    pod_header: &str,
    mut req: Outgoing,
    timeout: Duration,
) -> Result<Measured, String> {
    let (path, body) = req.take_body();
    let url = format!("{}{path}", target.trim_end_matches('/'));
    let started = Instant::now();
    let work = async {
        let resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let pod = resp
            .headers()
            .get(pod_header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!(
                "{url}: HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let mut stream = resp.bytes_stream();
        let mut buffer: Vec<u8> = Vec::new();
        let mut read = 0usize;
        let mut reading = ReplyReading::default();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("{url}: {e}"))?;
            read += chunk.len();
            if read > MAX_REPLY_BYTES {
                return Err(format!("{url}: reply longer than {MAX_REPLY_BYTES} bytes"));
            }
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                for line in String::from_utf8_lossy(&event).lines() {
                    let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                        continue;
                    };
                    if data != "[DONE]" {
                        reading.event(data, started.elapsed().as_secs_f64());
                    }
                }
            }
        }
        reading
            .measured(pod)
            .ok_or_else(|| format!("{url}: no token in the reply"))
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        format!(
            "{url}: no complete reply within {} s",
            timeout.as_secs_f64()
        )
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::chat::Role;
    use prewarm_core::{canonical_prompt, parse_request, Endpoint};

    fn outgoing(prompt: Prompt) -> Outgoing {
        Outgoing {
            model: "sg-3".into(),
            prompt,
            max_tokens: 128,
            user: Some("group-7".into()),
            tenant: None,
        }
    }

    #[test]
    fn completions_mode_sends_the_completion_body_unchanged() {
        let (path, body) = outgoing(Prompt::Text("abc de".into())).take_body();
        assert_eq!(path, "/v1/completions");
        assert_eq!(
            body,
            json!({"model": "sg-3", "prompt": "abc de", "max_tokens": 128, "stream": true,
                   "stream_options": {"include_usage": true}, "user": "group-7"})
        );
    }

    #[test]
    fn chat_mode_sends_the_messages_with_the_same_fields() {
        let messages = vec![
            Message {
                role: Role::System,
                content: "sys".into(),
            },
            Message {
                role: Role::User,
                content: "ask".into(),
            },
        ];
        let (path, body) = outgoing(Prompt::Chat(messages, Vec::new())).take_body();
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(
            body,
            json!({"model": "sg-3", "max_tokens": 128, "stream": true,
                   "stream_options": {"include_usage": true}, "user": "group-7",
                   "messages": [{"role": "system", "content": "sys"},
                                {"role": "user", "content": "ask"}]})
        );
        // what the filter reads from it
        let parsed = parse_request(
            Endpoint::ChatCompletions,
            body.to_string().as_bytes(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            (
                parsed.model.as_str(),
                parsed.max_tokens,
                parsed.user.as_deref()
            ),
            ("sg-3", Some(128), Some("group-7"))
        );
        assert!(parsed.stream);
        assert_eq!(
            canonical_prompt(&parsed),
            "<|system|>\nsys\n<|user|>\nask\n"
        );
    }

    #[test]
    fn a_request_without_user_sends_none_and_tools_go_with_tool_choice_none() {
        let messages = vec![Message {
            role: Role::User,
            content: "ask".into(),
        }];
        let tools = vec![ToolDefinition::of_block(9, "search the catalogue")];
        let mut req = outgoing(Prompt::Chat(messages, tools.clone()));
        req.user = None;
        let (_, body) = req.take_body();
        assert!(body.get("user").is_none(), "{body}");
        assert_eq!(body["tools"], serde_json::to_value(&tools).unwrap());
        assert_eq!(body["tool_choice"], "none");
        let parsed = parse_request(
            Endpoint::ChatCompletions,
            body.to_string().as_bytes(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(parsed.user, None);
        let sent = parsed.extras.tools.as_ref().map(|t| t.get().to_string());
        let sent: Value = serde_json::from_str(&sent.unwrap()).unwrap();
        assert_eq!(sent[0]["function"]["description"], "search the catalogue");
    }

    fn read(events: &[(&str, f64)]) -> Option<Measured> {
        let mut reading = ReplyReading::default();
        for (data, at) in events {
            reading.event(data, *at);
        }
        reading.measured(Some("pod-1".into()))
    }

    // Chunk shapes of vLLM's OpenAI server (entrypoints/openai/chat_completion/serving.py and
    // completion/serving.py, `exclude_unset`) with `stream_options.include_usage`.
    const CHAT_ROLE: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
    const CHAT_TOKEN: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}"#;
    const CHAT_USAGE: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2410,"total_tokens":2411,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2304}}}"#;
    const COMPLETION_TOKEN: &str = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#;

    #[test]
    fn chat_ttft_is_the_first_output_and_usage_gives_prompt_and_cached_tokens() {
        let m = read(&[(CHAT_ROLE, 0.1), (CHAT_TOKEN, 0.3), (CHAT_USAGE, 0.4)]).unwrap();
        assert_eq!(
            m,
            Measured {
                pod: Some("pod-1".into()),
                ttft_s: 0.3,
                prompt_tokens: Some(2410),
                cached_tokens: Some(2304),
            }
        );
        // a reply whose only choice names the role still has a first-token time
        assert_eq!(read(&[(CHAT_ROLE, 0.1)]).unwrap().ttft_s, 0.1);
        assert_eq!(read(&[(CHAT_USAGE, 0.4)]), None);
    }

    #[test]
    fn completion_ttft_is_the_first_choice_as_before() {
        let m = read(&[(COMPLETION_TOKEN, 0.2), ("not json", 0.25)]).unwrap();
        assert_eq!(m.ttft_s, 0.2);
        assert_eq!((m.prompt_tokens, m.cached_tokens), (None, None));
    }
}
