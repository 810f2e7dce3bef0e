//! Planning a pod's warm-up from the current state: the candidates are the pods not known to be
//! down (up, or not checked yet: at a gateway restart every pod comes up in the same round, and
//! each should warm only its own share) plus
//! the pod itself, the adapters those placed on it (pinned first, then by tier), the hot prefixes
//! the pool's hottest, an adapter's prefixes placed among the pods serving it ([`super::placement`]). Used by the executor, `GET /admin/pods/{id}/plan` and the `plan` command.

use prewarm_core::PlacementCandidate;
use serde::Serialize;

use super::adapters::placed_pods_among;
use super::placement::{adapter_scopes, tier_pools};
use super::pods::PodHealth;
use super::{Gateway, State};
use crate::policy::{plan_warmup_scoped, WarmupPlan};

/// Which pods count as placement candidates besides the planned one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidates {
    /// Pods not known to be down (the live service).
    Live,
    /// Every pod in the pool (the `plan` command, which checks no pod).
    All,
}

/// The plan `pod_id` would get now; `None` when it is not in the pool.
pub fn plan_for(
    gateway: &Gateway,
    state: &State,
    pod_id: &str,
    which: Candidates,
) -> Option<WarmupPlan> {
    state.pods.get(pod_id)?;
    let members: Vec<(&str, f64)> = state
        .pods
        .values()
        .filter(|p| {
            p.spec.id == pod_id
                || match which {
                    Candidates::All => true,
                    Candidates::Live => p.health != PodHealth::Down,
                }
        })
        .map(|p| (p.spec.id.as_str(), p.spec.weight))
        .collect();
    let candidates: Vec<PlacementCandidate<'_>> = members
        .iter()
        .map(|(id, w)| PlacementCandidate::new(id, *w))
        .collect();
    let replicas = gateway.config.pods.adapter_replicas;
    let pools = tier_pools(state, &gateway.config.pods);
    let mut adapters: Vec<(bool, crate::policy::Tier, &str)> = state
        .registry
        .iter()
        .filter(|r| {
            placed_pods_among(&pools.candidates(r.tier, &candidates), &r.name, replicas)
                .iter()
                .any(|p| p == pod_id)
        })
        .map(|r| (r.pinned, r.tier, r.name.as_str()))
        .collect();
    adapters.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
    let adapters: Vec<String> = adapters
        .into_iter()
        .map(|(_, _, n)| n.to_string())
        .collect();
    let hot = state.pool.hot_prefixes(
        gateway.config.warmup.max_candidates,
        &gateway.config.fingerprint.core(),
    );
    let scopes = adapter_scopes(state, &candidates, &gateway.config.pods, super::now_ms());
    Some(plan_warmup_scoped(
        pod_id,
        &candidates,
        &scopes,
        &adapters,
        &hot,
        &gateway.config.warmup,
    ))
}

/// A plan as the API and the `plan` command print it: prefix keys in their display form
/// (`<model seed hex>-<last block hex>`, as `GET /admin/prompts` lists them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanView {
    pub pod: String,
    pub adapters: Vec<String>,
    pub first_tier: Vec<String>,
    pub second_tier: Vec<String>,
    /// Prefixes that move to the pod but are left to lazy warm-up.
    pub lazy: usize,
    /// Hot prefixes examined.
    pub considered: usize,
}

impl From<&WarmupPlan> for PlanView {
    fn from(plan: &WarmupPlan) -> Self {
        Self {
            pod: plan.pod.clone(),
            adapters: plan.adapters.clone(),
            first_tier: plan.first_tier.iter().map(|k| k.to_string()).collect(),
            second_tier: plan.second_tier.iter().map(|k| k.to_string()).collect(),
            lazy: plan.lazy.len(),
            considered: plan.considered,
        }
    }
}
