//! Demand-sized adapter replica sets: the pods each adapter is placed on.
//!
//! The table lists an adapter on its replicas, and the filter routes the adapter's requests
//! among them, so a replica set's size decides both the adapter's share of the fleet and how
//! many GPU slots it occupies. In a pool of `n` pods (its tier's pool, see [`TierPools`]), an
//! adapter with a share `s = d / D` of the pool's adapter requests (`d` its rate, `D` the sum
//! over the pool's adapters) gets `r = ceil(n × s)` replicas: each replica then sees about an
//! average pod's share of the adapter traffic. At least one replica (gold: two, for failover,
//! when the pool has two pods and its GPU slots hold every adapter's minimum with them), at most
//! `n`. An adapter without measured demand has the minimum.
//!
//! GPU slots and load bound the sets. A pod holds `max_loras` adapters in GPU slots; adapters
//! are assigned hottest first (ties by name), each replica taking `d / r` of the demand, to the
//! best pods of the adapter's rendezvous ranking (core's placement over its name's chain seed)
//! that still have a free slot and whose assigned demand stays within [`LOAD_BOUND`] × the
//! pool's mean; then to pods within the bound; then to the ranking's best. The cold tail shares
//! slots through the engine's LRU — all it can have — while every pod carries a near-equal part
//! of the demand, so its KV cache serves an equal part of the prompts. Assigning the hot adapters first keeps the adapters
//! that carry most requests resident; a fixed replica count (the old `adapter_replicas`) instead
//! put every adapter on the same number of pods, about twice the slots there were.
//!
//! The counts fit the slots where load allows: while a pool's counts sum to more than its
//! pods' GPU slots, the largest count above its floor shrinks by one (ties: the colder
//! adapter). A replica beyond the slots is not capacity: it evicts another adapter through the
//! engine's LRU, and every request that then finds its adapter evicted waits for a load. So a
//! gold adapter's second replica, there for failover, is kept only while the pool's slots hold
//! every adapter's minimum with it: beyond them the gold replicas evict each other, and half of
//! a gold adapter's requests go to the replica that just lost it. Measured offline (Zipf over
//! 162 adapters, 17 of them gold, 10 pods of 4 GPU slots): two gold replicas each are 34
//! slots against 20 in the gold pool, and gold adapter hit was 0.764; with one, 0.955
//! (docs/evaluation.md). The
//! floor is the minimum (one replica, gold two) or the fewest replicas that keep each within
//! [`LOAD_BOUND`] × a pod's share, `ceil(n × s / LOAD_BOUND)`, whichever is larger: fewer
//! replicas would crowd the adapter's requests past the routing's load bound.
//!
//! With a gold pool, gold adapters are assigned first, and another tier's adapter may take a
//! gold pod's slot that is still free after them — after its own pool's free slots within the
//! bound, before oversubscribing its own pool — when that pod's assigned demand stays within
//! [`LOAD_BOUND`] × the whole fleet's mean. Such a replica never takes a slot a gold adapter
//! needs, and never makes a gold pod hold more adapters than slots.
//!
//! Sets are sticky: an adapter keeps the members of its previous set that are still in its pool
//! (up to its new count) and only gains or drops members when its count changes or a member
//! leaves, because a member moving moves the adapter's cached prefixes with it. Same inputs, same
//! sets.
//!
//! Cost. Each adapter scores every member of its pool once (core's rendezvous [`score`]: O(n))
//! and puts in order only the prefix of its ranking its passes read: the next best of the
//! unsorted rest by partial selection (`select_nth_unstable`), then those alone sorted, the
//! prefix doubling when a pass reads past it. A pass that needs a free slot first lists the
//! pods with one that it finds eligible (slot and load look-ups, no scoring) and, when there
//! are at most 64 (`FEW`), sorts only those: the pods left with free slots are mostly the ones
//! over the bound, and walking the ranking to find that none fits would sort all of it. The
//! passes over the previous set sort only its members, and the pass within the bound does the
//! same with the pool's pods within it. So a call is O(adapters × n), the sorting
//! O(adapters × (n + k log k)) for the k ranks the passes read. Sorting every ranking whole, and walking it whole
//! once the free slots were all over the bound, took about a second a call at 1,000 pods ×
//! 5,000 adapters (`docs/benchmarks.md`); scoring every pool member is now most of the cost.
//!
//! The sets are the full ranking's, bit for bit ([`replica_sets_by_full_ranking`] keeps it, the
//! property tests' oracle): (1) core's `rank` orders by score descending, then id, then position
//! (its sort is stable): a strict total order, so the prefix that selection then sorting yields
//! is the full ranking's prefix; (2) a pass takes, in ranking order, the pods it finds eligible,
//! and eligibility does not change during one adapter's passes (slots and load are charged once
//! its set is chosen), so walking a prefix lazily takes the same pods in the same order, and
//! when every eligible pod is in a set `S` (a kept pod is in the previous set; a pod with room
//! has a free slot) sorting `S`'s eligible members by the same order lists the same pods.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::placement::score;
use prewarm_core::PlacementCandidate;

