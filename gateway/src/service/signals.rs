//! Ingesting a filter's [`SignalBatch`]: prefill and feedback signals go to the prompt pool, pin
//! signals to the LoRA residency of the pods the adapter is placed on.

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
        let now = now_ms();
        let dropped = batch.dropped;
        let source_len = batch.signals.len();
        let report = {
            let mut state = self.state();
            let report = state.pool.ingest(batch, now);
            for pin in &report.pins {
                self.apply_pin_signal(&mut state, pin, now);
            }
            report
        };
        let t = &self.telemetry;
        Telemetry::add(&t.signals, &[("kind", "prefill")], report.prefills as u64);
        Telemetry::add(&t.signals, &[("kind", "feedback")], report.feedback as u64);
        Telemetry::add(&t.signals, &[("kind", "pin")], report.pins.len() as u64);
        Telemetry::add(&t.signals, &[("kind", "rejected")], report.rejected as u64);
        Telemetry::add(&t.signals, &[("kind", "dropped_by_filter")], dropped);
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
