//! Restarts as joins ([`super::restart`]): a pod that restarted while up is out of the table,
//! its models forgotten, until it is warmed like a joining pod — and nothing else is a restart.

use prewarm_core::wire::{PatternState, PrefillSignal, ServedRecord, Signal, SignalBatch};
use prewarm_core::{BlockChain, Endpoint, FingerprintConfig};

use super::*;
use crate::config::{GatewayConfig, PodSpec};
use crate::policy::{Tier, WarmupAction};

fn config() -> GatewayConfig {
    let mut c = GatewayConfig::default();
    c.pods.adapter_replicas = 1;
    c
}

fn text(seed: usize) -> String {
    (0..600).map(|i| format!("r{seed}x{i} ")).collect()
}

/// A new hot-prefix signal for `text` (also the placed prefixes' tests').
pub(super) fn hot_signal(text: &str) -> Signal {
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of("base", text.as_bytes(), &fp);
    Signal::Prefill(PrefillSignal {
        model: "base".into(),
        tenant: None,
        endpoint: Endpoint::Completions,
        prefix_tokens: chain.blocks.len() * fp.block_tokens,
        prefix: chain.blocks,
        prefix_text: text.into(),
        state: PatternState::New,
        priority: 50,
        keep_warm: true,
        shape: None,
    })
}

fn scrape(queries: u64, hits: u64) -> PodLoad {
    PodLoad {
        prefix_cache_queries: Some(queries),
        prefix_cache_hits: Some(hits),
        ..PodLoad::default()
    }
}

fn check(load: Option<PodLoad>, start: Option<f64>) -> HealthCheck {
    HealthCheck {
        ok: true,
        load,
        process_start_s: start,
    }
}

/// Pods `p0` and `p1`, up, warmed and routable, with 8 hot prefixes, the adapter `sql`
/// registered on `p0`, and `p0` having served traffic (its KV model holds shards); `p0`'s
/// scrapes so far: start time 100 s, 5 000 queried and 2 000 hit tokens.
fn warm_fleet() -> Fleet {
    let config = config();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    for i in 0..2 {
        let id = format!("p{i}");
        let mut spec = PodSpec::new(id.clone(), format!("10.0.0.{i}:8000"));
        spec.max_loras = 2;
        fleet.add_pod(config.pod_shape(&spec), 1_000).unwrap();
        let joined = fleet.on_check(&id, check(Some(scrape(5_000, 2_000)), Some(100.0)), 1_000);
        assert_eq!(joined, HealthChange::Joined(1), "the first check joins");
        fleet.on_models(&id, Vec::new(), 1_000);
        assert!(fleet.start_warmup(&id, 1_000));
    }
    fleet
        .registry_mut()
        .register_unverified("sql", "/adapters/sql", Tier::Bronze, false)
        .unwrap();
    fleet.on_models("p0", vec!["sql".into()], 1_500);
    let hot = (0..8).map(|s| hot_signal(&text(s))).collect();
    let (_, actions) = fleet.on_signals(SignalBatch::new("test", 0, hot), 2_000);
    complete(&mut fleet, actions, 2_050);
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of("base", text(0).as_bytes(), &fp);
    let mut served = SignalBatch::new("test", 1, Vec::new());
    served.served = vec![ServedRecord::of("p0", "base", &chain, 2_100, &fp)];
    fleet.on_signals(served, 2_200);
    fleet.tick(2_300);
    let p0 = fleet.pod("p0").unwrap();
    assert!(p0.routable(2_300) && p0.kv.resident_shards() > 0);
    assert_eq!(p0.lora.served().collect::<Vec<_>>(), ["sql"]);
    fleet.take_notes();
    fleet
}

fn complete(fleet: &mut Fleet, actions: Vec<Action>, now: u64) {
    for action in actions {
        match action {
            Action::Prefill(p) => fleet.prefill_done(&p, PrefillOutcome::Ok, now),
            Action::Adapters(calls) => fleet.adapters_done(&calls, &[], now),
        }
    }
}

fn listed(fleet: &Fleet, id: &str) -> bool {
    fleet.table().pods.iter().any(|p| p.id == id)
}

fn restarts_noted(fleet: &mut Fleet) -> Vec<(String, u64, RestartEvidence)> {
    fleet
        .take_notes()
        .into_iter()
        .filter_map(|n| match n {
            Note::Restarted {
                pod,
                epoch,
                evidence,
            } => Some((pod, epoch, evidence)),
            _ => None,
        })
        .collect()
}