use super::{Tier, TierPools};

mod cache;
mod full_ranking;
mod rankings;

pub use cache::ReplicaSetCache;
pub use full_ranking::replica_sets_by_full_ranking;

/// A pod's assigned adapter demand stays within this factor of its pool's mean where it can:
/// consistent hashing with bounded loads' usual `c = 1.25` (Mirrokni, Thorup, Zadimoghaddam),
/// the fleet's fairness bound (no pod above 1.25 × the mean load).
pub const LOAD_BOUND: f64 = 1.25;

/// One adapter's demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdapterDemand<'a> {
    pub name: &'a str,
    pub tier: Tier,
    /// Requests per minute (any consistent unit: only shares matter).
    pub rate: f64,
}

/// A pod that can hold replicas: a placement candidate and its GPU adapter slots.
#[derive(Debug, Clone, Copy)]
pub struct SlotCandidate<'a> {
    pub candidate: PlacementCandidate<'a>,
    pub slots: usize,
}

/// The fewest replicas of a `tier` adapter: two for gold while its pool's slots hold a second
/// replica of every gold adapter (`failover`, module doc), else one.
fn tier_floor(tier: Tier, failover: bool) -> usize {
    if tier == Tier::Gold && failover {
        2
    } else {
        1
    }
}

/// Replicas an adapter needs among `pool_size` pods for a `share` of its pool's demand, at least
/// `min_replicas` and `floor` ([`tier_floor`]).
fn replica_count(share: f64, floor: usize, pool_size: usize, min_replicas: usize) -> usize {
    let floor = min_replicas.max(floor);
    let wanted = if share.is_finite() && share > 0.0 {
        (share.min(1.0) * pool_size as f64).ceil() as usize
    } else {
        0
    };
    wanted.max(floor).min(pool_size)
}

/// Whether `tier`'s adapters have a pool of their own (gold, when the pools are split).
fn in_gold_pool(pools: &TierPools, tier: Tier) -> bool {
    !pools.is_one_pool() && tier == Tier::Gold
}

/// The adapters in assignment order and each pool's total demand.
struct DemandOrder<'a, 'b> {
    order: Vec<&'a AdapterDemand<'b>>,
    gold_total: f64,
    other_total: f64,
    /// The most demand a pod may take of adapters spilled out of their pool: [`LOAD_BOUND`] ×
    /// the whole fleet's mean.
    fleet_bound: f64,
}

/// Each pool's total demand (adapters of tiers sharing a pool share its denominator), and the
/// adapters gold first when they have a pool (its slots are theirs before anyone's), then by
/// demand, then by name.
fn demand_order<'a, 'b>(
    demands: &'a [AdapterDemand<'b>],
    pools: &TierPools,
    pods: usize,
) -> DemandOrder<'a, 'b> {
    let (mut gold_total, mut other_total) = (0.0f64, 0.0f64);
    for d in demands {
        let total = if in_gold_pool(pools, d.tier) {
            &mut gold_total
        } else {
            &mut other_total
        };
        *total += d.rate.max(0.0);
    }
    let mut order: Vec<&AdapterDemand<'_>> = demands.iter().collect();
    order.sort_by(|a, b| {
        in_gold_pool(pools, b.tier)
            .cmp(&in_gold_pool(pools, a.tier))
            .then(b.rate.total_cmp(&a.rate))
            .then(a.name.cmp(b.name))
    });
    DemandOrder {
        order,
        gold_total,
        other_total,
        fleet_bound: LOAD_BOUND * (gold_total + other_total) / pods.max(1) as f64,
    }
}

