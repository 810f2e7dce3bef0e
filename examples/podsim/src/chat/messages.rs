//! A request's `messages` and `tools` as the engine hands them to the chat template.
//!
//! - vLLM: each message is rebuilt from `role`, `content`, and per role `tool_calls`
//!   (arguments parsed from JSON strings into objects; malformed ones become `{}`), `reasoning`,
//!   `tool_call_id`, `name`. A string-format template gets content as one string (text parts
//!   joined with `\n`, no content = `""`); an openai-format one gets a list of parts.
//!   Tools become `{"type", "function": {"name", "description", "parameters"[, "strict"]}}`.
//! - SGLang: the message keeps its fields that are not null; content parts are joined with a
//!   space for string-format templates (tool results too); a tool call's string arguments must
//!   parse to a JSON object. Tools become `{"type", "function": {"description", "name",
//!   "parameters", "strict"}, "defer_loading"}`; `tool_choice: "none"` leaves them out and a
//!   named `tool_choice` keeps only that tool.
//!
//! Non-text parts (images, audio) are dropped for string-format templates: podsim serves a
//! text-only model.

use minijinja::value::ValueKind;
use minijinja::Value;

use super::template::ContentFormat;
use super::ChatError;
use crate::config::Engine;

/// A message's content as the template receives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

/// One message on its way to the template.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: Content,
    /// The other fields the engine passes on, in order.
    pub extra: Vec<(&'static str, Value)>,
}

impl Message {
    pub fn to_value(&self) -> Value {
        let content = match &self.content {
            Content::Text(s) => Value::from(s.as_str()),
            Content::Parts(parts) => Value::from(parts.clone()),
        };
        let mut pairs: Vec<(&str, Value)> = vec![
            ("role", Value::from(self.role.as_str())),
            ("content", content),
        ];
        pairs.extend(self.extra.iter().cloned());
        Value::from_pairs(pairs)
    }
}

fn field(value: &Value, key: &str) -> Option<Value> {
    value
        .get_attr(key)
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_none())
}

fn invalid(index: usize, rule: impl Into<String>) -> ChatError {
    ChatError::InvalidMessage {
        index,
        rule: rule.into(),
    }
}

/// The text of a part: `{"type": "text", "text": ...}` (or a bare string).
fn part_text(part: &Value) -> Option<String> {
    if let Some(s) = part.as_str() {
        return Some(s.to_string());
    }
    let kind = field(part, "type");
    let is_text = kind
        .as_ref()
        .and_then(Value::as_str)
        .is_none_or(|t| t == "text");
    if is_text {
        field(part, "text").and_then(|t| t.as_str().map(str::to_string))
    } else {
        None
    }
}

/// `messages` of the request, normalized for `engine` and the template's content format.
pub fn normalize(
    messages: Option<&Value>,
    engine: Engine,
    format: ContentFormat,
) -> Result<Vec<Message>, ChatError> {
    let Some(messages) = messages else {
        return Err(ChatError::Field {
            field: "messages",
            rule: "Field required".into(),
        });
    };
    if messages.kind() != ValueKind::Seq {
        return Err(ChatError::Field {
            field: "messages",
            rule: "Input should be a valid list".into(),
        });
    }
    messages
        .try_iter()
        .map_err(|e| ChatError::Template(e.to_string()))?
        .enumerate()
        .map(|(index, m)| match engine {
            Engine::Vllm => vllm_message(index, &m, format),
            Engine::Sglang => sglang_message(index, &m, format),
        })
        .collect()
}

fn role_of(index: usize, m: &Value) -> Result<String, ChatError> {
    if m.kind() != ValueKind::Map {
        return Err(invalid(index, "Input should be a valid dictionary"));
    }
    field(m, "role")
        .and_then(|r| r.as_str().map(str::to_string))
        .ok_or_else(|| invalid(index, "role: Field required (a string)"))
}

/// The parts of a content value; `None` when absent or null.
fn content_parts(index: usize, m: &Value) -> Result<Option<Vec<Value>>, ChatError> {
    match field(m, "content") {
        None => Ok(None),
        Some(c) if c.as_str().is_some() => Ok(Some(vec![Value::from_pairs([
            ("type", Value::from("text")),
            ("text", c),
        ])])),
        Some(c) if c.kind() == ValueKind::Seq => Ok(Some(
            c.try_iter()
                .map_err(|e| invalid(index, e.to_string()))?
                .collect(),
        )),
        Some(_) => Err(invalid(
            index,
            "content: Input should be a valid string or a list of parts",
        )),
    }
}