/// Runs the fleet's warm-up steps until `id` is routable (every step succeeds); returns the
/// first-tier prefills it took.
fn warm_until_routable(fleet: &mut Fleet, id: &str, mut now: u64) -> usize {
    let mut first_tier = 0;
    for _ in 0..200 {
        now += TICK_MS;
        for action in fleet.tick(now) {
            match action {
                Action::Prefill(p) => {
                    if p.pod == id && matches!(p.cause, Cause::Warmup(WarmupAction::Prefill(_))) {
                        assert!(!listed(fleet, id), "routed before its first tier was warm");
                        first_tier += 1;
                    }
                    fleet.prefill_done(&p, PrefillOutcome::Ok, now);
                }
                Action::Adapters(calls) => fleet.adapters_done(&calls, &[], now),
            }
        }
        if fleet.pod(id).unwrap().routable(now) {
            return first_tier;
        }
    }
    panic!("{id} never became routable");
}

#[test]
fn a_pod_whose_counters_went_down_is_warmed_before_it_routes_again() {
    let mut fleet = warm_fleet();
    let change = fleet.on_check("p0", check(Some(scrape(40, 0)), None), 3_000);
    assert_eq!(change, HealthChange::Joined(2), "a new epoch, as a join");
    assert_eq!(
        restarts_noted(&mut fleet),
        [("p0".to_string(), 2, RestartEvidence::Counters)]
    );
    let p0 = fleet.pod("p0").unwrap();
    assert_eq!(p0.health, PodHealth::Up);
    assert!(!p0.routable(3_000) && !listed(&fleet, "p0"));
    assert_eq!(p0.kv.resident_shards(), 0, "its prefix cache is forgotten");
    assert_eq!(p0.lora.served().count(), 0, "its adapters are forgotten");
    assert_eq!(p0.restart.restarts(), 1);
    assert!(listed(&fleet, "p1"), "the other pod keeps routing");
    // the shell, as for any join: /v1/models, then the warm-up
    fleet.on_models("p0", Vec::new(), 3_000);
    assert!(fleet.start_warmup("p0", 3_000));
    assert!(!listed(&fleet, "p0"));
    let warmed = warm_until_routable(&mut fleet, "p0", 3_000);
    assert!(warmed > 0, "some of the 8 hot prefixes are p0's to warm");
    assert!(listed(&fleet, "p0"));
}

#[test]
fn the_first_scrape_is_a_baseline_not_a_restart() {
    // a gateway that starts beside pods that served for hours: their counters are high, and
    // their next scrapes (equal, then higher) are the same processes
    let config = config();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    fleet
        .add_pod(
            config.pod_shape(&PodSpec::new("p0", "10.0.0.1:8000")),
            1_000,
        )
        .unwrap();
    let first = fleet.on_check(
        "p0",
        check(Some(scrape(9_000_000, 7_000_000)), Some(50.0)),
        1_000,
    );
    assert_eq!(first, HealthChange::Joined(1));
    fleet.start_warmup("p0", 1_000);
    for (now, q, h) in [(2_000, 9_000_000, 7_000_000), (3_000, 9_000_100, 7_000_000)] {
        let change = fleet.on_check("p0", check(Some(scrape(q, h)), Some(50.0)), now);
        assert_eq!(change, HealthChange::Unchanged);
    }
    assert!(restarts_noted(&mut fleet).is_empty());
    assert_eq!(fleet.pod("p0").unwrap().restart.restarts(), 0);
    assert_eq!(fleet.pod("p0").unwrap().epoch, 1);
}

#[test]
fn a_changed_process_start_time_is_a_restart() {
    let mut fleet = warm_fleet();
    // the new process already counted more than the old one did: only its start time tells
    let change = fleet.on_check("p0", check(Some(scrape(9_000, 4_000)), Some(160.25)), 3_000);
    assert_eq!(change, HealthChange::Joined(2));
    assert_eq!(
        restarts_noted(&mut fleet),
        [("p0".to_string(), 2, RestartEvidence::StartTime)]
    );
    assert!(!listed(&fleet, "p0"));
    // the same start time again is the same process
    let again = fleet.on_check("p0", check(Some(scrape(9_100, 4_000)), Some(160.25)), 3_200);
    assert_eq!(again, HealthChange::Unchanged);
}

