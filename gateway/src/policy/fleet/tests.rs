//! The fleet core's decisions, each named after the property it keeps. Several pin down what the
//! gateway's shell and the evaluator once decided differently (see the module doc of each test).

use prewarm_core::fingerprint::{routing_key, shards_of};
use prewarm_core::route::route_request;
use prewarm_core::wire::{
    PatternState, PinSignal, PrefillSignal, ServedRecord, Signal, SignalBatch,
};
use prewarm_core::{BlockChain, BlockHash, Endpoint, FingerprintConfig};

use super::*;
use crate::config::{GatewayConfig, PodSpec};
use crate::policy::lora::ResidencyRule;
use crate::policy::{PrefixKey, Tier, WarmupAction};

fn gateway_config() -> GatewayConfig {
    let mut c = GatewayConfig::default();
    c.pods.adapter_replicas = 1;
    c
}

/// A fleet of `pods` pods `p0..`, each up (and, with no plan to warm, routable at once).
fn fleet_of(config: &GatewayConfig, pods: usize) -> Fleet {
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    for i in 0..pods {
        let mut spec = PodSpec::new(format!("p{i}"), format!("10.0.0.{i}:8000"));
        spec.max_loras = 2;
        fleet.add_pod(config.pod_shape(&spec), 1_000).unwrap();
        bring_up(&mut fleet, &format!("p{i}"), 1_000);
    }
    fleet
}

fn bring_up(fleet: &mut Fleet, id: &str, now: u64) {
    assert!(matches!(
        fleet.on_health(id, true, Some(PodLoad::default()), now),
        HealthChange::Joined(_)
    ));
    fleet.on_models(id, Vec::new(), now);
    assert!(fleet.start_warmup(id, now));
}

fn register(fleet: &mut Fleet, name: &str, tier: Tier, pinned: bool) {
    let path = format!("/adapters/{name}");
    fleet
        .registry_mut()
        .register_unverified(name, &path, tier, pinned)
        .unwrap();
}

pub(super) fn text(seed: usize) -> String {
    (0..600)
        .map(|i| format!("w{seed}x{i} "))
        .collect::<String>()
}

pub(super) fn prefill_signal(model: &str, text: &str) -> Signal {
    pattern_signal(model, text, PatternState::New)
}

fn pattern_signal(model: &str, text: &str, state: PatternState) -> Signal {
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of(model, text.as_bytes(), &fp);
    Signal::Prefill(PrefillSignal {
        model: model.into(),
        tenant: None,
        endpoint: Endpoint::Completions,
        prefix_tokens: chain.blocks.len() * fp.block_tokens,
        prefix: chain.blocks,
        prefix_text: text.into(),
        state,
        priority: 50,
        keep_warm: true,
        shape: None,
    })
}

fn batch(signals: Vec<Signal>) -> SignalBatch {
    SignalBatch::new("test", 0, signals)
}

fn warm_holders(fleet: &Fleet, key: &PrefixKey, now: u64) -> Vec<String> {
    fleet
        .pods()
        .filter(|p| p.kv.warm_prefixes(now).iter().any(|w| w.key == *key))
        .map(|p| p.shape.id.clone())
        .collect()
}

/// The shipped gateway never fed served traffic to its KV model (only the evaluator did).
#[test]
fn served_traffic_reaches_the_pods_kv_model() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 2);
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of("base", text(1).as_bytes(), &fp);
    let shards = shards_of(&chain.blocks, &fp);
    assert_eq!(fleet.pod("p0").unwrap().kv.resident_shards(), 0);
    let mut served = batch(Vec::new());
    served.served = vec![ServedRecord::of("p0", "base", &chain, 1_500, &fp)];
    fleet.on_signals(served.clone(), 2_000);
    assert_eq!(fleet.pod("p0").unwrap().kv.resident_shards(), shards.len());
    assert_eq!(fleet.pod("p1").unwrap().kv.resident_shards(), 0);
    // The same chain again is a modelled hit.
    fleet.on_signals(served, 3_000);
    assert!(fleet.pod("p0").unwrap().kv.hit_ratio().unwrap() > 0.4);
}

/// The evaluator warmed a signalled prefix on the pod that served it; the gateway where the
/// filter routes it. Both now warm it where the table routes it.
#[test]
fn a_signalled_hot_prefix_is_warmed_where_the_filter_routes_it() {
    let config = gateway_config();
    for seed in 0..8 {
        let mut fleet = fleet_of(&config, 4);
        fleet.rebuild_table(1_000);
        let t = text(seed);
        fleet.on_signals(batch(vec![prefill_signal("base", &t)]), 2_000);
        let chain = BlockChain::of("base", t.as_bytes(), &FingerprintConfig::default());
        let key = PrefixKey::new("base", *chain.blocks.last().unwrap());
        let rk = routing_key(&chain.blocks, &FingerprintConfig::default()).unwrap();
        let (routed, _) = route_request(fleet.table(), "base", rk.0).unwrap();
        assert_eq!(warm_holders(&fleet, &key, 2_000), vec![routed.id.clone()]);
    }
}

