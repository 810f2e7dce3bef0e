//! Scenario and property tests of LoRA residency, in virtual time.

use super::*;
use proptest::prelude::*;

const S: u64 = 1_000;

fn pod(max_loras: usize, max_cpu_loras: usize) -> LoraResidency {
    LoraResidency::new(
        LoraSlots {
            max_loras,
            max_cpu_loras,
        },
        LoraConfig::default(),
    )
}

fn load(a: &str) -> LoraDecision {
    LoraDecision::Load(a.into())
}
fn unload(a: &str) -> LoraDecision {
    LoraDecision::Unload(a.into())
}
fn touch(a: &str) -> LoraDecision {
    LoraDecision::Touch(a.into())
}

fn in_gpu(p: &LoraResidency) -> Vec<String> {
    p.adapters()
        .into_iter()
        .filter(|a| a.in_gpu)
        .map(|a| a.name)
        .collect()
}

enum Step {
    /// ensure_resident(adapter, tier, priority, at) and the decisions expected (`None`: refused).
    Ensure(&'static str, Tier, u8, u64, Option<Vec<LoraDecision>>),
    Use(&'static str, u64),
    Gpu(Vec<&'static str>),
}

#[test]
fn residency_scenarios() {
    use Step::*;
    use Tier::{Bronze, Gold, Silver};
    let cases: Vec<(&str, (usize, usize), Vec<Step>)> = vec![
        (
            "a cold adapter is loaded then touched into a slot; a resident one costs nothing",
            (2, 2),
            vec![
                Ensure("a", Bronze, 0, 0, Some(vec![load("a"), touch("a")])),
                Ensure("a", Bronze, 0, 1, Some(vec![])),
                Gpu(vec!["a"]),
            ],
        ),
        (
            "a gold adapter within its guarantee is never evicted for bronze",
            (2, 4),
            vec![
                Ensure("g", Gold, 0, 0, Some(vec![load("g"), touch("g")])),
                Ensure("b1", Bronze, 0, 0, Some(vec![load("b1"), touch("b1")])),
                Ensure(
                    "b2",
                    Bronze,
                    0,
                    500 * S,
                    Some(vec![load("b2"), touch("b2")]),
                ),
                Gpu(vec!["b2", "g"]),
                Ensure(
                    "b3",
                    Bronze,
                    99,
                    900 * S,
                    Some(vec![load("b3"), touch("b3")]),
                ),
                Gpu(vec!["b3", "g"]),
            ],
        ),
        (
            "gold above its guarantee may go for bronze, after its 120 s only",
            (2, 4),
            vec![
                Ensure("g1", Gold, 0, 0, Some(vec![load("g1"), touch("g1")])),
                Ensure("g2", Gold, 0, 10 * S, Some(vec![load("g2"), touch("g2")])),
                Ensure("b", Bronze, 0, 119 * S, None),
                Gpu(vec!["g1", "g2"]),
                Ensure("b", Bronze, 0, 120 * S, Some(vec![load("b"), touch("b")])),
                Gpu(vec!["b", "g2"]),
            ],
        ),
        (
            "silver keeps its slot 45 s even against silver",
            (1, 4),
            vec![
                Ensure("s1", Silver, 0, 0, Some(vec![load("s1"), touch("s1")])),
                Ensure("s2", Silver, 0, 44 * S, None),
                Ensure("s2", Silver, 0, 45 * S, Some(vec![load("s2"), touch("s2")])),
                Gpu(vec!["s2"]),
            ],
        ),
        (
            "gold may displace silver within silver's guarantee only after 45 s; bronze never",
            (3, 6),
            vec![
                Ensure("s", Silver, 0, 0, Some(vec![load("s"), touch("s")])),
                Ensure("g", Gold, 0, 0, Some(vec![load("g"), touch("g")])),
                Ensure("g0", Gold, 0, 0, Some(vec![load("g0"), touch("g0")])),
                Ensure("b", Bronze, 0, 100 * S, None),
                Ensure("g2", Gold, 0, 100 * S, Some(vec![load("g2"), touch("g2")])),
                Gpu(vec!["g", "g0", "g2"]),
            ],
        ),
        (
            "LRU-2: an adapter used once goes before one used twice",
            (2, 4),
            vec![
                Ensure("a", Bronze, 0, 0, Some(vec![load("a"), touch("a")])),
                Use("a", 10 * S),
                Ensure("b", Bronze, 0, 20 * S, Some(vec![load("b"), touch("b")])),
                Ensure("c", Bronze, 0, 30 * S, Some(vec![load("c"), touch("c")])),
                Gpu(vec!["a", "c"]),
            ],
        ),
        (
            "LRU-2: the oldest second-to-last use goes first",
            (2, 4),
            vec![
                Ensure("a", Bronze, 0, 0, Some(vec![load("a"), touch("a")])),
                Ensure("b", Bronze, 0, 5 * S, Some(vec![load("b"), touch("b")])),
                Use("a", 40 * S),
                Use("b", 30 * S),
                Ensure("c", Bronze, 0, 50 * S, Some(vec![load("c"), touch("c")])),
                Gpu(vec!["b", "c"]),
            ],
        ),
        (
            "priority stretches an adapter's LRU-2 age",
            (2, 4),
            vec![
                Ensure("a", Bronze, 99, 0, Some(vec![load("a"), touch("a")])),
                Ensure("b", Bronze, 0, 20 * S, Some(vec![load("b"), touch("b")])),
                Use("a", 50 * S),
                Use("b", 50 * S),
                // a: 100 s / (1 + 99/50) ≈ 34 s; b: 80 s
                Ensure("c", Bronze, 0, 100 * S, Some(vec![load("c"), touch("c")])),
                Gpu(vec!["a", "c"]),
            ],
        ),
        (
            "at max_cpu_loras a registered adapter without a slot is unloaded first",
            (1, 2),
            vec![
                Ensure("a", Bronze, 0, 0, Some(vec![load("a"), touch("a")])),
                Ensure("b", Bronze, 0, S, Some(vec![load("b"), touch("b")])),
                Gpu(vec!["b"]),
                Ensure(
                    "c",
                    Bronze,
                    0,
                    2 * S,
                    Some(vec![unload("a"), load("c"), touch("c")]),
                ),
                Gpu(vec!["c"]),
            ],
        ),
    ];
    for (name, (slots, cpu), steps) in cases {
        let mut p = pod(slots, cpu);
        for step in steps {
            match step {
                Ensure(a, tier, prio, at, want) => {
                    let got = p.ensure_resident(a, tier, prio, at);
                    match want {
                        Some(w) => assert_eq!(got, Ok(w), "{name}: ensure {a} at {at}"),
                        None => assert_eq!(
                            got,
                            Err(LoraRefusal::NoGpuSlot(a.into())),
                            "{name}: ensure {a} at {at}"
                        ),
                    }
                }
                Use(a, at) => p.observe_use(a, at),
                Gpu(want) => assert_eq!(in_gpu(&p), want, "{name}"),
            }
        }
    }
}

#[test]
fn a_refusal_changes_nothing() {
    let mut p = pod(1, 1);
    p.ensure_resident("g", Tier::Gold, 0, 0).unwrap();
    let before = p.adapters();
    assert_eq!(
        p.ensure_resident("b", Tier::Bronze, 0, 1)
            .unwrap_err()
            .to_string(),
        "adapter \"b\": no registration slot: every registered adapter is pinned or protected"
    );
    assert_eq!(p.adapters(), before);
    assert_eq!(
        pod(0, 0).ensure_resident("x", Tier::Gold, 0, 0),
        Err(LoraRefusal::NoSlots("x".into()))
    );
}

#[test]
fn pins_hold_their_slot_and_are_bounded() {
    let mut p = pod(3, 3);
    assert_eq!(
        p.pin("p1", Tier::Bronze, 0),
        Ok(vec![load("p1"), touch("p1")])
    );
    assert_eq!(
        p.pin("p2", Tier::Bronze, 0),
        Ok(vec![load("p2"), touch("p2")])
    );
    assert!(matches!(
        p.pin("p3", Tier::Bronze, 0),
        Err(LoraRefusal::TooManyPins(_, 2))
    ));
    p.ensure_resident("b", Tier::Bronze, 0, 0).unwrap();
    assert_eq!(
        p.ensure_resident("c", Tier::Gold, 0, 1_000 * S),
        Ok(vec![unload("b"), load("c"), touch("c")])
    );
    assert_eq!(
        p.ensure_resident("d", Tier::Gold, 0, 1_000 * S),
        Err(LoraRefusal::NoRegistrationSlot("d".into()))
    );
    assert!(p.unpin("p1"));
    assert!(!p.unpin("p1"));
    assert!(!p.unpin("nobody"));
    assert_eq!(
        p.ensure_resident("d", Tier::Gold, 0, 1_000 * S),
        Ok(vec![unload("p1"), load("d"), touch("d")])
    );
}

#[test]
fn keep_warm_touches_protected_adapters_only_when_stale() {
    let mut p = pod(4, 4);
    p.ensure_resident("g", Tier::Gold, 0, 0).unwrap();
    p.ensure_resident("s", Tier::Silver, 0, 0).unwrap();
    p.ensure_resident("b", Tier::Bronze, 0, 0).unwrap();
    p.pin("pb", Tier::Bronze, 0).unwrap();
    assert_eq!(p.keep_warm(29 * S), vec![]);
    assert_eq!(
        p.keep_warm(30 * S),
        vec![touch("g"), touch("pb"), touch("s")]
    );
    assert_eq!(p.keep_warm(31 * S), vec![]);
    p.observe_use("g", 50 * S);
    assert_eq!(p.keep_warm(60 * S), vec![touch("pb"), touch("s")]);
}

#[test]
fn reconcile_follows_the_pod_and_restores_pins() {
    let mut p = pod(2, 3);
    p.pin("pinned", Tier::Gold, 0).unwrap();
    p.ensure_resident("a", Tier::Bronze, 0, 0).unwrap();
    p.loaded("pinned");
    p.loaded("a");
    // the pod restarted: nothing registered, someone else loaded "x", "y" is running
    let observed = LoraObservation {
        registered: vec!["x".into(), "y".into()],
        running: vec!["y".into()],
        waiting: vec!["z".into()],
    };
    let d = p.reconcile(&observed, 10 * S);
    assert_eq!(d, vec![load("pinned"), touch("pinned")]);
    let view: Vec<(String, bool, bool)> = p
        .adapters()
        .into_iter()
        .map(|a| (a.name, a.registered, a.in_gpu))
        .collect();
    assert_eq!(
        view,
        vec![
            ("a".into(), false, false),
            ("pinned".into(), true, true),
            ("x".into(), true, false),
            ("y".into(), true, true),
            ("z".into(), false, false),
        ]
    );
    // "pinned" is registered again once the pod answers its load.
    assert_eq!(p.served().collect::<Vec<_>>(), vec!["x", "y"]);
    p.loaded("pinned");
    assert_eq!(p.served().collect::<Vec<_>>(), vec!["pinned", "x", "y"]);
}

#[test]
fn an_adapter_is_served_only_once_its_load_is_answered() {
    let mut p = pod(2, 3);
    assert_eq!(
        p.ensure_resident("a", Tier::Bronze, 0, 0).unwrap(),
        vec![load("a"), touch("a")]
    );
    assert!(
        p.served().next().is_none(),
        "vLLM answers 404 until the load ends"
    );
    assert!(p.resident().next().is_none());
    // A health poll during the load does not list it yet, and does not undo it.
    let before = LoraObservation::default();
    assert_eq!(p.reconcile(&before, S), vec![]);
    assert!(p.adapters()[0].registered && p.adapters()[0].loading);
    // Registration slots count it meanwhile: two more fill them, a fourth needs a victim.
    p.ensure_resident("b", Tier::Bronze, 0, 2 * S).unwrap();
    p.ensure_resident("c", Tier::Bronze, 0, 3 * S).unwrap();
    let fourth = p.ensure_resident("d", Tier::Bronze, 0, 4 * S).unwrap();
    assert!(matches!(fourth[0], LoraDecision::Unload(_)), "{fourth:?}");
    p.loaded("b");
    assert!(p.served().any(|a| a == "b") && !p.served().any(|a| a == "c"));
    // The pod listing it, or serving it, ends the load as well.
    let listed = LoraObservation {
        registered: vec!["b".into(), "c".into(), "d".into()],
        ..LoraObservation::default()
    };
    p.reconcile(&listed, 5 * S);
    p.observe_use("d", 6 * S);
    assert_eq!(p.served().collect::<Vec<_>>(), vec!["b", "c", "d"]);
}

#[test]
fn observed_use_follows_the_pods_own_lru() {
    let mut p = pod(2, 4);
    p.ensure_resident("g", Tier::Gold, 0, 0).unwrap();
    p.observe_use("b1", 10 * S);
    p.observe_use("b2", 20 * S);
    assert_eq!(
        in_gpu(&p),
        vec!["b1", "b2"],
        "the pod evicts by recency, whatever the tier"
    );
}

#[test]
fn failures_revert_the_model_and_remove_unloads() {
    let mut p = pod(2, 2);
    let d = p.ensure_resident("a", Tier::Bronze, 0, 0).unwrap();
    p.record_failure(&d[0]);
    assert!(p.served().next().is_none());
    p.ensure_resident("a", Tier::Bronze, 0, 0).unwrap();
    p.loaded("a");
    p.record_failure(&touch("a"));
    assert!(in_gpu(&p).is_empty());
    assert_eq!(p.served().collect::<Vec<_>>(), vec!["a"]);
    assert_eq!(p.remove("a"), vec![unload("a")]);
    assert_eq!(p.remove("a"), vec![]);
}

#[test]
fn guarantees_round_the_shares() {
    let p = pod(8, 8);
    assert_eq!(
        (
            p.guaranteed_slots(Tier::Gold),
            p.guaranteed_slots(Tier::Silver)
        ),
        (3, 1)
    );
    let p = pod(4, 4);
    assert_eq!(
        (
            p.guaranteed_slots(Tier::Gold),
            p.guaranteed_slots(Tier::Silver)
        ),
        (1, 1)
    );
    assert_eq!(pod(1, 1).guaranteed_slots(Tier::Silver), 0);
    assert_eq!(pod(1, 1).guaranteed_slots(Tier::Bronze), 0);
}

#[test]
fn config_validation_names_every_field() {
    assert!(LoraConfig::default().validate("lora.").is_empty());
    let mut bad = LoraConfig::default();
    bad.gold.slot_share = 0.9;
    bad.touch_interval_ms = 0;
    let p = bad.validate("lora.");
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(
        p[0],
        "lora.silver.slot_share: 0.18: gold and silver shares must sum to at most 1"
    );
    assert!(p[1].starts_with("lora.touch_interval_ms: 0:"));
    let parsed: LoraConfig =
        serde_json::from_str(r#"{"gold": {"min_residency_ms": 1, "slot_share": 0.5}}"#).unwrap();
    assert_eq!(parsed.silver.min_residency_ms, 45_000);
    assert!(serde_json::from_str::<LoraConfig>(r#"{"platinum": {}}"#).is_err());
    assert_eq!(
        serde_json::to_string(&load("a")).unwrap(),
        r#"{"action":"load","adapter":"a"}"#
    );
}

fn tier(i: u8) -> Tier {
    match i % 3 {
        0 => Tier::Bronze,
        1 => Tier::Silver,
        _ => Tier::Gold,
    }
}

proptest! {
    /// Whatever the demand, slots and registrations stay within the pod's limits, and no gold
    /// adapter leaves its slot for a bronze one while gold is within its guarantee or younger
    /// than its minimum residency.
    #[test]
    fn tier_guarantees_hold(
        steps in proptest::collection::vec((0u8..10, 0u8..3, 0u8..99, 0u64..60), 1..80),
        slots in 1usize..6,
        extra_cpu in 0usize..4,
    ) {
        let mut p = pod(slots, slots + extra_cpu);
        let mut now = 0u64;
        for (adapter, t, prio, dt) in steps {
            now += dt * S;
            let name = format!("a{adapter}");
            let tier_of_step = tier(t);
            let before = p.adapters();
            let gold_before: Vec<&AdapterResidency> =
                before.iter().filter(|a| a.in_gpu && a.tier == Tier::Gold).collect();
            let _ = p.ensure_resident(&name, tier_of_step, prio, now);
            let after = p.adapters();
            prop_assert!(after.iter().filter(|a| a.in_gpu).count() <= slots);
            prop_assert!(after.iter().filter(|a| a.registered).count() <= slots + extra_cpu);
            if tier_of_step == Tier::Bronze {
                for g in &gold_before {
                    let still = after.iter().any(|a| a.name == g.name && a.in_gpu);
                    if !still && g.name != name {
                        prop_assert!(gold_before.len() > p.guaranteed_slots(Tier::Gold), "gold {} evicted within guarantee", g.name);
                        prop_assert!(now - g.gpu_since_ms.unwrap() >= 120 * S, "gold {} evicted before 120 s", g.name);
                    }
                }
            }
        }
    }
}

/// The seed's keep rule keeps a hot, recently reused adapter's slot that LRU-2 would give to a
/// newcomer, and keeps nothing below its thresholds.
#[test]
fn the_seed_keep_rule_keeps_a_reused_high_priority_adapter() {
    let keep = LoraConfig {
        residency_rule: ResidencyRule::SeedKeep,
        ..LoraConfig::default()
    };
    let slots = LoraSlots {
        max_loras: 1,
        max_cpu_loras: 4,
    };
    for (config, priority, kept) in [
        (keep.clone(), 80, true),
        (keep.clone(), 60, false),
        (LoraConfig::default(), 80, false),
    ] {
        let mut p = LoraResidency::new(slots, config);
        p.ensure_resident("hot", Tier::Bronze, priority, 0).unwrap();
        p.observe_use("hot", 10 * S);
        let newcomer = p.ensure_resident("new", Tier::Bronze, 0, 20 * S);
        assert_eq!(newcomer.is_err(), kept, "priority {priority}");
        assert_eq!(in_gpu(&p) == vec!["hot".to_string()], kept);
    }
    // Above 0.95 it is kept without reuse.
    let mut p = LoraResidency::new(slots, keep);
    p.ensure_resident("top", Tier::Bronze, 97, 0).unwrap();
    assert!(p.ensure_resident("new", Tier::Bronze, 0, 100 * S).is_err());
}

/// A per-adapter rule (an experiment arm's) overrides `[lora]`'s for that adapter only, and a
/// pod takes a generation of rules once.
#[test]
fn an_adapters_own_rule_decides_its_slot_and_no_others() {
    let slots = LoraSlots {
        max_loras: 1,
        max_cpu_loras: 4,
    };
    let keep_hot = BTreeMap::from([("hot".to_string(), ResidencyRule::SeedKeep)]);
    for (rules, kept) in [(BTreeMap::new(), false), (keep_hot.clone(), true)] {
        let mut p = LoraResidency::new(slots, LoraConfig::default());
        p.set_rules(1, &rules);
        p.ensure_resident("hot", Tier::Bronze, 80, 0).unwrap();
        p.observe_use("hot", 10 * S);
        assert_eq!(
            p.ensure_resident("new", Tier::Bronze, 0, 20 * S).is_err(),
            kept
        );
        let view = p.adapters();
        let hot = view.iter().find(|a| a.name == "hot").unwrap();
        assert_eq!(hot.residency_rule == ResidencyRule::SeedKeep, kept);
    }
    // The same reused, high-priority history under another adapter's name is not kept.
    let mut p = LoraResidency::new(slots, LoraConfig::default());
    p.set_rules(1, &keep_hot);
    p.ensure_resident("other", Tier::Bronze, 80, 0).unwrap();
    p.observe_use("other", 10 * S);
    assert!(p.ensure_resident("new", Tier::Bronze, 0, 20 * S).is_ok());
    // A generation already taken is not copied again; a new one replaces the rules.
    p.set_rules(1, &BTreeMap::new());
    assert_eq!(p.rule_of("hot"), ResidencyRule::SeedKeep);
    p.set_rules(2, &BTreeMap::new());
    assert_eq!(p.rule_of("hot"), ResidencyRule::Lru2);
}

/// `loads = "external"`: another controller registers adapters. The model decides no load or
/// unload — not to make an adapter resident, not for a pin the pod lost, not on removal — and
/// still touches what the pod holds.
#[test]
fn external_loads_decide_touches_only() {
    let config = LoraConfig {
        loads: AdapterLoads::External,
        ..LoraConfig::default()
    };
    let slots = LoraSlots {
        max_loras: 1,
        max_cpu_loras: 1,
    };
    let mut p = LoraResidency::new(slots, config);
    assert_eq!(p.loads(), AdapterLoads::External);
    // Not on the pod: nothing, and nothing believed registered.
    assert_eq!(p.ensure_resident("a", Tier::Gold, 50, 0), Ok(vec![]));
    assert_eq!(p.served().count(), 0);
    // The other controller loaded `b`: only touched, even with the one registration slot taken.
    let seen = LoraObservation {
        registered: vec!["b".into()],
        ..Default::default()
    };
    assert_eq!(p.reconcile(&seen, 1_000), vec![]);
    assert_eq!(
        p.ensure_resident("b", Tier::Gold, 50, 2_000),
        Ok(vec![touch("b")])
    );
    assert_eq!(p.ensure_resident("a", Tier::Gold, 50, 3_000), Ok(vec![]));
    // It unloaded `b`: the model follows, and no reload.
    assert_eq!(p.reconcile(&LoraObservation::default(), 4_000), vec![]);
    assert_eq!(p.served().count(), 0);
    p.reconcile(&seen, 5_000);
    assert_eq!(p.remove("b"), vec![], "no unload");
}
