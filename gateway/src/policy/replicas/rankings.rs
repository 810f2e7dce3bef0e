//! Every adapter's rendezvous ranking of the fleet's pods, kept between calls and updated by what
//! changed: a pod that joins is scored once per adapter and inserted at its place, a pod that
//! leaves is removed, an adapter that appears is ranked from scratch, one that is gone is
//! dropped.
//!
//! One ranking an adapter, of every pod (both tier pools): an adapter's ranking of a pool is its
//! ranking of the fleet with the other pool's pods skipped. Core's rank orders by score
//! descending, then id (its sort is stable, but ids are unique here), a total order on the pods,
//! so the pods of any subset come in the subset's own ranking order: a pod moving between the
//! pools changes no ranking.

use std::collections::{HashMap, HashSet};

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::placement::score;
use prewarm_core::PlacementCandidate;

use super::SlotCandidate;

/// A pod's place in no ranking: a pod that never wins (non-positive or non-finite weight), or a
/// free slot.
pub(super) const UNRANKED: u32 = u32::MAX;

/// A pod as the rankings know it: its id and weight (what its score is drawn from).
#[derive(Debug, Clone)]
struct RankedPod {
    id: String,
    weight: f64,
}

impl RankedPod {
    fn candidate(&self) -> PlacementCandidate<'_> {
        PlacementCandidate::new(&self.id, self.weight)
    }

    /// The same pod with the same score for every key: the same id and weight, bit for bit.
    fn is(&self, pod: &PlacementCandidate<'_>) -> bool {
        self.id == pod.id && self.weight.to_bits() == pod.weight.to_bits()
    }
}

/// One adapter's ranking of the pods, by slot (see [`FleetRankings`]).
#[derive(Debug, Clone)]
pub(super) struct AdapterRanking {
    seed: u64,
    /// The slots of the pods that can win, best first.
    order: Vec<u32>,
    /// Each slot's index in `order` ([`UNRANKED`] when it has none).
    rank_of: Vec<u32>,
}

impl AdapterRanking {
    /// The slots of the pods that can win, best first.
    pub(super) fn order(&self) -> &[u32] {
        &self.order
    }

    /// `slot`'s index in the ranking, when it has one.
    pub(super) fn rank_of(&self, slot: u32) -> Option<u32> {
        self.rank_of
            .get(slot as usize)
            .copied()
            .filter(|&r| r != UNRANKED)
    }

    /// Sets `rank_of` for `order[from..]`.
    fn index_from(&mut self, from: usize) {
        for (r, &s) in self.order.iter().enumerate().skip(from) {
            if let Some(at) = self.rank_of.get_mut(s as usize) {
                *at = u32::try_from(r).unwrap_or(UNRANKED);
            }
        }
    }
}

/// The fleet's pods in slots and every known adapter's ranking of them. Invariant: for every
/// adapter `A` held, `order` lists exactly the slots of the pods held whose score for `A`'s
/// chain seed can win (> −∞), in core's `rank` order (score descending, then id), so the cached
/// ranking of `A` over a pool `P` (the order with the pods outside `P` skipped) is exactly
/// core's `rank` of `P`'s members by `A`'s seed; `rank_of[s]` is slot `s`'s index in `order`
/// ([`UNRANKED`] when it has none), and every `rank_of` is as long as `pods`. Pod ids are
/// unique.
#[derive(Clone, Default)]
pub(super) struct FleetRankings {
    /// The pods by slot (`None`: a free slot, reused by the next pod to join).
    pods: Vec<Option<RankedPod>>,
    by_id: HashMap<String, u32>,
    free: Vec<u32>,
    adapters: HashMap<String, AdapterRanking>,
}

impl std::fmt::Debug for FleetRankings {
    /// A summary: the rankings are megabytes of slot numbers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetRankings")
            .field("pods", &self.by_id.len())
            .field("adapters", &self.adapters.len())
            .field("ranking_bytes", &self.ranking_bytes())
            .finish()
    }
}

/// What [`FleetRankings::sync_pods`] found: each given pod's slot, each slot's pod.
pub(super) struct Slots {
    /// Each given pod's slot, by its index among the pods given.
    pub(super) slot_of: Vec<u32>,
    /// Each slot's pod's index among the pods given ([`UNRANKED`] for a free slot).
    pub(super) pod_of: Vec<u32>,
}

