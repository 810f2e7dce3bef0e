//! `GET /v1/models`: the base model's card and one card per registered adapter, as vLLM
//! renders them (`owned_by`, `root`, `parent`, `max_model_len`, `permission`).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use crate::config::Engine;

fn permission(created: u64, n: usize) -> Value {
    json!([{
        "id": format!("modelperm-{created:x}{n:04x}"),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": false,
        "allow_sampling": true,
        "allow_logprobs": true,
        "allow_search_indices": false,
        "allow_view": true,
        "allow_fine_tuning": false,
        "organization": "*",
        "group": null,
        "is_blocking": false,
    }])
}

pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let config = &state.config.pod;
    let owner = match config.engine {
        Engine::Vllm => "vllm",
        Engine::Sglang => "sglang",
    };
    let created = state.created;
    let mut data = vec![json!({
        "id": config.served_model_name,
        "object": "model",
        "created": created,
        "owned_by": owner,
        "root": config.model_path,
        "parent": null,
        "max_model_len": config.max_model_len,
        "permission": permission(created, 0),
    })];
    let pod = state.lock_pod();
    for (i, adapter) in pod.registered_adapters().enumerate() {
        data.push(json!({
            "id": adapter.name,
            "object": "model",
            "created": created,
            "owned_by": owner,
            "root": adapter.path,
            "parent": config.served_model_name,
            "max_model_len": null,
            "permission": permission(created, i + 1),
        }));
    }
    Json(json!({"object": "list", "data": data}))
}
