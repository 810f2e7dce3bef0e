//! Where things go, decided once for the gateway and the evaluator.
//!
//! - An adapter is *placed* on its demand-sized replica set ([`crate::policy::replicas`]) in its
//!   tier's pool among the pods that are up: its share of the adapter requests served in the
//!   last [`DEMAND_WINDOW_MS`], at least `adapter_replicas` pods (gold two), hottest first into
//!   free GPU slots. That is where pins and warm-up loads make it resident. The sets are
//!   recomputed every keep-warm period and whenever the pods that are up change.
//! - The routing table lists an adapter on the routable pods of its replica set that serve it
//!   (those of its tier's pool, or a gold pod whose free slot it was given); when none of them does (a fleet whose adapters are registered by
//!   hand, not yet where the gateway placed them), on every routable pod that serves it, so its
//!   requests never go to pods that would have to load it from disk. Listing every registered
//!   adapter instead (15–19 a pod against 4 GPU slots in the evaluation) spread each adapter's
//!   requests over pods whose slots did not hold it, and vLLM's LRU churned the slots.
//! - A hot prefix lives where the filter will route it: core's placement of its routing key
//!   among its model's *scope* — the members of its replica set that the table lists it on or
//!   that are warming (about to load it): what the table lists once they are routable — or,
//!   when no candidate is such a member, the candidates whose table entry lists the adapter,
//!   or every candidate for the base model and for adapters no candidate serves. Every pod's
//!   plan sees the same scopes, so a prefix moves to exactly one pod. While an adapter's set is
//!   warming, the table lists it wherever it is served (it is *uncovered*); counting those
//!   pods in its scope planned only part of its prefixes onto the pods of its set, and once
//!   they were routable the table sent all of them there (measured: a scale-up by three pods
//!   on the shared trace, where most adapters have one replica, warmed 11 of the 28 first
//!   requests of hot prefixes its new pods served; 15–23 of 22–32 over six splits since,
//!   `docs/benchmarks.md`).
//! - With `[lora] loads = "external"` another controller places adapters: an adapter's set is
//!   the pods that are up and serve it (observed), so the table lists it wherever it is served
//!   and its hot prefixes are warmed there, never on a pod that would have to load it.

use std::collections::{BTreeMap, BTreeSet};

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::placement::adapter_order;
use prewarm_core::rate::RateWindow;
use prewarm_core::PlacementCandidate;

use super::pod::{FleetPod, PodHealth};
use super::Fleet;
use crate::policy::lora::AdapterLoads;
use crate::policy::replicas::ReplicaSetCache;
use crate::policy::{
    gold_pool_size, replica_sets, AdapterDemand, PoolFleet, ScopedCandidates, SlotCandidate, Tier,
    TierDemand, TierPools,
};
use crate::registry::AdapterRegistry;

/// Requests per adapter are counted over this window for its replica set: longer than the
/// tiers' minimum GPU residency (gold 120 s), so a set outlives what its residents are
/// guaranteed, and short enough to follow a tenant's traffic within minutes.
pub const DEMAND_WINDOW_MS: u64 = 300_000;

/// The `replicas` best of `candidates` for `adapter` (rendezvous over its name's chain seed).
pub fn placed_pods_among(
    candidates: &[PlacementCandidate<'_>],
    adapter: &str,
    replicas: usize,
) -> Vec<String> {
    adapter_order(adapter, candidates)
        .into_iter()
        .take(replicas.max(1))
        .filter_map(|i| candidates.get(i).map(|c| c.id.to_string()))
        .collect()
}

/// The tier of a registered adapter (bronze for one the registry does not know).
pub fn registry_tier(registry: &AdapterRegistry, adapter: &str) -> Tier {
    registry.get(adapter).map(|r| r.tier).unwrap_or_default()
}

/// The adapters the routing table lists for `pod` (module doc): those it serves that are placed
/// on it, or of its tier pool and that `uncovered` holds (no pod of their set serves them).
pub fn listed_adapters<'p>(
    pod: &'p FleetPod,
    registry: &AdapterRegistry,
    pools: &TierPools,
    placement: &Placement,
) -> Vec<&'p str> {
    pod.lora
        .served()
        .filter(|a| {
            pools.admits(registry_tier(registry, a), &pod.shape.id)
                || placement.replicas(a).contains(&pod.shape.id)
        })
        .filter(|a| placement.lists(a, &pod.shape.id))
        .collect()
}

