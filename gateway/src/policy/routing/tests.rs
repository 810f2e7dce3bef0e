//! Scenario tests of the routing table builder.

use super::*;

fn pod<'a>(id: &'a str, adapters: Vec<&'a str>, routable: bool) -> PodRoute<'a> {
    PodRoute {
        id,
        address: "127.0.0.1:8000",
        weight: 1.0,
        load: None,
        load_samples: 60,
        wait_ms: None,
        adapters,
        resident: Vec::new(),
        routable,
        warming: !routable,
    }
}

#[test]
fn only_routable_pods_sorted_with_sorted_adapters() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    assert_eq!(b.table().generation, 0);
    let pods = vec![
        pod("pod-b", vec!["z", "a", "z"], true),
        pod("pod-c", vec![], false),
        pod("pod-a", vec!["m"], true),
        PodRoute {
            weight: 0.0,
            ..pod("pod-d", vec![], true)
        },
    ];
    assert!(b.build(&pods, 1_000));
    let t = b.table();
    assert_eq!(t.generation, 1);
    assert_eq!(
        (t.generated_at_ms, t.block_tokens, t.load_factor),
        (1_000, 64, Some(1.25))
    );
    let ids: Vec<&str> = t.pods.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, vec!["pod-a", "pod-b"]);
    assert_eq!(t.pods[1].adapters, vec!["a".to_string(), "z".to_string()]);
    // the table is valid wire
    let decoded = prewarm_core::wire::RoutingTable::decode(&t.encode()).unwrap();
    assert_eq!(&decoded, t);
}

#[test]
fn the_generation_moves_only_when_the_content_changes() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    let mut pods = vec![pod("a", vec!["x", "y"], true), pod("b", vec![], false)];
    assert!(b.build(&pods, 1));
    type Change = Box<dyn Fn(&mut Vec<PodRoute<'static>>)>;
    let steps: Vec<(&str, Change, bool)> = vec![
        ("nothing changed", Box::new(|_| {}), false),
        (
            "adapter order is not content",
            Box::new(|p| p[0].adapters = vec!["y", "x", "x"]),
            false,
        ),
        (
            "a non-routable pod's details are not content",
            Box::new(|p| p[1].adapters = vec!["q"]),
            false,
        ),
        (
            "load within a step",
            Box::new(|p| p[0].load = Some(0.51)),
            true,
        ),
        (
            "load jitter inside the rounding",
            Box::new(|p| p[0].load = Some(0.509)),
            false,
        ),
        (
            "load within the step (one standard error of 60 checks)",
            Box::new(|p| p[0].load = Some(0.55)),
            false,
        ),
        (
            "load past the step",
            Box::new(|p| p[0].load = Some(0.65)),
            true,
        ),
        (
            "a pod becomes routable",
            Box::new(|p| p[1].routable = true),
            true,
        ),
        (
            "an adapter is added",
            Box::new(|p| p[1].adapters.push("r")),
            true,
        ),
        (
            "an adapter takes a GPU slot",
            Box::new(|p| p[1].resident = vec!["r"]),
            true,
        ),
        (
            "a resident adapter the pod does not list is not content",
            Box::new(|p| p[1].resident = vec!["r", "gone", "r"]),
            false,
        ),
        (
            "an address changes",
            Box::new(|p| p[0].address = "10.0.0.1:8000"),
            true,
        ),
        ("a weight changes", Box::new(|p| p[0].weight = 2.0), true),
        ("a pod leaves", Box::new(|p| p[0].routable = false), true),
    ];
    let mut generation = b.table().generation;
    for (name, change, changed) in steps {
        change(&mut pods);
        assert_eq!(b.build(&pods, 2), changed, "{name}");
        if changed {
            generation += 1;
        }
        assert_eq!(b.table().generation, generation, "{name}");
    }
    let last = &b.table().pods;
    assert_eq!(last.len(), 1);
    assert_eq!(
        (last[0].id.as_str(), &last[0].adapters),
        ("b", &vec!["q".to_string(), "r".to_string()])
    );
    assert_eq!(last[0].resident, vec!["r".to_string()]);
}

#[test]
fn loads_are_rounded_and_generations_continue_after_a_restart() {
    let config = RoutingConfig {
        load_factor: Some(1.25),
        load_step: 0.1,
        prefill_us_per_token: None,
    };
    let mut b = RoutingTableBuilder::new(64, config, 41);
    let mut p = pod("a", vec![], true);
    p.load = Some(0.46);
    assert!(b.build(&[p.clone()], 5));
    assert_eq!(b.table().generation, 42);
    assert_eq!(b.table().load_factor, Some(1.25));
    assert!((b.table().pods[0].load.unwrap() - 0.5).abs() < 1e-12);
    p.load = Some(f64::NAN);
    assert!(b.build(&[p], 6));
    assert_eq!(b.table().pods[0].load, None);
    let mut empty = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    assert!(
        empty.build(&[], 1),
        "the first build publishes even an empty table"
    );
    assert!(!empty.build(&[], 2));
}

