//! Adapter endpoints: register (a new version of a known name is a rollout), rollback, list,
//! detail, pin, unpin, remove, and the residency heatmap (adapters × pods).
//!
//! A rollout that leaves the pods holding the adapter on different versions (a pod refused or
//! failed the new version's load) rolls back by itself: the previous version becomes current
//! again and is re-loaded on every holder, the answer is a 409 naming the pods that failed, with
//! both reports, and `prewarm_adapter_auto_rollbacks_total` counts it. An operator never has to
//! notice a half-done rollout to undo it. A consistent rollout's requests are then watched for
//! errors. Both are decided by `crate::policy::rollout` and executed by `crate::service::rollouts`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ApiError;
use super::input::json_body;
use super::AppState;
use crate::registry::{prepare_version, verify_for_load, RegisterAdapter};
use crate::service::adapters::DecisionOutcome;
use crate::service::Gateway;

/// The pods holding `name` must all hold the registered version before a rollout proceeds.
fn check_consistent_before(gateway: &Gateway, name: &str) -> Result<(), ApiError> {
    let expected = gateway
        .state()
        .fleet
        .registry()
        .get(name)
        .map(|r| r.current.version.clone());
    let Some(expected) = expected else {
        return Ok(());
    };
    let odd: Vec<String> = gateway
        .versions_on_pods(name)
        .into_iter()
        .filter(|(_, v)| *v != expected)
        .map(|(p, v)| format!("{p}={v}"))
        .collect();
    if odd.is_empty() {
        Ok(())
    } else {
        Err(ApiError::Conflict(format!(
            "adapter {name:?}: pods disagree with registered version {expected:?} ({}): resolve before a rollout",
            odd.join(", ")
        )))
    }
}

