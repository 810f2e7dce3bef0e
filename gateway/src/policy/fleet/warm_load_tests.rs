//! The load and queue wait the table publishes for a joining pod: its first-tier warm calls are
//! the gateway's own requests, over when it enters the table, and must not send the traffic it
//! was warmed for elsewhere. Found on real vLLM on a loaded CI machine: the warm calls queued,
//! the new pod entered the table with a predicted wait above the price of moving a request,
//! and none of the prefixes warmed on it were routed there.

use prewarm_core::wire::{Signal, SignalBatch};

use super::tests::{prefill_signal, text};
use super::*;
use crate::config::{GatewayConfig, PodSpec};

/// A check that finds `running` requests on the pod and `waiting` more queued behind them,
/// `finished` completed since it started.
fn busy(running: u64, waiting: u64, finished: u64) -> PodLoad {
    PodLoad {
        running,
        waiting,
        request_successes: Some(finished),
        ..PodLoad::default()
    }
}

/// `p0` serving hot prompts, and `new` joining and warmed with health checks every 100 ms that
/// find its warm calls running and queued; returns the fleet, the time `new` became routable
/// and the warm calls it received.
fn join_with_queued_warm_calls() -> (Fleet, u64, usize) {
    let config = GatewayConfig::default();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    fleet
        .add_pod(
            config.pod_shape(&PodSpec::new("p0", "10.0.0.0:8000")),
            1_000,
        )
        .unwrap();
    fleet.on_health("p0", true, Some(PodLoad::default()), 1_000);
    assert!(fleet.start_warmup("p0", 1_000));
    let signals: Vec<Signal> = (0..16).map(|i| prefill_signal("base", &text(i))).collect();
    fleet.on_signals(SignalBatch::new("test", 0, signals), 2_000);

    fleet
        .add_pod(
            config.pod_shape(&PodSpec::new("new", "10.0.0.1:8000")),
            3_000,
        )
        .unwrap();
    fleet.on_health("new", true, Some(busy(0, 0, 0)), 3_000);
    fleet.on_models("new", Vec::new(), 3_000);
    assert!(fleet.start_warmup("new", 3_000));
    let (mut now, mut warmed, mut finished) = (3_000, 0usize, 0u64);
    let mut in_flight: Vec<Action> = Vec::new();
    while !fleet.pod("new").unwrap().routable(now) {
        assert!(now < 120_000, "the first tier never finished");
        now += 100;
        // The engine runs one warm call at a time and queues the others: a long queue for a
        // slow engine, and a health check that sees it.
        let queued = in_flight.len() as u64;
        fleet.on_health("new", true, Some(busy(1, queued, finished)), now);
        if let Some(Action::Prefill(p)) = in_flight.pop() {
            fleet.prefill_done(&p, PrefillOutcome::Ok, now);
            finished += 1;
        }
        for action in fleet.tick(now) {
            if matches!(&action, Action::Prefill(p) if p.pod == "new") {
                warmed += 1;
                in_flight.push(action);
            }
        }
    }
    (fleet, now, warmed)
}

fn published(fleet: &Fleet, id: &str) -> (Option<f64>, Option<u64>) {
    let row = fleet.table().pods.iter().find(|p| p.id == id).unwrap();
    (row.load, row.wait_ms)
}

#[test]
fn a_pod_enters_the_table_without_the_load_and_wait_of_its_own_warm_up() {
    let (mut fleet, now, warmed) = join_with_queued_warm_calls();
    assert!(
        warmed > 1,
        "the join warmed {warmed} prefixes: too few to queue"
    );
    // Its next check finds it idle: the warm-up is over.
    fleet.on_health("new", true, Some(busy(0, 0, warmed as u64)), now + 100);
    fleet.rebuild_table(now + 100);
    let (load, wait) = published(&fleet, "new");
    assert_eq!(load, Some(0.0), "the warm calls' busy checks count as load");
    assert!(
        wait.is_none_or(|w| w == 0),
        "the warm calls' queue counts as a wait: {wait:?}"
    );
}

#[test]
fn a_routed_pod_s_queue_counts() {
    let (mut fleet, now, warmed) = join_with_queued_warm_calls();
    let mut t = now;
    for i in 1..=20u64 {
        t += 1_000;
        fleet.on_health("new", true, Some(busy(4, 6, warmed as u64 + i)), t);
    }
    fleet.rebuild_table(t);
    let (load, wait) = published(&fleet, "new");
    assert_eq!(load, Some(1.0));
    assert!(wait.is_some_and(|w| w > 1_000), "{wait:?}");
}