/// Every adapter's replicas (pod ids) among `pods` (ids unique, as the fleet's are), at least
/// `min_replicas` each; an adapter keeps the members of its `previous` set that are still in its
/// pool and still have a free slot and room under the bound, up to its new count. Cost (module
/// doc, "Cost"): every adapter scores its pool once and sorts only the ranks its passes read,
/// O(adapters × pods) a call — the fleet calls it once a keep-warm period.
pub fn replica_sets(
    demands: &[AdapterDemand<'_>],
    pods: &[SlotCandidate<'_>],
    pools: &TierPools,
    min_replicas: usize,
    previous: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    let fleet = PodIndex::new(pods, pools);
    assign(demands, &fleet, pools, min_replicas, previous, |d, pool| {
        Ranking::new(chain_seed(d.name), pool, &fleet)
    })
}

/// The passes every adapter's set is chosen by (module doc), in assignment order, each reading
/// the adapter's ranking of its pool (and of the gold pool it may spill into) that `ranking`
/// gives: the lazy one ([`replica_sets`]) or the one kept between calls ([`ReplicaSetCache`]).
/// Both read core's rank of the pool's members, so both choose the same pods.
fn assign<'f, R: PoolRanking>(
    demands: &[AdapterDemand<'_>],
    fleet: &'f PodIndex<'_, '_>,
    pools: &TierPools,
    min_replicas: usize,
    previous: &BTreeMap<String, Vec<String>>,
    mut ranking: impl FnMut(&AdapterDemand<'_>, &'f Pool) -> R,
) -> BTreeMap<String, Vec<String>> {
    let in_gold_pool = |tier: Tier| in_gold_pool(pools, tier);
    let DemandOrder {
        order,
        gold_total,
        other_total,
        fleet_bound,
    } = demand_order(demands, pools, fleet.pods.len());
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for gold_side in [true, false] {
        let members: Vec<&AdapterDemand<'_>> = order
            .iter()
            .copied()
            .filter(|d| in_gold_pool(d.tier) == gold_side)
            .collect();
        let Some(first) = members.first() else {
            continue;
        };
        let pool = fleet.pool(first.tier);
        let slots: usize = pool.members.iter().map(|&p| fleet.slots(p)).sum();
        let total = if gold_side { gold_total } else { other_total };
        counts.extend(fit_slots(
            &members,
            total,
            pool.members.len(),
            slots,
            min_replicas,
        ));
    }
    let mut load = SlotLoad::new(fleet);
    let mut picked = vec![false; fleet.pods.len()];
    let mut sets = BTreeMap::new();
    for d in order {
        let pool = fleet.pool(d.tier);
        // The other tiers may take the gold pool's free slots (never beyond them).
        let spill = (!pools.is_one_pool() && d.tier != Tier::Gold).then_some(&fleet.gold);
        let total = if in_gold_pool(d.tier) {
            gold_total
        } else {
            other_total
        };
        let count = counts.get(d.name).copied().unwrap_or(1);
        // Each replica takes an equal part of the adapter's demand; a pod stays within
        // `LOAD_BOUND` × its pool's mean (a gold pod taking a spilled adapter: the fleet's).
        let part = if count > 0 {
            d.rate.max(0.0) / count as f64
        } else {
            0.0
        };
        let bound = LOAD_BOUND * total / pool.members.len().max(1) as f64;
        let has_slot = |p: usize| load.has_slot(p);
        let within = |p: usize| load.assigned(p) + part <= bound;
        let spill_fits = |p: usize| has_slot(p) && load.assigned(p) + part <= fleet_bound;
        let kept: Vec<usize> = previous
            .get(d.name)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|id| fleet.index(id))
            .collect();
        let mut chosen = Chosen {
            pods: Vec::with_capacity(count),
            picked: &mut picked,
            count,
        };
        let mut ranked = ranking(d, pool);
        let mut spilled = spill.map(|gold| ranking(d, gold));
        // The preferences, best first (module doc); each walks a ranking in order.
        ranked.take_among(&kept, &|p| has_slot(p) && within(p), &mut chosen);
        if let Some(spilled) = spilled.as_mut() {
            spilled.take_among(&kept, &spill_fits, &mut chosen);
        }
        ranked.take_free(&load, &|p| has_slot(p) && within(p), &mut chosen);
        if let Some(spilled) = spilled.as_mut() {
            spilled.take_free(&load, &spill_fits, &mut chosen);
        }
        ranked.take_within(&within, &mut chosen);
        ranked.walk(&|_| true, &mut chosen);
        let chosen = chosen.into_pods();
        for &p in &chosen {
            load.assign(p, part);
        }
        sets.insert(
            d.name.to_string(),
            chosen
                .into_iter()
                .map(|p| fleet.id(p).to_string())
                .collect(),
        );
    }
    sets
}

/// An adapter's ranking of one pool as the passes read it: core's rank of the pool's members by
/// the adapter's chain seed, whatever it is made of (module doc, "Cost"). Each method takes,
/// in ranking order, the pool's pods that `eligible` admits (and `chosen` has not taken) until
/// the set is full; they differ only in where the eligible pods may be, so an implementation
/// may look for them where it is cheapest.
trait PoolRanking {
    /// The eligible pods among `among`.
    fn take_among(&self, among: &[usize], eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen);
    /// The eligible pods, every one of which has a free slot in `load`.
    fn take_free(&mut self, load: &SlotLoad, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen);
    /// The eligible pods of the pool (when few are, walking to them would read most of it).
    fn take_within(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen);
    /// The eligible pods along the whole ranking.
    fn walk(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen);
}

/// Each of `members`' replica count in a pool of `pool_size` pods with `slots` GPU slots in
/// all and `total` demand, shrunk to fit the slots (module doc); `members` hottest first.
fn fit_slots<'a>(
    members: &[&AdapterDemand<'a>],
    total: f64,
    pool_size: usize,
    slots: usize,
    min_replicas: usize,
) -> Vec<(&'a str, usize)> {
    // gold's second replica only while the slots hold every adapter's floor with it (module doc)
    let floors_with_failover: usize = members
        .iter()
        .map(|d| replica_count(0.0, tier_floor(d.tier, true), pool_size, min_replicas))
        .sum();
    let failover = floors_with_failover <= slots;
    let mut counts: Vec<(&'a str, usize, usize)> = members
        .iter()
        .map(|d| {
            let share = if total > 0.0 { d.rate / total } else { 0.0 };
            let floor = tier_floor(d.tier, failover);
            let wanted = replica_count(share, floor, pool_size, min_replicas);
            let by_load = replica_count(share / LOAD_BOUND, floor, pool_size, min_replicas);
            (d.name, wanted, by_load)
        })
        .collect();
    let mut sum: usize = counts.iter().map(|c| c.1).sum();
    while sum > slots {
        // the largest count above its floor; among equals the last, the coldest
        let Some(c) = counts.iter_mut().filter(|c| c.1 > c.2).max_by_key(|c| c.1) else {
            break;
        };
        c.1 -= 1;
        sum -= 1;
    }
    counts.into_iter().map(|(n, c, _)| (n, c)).collect()
}

/// The pods by index: ids, slots, and each tier pool's members in the pods' order.
struct PodIndex<'p, 'a> {
    pods: &'p [SlotCandidate<'a>],
    by_id: HashMap<&'a str, usize>,
    gold: Pool,
    other: Pool,
}

/// A tier pool: its members (pod indices, in the pods' order) and each pod's position in it.
struct Pool {
    members: Vec<usize>,
    position: Vec<Option<usize>>,
}

impl Pool {
    fn new(pods: &[SlotCandidate<'_>], admits: impl Fn(&str) -> bool) -> Self {
        let mut position = vec![None; pods.len()];
        let mut members = Vec::new();
        for (p, pod) in pods.iter().enumerate() {
            if admits(pod.candidate.id) {
                if let Some(at) = position.get_mut(p) {
                    *at = Some(members.len());
                }
                members.push(p);
            }
        }
        Self { members, position }
    }

    fn position(&self, pod: usize) -> Option<usize> {
        self.position.get(pod).copied().flatten()
    }
}

impl<'p, 'a> PodIndex<'p, 'a> {
    fn new(pods: &'p [SlotCandidate<'a>], pools: &TierPools) -> Self {
        Self {
            pods,
            by_id: pods
                .iter()
                .enumerate()
                .map(|(p, c)| (c.candidate.id, p))
                .collect(),
            gold: Pool::new(pods, |id| pools.admits(Tier::Gold, id)),
            other: Pool::new(pods, |id| pools.admits(Tier::Bronze, id)),
        }
    }

    /// `tier`'s pool (every non-gold tier shares one).
    fn pool(&self, tier: Tier) -> &Pool {
        if tier == Tier::Gold {
            &self.gold
        } else {
            &self.other
        }
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    fn id(&self, pod: usize) -> &'a str {
        self.pods.get(pod).map_or("", |c| c.candidate.id)
    }

    fn slots(&self, pod: usize) -> usize {
        self.pods.get(pod).map_or(0, |c| c.slots)
    }

    fn candidate(&self, pod: usize) -> Option<&PlacementCandidate<'a>> {
        self.pods.get(pod).map(|c| &c.candidate)
    }
}

