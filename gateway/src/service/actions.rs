//! Executing the fleet core's actions and reporting their ends. Every call into the core goes
//! through [`Gateway::fleet`], which also turns the core's notes into metrics, logs and pods'
//! recent errors. A prefill is a `max_tokens: 1` request of the prefix in its traffic's shape
//! (the engine builds it with core's `prefill_call`), counted by the form it went in
//! (`prewarm_prefill_shapes_total{shape}`: `chat`, `completion`, or `unshaped` — a chat prefix
//! known without its shape); its end goes back to the core as ok, rejected (a 4xx that names
//! the request: the entry backs off) or failed. Adapter calls run in order
//! ([`super::adapters`]). The core decides; this module only executes.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::engine::{EngineError, PrefillRequest};
use crate::policy::fleet::{Action, AdapterCalls, Fleet, Note, Prefill, PrefillOutcome};
use crate::policy::lora::LoraDecision;
use crate::telemetry::Telemetry;
use crate::traces::warmup::{key_done, PlanShape};

use super::adapters::DecisionOutcome;
use super::{Gateway, State};

impl Gateway {
    /// Runs `f` on the fleet core under the lock, then records the notes it left.
    pub fn fleet<R>(&self, f: impl FnOnce(&mut Fleet) -> R) -> R {
        self.fleet_and_pods(|state| f(&mut state.fleet))
    }

    /// [`fleet`](Self::fleet) for a step that also edits the pods' I/O side under the same
    /// lock.
    pub(super) fn fleet_and_pods<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (result, notes) = {
            let mut state = self.state();
            let result = f(&mut state);
            let notes = state.fleet.take_notes();
            for note in &notes {
                if let Note::PodError { pod, message } = note {
                    if let Some(p) = state.pods.get_mut(pod) {
                        p.note_error(message.clone());
                    }
                }
            }
            (result, notes)
        };
        for note in notes {
            self.record_note(note);
        }
        result
    }

    fn record_note(&self, note: Note) {
        let t = &self.telemetry;
        match note {
            Note::Decision {
                policy,
                decision,
                count,
            } => Telemetry::add(
                &t.decisions,
                &[("policy", policy), ("decision", decision)],
                count,
            ),
            Note::PodError { .. } => {}
            Note::WarmupKeyError { pod } => {
                Telemetry::count(&t.warmup_key_errors, &[("pod", &pod)])
            }
            Note::FirstTierDone { pod, seconds } => {
                t.warmup_duration.observe(seconds);
                self.warmup_traces.first_tier_done(&pod, seconds);
                tracing::info!(pod = %pod, seconds, "warm-up first tier done: pod routable");
            }
            Note::Restarted {
                pod,
                epoch,
                evidence,
            } => {
                Telemetry::count(
                    &t.pod_restarts,
                    &[("pod", &pod), ("evidence", evidence.label())],
                );
                tracing::warn!(
                    pod = %pod, epoch, evidence = evidence.label(),
                    "pod restarted while up: its caches and adapters are gone; out of the table until warmed"
                );
            }
            Note::Planned {
                pod,
                adapters,
                first_tier,
                second_tier,
                lazy,
            } => {
                tracing::info!(
                    pod = %pod, adapters, first_tier, second_tier, lazy, "warm-up planned"
                );
                self.warmup_traces.planned(&PlanShape {
                    pod: &pod,
                    adapters,
                    first_tier,
                    second_tier,
                    lazy,
                    arms: &self.warm_arms(),
                });
            }
        }
    }

    /// The running experiment's arms that route with warm-up (`exp/arm`, comma-separated): the
    /// arms a warm-up serves, for its spans; empty with no experiment.
    pub fn warm_arms(&self) -> String {
        let state = self.state();
        let Some(running) = state.fleet.experiment() else {
            return String::new();
        };
        let id = &running.definition.id;
        running
            .definition
            .arms
            .iter()
            .filter(|a| a.settings.warmup)
            .map(|a| format!("{id}/{}", a.name))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A warm-up key (a prefill, an adapter load or touch) took `latency_ms`: for the grey
    /// release's warm-up criterion and `prewarm_warmup_key_seconds`.
    fn warmup_key_ended(&self, kind: &str, latency_ms: f64) {
        let now = self.now();
        self.warmup_latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(now, latency_ms);
        self.telemetry
            .warmup_key_seconds
            .get_or_create(&vec![("kind".to_string(), kind.to_string())])
            .observe(latency_ms / 1e3);
    }

    /// Ends the spans of warm-up plans that are over.
    pub fn close_finished_plan_spans(&self) {
        if self.warmup_traces.open_plans().is_empty() {
            return;
        }
        let state = self.state();
        self.warmup_traces.close_finished(|pod| {
            let progress = state.fleet.pod(pod)?.warmup.progress.as_ref()?;
            Some(progress.phase())
        });
    }

    /// Executes `action`; returns the outcomes of its adapter calls (none for a prefill).
    pub async fn execute(self: &Arc<Self>, action: Action) -> Vec<DecisionOutcome> {
        match action {
            Action::Prefill(p) => {
                self.prefill(p).await;
                Vec::new()
            }
            Action::Adapters(calls) => self.adapter_calls(calls).await,
        }
    }

    /// Executes `actions` one after another; returns their adapter calls' outcomes.
    pub async fn execute_all(self: &Arc<Self>, actions: Vec<Action>) -> Vec<DecisionOutcome> {
        let mut outcomes = Vec::new();
        for a in actions {
            outcomes.extend(self.execute(a).await);
        }
        outcomes
    }

    /// Executes `actions` in the background, in order.
    pub fn spawn_actions(&self, actions: Vec<Action>) {
        if actions.is_empty() {
            return;
        }
        let Some(me) = self.me() else {
            return;
        };
        tokio::spawn(async move {
            me.execute_all(actions).await;
        });
    }

    async fn prefill(self: &Arc<Self>, p: Prefill) {
        let span = self.warmup_traces.prefill_span(&p, &self.warm_arms());
        let outcome = match self.pod_handle(&p.pod) {
            Some((engine, _)) => {
                let request = PrefillRequest {
                    model: p.model.clone(),
                    endpoint: p.endpoint,
                    prefix_text: p.text.clone(),
                    shape: p.shape.clone(),
                };
                let form = request.form().label();
                span.record("prewarm.shape", form);
                Telemetry::count(&self.telemetry.prefill_shapes, &[("shape", form)]);
                let started = Instant::now();
                let result = engine.prefill(&request).instrument(span.clone()).await;
                let label = match &result {
                    Ok(()) => "ok",
                    Err(e) => e.label(),
                };
                let latency_ms = started.elapsed().as_secs_f64() * 1e3;
                key_done(&span, label, result.is_err(), latency_ms);
                self.warmup_key_ended("prefill", latency_ms);
                Telemetry::count(
                    &self.telemetry.prefills,
                    &[("pod", &p.pod), ("outcome", label)],
                );
                if let Err(e) = &result {
                    tracing::warn!(pod = %p.pod, prefix = %p.key, shape = form, error = %e, "prefill failed");
                    if let Some(pod) = self.state().pods.get_mut(&p.pod) {
                        pod.note_error(e.to_string());
                    }
                }
                prefill_outcome(&result)
            }
            None => {
                key_done(&span, "pod_gone", true, 0.0);
                PrefillOutcome::Failed
            }
        };
        let now = self.now();
        let first_tier_done = self.fleet(|f| {
            let before = f.table().generation;
            f.prefill_done(&p, outcome, now);
            f.table().generation != before
        });
        if first_tier_done {
            self.republish_table();
        }
    }

    async fn adapter_calls(self: &Arc<Self>, calls: AdapterCalls) -> Vec<DecisionOutcome> {
        let mut outcomes = Vec::with_capacity(calls.decisions.len());
        let mut failed = Vec::new();
        let arms = self.warm_arms();
        for d in &calls.decisions {
            let span = self
                .warmup_traces
                .adapter_span(&calls.pod, &calls.cause, d, &arms);
            let started = Instant::now();
            let outcome = self
                .execute_decision(&calls.pod, d)
                .instrument(span.clone())
                .await;
            let latency_ms = started.elapsed().as_secs_f64() * 1e3;
            key_done(&span, &outcome.outcome, outcome.error.is_some(), latency_ms);
            if !matches!(d, LoraDecision::Unload(_)) {
                self.warmup_key_ended(d.verb(), latency_ms);
            }
            if outcome.error.is_some() {
                failed.push(d.clone());
            }
            outcomes.push(outcome);
        }
        let now = self.now();
        self.fleet(|f| f.adapters_done(&calls, &failed, now));
        self.republish_table();
        outcomes
    }
}

