//! The background loops, each stopping on the shutdown signal:
//! - health: every `pods.health_interval_ms`, `GET /health` and `/metrics` of every pod, each
//!   pod's within a deadline of one interval (at least 2 s, at most `pods.request_timeout_ms`):
//!   a pod that does not answer in time counts as failed, so a hung pod never stretches the
//!   others' rounds; what they report is fed to the fleet core; a pod that comes up (or that the
//!   core finds restarted while up, `policy::fleet::restart`) has its `/v1/models` reconciled,
//!   then its warm-up started; every 5th round `/v1/models` reconciles the LoRA model of every
//!   pod;
//! - fleet: every [`TICK_MS`], the core's tick (warm-up steps, keep-warm, the table) and the
//!   execution of its actions, concurrently; a finished action wakes the loop at once (the
//!   warm-up's next step may be allowed);
//! - DNS: re-resolution of `pods.dns.name`, adding and removing discovered pods; the first
//!   resolution comes before the first health round, whose pods count as found at start;
//! - snapshots: every `state.snapshot_interval_seconds`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::task::{JoinHandle, JoinSet};

use super::pods::PodSource;
use super::Gateway;
use crate::config::{DnsDiscovery, PodSpec};
use crate::engine::Engine;
use crate::policy::fleet::{Action, HealthCheck, PodHealth, TICK_MS};

/// Ticks between two exports of the modelled hit ratios.
const HIT_RATIO_TICKS: u64 = 10;

/// Sleeps `d` or until shutdown; returns false at shutdown.
pub(crate) async fn pause(gateway: &Gateway, d: Duration) -> bool {
    let mut shutdown = gateway.shutdown_signal();
    if *shutdown.borrow() {
        return false;
    }
    tokio::select! {
        _ = shutdown.changed() => false,
        _ = tokio::time::sleep(d) => !gateway.is_shutting_down(),
    }
}

/// Spawns every loop the configuration asks for.
pub fn spawn_all(gateway: &Arc<Gateway>) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![
        tokio::spawn(discover_then_check(gateway.clone())),
        tokio::spawn(fleet_loop(gateway.clone())),
        tokio::spawn(verdict_loop(gateway.clone())),
        tokio::spawn(warm_embeddings_loop(gateway.clone())),
    ];
    if gateway.config.pods.dns.is_some() {
        tasks.push(tokio::spawn(dns_loop(gateway.clone())));
    }
    if gateway.config.state.snapshot_interval_seconds > 0 {
        tasks.push(tokio::spawn(snapshot_loop(gateway.clone())));
    }
    if let Some(search) = gateway.embeddings.clone() {
        tasks.push(tokio::spawn(super::refresh_embeddings::refresh_loop(
            gateway.clone(),
            search,
        )));
    }
    tasks
}

/// The shortest per-pod health deadline, ms: vLLM answers `/health` from its API server without
/// waiting for the engine, so 2 s is generous under load, and short intervals (tests use 100 ms)
/// do not turn a busy pod's slow answer into a failure.
const HEALTH_DEADLINE_FLOOR_MS: u64 = 2_000;

/// How long one pod's health probe (and each of its `/metrics` and `/v1/models` reads) may take
/// in a round: one interval, at least [`HEALTH_DEADLINE_FLOOR_MS`], at most the request timeout.
fn health_deadline(gateway: &Gateway) -> Duration {
    let pods = &gateway.config.pods;
    Duration::from_millis(
        pods.health_interval_ms
            .max(HEALTH_DEADLINE_FLOOR_MS)
            .min(pods.request_timeout_ms),
    )
}

async fn check_pod(gateway: Arc<Gateway>, id: String, reconcile: bool) {
    let Some((engine, _)) = gateway.pod_handle(&id) else {
        return;
    };
    let deadline = health_deadline(&gateway);
    let ok = matches!(
        tokio::time::timeout(deadline, engine.health()).await,
        Ok(Ok(()))
    );
    let scrape = if ok {
        tokio::time::timeout(deadline, engine.scrape())
            .await
            .ok()
            .and_then(Result::ok)
    } else {
        None
    };
    let check = HealthCheck {
        ok,
        process_start_s: scrape.as_ref().and_then(|s| s.process_start_s),
        load: scrape.map(|s| s.load),
    };
    // A pod that came up, came back, or restarted while up (the core tells it from the scrape)
    // is a joining pod: reconciled, then planned and warmed before it routes.
    if let Some(epoch) = gateway.record_health(&id, check) {
        // What the pod already serves (adapters configured with `--lora-modules`) decides which
        // adapters' prefixes it wins once routable: its plan must see it, not the next round's.
        reconcile_models(&gateway, &id, engine.as_ref(), deadline).await;
        let now = gateway.now();
        let started = gateway
            .fleet(|f| f.pod(&id).is_some_and(|p| p.epoch == epoch) && f.start_warmup(&id, now));
        if started {
            gateway.republish_table();
        }
        return;
    }
    if ok && reconcile {
        reconcile_models(&gateway, &id, engine.as_ref(), deadline).await;
    }
}

