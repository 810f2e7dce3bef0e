//! The warm-up executor of one pod at one epoch: plans (or re-plans, after the pod returned),
//! then loops — ask the progress for the actions it allows now (given the pod's waiting requests
//! and KV usage), start them, wait for one to finish or for a short tick, report the outcome —
//! until the plan is done, the pod leaves its epoch (down, removed, re-joined) or the service
//! shuts down. When the first tier finishes the pod becomes routable and the table is rebuilt.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::load_adapter::load_adapter;
use super::prefill_prefix::{prefill_prefix, PrefillOutcome};
use crate::policy::warmup::{PodPressure, WarmupPhase};
use crate::policy::{WarmupAction, WarmupProgress};
use crate::service::planning::{plan_for, Candidates};
use crate::service::{now_ms, Gateway};
use crate::telemetry::Telemetry;

/// How long the loop waits for a completion before asking the progress again (pressure and the
/// deadline change without completions).
const TICK: Duration = Duration::from_millis(100);

/// Plans the pod's warm-up and spawns its executor. Returns whether it started.
pub fn start_warmup(gateway: &Arc<Gateway>, pod_id: &str, epoch: u64) -> bool {
    let now = now_ms();
    let mut state = gateway.state();
    let Some(plan) = plan_for(gateway, &state, pod_id, Candidates::Live) else {
        return false;
    };
    let Some(pod) = state.pods.get_mut(pod_id) else {
        return false;
    };
    if pod.epoch != epoch {
        return false;
    }
    tracing::info!(
        pod = %pod_id,
        adapters = plan.adapters.len(),
        first_tier = plan.first_tier.len(),
        second_tier = plan.second_tier.len(),
        lazy = plan.lazy.len(),
        "warm-up planned"
    );
    let progress = match pod.warmup.previous.take() {
        Some(previous) => previous.restarted(plan, now),
        None => WarmupProgress::start(plan, gateway.config.warmup.clone(), now),
    };
    if progress.status(now).first_tier_done_ms.is_some() {
        // Nothing to warm before traffic: routable at once, a zero-length warm-up.
        gateway.telemetry.warmup_duration.observe(0.0);
    }
    pod.warmup.note_admission(now);
    pod.warmup.abort();
    pod.warmup.progress = Some(progress);
    let g = gateway.clone();
    let id = pod_id.to_string();
    let task = tokio::spawn(async move { run(g, id, epoch).await });
    pod.warmup.task = Some(task.abort_handle());
    drop(state);
    Telemetry::count(
        &gateway.telemetry.decisions,
        &[("policy", "warmup"), ("decision", "plan")],
    );
    gateway.republish_table();
    true
}

enum Step {
    Act(Vec<WarmupAction>),
    Finished,
    Stale,
}

fn next_step(gateway: &Gateway, pod_id: &str, epoch: u64, in_flight: usize) -> Step {
    let now = now_ms();
    let mut state = gateway.state();
    let Some(pod) = state.pods.get_mut(pod_id) else {
        return Step::Stale;
    };
    if pod.epoch != epoch {
        return Step::Stale;
    }
    let pressure = PodPressure {
        waiting: pod.load.waiting,
        kv_usage: pod.load.kv_usage,
    };
    let Some(progress) = pod.warmup.progress.as_mut() else {
        return Step::Stale;
    };
    if progress.phase() == WarmupPhase::Done && in_flight == 0 {
        return Step::Finished;
    }
    if progress.phase() == WarmupPhase::Interrupted {
        return Step::Stale;
    }
    Step::Act(progress.next_actions(pressure, now))
}

/// Reports an outcome; returns whether the first tier just finished.
fn report(
    gateway: &Gateway,
    pod_id: &str,
    epoch: u64,
    action: &WarmupAction,
    outcome: Option<bool>,
) -> bool {
    let now = now_ms();
    let mut state = gateway.state();
    let Some(pod) = state.pods.get_mut(pod_id) else {
        return false;
    };
    if pod.epoch != epoch {
        return false;
    }
    let Some(progress) = pod.warmup.progress.as_mut() else {
        return false;
    };
    let before = progress.status(now).first_tier_done_ms;
    match outcome {
        Some(true) => progress.completed(action, now),
        Some(false) => {
            if progress.failed(action, now) {
                Telemetry::count(&gateway.telemetry.warmup_key_errors, &[("pod", pod_id)]);
            }
        }
        None => progress.skipped(action, now),
    }
    let status = progress.status(now);
    if let (None, Some(done)) = (before, status.first_tier_done_ms) {
        let secs = done.saturating_sub(status.started_ms) as f64 / 1000.0;
        gateway.telemetry.warmup_duration.observe(secs);
        tracing::info!(pod = %pod_id, seconds = secs, "warm-up first tier done: pod routable");
        return true;
    }
    false
}

async fn execute(
    gateway: Arc<Gateway>,
    pod_id: String,
    action: WarmupAction,
) -> (WarmupAction, Option<bool>) {
    let outcome = match &action {
        WarmupAction::LoadAdapter(name) => load_adapter(&gateway, &pod_id, name).await,
        WarmupAction::Prefill(key) => match prefill_prefix(&gateway, &pod_id, *key).await {
            PrefillOutcome::Done => Some(true),
            PrefillOutcome::Failed => Some(false),
            PrefillOutcome::Gone => None,
        },
    };
    (action, outcome)
}

async fn run(gateway: Arc<Gateway>, pod_id: String, epoch: u64) {
    let mut in_flight: JoinSet<(WarmupAction, Option<bool>)> = JoinSet::new();
    let mut shutdown = gateway.shutdown_signal();
    // A first-tier-less plan is routable at once.
    gateway.republish_table();
    loop {
        if *shutdown.borrow() {
            break;
        }
        match next_step(&gateway, &pod_id, epoch, in_flight.len()) {
            Step::Stale => break,
            Step::Finished => {
                tracing::info!(pod = %pod_id, "warm-up done");
                break;
            }
            Step::Act(actions) => {
                for action in actions {
                    in_flight.spawn(execute(gateway.clone(), pod_id.clone(), action));
                }
            }
        }
        let finished = tokio::select! {
            _ = shutdown.changed() => break,
            done = in_flight.join_next(), if !in_flight.is_empty() => done,
            _ = tokio::time::sleep(TICK) => None,
        };
        if let Some(Ok((action, outcome))) = finished {
            if report(&gateway, &pod_id, epoch, &action, outcome) {
                gateway.republish_table();
            }
        }
    }
    in_flight.abort_all();
    gateway.republish_table();
}
