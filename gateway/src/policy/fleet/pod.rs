//! One pod as the fleet core models it: its shape (address, weight, LoRA slots), its health and
//! epoch, its last reported load, its KV and LoRA models and its warm-up. No handles, no I/O:
//! the shell keeps the pod's client, source and error log beside it.

use serde::Serialize;

use super::busy::BusyShare;
use super::engine_blocks::EngineBlocks;
use super::restart::RestartWatch;
use super::wait::QueueWait;
use crate::policy::lora::LoraSlots;
use crate::policy::warmup::WarmupStatus;
use crate::policy::{KvConfig, KvResidency, LoraConfig, LoraResidency, PrefixKey, WarmupProgress};

/// Health as the health checks report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PodHealth {
    /// Not checked yet.
    Unknown,
    Up,
    Down,
}

/// Live load of one pod, as its last scrape said.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PodLoad {
    pub waiting: u64,
    pub running: u64,
    /// 0..1.
    pub kv_usage: f64,
    /// From `vllm:cache_config_info`.
    pub block_size: Option<usize>,
    pub num_gpu_blocks: Option<usize>,
    /// From the newest non-empty `vllm:lora_requests_info` series.
    pub max_lora: Option<usize>,
    pub running_adapters: Vec<String>,
    pub waiting_adapters: Vec<String>,
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: Option<u64>,
    /// `vllm:prefix_cache_hits_total`: prompt tokens served from it.
    pub prefix_cache_hits: Option<u64>,
    /// `vllm:request_success_total` over its `finished_reason`s: requests finished.
    pub request_successes: Option<u64>,
}

impl PodLoad {
    /// Requests on the pod, running and queued (`vllm:num_requests_running` +
    /// `vllm:num_requests_waiting`).
    pub fn requests(&self) -> u64 {
        self.running.saturating_add(self.waiting)
    }
}

/// What the core needs to know of a pod to place and warm on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodShape {
    pub id: String,
    /// `host:port` for the routing table.
    pub address: String,
    /// Placement weight (> 0).
    pub weight: f64,
    pub slots: LoraSlots,
    /// The KV model's configuration (the `[kv]` section with the pod's geometry).
    pub kv: KvConfig,
}

/// A pod's warm-up: the progress of its current plan (absent before the first) and of the plan
/// before the pod was lost (kept to number the next attempt).
#[derive(Debug, Default)]
pub struct PodWarmup {
    pub progress: Option<WarmupProgress>,
    pub previous: Option<WarmupProgress>,
    /// The pod entered the routing table in this epoch: a re-warm triggered later (admin API)
    /// does not take it out again. Cleared when the pod re-joins.
    pub admitted: bool,
}

impl PodWarmup {
    /// A pod may take traffic once its first tier is done or its deadline passed.
    pub fn routable(&self, now_ms: u64) -> bool {
        self.admitted || self.progress.as_ref().is_some_and(|p| p.routable(now_ms))
    }

    pub fn status(&self, now_ms: u64) -> Option<WarmupStatus> {
        self.progress.as_ref().map(|p| p.status(now_ms))
    }

    /// The first tier's prefixes the current attempt prefilled (none before the first plan).
    pub fn first_tier_warmed(&self) -> Vec<PrefixKey> {
        self.progress
            .as_ref()
            .map(WarmupProgress::first_tier_warmed)
            .unwrap_or_default()
    }

    /// The pod is down or gone: the progress is marked lost.
    fn lose(&mut self) {
        if let Some(p) = self.progress.as_mut() {
            p.pod_lost();
        }
    }

    /// Makes way for a new plan: the current progress becomes the previous attempt.
    fn reset_for_rejoin(&mut self) {
        self.lose();
        self.admitted = false;
        if let Some(p) = self.progress.take() {
            self.previous = Some(p);
        }
    }
}

/// One pod of the fleet.
#[derive(Debug)]
pub struct FleetPod {
    pub shape: PodShape,
    pub health: PodHealth,
    pub consecutive_failures: u32,
    pub last_ok_ms: u64,
    /// Increases each time the pod (re)joins; completions of an older epoch are ignored.
    pub epoch: u64,
    pub load: PodLoad,
    pub lora: LoraResidency,
    pub kv: KvResidency,
    pub warmup: PodWarmup,
    /// The pod's prefix-cache counters against the model's (see [`FleetPod::reconcile_kv`]).
    pub kv_counters: KvReconciliation,
    /// Modelled minus observed prefix-cache hit ratio over the last [`KV_GAP_WINDOW`] scrapes;
    /// `None` before both saw traffic in such a window.
    pub kv_hit_gap: Option<f64>,
    /// The share of the last minute it was busy: the routing table's load.
    pub busy: BusyShare,
    /// The wait a request arriving now is predicted to queue there: the routing table's
    /// `wait_ms`.
    pub wait: QueueWait,
    /// What its scrapes say of its process, to tell a restart (see [`super::restart`]).
    pub restart: RestartWatch,
    /// What its engine's KV-cache events say its cache holds (see [`super::engine_blocks`]).
    pub engine_blocks: EngineBlocks,
}

/// Scrapes an excess of computed tokens must last before the model ages by it. Served records
/// reach the gateway a filter tick plus a batch call (its timeout, 500 ms by default) after the
/// pod counted the request, more when the gateway or the proxies are loaded; with the defaults
/// (health interval = filter tick = 1 s) ten scrapes tolerate lags up to ten ticks, and an
/// excess still there after them is not lag. Ageing later is harmless: it only delays what the
/// model would have aged anyway.
pub const KV_WINDOW: usize = 10;