/// The gateway ignored a prefix the pool had retired, so it kept its slot of the warm budget;
/// it now leaves the warm set at the next keep-warm.
#[test]
fn a_retired_prefix_leaves_the_warm_set() {
    let mut config = gateway_config();
    config.hotness.max_entries = 1;
    let mut fleet = fleet_of(&config, 1);
    fleet.on_signals(batch(vec![prefill_signal("base", &text(1))]), 2_000);
    let chain = BlockChain::of("base", text(1).as_bytes(), &FingerprintConfig::default());
    let first = PrefixKey::new("base", *chain.blocks.last().unwrap());
    assert_eq!(warm_holders(&fleet, &first, 2_000), vec!["p0".to_string()]);
    // A second hot prefix evicts the first from the pool (one entry at most).
    fleet.on_signals(batch(vec![prefill_signal("base", &text(2))]), 3_000);
    assert!(fleet.pool().get(&first).is_none());
    let actions = fleet.tick(10_000);
    assert!(actions
        .iter()
        .all(|a| !matches!(a, Action::Prefill(p) if p.key == first)));
    assert!(warm_holders(&fleet, &first, 10_000).is_empty());
}

/// The evaluator ordered a plan's adapters by tier then name; the gateway pinned first.
#[test]
fn a_plan_loads_pinned_adapters_first_then_by_tier() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 1);
    register(&mut fleet, "bronze-pinned", Tier::Bronze, true);
    register(&mut fleet, "a-silver", Tier::Silver, false);
    register(&mut fleet, "z-gold", Tier::Gold, false);
    register(&mut fleet, "b-bronze", Tier::Bronze, false);
    let plan = fleet.plan_for("p0", Candidates::All, 2_000).unwrap();
    assert_eq!(
        plan.adapters,
        vec!["bronze-pinned", "z-gold", "a-silver", "b-bronze"]
    );
}

/// The evaluator placed pins among routable pods only; the gateway among the pods that are up,
/// so a warming pod that an adapter is placed on gets the pin too.
#[test]
fn a_pin_reaches_a_warming_pod_the_adapter_is_placed_on() {
    let config = gateway_config();
    let mut fleet = Fleet::new(config.fleet(), 0, 0);
    fleet
        .add_pod(config.pod_shape(&PodSpec::new("w", "10.0.0.9:8000")), 0)
        .unwrap();
    register(&mut fleet, "sql", Tier::Gold, false);
    fleet.on_signals(batch(vec![prefill_signal("base", &text(3))]), 100);
    fleet.on_health("w", true, None, 200);
    fleet.start_warmup("w", 200);
    assert!(!fleet.pod("w").unwrap().routable(200), "still warming");
    let pin = Signal::Pin(PinSignal {
        adapter: "sql".into(),
        tenant: None,
        rate_per_minute: 10.0,
        priority: 90,
    });
    let (_, actions) = fleet.on_signals(batch(vec![pin]), 300);
    assert!(actions.iter().any(|a| a.pod() == "w"));
}

/// A reply from a pod's earlier life never edits the model of its new one.
#[test]
fn a_completion_from_an_older_epoch_is_ignored() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 1);
    let known = pattern_signal("base", &text(4), PatternState::Known);
    fleet.on_signals(batch(vec![known]), 2_000);
    let prefill = fleet
        .tick(5_000)
        .into_iter()
        .find_map(|a| match a {
            Action::Prefill(p) => Some(p),
            _ => None,
        })
        .expect("keep-warm prefills the signalled prefix");
    for t in 0..config.pods.unhealthy_after {
        fleet.on_health("p0", false, None, 6_000 + u64::from(t));
    }
    bring_up(&mut fleet, "p0", 7_000);
    fleet.prefill_done(&prefill, PrefillOutcome::Ok, 7_100);
    assert!(!fleet.pod("p0").unwrap().kv.is_resident(&prefill.key));
}

/// The model ages by what the pod computed that no record told it of — once the excess has
/// lasted `KV_WINDOW` scrapes, so that records still on their way are not counted twice — and
/// the gap between its hit ratio and the pod's is measured over the last `KV_GAP_WINDOW`.
#[test]
fn prefix_cache_counters_reconcile_the_kv_model() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 1);
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of("base", text(6).as_bytes(), &fp);
    let record = ServedRecord::of("p0", "base", &chain, 1_200, &fp);
    let chained = record.chained_tokens;
    let mut served = batch(Vec::new());
    served.served = vec![record];
    let load = |q: u64, h: u64| PodLoad {
        prefix_cache_queries: Some(q),
        prefix_cache_hits: Some(h),
        ..PodLoad::default()
    };
    let mut now = 2_000;
    let mut scrape = |fleet: &mut Fleet, q: u64, h: u64, times: usize| {
        for _ in 0..times {
            now += 100;
            fleet.on_health("p0", true, Some(load(q, h)), now);
        }
    };
    scrape(&mut fleet, 0, 0, 1);
    fleet.on_signals(served.clone(), 2_150);
    fleet.on_signals(served, 2_160);
    // The pod saw the same 2 requests but hit none of them (say it evicted in between).
    assert_eq!(
        fleet.pod("p0").unwrap().kv_hit_gap,
        None,
        "no scrape saw them"
    );
    scrape(&mut fleet, 2 * chained, 0, 1);
    let gap = fleet.pod("p0").unwrap().kv_hit_gap.unwrap();
    assert!(gap > 0.4, "modelled ~0.5 hit, observed 0: gap {gap}");
    // Tokens no record told of: a whole cache's worth ages every modelled shard, but only once
    // the excess has lasted the window.
    let resident = fleet.pod("p0").unwrap().kv.resident_shards();
    assert!(resident > 0);
    let capacity = config.kv.capacity_blocks * config.kv.block_tokens as u64;
    scrape(&mut fleet, 2 * chained + capacity, 0, KV_WINDOW - 1);
    assert_eq!(fleet.pod("p0").unwrap().kv.resident_shards(), resident);
    scrape(&mut fleet, 2 * chained + capacity, 0, 1);
    assert_eq!(fleet.pod("p0").unwrap().kv.resident_shards(), 0);
}

