//! The canonical prompt: one deterministic rendering of a request's prompt that the filter, the
//! gateway, podsim and the evaluator all hash and count.
//!
//! - Completions and embeddings: the prompt text itself; a batch of prompts is joined by `\n`.
//!   A single-prompt completion therefore renders to exactly its prompt, so the gateway can
//!   prefill a prefix with a plain completion whose prompt is the canonical prefix text.
//! - Chat: each message as `<|role|>\n` + text + `\n`, in order. The rendering of the first
//!   `k` messages is a byte prefix of the rendering of all of them, so a shared system prompt
//!   or few-shot preamble is a shared block prefix.
//!
//! Same request → same bytes, on every platform: nothing here depends on hashing order,
//! locale or pointer width.

use crate::request::{InferenceRequest, Prompt};

/// Appends the canonical rendering of one chat message to `out`.
pub fn push_chat_message(out: &mut String, role: &str, text: &str) {
    out.push_str("<|");
    out.push_str(role);
    out.push_str("|>\n");
    out.push_str(text);
    out.push('\n');
}

/// The canonical rendering of a prompt.
pub fn canonical_prompt_of(prompt: &Prompt) -> String {
    match prompt {
        Prompt::Texts(texts) => texts.join("\n"),
        Prompt::Chat(messages) => {
            let len = messages
                .iter()
                .map(|m| m.role.len().saturating_add(m.text.len()).saturating_add(6))
                .fold(0usize, usize::saturating_add);
            let mut out = String::with_capacity(len);
            for m in messages {
                push_chat_message(&mut out, &m.role, &m.text);
            }
            out
        }
    }
}

/// The canonical rendering of a request's prompt.
pub fn canonical_prompt(request: &InferenceRequest) -> String {
    canonical_prompt_of(&request.prompt)
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use crate::request::ChatMessage;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat(msgs: &[(&str, &str)]) -> Prompt {
        Prompt::Chat(
            msgs.iter()
                .map(|(r, t)| ChatMessage {
                    role: r.to_string(),
                    text: t.to_string(),
                    parts: false,
                })
                .collect(),
        )
    }

    #[test]
    fn single_completion_prompt_renders_as_itself() {
        assert_eq!(
            canonical_prompt_of(&Prompt::Texts(vec!["hello".into()])),
            "hello"
        );
        assert_eq!(
            canonical_prompt_of(&Prompt::Texts(vec!["a".into(), "b".into()])),
            "a\nb"
        );
    }

    #[test]
    fn chat_rendering_is_fixed_and_prefix_closed() {
        let two = canonical_prompt_of(&chat(&[("system", "S"), ("user", "U")]));
        assert_eq!(two, "<|system|>\nS\n<|user|>\nU\n");
        let one = canonical_prompt_of(&chat(&[("system", "S")]));
        assert!(two.starts_with(&one));
    }
}
