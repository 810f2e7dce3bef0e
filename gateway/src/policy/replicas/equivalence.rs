//! Property tests: the lazy ranking chooses what the full ranking chose
//! ([`super::replica_sets_by_full_ranking`], the previous computation, kept as the oracle), on
//! random fleets, pools, demands and previous sets, and along a fleet's life (a pod joins, one
//! leaves, demand shifts, each from the sets before).

use std::collections::BTreeMap;

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::{rank, PlacementCandidate};
use proptest::prelude::*;

use super::*;

/// A fleet as the tests draw it: pods (weight, slots), adapters (tier, rate), the gold pool's
/// size (0: one pool), the minimum replica count, and which pods each adapter held before.
#[derive(Debug, Clone)]
struct Case {
    pods: Vec<(f64, usize)>,
    adapters: Vec<(u8, f64)>,
    gold_pool: usize,
    min_replicas: usize,
    previous: Vec<Vec<usize>>,
}

fn tier(t: u8) -> Tier {
    match t {
        0 => Tier::Gold,
        1 => Tier::Silver,
        _ => Tier::Bronze,
    }
}

/// Pods `0..pods` (some weightless, so they never win) and adapters; at sizes that pass both
/// the ranking's first sorted prefix and the few-free-pods cut-off.
fn cases(max_pods: usize, max_adapters: usize) -> impl Strategy<Value = Case> {
    (1..=max_pods, 0..=max_adapters)
        .prop_flat_map(|(n, a)| {
            (
                proptest::collection::vec(
                    (
                        prop::sample::select(vec![0.0, 0.5, 1.0, 1.0, 1.0, 2.0]),
                        0usize..5,
                    ),
                    n,
                ),
                proptest::collection::vec(
                    (
                        0u8..3,
                        prop::sample::select(vec![0.0, 0.5, 1.0, 3.0, 10.0, 100.0, 1e4]),
                    ),
                    a,
                ),
                0..=n,
                1usize..4,
                proptest::collection::vec(proptest::collection::vec(0..n + 2, 0..4), a),
            )
        })
        .prop_map(|(pods, adapters, gold_pool, min_replicas, previous)| Case {
            pods,
            adapters,
            gold_pool,
            min_replicas,
            previous,
        })
}

/// Both computations' sets for `case`, with `previous` as the sets before.
fn both(
    case: &Case,
    previous: &BTreeMap<String, Vec<String>>,
) -> (BTreeMap<String, Vec<String>>, BTreeMap<String, Vec<String>>) {
    let ids: Vec<String> = (0..case.pods.len()).map(|i| format!("pod-{i}")).collect();
    let pods: Vec<SlotCandidate<'_>> = ids
        .iter()
        .zip(&case.pods)
        .map(|(id, &(weight, slots))| SlotCandidate {
            candidate: PlacementCandidate::new(id, weight),
            slots,
        })
        .collect();
    let candidates: Vec<PlacementCandidate<'_>> = pods.iter().map(|p| p.candidate).collect();
    let pools = if case.gold_pool == 0 {
        TierPools::default()
    } else {
        TierPools::of_size(case.gold_pool, &candidates)
    };
    let names: Vec<String> = (0..case.adapters.len())
        .map(|i| format!("adapter-{i}"))
        .collect();
    let demands: Vec<AdapterDemand<'_>> = names
        .iter()
        .zip(&case.adapters)
        .map(|(name, &(t, rate))| AdapterDemand {
            name,
            tier: tier(t),
            rate,
        })
        .collect();
    (
        replica_sets(&demands, &pods, &pools, case.min_replicas, previous),
        replica_sets_by_full_ranking(&demands, &pods, &pools, case.min_replicas, previous),
    )
}

/// The case's own previous sets (ids past the pods: pods that left).
fn drawn_previous(case: &Case) -> BTreeMap<String, Vec<String>> {
    case.previous
        .iter()
        .enumerate()
        .map(|(a, pods)| {
            (
                format!("adapter-{a}"),
                pods.iter().map(|p| format!("pod-{p}")).collect(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_lazy_ranking_chooses_what_the_full_ranking_chooses(case in cases(24, 40)) {
        let (lazy, full) = both(&case, &BTreeMap::new());
        prop_assert_eq!(lazy, full);
        let previous = drawn_previous(&case);
        let (lazy, full) = both(&case, &previous);
        prop_assert_eq!(lazy, full);
    }

    #[test]
    fn a_join_a_leave_and_a_demand_shift_keep_the_full_rankings_sets(
        case in cases(24, 40),
        joiner in (prop::sample::select(vec![0.5, 1.0, 2.0]), 0usize..5),
        leaver in any::<prop::sample::Index>(),
        shifted in any::<prop::sample::Index>(),
    ) {
        let (before, full) = both(&case, &BTreeMap::new());
        prop_assert_eq!(&before, &full);
        let mut joined = case.clone();
        joined.pods.push(joiner);
        let (after_join, full) = both(&joined, &before);
        prop_assert_eq!(&after_join, &full, "a pod joins");
        // The last pod leaves (ids are positions, so the others keep theirs).
        let mut left = joined.clone();
        left.pods.truncate(leaver.index(joined.pods.len()).max(1));
        let (after_leave, full) = both(&left, &after_join);
        prop_assert_eq!(&after_leave, &full, "pods leave");
        let mut shift = left.clone();
        if !shift.adapters.is_empty() {
            let i = shifted.index(shift.adapters.len());
            if let Some(a) = shift.adapters.get_mut(i) {
                a.1 = a.1 * 10.0 + 1.0;
            }
        }
        let (after_shift, full) = both(&shift, &after_leave);
        prop_assert_eq!(after_shift, full, "demand shifts");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Past the first sorted prefix (16) and the few-free-pods cut-off (64).
    #[test]
    fn the_lazy_ranking_chooses_what_the_full_ranking_chooses_in_large_fleets(
        case in cases(160, 200),
    ) {
        let (lazy, full) = both(&case, &BTreeMap::new());
        prop_assert_eq!(&lazy, &full);
        let (lazy, full) = both(&case, &lazy);
        prop_assert_eq!(lazy, full);
    }

    #[test]
    fn a_ranking_read_to_its_end_is_cores_rank(
        weights in proptest::collection::vec(prop::sample::select(vec![0.0, 0.5, 1.0, 2.0]), 0..200),
        adapter in "[a-z]{1,8}",
    ) {
        let ids: Vec<String> = (0..weights.len()).map(|i| format!("pod-{i}")).collect();
        let pods: Vec<SlotCandidate<'_>> = ids
            .iter()
            .zip(&weights)
            .map(|(id, &w)| SlotCandidate { candidate: PlacementCandidate::new(id, w), slots: 1 })
            .collect();
        let candidates: Vec<PlacementCandidate<'_>> = pods.iter().map(|p| p.candidate).collect();
        let fleet = PodIndex::new(&pods, &TierPools::default());
        let mut ranking = Ranking::new(chain_seed(&adapter), &fleet.other, &fleet);
        let lazy: Vec<usize> = (0..).map_while(|r| ranking.at(r)).collect();
        prop_assert_eq!(lazy, rank(chain_seed(&adapter), &candidates));
    }
}