/// Each pod's free GPU slots and assigned demand as the assignment goes, and the pods with a
/// free slot (so a pass that needs one reads only them once they are few).
struct SlotLoad {
    free: Vec<usize>,
    assigned: Vec<f64>,
    with_free: BTreeSet<usize>,
}

impl SlotLoad {
    fn new(fleet: &PodIndex<'_, '_>) -> Self {
        let free: Vec<usize> = (0..fleet.pods.len()).map(|p| fleet.slots(p)).collect();
        let with_free = (0..free.len())
            .filter(|&p| free.get(p).is_some_and(|&f| f > 0))
            .collect();
        Self {
            assigned: vec![0.0; free.len()],
            free,
            with_free,
        }
    }

    fn has_slot(&self, pod: usize) -> bool {
        self.free.get(pod).is_some_and(|&f| f > 0)
    }

    fn assigned(&self, pod: usize) -> f64 {
        self.assigned.get(pod).copied().unwrap_or(0.0)
    }

    /// The members of `pool` with a free slot (in the pods' order).
    fn free_pods(&self, pool: &Pool) -> Vec<usize> {
        self.with_free
            .iter()
            .copied()
            .filter(|&p| pool.position(p).is_some())
            .collect()
    }

    fn assign(&mut self, pod: usize, part: f64) {
        if let Some(f) = self.free.get_mut(pod) {
            *f = f.saturating_sub(1);
            if *f == 0 {
                self.with_free.remove(&pod);
            }
        }
        if let Some(a) = self.assigned.get_mut(pod) {
            *a += part;
        }
    }
}

