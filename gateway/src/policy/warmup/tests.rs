//! Scenario and property tests of warm-up planning and progress, in virtual time.

use super::*;
use prewarm_core::fingerprint::BlockHash;
use prewarm_core::placement::place;
use proptest::prelude::*;

fn hot(n: u64, salt: u64) -> Vec<HotPrefix> {
    (0..n)
        .map(|i| {
            let h = (i ^ salt)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(17);
            HotPrefix {
                key: PrefixKey {
                    model: 1,
                    last: BlockHash(h),
                },
                routing_key: BlockHash(h ^ 0x5555),
                tokens: 512,
                hotness: (n - i) as f64,
                fleet_wide: false,
                holders: 0,
            }
        })
        .collect()
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("pod-{i}")).collect()
}

fn cands(ids: &[String]) -> Vec<PlacementCandidate<'_>> {
    ids.iter()
        .map(|id| PlacementCandidate::new(id, 1.0))
        .collect()
}

#[test]
fn the_plan_takes_exactly_the_keys_that_move_hottest_first() {
    let mut pods = ids(5);
    let before = cands(&pods)
        .iter()
        .map(|c| c.id.to_string())
        .collect::<Vec<_>>();
    pods.push("pod-new".into());
    let after = cands(&pods);
    let old_ids = before;
    let old = cands(&old_ids);
    let prefixes = hot(12_000, 1);
    let plan = plan_warmup(
        "pod-new",
        &after,
        &["sql-lora".into()],
        &prefixes,
        &WarmupConfig::default(),
    );
    assert_eq!(plan.adapters, vec!["sql-lora".to_string()]);
    assert_eq!(plan.considered, 12_000);
    assert_eq!(plan.first_tier.len(), 100);
    assert_eq!(plan.second_tier.len(), 1_000);
    let planned: Vec<PrefixKey> = plan
        .first_tier
        .iter()
        .chain(&plan.second_tier)
        .chain(&plan.lazy)
        .copied()
        .collect();
    let moved: Vec<PrefixKey> = prefixes
        .iter()
        .filter(|h| place(h.routing_key.0, &old) != place(h.routing_key.0, &after))
        .map(|h| h.key)
        .collect();
    assert_eq!(planned, moved, "exactly the moving keys, in hotness order");
    let share = moved.len() as f64 / 12_000.0;
    assert!((share - 1.0 / 6.0).abs() < 0.02, "share {share}");
}

#[test]
fn a_prefix_common_to_the_fleet_is_in_every_joining_pods_plan_by_hotness() {
    let pods = ids(6);
    let all = cands(&pods);
    let mut prefixes = hot(60, 3);
    // the third hottest is an application's system prompt, cached fleet-wide
    prefixes[2].fleet_wide = true;
    let shared = prefixes[2].key;
    for pod in &pods {
        let plan = plan_warmup(pod, &all, &[], &prefixes, &WarmupConfig::default());
        let at = plan.first_tier.iter().position(|k| *k == shared);
        assert!(at.is_some(), "{pod}: {:?}", plan.first_tier);
        // it keeps its place by hotness among the keys that move to the pod
        let hotter = prefixes[..2]
            .iter()
            .filter(|h| plan.first_tier.contains(&h.key));
        assert_eq!(at, Some(hotter.count()), "{pod}");
    }
    // without the mark it goes to the one pod its key places it on
    prefixes[2].fleet_wide = false;
    let holders = pods
        .iter()
        .filter(|pod| {
            plan_warmup(pod, &all, &[], &prefixes, &WarmupConfig::default())
                .first_tier
                .contains(&shared)
        })
        .count();
    assert_eq!(holders, 1);
}

#[test]
fn a_prefix_held_on_two_pods_is_in_every_joining_pods_plan_by_hotness() {
    let pods = ids(6);
    let all = cands(&pods);
    let mut prefixes = hot(60, 3);
    // the third hottest is a system prompt whose conversations overflowed onto a second pod:
    // not common (that takes three), but its placed pod is full
    prefixes[2].holders = SPREAD_HOLDERS;
    let shared = prefixes[2].key;
    for pod in &pods {
        let plan = plan_warmup(pod, &all, &[], &prefixes, &WarmupConfig::default());
        let at = plan.first_tier.iter().position(|k| *k == shared);
        let hotter = prefixes[..2]
            .iter()
            .filter(|h| plan.first_tier.contains(&h.key));
        assert_eq!(at, Some(hotter.count()), "{pod}: {:?}", plan.first_tier);
    }
}

