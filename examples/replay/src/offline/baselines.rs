//! The baselines.
//!
//! - `round_robin`: what a plain Kubernetes Service gives: requests in turn over the pods that
//!   are up, no warm-up, adapters left to the engine's LRU.
//! - `affinity`: what the field's routers do: the pods whose GPU slots hold the request's
//!   adapter first (all pods when none does), then core's rendezvous placement on the prompt's
//!   routing key among them — the filter's own choice — with no warm-up, no keep-warm and no
//!   LoRA policy. A new pod takes traffic as soon as it is up.

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

/// Prefix- and adapter-affinity routing without warm-up.
#[derive(Debug)]
pub struct Affinity {
    fingerprint: FingerprintConfig,
    fallback: RoundRobin,
}

impl Affinity {
    pub fn new(fingerprint: FingerprintConfig) -> Self {
        Self {
            fingerprint,
            fallback: RoundRobin::default(),
        }
    }
}

impl Policy for Affinity {
    fn name(&self) -> &'static str {
        "affinity"
    }

    fn on_event(&mut self, _fleet: &mut Fleet, _event: FleetEvent, _now_s: f64) {}

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        let all: Vec<usize> = (0..fleet.pods.len()).collect();
        let holders: Vec<usize> = match request.adapter {
            Some(a) => all
                .iter()
                .copied()
                .filter(|&i| fleet.adapter_in_slot(i, a))
                .collect(),
            None => Vec::new(),
        };
        let pool = if holders.is_empty() { &all } else { &holders };
        place_among(fleet, pool, request.chain, &self.fingerprint)
            .unwrap_or_else(|| self.fallback.route(fleet, request))
    }
}
