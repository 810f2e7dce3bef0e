//! The replica sets in time proportional to what changed: [`ReplicaSetCache`] keeps every
//! adapter's ranking between calls ([`FleetRankings`]) and the last call's inputs and sets, and
//! chooses the sets by the same passes as [`super::replica_sets`] (module doc), reading the kept
//! rankings instead of scoring every pool member.

use std::collections::BTreeMap;

use prewarm_core::fingerprint::chain_seed;

use super::rankings::{AdapterRanking, FleetRankings, Slots, UNRANKED};
use super::{
    assign, replica_sets, AdapterDemand, Chosen, PodIndex, Pool, PoolRanking, Ranking,
    SlotCandidate, SlotLoad, FEW,
};
use crate::policy::{Tier, TierPools};

/// Pods of a ranking a pass reads before it lists the pods with a free slot instead: past it,
/// the eligible pods are likely few and far down the ranking.
const WALK: usize = 2 * FEW;

/// The replica sets kept between calls (the fleet's [`Placement`] holds one): every adapter's
/// rendezvous ranking of the pods, and the last call's inputs and sets. Invariant: the rankings
/// are those of the last call's pods and adapters ([`FleetRankings`]: an adapter's kept
/// ranking over a pool `P` is exactly core's `rank` of `P`'s members by its chain seed), and
/// `last`, when set, holds the inputs and the sets of the last call.
///
/// [`Placement`]: crate::policy::fleet::Placement
#[derive(Debug, Clone, Default)]
pub struct ReplicaSetCache {
    rankings: FleetRankings,
    last: Option<LastCall>,
}

/// A call's inputs, as compared with the next call's, and its sets.
#[derive(Debug, Clone)]
struct LastCall {
    /// Each demand's name, tier and rate (its bits: a rate that is not bit for bit the same is
    /// a change).
    demands: Vec<(String, Tier, u64)>,
    /// Each pod's id, weight (bits) and slots.
    pods: Vec<(String, u64, usize)>,
    pools: TierPools,
    min_replicas: usize,
    previous: BTreeMap<String, Vec<String>>,
    sets: BTreeMap<String, Vec<String>>,
}