impl FleetRankings {
    /// `adapter`'s ranking, when it is held.
    pub(super) fn get(&self, adapter: &str) -> Option<&AdapterRanking> {
        self.adapters.get(adapter)
    }

    /// Adapters held.
    pub(super) fn adapters(&self) -> usize {
        self.adapters.len()
    }

    /// Bytes the rankings hold (their arrays' capacity; ids and map overhead left out).
    pub(super) fn ranking_bytes(&self) -> usize {
        self.adapters
            .values()
            .map(|a| (a.order.capacity() + a.rank_of.capacity()) * std::mem::size_of::<u32>())
            .sum()
    }

    /// Makes the held pods `pods` (ids unique, else `None` and nothing changes): a pod that
    /// left, or whose weight changed, leaves every ranking; a pod that joined is scored once per
    /// adapter and inserted at its place (or, when many join at once, each ranking is made
    /// again). Returns the slots.
    pub(super) fn sync_pods(&mut self, pods: &[SlotCandidate<'_>]) -> Option<Slots> {
        let mut given: HashMap<&str, usize> = HashMap::with_capacity(pods.len());
        for (i, p) in pods.iter().enumerate() {
            if given.insert(p.candidate.id, i).is_some() {
                return None;
            }
        }
        let leaving: Vec<u32> = self
            .pods
            .iter()
            .enumerate()
            .filter_map(|(s, held)| {
                let held = held.as_ref()?;
                let stays = given
                    .get(held.id.as_str())
                    .and_then(|&i| pods.get(i))
                    .is_some_and(|p| held.is(&p.candidate));
                (!stays).then_some(u32::try_from(s).ok()?)
            })
            .collect();
        self.leave(&leaving);
        let joining: Vec<usize> = pods
            .iter()
            .enumerate()
            .filter(|(_, p)| !self.by_id.contains_key(p.candidate.id))
            .map(|(i, _)| i)
            .collect();
        let mut joined = Vec::with_capacity(joining.len());
        for i in joining {
            if let Some(p) = pods.get(i) {
                joined.push(self.hold(&p.candidate));
            }
        }
        self.join(&joined);
        let mut pod_of = vec![UNRANKED; self.pods.len()];
        let mut slot_of = Vec::with_capacity(pods.len());
        for (i, p) in pods.iter().enumerate() {
            let slot = self.by_id.get(p.candidate.id).copied().unwrap_or(UNRANKED);
            if let Some(at) = pod_of.get_mut(slot as usize) {
                *at = u32::try_from(i).unwrap_or(UNRANKED);
            }
            slot_of.push(slot);
        }
        Some(Slots { slot_of, pod_of })
    }

    /// Holds exactly the adapters `names` lists: ranks each new one from scratch, drops the
    /// others.
    pub(super) fn sync_adapters<'n>(&mut self, names: impl Iterator<Item = &'n str>) {
        let mut listed: HashSet<&str> = HashSet::new();
        for name in names {
            if !self.adapters.contains_key(name) {
                let ranking = self.ranked(chain_seed(name));
                self.adapters.insert(name.to_string(), ranking);
            }
            listed.insert(name);
        }
        if self.adapters.len() > listed.len() {
            self.adapters
                .retain(|name, _| listed.contains(name.as_str()));
        }
    }

    /// `adapter`'s kept ranking as pod ids, best first (for the tests of the invariant).
    #[cfg(test)]
    pub(super) fn ranked_ids(&self, adapter: &str) -> Option<Vec<&str>> {
        let ranking = self.adapters.get(adapter)?;
        let ids = ranking
            .order
            .iter()
            .filter_map(|&s| self.pods.get(s as usize)?.as_ref().map(|p| p.id.as_str()))
            .collect();
        Some(ids)
    }

    /// Whether every `rank_of` is as long as the slots and the inverse of its `order`.
    #[cfg(test)]
    pub(super) fn rank_of_is_the_inverse(&self) -> bool {
        self.adapters.values().all(|a| {
            a.rank_of.len() == self.pods.len()
                && a.order
                    .iter()
                    .enumerate()
                    .all(|(r, &s)| a.rank_of(s) == u32::try_from(r).ok())
                && a.rank_of.iter().filter(|&&r| r != UNRANKED).count() == a.order.len()
        })
    }

