//! Which pods the table lists while they are warmed: a pod that was already serving when the
//! gateway (re)started stays routable while it is re-warmed; a pod that joins waits for its
//! first tier, whatever it served before. Found designing the gateway standby (docs/deploy.md
//! §10): after a gateway restart every pod's first good check is a join, and every pod of a
//! serving fleet left the table until its first tier was warmed again.

use prewarm_core::wire::{Signal, SignalBatch};

use super::tests::{prefill_signal, text};
use super::*;
use crate::config::{GatewayConfig, PodSpec};

fn served(requests: u64) -> Option<PodLoad> {
    Some(PodLoad {
        request_successes: Some(requests),
        ..PodLoad::default()
    })
}

/// A gateway that has just started with a restored pool of 16 hot prompts, and pod `p0` up in
/// its first health round with `p0_served` requests served before.
fn restarted_gateway(p0_served: u64) -> (Fleet, GatewayConfig) {
    let config = GatewayConfig::default();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    let signals: Vec<Signal> = (0..16).map(|i| prefill_signal("base", &text(i))).collect();
    fleet.on_signals(SignalBatch::new("test", 0, signals), 1_000);
    fleet
        .add_pod(
            config.pod_shape(&PodSpec::new("p0", "10.0.0.0:8000")),
            1_000,
        )
        .unwrap();
    fleet.on_health("p0", true, served(p0_served), 2_000);
    fleet.on_models("p0", Vec::new(), 2_000);
    assert!(fleet.start_warmup("p0", 2_000));
    (fleet, config)
}

fn prefills_for(fleet: &mut Fleet, pod: &str, now: u64) -> usize {
    fleet
        .tick(now)
        .iter()
        .filter(|a| matches!(a, Action::Prefill(p) if p.pod == pod))
        .count()
}

#[test]
fn a_pod_serving_before_the_gateway_started_stays_routable_while_it_is_rewarmed() {
    let (mut fleet, _) = restarted_gateway(500);
    assert!(fleet.pod("p0").unwrap().routable(2_000));
    assert!(fleet.table().pods.iter().any(|p| p.id == "p0"));
    assert!(
        prefills_for(&mut fleet, "p0", 2_100) > 0,
        "it is warmed all the same"
    );
}

#[test]
fn a_pod_that_never_served_waits_for_its_first_tier_even_in_the_first_round() {
    let (mut fleet, _) = restarted_gateway(0);
    assert!(!fleet.pod("p0").unwrap().routable(2_000));
    assert!(prefills_for(&mut fleet, "p0", 2_100) > 0);
}

#[test]
fn a_pod_joining_after_the_first_round_waits_for_its_first_tier_whatever_it_served() {
    let (mut fleet, config) = restarted_gateway(500);
    fleet.settle();
    fleet
        .add_pod(
            config.pod_shape(&PodSpec::new("p1", "10.0.0.1:8000")),
            3_000,
        )
        .unwrap();
    fleet.on_health("p1", true, served(500), 3_000);
    fleet.on_models("p1", Vec::new(), 3_000);
    assert!(fleet.start_warmup("p1", 3_000));
    assert!(!fleet.pod("p1").unwrap().routable(3_000));
    assert!(prefills_for(&mut fleet, "p1", 3_100) > 0);
}