/// One pod `p0` with 8 hot prefixes, and pod `new` that joined at 3 000 and started its warm-up.
fn fleet_with_a_joining_pod(config: &GatewayConfig) -> Fleet {
    let mut fleet = fleet_of(config, 1);
    let hot = (10..18).map(|s| prefill_signal("base", &text(s))).collect();
    fleet.on_signals(batch(hot), 2_000);
    let mut spec = PodSpec::new("new", "10.0.0.7:8000");
    spec.max_loras = 2;
    fleet.add_pod(config.pod_shape(&spec), 3_000).unwrap();
    fleet.on_health("new", true, None, 3_000);
    fleet.start_warmup("new", 3_000);
    fleet
}

/// Pod `p0` serving 8 registered adapters with 4 hot prefixes each: the fleet, the adapters, and
/// each hot prefix's adapter, key and routing key.
fn fleet_with_hot_adapter_prefixes(
    config: &GatewayConfig,
) -> (Fleet, Vec<String>, Vec<(String, PrefixKey, BlockHash)>) {
    let mut fleet = fleet_of(config, 1);
    let adapters: Vec<String> = (0..8).map(|i| format!("lora-{i}")).collect();
    for a in &adapters {
        register(&mut fleet, a, Tier::Bronze, false);
    }
    fleet.on_models("p0", adapters.clone(), 1_500);
    let fp = FingerprintConfig::default();
    let mut hot = Vec::new();
    let mut signals = Vec::new();
    for (i, a) in adapters.iter().enumerate() {
        for s in 0..4 {
            let t = text(100 + 10 * i + s);
            let chain = BlockChain::of(a, t.as_bytes(), &fp);
            let key = PrefixKey::new(a, *chain.blocks.last().unwrap());
            hot.push((a.clone(), key, routing_key(&chain.blocks, &fp).unwrap()));
            signals.push(prefill_signal(a, &t));
        }
    }
    fleet.on_signals(batch(signals), 2_000);
    (fleet, adapters, hot)
}

/// While a joining pod warms, an adapter whose replica set moved to it is listed wherever it is
/// served (uncovered); the plan counted those pods in the adapter's scope and warmed about half
/// of its hot prefixes, though once the pod is routable the table sends all of them there.
#[test]
fn a_joining_pod_plans_every_hot_prefix_of_the_adapters_that_move_to_it() {
    let config = gateway_config();
    let (mut fleet, adapters, hot) = fleet_with_hot_adapter_prefixes(&config);
    let mut spec = PodSpec::new("new", "10.0.0.7:8000");
    spec.max_loras = 2;
    fleet.add_pod(config.pod_shape(&spec), 3_000).unwrap();
    fleet.on_health("new", true, None, 3_000);
    fleet.on_models("new", Vec::new(), 3_000);
    assert!(fleet.start_warmup("new", 3_000));
    let plan = fleet.plan_for("new", Candidates::Live, 3_000).unwrap();
    let planned: Vec<PrefixKey> = plan
        .first_tier
        .iter()
        .chain(&plan.second_tier)
        .copied()
        .collect();
    let moved: Vec<&String> = adapters
        .iter()
        .filter(|a| fleet.placed_pods(a) == vec!["new".to_string()])
        .collect();
    assert!(
        !moved.is_empty() && moved.len() < adapters.len(),
        "{moved:?}"
    );
    for (a, key, _) in &hot {
        assert_eq!(
            planned.contains(key),
            moved.contains(&a),
            "{a}: planned onto the new pod exactly when its set moved there"
        );
    }
}

