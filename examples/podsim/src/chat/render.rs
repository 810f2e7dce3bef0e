//! One chat request rendered to the prompt its engine tokenizes.
//!
//! vLLM (through transformers' `apply_chat_template`):
//! - `add_generation_prompt` (default true) and `continue_final_message` (default false); both
//!   true is a 400. `chat_template_kwargs` become template variables (`chat_template` and
//!   `tokenize` are refused), after the special tokens and before `messages`, `tools`,
//!   `documents` and `add_generation_prompt`, which the request's own fields set.
//! - `continue_final_message`: the final message's text (its last text part) is rendered with a
//!   marker appended and the rendering is cut at the marker, so the message stays open (no
//!   end-of-turn token); when the template trimmed the text, trailing whitespace before the
//!   marker goes too. A final message the rendering lost is a 400.
//!
//! SGLang (its OpenAI chat endpoint): no `add_generation_prompt` field (ignored; the generation
//! prompt is always added). A final assistant message with string content is removed and, with
//! `continue_final_message`, appended raw after the rendering; without it, it becomes a user
//! message. A template that fails with tools is retried with each tool's bare `function`.

use minijinja::value::ValueKind;
use minijinja::Value;

use super::fields::EngineFields;
use super::messages::{normalize, normalize_tools, Content, Message};
use super::template::ChatTemplate;
use super::ChatError;
use crate::config::Engine;

/// The marker transformers appends to the final message to find where it ends.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The prompt `fields` render to with `template`, as `engine` renders it.
pub fn render_chat(
    template: &ChatTemplate,
    fields: &EngineFields,
    engine: Engine,
) -> Result<String, ChatError> {
    match engine {
        Engine::Vllm => render_vllm(template, fields),
        Engine::Sglang => render_sglang(template, fields),
    }
}

fn kwargs_of(fields: &EngineFields) -> Result<Vec<(String, Value)>, ChatError> {
    let Some(kwargs) = &fields.chat_template_kwargs else {
        return Ok(Vec::new());
    };
    if kwargs.kind() != ValueKind::Map {
        return Err(ChatError::Field {
            field: "chat_template_kwargs",
            rule: "Input should be a valid dictionary".into(),
        });
    }
    let keys = kwargs
        .try_iter()
        .map_err(|e| ChatError::Template(e.to_string()))?;
    Ok(keys
        .map(|k| {
            let v = kwargs.get_item(&k).unwrap_or_default();
            (k.to_string(), v)
        })
        .collect())
}

fn context(
    template: &ChatTemplate,
    kwargs: Vec<(String, Value)>,
    messages: &[Message],
    tools: Option<&[Value]>,
    add_generation_prompt: bool,
) -> Value {
    let mut pairs: Vec<(String, Value)> = template
        .special_tokens()
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    pairs.extend(kwargs);
    pairs.push((
        "messages".into(),
        Value::from(messages.iter().map(Message::to_value).collect::<Vec<_>>()),
    ));
    pairs.push((
        "tools".into(),
        tools.map_or(Value::from(()), |t| Value::from(t.to_vec())),
    ));
    pairs.push(("documents".into(), Value::from(())));
    pairs.push((
        "add_generation_prompt".into(),
        Value::from(add_generation_prompt),
    ));
    // Later pairs win: the request's own fields over kwargs over special tokens.
    Value::from_pairs(pairs)
}