/// The fleet's adapter-placement part: the demand it places by, the replica sets, the rankings
/// they are chosen from, and the adapters none of whose replicas serves them. Invariants: only
/// registered adapters have a demand window (the windows are bounded by the registry); the sets
/// are those computed for the pods in `up`, and [`Fleet::placed_pods`] uses them only while the
/// pods up are the same; `cache` holds the rankings and inputs of the last computation of the
/// sets (its own invariant: every kept ranking is core's rank of the pods it was kept for).
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Requests served per registered adapter, over [`DEMAND_WINDOW_MS`].
    demand: BTreeMap<String, RateWindow>,
    sets: BTreeMap<String, Vec<String>>,
    uncovered: BTreeSet<String>,
    /// The pods that were up when the sets were computed.
    up: Vec<String>,
    /// The gold pool's size in force with `tier_pools` (0: one pool; see [`crate::policy::pools`]).
    gold_pool: usize,
    /// Every adapter's ranking of the pods up and the last computation's inputs and sets, so a
    /// keep-warm period costs what changed (`replicas::ReplicaSetCache`; at 1,000 pods × 5,000
    /// adapters about 40 MB).
    cache: ReplicaSetCache,
}

impl Placement {
    /// `adapter`'s replicas, best first (empty when it has no set).
    pub fn replicas(&self, adapter: &str) -> &[String] {
        self.sets
            .get(adapter)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Requests a minute for `adapter` over the demand window.
    fn demand_per_minute(&self, adapter: &str, now_ms: u64) -> f64 {
        self.demand
            .get(adapter)
            .map_or(0.0, |w| w.per_minute(now_ms))
    }

    /// Whether the table lists `adapter` on `pod` when the pod serves it.
    pub fn lists(&self, adapter: &str, pod: &str) -> bool {
        self.uncovered.contains(adapter)
            || !self.sets.contains_key(adapter)
            || self.replicas(adapter).iter().any(|p| p == pod)
    }
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
        if self.config.gold_pool_share > 0.0 {
            TierPools::new(self.config.gold_pool_share, &members)
        } else if self.config.tier_pools {
            TierPools::of_size(self.placement.gold_pool, &members)
        } else {
            TierPools::default()
        }
    }

    /// The gold pool's size for the demand of the last window and the pods' load
    /// (`pods.tier_pools`), from the size in force.
    fn sized_gold_pool(&self) -> usize {
        let now_ms = self.now_ms;
        let mut demand = TierDemand::default();
        let (mut gold, mut total) = (0.0f64, 0.0f64);
        for r in self.registry.iter() {
            let rate = self.placement.demand_per_minute(&r.name, now_ms);
            if rate <= 0.0 {
                continue;
            }
            total += rate;
            if r.tier == Tier::Gold {
                gold += rate;
                demand.gold_adapters += 1;
            } else {
                demand.other_adapters += 1;
            }
        }
        demand.gold_share = if total > 0.0 { gold / total } else { 0.0 };
        let pods = self.pods.len();
        if pods > 0 {
            let busy: f64 = self.pods.values().map(|p| p.busy.share(now_ms)).sum();
            demand.busy = busy / pods as f64;
        }
        let fleet = PoolFleet {
            pods,
            slots: self
                .pods
                .values()
                .map(|p| p.lora.slots().max_loras)
                .min()
                .unwrap_or(0),
            load_factor: self.config.routing.load_factor,
        };
        gold_pool_size(&demand, &fleet, self.placement.gold_pool)
    }