    /// A slot for `pod` (a free one, or a new one: every ranking's `rank_of` grows with it).
    fn hold(&mut self, pod: &PlacementCandidate<'_>) -> u32 {
        let held = RankedPod {
            id: pod.id.to_string(),
            weight: pod.weight,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                if let Some(at) = self.pods.get_mut(slot as usize) {
                    *at = Some(held);
                }
                slot
            }
            None => {
                let slot = u32::try_from(self.pods.len()).unwrap_or(UNRANKED);
                self.pods.push(Some(held));
                for a in self.adapters.values_mut() {
                    a.rank_of.push(UNRANKED);
                }
                slot
            }
        };
        self.by_id.insert(pod.id.to_string(), slot);
        slot
    }

    /// Removes the pods in `slots` from the pods held and every ranking.
    fn leave(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        for &s in slots {
            if let Some(held) = self.pods.get_mut(s as usize).and_then(Option::take) {
                self.by_id.remove(&held.id);
                self.free.push(s);
            }
        }
        for a in self.adapters.values_mut() {
            let Some(first) = slots.iter().filter_map(|&s| a.rank_of(s)).min() else {
                continue;
            };
            for &s in slots {
                if let Some(at) = a.rank_of.get_mut(s as usize) {
                    *at = UNRANKED;
                }
            }
            let first = first as usize;
            let rank_of = &a.rank_of;
            let mut rest = a.order.split_off(first.min(a.order.len()));
            // the slots left are the ones still ranked (`rank_of` was cleared for the leavers)
            rest.retain(|&s| rank_of.get(s as usize).is_some_and(|&r| r != UNRANKED));
            a.order.append(&mut rest);
            a.index_from(first);
        }
    }

    /// Inserts the pods in `slots` (held, in no ranking yet) into every ranking at their places.
    fn join(&mut self, slots: &[u32]) {
        if slots.is_empty() {
            return;
        }
        let pods = &self.pods;
        let candidate = |s: u32| -> Option<PlacementCandidate<'_>> {
            pods.get(s as usize)
                .and_then(Option::as_ref)
                .map(RankedPod::candidate)
        };
        let held = pods.iter().filter(|p| p.is_some()).count();
        // Inserting costs about log2(n) scores and a move of the ranking's tail each; past
        // about n / log2(n) pods at once, ranking again costs less.
        let log = (usize::BITS - held.leading_zeros()) as usize + 1;
        let again = slots.len().saturating_mul(log) >= held;
        for a in self.adapters.values_mut() {
            if again {
                *a = ranked_over(pods, a.seed);
                continue;
            }
            let mut first = a.order.len();
            for &s in slots {
                let Some(joiner) = candidate(s) else {
                    continue;
                };
                let own = score(a.seed, &joiner);
                if own == f64::NEG_INFINITY {
                    continue;
                }
                // the first place whose pod ranks after the joiner
                let at = a.order.partition_point(|&o| {
                    candidate(o).is_some_and(|c| {
                        score(a.seed, &c)
                            .total_cmp(&own)
                            .reverse()
                            .then_with(|| c.id.cmp(joiner.id))
                            .is_lt()
                    })
                });
                a.order.insert(at, s);
                first = first.min(at);
            }
            a.index_from(first);
        }
    }

    /// A ranking of the pods held for `seed`, made from scratch.
    fn ranked(&self, seed: u64) -> AdapterRanking {
        ranked_over(&self.pods, seed)
    }
}

/// `seed`'s ranking of `pods` from scratch: every pod scored, sorted as core's `rank` sorts.
fn ranked_over(pods: &[Option<RankedPod>], seed: u64) -> AdapterRanking {
    let mut scored: Vec<(f64, &str, u32)> = pods
        .iter()
        .enumerate()
        .filter_map(|(s, p)| {
            let p = p.as_ref()?;
            let own = score(seed, &p.candidate());
            let slot = u32::try_from(s).ok()?;
            (own > f64::NEG_INFINITY).then_some((own, p.id.as_str(), slot))
        })
        .collect();
    scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut ranking = AdapterRanking {
        seed,
        order: scored.into_iter().map(|(_, _, s)| s).collect(),
        rank_of: vec![UNRANKED; pods.len()],
    };
    ranking.index_from(0);
    ranking
}
