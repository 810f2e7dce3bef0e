//! Where a hot prefix lives: the filter's placement rule applied on the gateway's side, so that
//! a prefix is warmed exactly on the pod requests for it will be routed to. A request for an
//! adapter is placed among the pods the routing table lists for that adapter (the pods of its
//! tier's pool serving it); a request for the base model, or for an adapter no pod serves,
//! among every pod.

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::PlacementCandidate;

use super::adapters::placed_pods_among;
use super::{PodEntry, State};
use crate::config::PodsConfig;
use crate::policy::{ScopedCandidates, Tier, TierPools};
use crate::registry::AdapterRegistry;

/// The tier of a registered adapter (bronze for one the registry does not know).
pub fn tier_of(state: &State, adapter: &str) -> Tier {
    registry_tier(&state.registry, adapter)
}

fn registry_tier(registry: &AdapterRegistry, adapter: &str) -> Tier {
    registry.get(adapter).map(|r| r.tier).unwrap_or_default()
}

/// The tier pools over every pod in the pool, whatever its health.
pub fn tier_pools(state: &State, pods: &PodsConfig) -> TierPools {
    let members: Vec<PlacementCandidate<'_>> = state
        .pods
        .values()
        .map(|p| PlacementCandidate::new(&p.spec.id, p.spec.weight))
        .collect();
    TierPools::new(pods.gold_pool_share, &members)
}

/// The adapters `pod` serves that the routing table lists for it: those of its tier pool.
pub fn listed_adapters<'p>(
    pod: &'p PodEntry,
    registry: &AdapterRegistry,
    pools: &TierPools,
) -> Vec<&'p str> {
    pod.lora
        .served()
        .filter(|a| pools.is_one_pool() || pools.admits(registry_tier(registry, a), &pod.spec.id))
        .collect()
}

/// The scope of every registered or served adapter: the candidates whose table entry lists it,
/// and the candidates still warming that it is placed on (where the gateway is about to load
/// it, so a joining pod counts before its load completes). Every pod's plan sees the same
/// scopes, so a prefix moves to exactly one pod; once a pod is routable only what the table
/// lists for it counts, as for the filter, which routes an adapter among those pods.
pub fn adapter_scopes<'a>(
    state: &State,
    candidates: &[PlacementCandidate<'a>],
    pods: &PodsConfig,
    now_ms: u64,
) -> ScopedCandidates<'a> {
    let pools = tier_pools(state, pods);
    let mut members: Vec<(&str, &str)> = Vec::new();
    for r in state.registry.iter() {
        let pool = pools.candidates(r.tier, candidates);
        for pod in placed_pods_among(&pool, &r.name, pods.adapter_replicas) {
            let warming = state.pods.get(&pod).is_some_and(|p| !p.routable(now_ms));
            if let Some(c) = candidates.iter().find(|c| c.id == pod).filter(|_| warming) {
                members.push((r.name.as_str(), c.id));
            }
        }
    }
    for c in candidates {
        let Some(pod) = state.pods.get(c.id) else {
            continue;
        };
        for name in listed_adapters(pod, &state.registry, &pools) {
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

/// The routable pods as (id, weight): the members of placement the filters see in the table.
pub fn routable_pods(state: &State, now_ms: u64) -> Vec<(String, f64)> {
    state
        .pods
        .values()
        .filter(|p| p.routable(now_ms))
        .map(|p| (p.spec.id.clone(), p.spec.weight))
        .collect()
}

/// Placement candidates of (id, weight) members.
pub fn candidates_of(members: &[(String, f64)]) -> Vec<PlacementCandidate<'_>> {
    members
        .iter()
        .map(|(id, w)| PlacementCandidate::new(id, *w))
        .collect()
}
