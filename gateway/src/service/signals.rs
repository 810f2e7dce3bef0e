//! Ingesting a filter's [`SignalBatch`] into the fleet core (which applies it: served records,
//! pool, warm sets, pins) and executing the adapter calls its pins need, in the background.

use prewarm_core::wire::SignalBatch;
use serde::Serialize;

use super::{now_ms, Gateway};
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
    pub fn ingest_signals(&self, batch: SignalBatch) -> SignalsAccepted {
        let dropped = batch.dropped;
        let source_len = batch.signals.len();
        let (served, served_dropped) = (batch.served.len(), batch.served_dropped);
        let (report, actions) = self.fleet(|f| f.on_signals(batch, now_ms()));
        self.spawn_actions(actions);
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
        SignalsAccepted {
            prefills: report.prefills,
            feedback: report.feedback,
            pins: report.pins.len(),
            rejected: report.rejected,
            reasons: report.reasons.iter().map(|r| r.to_string()).collect(),
        }
    }
}