fn render_vllm(template: &ChatTemplate, fields: &EngineFields) -> Result<String, ChatError> {
    let add_generation_prompt = EngineFields::flag(
        fields.add_generation_prompt.as_ref(),
        "add_generation_prompt",
        true,
    )?;
    let continue_final = EngineFields::flag(
        fields.continue_final_message.as_ref(),
        "continue_final_message",
        false,
    )?;
    if add_generation_prompt && continue_final {
        return Err(ChatError::BothGenerationFlags);
    }
    let kwargs = kwargs_of(fields)?;
    let mut unexpected: Vec<String> = kwargs
        .iter()
        .map(|(k, _)| k.clone())
        .filter(|k| k == "chat_template" || k == "tokenize")
        .collect();
    if !unexpected.is_empty() {
        unexpected.sort();
        return Err(ChatError::UnexpectedKwargs(unexpected));
    }
    let tools = normalize_tools(
        fields.tools.as_ref(),
        fields.tool_choice.as_ref(),
        Engine::Vllm,
    )?;
    let format = template.content_format(tools.is_some())?;
    let mut messages = normalize(fields.messages.as_ref(), Engine::Vllm, format)?;
    let final_text = if continue_final {
        Some(mark_final_message(&mut messages)?)
    } else {
        None
    };
    let rendered = template.render(
        tools.is_some(),
        context(
            template,
            kwargs,
            &messages,
            tools.as_deref(),
            add_generation_prompt,
        ),
    )?;
    match final_text {
        Some(text) => cut_after_final_message(rendered, &text),
        None => Ok(rendered),
    }
}

/// Appends the marker to the final message's text; returns that text.
fn mark_final_message(messages: &mut [Message]) -> Result<String, ChatError> {
    let Some(last) = messages.last_mut() else {
        return Err(ChatError::ContinueFinalMessage(
            "continue_final_message is set but there is no final message to continue!".into(),
        ));
    };
    match &mut last.content {
        Content::Text(text) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Content::Parts(parts) => {
            for part in parts.iter_mut().rev() {
                if let Some(text) = part
                    .get_attr("text")
                    .ok()
                    .and_then(|t| t.as_str().map(str::to_string))
                {
                    *part = super::messages::replace_key(
                        part,
                        "text",
                        Value::from(format!("{text}{CONTINUE_TAG}")),
                    );
                    return Ok(text);
                }
            }
            Err(ChatError::ContinueFinalMessage(
                "continue_final_message is set but we could not find any text to continue in the final message!"
                    .into(),
            ))
        }
    }
}

/// The rendering up to where the final message's text ends.
fn cut_after_final_message(rendered: String, final_text: &str) -> Result<String, ChatError> {
    let tag = CONTINUE_TAG.trim();
    let found = rendered.contains(final_text.trim()) && rendered.contains(tag);
    let Some(at) = rendered.rfind(tag).filter(|_| found) else {
        return Err(ChatError::ContinueFinalMessage(
            "continue_final_message is set but the final message does not appear in the chat after applying the chat template! This can happen if the chat template deletes portions of the final message. Please verify the chat template and final message in your chat to ensure they are compatible."
                .into(),
        ));
    };
    let mut rendered = rendered;
    let intact = rendered
        .get(at..)
        .is_some_and(|rest| rest.starts_with(CONTINUE_TAG));
    rendered.truncate(at);
    if !intact {
        // The template trimmed the text: the marker's space is gone, and so is any whitespace
        // the message ended with.
        let kept = rendered.trim_end().len();
        rendered.truncate(kept);
    }
    Ok(rendered)
}