/// Two pods join together, each planned as it answers: each warms exactly the hot prefixes
/// the table sends it once both are routable, none of them cold there and none warmed for
/// nothing.
#[test]
fn pods_joining_together_warm_exactly_what_the_table_then_sends_them() {
    let config = gateway_config();
    let (mut fleet, _, hot) = fleet_with_hot_adapter_prefixes(&config);
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        let mut spec = PodSpec::new(id, format!("10.0.1.{i}:8000"));
        spec.max_loras = 2;
        fleet.add_pod(config.pod_shape(&spec), 3_000).unwrap();
    }
    for id in ["a", "b"] {
        bring_up(&mut fleet, id, 3_000);
    }
    let mut warmed: Vec<(String, PrefixKey)> = Vec::new();
    let mut now = 3_000;
    for _ in 0..100 {
        now += 100;
        for action in fleet.tick(now) {
            match action {
                Action::Prefill(p) => {
                    if matches!(p.cause, Cause::Warmup(_)) {
                        warmed.push((p.pod.clone(), p.key));
                    }
                    fleet.prefill_done(&p, PrefillOutcome::Ok, now);
                }
                Action::Adapters(calls) => fleet.adapters_done(&calls, &[], now),
            }
        }
        if ["a", "b"]
            .iter()
            .all(|id| fleet.pod(id).unwrap().routable(now))
        {
            break;
        }
    }
    fleet.tick(now + config.fleet().keep_warm_period_ms);
    let mut routed_to_new = 0;
    for (adapter, key, rk) in &hot {
        let (pod, _) = route_request(fleet.table(), adapter, rk.0).unwrap();
        let new = pod.id == "a" || pod.id == "b";
        routed_to_new += usize::from(new);
        let warmed_on: Vec<&str> = warmed
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(p, _)| p.as_str())
            .collect();
        assert_eq!(
            warmed_on,
            if new { vec![pod.id.as_str()] } else { vec![] },
            "{adapter} {key:?} is routed to {}",
            pod.id
        );
    }
    assert!(
        routed_to_new > 0 && routed_to_new < hot.len(),
        "{routed_to_new}"
    );
}

/// Warm-up steps come out of the tick, and the pod enters the table once its first tier is done.
#[test]
fn a_joining_pod_enters_the_table_when_its_first_tier_is_warm() {
    let config = gateway_config();
    let mut fleet = fleet_with_a_joining_pod(&config);
    let listed = |f: &Fleet| f.table().pods.iter().any(|p| p.id == "new");
    let steps: Vec<_> = fleet
        .tick(3_100)
        .into_iter()
        .filter_map(|a| match a {
            Action::Prefill(p) if matches!(p.cause, Cause::Warmup(WarmupAction::Prefill(_))) => {
                Some(p)
            }
            _ => None,
        })
        .collect();
    assert!(
        !steps.is_empty(),
        "some of the 8 hot prefixes move to the new pod"
    );
    assert!(!listed(&fleet));
    for p in &steps {
        fleet.prefill_done(p, PrefillOutcome::Ok, 3_200);
    }
    assert!(listed(&fleet));
    // the next keep-warm period places the prefixes warmed on the new pod in the table, so the
    // filters' index sends their next requests there instead of to the pods that served them
    fleet.tick(3_200 + config.fleet().keep_warm_period_ms);
    let placed_on_new: Vec<_> = fleet
        .table()
        .prefixes
        .iter()
        .filter(|p| p.pod == "new")
        .filter_map(|p| p.keys.last().copied())
        .collect();
    for p in &steps {
        assert!(placed_on_new.contains(&p.key.last), "{:?}", p.key);
    }
    assert_eq!(placed_on_new.len(), steps.len());
}

/// A served record for a model no registry or pod knows as an adapter (a base model named
/// otherwise than `pods.base_model`) must not make the table list it as an adapter, which
/// would pin its traffic to the pods that served it.
#[test]
fn a_base_model_under_another_name_never_becomes_an_adapter() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 2);
    let fp = FingerprintConfig::default();
    let chain = BlockChain::of("llama-8b", text(7).as_bytes(), &fp);
    let mut served = batch(Vec::new());
    served.served = vec![ServedRecord::of("p0", "llama-8b", &chain, 900, &fp)];
    fleet.on_signals(served, 2_000);
    fleet.rebuild_table(2_000);
    assert!(fleet.table().pods.iter().all(|p| p.adapters.is_empty()));
}

fn prefills(actions: &[Action]) -> Vec<(&str, &Cause)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Prefill(p) => Some((p.pod.as_str(), &p.cause)),
            _ => None,
        })
        .collect()
}

