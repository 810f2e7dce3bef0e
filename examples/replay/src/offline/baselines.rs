//! The simple baselines, and the adapter-first pool the adapter-aware ones share.
//!
//! - `round_robin`: what a plain Kubernetes Service gives: requests in turn over the pods that
//!   are up, no warm-up, adapters left to the engine's LRU.
//! - `first_shard_affinity`: the pods whose GPU slots hold the request's adapter first (all pods
//!   when none does), then core's rendezvous placement on the prompt's routing key — the hash of
//!   its *first 512-token shard* — among them: the filter's pre-longest-prefix choice, with no
//!   warm-up, no keep-warm and no LoRA policy. A new pod takes traffic as soon as it is up. When
//!   every prompt starts with the same 512-token system prompt its key is the same for all.
//!
//! The field's routers are in [`super::sglang_cache_aware`] and [`super::dynamo_kv`].

use prewarm_core::FingerprintConfig;

use super::fleet::Fleet;
use super::policy::{place_among, Policy, RequestCtx};
use crate::scenario::FleetEvent;

/// Round robin over the pods that are up.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn on_event(&mut self, _fleet: &mut Fleet, _event: FleetEvent, _now_s: f64) {}

    fn route(&mut self, fleet: &Fleet, _request: &RequestCtx<'_>) -> usize {
        let n = fleet.pods.len().max(1);
        let pod = self.next % n;
        self.next = self.next.wrapping_add(1);
        pod
    }
}

/// The pods whose GPU slots hold `adapter` now, else every pod (also for base-model requests):
/// the LoRA awareness llm-d's and Dynamo's routers give. It reads slot residency exactly from
/// the pod model, which a real router cannot (`vllm:lora_requests_info` shows activity, not
/// residency), so it is an optimistic stand-in.
pub fn adapter_first_pool(fleet: &Fleet, adapter: Option<&str>) -> Vec<usize> {
    let all: Vec<usize> = (0..fleet.pods.len()).collect();
    let holders: Vec<usize> = match adapter {
        Some(a) => all
            .iter()
            .copied()
            .filter(|&i| fleet.adapter_in_slot(i, a))
            .collect(),
        None => Vec::new(),
    };
    if holders.is_empty() {
        all
    } else {
        holders
    }
}

/// Adapter holders first, then rendezvous on the first shard's routing key; no warm-up.
#[derive(Debug)]
pub struct FirstShardAffinity {
    fingerprint: FingerprintConfig,
    fallback: RoundRobin,
}

impl FirstShardAffinity {
    pub fn new(fingerprint: FingerprintConfig) -> Self {
        Self {
            fingerprint,
            fallback: RoundRobin::default(),
        }
    }
}

impl Policy for FirstShardAffinity {
    fn name(&self) -> &'static str {
        "first_shard_affinity"
    }

    fn on_event(&mut self, _fleet: &mut Fleet, _event: FleetEvent, _now_s: f64) {}

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        let pool = adapter_first_pool(fleet, request.adapter);
        place_among(fleet, &pool, request.chain, &self.fingerprint)
            .unwrap_or_else(|| self.fallback.route(fleet, request))
    }
}