#[test]
fn a_prefix_held_on_one_pod_is_only_in_the_plan_of_the_pod_it_moves_to() {
    let pods = ids(6);
    let all = cands(&pods);
    let mut prefixes = hot(60, 3);
    prefixes[2].holders = 1;
    let shared = prefixes[2].key;
    let planned: Vec<&String> = pods
        .iter()
        .filter(|pod| {
            plan_warmup(pod, &all, &[], &prefixes, &WarmupConfig::default())
                .first_tier
                .contains(&shared)
        })
        .collect();
    let placed = place(prefixes[2].routing_key.0, &all).map(|i| &pods[i]);
    assert_eq!(planned, placed.into_iter().collect::<Vec<_>>());
}

#[test]
fn an_adapters_prefixes_move_only_among_the_pods_serving_it() {
    let pods = ids(6);
    let all = cands(&pods);
    // model 1 (the helper's prefixes) is an adapter served by pod-1 and pod-4 only
    let mut scoped = ScopedCandidates::new();
    scoped.insert(1, vec![all[1], all[4]]);
    let prefixes = hot(3_000, 3);
    let config = WarmupConfig {
        first_tier: 10_000,
        ..WarmupConfig::default()
    };
    for (i, pod) in pods.iter().enumerate() {
        let scope = PlanScope {
            scoped: &scoped,
            groups: &SemanticGroups::new(),
        };
        let plan = plan_warmup_scoped(pod, &all, scope, &[], &prefixes, &config);
        if i == 1 || i == 4 {
            let want = prefixes
                .iter()
                .filter(|h| {
                    place(h.routing_key.0, &scoped[&1]).map(|w| scoped[&1][w].id) == Some(pod)
                })
                .count();
            assert_eq!(plan.first_tier.len(), want, "{pod}");
            assert!(want > 1_000, "{pod}: {want}");
        } else {
            assert!(plan.first_tier.is_empty(), "{pod} serves no adapter prefix");
        }
    }
    // unscoped models still spread over every pod
    let scope = PlanScope {
        scoped: &ScopedCandidates::new(),
        groups: &SemanticGroups::new(),
    };
    let plan = plan_warmup_scoped("pod-0", &all, scope, &[], &prefixes, &config);
    assert!(!plan.first_tier.is_empty());
    assert_eq!(candidates_for(7, &all, &scoped).len(), 6);
}

#[test]
fn an_unknown_pod_gets_adapters_only_and_limits_apply() {
    let pods = ids(3);
    let plan = plan_warmup(
        "pod-x",
        &cands(&pods),
        &[],
        &hot(100, 2),
        &WarmupConfig::default(),
    );
    assert!(plan.first_tier.is_empty() && plan.lazy.is_empty());
    let config = WarmupConfig {
        first_tier: 2,
        second_tier: 3,
        max_candidates: 50,
        ..WarmupConfig::default()
    };
    let plan = plan_warmup("pod-0", &cands(&pods[..1]), &[], &hot(100, 2), &config);
    assert_eq!(
        (
            plan.first_tier.len(),
            plan.second_tier.len(),
            plan.lazy.len(),
            plan.considered
        ),
        (2, 3, 45, 50)
    );
}

fn small_plan() -> WarmupPlan {
    let keys: Vec<PrefixKey> = hot(12, 3).iter().map(|h| h.key).collect();
    WarmupPlan {
        pod: "pod-new".into(),
        adapters: vec!["a1".into(), "a2".into(), "a3".into()],
        first_tier: keys[..5].to_vec(),
        second_tier: keys[5..12].to_vec(),
        lazy: vec![],
        considered: 12,
    }
}

fn small_config() -> WarmupConfig {
    WarmupConfig {
        adapter_concurrency: 2,
        first_tier_concurrency: 2,
        second_tier_concurrency: 2,
        batch_size: 3,
        max_attempts: 2,
        deadline_ms: 60_000,
        ..WarmupConfig::default()
    }
}

fn calm() -> PodPressure {
    PodPressure::default()
}

