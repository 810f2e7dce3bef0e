//! Warm calls in their traffic's shape: a prefill carries its entry's endpoint, text and shape
//! (shared with the pool); an entry whose warm call an engine rejected backs off instead of
//! being sent again every keep-warm period; an entry whose salt a snapshot dropped is not
//! warmed until a signal brings the salt.

use std::sync::Arc;

use prewarm_core::wire::{Signal, SignalBatch};
use prewarm_core::Endpoint;

use super::*;
use crate::config::{GatewayConfig, PodSpec};
use crate::policy::hotness::shape_tests::{chat_prefix, signal, SALT, TOOLS};
use crate::policy::hotness::PromptRecord;
use crate::policy::PrefixKey;

const PERIOD: u64 = 60_000;

/// One pod `p0`, up and (nothing to warm) routable from `now`.
fn fleet_at(now: u64) -> Fleet {
    let mut config = GatewayConfig::default();
    config.pods.adapter_replicas = 1;
    let mut fleet = Fleet::new(config.fleet(), now, 0);
    add_up_pod(&mut fleet, &config, now);
    fleet
}

fn add_up_pod(fleet: &mut Fleet, config: &GatewayConfig, now: u64) {
    let spec = PodSpec::new("p0", "10.0.0.1:8000");
    fleet.add_pod(config.pod_shape(&spec), now).unwrap();
    assert!(matches!(
        fleet.on_health("p0", true, Some(PodLoad::default()), now),
        HealthChange::Joined(_)
    ));
    fleet.on_models("p0", Vec::new(), now);
    assert!(fleet.start_warmup("p0", now));
}

fn signalled(fleet: &mut Fleet, text: &str, shape_salt: Option<&str>, now: u64) -> Vec<Action> {
    let (_, shape) = chat_prefix(shape_salt, TOOLS);
    let batch = SignalBatch::new("t", 0, vec![Signal::Prefill(signal(text, Some(shape)))]);
    let (report, actions) = fleet.on_signals(batch, now);
    assert_eq!(report.prefills, 1, "{:?}", report.reasons);
    actions
}

fn prefills_of(actions: &[Action], key: PrefixKey) -> Vec<Prefill> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Prefill(p) if p.key == key => Some(p.clone()),
            _ => None,
        })
        .collect()
}

fn decisions(fleet: &mut Fleet, decision: &str) -> u64 {
    fleet
        .take_notes()
        .iter()
        .map(|n| match n {
            Note::Decision {
                policy: "pool",
                decision: d,
                count,
            } if *d == decision => *count,
            _ => 0,
        })
        .sum()
}

/// Ticks every 100 ms from `from` to `to` (keep-warm every second); the prefills of `key`.
fn ticks(fleet: &mut Fleet, from: u64, to: u64, key: PrefixKey) -> Vec<Prefill> {
    let mut sent = Vec::new();
    let mut now = from;
    while now < to {
        sent.extend(prefills_of(&fleet.tick(now), key));
        now += TICK_MS;
    }
    sent
}

#[test]
fn a_chat_entrys_prefill_carries_its_endpoint_and_its_shape_shared_with_the_pool() {
    let mut fleet = fleet_at(1_000);
    let (text, shape) = chat_prefix(Some(SALT), TOOLS);
    let actions = signalled(&mut fleet, &text, Some(SALT), 2_000);
    let key = fleet.pool().top(1)[0].key;
    let sent = prefills_of(&actions, key);
    assert_eq!(sent.len(), 1, "a new pattern is prefilled at once");
    let p = &sent[0];
    assert_eq!(p.endpoint, Endpoint::ChatCompletions);
    assert_eq!(p.shape.as_ref().map(|s| s.get()), Some(&shape));
    let pooled = fleet.pool().shared_text(&key).unwrap();
    assert!(
        Arc::ptr_eq(&p.text, &pooled),
        "the text is shared, not copied"
    );
    let pooled_shape = fleet.pool().get(&key).unwrap().shape.cloned().unwrap();
    assert!(std::ptr::eq(
        p.shape.as_ref().unwrap().get(),
        pooled_shape.get()
    ));
    assert!(
        !format!("{p:?}").contains(SALT),
        "an action's Debug shows no salt"
    );
}