/// Reconciles the LoRA model of pod `id` with its `/v1/models` (read within `deadline`) and
/// executes what that decides (re-pins: never cut short, so an adapter call is never abandoned
/// half-way); keeps the previous view when the fetch fails or an adapter call overlapped it.
async fn reconcile_models(
    gateway: &Arc<Gateway>,
    id: &str,
    engine: &dyn Engine,
    deadline: Duration,
) {
    let before = gateway.state().pods.get(id).map(|p| p.adapter_ops);
    let Ok(Ok(served)) = tokio::time::timeout(deadline, engine.models()).await else {
        return;
    };
    let actions = {
        let mut state = gateway.state();
        let Some(pod) = state.pods.get_mut(id) else {
            return;
        };
        if before != Some(pod.adapter_ops) || pod.adapter_ops.in_flight > 0 {
            // An adapter call overlapped the fetch: the list may predate it.
            return;
        }
        let registered = served.adapters.iter().map(|(n, _)| n.clone()).collect();
        pod.served = served;
        drop(state);
        let now = gateway.now();
        gateway.fleet(|f| f.on_models(id, registered, now))
    };
    gateway.execute_all(actions).await;
}

fn count_pods(gateway: &Gateway) {
    let now = gateway.now();
    let (mut up, mut down, mut warming) = (0, 0, 0);
    for p in gateway.state().fleet.pods() {
        match p.health {
            PodHealth::Up if p.routable(now) => up += 1,
            PodHealth::Up => warming += 1,
            _ => down += 1,
        }
    }
    gateway.telemetry.set_pods("up", up);
    gateway.telemetry.set_pods("warming", warming);
    gateway.telemetry.set_pods("down", down);
}

impl Gateway {
    /// One health round: every pod checked (`reconcile`: its `/v1/models` too), in pool order.
    pub async fn health_round(self: &Arc<Self>, reconcile: bool) {
        let started = std::time::Instant::now();
        self.ensure_kv_subscriptions();
        let checks = self
            .pod_ids()
            .into_iter()
            .map(|id| check_pod(self.clone(), id, reconcile));
        join_all(checks).await;
        self.republish_table();
        count_pods(self);
        self.telemetry
            .health_round_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// The fleet core's tick now; returns its actions for the caller to execute.
    pub fn tick(&self) -> Vec<Action> {
        let now = self.now();
        let actions = self.fleet(|f| f.tick(now));
        self.republish_table();
        actions
    }
}

async fn health_loop(gateway: Arc<Gateway>) {
    let interval = Duration::from_millis(gateway.config.pods.health_interval_ms);
    let mut round: u64 = 0;
    loop {
        // rounds start an interval apart, however long one takes (a round longer than the
        // interval is followed at once by the next)
        let started = tokio::time::Instant::now();
        gateway.health_round(round.is_multiple_of(5)).await;
        if round == 0 {
            // the pods found up in the first round were there before: they are not new
            gateway.fleet(|f| f.settle());
        }
        round = round.wrapping_add(1);
        if !pause(&gateway, interval.saturating_sub(started.elapsed())).await {
            return;
        }
    }
}

/// The KV models' modelled hit ratios, their gaps to the pods' own counters, and the blocks the
/// pods' KV-cache events say they hold.
fn export_kv_model(gateway: &Gateway, now: u64) {
    let (ratios, gaps, held) = {
        let state = gateway.state();
        let gaps: Vec<(String, f64)> = state
            .fleet
            .pods()
            .filter_map(|p| Some((p.shape.id.clone(), p.kv_hit_gap?)))
            .collect();
        let held: Vec<(String, usize)> = state
            .fleet
            .pods()
            .filter_map(|p| Some((p.shape.id.clone(), p.engine_blocks.view()?.cached_blocks)))
            .collect();
        (state.fleet.modelled_hit_ratios(now), gaps, held)
    };
    for (pod, blocks) in held {
        gateway.telemetry.set_engine_cached_blocks(&pod, blocks);
    }
    for (pod, ratio) in ratios {
        gateway.telemetry.set_hit_ratio(&pod, ratio);
    }
    for (pod, gap) in gaps {
        gateway.telemetry.set_kv_hit_gap(&pod, gap);
    }
}

/// The core's tick and the execution of its actions; see the module docs.
async fn fleet_loop(gateway: Arc<Gateway>) {
    let mut running: JoinSet<()> = JoinSet::new();
    let mut shutdown = gateway.shutdown_signal();
    let mut ticks: u64 = 0;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let now = gateway.now();
        for action in gateway.tick() {
            let g = gateway.clone();
            running.spawn(async move {
                g.execute(action).await;
            });
        }
        gateway.close_finished_plan_spans();
        if ticks.is_multiple_of(HIT_RATIO_TICKS) {
            export_kv_model(&gateway, now);
        }
        ticks = ticks.wrapping_add(1);
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = running.join_next(), if !running.is_empty() => {}
            _ = tokio::time::sleep(Duration::from_millis(TICK_MS)) => {}
        }
    }
    running.abort_all();
}

