//! Tier pools: with `pods.gold_pool_share` > 0 the pods are split in two, gold tenants' adapters
//! served (listed in the routing table, placed, pinned) only on the gold pool and the other
//! tiers' only on the rest. vLLM evicts GPU adapter slots by LRU of use, which the gateway can
//! only nudge with touches; a pod that also serves the long tail of silver and bronze adapters
//! keeps swapping its gold ones out. Base-model requests still go to every pod.
//!
//! The gold pool is the `round(share × pods)` best pods (at least one, and at least one left
//! for the others) by weighted rendezvous over pod ids with a fixed seed, over every pod in the
//! pool whatever its health: membership does not flap with health checks, and a pod joining or
//! leaving moves at most one other pod between the pools. With fewer than two pods, or a share
//! of 0 (the default), there is one pool serving every tier.

use std::collections::BTreeSet;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::{rank, PlacementCandidate};

use super::Tier;

/// The rendezvous key of the gold pool.
const GOLD_POOL_SEED: &str = "prewarm/gold-pool";

/// Which pods serve which tiers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierPools {
    /// Ids of the gold pool's pods; empty: one pool for every tier.
    gold: BTreeSet<String>,
}

impl TierPools {
    /// The pools of `pods` (every pod in the pool) for a gold share in [0, 1).
    pub fn new(gold_share: f64, pods: &[PlacementCandidate<'_>]) -> Self {
        let n = pods.len();
        if gold_share.is_nan() || gold_share <= 0.0 || n < 2 {
            return Self::default();
        }
        let size = ((gold_share * n as f64).round() as usize).clamp(1, n - 1);
        let gold = rank(chain_seed(GOLD_POOL_SEED), pods)
            .into_iter()
            .take(size)
            .filter_map(|i| pods.get(i).map(|c| c.id.to_string()))
            .collect();
        Self { gold }
    }

    /// Whether every pod serves every tier (no gold pool).
    pub fn is_one_pool(&self) -> bool {
        self.gold.is_empty()
    }

    /// Whether `pod` serves adapters of `tier`.
    pub fn admits(&self, tier: Tier, pod: &str) -> bool {
        self.is_one_pool() || (tier == Tier::Gold) == self.gold.contains(pod)
    }

    /// The members of `candidates` that serve adapters of `tier`.
    pub fn candidates<'a>(
        &self,
        tier: Tier,
        candidates: &[PlacementCandidate<'a>],
    ) -> Vec<PlacementCandidate<'a>> {
        candidates
            .iter()
            .filter(|c| self.admits(tier, c.id))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(ids: &[String]) -> Vec<PlacementCandidate<'_>> {
        ids.iter()
            .map(|id| PlacementCandidate::new(id, 1.0))
            .collect()
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
    }

    fn gold_count(pools: &TierPools, names: &[String]) -> usize {
        pools.candidates(Tier::Gold, &pods(names)).len()
    }

    #[test]
    fn no_share_or_one_pod_is_one_pool_for_every_tier() {
        let names = ids(4);
        for pools in [
            TierPools::new(0.0, &pods(&names)),
            TierPools::new(f64::NAN, &pods(&names)),
            TierPools::new(0.5, &pods(&names[..1])),
        ] {
            for tier in [Tier::Gold, Tier::Silver, Tier::Bronze] {
                assert!(names.iter().all(|p| pools.admits(tier, p)));
            }
        }
    }

    #[test]
    fn gold_and_the_other_tiers_split_the_pods() {
        let names = ids(8);
        let pools = TierPools::new(0.6, &pods(&names));
        assert_eq!(gold_count(&pools, &names), 5);
        for p in &names {
            assert_ne!(pools.admits(Tier::Gold, p), pools.admits(Tier::Silver, p));
            assert_eq!(pools.admits(Tier::Silver, p), pools.admits(Tier::Bronze, p));
        }
        assert_eq!(pools.candidates(Tier::Bronze, &pods(&names)).len(), 3);
        // both pools keep a pod at the extremes
        assert_eq!(gold_count(&TierPools::new(0.01, &pods(&names)), &names), 1);
        assert_eq!(gold_count(&TierPools::new(0.99, &pods(&names)), &names), 7);
    }

    #[test]
    fn a_joining_pod_moves_at_most_one_other_pod_between_pools() {
        for n in 2..20 {
            let names = ids(n + 1);
            let before = TierPools::new(0.5, &pods(&names[..n]));
            let after = TierPools::new(0.5, &pods(&names));
            let moved = names[..n]
                .iter()
                .filter(|p| before.admits(Tier::Gold, p) != after.admits(Tier::Gold, p))
                .count();
            assert!(moved <= 1, "{n} pods: {moved} moved");
        }
    }
}