fn render_sglang(template: &ChatTemplate, fields: &EngineFields) -> Result<String, ChatError> {
    let continue_final = EngineFields::flag(
        fields.continue_final_message.as_ref(),
        "continue_final_message",
        false,
    )?;
    let kwargs = kwargs_of(fields)?;
    let tools = normalize_tools(
        fields.tools.as_ref(),
        fields.tool_choice.as_ref(),
        Engine::Sglang,
    )?;
    let format = template.content_format(tools.is_some())?;
    let mut messages = normalize(fields.messages.as_ref(), Engine::Sglang, format)?;
    if messages.is_empty() {
        return Err(ChatError::Field {
            field: "messages",
            rule: "Messages cannot be empty.".into(),
        });
    }
    let mut assistant_prefix = None;
    if let Some(last) = messages.last() {
        if let (true, Content::Text(text)) = (last.role == "assistant", &last.content) {
            let text = text.clone();
            messages.pop();
            if continue_final {
                assistant_prefix = Some(text);
            } else {
                messages.push(Message {
                    role: "user".into(),
                    content: Content::Text(text),
                    extra: Vec::new(),
                });
            }
        }
    }
    let render = |tools: Option<&[Value]>| {
        template.render(
            tools.is_some(),
            context(template, kwargs.clone(), &messages, tools, true),
        )
    };
    let rendered = match render(tools.as_deref()) {
        Ok(r) => r,
        Err(first) => match &tools {
            // Some templates (Mistral's) expect tools without the OpenAI wrapper.
            Some(tools) => {
                let bare: Vec<Value> = tools
                    .iter()
                    .map(|t| t.get_attr("function").unwrap_or_else(|_| t.clone()))
                    .collect();
                render(Some(&bare))?
            }
            None => return Err(first),
        },
    };
    Ok(rendered + assistant_prefix.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::template::ContentFormatArg;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(
            vec![("default".into(), source.into())],
            vec![("bos_token".into(), "<s>".into())],
            ContentFormatArg::Auto,
            "test".into(),
        )
    }

    fn fields(body: &str) -> EngineFields {
        EngineFields::of(body.as_bytes())
    }

    const TRIMMING: &str = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}</>{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";

    #[test]
    fn continuing_the_final_message_leaves_it_open() {
        let t = template(TRIMMING);
        let body = r#"{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Sure, "}],
                       "continue_final_message":true,"add_generation_prompt":false}"#;
        // The template trimmed "Sure, ": the cut drops the marker and the trailing space.
        assert_eq!(
            render_chat(&t, &fields(body), Engine::Vllm).unwrap(),
            "<s>[user]Hi</>[assistant]Sure,"
        );
        let untrimmed =
            template("{% for m in messages %}[{{ m.role }}]{{ m.content }}</>{% endfor %}");
        assert_eq!(
            render_chat(&untrimmed, &fields(body), Engine::Vllm).unwrap(),
            "[user]Hi</>[assistant]Sure, "
        );
        // SGLang: the assistant message is taken out and appended after the generation prompt.
        assert_eq!(
            render_chat(&t, &fields(body), Engine::Sglang).unwrap(),
            "<s>[user]Hi</>[assistant]Sure, "
        );
    }

    #[test]
    fn a_final_message_the_template_drops_is_refused() {
        let t = template("{% for m in messages[:-1] %}{{ m.content }}{% endfor %}");
        let body = r#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],
                       "continue_final_message":true,"add_generation_prompt":false}"#;
        assert!(matches!(
            render_chat(&t, &fields(body), Engine::Vllm),
            Err(ChatError::ContinueFinalMessage(_))
        ));
    }

    #[test]
    fn request_fields_win_over_kwargs_and_kwargs_over_special_tokens() {
        let t = template("{{ bos_token }}|{{ add_generation_prompt }}|{{ x }}");
        let body = r#"{"messages":[],"chat_template_kwargs":{"bos_token":"B","add_generation_prompt":false,"x":1}}"#;
        assert_eq!(
            render_chat(&t, &fields(body), Engine::Vllm).unwrap(),
            "B|True|1"
        );
        let refused = r#"{"messages":[],"chat_template_kwargs":{"tokenize":true}}"#;
        assert_eq!(
            render_chat(&t, &fields(refused), Engine::Vllm)
                .unwrap_err()
                .to_string(),
            "Found unexpected chat template kwargs from request: {'tokenize'}"
        );
    }

    #[test]
    fn sglang_ignores_add_generation_prompt_and_turns_a_final_assistant_into_a_user() {
        let t = template(TRIMMING);
        let body = r#"{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}],
                       "add_generation_prompt":false}"#;
        assert_eq!(
            render_chat(&t, &fields(body), Engine::Sglang).unwrap(),
            "<s>[user]Hi</>[user]Yo</>[assistant]"
        );
    }
}