/// How often a grey release and the adapter rollouts under watch are checked, ms.
pub const VERDICT_CHECK_MS: u64 = 1_000;

/// The gateway's own rollbacks: a grey release's and an adapter rollout's.
async fn verdict_loop(gateway: Arc<Gateway>) {
    loop {
        gateway.check_experiment().await;
        gateway.check_rollout_watches().await;
        if !pause(&gateway, Duration::from_millis(VERDICT_CHECK_MS)).await {
            break;
        }
    }
}

/// How often the hot embedding inputs are computed, ms (`calls_per_second` is per round).
pub const WARM_EMBEDDINGS_ROUND_MS: u64 = 1_000;

async fn warm_embeddings_loop(gateway: Arc<Gateway>) {
    loop {
        gateway.compute_warm_embeddings().await;
        if !pause(&gateway, Duration::from_millis(WARM_EMBEDDINGS_ROUND_MS)).await {
            break;
        }
    }
}

/// Re-resolves `pods.dns` every interval; the first resolution is the health loop's
/// ([`discover_then_check`]).
async fn dns_loop(gateway: Arc<Gateway>) {
    let Some(dns) = gateway.config.pods.dns.clone() else {
        return;
    };
    let interval = Duration::from_secs(dns.interval_seconds);
    while pause(&gateway, interval).await {
        discover(&gateway, &dns).await;
    }
}

/// The pods found up by the first health round were serving before the gateway started (a
/// gateway restart keeps them in the table while they are re-warmed, and they are not new pods
/// to an experiment): with DNS discovery, that round must see the discovered pods, so the first
/// resolution comes before it.
async fn discover_then_check(gateway: Arc<Gateway>) {
    if let Some(dns) = gateway.config.pods.dns.clone() {
        discover(&gateway, &dns).await;
    }
    health_loop(gateway).await;
}

/// One resolution of `pods.dns`: adds the pods it finds and removes the ones it no longer does.
async fn discover(gateway: &Gateway, dns: &DnsDiscovery) {
    match tokio::net::lookup_host((dns.name.as_str(), dns.port)).await {
        Ok(addrs) => {
            let found: BTreeSet<String> = addrs.map(|a| a.to_string()).collect();
            let known: Vec<String> = gateway
                .state()
                .pods
                .values()
                .filter(|p| p.source == PodSource::Dns)
                .map(|p| p.spec.id.clone())
                .collect();
            for id in known.iter().filter(|id| !found.contains(*id)) {
                let _ = gateway.remove_pod(id);
            }
            for addr in found.iter().filter(|a| !known.contains(a)) {
                let mut spec = PodSpec::new(addr.clone(), addr.clone());
                spec.engine = dns.engine;
                spec.max_loras = dns.max_loras;
                spec.max_cpu_loras = dns.max_cpu_loras;
                let at_port = |port: Option<u16>| {
                    let (host, _) = addr.rsplit_once(':')?;
                    Some(format!("{host}:{}", port?))
                };
                spec.kv_events = at_port(dns.kv_events_port);
                spec.kv_events_replay = at_port(dns.kv_events_replay_port);
                if let Err(e) = gateway.add_pod(spec, PodSource::Dns) {
                    tracing::warn!(address = %addr, error = %e, "discovered pod refused");
                }
            }
        }
        Err(e) => tracing::warn!(name = %dns.name, error = %e, "DNS resolution failed"),
    }
}

async fn snapshot_loop(gateway: Arc<Gateway>) {
    let interval = Duration::from_secs(gateway.config.state.snapshot_interval_seconds);
    loop {
        if !pause(&gateway, interval).await {
            return;
        }
        let g = gateway.clone();
        let _ = tokio::task::spawn_blocking(move || g.write_snapshot()).await;
    }
}