/// The pattern state a signal carries (the seed's 201 `new` / 202 `known`) changes what is
/// warmed: a new pattern's whole prefix at once where it is routed; a known one's only through
/// keep-warm, when shards of it are not believed resident.
#[test]
fn a_new_pattern_is_prefilled_at_once_and_a_known_one_incrementally() {
    let config = gateway_config();
    let fp = FingerprintConfig::default();

    let mut fleet = fleet_of(&config, 2);
    let t = text(8);
    let (_, actions) = fleet.on_signals(batch(vec![prefill_signal("base", &t)]), 2_000);
    let now = prefills(&actions);
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].1, &Cause::NewPattern);
    // Modelled done: keep-warm does not send it again.
    assert!(prefills(&fleet.tick(3_000)).is_empty());

    let mut fleet = fleet_of(&config, 2);
    let (_, actions) = fleet.on_signals(
        batch(vec![pattern_signal("base", &t, PatternState::Known)]),
        2_000,
    );
    assert!(prefills(&actions).is_empty());
    let later = fleet.tick(3_000);
    assert_eq!(
        prefills(&later).len(),
        1,
        "not resident: keep-warm prefills it"
    );
    assert_eq!(prefills(&later)[0].1, &Cause::KeepWarm);

    // A known pattern whose shards the pod was just sent: nothing to prefill.
    let mut fleet = fleet_of(&config, 2);
    fleet.rebuild_table(1_000);
    let chain = BlockChain::of("base", t.as_bytes(), &fp);
    let rk = routing_key(&chain.blocks, &fp).unwrap();
    let routed = route_request(fleet.table(), "base", rk.0)
        .unwrap()
        .0
        .id
        .clone();
    let mut served = batch(vec![pattern_signal("base", &t, PatternState::Known)]);
    served.served = vec![ServedRecord::of(&routed, "base", &chain, 1_500, &fp)];
    let (_, actions) = fleet.on_signals(served, 2_000);
    assert!(prefills(&actions).is_empty());
    assert!(prefills(&fleet.tick(3_000)).is_empty());
}

fn not_kept_warm(signal: Signal) -> Signal {
    match signal {
        Signal::Prefill(p) => Signal::Prefill(PrefillSignal {
            keep_warm: false,
            ..p
        }),
        other => other,
    }
}

/// An experiment arm without keep-warm (its signals say `keep_warm: false`): its known pattern
/// is never re-prefilled where keep-warm re-prefills the same pattern from a keep-warm arm, and
/// a keep-warm arm's signal for the prefix turns keep-warm on for it.
#[test]
fn keep_warm_re_prefills_only_what_an_arm_with_keep_warm_signalled() {
    let config = gateway_config();
    let t = text(9);
    let key = PrefixKey::new(
        "base",
        *BlockChain::of("base", t.as_bytes(), &FingerprintConfig::default())
            .blocks
            .last()
            .unwrap(),
    );
    let known = || pattern_signal("base", &t, PatternState::Known);

    let mut fleet = fleet_of(&config, 2);
    fleet.on_signals(batch(vec![not_kept_warm(known())]), 2_000);
    assert!(!fleet.pool().get(&key).unwrap().keep_warm);
    assert!(prefills(&fleet.tick(3_000)).is_empty(), "not re-prefilled");
    assert!(warm_holders(&fleet, &key, 3_000).is_empty());
    // the other arm signals it too: kept warm from then on
    fleet.on_signals(batch(vec![known()]), 4_000);
    assert!(fleet.pool().get(&key).unwrap().keep_warm);
    assert_eq!(prefills(&fleet.tick(5_000)).len(), 1);

    // a new pattern of the arm without keep-warm is prefilled once, then left alone
    let mut fleet = fleet_of(&config, 2);
    let (_, actions) = fleet.on_signals(
        batch(vec![not_kept_warm(prefill_signal("base", &t))]),
        2_000,
    );
    assert_eq!(prefills(&actions).len(), 1);
    fleet.tick(3_000);
    assert!(
        warm_holders(&fleet, &key, 3_000).is_empty(),
        "left the warm set"
    );
}

fn holders(fleet: &Fleet, adapter: &str) -> Vec<String> {
    let mut h: Vec<String> = fleet
        .table()
        .pods
        .iter()
        .filter(|p| p.adapters.iter().any(|a| a == adapter))
        .map(|p| p.id.clone())
        .collect();
    h.sort();
    h
}

/// Pods that registered every adapter (`--lora-modules`) listed them all, so each adapter's
/// requests spread over pods whose GPU slots did not hold it. The table lists an adapter on its
/// replica set only; an adapter none of whose replicas serves it stays listed where it is served.
#[test]
fn the_table_lists_an_adapter_on_its_replicas_not_everywhere_it_is_registered() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 4);
    register(&mut fleet, "sql", Tier::Bronze, false);
    let everywhere = vec!["sql".to_string(), "orphan".to_string()];
    for i in 0..4 {
        fleet.on_models(&format!("p{i}"), everywhere.clone(), 2_000);
    }
    fleet.tick(3_000);
    let placed = fleet.placed_pods("sql");
    assert_eq!(placed.len(), 1, "no demand yet: one replica");
    assert_eq!(holders(&fleet, "sql"), placed);
    assert_eq!(
        holders(&fleet, "orphan").len(),
        4,
        "unregistered with the gateway: no set"
    );
}