#[test]
fn config_validation_names_every_field() {
    assert!(RoutingConfig::default().validate("routing.").is_empty());
    let bad = RoutingConfig {
        load_factor: Some(0.5),
        load_step: 0.0,
        prefill_us_per_token: Some(0.0),
    };
    assert_eq!(
        bad.validate("routing."),
        vec![
            "routing.load_factor: 0.5: must be between 1 and 100".to_string(),
            "routing.load_step: 0: must be in (0, 1]".to_string(),
            "routing.prefill_us_per_token: 0: must be in (0, 100000]".to_string()
        ]
    );
}

#[test]
fn waits_are_published_in_steps_and_a_jitter_within_one_changes_nothing() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    assert_eq!(
        b.table().prefill_us_per_token,
        Some(DEFAULT_PREFILL_US_PER_TOKEN)
    );
    let mut p = pod("a", vec![], true);
    p.wait_ms = Some(1_234.0);
    assert!(b.build(&[p.clone()], 1));
    assert_eq!(b.table().pods[0].wait_ms, Some(1_200));
    p.wait_ms = Some(1_180.0);
    assert!(
        !b.build(&[p.clone()], 2),
        "1,180 ms rounds to the same step"
    );
    p.wait_ms = Some(1e12);
    assert!(b.build(&[p.clone()], 3));
    assert_eq!(b.table().pods[0].wait_ms, Some(MAX_WAIT_MS));
    p.wait_ms = Some(f64::NAN);
    assert!(b.build(&[p], 4));
    assert_eq!(b.table().pods[0].wait_ms, None);
}

#[test]
fn placed_prefixes_change_the_generation_and_name_only_listed_pods() {
    use prewarm_core::fingerprint::BlockHash;
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    assert!(b.build(&[pod("a", vec![], true), pod("c", vec![], false)], 1));
    let placed = |block: u64, pod: &str| PlacedPrefix {
        keys: vec![BlockHash(block)],
        pod: pod.into(),
    };
    let list = vec![placed(1, "a"), placed(2, "c"), placed(3, "a")];
    assert!(b.place_prefixes(&list, 2));
    assert_eq!(b.table().generation, 2);
    assert_eq!(b.table().prefixes, vec![placed(1, "a"), placed(3, "a")]);
    assert!(
        !b.place_prefixes(&list, 3),
        "an unchanged list is no change"
    );
    assert_eq!(b.table().generation, 2);
    let reordered = vec![placed(3, "a"), placed(2, "c"), placed(1, "a")];
    assert!(
        !b.place_prefixes(&reordered, 3),
        "the same placements in another (hotness) order are no change"
    );
    assert_eq!(b.table().prefixes, vec![placed(1, "a"), placed(3, "a")]);
    assert!(
        b.place_prefixes(&[placed(1, "a"), placed(4, "a")], 3),
        "another prefix in the set is a change"
    );
    assert_eq!(b.table().generation, 3);
    assert!(b.place_prefixes(&[], 4));
    assert!(b.table().prefixes.is_empty());
    // what the builder publishes, the filters accept
    assert!(prewarm_core::wire::RoutingTable::decode(&b.table().encode()).is_ok());
}

fn experiment(cold_arm: bool) -> prewarm_core::experiment::Experiment {
    let json = serde_json::json!({"id": "e", "arms": [
        {"name": "warm", "weight": 0.5},
        {"name": "cold", "weight": 0.5, "settings": {"warmup": !cold_arm}},
    ]});
    serde_json::from_value(json).unwrap()
}

#[test]
fn warming_pods_are_listed_apart_only_while_an_arm_routes_to_them() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    let pods = vec![pod("pod-a", vec![], true), pod("pod-b", vec!["x"], false)];
    assert!(b.build(&pods, 1));
    assert!(b.table().warming.is_empty(), "no experiment: not listed");

    assert!(b.set_experiment(Some(&experiment(false)), 2));
    assert!(!b.set_experiment(Some(&experiment(false)), 3), "unchanged");
    assert!(
        !b.build(&pods, 3),
        "no arm without warm-up: still not listed"
    );
    assert!(b.set_experiment(Some(&experiment(true)), 4));
    let before = b.table().generation;
    assert!(b.build(&pods, 5));
    let t = b.table();
    assert_eq!(t.generation, before + 1);
    let warming: Vec<&str> = t.warming.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(warming, vec!["pod-b"]);
    assert_eq!(t.pods.len(), 1, "and never among the routable pods");
    assert_eq!(
        prewarm_core::wire::RoutingTable::decode(&t.encode()).as_ref(),
        Ok(t)
    );

    // the pod finishes its warm-up: it moves to the pods
    let done = vec![pod("pod-a", vec![], true), pod("pod-b", vec!["x"], true)];
    assert!(b.build(&done, 6));
    assert!(b.table().warming.is_empty());
    assert_eq!(b.table().pods.len(), 2);

    // the experiment ends: warming pods are no longer listed
    assert!(b.build(&pods, 7));
    assert_eq!(b.table().warming.len(), 1);
    assert!(b.set_experiment(None, 8));
    assert!(b.build(&pods, 9));
    assert!(b.table().warming.is_empty() && b.table().experiment.is_none());
}