/// When at most this many pods with a free slot are eligible, a pass that needs one sorts them
/// alone instead of walking the ranking to find them.
const FEW: usize = 64;

/// An adapter's replicas as the passes choose them, and which pods are taken.
struct Chosen<'m> {
    pods: Vec<usize>,
    picked: &'m mut Vec<bool>,
    count: usize,
}

impl Chosen<'_> {
    fn full(&self) -> bool {
        self.pods.len() >= self.count
    }

    /// Takes `pod` if it is not taken yet and the set is not full.
    fn take(&mut self, pod: usize) {
        if self.full() {
            return;
        }
        if let Some(seen) = self.picked.get_mut(pod) {
            if !*seen {
                *seen = true;
                self.pods.push(pod);
            }
        }
    }

    /// The chosen pods, best first; clears the marks for the next adapter.
    fn into_pods(self) -> Vec<usize> {
        for &p in &self.pods {
            if let Some(seen) = self.picked.get_mut(p) {
                *seen = false;
            }
        }
        self.pods
    }
}

/// First pods a ranking sorts; it doubles what it has sorted when a pass reads past it.
const FIRST_SORTED: usize = 16;

/// One adapter's rendezvous ranking of one pool, sorted lazily: every member is scored (core's
/// [`score`] over the adapter's chain seed) when it is made, and only the prefix a pass reads is
/// in order, the rest unordered behind it (module doc, "Cost").
struct Ranking<'f, 'p, 'a> {
    fleet: &'f PodIndex<'p, 'a>,
    pool: &'f Pool,
    /// Each pool member's score, by position in the pool.
    scores: Vec<f64>,
    /// Pool positions of the members that can win: `order[..sorted]` best first, then the rest.
    order: Vec<usize>,
    sorted: usize,
}

impl PoolRanking for Ranking<'_, '_, '_> {
    fn take_among(&self, among: &[usize], eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        Ranking::take_among(self, among, eligible, chosen);
    }

    fn take_free(
        &mut self,
        load: &SlotLoad,
        eligible: &dyn Fn(usize) -> bool,
        chosen: &mut Chosen,
    ) {
        if chosen.full() {
            return;
        }
        let free = load.free_pods(self.pool);
        self.take_among_or_walk(&free, eligible, chosen);
    }

    fn take_within(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        let pool = self.pool;
        self.take_among_or_walk(&pool.members, eligible, chosen);
    }

    fn walk(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        Ranking::walk(self, eligible, chosen);
    }
}

