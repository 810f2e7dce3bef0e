//! The filters' endpoints: `POST /v1/signals` (screened first: names within limits, prefix
//! hashes recomputed from the text), `GET /v1/routing[?since=<generation>]` (with ETag/304; the
//! delta from `since` when the gateway keeps that generation, else the whole table) and
//! `GET /v1/embeddings/warm?after=<generation>` (the warm embedding entries computed since).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use prewarm_core::wire::{SignalBatch, WireError, MAX_EMBEDDINGS_PER_BATCH};

use super::error::ApiError;
use super::AppState;
use crate::policy::hotness::screen::screen;
use crate::service::table::TableReply;
use crate::telemetry::Telemetry;

/// Signals a batch may carry at most.
pub const MAX_SIGNALS_PER_BATCH: usize = 10_000;

pub async fn post_signals(
    State(gateway): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let batch = SignalBatch::decode(&body).map_err(|e| match e {
        WireError::IncompatibleVersion { .. } => ApiError::BadRequest(e.to_string()),
        WireError::Malformed(m) => ApiError::BadRequest(m),
    })?;
    if batch.signals.len() > MAX_SIGNALS_PER_BATCH {
        return Err(ApiError::BadRequest(format!(
            "signals: {}: at most {MAX_SIGNALS_PER_BATCH} per batch",
            batch.signals.len()
        )));
    }
    if batch.embeddings.len() > MAX_EMBEDDINGS_PER_BATCH {
        return Err(ApiError::BadRequest(format!(
            "embeddings: {}: at most {MAX_EMBEDDINGS_PER_BATCH} per batch",
            batch.embeddings.len()
        )));
    }
    let (batch, refused) = screen(batch, &gateway.config.fingerprint.core());
    let mut accepted = gateway.ingest_signals(batch);
    if !refused.is_empty() {
        Telemetry::add(
            &gateway.telemetry.signals,
            &[("kind", "rejected")],
            refused.len() as u64,
        );
        accepted.rejected += refused.len();
        let room = 8usize.saturating_sub(accepted.reasons.len());
        accepted
            .reasons
            .extend(refused.iter().take(room).map(|e| e.to_string()));
    }
    Ok((StatusCode::ACCEPTED, Json(accepted)).into_response())
}

/// `GET /v1/routing` query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingQuery {
    /// The generation the filter holds: it gets the delta from it when the gateway keeps it.
    since: Option<String>,
}

/// The longest `since` value quoted back in an error.
const MAX_QUOTED: usize = 32;

pub async fn get_routing(
    State(gateway): State<AppState>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<RoutingQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(query) =
        query.map_err(|e| ApiError::BadRequest(format!("query: {}", e.body_text())))?;
    let since = match query.since.as_deref() {
        None => None,
        Some(raw) => Some(raw.parse::<u64>().map_err(|_| {
            let quoted: String = raw.chars().take(MAX_QUOTED).collect();
            ApiError::BadRequest(format!("since: {quoted:?}: must be a generation (0..2^64)"))
        })?),
    };
    let table = gateway.published_table();
    let etag = table.etag();
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let telemetry = &gateway.telemetry;
    if unchanged {
        Telemetry::add(&telemetry.table_replies, &[("kind", "unchanged")], 1);
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response());
    }
    let (kind, body) = match table.reply(since) {
        TableReply::Whole(json) => ("whole", json),
        TableReply::Delta(json) => ("delta", json),
    };
    Telemetry::add(&telemetry.table_replies, &[("kind", kind)], 1);
    Telemetry::add(
        &telemetry.table_reply_bytes,
        &[("kind", kind)],
        body.len() as u64,
    );
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, "no-cache".to_string()),
        ],
        body.to_vec(),
    )
        .into_response())
}

/// `GET /v1/embeddings/warm` query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmQuery {
    #[serde(default)]
    after: u64,
}

pub async fn get_warm_embeddings(
    State(gateway): State<AppState>,
    query: Result<axum::extract::Query<WarmQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(query) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "after: {}: must be a generation (0..2^64)",
            e.body_text()
        ))
    })?;
    let doc = gateway.warm_embeddings_since(query.after);
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        doc.encode(),
    )
        .into_response())
}
