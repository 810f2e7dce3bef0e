//! Where a hot prefix lives: the filter's placement rule applied on the gateway's side, so that
//! a prefix is warmed exactly on the pod requests for it will be routed to. A request for an
//! adapter is placed among the pods the routing table lists for that adapter (the pods serving
//! it); a request for the base model, or for an adapter no pod serves, among every pod.

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::PlacementCandidate;

use super::adapters::placed_pods_among;
use super::State;
use crate::policy::ScopedCandidates;

/// The scope of every registered or served adapter: the candidates serving it, and the
/// candidates still warming that it is placed on (where the gateway is about to load it, so a
/// joining pod counts before its load completes). Every pod's plan sees the same scopes, so a
/// prefix moves to exactly one pod; once a pod is routable only what it serves counts, as for
/// the filter, which routes an adapter among the pods the table lists for it.
pub fn adapter_scopes<'a>(
    state: &State,
    candidates: &[PlacementCandidate<'a>],
    replicas: usize,
    now_ms: u64,
) -> ScopedCandidates<'a> {
    let mut members: Vec<(&str, &str)> = Vec::new();
    for r in state.registry.iter() {
        for pod in placed_pods_among(candidates, &r.name, replicas) {
            let warming = state.pods.get(&pod).is_some_and(|p| !p.routable(now_ms));
            if let Some(c) = candidates.iter().find(|c| c.id == pod).filter(|_| warming) {
                members.push((r.name.as_str(), c.id));
            }
        }
    }
    for c in candidates {
        for name in state
            .pods
            .get(c.id)
            .into_iter()
            .flat_map(|p| p.lora.served())
        {
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