/// Demand grows a set: an adapter with most of the requests is placed on most pods.
#[test]
fn an_adapter_with_most_of_the_demand_gets_most_of_the_pods() {
    let config = gateway_config();
    let mut fleet = fleet_of(&config, 4);
    register(&mut fleet, "hot", Tier::Bronze, false);
    register(&mut fleet, "cold", Tier::Bronze, false);
    let both = vec!["hot".to_string(), "cold".to_string()];
    for i in 0..4 {
        fleet.on_models(&format!("p{i}"), both.clone(), 2_000);
    }
    let fp = FingerprintConfig::default();
    let mut served = batch(Vec::new());
    for (n, model) in ["hot", "hot", "hot", "hot", "hot", "hot", "hot", "cold"]
        .iter()
        .enumerate()
    {
        let chain = BlockChain::of(model, text(n).as_bytes(), &fp);
        served
            .served
            .push(ServedRecord::of("p0", model, &chain, 900, &fp));
    }
    fleet.on_signals(served, 2_500);
    fleet.tick(3_000);
    // ceil(4 × 7/8) = 4 and ceil(4 × 1/8) = 1.
    assert_eq!(fleet.placed_pods("hot").len(), 4);
    assert_eq!(fleet.placed_pods("cold").len(), 1);
    assert_eq!(holders(&fleet, "hot").len(), 4);
    assert_eq!(holders(&fleet, "cold").len(), 1);
}

fn serve(fleet: &mut Fleet, pod: &str, requests: &[(&str, usize)], now: u64) {
    let fp = FingerprintConfig::default();
    let mut served = batch(Vec::new());
    for (model, count) in requests {
        for n in 0..*count {
            let chain = BlockChain::of(model, text(n).as_bytes(), &fp);
            served
                .served
                .push(ServedRecord::of(pod, model, &chain, now - 100, &fp));
        }
    }
    fleet.on_signals(served, now);
}

/// A fleet of 6 pods (2 slots each) serving a gold adapter and four bronze ones, all
/// registered everywhere, with demand on both tiers.
fn tiered_fleet(config: &GatewayConfig) -> Fleet {
    let mut fleet = fleet_of(config, 6);
    register(&mut fleet, "gold", Tier::Gold, false);
    let mut all = vec!["gold".to_string()];
    for b in ["b1", "b2", "b3", "b4"] {
        register(&mut fleet, b, Tier::Bronze, false);
        all.push(b.to_string());
    }
    for i in 0..6 {
        fleet.on_models(&format!("p{i}"), all.clone(), 2_000);
    }
    let demand = [("gold", 4), ("b1", 2), ("b2", 1), ("b3", 1), ("b4", 1)];
    serve(&mut fleet, "p0", &demand, 2_500);
    fleet.tick(3_000);
    fleet
}

fn sorted(mut pods: Vec<String>) -> Vec<String> {
    pods.sort();
    pods
}

fn gold_pool(fleet: &Fleet) -> Vec<String> {
    let pools = fleet.tier_pools();
    (0..6)
        .map(|i| format!("p{i}"))
        .filter(|p| pools.admits(Tier::Gold, p) && !pools.admits(Tier::Bronze, p))
        .collect()
}

/// `pods.tier_pools` (the default): once both tiers have demand, gold adapters get the smallest
/// pool that holds two replicas of each (2 pods here, the fleet idle), and while the other pool
/// has free slots no bronze adapter is placed or listed on it; without `tier_pools` every pod
/// serves every tier.
#[test]
fn by_default_gold_adapters_get_a_pool_of_their_own_once_both_tiers_have_demand() {
    let config = gateway_config();
    let fleet = tiered_fleet(&config);
    let gold = gold_pool(&fleet);
    assert_eq!(gold.len(), 2, "{gold:?}");
    assert_eq!(
        sorted(fleet.placed_pods("gold")),
        gold,
        "two replicas, both in the pool"
    );
    for b in ["b1", "b2", "b3", "b4"] {
        let placed = fleet.placed_pods(b);
        assert!(!placed.is_empty());
        assert!(
            placed.iter().all(|p| !gold.contains(p)),
            "{b} on {placed:?}"
        );
        assert!(holders(&fleet, b).iter().all(|p| !gold.contains(p)));
    }

    let mut one_pool = gateway_config();
    one_pool.pods.tier_pools = false;
    assert!(tiered_fleet(&one_pool).tier_pools().is_one_pool());
}

/// A burst of a new bronze adapter never takes a gold adapter's slot: the gold adapter stays
/// where it was and resident there, and no gold pod is given more adapters than its slots.
#[test]
fn a_burst_of_a_new_bronze_adapter_does_not_take_a_gold_slot() {
    let config = gateway_config();
    let mut fleet = tiered_fleet(&config);
    let gold = gold_pool(&fleet);
    for p in &gold {
        serve(&mut fleet, p, &[("gold", 1)], 3_500);
    }
    fleet.tick(4_000);
    register(&mut fleet, "burst", Tier::Bronze, false);
    for i in 0..6 {
        let models = ["gold", "b1", "b2", "b3", "b4", "burst"].map(String::from);
        fleet.on_models(&format!("p{i}"), models.to_vec(), 4_500);
    }
    serve(&mut fleet, "p0", &[("burst", 40)], 5_000);
    fleet.tick(5_000);
    assert_eq!(
        gold_pool(&fleet),
        gold,
        "the burst does not resize the pool"
    );
    let placed = fleet.placed_pods("burst");
    assert!(
        placed.len() > 1,
        "the burst's demand grows its set: {placed:?}"
    );
    assert_eq!(sorted(fleet.placed_pods("gold")), gold);
    let table = fleet.table();
    for p in table.pods.iter().filter(|p| gold.contains(&p.id)) {
        assert!(
            p.resident.iter().any(|a| a == "gold"),
            "{}: {:?}",
            p.id,
            p.resident
        );
        assert!(
            p.adapters.len() <= 2,
            "{}: {:?} on 2 slots",
            p.id,
            p.adapters
        );
    }
}