fn vllm_message(index: usize, m: &Value, format: ContentFormat) -> Result<Message, ChatError> {
    let role = role_of(index, m)?;
    let parts = content_parts(index, m)?.unwrap_or_default();
    let mut content = match format {
        ContentFormat::String => Content::Text(
            parts
                .iter()
                .filter_map(part_text)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        ContentFormat::Openai => Content::Parts(
            parts
                .into_iter()
                .map(|p| match p.as_str() {
                    Some(s) => {
                        Value::from_pairs([("type", Value::from("text")), ("text", Value::from(s))])
                    }
                    None => p,
                })
                .collect(),
        ),
    };
    let mut extra = Vec::new();
    match role.as_str() {
        "assistant" => {
            if let Some(calls) = field(m, "tool_calls") {
                let calls = vllm_tool_calls(index, &calls)?;
                if !calls.is_empty() {
                    extra.push(("tool_calls", Value::from(calls)));
                }
            }
            if let Some(reasoning) = field(m, "reasoning") {
                extra.push(("reasoning", reasoning.clone()));
                extra.push(("reasoning_content", reasoning));
            }
        }
        "tool" => {
            if let Some(id) = field(m, "tool_call_id") {
                extra.push(("tool_call_id", id));
            }
            // Tool results reach templates as one string even for openai-format templates.
            if let Content::Parts(parts) = &content {
                if parts.iter().all(|p| {
                    field(p, "type")
                        .and_then(|t| t.as_str().map(|t| t == "text"))
                        .unwrap_or(false)
                }) {
                    content = Content::Text(
                        parts
                            .iter()
                            .filter_map(part_text)
                            .collect::<Vec<_>>()
                            .join("\n"),
                    );
                }
            }
        }
        _ => {}
    }
    if let Some(name) = field(m, "name").filter(|n| n.as_str().is_some()) {
        extra.push(("name", name));
    }
    Ok(Message {
        role,
        content,
        extra,
    })
}

/// vLLM's assistant tool calls: objects with a `function` object; string arguments parsed.
fn vllm_tool_calls(index: usize, calls: &Value) -> Result<Vec<Value>, ChatError> {
    if calls.kind() != ValueKind::Seq {
        return Err(invalid(index, "tool_calls: Input should be a valid list"));
    }
    let mut out = Vec::new();
    for call in calls
        .try_iter()
        .map_err(|e| invalid(index, e.to_string()))?
    {
        let function = field(&call, "function").filter(|f| f.kind() == ValueKind::Map);
        let is_function = field(&call, "type")
            .and_then(|t| t.as_str().map(|t| t == "function"))
            .unwrap_or(true);
        let (Some(function), true) = (function, is_function) else {
            return Err(invalid(
                index,
                "chat completions only support assistant tool_calls of type 'function'.",
            ));
        };
        let arguments = match field(&function, "arguments") {
            Some(a) if a.kind() == ValueKind::Map => a,
            Some(a) => match a.as_str() {
                Some(s) if !s.is_empty() => serde_json::from_str::<Value>(s)
                    .ok()
                    .filter(|v| v.kind() == ValueKind::Map)
                    .unwrap_or_else(empty_map),
                _ => empty_map(),
            },
            None => empty_map(),
        };
        out.push(replace_key(
            &call,
            "function",
            replace_key(&function, "arguments", arguments),
        ));
    }
    Ok(out)
}

fn sglang_message(index: usize, m: &Value, format: ContentFormat) -> Result<Message, ChatError> {
    let role = role_of(index, m)?.to_lowercase();
    const ROLES: [&str; 7] = [
        "user",
        "system",
        "assistant",
        "tool",
        "function",
        "developer",
        "latest_reminder",
    ];
    if !ROLES.contains(&role.as_str()) {
        return Err(invalid(
            index,
            "'role' must be one of 'system', 'assistant', 'tool', 'function', 'developer', 'latest_reminder' (case-insensitive).",
        ));
    }
    let content = match (content_parts(index, m)?, field(m, "content")) {
        (_, Some(s)) if s.as_str().is_some() => {
            Content::Text(s.as_str().unwrap_or_default().into())
        }
        (None, _) => Content::Text(String::new()),
        (Some(parts), _) => match format {
            ContentFormat::String => Content::Text(
                parts
                    .iter()
                    .filter_map(part_text)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            ContentFormat::Openai
                if role == "tool" && parts.iter().all(|p| part_text(p).is_some()) =>
            {
                Content::Text(
                    parts
                        .iter()
                        .filter_map(part_text)
                        .collect::<Vec<_>>()
                        .join(" "),
                )
            }
            ContentFormat::Openai => Content::Parts(parts),
        },
    };
    let mut extra = Vec::new();
    if role != "user" {
        for key in ["tool_call_id", "name", "reasoning_content", "tools"] {
            if let Some(v) = field(m, key) {
                extra.push((key, v));
            }
        }
        if let Some(calls) = field(m, "tool_calls") {
            extra.push(("tool_calls", sglang_tool_calls(index, &role, &calls)?));
        }
    }
    Ok(Message {
        role,
        content,
        extra,
    })
}

/// SGLang parses an assistant's string arguments and refuses any that are not a JSON object.
fn sglang_tool_calls(index: usize, role: &str, calls: &Value) -> Result<Value, ChatError> {
    if role != "assistant" || calls.kind() != ValueKind::Seq {
        return Ok(calls.clone());
    }
    let mut out = Vec::new();
    for call in calls
        .try_iter()
        .map_err(|e| invalid(index, e.to_string()))?
    {
        let Some(function) = field(&call, "function") else {
            out.push(call);
            continue;
        };
        match field(&function, "arguments")
            .as_ref()
            .and_then(Value::as_str)
        {
            Some(s) => {
                let parsed: Value = serde_json::from_str(s).map_err(|_| {
                    invalid(
                        index,
                        "Assistant tool call function.arguments must be valid JSON.",
                    )
                })?;
                if parsed.kind() != ValueKind::Map {
                    return Err(invalid(
                        index,
                        "Assistant tool call function.arguments must be a JSON object.",
                    ));
                }
                out.push(replace_key(
                    &call,
                    "function",
                    replace_key(&function, "arguments", parsed),
                ));
            }
            None => out.push(call),
        }
    }
    Ok(Value::from(out))
}

fn empty_map() -> Value {
    Value::from_pairs(Vec::<(Value, Value)>::new())
}

/// A copy of map `m` with `key` set to `value` (same position when present, else last).
pub fn replace_key(m: &Value, key: &str, value: Value) -> Value {
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    let mut replaced = false;
    if let Ok(keys) = m.try_iter() {
        for k in keys {
            if k.as_str() == Some(key) {
                pairs.push((k, value.clone()));
                replaced = true;
            } else {
                let v = m.get_item(&k).unwrap_or_default();
                pairs.push((k, v));
            }
        }
    }
    if !replaced {
        pairs.push((Value::from(key), value));
    }
    Value::from_pairs(pairs)
}

/// `tools` as the engine hands them to the template; `None` when there are none to render.
pub fn normalize_tools(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    engine: Engine,
) -> Result<Option<Vec<Value>>, ChatError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    let bad = |rule: &str| ChatError::Field {
        field: "tools",
        rule: rule.into(),
    };
    if tools.kind() != ValueKind::Seq {
        return Err(bad("Input should be a valid list"));
    }
    let tools: Vec<Value> = tools.try_iter().map_err(|e| bad(&e.to_string()))?.collect();
    if engine == Engine::Vllm && tools.is_empty() {
        return Err(ChatError::EmptyTools);
    }
    let mut out = Vec::with_capacity(tools.len());
    for tool in &tools {
        let function = field(tool, "function")
            .filter(|f| f.kind() == ValueKind::Map)
            .ok_or_else(|| bad("each tool needs a `function` object"))?;
        let name = field(&function, "name")
            .filter(|n| n.as_str().is_some())
            .ok_or_else(|| bad("each tool's function needs a `name` string"))?;
        let kind = field(tool, "type").unwrap_or_else(|| Value::from("function"));
        let opt = |key: &str| field(&function, key).unwrap_or(Value::from(()));
        let normalized = match engine {
            Engine::Vllm => {
                if kind.as_str() != Some("function") {
                    return Err(bad("type: Input should be 'function'"));
                }
                let mut f = vec![
                    ("name", name),
                    ("description", opt("description")),
                    ("parameters", opt("parameters")),
                ];
                for key in ["strict", "defer_loading"] {
                    if let Some(v) = field(&function, key)
                        .or_else(|| (key == "defer_loading").then(|| field(tool, key)).flatten())
                    {
                        f.push((key, v));
                    }
                }
                let mut t = vec![("type", kind), ("function", Value::from_pairs(f))];
                if let Some(v) = field(tool, "defer_loading") {
                    t.push(("defer_loading", v));
                }
                Value::from_pairs(t)
            }
            Engine::Sglang => {
                let mut f = vec![
                    ("description", opt("description")),
                    ("name", name),
                    ("parameters", opt("parameters")),
                    (
                        "strict",
                        field(&function, "strict").unwrap_or(Value::from(false)),
                    ),
                ];
                let defer = field(tool, "defer_loading");
                if let Some(v) = field(&function, "defer_loading").or_else(|| defer.clone()) {
                    f.push(("defer_loading", v));
                }
                Value::from_pairs([
                    ("type", kind),
                    ("function", Value::from_pairs(f)),
                    ("defer_loading", defer.unwrap_or(Value::from(()))),
                ])
            }
        };
        out.push(normalized);
    }
    if engine == Engine::Sglang {
        match tool_choice {
            Some(c) if c.as_str() == Some("none") => return Ok(None),
            Some(c) if c.kind() == ValueKind::Map => {
                let wanted = field(c, "function").and_then(|f| field(&f, "name"));
                out.retain(|t| field(t, "function").and_then(|f| field(&f, "name")) == wanted);
            }
            _ => {}
        }
        if out.is_empty() {
            return Ok(None);
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn parts_join_with_newline_on_vllm_and_space_on_sglang() {
        let m = json(
            r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]"#,
        );
        let v = normalize(Some(&m), Engine::Vllm, ContentFormat::String).unwrap();
        assert_eq!(v[0].content, Content::Text("a\nb".into()));
        let s = normalize(Some(&m), Engine::Sglang, ContentFormat::String).unwrap();
        assert_eq!(s[0].content, Content::Text("a b".into()));
        let o = normalize(
            Some(&json(r#"[{"role":"user","content":"q"}]"#)),
            Engine::Vllm,
            ContentFormat::Openai,
        )
        .unwrap();
        assert!(matches!(&o[0].content, Content::Parts(p) if p.len() == 1));
    }

    #[test]
    fn tool_call_arguments_become_objects() {
        let m = json(
            r#"[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]}]"#,
        );
        let v = normalize(Some(&m), Engine::Vllm, ContentFormat::String).unwrap();
        assert_eq!(v[0].content, Content::Text(String::new()));
        let calls = &v[0].extra[0].1;
        let args = calls
            .get_item_by_index(0)
            .unwrap()
            .get_attr("function")
            .unwrap()
            .get_attr("arguments")
            .unwrap();
        assert_eq!(args.kind(), ValueKind::Map);
        let bad = json(
            r#"[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]"#,
        );
        assert!(normalize(Some(&bad), Engine::Sglang, ContentFormat::String).is_err());
        assert!(normalize(Some(&bad), Engine::Vllm, ContentFormat::String).is_ok());
    }

    #[test]
    fn tools_are_reshaped_like_the_engines_models() {
        let tools = json(
            r#"[{"type":"function","function":{"parameters":{"type":"object"},"name":"f","extra":1}}]"#,
        );
        let v = normalize_tools(Some(&tools), None, Engine::Vllm)
            .unwrap()
            .unwrap();
        assert_eq!(
            super::super::pyjson::dumps(&v[0]).unwrap(),
            r#"{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}"#
        );
        let s = normalize_tools(Some(&tools), None, Engine::Sglang)
            .unwrap()
            .unwrap();
        assert_eq!(
            super::super::pyjson::dumps(&s[0]).unwrap(),
            r#"{"type": "function", "function": {"description": null, "name": "f", "parameters": {"type": "object"}, "strict": false}, "defer_loading": null}"#
        );
        let none = Value::from("none");
        assert!(normalize_tools(Some(&tools), Some(&none), Engine::Sglang)
            .unwrap()
            .is_none());
        assert!(normalize_tools(Some(&tools), Some(&none), Engine::Vllm)
            .unwrap()
            .is_some());
        assert_eq!(
            normalize_tools(Some(&json("[]")), None, Engine::Vllm),
            Err(ChatError::EmptyTools)
        );
    }
}
