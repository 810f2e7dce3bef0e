use super::*;

fn pods(ids: &[&'static str], slots: usize) -> Vec<SlotCandidate<'static>> {
    ids.iter()
        .map(|id| SlotCandidate {
            candidate: PlacementCandidate::new(id, 1.0),
            slots,
        })
        .collect()
}

/// `names` as adapters of `tier`, each with demand `rate`.
fn demands_of<S: AsRef<str>>(names: &[S], tier: Tier, rate: f64) -> Vec<AdapterDemand<'_>> {
    names
        .iter()
        .map(|name| AdapterDemand {
            name: name.as_ref(),
            tier,
            rate,
        })
        .collect()
}

const EIGHT: [&str; 8] = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"];

#[test]
fn a_hot_adapter_gets_replicas_in_proportion_to_its_share() {
    let demands = [
        AdapterDemand {
            name: "hot",
            tier: Tier::Bronze,
            rate: 50.0,
        },
        AdapterDemand {
            name: "warm",
            tier: Tier::Bronze,
            rate: 25.0,
        },
        AdapterDemand {
            name: "cold",
            tier: Tier::Bronze,
            rate: 25.0,
        },
    ];
    let sets = replica_sets(
        &demands,
        &pods(&EIGHT, 4),
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    assert_eq!(sets["hot"].len(), 4);
    assert_eq!(sets["warm"].len(), 2);
    assert_eq!(sets["cold"].len(), 2);
}

#[test]
fn every_adapter_has_one_replica_and_gold_two() {
    let demands = [
        AdapterDemand {
            name: "idle",
            tier: Tier::Bronze,
            rate: 0.0,
        },
        AdapterDemand {
            name: "gold",
            tier: Tier::Gold,
            rate: 0.0,
        },
        AdapterDemand {
            name: "busy",
            tier: Tier::Silver,
            rate: 1e9,
        },
    ];
    let sets = replica_sets(
        &demands,
        &pods(&EIGHT, 4),
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    assert_eq!(sets["idle"].len(), 1);
    assert_eq!(sets["gold"].len(), 2);
    assert_eq!(sets["busy"].len(), 8);
    let one = replica_sets(
        &demands,
        &pods(&["p0"], 4),
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    assert_eq!(one["gold"], vec!["p0".to_string()]);
}

#[test]
fn gold_keeps_a_second_replica_only_while_the_slots_hold_one_of_every_gold_adapter() {
    // six gold adapters without measured demand (their floor decides) on eight pods of one
    // slot: two replicas each would be 12 slots of 8, and the gold replicas would evict each
    // other; one each leaves two slots spare
    let names: Vec<String> = (0..6).map(|i| format!("g{i}")).collect();
    let demands = demands_of(&names, Tier::Gold, 0.0);
    let sets = |slots| {
        replica_sets(
            &demands,
            &pods(&EIGHT, slots),
            &TierPools::default(),
            1,
            &BTreeMap::new(),
        )
    };
    let scarce = sets(1);
    assert!(
        names.iter().all(|n| scarce[n.as_str()].len() == 1),
        "{scarce:?}"
    );
    // two slots a pod: 16 slots hold 12, so each keeps its failover replica
    let room = sets(2);
    assert!(
        names.iter().all(|n| room[n.as_str()].len() == 2),
        "{room:?}"
    );
}

#[test]
fn no_pod_is_over_its_slots_while_another_has_room() {
    let names: Vec<String> = (0..24).map(|i| format!("a{i}")).collect();
    let demands: Vec<AdapterDemand<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| AdapterDemand {
            name: n,
            tier: Tier::Bronze,
            rate: 1.0 + i as f64,
        })
        .collect();
    let fleet = pods(&EIGHT, 4);
    let sets = replica_sets(&demands, &fleet, &TierPools::default(), 1, &BTreeMap::new());
    let mut held: BTreeMap<&str, usize> = BTreeMap::new();
    for pods in sets.values() {
        for p in pods {
            *held.entry(p.as_str()).or_default() += 1;
        }
    }
    let total: usize = held.values().sum();
    assert!(total <= 32, "{total} replicas");
    assert!(held.values().all(|&n| n <= 4), "{held:?}");
}

#[test]
fn the_hottest_adapters_get_slots_before_the_cold_tail() {
    // 3 pods × 1 slot; the hot adapter first, then the cold ones fill what is left.
    let demands = [
        AdapterDemand {
            name: "c1",
            tier: Tier::Bronze,
            rate: 1.0,
        },
        AdapterDemand {
            name: "c2",
            tier: Tier::Bronze,
            rate: 1.0,
        },
        AdapterDemand {
            name: "hot",
            tier: Tier::Bronze,
            rate: 8.0,
        },
        AdapterDemand {
            name: "c3",
            tier: Tier::Bronze,
            rate: 1.0,
        },
    ];
    let fleet = pods(&["x", "y", "z"], 1);
    let sets = replica_sets(&demands, &fleet, &TierPools::default(), 1, &BTreeMap::new());
    // ceil(3 × 8/11) = 3 wanted, 6 replicas in 3 slots: the hot set gives up one, keeping
    // the ceil(3 × 8/11 ÷ 1.25) = 2 the load bound needs; the cold ones share slots by LRU.
    assert_eq!(sets["hot"].len(), 2);
    for cold in ["c1", "c2", "c3"] {
        assert_eq!(sets[cold].len(), 1);
    }
}

#[test]
fn same_inputs_same_sets_and_a_join_moves_only_some() {
    let names: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let demands = demands_of(&names, Tier::Bronze, 1.0);
    let before = replica_sets(
        &demands,
        &pods(&EIGHT, 8),
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    assert_eq!(
        before,
        replica_sets(
            &demands,
            &pods(&EIGHT, 8),
            &TierPools::default(),
            1,
            &BTreeMap::new()
        )
    );
    let mut nine = EIGHT.to_vec();
    nine.push("p8");
    let after = replica_sets(
        &demands,
        &pods(&nine, 8),
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    let moved = names.iter().filter(|n| before[*n] != after[*n]).count();
    assert!(
        moved > 0 && moved < names.len() / 2,
        "{moved} of {} moved",
        names.len()
    );
}

#[test]
fn a_join_moves_fewer_sets_when_the_previous_ones_are_kept() {
    let names: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
    let demands: Vec<AdapterDemand<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| AdapterDemand {
            name: n,
            tier: Tier::Bronze,
            rate: 1.0 + (i % 7) as f64,
        })
        .collect();
    let none = BTreeMap::new();
    let before = replica_sets(&demands, &pods(&EIGHT, 4), &TierPools::default(), 1, &none);
    assert_eq!(
        before,
        replica_sets(
            &demands,
            &pods(&EIGHT, 4),
            &TierPools::default(),
            1,
            &before
        ),
        "nothing changed: nothing moves"
    );
    let mut nine = EIGHT.to_vec();
    nine.push("p8");
    let sticky = replica_sets(&demands, &pods(&nine, 4), &TierPools::default(), 1, &before);
    let fresh = replica_sets(&demands, &pods(&nine, 4), &TierPools::default(), 1, &none);
    let moved = |after: &BTreeMap<String, Vec<String>>| {
        names
            .iter()
            .map(|n| after[n].iter().filter(|p| !before[n].contains(p)).count())
            .sum::<usize>()
    };
    assert!(
        moved(&sticky) < moved(&fresh),
        "{} vs {}",
        moved(&sticky),
        moved(&fresh)
    );
    assert!(
        sticky.values().any(|p| p.iter().any(|id| id == "p8")),
        "the new pod takes some"
    );
}

#[test]
fn gold_adapters_stay_in_the_gold_pool() {
    let fleet = pods(&EIGHT, 4);
    let candidates: Vec<PlacementCandidate<'_>> = fleet.iter().map(|p| p.candidate).collect();
    let pools = TierPools::new(0.5, &candidates);
    let demands = [
        AdapterDemand {
            name: "g",
            tier: Tier::Gold,
            rate: 10.0,
        },
        AdapterDemand {
            name: "b",
            tier: Tier::Bronze,
            rate: 10.0,
        },
    ];
    let sets = replica_sets(&demands, &fleet, &pools, 1, &BTreeMap::new());
    assert!(sets["g"].iter().all(|p| pools.admits(Tier::Gold, p)));
    assert!(sets["b"].iter().all(|p| pools.admits(Tier::Bronze, p)));
    assert_eq!(sets["g"].len(), 4, "the whole gold pool: its only adapter");
}

/// 4 pods of 2 slots, a gold pool of 2; bronze adapters far hotter than gold ones and more
/// of them than the other pool's 4 slots.
fn spill_case(gold: &[&'static str]) -> (BTreeMap<String, Vec<String>>, TierPools) {
    let fleet = pods(&EIGHT[..4], 2);
    let candidates: Vec<PlacementCandidate<'_>> = fleet.iter().map(|p| p.candidate).collect();
    let pools = TierPools::of_size(2, &candidates);
    let mut demands = demands_of(gold, Tier::Gold, 0.0);
    for name in ["b1", "b2", "b3", "b4", "b5", "b6"] {
        demands.push(AdapterDemand {
            name,
            tier: Tier::Bronze,
            rate: 5.0,
        });
    }
    let sets = replica_sets(&demands, &fleet, &pools, 1, &BTreeMap::new());
    (sets, pools)
}

fn on_pod<'a>(sets: &'a BTreeMap<String, Vec<String>>, pod: &str) -> Vec<&'a str> {
    sets.iter()
        .filter(|(_, pods)| pods.iter().any(|p| p == pod))
        .map(|(name, _)| name.as_str())
        .collect()
}

#[test]
fn gold_adapters_take_their_pools_slots_before_hotter_bronze_ones() {
    // two gold adapters, two replicas each: the gold pool's 4 slots are theirs
    let (sets, pools) = spill_case(&["g1", "g2"]);
    for pod in EIGHT[..4].iter().filter(|p| !pools.admits(Tier::Bronze, p)) {
        assert_eq!(on_pod(&sets, pod), ["g1", "g2"], "{pod}");
    }
}

#[test]
fn the_other_tiers_take_only_the_gold_pools_free_slots() {
    // one gold adapter leaves a free slot on each gold pod: the bronze tail takes it, and
    // no gold pod holds more adapters than slots
    let (sets, pools) = spill_case(&["g1"]);
    let gold_pods: Vec<&str> = EIGHT[..4]
        .iter()
        .copied()
        .filter(|p| !pools.admits(Tier::Bronze, p))
        .collect();
    assert_eq!(gold_pods.len(), 2);
    for pod in &gold_pods {
        let held = on_pod(&sets, pod);
        assert!(held.contains(&"g1"), "{pod}: {held:?}");
        assert_eq!(
            held.len(),
            2,
            "{pod}: one spilled bronze adapter, no more: {held:?}"
        );
    }
    assert!(sets["g1"].iter().all(|p| gold_pods.contains(&p.as_str())));
}

#[test]
fn the_sets_fit_the_slots_as_far_as_the_load_bound_allows() {
    // 4 pods of 2 slots: a hot adapter wants all 4 pods and three cold ones one each, 7
    // replicas in 8 slots; two more cold ones make 9: the hot set gives one up
    let names = ["hot", "a", "b", "c", "d", "e"];
    let demands: Vec<AdapterDemand<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, name)| AdapterDemand {
            name,
            tier: Tier::Bronze,
            rate: if i == 0 { 90.0 } else { 2.0 },
        })
        .collect();
    let fleet = pods(&EIGHT[..4], 2);
    let sets = replica_sets(
        &demands[..4],
        &fleet,
        &TierPools::default(),
        1,
        &BTreeMap::new(),
    );
    assert_eq!(sets["hot"].len(), 4, "7 replicas fit 8 slots");
    let sets = replica_sets(&demands, &fleet, &TierPools::default(), 1, &BTreeMap::new());
    assert_eq!(
        sets["hot"].len(),
        3,
        "9 would not: the largest set gives one up"
    );
    assert_eq!(sets.values().map(Vec::len).sum::<usize>(), 8);
    // ten cold adapters and the hot one (90 of 100) on 8 slots: it gives up one of its 4
    // pods, keeping the ceil(4 × 0.9 / 1.25) = 3 the load bound needs
    let many: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    let mut crowded = demands_of(&many, Tier::Bronze, 1.0);
    crowded.push(AdapterDemand {
        name: "hot",
        tier: Tier::Bronze,
        rate: 90.0,
    });
    let sets = replica_sets(&crowded, &fleet, &TierPools::default(), 1, &BTreeMap::new());
    assert_eq!(sets["hot"].len(), 3);
    assert!(many.iter().all(|m| sets[m].len() == 1));
}