#[test]
fn progress_walks_adapters_first_tier_then_second_tier_in_batches() {
    let plan = small_plan();
    let keys: Vec<PrefixKey> = plan
        .first_tier
        .iter()
        .chain(&plan.second_tier)
        .copied()
        .collect();
    let mut w = WarmupProgress::start(plan, small_config(), 1_000);
    let load = |a: &str| WarmupAction::LoadAdapter(a.into());
    let prefill = |i: usize| WarmupAction::Prefill(keys[i]);

    assert_eq!(w.phase(), WarmupPhase::Adapters);
    assert_eq!(w.next_actions(calm(), 1_000), vec![load("a1"), load("a2")]);
    assert_eq!(
        w.next_actions(calm(), 1_000),
        vec![],
        "concurrency 2 in flight"
    );
    w.completed(&load("a1"), 1_100);
    assert_eq!(w.next_actions(calm(), 1_100), vec![load("a3")]);
    assert!(!w.failed(&load("a2"), 1_200), "first failure: retried");
    assert_eq!(w.next_actions(calm(), 1_200), vec![load("a2")]);
    assert!(
        w.failed(&load("a2"), 1_300),
        "second failure: failed for good"
    );
    assert_eq!(
        w.next_actions(calm(), 1_300),
        vec![],
        "a3 still loading; prefixes wait for adapters"
    );
    w.completed(&load("a3"), 1_400);

    assert_eq!(w.phase(), WarmupPhase::FirstTier);
    assert!(!w.routable(1_400));
    assert_eq!(w.next_actions(calm(), 1_400), vec![prefill(0), prefill(1)]);
    w.completed(&prefill(0), 1_500);
    w.completed(&prefill(0), 1_500); // a duplicate report changes nothing
    assert_eq!(w.next_actions(calm(), 1_500), vec![prefill(2)]);
    w.skipped(&prefill(1), 1_600);
    w.completed(&prefill(2), 1_600);
    assert_eq!(w.next_actions(calm(), 1_600), vec![prefill(3), prefill(4)]);
    w.completed(&prefill(3), 1_700);
    assert!(!w.routable(1_700));
    w.completed(&prefill(4), 1_800);
    assert!(w.routable(1_800), "first tier finished");

    assert_eq!(w.phase(), WarmupPhase::SecondTier);
    assert_eq!(w.next_actions(calm(), 1_800), vec![prefill(5), prefill(6)]);
    w.completed(&prefill(5), 1_900);
    assert_eq!(
        w.next_actions(calm(), 1_900),
        vec![prefill(7)],
        "the rest of batch 1 only"
    );
    w.completed(&prefill(6), 2_000);
    assert_eq!(
        w.next_actions(calm(), 2_000),
        vec![],
        "batch 2 waits for batch 1"
    );
    w.completed(&prefill(7), 2_100);
    assert_eq!(w.next_actions(calm(), 2_100), vec![prefill(8), prefill(9)]);
    for i in 8..10 {
        w.completed(&prefill(i), 2_200);
    }
    assert_eq!(
        w.next_actions(calm(), 2_200),
        vec![prefill(10)],
        "the rest of batch 2"
    );
    w.completed(&prefill(10), 2_300);
    assert_eq!(
        w.next_actions(calm(), 2_300),
        vec![prefill(11)],
        "the last batch of 1"
    );
    w.completed(&prefill(11), 2_300);
    assert_eq!(w.phase(), WarmupPhase::Done);
    assert_eq!(w.next_actions(calm(), 2_300), vec![]);

    assert_eq!(
        w.first_tier_warmed(),
        vec![keys[0], keys[2], keys[3], keys[4]],
        "the first tier's prefilled keys, without the skipped one"
    );
    let s = w.status(2_300);
    assert_eq!(s.first_tier_done_ms, Some(1_800));
    assert_eq!(
        (
            s.adapters.done,
            s.adapters.failed,
            s.first_tier.done,
            s.first_tier.skipped,
            s.second_tier.done
        ),
        (2, 1, 4, 1, 7)
    );
    assert_eq!((s.attempt, s.started_ms, s.deadline_ms), (1, 1_000, 61_000));
}

#[test]
fn pressure_backs_concurrency_off() {
    let config = WarmupConfig {
        first_tier_concurrency: 8,
        ..small_config()
    };
    let cases = [
        (
            PodPressure {
                waiting: 0,
                kv_usage: 0.0,
            },
            5,
        ), // 8, but only 5 first-tier keys
        (
            PodPressure {
                waiting: 4,
                kv_usage: 0.0,
            },
            4,
        ),
        (
            PodPressure {
                waiting: 8,
                kv_usage: 0.0,
            },
            2,
        ),
        (
            PodPressure {
                waiting: 0,
                kv_usage: 0.9,
            },
            4,
        ),
        (
            PodPressure {
                waiting: 9,
                kv_usage: 0.9,
            },
            1,
        ),
        (
            PodPressure {
                waiting: 1_000,
                kv_usage: 1.0,
            },
            1,
        ),
    ];
    for (pressure, want) in cases {
        let mut plan = small_plan();
        plan.adapters.clear();
        let mut w = WarmupProgress::start(plan, config.clone(), 0);
        assert_eq!(w.next_actions(pressure, 0).len(), want, "{pressure:?}");
        assert_eq!(w.in_flight(), want);
    }
}

#[test]
fn the_deadline_admits_an_unfinished_pod() {
    let mut w = WarmupProgress::start(small_plan(), small_config(), 1_000);
    w.next_actions(calm(), 1_000);
    assert!(!w.routable(60_999));
    assert!(w.routable(61_000));
    assert_eq!(
        w.status(61_000).phase,
        WarmupPhase::Adapters,
        "work goes on after the deadline"
    );
}

