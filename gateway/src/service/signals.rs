//! Ingesting a filter's [`SignalBatch`] into the fleet core (which applies it: served records,
//! pool, warm sets, pins) and executing the adapter calls its pins need, in the background.

use prewarm_core::wire::{OutcomeRecord, SignalBatch};
use serde::Serialize;

use super::Gateway;
use crate::policy::fleet::Action;
use crate::telemetry::Telemetry;

/// What `POST /v1/signals` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SignalsAccepted {
    pub prefills: usize,
    pub feedback: usize,
    pub pins: usize,
    pub rejected: usize,
    /// The first few reasons for rejected signals (`field: value: rule`).
    pub reasons: Vec<String>,
}

impl Gateway {
    /// Applies `batch` and executes the actions it needs in the background.
    pub fn ingest_signals(&self, batch: SignalBatch) -> SignalsAccepted {
        let (accepted, actions) = self.apply_signals(batch);
        self.spawn_actions(actions);
        accepted
    }

    /// Applies `batch`; returns what was accepted and the actions it needs.
    pub fn apply_signals(&self, mut batch: SignalBatch) -> (SignalsAccepted, Vec<Action>) {
        self.ingest_outcomes(&std::mem::take(&mut batch.outcomes), batch.outcomes_dropped);
        self.ingest_embeddings(&std::mem::take(&mut batch.embeddings));
        let dropped = batch.dropped;
        let source_len = batch.signals.len();
        let (served, served_dropped) = (batch.served.len(), batch.served_dropped);
        let now = self.now();
        let (report, actions) = self.fleet(|f| f.on_signals(batch, now));
        let t = &self.telemetry;
        Telemetry::add(&t.signals, &[("kind", "prefill")], report.prefills as u64);
        Telemetry::add(&t.signals, &[("kind", "feedback")], report.feedback as u64);
        Telemetry::add(&t.signals, &[("kind", "pin")], report.pins.len() as u64);
        Telemetry::add(&t.signals, &[("kind", "rejected")], report.rejected as u64);
        Telemetry::add(&t.signals, &[("kind", "dropped_by_filter")], dropped);
        Telemetry::add(&t.signals, &[("kind", "served")], served as u64);
        Telemetry::add(
            &t.signals,
            &[("kind", "served_dropped_by_filter")],
            served_dropped,
        );
        if report.rejected > 0 {
            tracing::debug!(
                signals = source_len,
                rejected = report.rejected,
                "signals refused"
            );
        }
        let accepted = SignalsAccepted {
            prefills: report.prefills,
            feedback: report.feedback,
            pins: report.pins.len(),
            rejected: report.rejected,
            reasons: report.reasons.iter().map(|r| r.to_string()).collect(),
        };
        (accepted, actions)
    }

    /// Counts the records of adapters whose rollout is under watch (possible records only).
    fn count_rollout_outcomes(&self, records: &[OutcomeRecord]) {
        let mut state = self.state();
        let registry = state.fleet.registry_mut();
        if !registry.watching() {
            return;
        }
        for r in records.iter().filter(|r| r.problem().is_none()) {
            if let Some(model) = &r.model {
                registry.count_outcome(model, r.at_ms, r.status);
            }
        }
    }

    /// Adds a batch's outcome records to the ledger, counted by what became of them.
    fn ingest_outcomes(&self, records: &[OutcomeRecord], dropped_by_filter: u64) {
        let now = self.now();
        let (joined, ttfb) = {
            let state = self.state();
            let running = state.fleet.experiment();
            let joined: Vec<String> = running.map(|r| r.joined_pods.clone()).unwrap_or_default();
            (joined, self.telemetry.experiment_ttfb(running))
        };
        let got = self
            .outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .ingest_observed(
                records,
                now,
                |pod| joined.iter().any(|p| p == pod),
                |label, r| ttfb.observe(label, r),
            );
        self.count_rollout_outcomes(records);
        let t = &self.telemetry.outcomes;
        Telemetry::add(t, &[("kind", "accepted")], got.accepted);
        Telemetry::add(t, &[("kind", "rejected")], got.rejected);
        Telemetry::add(t, &[("kind", "dropped")], got.dropped);
        Telemetry::add(t, &[("kind", "dropped_by_filter")], dropped_by_filter);
    }
}
