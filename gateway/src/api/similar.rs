//! Prompt-embedding reads (with `embeddings.model_dir`; 404 without):
//! - `GET /admin/prompts/similar?text=T&k=N` — the N (default 10, 1..=100) pool prompts nearest
//!   to T (1..=8,192 bytes) by cosine of their all-MiniLM-L6-v2 vectors, nearest first;
//! - `GET /admin/prompts/groups?k=N` — the N (default 20, 1..=100) hottest semantic groups of
//!   hot prompts, and the index's status.
//!
//! 503 until the first index is built (the gateway is not ready before then either).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::AppState;
use crate::embeddings::search::PromptSearch;

/// Longest `text` of `/admin/prompts/similar`, bytes (the embedder reads at most
/// `embeddings.max_text_bytes` of it).
pub const MAX_QUERY_BYTES: usize = 8192;
/// Largest `k` of both endpoints.
pub const MAX_K: usize = 100;

#[derive(Deserialize)]
pub struct SimilarQuery {
    text: Option<String>,
    k: Option<String>,
}

#[derive(Deserialize)]
pub struct GroupsQuery {
    k: Option<String>,
}

fn parse_k(k: Option<String>, default: usize) -> Result<usize, ApiError> {
    match k {
        None => Ok(default),
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|k| (1..=MAX_K).contains(k))
            .ok_or_else(|| ApiError::BadRequest(format!("k: {s:?}: must be 1..{MAX_K}"))),
    }
}

fn search_of(gateway: &AppState) -> Result<Arc<PromptSearch>, ApiError> {
    let search = gateway.embeddings.clone().ok_or_else(|| {
        ApiError::NotFound("embeddings: off (embeddings.model_dir is not set)".into())
    })?;
    if !search.is_built() {
        return Err(ApiError::Unavailable(
            "embeddings: the prompt index is not built yet".into(),
        ));
    }
    Ok(search)
}

pub async fn similar(
    State(gateway): State<AppState>,
    Query(q): Query<SimilarQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = parse_k(q.k, 10)?;
    let text = q
        .text
        .ok_or_else(|| ApiError::BadRequest("text: missing: required".into()))?;
    if text.trim().is_empty() || text.len() > MAX_QUERY_BYTES {
        return Err(ApiError::BadRequest(format!(
            "text: {} bytes: must be 1..{MAX_QUERY_BYTES} bytes, not blank",
            text.len()
        )));
    }
    let search = search_of(&gateway)?;
    let probe = search.config().index_probe;
    let found = tokio::task::spawn_blocking(move || {
        search
            .embed_query(&text)
            .map(|v| search.index().nearest(&v, k, probe))
    })
    .await
    .map_err(|_| ApiError::Internal)?
    .map_err(|e| {
        tracing::error!(error = %e, "embedding a similar-prompts query failed");
        ApiError::Internal
    })?;
    Ok(Json(json!({"k": k, "prompts": found})))
}

pub async fn groups(
    State(gateway): State<AppState>,
    Query(q): Query<GroupsQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = parse_k(q.k, 20)?;
    let search = search_of(&gateway)?;
    let min_cosine = search.config().group_cosine;
    let status = search.status();
    let mut groups = tokio::task::spawn_blocking(move || search.index().groups(min_cosine))
        .await
        .map_err(|_| ApiError::Internal)?;
    let total = groups.len();
    groups.truncate(k);
    Ok(Json(json!({
        "index": status,
        "min_cosine": min_cosine,
        "total": total,
        "groups": groups,
    })))
}