pub async fn register(State(gateway): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let request: RegisterAdapter = json_body(&body)?;
    let max_files = gateway.config.registry.max_manifest_files;
    let r = request.clone();
    let registered_at = gateway.now();
    let version =
        tokio::task::spawn_blocking(move || prepare_version(&r, max_files, registered_at))
            .await
            .map_err(|_| ApiError::Internal)??;
    let rollout_pending = gateway
        .state()
        .fleet
        .registry()
        .get(&request.name)
        .is_some_and(|rec| rec.current.version != version.version);
    if rollout_pending {
        check_consistent_before(&gateway, &request.name)?;
    }
    let registered = gateway
        .state()
        .fleet
        .registry_mut()
        .register(&request, version)?;
    let rollout = match registered.previous_version {
        Some(_) => Some(gateway.roll_out(&registered).await),
        None => None,
    };
    let auto_rollback = match (&rollout, &registered.previous_version) {
        (Some(report), Some(previous)) => {
            gateway.settle_rollout(&registered, previous, report).await
        }
        _ => None,
    };
    let pins = if request.pinned == Some(true) {
        pin_where_placed(&gateway, &registered.name).await
    } else {
        Vec::new()
    };
    let status = match (&auto_rollback, &rollout) {
        (Some(_), _) => StatusCode::CONFLICT,
        (None, Some(_)) => StatusCode::OK,
        (None, None) => StatusCode::CREATED,
    };
    let record = gateway
        .state()
        .fleet
        .registry()
        .get(&registered.name)
        .cloned();
    let mut body = json!({
        "registered": registered,
        "adapter": record,
        "rollout": rollout,
        "pin_outcomes": pins,
    });
    if let Some(undone) = auto_rollback {
        body["error"] = json!(undone.reason);
        body["auto_rollback"] = json!(undone);
    }
    Ok((status, Json(body)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    version: String,
}

pub async fn rollback(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RollbackRequest = json_body(&body)?;
    if gateway.state().fleet.registry().get(&name).is_none() {
        return Err(ApiError::NotFound(format!(
            "adapter {name:?}: not registered"
        )));
    }
    check_consistent_before(&gateway, &name)?;
    // The old version's files must still match its manifest before any pod is touched.
    let target = gateway.state().fleet.registry().get(&name).and_then(|r| {
        r.history
            .iter()
            .find(|v| v.version == request.version)
            .cloned()
    });
    if let Some(version) = target {
        let max_files = gateway.config.registry.max_manifest_files;
        let n = name.clone();
        tokio::task::spawn_blocking(move || verify_for_load(&n, &version, max_files))
            .await
            .map_err(|_| ApiError::Internal)??;
    }
    let registered = gateway
        .state()
        .fleet
        .registry_mut()
        .rollback(&name, &request.version)?;
    let rollout = gateway.roll_out(&registered).await;
    Ok(Json(json!({"registered": registered, "rollout": rollout})).into_response())
}

pub async fn list(State(gateway): State<AppState>) -> Json<serde_json::Value> {
    let adapters: Vec<_> = gateway.state().fleet.registry().iter().cloned().collect();
    Json(json!({ "adapters": adapters }))
}

pub async fn detail(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let state = gateway.state();
    let record = state
        .fleet
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::NotFound(format!("adapter {name:?}: not registered")))?;
    let pods: BTreeMap<&str, _> = state
        .fleet
        .pods()
        .filter_map(|p| {
            p.lora
                .adapters()
                .into_iter()
                .find(|a| a.name == name)
                .map(|a| (p.shape.id.as_str(), a))
        })
        .collect();
    Ok(Json(json!({"adapter": record, "pods": pods})).into_response())
}

/// Pins the adapter where it is placed and executes the core's calls.
async fn pin_where_placed(gateway: &std::sync::Arc<Gateway>, name: &str) -> Vec<DecisionOutcome> {
    match gateway.fleet(|f| f.pin_adapter(name, gateway.now())) {
        Ok(actions) => gateway.execute_all(actions).await,
        Err(_) => Vec::new(),
    }
}

pub async fn pin(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let actions = gateway.fleet(|f| f.pin_adapter(&name, gateway.now()))?;
    let outcomes = gateway.execute_all(actions).await;
    Ok(Json(json!({"adapter": name, "pinned": true, "outcomes": outcomes})).into_response())
}

pub async fn unpin(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    gateway.fleet(|f| f.unpin_adapter(&name))?;
    Ok(Json(json!({"adapter": name, "pinned": false})).into_response())
}

pub async fn remove(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let actions = gateway
        .fleet(|f| f.remove_adapter(&name))
        .ok_or_else(|| ApiError::NotFound(format!("adapter {name:?}: not registered")))?;
    let outcomes = gateway.execute_all(actions).await;
    Ok(Json(json!({"removed": name, "outcomes": outcomes})).into_response())
}

/// One cell of the heatmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// Modelled in a GPU slot.
    Gpu,
    /// Registered on the pod, not modelled in a slot.
    Registered,
    Absent,
}

pub async fn heatmap(State(gateway): State<AppState>) -> Json<serde_json::Value> {
    let state = gateway.state();
    let adapters: Vec<String> = state
        .fleet
        .registry()
        .iter()
        .map(|r| r.name.clone())
        .collect();
    let pods: Vec<String> = state.fleet.pods().map(|p| p.shape.id.clone()).collect();
    let per_pod: Vec<BTreeMap<String, Residency>> = state
        .fleet
        .pods()
        .map(|p| {
            p.lora
                .adapters()
                .into_iter()
                .map(|a| {
                    let cell = if a.in_gpu {
                        Residency::Gpu
                    } else if a.registered {
                        Residency::Registered
                    } else {
                        Residency::Absent
                    };
                    (a.name, cell)
                })
                .collect()
        })
        .collect();
    let cells: Vec<Vec<Residency>> = adapters
        .iter()
        .map(|a| {
            per_pod
                .iter()
                .map(|m| m.get(a).copied().unwrap_or(Residency::Absent))
                .collect()
        })
        .collect();
    Json(json!({"adapters": adapters, "pods": pods, "cells": cells}))
}
