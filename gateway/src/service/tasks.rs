//! The background loops, each stopping on the shutdown signal:
//! - health: every `pods.health_interval_ms`, `GET /health` and `/metrics` of every pod, each
//!   pod's within a deadline of one interval (at least 2 s, at most `pods.request_timeout_ms`): a pod that
//!   does not answer in time counts as failed, so a hung pod never stretches the others' rounds;
//!   a pod that comes up has its `/v1/models` reconciled, then starts a warm-up; every 5th round
//!   `/v1/models` reconciles the LoRA model of every pod;
//!   the routing table is rebuilt (a warm-up deadline may have passed);
//! - keep-warm: the KV and LoRA policies' re-touches for up pods, within their budgets;
//! - DNS: re-resolution of `pods.dns.name`, adding and removing discovered pods;
//! - snapshots: every `state.snapshot_interval_seconds`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::task::JoinHandle;

use super::adapters::PodDecision;
use super::hit_ratio::modelled_hit_ratios;
use super::pods::{PodHealth, PodSource};
use super::{now_ms, Gateway};
use crate::config::PodSpec;
use crate::engine::Engine;
use crate::policy::lora::LoraObservation;
use crate::telemetry::Telemetry;
use crate::warmup::executor::start_warmup;
use crate::warmup::prefill_prefix::prefill_prefix;

/// Sleeps `d` or until shutdown; returns false at shutdown.
async fn pause(gateway: &Gateway, d: Duration) -> bool {
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
        tokio::spawn(health_loop(gateway.clone())),
        tokio::spawn(keep_warm_loop(gateway.clone())),
    ];
    if gateway.config.pods.dns.is_some() {
        tasks.push(tokio::spawn(dns_loop(gateway.clone())));
    }
    if gateway.config.state.snapshot_interval_seconds > 0 {
        tasks.push(tokio::spawn(snapshot_loop(gateway.clone())));
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
    let load = if ok {
        tokio::time::timeout(deadline, engine.load())
            .await
            .ok()
            .and_then(Result::ok)
    } else {
        None
    };
    if let Some(epoch) = gateway.record_health(&id, ok, load) {
        // What the pod already serves (adapters configured with `--lora-modules`) decides which
        // adapters' prefixes it wins once routable: its plan must see it, not the next round's.
        let _ =
            tokio::time::timeout(deadline, reconcile_models(&gateway, &id, engine.as_ref())).await;
        start_warmup(&gateway, &id, epoch);
        return;
    }
    if ok && reconcile {
        let _ =
            tokio::time::timeout(deadline, reconcile_models(&gateway, &id, engine.as_ref())).await;
    }
}

/// Reconciles the LoRA model of pod `id` with its `/v1/models` and executes what that decides
/// (re-pins); keeps the previous view when the fetch fails or an adapter call overlapped it.
async fn reconcile_models(gateway: &Arc<Gateway>, id: &str, engine: &dyn Engine) {
    let before = gateway.state().pods.get(id).map(|p| p.adapter_ops);
    let Ok(served) = engine.models().await else {
        return;
    };
    let decisions = {
        let mut state = gateway.state();
        let Some(pod) = state.pods.get_mut(id) else {
            return;
        };
        if before != Some(pod.adapter_ops) || pod.adapter_ops.in_flight > 0 {
            // An adapter call overlapped the fetch: the list may predate it.
            return;
        }
        let observed = LoraObservation {
            registered: served.adapters.iter().map(|(n, _)| n.clone()).collect(),
            running: pod.load.running_adapters.clone(),
            waiting: pod.load.waiting_adapters.clone(),
        };
        let decisions = pod.lora.reconcile(&observed, now_ms());
        pod.served = served;
        decisions
    };
    gateway
        .execute_decisions(PodDecision::on_pod(id, decisions))
        .await;
}

fn count_pods(gateway: &Gateway) {
    let now = now_ms();
    let (mut up, mut down, mut warming) = (0, 0, 0);
    for p in gateway.state().pods.values() {
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

async fn health_loop(gateway: Arc<Gateway>) {
    let interval = Duration::from_millis(gateway.config.pods.health_interval_ms);
    let mut round: u64 = 0;
    loop {
        let reconcile = round.is_multiple_of(5);
        let checks = gateway
            .pod_ids()
            .into_iter()
            .map(|id| check_pod(gateway.clone(), id, reconcile));
        join_all(checks).await;
        gateway.republish_table();
        count_pods(&gateway);
        round = round.wrapping_add(1);
        if !pause(&gateway, interval).await {
            return;
        }
    }
}

async fn keep_warm_loop(gateway: Arc<Gateway>) {
    loop {
        if !pause(&gateway, Duration::from_secs(1)).await {
            return;
        }
        let now = now_ms();
        let (prefills, decisions) = {
            let mut state = gateway.state();
            let mut prefills = Vec::new();
            let mut decisions = Vec::new();
            for pod in state.pods.values_mut() {
                if !pod.routable(now) {
                    continue;
                }
                for k in pod.kv.keep_warm(now) {
                    prefills.push((pod.spec.id.clone(), k.key));
                }
                let touches = pod.lora.keep_warm(now);
                decisions.extend(PodDecision::on_pod(&pod.spec.id, touches));
            }
            for (pod, ratio) in modelled_hit_ratios(&state, &gateway.config, now) {
                gateway.telemetry.set_hit_ratio(&pod, ratio);
            }
            (prefills, decisions)
        };
        Telemetry::add(
            &gateway.telemetry.decisions,
            &[("policy", "kv"), ("decision", "keep_warm")],
            prefills.len() as u64,
        );
        let g = &gateway;
        join_all(
            prefills
                .into_iter()
                .map(|(pod, key)| async move { prefill_prefix(g, &pod, key).await }),
        )
        .await;
        gateway.execute_decisions(decisions).await;
    }
}

async fn dns_loop(gateway: Arc<Gateway>) {
    let Some(dns) = gateway.config.pods.dns.clone() else {
        return;
    };
    let interval = Duration::from_secs(dns.interval_seconds);
    loop {
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
                    if let Err(e) = gateway.add_pod(spec, PodSource::Dns) {
                        tracing::warn!(address = %addr, error = %e, "discovered pod refused");
                    }
                }
            }
            Err(e) => tracing::warn!(name = %dns.name, error = %e, "DNS resolution failed"),
        }
        if !pause(&gateway, interval).await {
            return;
        }
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
