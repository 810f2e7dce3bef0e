//! Adapters on pods: where an adapter is placed (core's rendezvous over the adapter name among
//! the healthy pods of its tier's pool, `pods.adapter_replicas` of them), how pin signals and
//! operator pins become the LoRA policy's decisions, and the execution of those decisions (load
//! after manifest verification, unload, touch) with their outcomes fed back to the policy and
//! the metrics.

use std::sync::Arc;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::wire::PinSignal;
use prewarm_core::{rank, PlacementCandidate};
use serde::Serialize;

use super::placement::{tier_of, tier_pools};
use super::pods::{LoadedAdapter, PodHealth};
use super::{now_ms, Gateway, State};
use crate::config::PodsConfig;
use crate::engine::{AdapterLoad, AdapterOutcome, Engine, EngineError, PrefillRequest};
use crate::policy::LoraDecision;
use crate::registry::{verify_for_load, AdapterVersion, RegistryError};
use crate::telemetry::Telemetry;

/// A decision for one pod, ready to execute outside the lock.
#[derive(Debug, Clone, PartialEq)]
pub struct PodDecision {
    pub pod: String,
    pub decision: LoraDecision,
}

impl PodDecision {
    /// `decisions` for pod `pod`, in order.
    pub fn on_pod(pod: &str, decisions: Vec<LoraDecision>) -> Vec<Self> {
        decisions
            .into_iter()
            .map(|decision| Self {
                pod: pod.to_string(),
                decision,
            })
            .collect()
    }
}

/// How one executed decision ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionOutcome {
    pub pod: String,
    pub action: &'static str,
    pub adapter: String,
    /// `ok`, `already`, `refused_manifest`, `unregistered`, or an engine error label.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The pods `adapter` is placed on among the healthy ones of its tier's pool, best first.
pub fn placed_pods(state: &State, adapter: &str, pods: &PodsConfig) -> Vec<String> {
    let up: Vec<PlacementCandidate<'_>> = state
        .pods
        .values()
        .filter(|p| p.health == PodHealth::Up)
        .map(|p| PlacementCandidate::new(&p.spec.id, p.spec.weight))
        .collect();
    let pool = tier_pools(state, pods).candidates(tier_of(state, adapter), &up);
    placed_pods_among(&pool, adapter, pods.adapter_replicas)
}

/// The `replicas` best of `candidates` for `adapter` (rendezvous over its name's chain seed).
pub fn placed_pods_among(
    candidates: &[PlacementCandidate<'_>],
    adapter: &str,
    replicas: usize,
) -> Vec<String> {
    rank(chain_seed(adapter), candidates)
        .into_iter()
        .take(replicas.max(1))
        .filter_map(|i| candidates.get(i).map(|c| c.id.to_string()))
        .collect()
}

/// The metric label of a step's result.
fn outcome_label<'a>(result: &'a Result<&'static str, (String, String)>) -> &'a str {
    match result {
        Ok(l) => l,
        Err((l, _)) => l.as_str(),
    }
}

fn action(d: &LoraDecision) -> &'static str {
    match d {
        LoraDecision::Load(_) => "load",
        LoraDecision::Unload(_) => "unload",
        LoraDecision::Touch(_) => "touch",
    }
}

impl Gateway {
    fn engine_of(&self, pod_id: &str) -> Result<Arc<dyn Engine>, (String, String)> {
        self.pod_handle(pod_id).map(|(e, _)| e).ok_or_else(|| {
            (
                "unknown_pod".to_string(),
                format!("pod {pod_id:?}: not in the pool"),
            )
        })
    }

    /// Marks the start or end of an adapter call on a pod, so that a `/v1/models` reconciliation
    /// that overlapped one (and may have seen the pod mid-change) is discarded.
    fn adapter_op_boundary(&self, pod_id: &str, start: bool) {
        if let Some(pod) = self.state().pods.get_mut(pod_id) {
            pod.adapter_ops.seq = pod.adapter_ops.seq.wrapping_add(1);
            pod.adapter_ops.in_flight = if start {
                pod.adapter_ops.in_flight.saturating_add(1)
            } else {
                pod.adapter_ops.in_flight.saturating_sub(1)
            };
        }
    }

    /// A pin signal: make the adapter resident where it is placed. Decisions are executed in the
    /// background. Unregistered adapters are counted and skipped (the gateway has no path).
    pub(super) fn apply_pin_signal(&self, state: &mut State, pin: &PinSignal, now: u64) {
        if state.registry.get(&pin.adapter).is_none() {
            Telemetry::count(
                &self.telemetry.decisions,
                &[("policy", "lora"), ("decision", "unregistered")],
            );
            return;
        }
        let tier = tier_of(state, &pin.adapter);
        let mut decisions = Vec::new();
        for pod_id in placed_pods(state, &pin.adapter, &self.config.pods) {
            let Some(pod) = state.pods.get_mut(&pod_id) else {
                continue;
            };
            match pod
                .lora
                .ensure_resident(&pin.adapter, tier, pin.priority, now)
            {
                Ok(ds) => decisions.extend(PodDecision::on_pod(&pod_id, ds)),
                Err(refusal) => {
                    Telemetry::count(
                        &self.telemetry.decisions,
                        &[("policy", "lora"), ("decision", "refused")],
                    );
                    pod.note_error(refusal.to_string());
                }
            }
        }
        self.spawn_decisions(decisions);
    }

    /// Runs decisions in the background, in order per call.
    pub fn spawn_decisions(&self, decisions: Vec<PodDecision>) {
        if decisions.is_empty() {
            return;
        }
        let Some(me) = self.me() else {
            return;
        };
        tokio::spawn(async move {
            me.execute_decisions(decisions).await;
        });
    }