/// Scrapes the hit-ratio gap is measured over: long against the records' lag (so that a window
/// holds both a request's count at the pod and its record), short enough to follow a change
/// (30 s at the default interval).
pub const KV_GAP_WINDOW: usize = 30;

/// Cumulative prefix-cache tokens: the pod's (`queries`, `hits`) and the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvCounters {
    pub queries: u64,
    pub hits: u64,
    /// Recorded traffic's tokens, and the modelled hits among them.
    pub modelled_queries: u64,
    pub modelled_hits: u64,
    /// Tokens the model believes the pod computed, its own prefills included.
    pub modelled_computed: u64,
}

impl KvCounters {
    /// Whether every counter is at least `earlier`'s (else the pod or the model restarted).
    fn follows(&self, earlier: &KvCounters) -> bool {
        self.queries >= earlier.queries
            && self.hits >= earlier.hits
            && self.modelled_queries >= earlier.modelled_queries
            && self.modelled_hits >= earlier.modelled_hits
            && self.modelled_computed >= earlier.modelled_computed
    }

    /// Tokens the pod computed beyond those the model saw computed, since `baseline`.
    fn excess_over(&self, baseline: &KvCounters) -> u64 {
        let computed = (self.queries - baseline.queries).saturating_sub(self.hits - baseline.hits);
        computed.saturating_sub(self.modelled_computed - baseline.modelled_computed)
    }
}

/// A pod's counters since its baseline (the first scrape after a restart of either side).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvReconciliation {
    baseline: Option<KvCounters>,
    /// The last `KV_GAP_WINDOW + 1` scrapes, oldest first.
    window: std::collections::VecDeque<KvCounters>,
    /// Tokens the model was aged by since the baseline.
    aged: u64,
}

impl FleetPod {
    pub(super) fn new(shape: PodShape, lora: &LoraConfig, now_ms: u64) -> Self {
        Self {
            kv: KvResidency::new(shape.kv.clone(), now_ms),
            lora: LoraResidency::new(shape.slots, lora.clone()),
            shape,
            health: PodHealth::Unknown,
            consecutive_failures: 0,
            last_ok_ms: 0,
            epoch: 0,
            load: PodLoad::default(),
            warmup: PodWarmup::default(),
            kv_counters: KvReconciliation::default(),
            kv_hit_gap: None,
            busy: BusyShare::default(),
            wait: QueueWait::default(),
            restart: RestartWatch::default(),
            engine_blocks: EngineBlocks::default(),
        }
    }

    /// Reconciles the KV model with the pod's prefix-cache counters. Prompt tokens the pod
    /// computed (queried, not hit) beyond those the model saw computed — requests no filter
    /// recorded, other gateways' prefills, hits the model assumed that the pod missed — age the
    /// model by as many tokens, once the excess has lasted [`KV_WINDOW`] scrapes (before that it
    /// may be records still on their way). The hit ratios' difference over the last
    /// [`KV_GAP_WINDOW`] scrapes is kept for `prewarm_kv_model_hit_gap`. A counter that went down
    /// starts a new baseline.
    pub(super) fn reconcile_kv(&mut self, queries: u64, hits: u64) {
        let (mq, mh) = self.kv.traffic_tokens();
        let now = KvCounters {
            queries,
            hits,
            modelled_queries: mq,
            modelled_hits: mh,
            modelled_computed: self.kv.computed_tokens(),
        };
        let r = &mut self.kv_counters;
        let restarted = r.window.back().is_some_and(|last| !now.follows(last));
        let baseline = match r.baseline {
            Some(b) if !restarted => b,
            _ => {
                *r = KvReconciliation {
                    baseline: Some(now),
                    ..KvReconciliation::default()
                };
                now
            }
        };
        r.window.push_back(now);
        while r.window.len() > KV_GAP_WINDOW + 1 {
            r.window.pop_front();
        }
        let lasting = if r.window.len() > KV_WINDOW {
            r.window
                .iter()
                .rev()
                .take(KV_WINDOW)
                .map(|c| c.excess_over(&baseline))
                .min()
                .unwrap_or(0)
        } else {
            0
        };
        if lasting > r.aged {
            let unseen = lasting - r.aged;
            r.aged = lasting;
            self.kv.record_uncached_tokens(unseen);
        }
        let Some(first) = self.kv_counters.window.front() else {
            return;
        };
        let (dq, dh) = (now.queries - first.queries, now.hits - first.hits);
        let (dmq, dmh) = (
            now.modelled_queries - first.modelled_queries,
            now.modelled_hits - first.modelled_hits,
        );
        if dq > 0 && dmq > 0 {
            self.kv_hit_gap = Some(dmh as f64 / dmq as f64 - dh as f64 / dq as f64);
        }
    }

    /// Whether the pod may take traffic: up and past its first warm-up tier (or deadline).
    pub fn routable(&self, now_ms: u64) -> bool {
        self.health == PodHealth::Up && self.warmup.routable(now_ms)
    }

    /// The pod came (back) up, or restarted: a new epoch, and it lost its adapters and its
    /// prefix cache.
    pub(super) fn rejoin(&mut self, lora: &LoraConfig) {
        self.health = PodHealth::Up;
        self.epoch = self.epoch.saturating_add(1);
        self.warmup.reset_for_rejoin();
        self.kv.reset();
        self.engine_blocks.note_rejoin();
        self.busy = BusyShare::default();
        self.wait = QueueWait::default();
        self.lora = LoraResidency::new(self.lora.slots(), lora.clone());
    }

    pub(super) fn go_down(&mut self) {
        self.health = PodHealth::Down;
        self.warmup.lose();
    }
}
