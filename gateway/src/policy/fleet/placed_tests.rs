//! The prefixes the routing table places ([`super::prefix_placement`]): a prefix that reaches
//! the fingerprint's cut is warmed but never seeded.

use prewarm_core::prefix::PromptKeys;
use prewarm_core::wire::SignalBatch;
use prewarm_core::{BlockChain, FingerprintConfig};

use super::restart_tests::hot_signal;
use super::*;
use crate::config::{GatewayConfig, PodSpec};

/// The keys a prefix of `text` is seeded by.
fn placed_keys(text: &str) -> Vec<u64> {
    let fp = FingerprintConfig::default();
    PromptKeys::of(&BlockChain::of("base", text.as_bytes(), &fp), &fp).placed()
}

/// The table's placed prefixes once two pods warmed `texts` and keep-warm ran.
fn placed_after_warming(texts: &[String]) -> Vec<Vec<u64>> {
    let config = GatewayConfig::default();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    for i in 0..2 {
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
    let hot = texts.iter().map(|t| hot_signal(t)).collect();
    let (ack, mut actions) = fleet.on_signals(SignalBatch::new("test", 0, hot), 2_000);
    assert_eq!(ack.prefills, texts.len(), "{ack:?}");
    let mut now = 2_000;
    for _ in 0..200 {
        for action in actions {
            match action {
                Action::Prefill(p) => fleet.prefill_done(&p, PrefillOutcome::Ok, now),
                Action::Adapters(calls) => fleet.adapters_done(&calls, &[], now),
            }
        }
        now += TICK_MS;
        actions = fleet.tick(now);
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
