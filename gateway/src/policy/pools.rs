//! Tier pools: the pods are split in two, gold tenants' adapters served (listed in the routing
//! table, placed, pinned) only on the gold pool and the other tiers' on the rest. vLLM evicts
//! GPU adapter slots by LRU of use, which the gateway can only nudge with touches; a pod that
//! also serves the long tail of silver and bronze adapters keeps swapping its gold ones out.
//! The pool reserves slots, it does not waste them: gold adapters are placed first, and a slot
//! of the gold pool they leave free may take one of the other tiers' replicas, never more than
//! the pod's slots ([`crate::policy::replicas`]), so nothing on a gold pod is ever evicted by
//! the LRU. Base-model requests still go to every pod.
//!
//! The gold pool is the `size` best pods (at least one, and at least one left for the others)
//! by weighted rendezvous over pod ids with a fixed seed, over every pod in the pool whatever its
//! health: membership does not flap with health checks, and a pod joining or leaving moves at
//! most one other pod between the pools. With fewer than two pods, or a size of 0, there is one
//! pool serving every tier.
//!
//! **The size** (`pods.tier_pools`, on by default) comes from the last demand window, in
//! [`gold_pool_size`]. Pools exist for GPU adapter slots, not for load: base-model requests and
//! the routing's load bound still spread over every pod. So the gold pool is the *smallest* one
//! that holds its tiers, and every other pod goes to the long tail, which needs slots most:
//! - **slots**: with `s = max_loras` slots a pod, `G` gold adapters with demand, two replicas
//!   each for failover, need `max(2, 2·G / s)` pods. When that leaves the other pool too few
//!   pods, one replica each: `max(1, G / s)` pods, no failover — a second replica the slots
//!   cannot hold is not capacity, it evicts another gold adapter ([`crate::policy::replicas`]),
//!   and without a pool of their own the gold adapters share every pod's slots with the long
//!   tail, which evicts them;
//! - **load**: the pool carries the gold share `g` of the adapter requests. With the fleet's
//!   mean busy share `u` over `n` pods, a gold pool of `k` pods is busy about `u·g·n / k`
//!   (busy share grows about linearly with load well below saturation), which must stay under
//!   the routing's load cap `max(c·u, LOAD_FLOOR)` (core's [`load_cap`], `c` the
//!   `routing.load_factor`), so `k ≥ u·g·n / cap`. The other pool obeys the same bound for
//!   `1 − g`, and has at least one pod.
//!
//! The size is the larger of the gold bounds, rounded up. When it leaves the other pool too
//! few pods, or a side has no demand, there is one pool. The pool grows as soon as a bound
//! needs it, but shrinks only once it has 1.5 pods more than needed, so demand on a boundary
//! does not move pods (and their adapters) back and forth. `pods.gold_pool_share` > 0 sets the
//! share by hand instead.
//!
//! [`load_cap`]: prewarm_core::placement::load_cap

use std::collections::BTreeSet;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::placement::load_cap;
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
        if gold_share.is_nan() || gold_share <= 0.0 {
            return Self::default();
        }
        let size = ((gold_share * pods.len() as f64).round() as usize).max(1);
        Self::of_size(size, pods)
    }

    /// The pools of `pods` (every pod in the pool) with a gold pool of `size` pods (0: one pool).
    pub fn of_size(size: usize, pods: &[PlacementCandidate<'_>]) -> Self {
        let n = pods.len();
        if size == 0 || n < 2 {
            return Self::default();
        }
        let size = size.clamp(1, n - 1);
        let gold = rank(chain_seed(GOLD_POOL_SEED), pods)
            .into_iter()
            .take(size)
            .filter_map(|i| pods.get(i).map(|c| c.id.to_string()))
            .collect();
        Self { gold }
    }

    /// Pods in the gold pool (0: one pool).
    pub fn gold_pods(&self) -> usize {
        self.gold.len()
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

/// What the gold pool is sized from: the adapter requests of the last demand window by tier,
/// and the fleet's load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TierDemand {
    /// Gold adapters' share of the adapter requests, in [0, 1].
    pub gold_share: f64,
    /// Gold adapters with requests in the window.
    pub gold_adapters: usize,
    /// Other tiers' adapters with requests in the window.
    pub other_adapters: usize,
    /// The pods' mean busy share of the last minute, in [0, 1].
    pub busy: f64,
}

/// The fleet a gold pool is cut from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolFleet {
    /// Pods in the pool.
    pub pods: usize,
    /// GPU adapter slots of the smallest pod (`max_loras`).
    pub slots: usize,
    /// The routing's bounded-load factor (`routing.load_factor`; `None`: no load bound).
    pub load_factor: Option<f64>,
}

