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
use crate::service::now_ms;
use crate::service::planning::{plan_for, Candidates, PlanView};
use crate::service::pods::{PodHealth, PodSource};
use crate::warmup::executor::start_warmup;

fn unknown(id: &str) -> ApiError {
    ApiError::NotFound(format!("pod {id:?}: not in the pool"))
}

pub async fn list(State(gateway): State<AppState>) -> Json<serde_json::Value> {
    let now = now_ms();
    let pods: Vec<PodSummary> = gateway
        .state()
        .pods
        .values()
        .map(|p| summary(p, now))
        .collect();
    Json(json!({ "pods": pods }))
}

pub async fn detail(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = now_ms();
    let state = gateway.state();
    let pod = state.pods.get(&id).ok_or_else(|| unknown(&id))?;
    Ok(Json(pod_detail(pod, now)).into_response())
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
    let (health, epoch) = {
        let state = gateway.state();
        let pod = state.pods.get(&id).ok_or_else(|| unknown(&id))?;
        (pod.health, pod.epoch)
    };
    if health != PodHealth::Up {
        return Err(ApiError::Conflict(format!(
            "pod {id:?}: not up: its warm-up starts when it is"
        )));
    }
    start_warmup(&gateway, &id, epoch);
    let status = gateway
        .state()
        .pods
        .get(&id)
        .and_then(|p| p.warmup.status(now_ms()));
    Ok((StatusCode::ACCEPTED, Json(status)).into_response())
}

pub async fn warmup_progress(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let state = gateway.state();
    let pod = state.pods.get(&id).ok_or_else(|| unknown(&id))?;
    Ok(Json(json!({"pod": id, "warmup": pod.warmup.status(now_ms())})).into_response())
}

pub async fn plan(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let state = gateway.state();
    let plan = plan_for(&gateway, &state, &id, Candidates::Live).ok_or_else(|| unknown(&id))?;
    Ok(Json(PlanView::from(&plan)).into_response())
}