fn loaded(id: &'static str, load: f64) -> PodRoute<'static> {
    PodRoute {
        load: Some(load),
        ..pod(id, vec![], true)
    }
}

#[test]
fn a_load_within_its_step_keeps_the_generation_and_the_published_figure() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    let mut pods: Vec<PodRoute<'static>> = (0..4).map(|_| loaded("x", 0.3)).collect();
    for (p, id) in pods.iter_mut().zip(["a", "b", "c", "d"]) {
        p.id = id;
    }
    assert!(b.build(&pods, 1));
    let generation = b.table().generation;
    // every pod jitters within ±0.05 (the step at 0.3 over 60 checks is ≈ 0.06): nothing moves
    for (i, jitter) in [0.04, -0.05, 0.03, -0.02].into_iter().enumerate() {
        pods[i].load = Some(0.3 + jitter);
    }
    assert!(!b.build(&pods, 2));
    assert_eq!(b.table().generation, generation);
    assert!(b.table().pods.iter().all(|p| p.load == Some(0.3)));
    // the same change over fewer checks is within the step too; over 600 it is news
    pods[0].load_samples = 600;
    assert!(b.build(&pods, 3));
    let published: Vec<Option<f64>> = b.table().pods.iter().map(|p| p.load).collect();
    assert_eq!(published, vec![Some(0.34), Some(0.3), Some(0.3), Some(0.3)]);
}

#[test]
fn a_load_crossing_the_cap_is_published_whatever_the_step() {
    let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    // mean 0.19: the cap is the floor, 0.5; pod a (0.52) is full
    let mut pods = vec![
        loaded("a", 0.52),
        loaded("b", 0.1),
        loaded("c", 0.1),
        loaded("d", 0.05),
    ];
    assert!(b.build(&pods, 1));
    let generation = b.table().generation;
    pods[0].load = Some(0.55);
    assert!(!b.build(&pods, 2), "still full, within the step");
    pods[0].load = Some(0.48);
    assert!(
        b.build(&pods, 3),
        "within the step of 0.52, but under the cap now"
    );
    assert_eq!(b.table().generation, generation + 1);
    assert_eq!(b.table().pods[0].load, Some(0.48));
    // and the filters' rule sees it under the cap
    let t = b.table();
    let cap = prewarm_core::placement::load_cap(
        t.pods.iter().map(|p| p.load.unwrap_or(0.0)),
        t.load_factor.unwrap(),
    );
    assert!(t.pods[0].load.unwrap() <= cap);
    // without a load factor there is no cap to cross
    let mut plain = RoutingTableBuilder::new(
        64,
        RoutingConfig {
            load_factor: None,
            ..RoutingConfig::default()
        },
        0,
    );
    pods[0].load = Some(0.52);
    assert!(plain.build(&pods, 1));
    pods[0].load = Some(0.48);
    assert!(!plain.build(&pods, 2));
}

#[test]
fn an_adapter_pools_cap_counts_too() {
    let holder = |id: &'static str, load: f64| PodRoute {
        adapters: vec!["x"],
        ..loaded(id, load)
    };
    // x's holders a, b, e: mean 0.567, cap 0.708, a (0.70) under it; the whole table's mean is
    // 0.34, its cap the floor 0.5, a over it. a moving to 0.74 is within its step (≈ 0.058)
    // and stays over the whole table's cap, but crosses x's.
    let with_x = vec![
        holder("a", 0.70),
        holder("b", 0.5),
        loaded("c", 0.0),
        loaded("d", 0.0),
        holder("e", 0.5),
    ];
    let without_x: Vec<PodRoute<'static>> = with_x
        .iter()
        .map(|p| PodRoute {
            adapters: vec![],
            ..p.clone()
        })
        .collect();
    for (mut pods, crosses) in [(with_x, true), (without_x, false)] {
        let mut b = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
        assert!(b.build(&pods, 1));
        pods[0].load = Some(0.74);
        assert_eq!(b.build(&pods, 2), crosses);
        let want = if crosses { 0.74 } else { 0.70 };
        assert_eq!(b.table().pods[0].load, Some(want));
    }
}
