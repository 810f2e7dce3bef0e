//! The replica sets by full ranking: every adapter sorts its whole pool by rendezvous and walks
//! the ranking once per preference. O(adapters × pods × log pods) a call. Kept, unchanged, as the
//! property tests' oracle for [`super::replica_sets`] and the benchmark's baseline; nothing in the
//! gateway calls it.

use std::collections::BTreeMap;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::{rank, PlacementCandidate};

use super::{
    demand_order, fit_slots, in_gold_pool, AdapterDemand, DemandOrder, SlotCandidate, LOAD_BOUND,
};
use crate::policy::{Tier, TierPools};

/// [`super::replica_sets`] as it was before the ranking became lazy: the same sets.
pub fn replica_sets_by_full_ranking(
    demands: &[AdapterDemand<'_>],
    pods: &[SlotCandidate<'_>],
    pools: &TierPools,
    min_replicas: usize,
    previous: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    let candidates: Vec<PlacementCandidate<'_>> = pods.iter().map(|p| p.candidate).collect();
    let pool_of = |tier: Tier| pools.candidates(tier, &candidates);
    let in_gold_pool = |tier: Tier| in_gold_pool(pools, tier);
    let DemandOrder {
        order,
        gold_total,
        other_total,
        fleet_bound,
    } = demand_order(demands, pools, pods.len());
    let mut free: BTreeMap<&str, usize> = pods.iter().map(|p| (p.candidate.id, p.slots)).collect();
    let mut assigned: BTreeMap<&str, f64> = BTreeMap::new();
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
        let pool = pool_of(first.tier);
        let slots: usize = pods
            .iter()
            .filter(|p| pool.iter().any(|c| c.id == p.candidate.id))
            .map(|p| p.slots)
            .sum();
        let total = if gold_side { gold_total } else { other_total };
        counts.extend(fit_slots(&members, total, pool.len(), slots, min_replicas));
    }
    let mut sets = BTreeMap::new();
    for d in order {
        let pool = pool_of(d.tier);
        // The other tiers may take the gold pool's free slots (never beyond them).
        let spill: Vec<PlacementCandidate<'_>> = if pools.is_one_pool() || d.tier == Tier::Gold {
            Vec::new()
        } else {
            pools.candidates(Tier::Gold, &candidates)
        };
        let total = if in_gold_pool(d.tier) {
            gold_total
        } else {
            other_total
        };
        let count = counts.get(d.name).copied().unwrap_or(1);
        let (ranked, spill) = (ranked_ids(d.name, &pool), ranked_ids(d.name, &spill));
        // Each replica takes an equal part of the adapter's demand; a pod stays within
        // `LOAD_BOUND` × its pool's mean (a gold pod taking a spilled adapter: the fleet's).
        let part = if count > 0 {
            d.rate.max(0.0) / count as f64
        } else {
            0.0
        };
        let bound = LOAD_BOUND * total / pool.len().max(1) as f64;
        let has_slot = |id: &str| free.get(id).is_some_and(|&f| f > 0);
        let load = |id: &str| assigned.get(id).copied().unwrap_or(0.0) + part;
        let within = |id: &str| load(id) <= bound;
        let spill_fits = |id: &str| has_slot(id) && load(id) <= fleet_bound;
        let kept = previous.get(d.name).map(Vec::as_slice).unwrap_or_default();
        let was_kept = |id: &str| kept.iter().any(|k| k == id);
        let mut chosen: Vec<&str> = Vec::with_capacity(count);
        let preferences: [Preference<'_, '_, '_>; 6] = [
            (&ranked, &|id| was_kept(id) && has_slot(id) && within(id)),
            (&spill, &|id| was_kept(id) && spill_fits(id)),
            (&ranked, &|id| has_slot(id) && within(id)),
            (&spill, &spill_fits),
            (&ranked, &within),
            (&ranked, &|_| true),
        ];
        for (among, eligible) in preferences {
            for id in among {
                if chosen.len() >= count {
                    break;
                }
                if !chosen.contains(id) && eligible(id) {
                    chosen.push(id);
                }
            }
        }
        for id in &chosen {
            if let Some(f) = free.get_mut(id) {
                *f = f.saturating_sub(1);
            }
            *assigned.entry(id).or_default() += part;
        }
        sets.insert(
            d.name.to_string(),
            chosen.into_iter().map(str::to_string).collect(),
        );
    }
    sets
}

/// Candidates in rank order, and which of them a pass of the assignment may take.
type Preference<'s, 'id, 'f> = (&'s [&'id str], &'f dyn Fn(&str) -> bool);

/// The ids of `among` in `adapter`'s rendezvous order.
fn ranked_ids<'a>(adapter: &str, among: &[PlacementCandidate<'a>]) -> Vec<&'a str> {
    rank(chain_seed(adapter), among)
        .into_iter()
        .filter_map(|i| among.get(i).map(|c| c.id))
        .collect()
}
