//! One pod as the fleet core models it: its shape (address, weight, LoRA slots), its health and
//! epoch, its last reported load, its KV and LoRA models and its warm-up. No handles, no I/O:
//! the shell keeps the pod's client, source and error log beside it.

use serde::Serialize;

use crate::policy::lora::LoraSlots;
use crate::policy::warmup::WarmupStatus;
use crate::policy::{KvConfig, KvResidency, LoraConfig, LoraResidency, WarmupProgress};

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
    /// The pod's prefix-cache counters and the model's at the last reconciliation.
    pub kv_counters: Option<KvCounters>,
    /// Modelled minus observed prefix-cache hit ratio over the last scrape interval with
    /// traffic; `None` before the pod reported counters for traffic the model also saw.
    pub kv_hit_gap: Option<f64>,
}

/// Cumulative prefix-cache tokens: the pod's (`queries`, `hits`) and the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvCounters {
    pub queries: u64,
    pub hits: u64,
    pub modelled_queries: u64,
    pub modelled_hits: u64,
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
            kv_counters: None,
            kv_hit_gap: None,
        }
    }

    /// Reconciles the KV model with the pod's prefix-cache counters: prompt tokens the pod
    /// computed (queried, not hit) beyond those the model saw computed — requests no filter
    /// recorded, other gateways' prefills, hits the model assumed that the pod missed — age the
    /// model by as many tokens; the hit ratios' difference over the interval is kept for the
    /// `prewarm_kv_model_hit_gap` metric. A counter that went down (the pod restarted) starts a
    /// new baseline.
    pub(super) fn reconcile_kv(&mut self, queries: u64, hits: u64) {
        let (mq, mh) = self.kv.traffic_tokens();
        let now = KvCounters {
            queries,
            hits,
            modelled_queries: mq,
            modelled_hits: mh,
        };
        let before = self.kv_counters.replace(now);
        let Some(b) = before.filter(|b| queries >= b.queries && hits >= b.hits) else {
            return;
        };
        let (dq, dh) = (queries - b.queries, hits - b.hits);
        let (dmq, dmh) = (
            mq.saturating_sub(b.modelled_queries),
            mh.saturating_sub(b.modelled_hits),
        );
        let unseen = dq
            .saturating_sub(dh)
            .saturating_sub(dmq.saturating_sub(dmh));
        if unseen > 0 {
            self.kv.record_uncached_tokens(unseen);
        }
        if dq > 0 && dmq > 0 {
            self.kv_hit_gap = Some(dmh as f64 / dmq as f64 - dh as f64 / dq as f64);
        }
    }

    /// Whether the pod may take traffic: up and past its first warm-up tier (or deadline).
    pub fn routable(&self, now_ms: u64) -> bool {
        self.health == PodHealth::Up && self.warmup.routable(now_ms)
    }

    /// The pod came (back) up: a new epoch, and it lost its adapters and its prefix cache.
    pub(super) fn rejoin(&mut self, lora: &LoraConfig) {
        self.health = PodHealth::Up;
        self.epoch = self.epoch.saturating_add(1);
        self.warmup.reset_for_rejoin();
        self.kv.reset();
        self.lora = LoraResidency::new(self.lora.slots(), lora.clone());
    }

    pub(super) fn go_down(&mut self) {
        self.health = PodHealth::Down;
        self.warmup.lose();
    }
}