    /// The pods `adapter` is placed on among the pods that are up, best first.
    /// The placement's sets when they were computed for the pods up now (every
    /// [`Fleet::tick`] keeps them so), else computed afresh.
    pub fn placed_pods(&self, adapter: &str) -> Vec<String> {
        if self.placement.up == self.up_ids() {
            if let Some(pods) = self.placement.sets.get(adapter) {
                return pods.clone();
            }
        }
        let up = self.up_candidates();
        self.replica_sets_among(&up)
            .remove(adapter)
            .unwrap_or_else(|| {
                let pool = self.tier_pools().candidates(self.tier_of(adapter), &up);
                placed_pods_among(&pool, adapter, self.config.adapter_replicas)
            })
    }

    fn up_ids(&self) -> Vec<String> {
        self.pods
            .values()
            .filter(|p| p.health == PodHealth::Up)
            .map(|p| p.shape.id.clone())
            .collect()
    }

    fn up_candidates(&self) -> Vec<PlacementCandidate<'_>> {
        self.pods
            .values()
            .filter(|p| p.health == PodHealth::Up)
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect()
    }

    /// Every registered adapter's replica set among `candidates` (module doc).
    pub fn replica_sets_among(
        &self,
        candidates: &[PlacementCandidate<'_>],
    ) -> BTreeMap<String, Vec<String>> {
        if self.config.lora.loads == AdapterLoads::External {
            return self.serving_sets_among(candidates);
        }
        let (demands, pods) = self.replica_inputs(candidates);
        replica_sets(
            &demands,
            &pods,
            &self.tier_pools(),
            self.config.adapter_replicas,
            &self.placement.sets,
        )
    }

    /// [`Fleet::replica_sets_among`] by `cache` (rankings kept between calls; the last sets
    /// when no input changed): the sets, or `None` when they are the placement's already.
    fn refresh_sets_among(
        &self,
        candidates: &[PlacementCandidate<'_>],
        cache: &mut ReplicaSetCache,
    ) -> Option<BTreeMap<String, Vec<String>>> {
        if self.config.lora.loads == AdapterLoads::External {
            return Some(self.serving_sets_among(candidates));
        }
        let (demands, pods) = self.replica_inputs(candidates);
        let sets = cache.replica_sets(
            &demands,
            &pods,
            &self.tier_pools(),
            self.config.adapter_replicas,
            &self.placement.sets,
        );
        (*sets != self.placement.sets).then(|| sets.clone())
    }

    /// Every registered adapter's demand, and `candidates` with their GPU adapter slots.
    fn replica_inputs<'s>(
        &'s self,
        candidates: &[PlacementCandidate<'s>],
    ) -> (Vec<AdapterDemand<'s>>, Vec<SlotCandidate<'s>>) {
        let now_ms = self.now_ms;
        let demands: Vec<AdapterDemand<'_>> = self
            .registry
            .iter()
            .map(|r| AdapterDemand {
                name: &r.name,
                tier: r.tier,
                rate: self.placement.demand_per_minute(&r.name, now_ms),
            })
            .collect();
        let pods: Vec<SlotCandidate<'_>> = candidates
            .iter()
            .filter_map(|c| {
                let pod = self.pods.get(c.id)?;
                Some(SlotCandidate {
                    candidate: *c,
                    slots: pod.lora.slots().max_loras,
                })
            })
            .collect();
        (demands, pods)
    }

    /// With external loads: every adapter a candidate serves, on the candidates that serve it
    /// (in the candidates' order). The other controller decided where it is; placing it
    /// elsewhere would warm its prefixes on pods that cannot serve them.
    fn serving_sets_among(
        &self,
        candidates: &[PlacementCandidate<'_>],
    ) -> BTreeMap<String, Vec<String>> {
        let mut sets: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in candidates {
            let Some(pod) = self.pods.get(c.id) else {
                continue;
            };
            for adapter in pod.lora.served() {
                sets.entry(adapter.to_string())
                    .or_default()
                    .push(c.id.to_string());
            }
        }
        sets
    }

    /// Recomputes the placement when `force`d or when the pods that are up changed.
    pub(super) fn refresh_placement(&mut self, force: bool, now_ms: u64) {
        let up = self.up_ids();
        if !force && up == self.placement.up {
            return;
        }
        self.placement.gold_pool = self.sized_gold_pool();
        let mut cache = std::mem::take(&mut self.placement.cache);
        if let Some(sets) = self.refresh_sets_among(&self.up_candidates(), &mut cache) {
            self.placement.sets = sets;
        }
        self.placement.cache = cache;
        let uncovered = self
            .placement
            .sets
            .iter()
            .filter(|(name, pods)| {
                !pods.iter().any(|id| {
                    self.pods
                        .get(id)
                        .is_some_and(|p| p.routable(now_ms) && p.lora.served().any(|a| a == *name))
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        self.placement.uncovered = uncovered;
        self.placement.up = up;
    }

    /// A request for `adapter` was served: counts towards its demand (registered adapters only,
    /// so the windows are bounded by the registry).
    pub(super) fn record_demand(&mut self, adapter: &str, now_ms: u64) {
        if self.registry.get(adapter).is_none() {
            return;
        }
        self.placement
            .demand
            .entry(adapter.to_string())
            .or_insert_with(|| RateWindow::new(DEMAND_WINDOW_MS))
            .record(now_ms, 1);
    }

    /// The ids of the pods routable at `now_ms`, in id order.
    pub fn routable_ids(&self, now_ms: u64) -> Vec<String> {
        self.routable_candidates(now_ms)
            .iter()
            .map(|c| c.id.to_string())
            .collect()
    }

    /// The routable pods as placement candidates: the members the filters see in the table.
    pub fn routable_candidates(&self, now_ms: u64) -> Vec<PlacementCandidate<'_>> {
        self.pods
            .values()
            .filter(|p| p.routable(now_ms))
            .map(|p| PlacementCandidate::new(&p.shape.id, p.shape.weight))
            .collect()
    }

    /// The scope of every registered or served adapter among `candidates` (see the module doc):
    /// the members of its replica set that the table lists it on or that are warming (about to
    /// load it); only when there are none, the candidates the table lists it on.
    pub fn adapter_scopes<'a>(
        &self,
        candidates: &[PlacementCandidate<'a>],
        now_ms: u64,
    ) -> ScopedCandidates<'a> {
        let pools = self.tier_pools();
        let mut listed: BTreeMap<&str, Vec<PlacementCandidate<'a>>> = BTreeMap::new();
        for c in candidates {
            let Some(pod) = self.pods.get(c.id) else {
                continue;
            };
            for name in listed_adapters(pod, &self.registry, &pools, &self.placement) {
                listed.entry(name).or_default().push(*c);
            }
        }
        let mut scopes = ScopedCandidates::new();
        for (name, listed) in &listed {
            let set = self.placement.replicas(name);
            let settled: Vec<PlacementCandidate<'a>> = listed
                .iter()
                .filter(|c| set.iter().any(|p| p == c.id))
                .copied()
                .collect();
            if !settled.is_empty() {
                scopes.insert(chain_seed(name), settled);
            }
        }
        for r in self.registry.iter() {
            for pod in self.placement.replicas(&r.name) {
                let warming = self.pods.get(pod).is_some_and(|p| !p.routable(now_ms));
                if let Some(c) = candidates.iter().find(|c| c.id == pod).filter(|_| warming) {
                    let scope = scopes.entry(chain_seed(&r.name)).or_default();
                    if !scope.iter().any(|s| s.id == c.id) {
                        scope.push(*c);
                    }
                }
            }
        }
        for (name, listed) in listed {
            scopes.entry(chain_seed(name)).or_insert(listed);
        }
        scopes
    }
}
