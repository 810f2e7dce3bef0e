//! The spans of warm-up: one `warmup.plan` span per warm-up plan, from the plan to its end (done,
//! interrupted or replaced by a re-plan), and one span per key the gateway warms — a prefill
//! (`warmup.prefill`) or an adapter call (`warmup.adapter`) — from the call to the pod's answer.
//! A key of a plan is a child of its plan's span; a key warmed for another reason (keep-warm, a
//! filter's signal, a pin, an operator, a reconcile) is a root of its own.
//!
//! Attributes (all prefixed `prewarm.`): `pod`, `source` (`plan`, `keep_warm`, `signal`, `pin`,
//! `operator`, `reconcile`), `model`, `key` (a prefix's key) or `adapter` and `call`
//! (`load`/`unload`/`touch`), `tokens` (the prefix's tokens), `shape` (a prefill's form:
//! `chat`, `completion`, `unshaped`), `outcome` (`ok` or the error's label), `latency_ms`, and
//! `arms` — the running experiment's arms whose routing sees the warmth
//! (those with warm-up on: a warm-up is the fleet's, not one arm's), empty with no experiment.
//! A plan's span has `adapters`, `first_tier`, `second_tier`, `lazy` (its keys per tier),
//! `first_tier_seconds` once the pod is routable, and `outcome` (`done`, `interrupted`,
//! `replaced`, `pod_gone`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use tracing::field::Empty;
use tracing::Span;

use super::TARGET;
use crate::policy::fleet::{Cause, Prefill};
use crate::policy::warmup::WarmupPhase;
use crate::policy::LoraDecision;

/// The open plan spans, by pod.
#[derive(Default)]
pub struct WarmupTraces {
    plans: Mutex<BTreeMap<String, Span>>,
}

/// What a plan holds, for its span.
pub struct PlanShape<'a> {
    pub pod: &'a str,
    pub adapters: usize,
    pub first_tier: usize,
    pub second_tier: usize,
    pub lazy: usize,
    pub arms: &'a str,
}

impl WarmupTraces {
    fn plans(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Span>> {
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the span of a new plan for `shape.pod`, ending the pod's previous one as replaced.
    pub fn planned(&self, shape: &PlanShape<'_>) {
        let span = tracing::info_span!(
            target: TARGET,
            parent: None::<tracing::Id>,
            "warmup.plan",
            prewarm.pod = shape.pod,
            prewarm.adapters = shape.adapters as i64,
            prewarm.first_tier = shape.first_tier as i64,
            prewarm.second_tier = shape.second_tier as i64,
            prewarm.lazy = shape.lazy as i64,
            prewarm.arms = shape.arms,
            prewarm.first_tier_seconds = Empty,
            prewarm.outcome = Empty,
        );
        if let Some(previous) = self.plans().insert(shape.pod.to_string(), span) {
            previous.record("prewarm.outcome", "replaced");
        }
    }

    /// Records that `pod`'s plan reached routable after `seconds`.
    pub fn first_tier_done(&self, pod: &str, seconds: f64) {
        if let Some(span) = self.plans().get(pod) {
            span.record("prewarm.first_tier_seconds", seconds);
        }
    }

    /// Ends the spans of plans that are over: `phase` gives a pod's warm-up phase (`None`: the
    /// pod or its warm-up is gone).
    pub fn close_finished(&self, phase: impl Fn(&str) -> Option<WarmupPhase>) {
        self.plans().retain(|pod, span| {
            let outcome = match phase(pod) {
                Some(WarmupPhase::Done) => "done",
                Some(WarmupPhase::Interrupted) => "interrupted",
                Some(_) => return true,
                None => "pod_gone",
            };
            span.record("prewarm.outcome", outcome);
            false
        });
    }

    /// Pods with an open plan span.
    pub fn open_plans(&self) -> Vec<String> {
        self.plans().keys().cloned().collect()
    }

    /// The parent of a key warmed for `cause` on `pod`: its plan's span for a plan step.
    fn parent(&self, pod: &str, cause: &Cause) -> Option<tracing::Id> {
        match cause {
            Cause::Warmup(_) => self.plans().get(pod).and_then(Span::id),
            _ => None,
        }
    }

    /// The span of prefill `p` (record its end with [`key_done`]).
    pub fn prefill_span(&self, p: &Prefill, arms: &str) -> Span {
        let tokens = p
            .shards
            .last()
            .map_or(0, |s| s.base_offset.saturating_add(s.valid_len));
        tracing::info_span!(
            target: TARGET,
            parent: self.parent(&p.pod, &p.cause),
            "warmup.prefill",
            prewarm.pod = p.pod.as_str(),
            prewarm.source = source(&p.cause),
            prewarm.model = p.model.as_str(),
            prewarm.key = %p.key,
            prewarm.tokens = tokens as i64,
            prewarm.arms = arms,
            prewarm.shape = Empty,
            prewarm.outcome = Empty,
            prewarm.latency_ms = Empty,
        )
    }

    /// The span of adapter call `decision` on `pod` (record its end with [`key_done`]).
    pub fn adapter_span(
        &self,
        pod: &str,
        cause: &Cause,
        decision: &LoraDecision,
        arms: &str,
    ) -> Span {
        tracing::info_span!(
            target: TARGET,
            parent: self.parent(pod, cause),
            "warmup.adapter",
            prewarm.pod = pod,
            prewarm.source = source(cause),
            prewarm.adapter = decision.adapter(),
            prewarm.call = decision.verb(),
            prewarm.arms = arms,
            prewarm.outcome = Empty,
            prewarm.latency_ms = Empty,
        )
    }
}

/// Records a key's outcome and latency on its span; a failure also sets the span's status.
pub fn key_done(span: &Span, outcome: &str, failed: bool, latency_ms: f64) {
    span.record("prewarm.outcome", outcome);
    span.record("prewarm.latency_ms", latency_ms);
    if failed {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        span.set_status(opentelemetry::trace::Status::error(outcome.to_string()));
    }
}

/// The `source` attribute of a key warmed for `cause`.
pub fn source(cause: &Cause) -> &'static str {
    match cause {
        Cause::Warmup(_) => "plan",
        Cause::KeepWarm => "keep_warm",
        Cause::NewPattern => "signal",
        Cause::Pin => "pin",
        Cause::Operator => "operator",
        Cause::Reconcile => "reconcile",
    }
}
