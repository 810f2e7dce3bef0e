//! The prefixes the routing table places ([`super::prefix_placement`]): a prefix that reaches
//! the fingerprint's cut is warmed but never seeded.

use prewarm_core::fingerprint::shards_of;
use prewarm_core::prefix::PromptKeys;
use prewarm_core::wire::{ServedRecord, SignalBatch};
use prewarm_core::{BlockChain, FingerprintConfig};

use super::prefix_placement::COMMON_HOLDERS;
use super::restart_tests::hot_signal;
use super::*;
use crate::config::{GatewayConfig, PodSpec};

/// The keys a prefix of `text` is seeded by.
fn placed_keys(text: &str) -> Vec<u64> {
    let fp = FingerprintConfig::default();
    PromptKeys::of(&BlockChain::of("base", text.as_bytes(), &fp), &fp).placed()
}

/// A fleet of `pods` pods (`p0`, `p1`, …), each up and warming from 1 s.
fn fleet_warming(pods: usize) -> Fleet {
    let config = GatewayConfig::default();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    for i in 0..pods {
        let id = format!("p{i}");
        let spec = PodSpec::new(id.clone(), format!("10.0.0.{i}:8000"));
        fleet.add_pod(config.pod_shape(&spec), 1_000).unwrap();
        let check = HealthCheck {
            ok: true,
            load: Some(PodLoad::default()),
            process_start_s: None,
        };
        fleet.on_check(&id, check, 1_000);
        fleet.on_models(&id, Vec::new(), 1_000);
        assert!(fleet.start_warmup(&id, 1_000));
    }
    fleet
}

/// The table's placed prefixes once two pods warmed `texts` and keep-warm ran.
fn placed_after_warming(texts: &[String]) -> Vec<Vec<u64>> {
    let mut fleet = fleet_warming(2);
    let hot = texts.iter().map(|t| hot_signal(t)).collect();
    let (ack, mut actions) = fleet.on_signals(SignalBatch::new("test", 0, hot), 2_000);
    assert_eq!(ack.prefills, texts.len(), "{ack:?}");
    let mut now = 2_000;
    for _ in 0..200 {
        actions = answer_and_tick(&mut fleet, actions, now);
        now += TICK_MS;
    }
    fleet
        .table()
        .prefixes
        .iter()
        .map(|p| p.keys.iter().map(|k| k.0).collect())
        .collect()
}

#[test]
fn a_prefix_reaching_the_fingerprint_cut_is_not_seeded() {
    let short: String = (0..600).map(|i| format!("short{i} ")).collect();
    // 32,768 tokens (4 bytes a token), the fingerprint's cut: an agent session's context,
    // as the filter signals the head of a longer prompt
    let mut long: String = (0..20_000).map(|i| format!("long{i} ")).collect();
    long.truncate(4 * 32_768);
    let placed = placed_after_warming(&[short.clone(), long.clone()]);
    assert!(placed.contains(&placed_keys(&short)), "{placed:?}");
    assert!(!placed.contains(&placed_keys(&long)));
}

/// A hot prefix as the KV model holds it: on the pod its signal warmed it on, then served on
/// more pods.
#[test]
fn a_hot_prefixs_holders_are_the_pods_every_shard_is_modelled_on() {
    let mut fleet = fleet_warming(4);
    let fp = FingerprintConfig::default();
    let text: String = (0..600).map(|i| format!("shared{i} ")).collect();
    let chain = BlockChain::of("base", text.as_bytes(), &fp);
    let holders_of = |fleet: &Fleet| {
        let hot = fleet.hot_prefixes(10);
        assert_eq!(hot.len(), 1, "{hot:?}");
        (hot[0].holders, hot[0].fleet_wide)
    };
    let (ack, _) = fleet.on_signals(SignalBatch::new("test", 0, vec![hot_signal(&text)]), 2_000);
    assert_eq!(ack.prefills, 1);
    let mut now = 2_000;
    let mut served_on = Vec::new();
    for pod in ["p0", "p1", "p2", "p3"] {
        now += 1_000;
        let mut served = SignalBatch::new("test", 0, Vec::new());
        served.served = vec![ServedRecord::of(pod, "base", &chain, now - 100, &fp)];
        fleet.on_signals(served, now);
        served_on.push(pod);
        let on = fleet
            .pods()
            .filter(|p| p.kv.shards_resident(&shards_of(&chain.blocks, &fp)))
            .count();
        let (holders, fleet_wide) = holders_of(&fleet);
        assert_eq!(holders, on.min(COMMON_HOLDERS), "served on {served_on:?}");
        assert_eq!(fleet_wide, on >= COMMON_HOLDERS, "served on {served_on:?}");
    }
}

/// Answers every call of `actions` at once at `now`, then ticks.
fn answer_and_tick(fleet: &mut Fleet, actions: Vec<Action>, now: u64) -> Vec<Action> {
    for action in actions {
        match action {
            Action::Prefill(p) => fleet.prefill_done(&p, PrefillOutcome::Ok, now),
            Action::Adapters(calls) => fleet.adapters_done(&calls, &[], now),
        }
    }
    fleet.tick(now + TICK_MS)
}

#[test]
fn a_joining_pod_is_listed_with_the_prefixes_its_warm_up_prefilled() {
    let config = GatewayConfig::default();
    let mut fleet = fleet_warming(2);
    let texts: Vec<String> = (0..24)
        .map(|t| (0..600).map(|i| format!("template{t} word{i} ")).collect())
        .collect();
    let hot = texts.iter().map(|t| hot_signal(t)).collect();
    let (_, mut actions) = fleet.on_signals(SignalBatch::new("test", 0, hot), 2_000);
    let mut now = 2_000;
    for _ in 0..100 {
        actions = answer_and_tick(&mut fleet, actions, now);
        now += TICK_MS;
    }
    let spec = PodSpec::new("p2".to_string(), "10.0.0.2:8000".to_string());
    fleet.add_pod(config.pod_shape(&spec), now).unwrap();
    let check = HealthCheck {
        ok: true,
        load: Some(PodLoad::default()),
        process_start_s: None,
    };
    fleet.on_check("p2", check, now);
    fleet.on_models("p2", Vec::new(), now);
    assert!(fleet.start_warmup("p2", now));
    // tick by tick until the table lists it: that table already names it for the prefixes it
    // won, though no keep-warm period came due since it joined (they run a second apart)
    let listed = |fleet: &Fleet| fleet.table().pods.iter().any(|p| p.id == "p2");
    let mut ticks = 0;
    while !listed(&fleet) && ticks < 100 {
        actions = answer_and_tick(&mut fleet, actions, now);
        now += TICK_MS;
        ticks += 1;
    }
    assert!(listed(&fleet), "the joining pod never became routable");
    let on_new = fleet
        .table()
        .prefixes
        .iter()
        .filter(|p| p.pod == "p2")
        .count();
    assert!(
        on_new > 0,
        "after {ticks} ticks: {:?}",
        fleet.table().prefixes
    );
}