fn experiment(id: &str, cold_weight: f64) -> prewarm_core::experiment::Experiment {
    let json = serde_json::json!({"id": id, "arms": [
        {"name": "warm", "weight": 1.0 - cold_weight},
        {"name": "cold", "weight": cold_weight, "settings": {"warmup": false}},
    ]});
    serde_json::from_value(json).unwrap()
}

#[test]
fn the_table_carries_the_experiment_and_its_cold_arm_sees_a_warming_pod() {
    let mut fleet = fleet_with_a_joining_pod(&gateway_config());
    fleet.tick(3_100);
    let warming = |f: &Fleet| {
        f.table()
            .warming
            .iter()
            .map(|p| p.id.clone())
            .collect::<Vec<_>>()
    };
    assert!(warming(&fleet).is_empty(), "no experiment: not listed");

    let (running, new) = fleet
        .start_experiment(experiment("e", 0.05), 3_200)
        .unwrap();
    assert!(new);
    assert!(fleet.rebuild_table(3_200));
    assert_eq!(fleet.table().experiment.as_ref(), Some(&running.definition));
    assert_eq!(warming(&fleet), vec!["new"]);
    assert!(
        fleet.table().pods.iter().all(|p| p.id != "new"),
        "the warm arm waits"
    );

    // re-weighting keeps the start; another experiment waits for this one to end
    let (reweighted, new) = fleet
        .start_experiment(experiment("e", 0.25), 9_000)
        .unwrap();
    assert!(!new);
    assert_eq!(reweighted.started_ms, 3_200);
    let other = fleet.start_experiment(experiment("f", 0.5), 9_000);
    assert!(matches!(other, Err(ExperimentError::AnotherRunning { .. })));
    let invalid = fleet.start_experiment(experiment("e", 1.5), 9_000);
    assert!(matches!(invalid, Err(ExperimentError::Invalid(p)) if p.starts_with("arms[")));
    assert!(fleet.end_experiment("f").is_err());
    assert_eq!(
        fleet.experiment().map(|r| r.definition.id.as_str()),
        Some("e")
    );

    assert!(fleet.end_experiment("e").is_ok());
    assert!(fleet.rebuild_table(9_100));
    assert!(fleet.table().experiment.is_none() && warming(&fleet).is_empty());
}

#[test]
fn a_release_starts_at_its_first_step_climbs_and_rolls_back_to_zero() {
    use crate::policy::release::{Rollback, RollbackReason};
    let mut fleet = fleet_of(&gateway_config(), 1);
    let mut e = experiment("r", 0.5);
    e.release = Some(Default::default());
    let (running, _) = fleet.start_experiment(e.clone(), 1_000).unwrap();
    let weights = |f: &Fleet| {
        f.experiment()
            .unwrap()
            .definition
            .arms
            .iter()
            .map(|a| (a.weight * 1e9).round() / 1e9)
            .collect::<Vec<_>>()
    };
    assert_eq!(weights(&fleet), vec![0.01, 0.99]);
    assert_eq!(running.release.as_ref().unwrap().step, 0);
    assert_eq!(fleet.advance_release(2, 5_000), Some(0.25));
    assert_eq!(weights(&fleet), vec![0.25, 0.75]);
    assert_eq!(
        fleet
            .experiment()
            .unwrap()
            .release
            .as_ref()
            .unwrap()
            .step_started_ms,
        5_000
    );
    let rollback = Rollback {
        reason: RollbackReason::Errors,
        at_ms: 6_000,
        detail: "3 errors".into(),
    };
    assert_eq!(fleet.roll_back_release(rollback).as_deref(), Some("warm"));
    assert_eq!(weights(&fleet), vec![0.0, 1.0]);
    assert!(fleet.rebuild_table(6_000));
    assert_eq!(
        fleet.table().experiment.as_ref().unwrap().arms[0].weight,
        0.0
    );
    let events = experiment_events(&fleet);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[2].starts_with("rolled back (errors): 3 errors"));
    // posting it again restarts the release
    fleet.start_experiment(e, 7_000).unwrap();
    assert_eq!(weights(&fleet), vec![0.01, 0.99]);
    assert!(fleet
        .experiment()
        .unwrap()
        .release
        .as_ref()
        .unwrap()
        .rolled_back
        .is_none());
}