#[test]
fn an_empty_plan_is_routable_at_once() {
    let plan = WarmupPlan {
        pod: "p".into(),
        adapters: vec![],
        first_tier: vec![],
        second_tier: vec![],
        lazy: vec![],
        considered: 0,
    };
    let w = WarmupProgress::start(plan, small_config(), 5);
    assert!(w.routable(5));
    assert_eq!(w.phase(), WarmupPhase::Done);
    assert_eq!(w.status(5).first_tier_done_ms, Some(5));
}

#[test]
fn a_pod_lost_mid_warmup_is_replanned_when_it_returns() {
    let mut w = WarmupProgress::start(small_plan(), small_config(), 0);
    let first = w.next_actions(calm(), 0);
    w.completed(&first[0], 10);
    w.pod_lost();
    assert_eq!(w.phase(), WarmupPhase::Interrupted);
    assert!(!w.routable(1_000_000), "a dead pod is never routable");
    assert!(w.next_actions(calm(), 20).is_empty());
    w.completed(&first[1], 30); // a late reply is ignored
    assert_eq!(w.status(30).adapters.done, 1);
    assert_eq!(w.status(30).adapters.in_flight, 0);
    let mut again = w.restarted(small_plan(), 5_000);
    assert_eq!(again.status(5_000).attempt, 2);
    assert_eq!(again.phase(), WarmupPhase::Adapters);
    assert_eq!(
        again.next_actions(calm(), 5_000).len(),
        2,
        "from scratch: the cache is cold"
    );
    assert_eq!(again.deadline_ms(), 65_000);
}

#[test]
fn config_validation_names_every_field() {
    assert!(WarmupConfig::default().validate("warmup.").is_empty());
    let bad = WarmupConfig {
        batch_size: 0,
        deadline_ms: 5,
        kv_usage_high: 2.0,
        ..WarmupConfig::default()
    };
    let p = bad.validate("warmup.");
    assert_eq!(p.len(), 3, "{p:?}");
    assert_eq!(p[0], "warmup.batch_size: 0: must be between 1 and 100000");
    assert!(p[1].starts_with("warmup.deadline_ms: 5:"));
    assert!(p[2].starts_with("warmup.kv_usage_high: 2:"));
    assert!(serde_json::from_str::<WarmupConfig>(r#"{"first_tire": 3}"#).is_err());
}

proptest! {
    /// The early-exit check agrees with core's `place` for every candidate, weights and ties
    /// included.
    #[test]
    fn wins_agrees_with_place(
        key in any::<u64>(),
        weights in proptest::collection::vec(prop::sample::select(vec![0.0, 0.5, 1.0, 1.0, 2.0]), 1..12),
        duplicate in any::<bool>(),
    ) {
        let mut names: Vec<String> = (0..weights.len()).map(|i| format!("pod-{i}")).collect();
        if duplicate && names.len() > 1 {
            names[1] = names[0].clone();
        }
        let candidates: Vec<PlacementCandidate<'_>> =
            names.iter().zip(&weights).map(|(n, w)| PlacementCandidate::new(n, *w)).collect();
        let placed = place(key, &candidates);
        for me in 0..candidates.len() {
            prop_assert_eq!(wins(key, me, &candidates), placed == Some(me), "me {}", me);
        }
    }

    /// Any interleaving of completions and failures finishes the warm-up, never exceeds the
    /// concurrency limit, and makes the pod routable exactly when the first tier is finished.
    #[test]
    fn progress_always_finishes_within_its_limits(outcomes in proptest::collection::vec(0u8..4, 1..200)) {
        let mut w = WarmupProgress::start(small_plan(), small_config(), 0);
        let mut in_flight: Vec<WarmupAction> = Vec::new();
        let mut outcomes = outcomes.into_iter().cycle();
        for step in 0..500u64 {
            in_flight.extend(w.next_actions(calm(), step));
            prop_assert!(in_flight.len() <= 2);
            prop_assert_eq!(w.in_flight(), in_flight.len());
            if in_flight.is_empty() {
                break;
            }
            let action = in_flight.remove(0);
            match outcomes.next().unwrap() {
                0 => { w.failed(&action, step); }
                _ => w.completed(&action, step),
            }
            let s = w.status(step);
            let first_finished = s.adapters.done + s.adapters.failed == 3
                && s.first_tier.done + s.first_tier.failed == 5;
            prop_assert_eq!(w.routable(step), first_finished);
        }
        prop_assert_eq!(w.phase(), WarmupPhase::Done);
    }
}