/// The gold pool's size for `demand` on `fleet` (module doc); 0: one pool. `previous` is the
/// size in force, kept until the pool has 1.5 pods more than it needs.
pub fn gold_pool_size(demand: &TierDemand, fleet: &PoolFleet, previous: usize) -> usize {
    let g = demand.gold_share;
    let n = fleet.pods;
    if !(g > 0.0 && g < 1.0) || demand.gold_adapters == 0 || demand.other_adapters == 0 {
        return 0;
    }
    let u = if demand.busy.is_finite() {
        demand.busy.clamp(0.0, 1.0)
    } else {
        0.0
    };
    // pods a pool carrying `share` of the requests needs to stay under the load cap
    let for_load = |share: f64| match fleet.load_factor {
        Some(c) => share * n as f64 * u / load_cap(std::iter::once(u), c),
        None => 0.0,
    };
    let slots = fleet.slots.max(1) as f64;
    let others = (for_load(1.0 - g).ceil() as usize).max(1);
    // two replicas of each gold adapter (failover) when the pods allow it, else one (module doc)
    let with = |replicas: f64, least: f64| {
        (replicas * demand.gold_adapters as f64 / slots)
            .max(least)
            .max(for_load(g))
    };
    let mut needed = with(2.0, 2.0);
    if needed.ceil() as usize + others > n {
        needed = with(1.0, 1.0);
    }
    let size = needed.ceil() as usize;
    if size + others > n {
        return 0;
    }
    if previous >= size && previous + others <= n && (previous as f64) < needed + 1.5 {
        return previous;
    }
    size
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

    fn demand(gold_share: f64, gold_adapters: usize, other_adapters: usize) -> TierDemand {
        TierDemand {
            gold_share,
            gold_adapters,
            other_adapters,
            busy: 0.2,
        }
    }

    fn fleet(pods: usize, slots: usize) -> PoolFleet {
        PoolFleet {
            pods,
            slots,
            load_factor: Some(1.25),
        }
    }

    #[test]
    fn a_lightly_loaded_gold_pool_is_just_big_enough_for_two_replicas_of_each_gold_adapter() {
        // busy 0.2: the load cap is the floor (0.5), so load needs fewer pods than slots do
        for (gold, slots, size) in [(1, 4, 2), (3, 4, 2), (4, 4, 2), (5, 4, 3), (6, 2, 6)] {
            let d = demand(0.3, gold, 10);
            assert_eq!(
                gold_pool_size(&d, &fleet(12, slots), 0),
                size,
                "{gold}/{slots}"
            );
        }
    }

    #[test]
    fn each_pool_stays_under_the_load_cap_and_gold_keeps_its_adapters_resident() {
        for pods in 2..24 {
            for slots in 1..6 {
                for (gold, other) in [(1, 1), (3, 24), (4, 28), (6, 3), (10, 10)] {
                    for share in [0.05, 0.3, 0.5, 0.9] {
                        for busy in [0.0, 0.2, 0.45, 0.8, 1.0] {
                            let d = TierDemand {
                                busy,
                                ..demand(share, gold, other)
                            };
                            let size = gold_pool_size(&d, &fleet(pods, slots), 0);
                            if size == 0 {
                                continue;
                            }
                            // every gold adapter has a slot, and two whenever the pods
                            // leave the other tiers their room with them
                            assert!(size * slots >= gold, "{d:?} {pods} {slots}");
                            let n = pods as f64;
                            let others =
                                ((busy * (1.0 - share) * n / (1.25 * busy).max(0.5)).ceil()
                                    as usize)
                                    .max(1);
                            let two = (2 * gold).div_ceil(slots).max(2);
                            assert!(size >= two || two + others > pods, "{d:?} {pods} {slots}");
                            assert!(size < pods, "{d:?} {pods}");
                            let cap = (1.25 * busy).max(0.5) + 1e-9;
                            assert!(busy * share * n / size as f64 <= cap, "{d:?} {pods}");
                            assert!(busy * (1.0 - share) * n / (pods - size) as f64 <= cap);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_busier_fleet_needs_a_bigger_gold_pool() {
        let sizes: Vec<usize> = [0.2, 0.4, 0.6, 0.8]
            .into_iter()
            .map(|busy| {
                let d = TierDemand {
                    busy,
                    ..demand(0.5, 2, 10)
                };
                gold_pool_size(&d, &fleet(20, 4), 0)
            })
            .collect();
        // 0.5 × 20 × u ÷ max(1.25 u, 0.5): 4, 8, 8, 8 pods (above the floor, g·n ÷ c)
        assert_eq!(sizes, [4, 8, 8, 8]);
        let unbounded = PoolFleet {
            load_factor: None,
            ..fleet(20, 4)
        };
        let d = TierDemand {
            busy: 0.8,
            ..demand(0.5, 2, 10)
        };
        assert_eq!(
            gold_pool_size(&d, &unbounded, 0),
            2,
            "no load bound: slots only"
        );
    }

    #[test]
    fn no_demand_on_a_side_or_too_few_pods_is_one_pool_and_few_pods_drop_the_second_gold_replica() {
        let idle = |share, gold, other| TierDemand {
            busy: 0.0,
            ..demand(share, gold, other)
        };
        assert_eq!(gold_pool_size(&demand(0.0, 0, 5), &fleet(10, 4), 0), 0);
        assert_eq!(gold_pool_size(&demand(1.0, 3, 0), &fleet(10, 4), 0), 0);
        assert_eq!(gold_pool_size(&demand(f64::NAN, 3, 5), &fleet(10, 4), 0), 0);
        // two replicas of 8 gold adapters on 2 slots need 8 pods: with 9, they have them
        assert_eq!(gold_pool_size(&idle(0.3, 8, 5), &fleet(9, 2), 0), 8);
        // with 8 that leaves the others none: one replica each, 4 pods
        assert_eq!(gold_pool_size(&idle(0.3, 8, 5), &fleet(8, 2), 0), 4);
        // with 4 even one each leaves the others none
        assert_eq!(gold_pool_size(&idle(0.3, 8, 5), &fleet(4, 2), 0), 0);
    }

    #[test]
    fn the_pool_grows_at_once_and_shrinks_only_with_a_pod_and_a_half_to_spare() {
        let at = |busy, previous| {
            let d = TierDemand {
                busy,
                ..demand(0.5, 2, 10)
            };
            gold_pool_size(&d, &fleet(20, 4), previous)
        };
        // busy 0.3: 0.5 × 20 × 0.3 ÷ 0.5 = 6 pods needed
        assert_eq!(at(0.3, 4), 6, "grows at once");
        assert_eq!(at(0.3, 7), 7, "7 < 6 + 1.5: kept");
        assert_eq!(at(0.3, 8), 6, "8 >= 7.5: shrinks");
        assert_eq!(at(0.3, 19), 6, "beyond the other pool's room: recomputed");
    }

    #[test]
    fn a_size_keeps_one_pod_for_the_other_tiers() {
        let names = ids(6);
        for size in [1, 3, 5, 6, 40] {
            let pools = TierPools::of_size(size, &pods(&names));
            assert_eq!(gold_count(&pools, &names), size.min(5));
        }
        assert!(TierPools::of_size(0, &pods(&names)).is_one_pool());
    }
}
