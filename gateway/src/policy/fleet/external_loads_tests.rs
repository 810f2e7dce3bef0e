//! `[lora] loads = "external"`: another controller (llm-d, AIBrix) registers adapters, so the
//! fleet core never asks for a load or an unload, whatever path a decision takes (warm-up, pin
//! signals, operator pins and removals, reconciliation, keep-warm, rollouts) — while it still
//! observes what each pod holds, touches it, warms hot prefixes and lists served adapters.

use prewarm_core::wire::{PinSignal, Signal, SignalBatch};

use super::*;
use crate::config::{GatewayConfig, PodSpec};
use crate::policy::lora::AdapterLoads;
use crate::policy::{LoraDecision, Tier};

fn config(loads: AdapterLoads) -> GatewayConfig {
    let mut c = GatewayConfig::default();
    c.lora.loads = loads;
    c
}

fn add_up(fleet: &mut Fleet, config: &GatewayConfig, id: &str, holds: &[&str], now: u64) {
    let mut spec = PodSpec::new(id, format!("10.0.0.{}:8000", &id[1..]));
    spec.max_loras = 2;
    spec.max_cpu_loras = Some(4);
    fleet.add_pod(config.pod_shape(&spec), now).unwrap();
    fleet.on_health(id, true, Some(PodLoad::default()), now);
    let held = holds.iter().map(|a| a.to_string()).collect();
    let mut actions = fleet.on_models(id, held, now);
    assert!(fleet.start_warmup(id, now));
    actions.extend(fleet.tick(now));
    log(actions);
}

thread_local! {
    static LOG: std::cell::RefCell<Vec<Action>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn log(actions: impl IntoIterator<Item = Action>) {
    LOG.with(|l| l.borrow_mut().extend(actions));
}

fn take_log() -> Vec<Action> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

fn decisions(actions: &[Action]) -> Vec<(String, LoraDecision)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Adapters(calls) => Some(
                calls
                    .decisions
                    .iter()
                    .map(|d| (calls.pod.clone(), d.clone()))
                    .collect::<Vec<_>>(),
            ),
            Action::Prefill(_) => None,
        })
        .flatten()
        .collect()
}

fn prefill_signal(model: &str, seed: usize) -> Signal {
    super::tests::prefill_signal(model, &super::tests::text(seed))
}

fn pin_signal(adapter: &str) -> Signal {
    Signal::Pin(PinSignal {
        adapter: adapter.into(),
        tenant: None,
        rate_per_minute: 30.0,
        priority: 90,
    })
}

/// Every path that decides adapter calls, on a fleet where `p0` holds `sql` (loaded by the other
/// controller) and `p1` holds nothing: warm-ups of joining pods, pin signals, an operator's pin,
/// `/v1/models` reconciliation of a pod that lost a pinned adapter, keep-warm, a rollout and a
/// removal. Returns every action the core asked for.
fn drive(loads: AdapterLoads) -> (Fleet, Vec<Action>) {
    let config = config(loads);
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    take_log();
    for (name, tier, pinned) in [
        ("sql", Tier::Gold, true),
        ("chat", Tier::Bronze, false),
        ("legal", Tier::Silver, false),
    ] {
        fleet
            .registry_mut()
            .register_unverified(name, &format!("/adapters/{name}"), tier, pinned)
            .unwrap();
    }
    log(fleet
        .on_signals(
            SignalBatch::new("f", 0, vec![prefill_signal("base", 1)]),
            1_000,
        )
        .1);
    add_up(&mut fleet, &config, "p0", &["sql"], 1_000);
    add_up(&mut fleet, &config, "p1", &[], 1_000);
    let mut now = 1_000;
    for step in 0..50 {
        now += TICK_MS;
        log(fleet.tick(now));
        if step == 5 {
            let signals = vec![
                pin_signal("chat"),
                pin_signal("sql"),
                prefill_signal("base", 2),
                prefill_signal("sql", 3),
            ];
            log(fleet.on_signals(SignalBatch::new("f", 1, signals), now).1);
            log(fleet.pin_adapter("legal", now).unwrap());
        }
        if step == 10 {
            // p0 lost `sql` (the other controller unloaded it): no reload from us.
            log(fleet.on_models("p0", Vec::new(), now));
        }
        if step == 20 {
            log(fleet.on_models("p0", vec!["sql".into(), "chat".into()], now));
        }
    }
    log(fleet.reload_adapter("chat", &["p0".into(), "p1".into()]));
    log(fleet.remove_adapter("chat").unwrap());
    (fleet, take_log())
}

