//! Ingesting a filter's [`SignalBatch`]: prefill and feedback signals go to the prompt pool, pin
//! signals to the LoRA residency of the pods the adapter is placed on.

use prewarm_core::fingerprint::{routing_key, shards_of};
use prewarm_core::place;
use prewarm_core::wire::{Signal, SignalBatch};
use serde::Serialize;

use super::placement::{adapter_scopes, candidates_of, routable_pods};
use super::{now_ms, Gateway, State};
use crate::policy::{candidates_for, PrefixKey};
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
        let hot: Vec<PrefixKey> = batch
            .signals
            .iter()
            .filter_map(|s| match s {
                Signal::Prefill(p) => p.prefix.last().map(|last| PrefixKey::new(&p.model, *last)),
                _ => None,
            })
            .collect();
        let report = {
            let mut state = self.state();
            let report = state.pool.ingest(batch, now);
            for pin in &report.pins {
                self.apply_pin_signal(&mut state, pin, now);
            }
            let placed = self.keep_warm_where_routed(&mut state, &hot, now);
            Telemetry::add(
                &self.telemetry.decisions,
                &[("policy", "kv"), ("decision", "warm_signalled")],
                placed as u64,
            );
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

impl Gateway {
    /// Adds each signalled hot prefix to the warm set of the pod the filters route it to (core's
    /// placement over the routable pods serving its model, keyed by its routing key), unless the
    /// KV model believes it resident there; the keep-warm loop then prefills it within the pod's budget. Returns
    /// how many were added.
    fn keep_warm_where_routed(&self, state: &mut State, keys: &[PrefixKey], now: u64) -> usize {
        let fingerprint = self.config.fingerprint.core();
        let routable = routable_pods(state, now);
        let candidates = candidates_of(&routable);
        let scopes = adapter_scopes(state, &candidates, &self.config.pods, now);
        let mut added = 0;
        for key in keys {
            let Some(view) = state.pool.get(key) else {
                continue;
            };
            let Some(rk) = routing_key(view.blocks, &fingerprint) else {
                continue;
            };
            let shards = shards_of(view.blocks, &fingerprint);
            let among = candidates_for(key.model, &candidates, &scopes);
            let Some(pod_id) = place(rk.0, among).and_then(|i| among.get(i)) else {
                continue;
            };
            if let Some(pod) = state.pods.get_mut(pod_id.id) {
                if !pod.kv.is_resident(key) {
                    pod.kv.keep_warm_prefix(*key, &shards);
                    added += 1;
                }
            }
        }
        added
    }
}
