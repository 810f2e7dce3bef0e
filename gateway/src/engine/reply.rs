//! Decoding of adapter load/unload replies in every shape pods use:
//! - vLLM success: HTTP 200 with a plain-text body (`Success: LoRA adapter 'x' added ...`);
//! - SGLang: JSON `{"success": bool, "error_message": ..., "loaded_adapters": ...}` (200 or 400);
//! - vLLM errors: nested `{"error": {"message", "type", "code"}}` (0.10.1 on) or flat
//!   `{"object": "error", "message", "type", "code"}` (before).

use serde::Deserialize;

use super::AdapterOutcome;

/// A decoded error reply: its type (`NotFoundError`, `InvalidUserInput`, ...) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub kind: String,
    pub message: String,
}

#[derive(Deserialize)]
struct Nested {
    error: Flat,
}

#[derive(Deserialize)]
struct Flat {
    #[serde(default)]
    message: String,
    #[serde(default, rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct SglangReply {
    success: bool,
    #[serde(default)]
    error_message: Option<String>,
}

/// Decodes an error body in either vLLM shape; a body in neither becomes kind `unknown` with the
/// body's first 200 characters as its message.
pub fn error_reply(body: &[u8]) -> ErrorReply {
    if let Ok(n) = serde_json::from_slice::<Nested>(body) {
        return ErrorReply {
            kind: n.error.kind,
            message: n.error.message,
        };
    }
    if let Ok(f) = serde_json::from_slice::<Flat>(body) {
        if !f.message.is_empty() || !f.kind.is_empty() {
            return ErrorReply {
                kind: f.kind,
                message: f.message,
            };
        }
    }
    let text = String::from_utf8_lossy(body);
    ErrorReply {
        kind: "unknown".into(),
        message: text.chars().take(200).collect(),
    }
}

/// How an adapter call ended, as far as the reply says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterReply {
    Ok(AdapterOutcome),
    Failed { status: u16, error: ErrorReply },
}

/// A vLLM load reply. "Already loaded" (a 400 `InvalidUserInput` saying so) counts as there.
pub fn vllm_load(status: u16, body: &[u8]) -> AdapterReply {
    if status == 200 {
        return AdapterReply::Ok(AdapterOutcome::Done);
    }
    let error = error_reply(body);
    if status == 400 && error.message.contains("already been loaded") {
        return AdapterReply::Ok(AdapterOutcome::AlreadyThere);
    }
    AdapterReply::Failed { status, error }
}

/// A vLLM unload reply. An unknown name (404) counts as already unloaded.
pub fn vllm_unload(status: u16, body: &[u8]) -> AdapterReply {
    match status {
        200 => AdapterReply::Ok(AdapterOutcome::Done),
        404 => {
            let error = error_reply(body);
            if error.message.contains("cannot be found") {
                AdapterReply::Ok(AdapterOutcome::AlreadyThere)
            } else {
                AdapterReply::Failed { status, error }
            }
        }
        _ => AdapterReply::Failed {
            status,
            error: error_reply(body),
        },
    }
}

/// An SGLang load or unload reply (`already` phrases count as there).
pub fn sglang(status: u16, body: &[u8]) -> AdapterReply {
    match serde_json::from_slice::<SglangReply>(body) {
        Ok(r) if r.success => AdapterReply::Ok(AdapterOutcome::Done),
        Ok(r) => {
            let message = r.error_message.unwrap_or_default();
            let lower = message.to_ascii_lowercase();
            if lower.contains("already loaded") || lower.contains("already exists") {
                AdapterReply::Ok(AdapterOutcome::AlreadyThere)
            } else {
                AdapterReply::Failed {
                    status: if status == 200 { 400 } else { status },
                    error: ErrorReply {
                        kind: "SglangError".into(),
                        message,
                    },
                }
            }
        }
        Err(_) => AdapterReply::Failed {
            status,
            error: error_reply(body),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_plain_text_success() {
        assert_eq!(
            vllm_load(200, b"Success: LoRA adapter 'a' added successfully."),
            AdapterReply::Ok(AdapterOutcome::Done)
        );
        assert_eq!(
            vllm_unload(200, b"Success: LoRA adapter 'a' removed successfully."),
            AdapterReply::Ok(AdapterOutcome::Done)
        );
    }

    #[test]
    fn nested_and_flat_errors() {
        let nested = br#"{"error":{"message":"Loading lora a failed: No adapter found for /x","type":"NotFoundError","param":null,"code":404}}"#;
        let flat = br#"{"object":"error","message":"Loading lora a failed: No adapter found for /x","type":"NotFoundError","param":null,"code":404}"#;
        for body in [&nested[..], &flat[..]] {
            match vllm_load(404, body) {
                AdapterReply::Failed { status, error } => {
                    assert_eq!(status, 404);
                    assert_eq!(error.kind, "NotFoundError");
                    assert!(error.message.contains("No adapter found"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn already_loaded_and_unknown_unload_are_idempotent() {
        let already = br#"{"error":{"message":"The lora adapter 'a' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.","type":"InvalidUserInput","code":400}}"#;
        assert_eq!(
            vllm_load(400, already),
            AdapterReply::Ok(AdapterOutcome::AlreadyThere)
        );
        let unknown = br#"{"object":"error","message":"The lora adapter 'a' cannot be found.","type":"NotFoundError","code":404}"#;
        assert_eq!(
            vllm_unload(404, unknown),
            AdapterReply::Ok(AdapterOutcome::AlreadyThere)
        );
    }

    #[test]
    fn sglang_json_replies() {
        assert_eq!(
            sglang(
                200,
                br#"{"success":true,"error_message":null,"loaded_adapters":{"a":"/p"}}"#
            ),
            AdapterReply::Ok(AdapterOutcome::Done)
        );
        match sglang(
            400,
            br#"{"success":false,"error_message":"max loaded loras reached"}"#,
        ) {
            AdapterReply::Failed { status, error } => {
                assert_eq!(status, 400);
                assert!(error.message.contains("max loaded"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_is_reported_not_panicked_on() {
        let e = error_reply(&[0xff, 0x00, b'{']);
        assert_eq!(e.kind, "unknown");
    }
}