#[test]
fn with_external_loads_no_action_loads_or_unloads_an_adapter() {
    let (_, actions) = drive(AdapterLoads::External);
    let calls = decisions(&actions);
    let loads: Vec<_> = calls
        .iter()
        .filter(|(_, d)| !matches!(d, LoraDecision::Touch(_)))
        .collect();
    assert!(loads.is_empty(), "{loads:?}");
    // Adapters the pods hold are still kept warm, on the pods that hold them only.
    assert!(calls
        .iter()
        .any(|(pod, d)| pod == "p0" && *d == LoraDecision::Touch("sql".into())));
    assert!(
        calls
            .iter()
            .all(|(pod, d)| pod == "p0" && d.adapter() != "legal"),
        "{calls:?}"
    );
    // Hot prefixes are still prefilled.
    assert!(actions.iter().any(|a| matches!(a, Action::Prefill(_))));
}

/// The same script under the default does load adapters: the test above can fail.
#[test]
fn with_prewarm_loads_the_same_script_loads_adapters() {
    let (_, actions) = drive(AdapterLoads::Prewarm);
    let calls = decisions(&actions);
    assert!(calls
        .iter()
        .any(|(_, d)| matches!(d, LoraDecision::Load(_))));
    assert!(calls
        .iter()
        .any(|(_, d)| matches!(d, LoraDecision::Unload(_))));
}

/// Where the other controller put an adapter is where the table lists it and where its hot
/// prefixes are warmed: every pod that serves it, none that does not.
#[test]
fn with_external_loads_the_table_lists_an_adapter_wherever_it_is_served() {
    let config = config(AdapterLoads::External);
    let mut fleet = Fleet::new(config.fleet(), 1_000, 0);
    fleet
        .registry_mut()
        .register_unverified("sql", "/adapters/sql", Tier::Bronze, false)
        .unwrap();
    for (id, holds) in [
        ("p0", &["sql"][..]),
        ("p1", &["sql"]),
        ("p2", &[]),
        ("p3", &[]),
    ] {
        add_up(&mut fleet, &config, id, holds, 1_000);
    }
    // Warm-ups done (p0 and p1 touched `sql`): every pod routable.
    for action in take_log() {
        match &action {
            Action::Adapters(calls) => fleet.adapters_done(calls, &[], 2_000),
            Action::Prefill(p) => fleet.prefill_done(p, PrefillOutcome::Ok, 2_000),
        }
    }
    fleet.tick(3_000);
    let mut listed: Vec<String> = fleet
        .table()
        .pods
        .iter()
        .filter(|p| p.adapters.iter().any(|a| a == "sql"))
        .map(|p| p.id.clone())
        .collect();
    listed.sort();
    assert_eq!(listed, vec!["p0", "p1"]);
    let (_, actions) = fleet.on_signals(
        SignalBatch::new("f", 0, vec![prefill_signal("sql", 7)]),
        3_100,
    );
    let prefilled: Vec<&str> = actions
        .iter()
        .filter(|a| matches!(a, Action::Prefill(_)))
        .map(Action::pod)
        .collect();
    assert!(!prefilled.is_empty());
    assert!(
        prefilled.iter().all(|p| ["p0", "p1"].contains(p)),
        "{prefilled:?}"
    );
}

#[test]
fn lora_loads_parses_its_two_values_and_names_itself_when_wrong() {
    let c = GatewayConfig::from_toml("[lora]\nloads = \"external\"\n").unwrap();
    assert_eq!(c.lora.loads, AdapterLoads::External);
    assert_eq!(
        GatewayConfig::from_toml("").unwrap().lora.loads,
        AdapterLoads::Prewarm
    );
    let e = GatewayConfig::from_toml("[lora]\nloads = \"llm-d\"\n").unwrap_err();
    assert!(
        e.contains("lora.loads: \"llm-d\": must be \"prewarm\""),
        "{e}"
    );
    let e = GatewayConfig::from_toml("[lora]\nloads = true\n").unwrap_err();
    assert!(e.contains("loads"), "{e}");
}
