//! The pool: pods from the static list, DNS discovery and the admin API, each with its client,
//! health, last scrape, registered adapters and warm-up state. Health transitions decide when a
//! pod (re)joins: a pod that comes up (first time or after being down) gets a new `epoch` and a
//! fresh warm-up; an executor working for an older epoch stops.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use super::{now_ms, Gateway};
use crate::config::PodSpec;
use crate::engine::{engine_for, Engine, HttpPod, PodLoad, ServedModels};
use crate::policy::lora::LoraSlots;
use crate::policy::{KvConfig, KvResidency, LoraResidency};
use crate::warmup::PodWarmup;

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

/// Health as the health loop sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodHealth {
    /// Not checked yet.
    Unknown,
    Up,
    Down,
}

/// An adapter the gateway loaded (or found registered) on a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedAdapter {
    pub version: String,
    /// The manifest digest of the loaded version, when it had one.
    pub digest: Option<String>,
    pub loaded_at_ms: u64,
}

/// One pod.
pub struct PodEntry {
    pub spec: PodSpec,
    pub source: PodSource,
    pub engine: Arc<dyn Engine>,
    pub health: PodHealth,
    pub consecutive_failures: u32,
    pub last_ok_ms: u64,
    /// Increases each time the pod (re)joins; executors compare it to know they are current.
    pub epoch: u64,
    pub load: PodLoad,
    pub served: ServedModels,
    /// Which version of each adapter the gateway loaded on the pod, by name (for rollout
    /// consistency); registration itself is modelled by `lora`.
    pub versions: BTreeMap<String, LoadedAdapter>,
    pub lora: LoraResidency,
    pub kv: KvResidency,
    pub warmup: PodWarmup,
    pub errors: VecDeque<String>,
    pub adapter_ops: AdapterOps,
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
        self.errors.push_back(format!("{} {message}", now_ms()));
    }

    /// Whether the pod may take traffic: up and past its first warm-up tier (or deadline).
    pub fn routable(&self, now_ms: u64) -> bool {
        self.health == PodHealth::Up && self.warmup.routable(now_ms)
    }
}

/// Why a pod could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("{0}")]
    Invalid(String),
    #[error("id: {0:?}: a pod with this id exists")]
    Exists(String),
    #[error("pod {0:?}: not in the pool")]
    Unknown(String),
    #[error("pods: {0}: the pool is full")]
    Full(usize),
}

/// Pods the pool holds at most.
pub const MAX_PODS: usize = 4096;

impl Gateway {
    /// Adds a pod (health unknown: the health loop brings it up and starts its warm-up).
    pub fn add_pod(&self, spec: PodSpec, source: PodSource) -> Result<(), PoolError> {
        let problems = spec.problems("pod");
        if let Some(first) = problems.into_iter().next() {
            return Err(PoolError::Invalid(
                first.strip_prefix("pod.").unwrap_or(&first).to_string(),
            ));
        }
        let pod = HttpPod::new(
            &spec.id,
            &spec.address,
            self.http_client(),
            self.config.pods.max_in_flight_per_pod,
            self.retry_policy(),
        );
        let engine = engine_for(spec.engine, pod, &self.config.pods.base_model);
        let kv = KvResidency::new(self.kv_config_for(&spec), now_ms());
        let slots = LoraSlots {
            max_loras: spec.max_loras,
            max_cpu_loras: spec.max_cpu_loras.unwrap_or(spec.max_loras),
        };
        let mut state = self.state();
        if state.pods.contains_key(&spec.id) {
            return Err(PoolError::Exists(spec.id));
        }
        if state.pods.len() >= MAX_PODS {
            return Err(PoolError::Full(MAX_PODS));
        }
        tracing::info!(pod = %spec.id, address = %spec.address, source = ?source, "pod added");
        state.pods.insert(
            spec.id.clone(),
            PodEntry {
                spec,
                source,
                engine,
                health: PodHealth::Unknown,
                consecutive_failures: 0,
                last_ok_ms: 0,
                epoch: 0,
                load: PodLoad::default(),
                served: ServedModels::default(),
                versions: BTreeMap::new(),
                lora: LoraResidency::new(slots, self.config.lora.clone()),
                kv,
                warmup: PodWarmup::default(),
                errors: VecDeque::new(),
                adapter_ops: AdapterOps::default(),
            },
        );
        Ok(())
    }