impl<'f, 'p, 'a> Ranking<'f, 'p, 'a> {
    fn new(seed: u64, pool: &'f Pool, fleet: &'f PodIndex<'p, 'a>) -> Self {
        let scores: Vec<f64> = pool
            .members
            .iter()
            .map(|&p| {
                fleet
                    .candidate(p)
                    .map_or(f64::NEG_INFINITY, |c| score(seed, c))
            })
            .collect();
        // `rank` leaves out the candidates that can never win.
        let order = (0..scores.len())
            .filter(|&i| scores.get(i).is_some_and(|&s| s > f64::NEG_INFINITY))
            .collect();
        Self {
            fleet,
            pool,
            scores,
            order,
            sorted: 0,
        }
    }

    /// `rank`'s order: higher score first, then the id, then the position in the pool (its sort
    /// is stable) — a total order, so any sort of any subset agrees with it.
    fn better(&self, a: usize, b: usize) -> Ordering {
        let score = |i: usize| self.scores.get(i).copied().unwrap_or(f64::NEG_INFINITY);
        let id = |i: usize| self.pool.members.get(i).map_or("", |&p| self.fleet.id(p));
        score(b)
            .total_cmp(&score(a))
            .then_with(|| id(a).cmp(id(b)))
            .then(a.cmp(&b))
    }

    /// The pod at `rank` in the ranking, sorting more of it first if needed: the next best of
    /// the unsorted rest by partial selection, then those alone sorted.
    fn at(&mut self, rank: usize) -> Option<usize> {
        if rank >= self.order.len() {
            return None;
        }
        if rank >= self.sorted {
            let want = (rank + 1)
                .max(self.sorted * 2)
                .max(FIRST_SORTED)
                .min(self.order.len());
            let mut rest = std::mem::take(&mut self.order);
            if let Some(unsorted) = rest.get_mut(self.sorted..) {
                let next = want - self.sorted;
                if next < unsorted.len() {
                    unsorted.select_nth_unstable_by(next - 1, |&a, &b| self.better(a, b));
                }
                if let Some(head) = unsorted.get_mut(..next) {
                    head.sort_unstable_by(|&a, &b| self.better(a, b));
                }
            }
            self.order = rest;
            self.sorted = want;
        }
        self.order
            .get(rank)
            .and_then(|&i| self.pool.members.get(i))
            .copied()
    }

    /// Takes, in ranking order, the `eligible` pods of the ranking that `among` lists: the same
    /// pods, in the same order, as walking the whole ranking and testing each.
    fn take_among(&self, among: &[usize], eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        if chosen.full() {
            return;
        }
        let mut positions: Vec<usize> = among
            .iter()
            .filter(|&&p| eligible(p))
            .filter_map(|&p| self.pool.position(p))
            .filter(|&i| self.scores.get(i).is_some_and(|&s| s > f64::NEG_INFINITY))
            .collect();
        positions.sort_unstable_by(|&a, &b| self.better(a, b));
        positions.dedup();
        for i in positions {
            if let Some(&p) = self.pool.members.get(i) {
                chosen.take(p);
            }
        }
    }

    /// A pass whose eligible pods are all in `among` (the pool's pods with a free slot, or the
    /// pool): when few of them are eligible, among those alone; else along the ranking. Pods
    /// left with free slots are often the ones over the bound, so walking to find that none is
    /// eligible would sort the whole ranking.
    fn take_among_or_walk(
        &mut self,
        among: &[usize],
        eligible: &dyn Fn(usize) -> bool,
        chosen: &mut Chosen,
    ) {
        if chosen.full() {
            return;
        }
        let fits: Vec<usize> = among.iter().copied().filter(|&p| eligible(p)).collect();
        if fits.len() <= FEW {
            self.take_among(&fits, eligible, chosen);
        } else {
            self.walk(eligible, chosen);
        }
    }

    /// Takes the `eligible` pods along the ranking, best first, until the set is full.
    fn walk(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        let mut rank = 0;
        while !chosen.full() {
            let Some(p) = self.at(rank) else {
                break;
            };
            if eligible(p) {
                chosen.take(p);
            }
            rank += 1;
        }
    }
}

#[cfg(test)]
mod equivalence;

#[cfg(test)]
mod tests;
