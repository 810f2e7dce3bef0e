//! Prompt endpoints: the top-K of the prompt pool, adding and removing operator templates.
//!
//! - `GET /admin/prompts?k=` — the hottest entries, each with its endpoint, a summary of its
//!   traffic's shape (never a salt), its salt-dropped flag, the rejections of its warm calls
//!   and the end of its back-off;
//! - `POST /admin/prompts` — add a template (optionally with a shape);
//! - `DELETE /admin/prompts/{key}` — remove a template.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ApiError;
use super::input::json_body;
use super::AppState;
use crate::policy::hotness::{Origin, ShapeSummary, Template};
use crate::policy::PrefixKey;
use prewarm_core::request::Endpoint;

/// Largest `k` of `GET /admin/prompts`.
pub const MAX_TOP_K: usize = 1000;
/// Characters of prefix text shown per prompt.
const PREVIEW_CHARS: usize = 120;

#[derive(Deserialize)]
pub struct TopQuery {
    k: Option<String>,
}

/// One prompt in `GET /admin/prompts`.
#[derive(Debug, Serialize)]
pub struct PromptSummary {
    /// `PrefixKey` display form: `<model seed hex>-<last block hex>`.
    pub key: String,
    pub model: String,
    pub tenant: Option<String>,
    pub origin: Origin,
    pub hotness: f64,
    pub blocks: usize,
    pub text_bytes: usize,
    /// The first 120 characters of the canonical prefix text.
    pub preview: String,
    pub tags: Vec<String>,
    pub adoptions: u32,
    pub successes: u32,
    pub last_signal_ms: u64,
    /// Keep-warm keeps it warm (`false`: only experiment arms without keep-warm signalled it).
    pub keep_warm: bool,
    /// The endpoint its traffic used.
    pub endpoint: Endpoint,
    /// Its traffic's shape (messages, roles, tools and kwargs bytes, `salted`); null: none
    /// known (a completion without salt, or an entry from an older snapshot or filter).
    pub shape: Option<ShapeSummary>,
    /// A snapshot dropped its shape's salt: not warmed until a signal brings it again.
    pub salt_dropped: bool,
    /// Warm calls an engine rejected in a row.
    pub rejections: u32,
    /// Its back-off's end (ms, the gateway's clock), while it lasts; null otherwise.
    pub backoff_until_ms: Option<u64>,
}

pub async fn top(
    State(gateway): State<AppState>,
    Query(q): Query<TopQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let k = match q.k {
        None => 50,
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|k| (1..=MAX_TOP_K).contains(k))
            .ok_or_else(|| ApiError::BadRequest(format!("k: {s:?}: must be 1..{MAX_TOP_K}")))?,
    };
    let now = gateway.now();
    let state = gateway.state();
    let pool = state.fleet.pool();
    let prompts: Vec<PromptSummary> = pool
        .top(k)
        .into_iter()
        .map(|v| PromptSummary {
            key: v.key.to_string(),
            model: v.model.to_string(),
            tenant: v.tenant.map(str::to_string),
            origin: v.origin,
            hotness: v.hotness,
            blocks: v.blocks.len(),
            text_bytes: v.text.len(),
            preview: v.text.chars().take(PREVIEW_CHARS).collect(),
            tags: v.tags.to_vec(),
            adoptions: v.adoptions,
            successes: v.successes,
            last_signal_ms: v.last_signal_ms,
            keep_warm: v.keep_warm,
            endpoint: v.endpoint,
            shape: v.shape.map(|s| s.summary()),
            salt_dropped: v.salt_dropped,
            rejections: v.rejections,
            backoff_until_ms: (v.backoff_until_ms > now).then_some(v.backoff_until_ms),
        })
        .collect();
    Ok(Json(json!({
        "total": pool.len(),
        "templates": pool.templates(),
        "prompts": prompts,
    })))
}

pub async fn add(State(gateway): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let template: Template = json_body(&body)?;
    let fingerprint = gateway.config.fingerprint.core();
    let key = gateway
        .state()
        .fleet
        .pool_mut()
        .add_template(template, &fingerprint, gateway.now())
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok((StatusCode::CREATED, Json(json!({"key": key.to_string()}))).into_response())
}

pub async fn remove(
    State(gateway): State<AppState>,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let parsed = key
        .parse::<PrefixKey>()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if gateway.state().fleet.pool_mut().remove_template(&parsed) {
        Ok(Json(json!({"removed": key})).into_response())
    } else {
        Err(ApiError::NotFound(format!(
            "key: {key:?}: no such template"
        )))
    }
}