#[test]
fn a_restart_within_fewer_failed_checks_than_unhealthy_after_is_caught_by_the_next_good_one() {
    let mut fleet = warm_fleet();
    let unhealthy_after = fleet.config().unhealthy_after;
    assert!(unhealthy_after >= 2);
    let mut now = 3_000;
    for _ in 1..unhealthy_after {
        now += 100;
        let failed = HealthCheck::default();
        assert_eq!(fleet.on_check("p0", failed, now), HealthChange::Unchanged);
    }
    // answered, but without /metrics; then metrics without the counters: nothing to compare
    for load in [None, Some(PodLoad::default())] {
        now += 100;
        assert_eq!(
            fleet.on_check("p0", check(load, None), now),
            HealthChange::Unchanged
        );
    }
    assert!(fleet.pod("p0").unwrap().routable(now), "no evidence yet");
    now += 100;
    let change = fleet.on_check("p0", check(Some(scrape(0, 0)), None), now);
    assert_eq!(
        change,
        HealthChange::Joined(2),
        "compared with the last counters seen"
    );
    assert!(!listed(&fleet, "p0"));
}

#[test]
fn a_pod_back_from_down_joins_once_and_is_not_counted_a_restart() {
    let mut fleet = warm_fleet();
    let unhealthy_after = fleet.config().unhealthy_after;
    let mut now = 3_000;
    for _ in 0..unhealthy_after {
        now += 100;
        fleet.on_check("p0", HealthCheck::default(), now);
    }
    assert_eq!(fleet.pod("p0").unwrap().health, PodHealth::Down);
    now += 100;
    let back = fleet.on_check("p0", check(Some(scrape(0, 0)), Some(170.0)), now);
    assert_eq!(back, HealthChange::Joined(2));
    assert!(restarts_noted(&mut fleet).is_empty());
    assert_eq!(fleet.pod("p0").unwrap().restart.restarts(), 0);
    // its new counters and start time are the baseline
    now += 100;
    let next = fleet.on_check("p0", check(Some(scrape(10, 0)), Some(170.0)), now);
    assert_eq!(next, HealthChange::Unchanged);
}

#[test]
fn a_warm_call_of_the_life_before_the_restart_does_not_warm_the_new_one() {
    let mut fleet = warm_fleet();
    // new patterns are prefilled where the table routes them: one of them on p0
    let fresh = (100..116).map(|s| hot_signal(&text(s))).collect();
    let (_, actions) = fleet.on_signals(SignalBatch::new("test", 2, fresh), 2_500);
    let prefill = actions
        .into_iter()
        .find_map(|a| match a {
            Action::Prefill(p) if p.pod == "p0" => Some(p),
            _ => None,
        })
        .expect("a new pattern is prefilled on p0");
    fleet.on_check("p0", check(Some(scrape(0, 0)), None), 3_000);
    fleet.prefill_done(&prefill, PrefillOutcome::Ok, 3_100);
    assert!(!fleet.pod("p0").unwrap().kv.is_resident(&prefill.key));
}

#[test]
fn the_table_publishes_a_pods_queue_wait_and_a_restart_forgets_it() {
    let mut fleet = warm_fleet();
    let mut now = 3_000;
    for s in 0..20u64 {
        let load = PodLoad {
            waiting: 4,
            running: 8,
            request_successes: Some(100 + s * 2),
            ..scrape(5_000 + s, 2_000)
        };
        fleet.on_check("p1", check(Some(load), Some(100.0)), now);
        now += 1_000;
    }
    fleet.rebuild_table(now);
    let wait = |fleet: &Fleet, id: &str| {
        fleet
            .table()
            .pods
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.wait_ms)
    };
    // 4 queued, 2 finished a second: about 2 s, in steps of 100 ms
    let w = wait(&fleet, "p1").expect("p1 exports its completions");
    assert!((1_800..=2_200).contains(&w) && w % 100 == 0, "{w}");
    assert_eq!(wait(&fleet, "p0"), None, "p0 exports no completion counter");
    let restarted = fleet.on_check("p1", check(Some(scrape(40, 0)), Some(100.0)), now);
    assert!(matches!(restarted, HealthChange::Joined(_)));
    assert_eq!(fleet.pod("p1").unwrap().wait.wait_ms(now), None);
}
