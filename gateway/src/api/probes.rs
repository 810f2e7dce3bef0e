//! Probes and metrics: `/healthz`, `/readyz`, `/metrics`, the per-pod readiness gate
//! `GET /v1/pods/{id}/ready`, and `POST /admin/snapshot`.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::AppState;

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(gateway): State<AppState>) -> Response {
    if gateway.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else if let Some(reason) = gateway.restore_refused() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "snapshot not loaded\n").into_response()
    }
}

pub async fn metrics(State(gateway): State<AppState>) -> Response {
    // the running experiment's figures as of this scrape
    gateway.export_experiment();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        gateway.telemetry.render(),
    )
        .into_response()
}

pub async fn pod_ready(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = gateway.now();
    let state = gateway.state();
    let pod = state
        .fleet
        .pod(&id)
        .ok_or_else(|| ApiError::NotFound(format!("pod {id:?}: not in the pool")))?;
    let ready = pod.routable(now);
    let body = Json(json!({"pod": id, "ready": ready, "health": pod.health}));
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Ok((status, body).into_response())
}

pub async fn snapshot(State(gateway): State<AppState>) -> Result<Response, ApiError> {
    let g = gateway.clone();
    let written = tokio::task::spawn_blocking(move || g.write_snapshot())
        .await
        .map_err(|_| ApiError::Internal)?
        .map_err(|e| match gateway.restore_refused() {
            Some(_) => ApiError::Conflict(e.to_string()),
            None => ApiError::Unavailable(format!("snapshot: {e}")),
        })?;
    Ok(Json(written).into_response())
}
