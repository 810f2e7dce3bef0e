//! Property tests: along random sequences of changes (pods join, leave, rejoin, change weight or
//! slots; the gold pool resizes; demand shifts; adapters appear, go or change tier; nothing
//! changes), the cached computation's sets are the full ranking's
//! ([`replica_sets_by_full_ranking`], the oracle) after every step, and every kept ranking is
//! core's rank of the pods.

use std::collections::BTreeMap;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::{rank, PlacementCandidate};
use proptest::prelude::*;

use super::ReplicaSetCache;
use crate::policy::replicas::{replica_sets_by_full_ranking, AdapterDemand, SlotCandidate};
use crate::policy::{Tier, TierPools};

type Sets = BTreeMap<String, Vec<String>>;

/// A fleet as the steps change it: pods (id number, weight, slots), adapters (name number,
/// tier, rate), the gold pool's size (0: one pool), the minimum replica count.
#[derive(Debug, Clone)]
struct World {
    pods: Vec<(usize, f64, usize)>,
    adapters: Vec<(usize, u8, f64)>,
    gold_pool: usize,
    min_replicas: usize,
    /// The next new pod's and adapter's number.
    next_pod: usize,
    next_adapter: usize,
    /// Pods that left, which may rejoin under their id.
    gone: Vec<usize>,
}

/// One change between two calls.
#[derive(Debug, Clone)]
enum Step {
    Join {
        at: prop::sample::Index,
        weight: f64,
        slots: usize,
    },
    Rejoin {
        which: prop::sample::Index,
        at: prop::sample::Index,
    },
    Leave(prop::sample::Index),
    Weight(prop::sample::Index, f64),
    Slots(prop::sample::Index, usize),
    GoldPool(usize),
    Shift(prop::sample::Index, f64),
    ShiftAll(f64),
    Appears(u8, f64),
    Goes(prop::sample::Index),
    TierChange(prop::sample::Index, u8),
    MinReplicas(usize),
    /// The caller forgets the sets before (an empty `previous`).
    Forget,
    Nothing,
}

const WEIGHTS: [f64; 6] = [0.0, 0.5, 1.0, 1.0, 1.0, 2.0];
const RATES: [f64; 7] = [0.0, 0.5, 1.0, 3.0, 10.0, 100.0, 1e4];

fn steps() -> impl Strategy<Value = Step> {
    let index = any::<prop::sample::Index>;
    let weight = || prop::sample::select(WEIGHTS.to_vec());
    let rate = || prop::sample::select(RATES.to_vec());
    prop_oneof![
        4 => (index(), weight(), 0usize..5).prop_map(|(at, weight, slots)| Step::Join { at, weight, slots }),
        2 => (index(), index()).prop_map(|(which, at)| Step::Rejoin { which, at }),
        4 => index().prop_map(Step::Leave),
        1 => (index(), weight()).prop_map(|(i, w)| Step::Weight(i, w)),
        2 => (index(), 0usize..5).prop_map(|(i, s)| Step::Slots(i, s)),
        2 => (0usize..6).prop_map(Step::GoldPool),
        4 => (index(), rate()).prop_map(|(i, r)| Step::Shift(i, r)),
        1 => rate().prop_map(Step::ShiftAll),
        2 => (0u8..3, rate()).prop_map(|(t, r)| Step::Appears(t, r)),
        2 => index().prop_map(Step::Goes),
        1 => (index(), 0u8..3).prop_map(|(i, t)| Step::TierChange(i, t)),
        1 => (1usize..4).prop_map(Step::MinReplicas),
        1 => Just(Step::Forget),
        3 => Just(Step::Nothing),
    ]
}

fn worlds(max_pods: usize, max_adapters: usize) -> impl Strategy<Value = World> {
    (
        proptest::collection::vec(
            (prop::sample::select(WEIGHTS.to_vec()), 0usize..5),
            1..=max_pods,
        ),
        proptest::collection::vec(
            (0u8..3, prop::sample::select(RATES.to_vec())),
            0..=max_adapters,
        ),
        0usize..6,
        1usize..4,
    )
        .prop_map(|(pods, adapters, gold_pool, min_replicas)| World {
            next_pod: pods.len(),
            next_adapter: adapters.len(),
            pods: pods
                .into_iter()
                .enumerate()
                .map(|(i, (w, s))| (i, w, s))
                .collect(),
            adapters: adapters
                .into_iter()
                .enumerate()
                .map(|(i, (t, r))| (i, t, r))
                .collect(),
            gold_pool,
            min_replicas,
            gone: Vec::new(),
        })
}