#[test]
fn a_rejected_prefill_backs_the_entry_off_and_is_not_sent_again_until_it_ends() {
    let mut fleet = fleet_at(1_000);
    let (text, _) = chat_prefix(None, TOOLS);
    let actions = signalled(&mut fleet, &text, None, 2_000);
    let key = fleet.pool().top(1)[0].key;
    let first = prefills_of(&actions, key).pop().expect("prefilled");
    fleet.prefill_done(&first, PrefillOutcome::Rejected, 2_100);
    assert_eq!(decisions(&mut fleet, "back_off"), 1);
    assert_eq!(fleet.pool().get(&key).unwrap().rejections, 1);
    // Every keep-warm period finds it evicted and due: not sent, counted.
    let during = ticks(&mut fleet, 2_200, 2_100 + PERIOD, key);
    assert!(during.is_empty(), "sent while backing off: {during:?}");
    assert!(decisions(&mut fleet, "backed_off") >= 50);
    let after = ticks(&mut fleet, 2_100 + PERIOD, 2_100 + PERIOD + 2_000, key);
    assert_eq!(after.len(), 1, "sent again once the back-off is over");
    // Rejected again: two periods this time.
    fleet.prefill_done(&after[0], PrefillOutcome::Rejected, 2_100 + PERIOD + 2_000);
    let until = fleet.pool().get(&key).unwrap().backoff_until_ms;
    assert_eq!(until, 2_100 + 3 * PERIOD + 2_000);

    // A failure that is not a rejection (a timeout, a 5xx) is tried again next period.
    let mut fleet = fleet_at(1_000);
    let actions = signalled(&mut fleet, &text, None, 2_000);
    let first = prefills_of(&actions, key).pop().expect("prefilled");
    fleet.prefill_done(&first, PrefillOutcome::Failed, 2_100);
    assert_eq!(ticks(&mut fleet, 2_200, 4_200, key).len(), 1);
    assert_eq!(fleet.pool().get(&key).unwrap().rejections, 0);
}

#[test]
fn an_entry_whose_salt_a_snapshot_dropped_is_not_warmed_until_a_signal_brings_it() {
    let mut before = fleet_at(1_000);
    let (text, salted) = chat_prefix(Some(SALT), TOOLS);
    signalled(&mut before, &text, Some(SALT), 2_000);
    let key = before.pool().top(1)[0].key;
    let json = serde_json::to_string(&before.pool().export_shared()).unwrap();
    assert!(!json.contains(SALT));
    let records: Vec<PromptRecord> = serde_json::from_str(&json).unwrap();

    // A restarted gateway: the pool restored, then the pod joins and plans its warm-up.
    let mut config = GatewayConfig::default();
    config.pods.adapter_replicas = 1;
    let mut after = Fleet::new(config.fleet(), 10_000, 0);
    assert!(after.pool_mut().restore(records, 10_000).is_empty());
    add_up_pod(&mut after, &config, 10_000);
    let plan = after.plan_for("p0", Candidates::Live, 10_000).unwrap();
    assert!(plan.first_tier.contains(&key), "planned: {plan:?}");
    let warmed = ticks(&mut after, 10_000, 15_000, key);
    assert!(warmed.is_empty(), "warmed without its salt: {warmed:?}");
    assert!(decisions(&mut after, "salt_dropped") >= 1);

    // The traffic signals it again, salted: warmed at once, with the salt.
    let actions = signalled(&mut after, &text, Some(SALT), 16_000);
    let sent = prefills_of(&actions, key);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].shape.as_ref().map(|s| s.get()), Some(&salted));
    assert_eq!(
        sent[0].shape.as_ref().and_then(|s| s.cache_salt.as_deref()),
        Some(SALT)
    );
}
