//! Adapter endpoints: register (a new version of a known name is a rollout), rollback, list,
//! detail, pin, unpin, remove, and the residency heatmap (adapters × pods).

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
use crate::policy::LoraDecision;
use crate::registry::{prepare_version, verify_for_load, RegisterAdapter, Registered};
use crate::service::adapters::{placed_pods, DecisionOutcome, PodDecision};
use crate::service::placement::tier_of;
use crate::service::{now_ms, Gateway};

/// What a rollout (or rollback) found and did.
#[derive(Debug, Serialize)]
pub struct RolloutReport {
    /// Version loaded on each pod holding the adapter, before.
    pub before: BTreeMap<String, String>,
    pub outcomes: Vec<DecisionOutcome>,
    /// Version on each pod holding the adapter, after.
    pub after: BTreeMap<String, String>,
    /// Every pod holding the adapter has the new version.
    pub consistent: bool,
}

fn versions_on_pods(gateway: &Gateway, name: &str) -> BTreeMap<String, String> {
    gateway
        .state()
        .pods
        .values()
        .filter_map(|p| {
            p.versions
                .get(name)
                .map(|v| (p.spec.id.clone(), v.version.clone()))
        })
        .collect()
}

/// Re-loads the adapter's new current version on every pod that holds it.
async fn roll_out(gateway: &std::sync::Arc<Gateway>, registered: &Registered) -> RolloutReport {
    let before = versions_on_pods(gateway, &registered.name);
    let mut decisions = Vec::new();
    for pod in before.keys() {
        let reload = vec![
            LoraDecision::Unload(registered.name.clone()),
            LoraDecision::Load(registered.name.clone()),
        ];
        decisions.extend(PodDecision::on_pod(pod, reload));
    }
    let outcomes = gateway.execute_decisions(decisions).await;
    let after = versions_on_pods(gateway, &registered.name);
    let consistent = before
        .keys()
        .all(|p| after.get(p) == Some(&registered.version));
    if !consistent {
        tracing::error!(adapter = %registered.name, ?after, "rollout left pods inconsistent");
    }
    RolloutReport {
        before,
        outcomes,
        after,
        consistent,
    }
}

/// The pods holding `name` must all hold the registered version before a rollout proceeds.
fn check_consistent_before(gateway: &Gateway, name: &str) -> Result<(), ApiError> {
    let expected = gateway
        .state()
        .registry
        .get(name)
        .map(|r| r.current.version.clone());
    let Some(expected) = expected else {
        return Ok(());
    };
    let odd: Vec<String> = versions_on_pods(gateway, name)
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
    let version = tokio::task::spawn_blocking(move || prepare_version(&r, max_files, now_ms()))
        .await
        .map_err(|_| ApiError::Internal)??;
    let rollout_pending = gateway
        .state()
        .registry
        .get(&request.name)
        .is_some_and(|rec| rec.current.version != version.version);
    if rollout_pending {
        check_consistent_before(&gateway, &request.name)?;
    }
    let registered = gateway.state().registry.register(&request, version)?;
    let rollout = match registered.previous_version {
        Some(_) => Some(roll_out(&gateway, &registered).await),
        None => None,
    };
    let pins = if request.pinned == Some(true) {
        pin_where_placed(&gateway, &registered.name).await
    } else {
        Vec::new()
    };
    let status = if rollout.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let record = gateway.state().registry.get(&registered.name).cloned();
    Ok((
        status,
        Json(json!({"registered": registered, "adapter": record, "rollout": rollout, "pin_outcomes": pins})),
    )
        .into_response())
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
    if gateway.state().registry.get(&name).is_none() {
        return Err(ApiError::NotFound(format!(
            "adapter {name:?}: not registered"
        )));
    }
    check_consistent_before(&gateway, &name)?;
    // The old version's files must still match its manifest before any pod is touched.
    let target = gateway.state().registry.get(&name).and_then(|r| {
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
    let registered = gateway.state().registry.rollback(&name, &request.version)?;
    let rollout = roll_out(&gateway, &registered).await;
    Ok(Json(json!({"registered": registered, "rollout": rollout})).into_response())
}

pub async fn list(State(gateway): State<AppState>) -> Json<serde_json::Value> {
    let adapters: Vec<_> = gateway.state().registry.iter().cloned().collect();
    Json(json!({ "adapters": adapters }))
}

pub async fn detail(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let state = gateway.state();
    let record = state
        .registry
        .get(&name)
        .ok_or_else(|| ApiError::NotFound(format!("adapter {name:?}: not registered")))?;
    let pods: BTreeMap<&str, _> = state
        .pods
        .values()
        .filter_map(|p| {
            p.lora
                .adapters()
                .into_iter()
                .find(|a| a.name == name)
                .map(|a| (p.spec.id.as_str(), a))
        })
        .collect();
    Ok(Json(json!({"adapter": record, "pods": pods})).into_response())
}

/// Pins the adapter in the LoRA model of the pods it is placed on and executes the decisions.
async fn pin_where_placed(gateway: &std::sync::Arc<Gateway>, name: &str) -> Vec<DecisionOutcome> {
    let now = now_ms();
    let mut decisions = Vec::new();
    {
        let mut state = gateway.state();
        let tier = tier_of(&state, name);
        for pod_id in placed_pods(&state, name, &gateway.config.pods) {
            if let Some(pod) = state.pods.get_mut(&pod_id) {
                match pod.lora.pin(name, tier, now) {
                    Ok(ds) => decisions.extend(PodDecision::on_pod(&pod_id, ds)),
                    Err(refusal) => pod.note_error(refusal.to_string()),
                }
            }
        }
    }
    gateway.execute_decisions(decisions).await
}

pub async fn pin(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    gateway.state().registry.set_pinned(&name, true)?;
    let outcomes = pin_where_placed(&gateway, &name).await;
    Ok(Json(json!({"adapter": name, "pinned": true, "outcomes": outcomes})).into_response())
}

pub async fn unpin(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let mut state = gateway.state();
    state.registry.set_pinned(&name, false)?;
    for pod in state.pods.values_mut() {
        pod.lora.unpin(&name);
    }
    Ok(Json(json!({"adapter": name, "pinned": false})).into_response())
}

pub async fn remove(
    State(gateway): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let decisions = {
        let mut state = gateway.state();
        if state.registry.remove(&name).is_none() {
            return Err(ApiError::NotFound(format!(
                "adapter {name:?}: not registered"
            )));
        }
        let mut decisions = Vec::new();
        for pod in state.pods.values_mut() {
            let removals = pod.lora.remove(&name);
            decisions.extend(PodDecision::on_pod(&pod.spec.id, removals));
        }
        decisions
    };
    let outcomes = gateway.execute_decisions(decisions).await;
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
    let adapters: Vec<String> = state.registry.iter().map(|r| r.name.clone()).collect();
    let pods: Vec<String> = state.pods.keys().cloned().collect();
    let per_pod: Vec<BTreeMap<String, Residency>> = state
        .pods
        .values()
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