fn tier(t: u8) -> Tier {
    match t {
        0 => Tier::Gold,
        1 => Tier::Silver,
        _ => Tier::Bronze,
    }
}

impl World {
    /// Applies `step`; returns whether the caller forgets the sets before.
    fn apply(&mut self, step: &Step) -> bool {
        match step {
            Step::Join { at, weight, slots } => {
                let id = self.next_pod;
                self.next_pod += 1;
                let at = at.index(self.pods.len() + 1);
                self.pods.insert(at, (id, *weight, *slots));
            }
            Step::Rejoin { which, at } => {
                if !self.gone.is_empty() {
                    let id = self.gone.swap_remove(which.index(self.gone.len()));
                    let at = at.index(self.pods.len() + 1);
                    self.pods.insert(at, (id, 1.0, 2));
                }
            }
            Step::Leave(i) => {
                if self.pods.len() > 1 {
                    let (id, _, _) = self.pods.remove(i.index(self.pods.len()));
                    self.gone.push(id);
                }
            }
            Step::Weight(i, w) => {
                let n = self.pods.len();
                if let Some(p) = self.pods.get_mut(i.index(n)) {
                    p.1 = *w;
                }
            }
            Step::Slots(i, s) => {
                let n = self.pods.len();
                if let Some(p) = self.pods.get_mut(i.index(n)) {
                    p.2 = *s;
                }
            }
            Step::GoldPool(size) => self.gold_pool = *size,
            Step::Shift(i, r) => {
                let n = self.adapters.len();
                if n > 0 {
                    if let Some(a) = self.adapters.get_mut(i.index(n)) {
                        a.2 = *r;
                    }
                }
            }
            Step::ShiftAll(r) => {
                for (k, a) in self.adapters.iter_mut().enumerate() {
                    a.2 = r * (k % 3) as f64 + a.2 / 2.0;
                }
            }
            Step::Appears(t, r) => {
                let name = self.next_adapter;
                self.next_adapter += 1;
                self.adapters.push((name, *t, *r));
            }
            Step::Goes(i) => {
                if !self.adapters.is_empty() {
                    self.adapters.remove(i.index(self.adapters.len()));
                }
            }
            Step::TierChange(i, t) => {
                let n = self.adapters.len();
                if n > 0 {
                    if let Some(a) = self.adapters.get_mut(i.index(n)) {
                        a.1 = *t;
                    }
                }
            }
            Step::MinReplicas(m) => self.min_replicas = *m,
            Step::Forget => return true,
            Step::Nothing => {}
        }
        false
    }

    fn pod_ids(&self) -> Vec<String> {
        self.pods.iter().map(|p| format!("pod-{}", p.0)).collect()
    }

    fn adapter_names(&self) -> Vec<String> {
        self.adapters
            .iter()
            .map(|a| format!("adapter-{}", a.0))
            .collect()
    }

    /// The cached computation's sets (`cache`) and the oracle's, with `previous` as the sets
    /// before; and whether every ranking the cache keeps is core's rank of the pods.
    fn both(&self, cache: &mut ReplicaSetCache, previous: &Sets) -> (Sets, Sets, bool) {
        let ids = self.pod_ids();
        let names = self.adapter_names();
        let pods: Vec<SlotCandidate<'_>> = ids
            .iter()
            .zip(&self.pods)
            .map(|(id, &(_, weight, slots))| SlotCandidate {
                candidate: PlacementCandidate::new(id, weight),
                slots,
            })
            .collect();
        let candidates: Vec<PlacementCandidate<'_>> = pods.iter().map(|p| p.candidate).collect();
        let pools = if self.gold_pool == 0 {
            TierPools::default()
        } else {
            TierPools::of_size(self.gold_pool, &candidates)
        };
        let demands: Vec<AdapterDemand<'_>> = names
            .iter()
            .zip(&self.adapters)
            .map(|(name, &(_, t, rate))| AdapterDemand {
                name,
                tier: tier(t),
                rate,
            })
            .collect();
        let cached = cache
            .replica_sets(&demands, &pods, &pools, self.min_replicas, previous)
            .clone();
        let oracle =
            replica_sets_by_full_ranking(&demands, &pods, &pools, self.min_replicas, previous);
        let rankings_hold = names.iter().all(|name| {
            let core: Vec<&str> = rank(chain_seed(name), &candidates)
                .into_iter()
                .filter_map(|i| candidates.get(i).map(|c| c.id))
                .collect();
            cache.rankings.ranked_ids(name) == Some(core)
        }) && cache.rankings.adapters() == {
            let mut distinct = names.clone();
            distinct.sort();
            distinct.dedup();
            distinct.len()
        } && cache.rankings.rank_of_is_the_inverse();
        (cached, oracle, rankings_hold)
    }
}

