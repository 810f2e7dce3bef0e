//! The pool's I/O side: pods from the static list, DNS discovery and the admin API, each with
//! its client, source, last `/v1/models`, the adapter versions the gateway loaded on it and its
//! recent errors. Health checks are fed to the fleet core, which decides when a pod (re)joins:
//! a pod that comes up gets a new epoch and a fresh warm-up, and completions of an older epoch
//! are ignored.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use super::Gateway;
use crate::config::PodSpec;
use crate::engine::{engine_for, Engine, HttpPod, ServedModels};
use crate::policy::fleet::{FleetError, HealthChange, HealthCheck};

/// Errors kept per pod for the admin API.
const RECENT_ERRORS: usize = 16;

/// Where a pod came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodSource {
    Static,
    Dns,
    Admin,
}

/// An adapter the gateway loaded (or found registered) on a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedAdapter {
    pub version: String,
    /// The manifest digest of the loaded version, when it had one.
    pub digest: Option<String>,
    pub loaded_at_ms: u64,
}

/// One pod's I/O side (its models are the fleet core's pod of the same id).
pub struct PodEntry {
    pub spec: PodSpec,
    pub source: PodSource,
    pub engine: Arc<dyn Engine>,
    pub served: ServedModels,
    /// Which version of each adapter the gateway loaded on the pod, by name (for rollout
    /// consistency); registration itself is modelled by the core's LoRA model.
    pub versions: BTreeMap<String, LoadedAdapter>,
    pub errors: VecDeque<String>,
    pub adapter_ops: AdapterOps,
    /// The subscription to its KV-cache events, once the health round started it.
    pub kv_events: Option<super::kv_events::Subscription>,
}

/// Adapter calls in flight on a pod and a counter of their starts and ends: a reconciliation
/// applies what `/v1/models` said only when no call overlapped the fetch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterOps {
    pub in_flight: u32,
    pub seq: u64,
}

impl PodEntry {
    pub fn note_error(&mut self, message: String) {
        if self.errors.len() >= RECENT_ERRORS {
            self.errors.pop_front();
        }
        self.errors
            .push_back(format!("{} {message}", super::now_ms()));
    }
}

/// Why a pod could not be added or removed: its spec, or the fleet's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

impl Gateway {
    /// Adds a pod (health unknown: the health loop brings it up and starts its warm-up).
    pub fn add_pod(&self, spec: PodSpec, source: PodSource) -> Result<(), PoolError> {
        let pod = HttpPod::new(
            &spec.id,
            &spec.address,
            self.http_client(),
            self.config.pods.max_in_flight_per_pod,
            self.retry_policy(),
        );
        let engine = engine_for(spec.engine, pod, &self.config.pods.base_model);
        self.add_pod_with_engine(spec, source, engine)
    }

    /// [`Gateway::add_pod`] with the pod's client given (an in-process engine in tests).
    pub fn add_pod_with_engine(
        &self,
        spec: PodSpec,
        source: PodSource,
        engine: Arc<dyn Engine>,
    ) -> Result<(), PoolError> {
        let problems = spec.problems("pod");
        if let Some(first) = problems.into_iter().next() {
            return Err(PoolError::Invalid(
                first.strip_prefix("pod.").unwrap_or(&first).to_string(),
            ));
        }
        let shape = self.config.pod_shape(&spec);
        let mut state = self.state();
        state.fleet.add_pod(shape, self.now())?;
        tracing::info!(pod = %spec.id, address = %spec.address, source = ?source, "pod added");
        state.pods.insert(
            spec.id.clone(),
            PodEntry {
                spec,
                source,
                engine,
                served: ServedModels::default(),
                versions: BTreeMap::new(),
                errors: VecDeque::new(),
                adapter_ops: AdapterOps::default(),
                kv_events: None,
            },
        );
        Ok(())
    }

    /// Removes a pod; it leaves the routing table at once (in-flight actions for it end
    /// ignored: the core no longer has it).
    pub fn remove_pod(&self, id: &str) -> Result<(), PoolError> {
        {
            let mut state = self.state();
            state.fleet.remove_pod(id, self.now())?;
            state.pods.remove(id);
        }
        self.telemetry.forget_pod(id);
        tracing::info!(pod = %id, "pod removed");
        self.republish_table();
        Ok(())
    }

    /// The engine and epoch of a pod, for work outside the lock.
    pub fn pod_handle(&self, id: &str) -> Option<(Arc<dyn Engine>, u64)> {
        let state = self.state();
        let epoch = state.fleet.pod(id)?.epoch;
        state.pods.get(id).map(|p| (p.engine.clone(), epoch))
    }

    /// Records a health check. Returns the new epoch when the pod just (re)joined — or
    /// restarted while up — and needs a warm-up.
    pub fn record_health(&self, id: &str, check: HealthCheck) -> Option<u64> {
        let now = self.now();
        let change = self.fleet_and_pods(|state| {
            let change = state.fleet.on_check(id, check, now);
            if let (HealthChange::Joined(_), Some(pod)) = (change, state.pods.get_mut(id)) {
                // A returning (or restarted) pod lost its adapters.
                pod.versions.clear();
            }
            change
        });
        match change {
            HealthChange::Joined(epoch) => {
                tracing::info!(pod = %id, epoch, "pod up: warm-up will start");
                self.republish_table();
                Some(epoch)
            }
            HealthChange::Down => {
                tracing::warn!(pod = %id, "pod down");
                self.republish_table();
                None
            }
            HealthChange::Unchanged => None,
        }
    }

    /// Ids of every pod.
    pub fn pod_ids(&self) -> Vec<String> {
        self.state().pods.keys().cloned().collect()
    }
}
