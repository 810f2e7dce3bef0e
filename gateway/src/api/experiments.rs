//! Experiment endpoints: start (or re-weight) one, read the running one, end it
//! (docs/admin-api.md#experiments).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use prewarm_core::experiment::Experiment;
use serde_json::json;

use super::error::ApiError;
use super::input::json_body;
use super::AppState;
use crate::policy::fleet::ExperimentError;

impl From<ExperimentError> for ApiError {
    fn from(e: ExperimentError) -> Self {
        match e {
            ExperimentError::Invalid(problem) => ApiError::BadRequest(problem),
            ExperimentError::AnotherRunning { .. } => ApiError::Conflict(e.to_string()),
            ExperimentError::NotRunning(_) => ApiError::NotFound(e.to_string()),
        }
    }
}

/// `POST /admin/experiments`: 201 with the experiment when it starts, 200 when it re-weights
/// the running one of the same id.
pub async fn start(State(gateway): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let definition: Experiment = json_body(&body)?;
    let (running, new) = gateway.start_experiment(definition).await?;
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(running)).into_response())
}

/// `GET /admin/experiments`: the running experiment, or `null`.
pub async fn list(State(gateway): State<AppState>) -> Response {
    let running = gateway.state().fleet.experiment().cloned();
    Json(json!({ "running": running })).into_response()
}

/// `GET /admin/experiments/{id}`: the experiment and its report.
pub async fn detail(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (running, report) = gateway
        .experiment_report(&id, true)
        .ok_or_else(|| ApiError::from(ExperimentError::NotRunning(id)))?;
    let mut body = serde_json::to_value(&running).map_err(|_| ApiError::Internal)?;
    if let Some(fields) = body.as_object_mut() {
        fields.insert(
            "report".into(),
            serde_json::to_value(&report).map_err(|_| ApiError::Internal)?,
        );
    }
    Ok(Json(body).into_response())
}

/// `DELETE /admin/experiments/{id}`: ends it.
pub async fn end(
    State(gateway): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let ended = gateway.end_experiment(&id).await?;
    Ok(Json(json!({ "ended": ended.definition.id })).into_response())
}