/// How a prefill's call ended, for the core. A 4xx names the request itself (a chat template's
/// error on the shape, a body the engine refuses): rejected, so the entry backs off — except
/// 404 (the model or adapter is not on this pod: a pod's state, not the request's), 408 and
/// 429 (the pod was slow or busy), which fail like a 5xx or a transport error.
pub fn prefill_outcome(result: &Result<(), EngineError>) -> PrefillOutcome {
    match result {
        Ok(()) => PrefillOutcome::Ok,
        Err(EngineError::Rejected { status, .. })
            if (400..500).contains(status) && !matches!(status, 404 | 408 | 429) =>
        {
            PrefillOutcome::Rejected
        }
        Err(_) => PrefillOutcome::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(status: u16) -> Result<(), EngineError> {
        Err(EngineError::Rejected {
            pod: "p".into(),
            url: "u".into(),
            status,
            kind: "BadRequestError".into(),
            message: "m".into(),
        })
    }

    #[test]
    fn only_a_4xx_that_names_the_request_is_a_rejection() {
        assert_eq!(prefill_outcome(&Ok(())), PrefillOutcome::Ok);
        for status in [400, 413, 422] {
            assert_eq!(prefill_outcome(&rejected(status)), PrefillOutcome::Rejected);
        }
        for status in [404, 408, 429, 500, 503] {
            assert_eq!(prefill_outcome(&rejected(status)), PrefillOutcome::Failed);
        }
        let timeout = Err(EngineError::Timeout {
            pod: "p".into(),
            url: "u".into(),
        });
        assert_eq!(prefill_outcome(&timeout), PrefillOutcome::Failed);
    }
}