#[test]
fn a_comparisons_first_significance_is_one_event_kept_across_a_reweighting() {
    let mut fleet = Fleet::new(gateway_config().fleet(), 1_000, 0);
    let e = experiment("s", 0.5);
    fleet.start_experiment(e.clone(), 1_000).unwrap();
    let found = || {
        vec![(
            "cold@new".to_string(),
            "arm cold significantly slower".to_string(),
        )]
    };
    fleet.note_significant(found(), 2_000);
    fleet.note_significant(found(), 3_000);
    // the same experiment posted again (new weights) keeps what was noted
    fleet.start_experiment(e, 4_000).unwrap();
    fleet.note_significant(found(), 5_000);
    let events = experiment_events(&fleet);
    let significant: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("significantly"))
        .collect();
    assert_eq!(significant, ["arm cold significantly slower"]);
}

fn experiment_events(fleet: &Fleet) -> Vec<String> {
    fleet
        .experiment()
        .map(|r| r.events.iter().map(|e| e.event.clone()).collect())
        .unwrap_or_default()
}

#[test]
fn only_pods_joining_after_the_first_health_round_count_as_new() {
    let config = gateway_config();
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    fleet.start_experiment(experiment("n", 0.5), 1_000).unwrap();
    for (id, address, settle_first) in [
        ("p0", "10.0.0.1:8000", false),
        ("p1", "10.0.0.2:8000", true),
    ] {
        if settle_first {
            fleet.settle();
        }
        let spec = PodSpec::new(id, address);
        fleet.add_pod(config.pod_shape(&spec), 2_000).unwrap();
        fleet.on_health(id, true, None, 2_000);
    }
    assert_eq!(
        fleet.experiment().unwrap().joined_pods,
        vec!["p1".to_string()]
    );
    // a pod that goes down and returns lost its cache: new again (listed once)
    fleet.on_health("p1", false, None, 3_000);
    fleet.on_health("p1", true, None, 4_000);
    assert_eq!(
        fleet.experiment().unwrap().joined_pods,
        vec!["p1".to_string()]
    );
}

fn register_for(fleet: &mut Fleet, name: &str, tenant: &str) {
    let request = crate::registry::RegisterAdapter {
        name: name.into(),
        path: format!("/adapters/{name}"),
        version: None,
        tenant: Some(tenant.into()),
        tier: Some(Tier::Bronze),
        rank: None,
        alpha: None,
        target_modules: None,
        pinned: Some(false),
    };
    let version = crate::registry::AdapterVersion {
        version: "1".into(),
        path: request.path.clone(),
        rank: None,
        alpha: None,
        target_modules: Vec::new(),
        manifest: None,
        registered_at_ms: 0,
    };
    fleet.registry_mut().register(&request, version).unwrap();
}

fn rules_on(fleet: &Fleet, pod: &str, adapters: &[String]) -> Vec<ResidencyRule> {
    let lora = &fleet.pod(pod).unwrap().lora;
    adapters.iter().map(|a| lora.rule_of(a)).collect()
}

#[test]
fn a_tenant_experiment_gives_each_tenants_adapters_its_arms_residency_rule() {
    use prewarm_core::experiment::{Experiment, Unit};
    let mut fleet = fleet_of(&gateway_config(), 2);
    let adapters: Vec<String> = (0..12).map(|i| format!("lora-{i}")).collect();
    for (i, a) in adapters.iter().enumerate() {
        register_for(&mut fleet, a, &format!("tenant-{}", i / 2));
    }
    let json = serde_json::json!({"id": "keep", "unit": "tenant", "arms": [
        {"name": "seed", "weight": 0.5, "settings": {"residency_rule": "seed_keep"}},
        {"name": "lru", "weight": 0.5},
    ]});
    let definition: Experiment = serde_json::from_value(json).unwrap();
    assert_eq!(definition.unit, Unit::Tenant);
    let expected: Vec<ResidencyRule> = (0..12)
        .map(|i| {
            let arm = definition.arm_of(format!("tenant-{}", i / 2).as_bytes());
            if arm == 0 {
                ResidencyRule::SeedKeep
            } else {
                ResidencyRule::Lru2
            }
        })
        .collect();
    assert!(expected.contains(&ResidencyRule::SeedKeep) && expected.contains(&ResidencyRule::Lru2));
    fleet.tick(2_000);
    assert_eq!(
        rules_on(&fleet, "p0", &adapters),
        vec![ResidencyRule::Lru2; 12]
    );

    fleet.start_experiment(definition, 2_100).unwrap();
    fleet.tick(2_200);
    for pod in ["p0", "p1"] {
        assert_eq!(rules_on(&fleet, pod, &adapters), expected, "{pod}");
    }
    // A pod that joins later takes the rules too; ending the experiment restores [lora]'s.
    let config = gateway_config();
    let mut spec = PodSpec::new("p2", "10.0.0.2:8000");
    spec.max_loras = 2;
    fleet.add_pod(config.pod_shape(&spec), 2_300).unwrap();
    fleet.tick(2_400);
    assert_eq!(rules_on(&fleet, "p2", &adapters), expected);
    fleet.end_experiment("keep").unwrap();
    fleet.tick(2_500);
    for pod in ["p0", "p1", "p2"] {
        assert_eq!(
            rules_on(&fleet, pod, &adapters),
            vec![ResidencyRule::Lru2; 12]
        );
    }
}