/// Runs `steps` from `world`, the caller passing the last sets back as the fleet does.
fn run(mut world: World, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut cache = ReplicaSetCache::default();
    let (cached, oracle, held) = world.both(&mut cache, &Sets::new());
    prop_assert_eq!(&cached, &oracle, "from scratch");
    prop_assert!(held, "the kept rankings are core's, from scratch");
    let mut previous = cached;
    for (i, step) in steps.iter().enumerate() {
        if world.apply(step) {
            previous = Sets::new();
        }
        let (cached, oracle, held) = world.both(&mut cache, &previous);
        prop_assert_eq!(&cached, &oracle, "step {}: {:?}", i, step);
        prop_assert!(held, "step {}: {:?}: the kept rankings are core's", i, step);
        previous = cached;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_cached_sets_are_the_full_rankings_after_every_change(
        world in worlds(24, 30),
        steps in proptest::collection::vec(steps(), 1..24),
    ) {
        run(world, &steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Past the few-free-pods cut-off (64) and the walk before listing free pods (128).
    #[test]
    fn the_cached_sets_are_the_full_rankings_in_large_fleets(
        world in worlds(220, 160),
        steps in proptest::collection::vec(steps(), 1..10),
    ) {
        run(world, &steps)?;
    }
}

#[test]
fn nothing_changed_returns_the_last_sets_and_a_new_previous_recomputes() {
    let world = World {
        pods: (0..6).map(|i| (i, 1.0, 2)).collect(),
        adapters: (0..9).map(|i| (i, (i % 3) as u8, 1.0 + i as f64)).collect(),
        gold_pool: 2,
        min_replicas: 1,
        next_pod: 6,
        next_adapter: 9,
        gone: Vec::new(),
    };
    let mut cache = ReplicaSetCache::default();
    let (first, oracle, _) = world.both(&mut cache, &Sets::new());
    assert_eq!(first, oracle);
    // the same inputs, previous included: the same sets, from the cache
    let (again, _, _) = world.both(&mut cache, &Sets::new());
    assert_eq!(again, first);
    // a previous that differs is an input that changed: computed again, as the oracle does
    let mut moved = first.clone();
    if let Some(pods) = moved.values_mut().next() {
        pods.reverse();
        pods.push("pod-5".to_string());
    }
    let (cached, oracle, _) = world.both(&mut cache, &moved);
    assert_eq!(cached, oracle);
}

#[test]
fn duplicate_pod_ids_are_ranked_afresh() {
    let ids = ["a", "b", "a", "c"];
    let pods: Vec<SlotCandidate<'_>> = ids
        .iter()
        .map(|id| SlotCandidate {
            candidate: PlacementCandidate::new(id, 1.0),
            slots: 2,
        })
        .collect();
    let demands = [AdapterDemand {
        name: "x",
        tier: Tier::Bronze,
        rate: 1.0,
    }];
    let mut cache = ReplicaSetCache::default();
    let sets = cache
        .replica_sets(&demands, &pods, &TierPools::default(), 2, &Sets::new())
        .clone();
    let lazy = crate::policy::replicas::replica_sets(
        &demands,
        &pods,
        &TierPools::default(),
        2,
        &Sets::new(),
    );
    assert_eq!(sets, lazy);
    assert_eq!(cache.ranking_bytes().1, 0, "nothing kept");
}