    /// The KV model's configuration for a pod: the `[kv]` section with the pod's overrides.
    fn kv_config_for(&self, spec: &PodSpec) -> KvConfig {
        let mut kv = self.config.kv.clone();
        if let Some(b) = spec.block_size {
            kv.block_tokens = b;
        }
        if let Some(n) = spec.num_blocks {
            kv.capacity_blocks = n as u64;
        }
        kv
    }

    /// Removes a pod; its warm-up stops and it leaves the routing table.
    pub fn remove_pod(&self, id: &str) -> Result<(), PoolError> {
        let removed = self.state().pods.remove(id);
        match removed {
            Some(mut entry) => {
                entry.warmup.abort();
                tracing::info!(pod = %id, "pod removed");
                self.republish_table();
                Ok(())
            }
            None => Err(PoolError::Unknown(id.to_string())),
        }
    }

    /// The engine and epoch of a pod, for work outside the lock.
    pub fn pod_handle(&self, id: &str) -> Option<(Arc<dyn Engine>, u64)> {
        self.state()
            .pods
            .get(id)
            .map(|p| (p.engine.clone(), p.epoch))
    }

    /// Whether `id` is still at `epoch` and up (an executor's check before each step).
    pub fn pod_current(&self, id: &str, epoch: u64) -> bool {
        self.state()
            .pods
            .get(id)
            .is_some_and(|p| p.epoch == epoch && p.health == PodHealth::Up)
    }

    /// Records a health check. Returns the new epoch when the pod just (re)joined and needs a
    /// warm-up.
    pub fn record_health(&self, id: &str, ok: bool, load: Option<PodLoad>) -> Option<u64> {
        let failures_allowed = self.config.pods.unhealthy_after;
        let now = now_ms();
        let mut changed = false;
        let joined = {
            let mut state = self.state();
            let pod = state.pods.get_mut(id)?;
            if let Some(l) = load {
                pod.kv.observe_usage(l.kv_usage);
                if let (Some(b), Some(n)) = (l.block_size, l.num_gpu_blocks) {
                    pod.kv.set_geometry(b, n as u64);
                }
                pod.load = l;
            }
            if ok {
                pod.consecutive_failures = 0;
                pod.last_ok_ms = now;
                if pod.health != PodHealth::Up {
                    pod.health = PodHealth::Up;
                    pod.epoch = pod.epoch.saturating_add(1);
                    pod.warmup.reset_for_rejoin();
                    // A returning pod lost its adapters and its prefix cache.
                    pod.versions.clear();
                    pod.kv.reset();
                    pod.lora = LoraResidency::new(pod.lora.slots(), self.config.lora.clone());
                    changed = true;
                    tracing::info!(pod = %id, epoch = pod.epoch, "pod up: warm-up will start");
                    Some(pod.epoch)
                } else {
                    None
                }
            } else {
                pod.consecutive_failures = pod.consecutive_failures.saturating_add(1);
                if pod.health != PodHealth::Down && pod.consecutive_failures >= failures_allowed {
                    pod.health = PodHealth::Down;
                    pod.warmup.abort();
                    changed = true;
                    tracing::warn!(pod = %id, "pod down");
                }
                None
            }
        };
        if changed {
            self.republish_table();
        }
        joined
    }

    /// Ids of every pod.
    pub fn pod_ids(&self) -> Vec<String> {
        self.state().pods.keys().cloned().collect()
    }
}
