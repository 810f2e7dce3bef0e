//! The LoRA calls of the fleet core's decisions on a pod: load (after manifest verification),
//! unload, touch (a one-token request with the adapter), each counted in the metrics and, when
//! it failed, kept in the pod's recent errors. With `[lora] loads = "external"` no load or unload
//! reaches an engine. Where adapters go is the core's decision
//! ([`crate::policy::fleet`]).

use std::sync::Arc;

use serde::Serialize;

use super::pods::LoadedAdapter;
use super::Gateway;
use crate::engine::{AdapterLoad, AdapterOutcome, Engine, EngineError, PrefillRequest};
use crate::policy::lora::AdapterLoads;
use crate::policy::LoraDecision;
use crate::registry::{verify_for_load, AdapterVersion, RegistryError};
use crate::telemetry::Telemetry;

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

/// The metric label of a step's result.
fn outcome_label<'a>(result: &'a Result<&'static str, (String, String)>) -> &'a str {
    match result {
        Ok(l) => l,
        Err((l, _)) => l.as_str(),
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

    /// Executes one decision on `pod_id` (the core hears of a failure from the caller).
    pub(super) async fn execute_decision(
        self: &Arc<Self>,
        pod_id: &str,
        decision: &LoraDecision,
    ) -> DecisionOutcome {
        let adapter = decision.adapter().to_string();
        Telemetry::count(
            &self.telemetry.decisions,
            &[("policy", "lora"), ("decision", decision.verb())],
        );
        self.adapter_op_boundary(pod_id, true);
        let external = self.config.lora.loads == AdapterLoads::External;
        let result = match decision {
            // The policy decides none under external loads; this keeps the promise at the
            // engine's door should a path ever slip one through.
            LoraDecision::Load(name) | LoraDecision::Unload(name) if external => Err((
                "left_external".to_string(),
                format!(
                    "adapter {name:?}: lora.loads is \"external\": {} left to the other controller",
                    decision.verb()
                ),
            )),
            LoraDecision::Load(name) => self.load_adapter_on(pod_id, name).await,
            LoraDecision::Unload(name) => self.unload_adapter_on(pod_id, name).await,
            LoraDecision::Touch(name) => self.touch_adapter_on(pod_id, name).await,
        };
        self.adapter_op_boundary(pod_id, false);
        let (outcome, error) = match result {
            Ok(label) => (label.to_string(), None),
            Err((label, message)) => {
                if let Some(pod) = self.state().pods.get_mut(pod_id) {
                    pod.note_error(message.clone());
                }
                tracing::warn!(pod = %pod_id, adapter = %adapter, action = decision.verb(), error = %message, "adapter action failed");
                (label, Some(message))
            }
        };
        DecisionOutcome {
            pod: pod_id.to_string(),
            action: decision.verb(),
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
        let version = self
            .state()
            .fleet
            .registry()
            .get(name)
            .map(|r| r.current.clone());
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
                        loaded_at_ms: self.now(),
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
        let request = PrefillRequest::completion(name, "");
        engine
            .prefill(&request)
            .await
            .map(|()| "ok")
            .map_err(|e: EngineError| (e.label().to_string(), e.to_string()))
    }
}
