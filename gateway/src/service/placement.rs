//! Where a hot prefix lives: the filter's placement rule applied on the gateway's side, so that
//! a prefix is warmed exactly on the pod requests for it will be routed to. A request for an
//! adapter is placed among the pods the routing table lists for that adapter (the pods serving
//! it); a request for the base model, or for an adapter no pod serves, among every pod.

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::PlacementCandidate;

use super::State;
use crate::policy::ScopedCandidates;

/// The scope of every adapter some candidate serves. `planned` adds the adapters a pod's
/// warm-up is about to load, so a joining pod counts as serving them already.
pub fn adapter_scopes<'a>(
    state: &State,
    candidates: &[PlacementCandidate<'a>],
    planned: Option<(&str, &[String])>,
) -> ScopedCandidates<'a> {
    let mut scopes = ScopedCandidates::new();
    for c in candidates {
        let served = state
            .pods
            .get(c.id)
            .into_iter()
            .flat_map(|p| p.lora.served());
        let planned_here = planned
            .filter(|(pod, _)| *pod == c.id)
            .into_iter()
            .flat_map(|(_, adapters)| adapters.iter().map(String::as_str));
        let mut names: Vec<&str> = served.chain(planned_here).collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            scopes.entry(chain_seed(name)).or_default().push(*c);
        }
    }
    scopes
}
