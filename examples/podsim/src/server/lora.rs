//! Runtime LoRA routes.
//!
//! - vLLM: `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"?}` and
//!   `POST /v1/unload_lora_adapter` `{"lora_name"}`; plain-text successes, errors in vLLM's
//!   JSON format. A load returns after the adapter is read into the host cache (its disk-load
//!   time, scaled).
//! - SGLang: `POST /load_lora_adapter` `{"lora_name", "lora_path", "pinned"?}` and
//!   `POST /unload_lora_adapter`; always JSON `{"success", "error_message", "loaded_adapters"}`
//!   with 200 or 400.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::adapter_dir::{read_adapter_rank, AdapterDirError};
use super::errors::ApiError;
use super::{json_body, AppState};
use crate::adapters::AdapterSpec;
use crate::pod::AdapterError;

/// Longest adapter name accepted.
const MAX_NAME_BYTES: usize = 256;
/// Longest adapter path accepted.
const MAX_PATH_BYTES: usize = 4096;

#[derive(Deserialize, Default)]
struct AdapterBody {
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    lora_path: Option<String>,
    #[serde(default)]
    load_inplace: bool,
    #[serde(default)]
    pinned: bool,
}

fn parse_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<AdapterBody, ApiError> {
    let body = json_body(headers, body)?;
    let parsed: AdapterBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::validation(Some("body"), format!("body: not valid JSON: {e}")))?;
    if parsed
        .lora_name
        .as_ref()
        .is_some_and(|n| n.len() > MAX_NAME_BYTES)
    {
        return Err(ApiError::invalid_user_input(format!(
            "lora_name: longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    if parsed
        .lora_path
        .as_ref()
        .is_some_and(|p| p.len() > MAX_PATH_BYTES)
    {
        return Err(ApiError::invalid_user_input(format!(
            "lora_path: longer than {MAX_PATH_BYTES} bytes"
        )));
    }
    Ok(parsed)
}

/// Registers the adapter after reading its directory; returns the model time the load takes.
async fn load(
    state: &AppState,
    body: AdapterBody,
    replace: bool,
) -> Result<(String, f64), ApiError> {
    if body.lora_name.is_none() {
        return Err(ApiError::missing_body_field("body.lora_name"));
    }
    if body.lora_path.is_none() {
        return Err(ApiError::missing_body_field("body.lora_path"));
    }
    let (Some(name), Some(path)) = (
        body.lora_name.filter(|n| !n.is_empty()),
        body.lora_path.filter(|p| !p.is_empty()),
    ) else {
        return Err(ApiError::invalid_user_input(
            "Both 'lora_name' and 'lora_path' must be provided.",
        ));
    };
    let known = state
        .lock_pod()
        .registered_adapters()
        .any(|a| a.name == name);
    if known && !replace {
        return Err(AdapterError::AlreadyLoaded { name }.into());
    }
    let rank = read_adapter_rank(&path).await.map_err(|e| match e {
        AdapterDirError::Missing { .. } => ApiError::not_found(format!(
            "Loading lora {name} failed: No adapter found for {path}"
        )),
        AdapterDirError::BadConfig { .. } => {
            ApiError::internal(format!("Loading lora {name} failed: {e}"))
        }
    })?;
    let spec = AdapterSpec {
        name: name.clone(),
        path,
        rank,
        pinned: body.pinned,
    };
    let cost = {
        let mut pod = state.lock_pod();
        let cost = pod.load_adapter(spec, replace)?;
        let snapshot = pod.metrics(state.clock.now());
        state.exporter.sync(&snapshot);
        cost
    };
    Ok((name, cost))
}

fn unload(state: &AppState, body: AdapterBody) -> Result<String, ApiError> {
    if body.lora_name.is_none() {
        return Err(ApiError::missing_body_field("body.lora_name"));
    }
    let Some(name) = body.lora_name.filter(|n| !n.is_empty()) else {
        return Err(ApiError::invalid_user_input(
            "'lora_name' needs to be provided to unload a LoRA adapter.",
        ));
    };
    state.lock_pod().unload_adapter(&name)?;
    Ok(name)
}

pub async fn vllm_load(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let outcome = match parse_body(&headers, body) {
        Ok(b) => {
            let replace = b.load_inplace;
            // `pinned` is SGLang's; vLLM ignores it.
            let b = AdapterBody { pinned: false, ..b };
            load(&state, b, replace).await
        }
        Err(e) => Err(e),
    };
    match outcome {
        Ok((name, cost)) => {
            state.clock.sleep(cost).await;
            format!("Success: LoRA adapter '{name}' added successfully.").into_response()
        }
        Err(e) => state.error(e),
    }
}

pub async fn vllm_unload(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match parse_body(&headers, body).and_then(|b| unload(&state, b)) {
        Ok(name) => format!("Success: LoRA adapter '{name}' removed successfully.").into_response(),
        Err(e) => state.error(e),
    }
}

fn sglang_reply(state: &AppState, error: Option<ApiError>) -> Response {
    let loaded: Map<String, Value> = state
        .lock_pod()
        .registered_adapters()
        .map(|a| (a.name.clone(), Value::String(a.path.clone())))
        .collect();
    let (status, success, message) = match error {
        None => (StatusCode::OK, true, String::new()),
        Some(e) => (StatusCode::BAD_REQUEST, false, e.message),
    };
    (
        status,
        Json(json!({"success": success, "error_message": message, "loaded_adapters": loaded})),
    )
        .into_response()
}

pub async fn sglang_load(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let outcome = match parse_body(&headers, body) {
        Ok(b) => load(&state, b, false).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok((_, cost)) => {
            state.clock.sleep(cost).await;
            sglang_reply(&state, None)
        }
        Err(e) => sglang_reply(&state, Some(e)),
    }
}

pub async fn sglang_unload(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let error = parse_body(&headers, body)
        .and_then(|b| unload(&state, b))
        .err();
    sglang_reply(&state, error)
}