impl LastCall {
    /// Whether these are the inputs of the call: element by element, so equal means equal (no
    /// hash that two different inputs could share).
    fn same(
        &self,
        demands: &[AdapterDemand<'_>],
        pods: &[SlotCandidate<'_>],
        pools: &TierPools,
        min_replicas: usize,
        previous: &BTreeMap<String, Vec<String>>,
    ) -> bool {
        self.min_replicas == min_replicas
            && self.demands.len() == demands.len()
            && self.pods.len() == pods.len()
            && self
                .demands
                .iter()
                .zip(demands)
                .all(|((name, tier, rate), d)| {
                    name == d.name && *tier == d.tier && *rate == d.rate.to_bits()
                })
            && self.pods.iter().zip(pods).all(|((id, weight, slots), p)| {
                id == p.candidate.id && *weight == p.candidate.weight.to_bits() && *slots == p.slots
            })
            && self.pools == *pools
            && self.previous == *previous
    }
}

impl ReplicaSetCache {
    /// [`super::replica_sets`] of the same inputs, bit for bit: the last call's sets when every
    /// input, `previous` included, equals the last call's; else the rankings updated by what
    /// changed (pods joined or left, adapters appeared or went) and the passes run over them.
    /// Pods whose ids are not unique (never the fleet's) are ranked afresh, as
    /// [`super::replica_sets`] does, and nothing is kept.
    pub fn replica_sets(
        &mut self,
        demands: &[AdapterDemand<'_>],
        pods: &[SlotCandidate<'_>],
        pools: &TierPools,
        min_replicas: usize,
        previous: &BTreeMap<String, Vec<String>>,
    ) -> &BTreeMap<String, Vec<String>> {
        let same = self
            .last
            .as_ref()
            .is_some_and(|l| l.same(demands, pods, pools, min_replicas, previous));
        if !same {
            let last = self.last.take();
            let sets =
                match self.rankings.sync_pods(pods) {
                    Some(slots) => {
                        self.rankings.sync_adapters(demands.iter().map(|d| d.name));
                        let fleet = PodIndex::new(pods, pools);
                        let rankings = &self.rankings;
                        assign(demands, &fleet, pools, min_replicas, previous, |d, pool| {
                            match rankings.get(d.name) {
                                Some(ranking) => KeptOrLazy::Kept(Kept {
                                    ranking,
                                    slots: &slots,
                                    pool,
                                }),
                                None => {
                                    KeptOrLazy::Lazy(Ranking::new(chain_seed(d.name), pool, &fleet))
                                }
                            }
                        })
                    }
                    None => replica_sets(demands, pods, pools, min_replicas, previous),
                };
            self.last = Some(LastCall {
                demands: demands
                    .iter()
                    .map(|d| (d.name.to_string(), d.tier, d.rate.to_bits()))
                    .collect(),
                pods: pods
                    .iter()
                    .map(|p| {
                        (
                            p.candidate.id.to_string(),
                            p.candidate.weight.to_bits(),
                            p.slots,
                        )
                    })
                    .collect(),
                pools: pools.clone(),
                min_replicas,
                // The fleet passes the last call's sets back: no copy of them then.
                previous: match last {
                    Some(last) if last.sets == *previous => last.sets,
                    _ => previous.clone(),
                },
                sets,
            });
        }
        static EMPTY: BTreeMap<String, Vec<String>> = BTreeMap::new();
        self.last.as_ref().map_or(&EMPTY, |l| &l.sets)
    }

    /// Bytes the kept rankings hold (their `u32` arrays) and the adapters they are for.
    pub fn ranking_bytes(&self) -> (usize, usize) {
        (self.rankings.ranking_bytes(), self.rankings.adapters())
    }
}

/// An adapter's kept ranking of the fleet, read as its ranking of one pool (the other pool's
/// pods skipped).
struct Kept<'c> {
    ranking: &'c AdapterRanking,
    slots: &'c Slots,
    pool: &'c Pool,
}

impl Kept<'_> {
    /// The pod (index among the pods given) in `slot`, when it is in the pool.
    fn pod_in(&self, slot: u32) -> Option<usize> {
        let pod = self.slots.pod_of.get(slot as usize).copied()?;
        let pod = (pod != UNRANKED).then_some(pod as usize)?;
        self.pool.position(pod).map(|_| pod)
    }

    /// `pod`'s rank, when it is in the pool and can win.
    fn rank(&self, pod: usize) -> Option<u32> {
        self.pool.position(pod)?;
        let slot = self.slots.slot_of.get(pod).copied()?;
        self.ranking.rank_of(slot)
    }

    /// Takes the eligible pods along the ranking until the set is full, the ranking ends or
    /// `budget` of its pods are read; whether it got to the end or the set is full.
    fn walk_for(
        &self,
        budget: usize,
        eligible: &dyn Fn(usize) -> bool,
        chosen: &mut Chosen,
    ) -> bool {
        let order = self.ranking.order();
        for &slot in order.iter().take(budget) {
            if chosen.full() {
                return true;
            }
            if let Some(p) = self.pod_in(slot).filter(|&p| eligible(p)) {
                chosen.take(p);
            }
        }
        chosen.full() || budget >= order.len()
    }
}

impl PoolRanking for Kept<'_> {
    /// The eligible pods of `among` sorted by their rank: looked up, not scored.
    fn take_among(&self, among: &[usize], eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        if chosen.full() {
            return;
        }
        let mut ranked: Vec<(u32, usize)> = among
            .iter()
            .filter(|&&p| eligible(p))
            .filter_map(|&p| Some((self.rank(p)?, p)))
            .collect();
        ranked.sort_unstable();
        ranked.dedup();
        for (_, p) in ranked {
            chosen.take(p);
        }
    }

    /// Every eligible pod has a free slot: when at most [`FEW`] pods have one, they alone,
    /// sorted by rank; else along the ranking, and when [`WALK`] of its pods did not fill the
    /// set, the rest among the pods with a free slot. Either way the eligible pods in ranking
    /// order, as a walk of the whole ranking takes them (those already taken are skipped).
    fn take_free(
        &mut self,
        load: &SlotLoad,
        eligible: &dyn Fn(usize) -> bool,
        chosen: &mut Chosen,
    ) {
        if chosen.full() {
            return;
        }
        if load.with_free.len() > FEW && self.walk_for(WALK, eligible, chosen) {
            return;
        }
        let free = load.free_pods(self.pool);
        self.take_among(&free, eligible, chosen);
    }

    /// Along the ranking: reading a kept ranking costs no scoring, so listing the pool's pods
    /// saves nothing.
    fn take_within(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        self.walk(eligible, chosen);
    }

    fn walk(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        self.walk_for(usize::MAX, eligible, chosen);
    }
}

/// A kept ranking, or (for an adapter the rankings do not hold, which `sync_adapters` rules
/// out) the lazy one.
enum KeptOrLazy<'c, 'f, 'p, 'a> {
    Kept(Kept<'c>),
    Lazy(Ranking<'f, 'p, 'a>),
}

impl PoolRanking for KeptOrLazy<'_, '_, '_, '_> {
    fn take_among(&self, among: &[usize], eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        match self {
            Self::Kept(k) => k.take_among(among, eligible, chosen),
            Self::Lazy(l) => PoolRanking::take_among(l, among, eligible, chosen),
        }
    }

    fn take_free(
        &mut self,
        load: &SlotLoad,
        eligible: &dyn Fn(usize) -> bool,
        chosen: &mut Chosen,
    ) {
        match self {
            Self::Kept(k) => k.take_free(load, eligible, chosen),
            Self::Lazy(l) => l.take_free(load, eligible, chosen),
        }
    }

    fn take_within(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        match self {
            Self::Kept(k) => k.take_within(eligible, chosen),
            Self::Lazy(l) => l.take_within(eligible, chosen),
        }
    }

    fn walk(&mut self, eligible: &dyn Fn(usize) -> bool, chosen: &mut Chosen) {
        match self {
            Self::Kept(k) => PoolRanking::walk(k, eligible, chosen),
            Self::Lazy(l) => PoolRanking::walk(l, eligible, chosen),
        }
    }
}

#[cfg(test)]
mod tests;
