//! Pod endpoints: list, detail, add, remove, trigger warm-up, warm-up progress, plan.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::input::json_body;
use super::views::{detail as pod_detail, summary, PodSummary};
use super::AppState;
use crate::config::PodSpec;
use crate::policy::fleet::Candidates;
use crate::service::planning::PlanView;
use crate::service::pods::PodSource;

fn unknown(id: &str) -> ApiError {
    ApiError::NotFound(format!("pod {id:?}: not in the pool"))
}

pub async fn list(State(gateway): State<AppState>) -> Json<serde_json::Value> {
    let now = gateway.now();
    let state = gateway.state();
    let pods: Vec<PodSummary> = state
        .fleet
        .pods()
        .filter_map(|p| Some(summary(p, state.pods.get(&p.shape.id)?, now)))
        .collect();
    Json(json!({ "pods": pods }))
}

pub async fn detail(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = gateway.now();
    let state = gateway.state();
    let (Some(pod), Some(io)) = (state.fleet.pod(&id), state.pods.get(&id)) else {
        return Err(unknown(&id));
    };
    Ok(Json(pod_detail(pod, io, now)).into_response())
}

pub async fn add(State(gateway): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let spec: PodSpec = json_body(&body)?;
    let id = spec.id.clone();
    gateway.add_pod(spec, PodSource::Admin)?;
    Ok((StatusCode::CREATED, Json(json!({"added": id}))).into_response())
}

pub async fn remove(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    gateway.remove_pod(&id)?;
    Ok(Json(json!({"removed": id})).into_response())
}

pub async fn trigger_warmup(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let started = gateway.fleet(|f| {
        if f.pod(&id).is_none() {
            return Err(unknown(&id));
        }
        Ok(f.start_warmup(&id, gateway.now()))
    })?;
    if !started {
        return Err(ApiError::Conflict(format!(
            "pod {id:?}: not up: its warm-up starts when it is"
        )));
    }
    gateway.republish_table();
    let status = gateway
        .state()
        .fleet
        .pod(&id)
        .and_then(|p| p.warmup.status(gateway.now()));
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

pub async fn warmup_progress(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let state = gateway.state();
    let pod = state.fleet.pod(&id).ok_or_else(|| unknown(&id))?;
    let warmed: Vec<String> = pod
        .warmup
        .first_tier_warmed()
        .iter()
        .map(ToString::to_string)
        .collect();
    Ok(Json(json!({
        "pod": id,
        "warmup": pod.warmup.status(gateway.now()),
        "first_tier_warmed": warmed,
    }))
    .into_response())
}

pub async fn plan(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let plan = gateway
        .state()
        .fleet
        .plan_for(&id, Candidates::Live, gateway.now())
        .ok_or_else(|| unknown(&id))?;
    Ok(Json(PlanView::from(&plan)).into_response())
}
