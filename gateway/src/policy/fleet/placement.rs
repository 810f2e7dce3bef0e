//! Where things go, decided once for the gateway and the evaluator.
//!
//! - An adapter is *placed* on the `adapter_replicas` best pods of its tier's pool (core's
//!   rendezvous over its name's chain seed) among the pods that are up; that is where pins and
//!   warm-up loads make it resident.
//! - The routing table lists, for each routable pod, the adapters its LoRA model serves that its
//!   tier pool admits: the filter routes an adapter's requests among those pods.
//! - A hot prefix lives where the filter will route it: core's placement of its routing key
//!   among its model's *scope* — the candidates whose table entry lists the adapter, plus the
//!   warming pods it is placed on (about to load it) — or among every candidate for the base
//!   model and for adapters no candidate serves. Every pod's plan sees the same scopes, so a
//!   prefix moves to exactly one pod.

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::{rank, PlacementCandidate};

use super::pod::{FleetPod, PodHealth};
use super::Fleet;
use crate::policy::{ScopedCandidates, Tier, TierPools};
use crate::registry::AdapterRegistry;

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

/// The tier of a registered adapter (bronze for one the registry does not know).
pub fn registry_tier(registry: &AdapterRegistry, adapter: &str) -> Tier {
    registry.get(adapter).map(|r| r.tier).unwrap_or_default()
}

/// The adapters `pod` serves that the routing table lists for it: those of its tier pool.
pub fn listed_adapters<'p>(
    pod: &'p FleetPod,
    registry: &AdapterRegistry,
    pools: &TierPools,
) -> Vec<&'p str> {
    pod.lora
        .served()
        .filter(|a| pools.is_one_pool() || pools.admits(registry_tier(registry, a), &pod.shape.id))
        .collect()
}

impl Fleet {
    /// The tier of a registered adapter (bronze for one the registry does not know).
    pub fn tier_of(&self, adapter: &str) -> Tier {
        registry_tier(&self.registry, adapter)
    }

    /// The tier pools over every pod, whatever its health.
    pub fn tier_pools(&self) -> TierPools {
        let members: Vec<PlacementCandidate<'_>> = self
            .pods
            .values()
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect();
        TierPools::new(self.config.gold_pool_share, &members)
    }

    /// The pods `adapter` is placed on among the pods that are up, best first.
    pub fn placed_pods(&self, adapter: &str) -> Vec<String> {
        let up: Vec<PlacementCandidate<'_>> = self
            .pods
            .values()
            .filter(|p| p.health == PodHealth::Up)
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect();
        let pool = self.tier_pools().candidates(self.tier_of(adapter), &up);
        placed_pods_among(&pool, adapter, self.config.adapter_replicas)
    }

    /// The routable pods as placement candidates: the members the filters see in the table.
    pub fn routable_candidates(&self, now_ms: u64) -> Vec<PlacementCandidate<'_>> {
        self.pods
            .values()
            .filter(|p| p.routable(now_ms))
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect()
    }

    /// The scope of every registered or served adapter among `candidates` (see the module doc).
    pub fn adapter_scopes<'a>(
        &self,
        candidates: &[PlacementCandidate<'a>],
        now_ms: u64,
    ) -> ScopedCandidates<'a> {
        let pools = self.tier_pools();
        let mut members: Vec<(&str, &str)> = Vec::new();
        for r in self.registry.iter() {
            let pool = pools.candidates(r.tier, candidates);
            for pod in placed_pods_among(&pool, &r.name, self.config.adapter_replicas) {
                let warming = self.pods.get(&pod).is_some_and(|p| !p.routable(now_ms));
                if let Some(c) = candidates.iter().find(|c| c.id == pod).filter(|_| warming) {
                    members.push((r.name.as_str(), c.id));
                }
            }
        }
        for c in candidates {
            let Some(pod) = self.pods.get(c.id) else {
                continue;
            };
            for name in listed_adapters(pod, &self.registry, &pools) {
                members.push((name, c.id));
            }
        }
        members.sort_unstable();
        members.dedup();
        let mut scopes = ScopedCandidates::new();
        for (name, pod) in members {
            if let Some(c) = candidates.iter().find(|c| c.id == pod) {
                scopes.entry(chain_seed(name)).or_default().push(*c);
            }
        }
        scopes
    }
}