    /// Executes decisions one after another (a pod's unload must precede the load it frees a
    /// slot for); returns their outcomes.
    pub async fn execute_decisions(
        self: &Arc<Self>,
        decisions: Vec<PodDecision>,
    ) -> Vec<DecisionOutcome> {
        let mut outcomes = Vec::with_capacity(decisions.len());
        for d in decisions {
            outcomes.push(self.execute_decision(&d).await);
        }
        if !outcomes.is_empty() {
            self.republish_table();
        }
        outcomes
    }

    async fn execute_decision(self: &Arc<Self>, d: &PodDecision) -> DecisionOutcome {
        let adapter = d.decision.adapter().to_string();
        Telemetry::count(
            &self.telemetry.decisions,
            &[("policy", "lora"), ("decision", action(&d.decision))],
        );
        self.adapter_op_boundary(&d.pod, true);
        let result = match &d.decision {
            LoraDecision::Load(name) => self.load_adapter_on(&d.pod, name).await,
            LoraDecision::Unload(name) => self.unload_adapter_on(&d.pod, name).await,
            LoraDecision::Touch(name) => self.touch_adapter_on(&d.pod, name).await,
        };
        self.adapter_op_boundary(&d.pod, false);
        let (outcome, error) = match result {
            Ok(label) => (label.to_string(), None),
            Err((label, message)) => {
                let mut state = self.state();
                if let Some(pod) = state.pods.get_mut(&d.pod) {
                    pod.lora.record_failure(&d.decision);
                    pod.note_error(message.clone());
                }
                tracing::warn!(pod = %d.pod, adapter = %adapter, action = action(&d.decision), error = %message, "adapter action failed");
                (label, Some(message))
            }
        };
        DecisionOutcome {
            pod: d.pod.clone(),
            action: action(&d.decision),
            adapter,
            outcome,
            error,
        }
    }

    /// Verifies the registered version's files, then loads it. `Err((label, message))`.
    pub async fn load_adapter_on(
        self: &Arc<Self>,
        pod_id: &str,
        name: &str,
    ) -> Result<&'static str, (String, String)> {
        let version = self.state().registry.get(name).map(|r| r.current.clone());
        let Some(version) = version else {
            return Err((
                "unregistered".into(),
                format!("adapter {name:?}: not registered"),
            ));
        };
        let result = self.verify_and_load(pod_id, name, &version).await;
        let label = outcome_label(&result);
        Telemetry::count(
            &self.telemetry.adapter_loads,
            &[("pod", pod_id), ("outcome", label)],
        );
        if result.is_ok() {
            let mut state = self.state();
            if let Some(pod) = state.pods.get_mut(pod_id) {
                pod.versions.insert(
                    name.to_string(),
                    LoadedAdapter {
                        version: version.version.clone(),
                        digest: version.manifest.as_ref().map(|m| m.digest.clone()),
                        loaded_at_ms: now_ms(),
                    },
                );
            }
        }
        result
    }

    async fn verify_and_load(
        &self,
        pod_id: &str,
        name: &str,
        version: &AdapterVersion,
    ) -> Result<&'static str, (String, String)> {
        let max_files = self.config.registry.max_manifest_files;
        let (n, v) = (name.to_string(), version.clone());
        let verified = tokio::task::spawn_blocking(move || verify_for_load(&n, &v, max_files))
            .await
            .unwrap_or_else(|_| {
                Err(RegistryError::Unverifiable {
                    name: name.to_string(),
                    message: "verification task failed".into(),
                })
            });
        if let Err(e) = verified {
            tracing::error!(pod = %pod_id, adapter = %name, error = %e, "adapter load refused: manifest mismatch");
            return Err(("refused_manifest".into(), e.to_string()));
        }
        let engine = self.engine_of(pod_id)?;
        let load = AdapterLoad {
            name: name.to_string(),
            path: version.path.clone(),
        };
        match engine.load_adapter(&load).await {
            Ok(AdapterOutcome::Done) => Ok("ok"),
            Ok(AdapterOutcome::AlreadyThere) => Ok("already"),
            Err(e) => Err((e.label().to_string(), e.to_string())),
        }
    }

    async fn unload_adapter_on(
        &self,
        pod_id: &str,
        name: &str,
    ) -> Result<&'static str, (String, String)> {
        let engine = self.engine_of(pod_id)?;
        let result = match engine.unload_adapter(name).await {
            Ok(AdapterOutcome::Done) => Ok("ok"),
            Ok(AdapterOutcome::AlreadyThere) => Ok("already"),
            Err(e) => Err((e.label().to_string(), e.to_string())),
        };
        let label = outcome_label(&result);
        Telemetry::count(
            &self.telemetry.adapter_unloads,
            &[("pod", pod_id), ("outcome", label)],
        );
        if result.is_ok() {
            if let Some(pod) = self.state().pods.get_mut(pod_id) {
                pod.versions.remove(name);
            }
        }
        result
    }

    /// A one-token request with the adapter: makes it the pod's most recently used.
    async fn touch_adapter_on(
        &self,
        pod_id: &str,
        name: &str,
    ) -> Result<&'static str, (String, String)> {
        let engine = self.engine_of(pod_id)?;
        let request = PrefillRequest {
            model: name.to_string(),
            prefix_text: String::new(),
        };
        engine
            .prefill(&request)
            .await
            .map(|()| "ok")
            .map_err(|e: EngineError| (e.label().to_string(), e.to_string()))
    }
}
