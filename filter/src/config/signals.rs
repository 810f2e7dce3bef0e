//! The Signals section of the filter's configuration: what makes a signal (the triggers, their
//! rate window, the models never pinned) and the bounds of what waits for a batch and goes in
//! one (signals, served records, outcome records).

use prewarm_core::trigger::TriggerConfig;
use prewarm_core::wire::MAX_SIGNAL_BATCH_BYTES;
use serde::Deserialize;

use super::range;

/// Most signals in one batch (the gateway refuses more).
pub const MAX_BATCH_SIGNALS: usize = 10_000;

/// Signals, records and their batches (JSON keys at the top level, `triggers` a table).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SignalsConfig {
    /// Most signals in one POST (default 64).
    pub max_batch_signals: usize,
    /// Most bytes of one POST's body (default 1 MiB; at most core's `MAX_SIGNAL_BATCH_BYTES`,
    /// the gateway's default limit).
    pub max_batch_bytes: usize,
    /// Most signals waiting in the shared queue (its slots); the oldest are dropped beyond
    /// (default 256).
    pub max_pending_signals: usize,
    /// Most served records (which pod each routed request went to, for the gateway's KV model)
    /// waiting in their shared queue; the oldest are dropped beyond (default 4096).
    pub max_pending_served: usize,
    /// Whether the filter records each inference request's outcome (time to first byte,
    /// status, usage) for experiments (default true; docs/experiments.md#outcomes).
    pub outcomes: bool,
    /// Outcome records waiting in their shared queue; the oldest are dropped beyond (default
    /// 4096).
    pub max_pending_outcomes: usize,
    /// Longest signal queued, bytes of JSON; longer ones are dropped (default 256 KiB: a
    /// prefill of the default 32768 prefix tokens, 128 KiB of text, fits with room for escapes).
    /// At most a batch less its envelope (a rule of [`super::FilterConfig::validate`]).
    pub max_signal_bytes: usize,
    /// Trigger thresholds (defaults 0.85 / 3 / 5 per minute / 20 per minute).
    pub triggers: TriggerConfig,
    /// Window of the pattern and adapter rates, ms (default 60000).
    pub rate_window_ms: u64,
    /// Models that are base models, not LoRA adapters: never pinned (default none).
    pub base_models: Vec<String>,
}

impl Default for SignalsConfig {
    fn default() -> Self {
        Self {
            max_batch_signals: 64,
            max_batch_bytes: 1 << 20,
            max_pending_signals: 256,
            max_pending_served: 4096,
            outcomes: true,
            max_pending_outcomes: 4096,
            max_signal_bytes: 256 << 10,
            triggers: TriggerConfig::default(),
            rate_window_ms: 60_000,
            base_models: Vec::new(),
        }
    }
}

impl SignalsConfig {
    /// This section's problems, as `field: value: rule` (`triggers.field` for the table's).
    pub fn validate(&self, p: &mut Vec<String>) {
        p.extend(self.triggers.validate("triggers."));
        range(
            p,
            "max_batch_signals",
            self.max_batch_signals,
            1,
            MAX_BATCH_SIGNALS,
        );
        for (field, value) in [
            ("max_pending_signals", self.max_pending_signals),
            ("max_pending_served", self.max_pending_served),
            ("max_pending_outcomes", self.max_pending_outcomes),
        ] {
            range(p, field, value, 1, 100_000);
        }
        // the gateway's default body limit: a batch is never refused for its size
        range(
            p,
            "max_batch_bytes",
            self.max_batch_bytes,
            4096,
            MAX_SIGNAL_BATCH_BYTES,
        );
        range(p, "rate_window_ms", self.rate_window_ms, 1000, 3_600_000);
    }
}
