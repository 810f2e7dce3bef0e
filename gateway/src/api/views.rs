//! The read endpoints' JSON shapes (stable: the dashboard and the status CLI read them).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{EngineKind, PodSpec};
use crate::engine::PodLoad;
use crate::policy::fleet::engine_blocks::EngineBlocksView;
use crate::policy::fleet::{FleetPod, PodHealth};
use crate::policy::lora::AdapterResidency;
use crate::policy::warmup::WarmupStatus;
use crate::service::pods::{LoadedAdapter, PodEntry, PodSource};

/// One pod in `GET /admin/pods`.
#[derive(Debug, Serialize)]
pub struct PodSummary {
    pub id: String,
    pub address: String,
    pub engine: EngineKind,
    pub source: PodSource,
    pub health: PodHealth,
    /// In the routing table (first warm-up tier done or deadline passed, and up).
    pub routable: bool,
    pub epoch: u64,
    /// The warm-up phase (`adapters`, `first_tier`, `second_tier`, `done`, `interrupted`), or
    /// null before the first warm-up.
    pub warmup_phase: Option<crate::policy::warmup::WarmupPhase>,
    pub waiting: u64,
    pub running: u64,
    pub kv_usage: f64,
    /// What routing reads of the pod: the share of the last minute it was busy (the table's
    /// `load`) and its predicted queue wait in ms (the table's `wait_ms` before rounding; null
    /// when the engine exports no completion counter).
    pub busy_share: f64,
    pub queue_wait_ms: Option<f64>,
    /// Adapters the LoRA model believes registered on the pod.
    pub adapters: Vec<String>,
}

/// `GET /admin/pods/{id}`.
#[derive(Debug, Serialize)]
pub struct PodDetail {
    #[serde(flatten)]
    pub summary: PodSummary,
    pub spec: PodSpec,
    pub last_ok_ms: u64,
    pub consecutive_failures: u32,
    /// Restarts detected while the pod was up (since the gateway started), each re-warmed as a
    /// join (`policy::fleet::restart`).
    pub restarts: u64,
    /// `process_start_time_seconds` of its last scrape that had one (unix seconds).
    pub process_start_time_s: Option<f64>,
    pub load: PodLoad,
    /// `/v1/models` at the last reconciliation: base model and (name, path) pairs.
    pub served: crate::engine::ServedModels,
    pub lora: Vec<AdapterResidency>,
    /// Versions the gateway loaded, by adapter name.
    pub versions: BTreeMap<String, LoadedAdapter>,
    /// Prefixes the KV model keeps warm on the pod.
    pub warm_prefixes: usize,
    pub resident_shards: usize,
    pub modelled_hit_ratio: Option<f64>,
    pub warmup: Option<WarmupStatus>,
    /// What its engine's KV-cache events say (`policy::fleet::engine_blocks`): null until the
    /// first batch, or without `kv_events` in its spec.
    pub kv_events: Option<EngineBlocksView>,
    /// Whether the gateway is connected to the pod's KV-event publisher now (null without
    /// `kv_events` in its spec).
    pub kv_events_connected: Option<bool>,
    /// Recent errors, oldest first, each prefixed by its time in ms.
    pub errors: Vec<String>,
}

/// A pod's summary from its model in the fleet core and its I/O side.
pub fn summary(pod: &FleetPod, io: &PodEntry, now_ms: u64) -> PodSummary {
    PodSummary {
        id: io.spec.id.clone(),
        address: io.spec.address.clone(),
        engine: io.spec.engine,
        source: io.source,
        health: pod.health,
        routable: pod.routable(now_ms),
        epoch: pod.epoch,
        warmup_phase: pod.warmup.progress.as_ref().map(|p| p.phase()),
        waiting: pod.load.waiting,
        running: pod.load.running,
        kv_usage: pod.load.kv_usage,
        busy_share: pod.busy.share(now_ms),
        queue_wait_ms: pod.wait.wait_ms(now_ms),
        adapters: pod.lora.served().map(str::to_string).collect(),
    }
}

pub fn detail(pod: &FleetPod, io: &PodEntry, now_ms: u64) -> PodDetail {
    PodDetail {
        summary: summary(pod, io, now_ms),
        spec: io.spec.clone(),
        last_ok_ms: pod.last_ok_ms,
        consecutive_failures: pod.consecutive_failures,
        restarts: pod.restart.restarts(),
        process_start_time_s: pod.restart.start_time_s(),
        load: pod.load.clone(),
        served: io.served.clone(),
        lora: pod.lora.adapters(),
        versions: io.versions.clone(),
        warm_prefixes: pod.kv.warm_prefixes(now_ms).len(),
        resident_shards: pod.kv.resident_shards(),
        modelled_hit_ratio: pod.kv.hit_ratio(),
        warmup: pod.warmup.status(now_ms),
        kv_events: pod.engine_blocks.view(),
        kv_events_connected: io
            .spec
            .kv_events
            .as_ref()
            .map(|_| io.kv_events.as_ref().is_some_and(|s| s.connected())),
        errors: io.errors.iter().cloned().collect(),
    }
}
