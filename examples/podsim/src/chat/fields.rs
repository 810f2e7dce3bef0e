//! The body fields podsim reads beyond prewarm-core's parse: the chat template's inputs and the
//! cache salt. Every field is parsed as any JSON value, so a wrong type is reported by the rule
//! of the engine podsim imitates, naming the field, and never fails the whole body.

use minijinja::value::ValueKind;
use minijinja::Value;
use serde::Deserialize;

use super::ChatError;
use crate::config::Engine;

/// vLLM's limit on a cache salt, in characters.
const MAX_CACHE_SALT_CHARS: usize = 128;

/// The fields, each `None` when absent or null.
#[derive(Debug, Default, Deserialize)]
pub struct EngineFields {
    #[serde(default)]
    pub messages: Option<Value>,
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Value>,
    #[serde(default)]
    pub add_generation_prompt: Option<Value>,
    #[serde(default)]
    pub continue_final_message: Option<Value>,
    #[serde(default)]
    pub cache_salt: Option<Value>,
    /// SGLang's caller-defined cache key, concatenated after the salt.
    #[serde(default)]
    pub extra_key: Option<Value>,
}

impl EngineFields {
    /// The fields of a JSON body; an undecodable body gives all-absent fields (prewarm-core's
    /// parse reports it).
    pub fn of(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }

    /// A boolean flag with its default, read as pydantic's lax `bool` reads it.
    pub fn flag(
        value: Option<&Value>,
        field: &'static str,
        default: bool,
    ) -> Result<bool, ChatError> {
        let Some(v) = value else {
            return Ok(default);
        };
        let parsed = match v.kind() {
            ValueKind::Bool => Some(v.is_true()),
            ValueKind::Number => match i64::try_from(v.clone()) {
                Ok(0) => Some(false),
                Ok(1) => Some(true),
                _ => None,
            },
            ValueKind::String => match v.as_str().map(str::to_ascii_lowercase).as_deref() {
                Some("true" | "t" | "yes" | "y" | "on" | "1") => Some(true),
                Some("false" | "f" | "no" | "n" | "off" | "0") => Some(false),
                _ => None,
            },
            _ => None,
        };
        parsed.ok_or(ChatError::Field {
            field,
            rule: "Input should be a valid boolean".into(),
        })
    }
}

/// The key that isolates a request's cached blocks, from `cache_salt` (and on SGLang
/// `extra_key`), checked by the engine's rules:
/// - vLLM: a non-empty string of at most 128 characters without `@`, `/`, `\` or NUL;
/// - SGLang: strings, concatenated (`cache_salt` then `extra_key`); empty ones are ignored.
pub fn cache_salt(fields: &EngineFields, engine: Engine) -> Result<Option<String>, ChatError> {
    match engine {
        Engine::Vllm => {
            let Some(v) = &fields.cache_salt else {
                return Ok(None);
            };
            let salt = v.as_str().filter(|s| !s.is_empty()).ok_or_else(|| {
                ChatError::CacheSalt(
                    "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"
                        .into(),
                )
            })?;
            if salt.chars().count() > MAX_CACHE_SALT_CHARS || salt.contains(['@', '/', '\\', '\0'])
            {
                return Err(ChatError::CacheSalt(
                    "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)"
                        .into(),
                ));
            }
            Ok(Some(salt.to_string()))
        }
        Engine::Sglang => {
            let mut key = String::new();
            for (name, v) in [
                ("cache_salt", &fields.cache_salt),
                ("extra_key", &fields.extra_key),
            ] {
                let Some(v) = v else { continue };
                match v.as_str() {
                    Some(s) => key.push_str(s),
                    None if !v.is_true() => {}
                    None => {
                        return Err(ChatError::CacheSalt(format!(
                            "Value of {name} must be a string, but got {}",
                            python_type(v)
                        )))
                    }
                }
            }
            Ok(Some(key).filter(|k| !k.is_empty()))
        }
    }
}

fn python_type(v: &Value) -> &'static str {
    match v.kind() {
        ValueKind::Seq => "list",
        ValueKind::Map => "dict",
        ValueKind::Bool => "bool",
        ValueKind::Number if v.is_integer() => "int",
        ValueKind::Number => "float",
        _ => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> EngineFields {
        EngineFields::of(body.as_bytes())
    }

    #[test]
    fn salts_follow_each_engines_rules() {
        assert_eq!(
            cache_salt(&fields(r#"{"cache_salt":"t1"}"#), Engine::Vllm),
            Ok(Some("t1".into()))
        );
        assert_eq!(cache_salt(&fields(r#"{}"#), Engine::Vllm), Ok(None));
        for bad in [
            r#"{"cache_salt":""}"#,
            r#"{"cache_salt":7}"#,
            r#"{"cache_salt":"a/b"}"#,
        ] {
            assert!(
                matches!(
                    cache_salt(&fields(bad), Engine::Vllm),
                    Err(ChatError::CacheSalt(_))
                ),
                "{bad}"
            );
        }
        let long = format!(r#"{{"cache_salt":"{}"}}"#, "x".repeat(129));
        assert!(cache_salt(&fields(&long), Engine::Vllm).is_err());
        assert_eq!(
            cache_salt(
                &fields(r#"{"cache_salt":"a","extra_key":"b"}"#),
                Engine::Sglang
            ),
            Ok(Some("ab".into()))
        );
        assert_eq!(
            cache_salt(&fields(r#"{"cache_salt":""}"#), Engine::Sglang),
            Ok(None)
        );
        assert!(cache_salt(&fields(r#"{"cache_salt":["a"]}"#), Engine::Sglang).is_err());
    }

    #[test]
    fn flags_read_like_pydantic_bools() {
        let f = fields(r#"{"add_generation_prompt":"false","continue_final_message":1}"#);
        assert_eq!(
            EngineFields::flag(
                f.add_generation_prompt.as_ref(),
                "add_generation_prompt",
                true
            ),
            Ok(false)
        );
        assert_eq!(
            EngineFields::flag(
                f.continue_final_message.as_ref(),
                "continue_final_message",
                false
            ),
            Ok(true)
        );
        assert_eq!(EngineFields::flag(None, "x", true), Ok(true));
        let bad = fields(r#"{"add_generation_prompt":[]}"#);
        assert!(EngineFields::flag(
            bad.add_generation_prompt.as_ref(),
            "add_generation_prompt",
            true
        )
        .is_err());
    }
}
