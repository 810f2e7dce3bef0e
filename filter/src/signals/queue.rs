//! The queues every worker appends to and a root tick drains into one batch: pending signals,
//! served records (core's `ServedRecord`: which pod each routed request went to, for the
//! gateway's KV model) and outcome records (core's `OutcomeRecord`, for experiments). Each is a [`SharedRing`] of slots, one encoded record (JSON) per slot.
//! Appending costs one 8-byte compare-and-swap and one write of that record, whatever the queue
//! holds; a record longer than its cap is dropped (counted) so that a queue's memory is bounded
//! by `slots × cap`. Beyond `slots` pending, the oldest are overwritten; the taker counts them
//! and the count travels in the next batch (`dropped`, `served_dropped`).
//!
//! A take is cut to fit a batch: at most `max_batch_signals` signals (and core's
//! `MAX_SERVED_PER_BATCH` records), and at most `max_batch_bytes` for the whole encoded
//! `SignalBatch`: core's envelope bound, then five eighths of the rest for signals (each with
//! its comma), a quarter for served records and an eighth for outcome records (core's
//! `MAX_OUTCOMES_PER_BATCH` of ~150 bytes fit in the default's). `max_batch_bytes` is at most core's
//! `MAX_SIGNAL_BATCH_BYTES`, the gateway's default body limit, so a batch is never refused for
//! its size.

use std::marker::PhantomData;

use prewarm_core::wire::{
    OutcomeRecord, ServedRecord, Signal, SignalBatch, MAX_NAME_BYTES, MAX_OUTCOMES_PER_BATCH,
    MAX_SERVED_PER_BATCH,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::FilterConfig;
use crate::host::{Host, Metric};
use crate::shared::Keys;
use crate::signals::ring::SharedRing;

/// Records taken for one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending<T> {
    /// Records dropped since the last batch was taken.
    pub dropped: u64,
    pub records: Vec<T>,
}

/// A queue of one record kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordQueue<T> {
    ring: SharedRing,
    max_record_bytes: usize,
    max_batch_records: usize,
    /// Bytes of records (and commas) a batch may carry.
    batch_budget: usize,
    retries: u32,
    enqueued: Metric,
    dropped: Metric,
    kind: PhantomData<fn() -> T>,
}

/// The pending signals.
pub type SignalQueue = RecordQueue<Signal>;

/// The served records.
pub type ServedQueue = RecordQueue<ServedRecord>;

/// The outcome records.
pub type OutcomeQueue = RecordQueue<OutcomeRecord>;

/// What a batch may carry beside its envelope.
fn records_budget(config: &FilterConfig) -> usize {
    config
        .max_batch_bytes
        .saturating_sub(SignalBatch::envelope_bytes(&config.source))
}

impl SignalQueue {
    pub fn new(config: &FilterConfig, keys: &Keys) -> Self {
        let budget = records_budget(config);
        Self {
            ring: SharedRing::new(&keys.signals(), config.max_pending_signals),
            max_record_bytes: config.max_signal_bytes,
            max_batch_records: config.max_batch_signals,
            batch_budget: budget - budget / 4 - budget / 8,
            retries: config.cas_retries,
            enqueued: Metric::SignalsEnqueued,
            dropped: Metric::SignalsDropped,
            kind: PhantomData,
        }
    }
}

impl ServedQueue {
    /// A served record is a pod id, a model name (each at most core's name cap), a hash per
    /// 512-token shard of the fingerprinted prefix and two counts.
    pub fn served(config: &FilterConfig, keys: &Keys) -> Self {
        let shards = config.max_prefix_tokens.div_ceil(512);
        Self {
            ring: SharedRing::new(&keys.served(), config.max_pending_served),
            max_record_bytes: shards.saturating_mul(24).saturating_add(1024),
            max_batch_records: MAX_SERVED_PER_BATCH,
            batch_budget: records_budget(config) / 4,
            retries: config.cas_retries,
            enqueued: Metric::ServedEnqueued,
            dropped: Metric::ServedDropped,
            kind: PhantomData,
        }
    }
}

impl OutcomeQueue {
    /// An outcome record is three names (each at most core's name cap) and six numbers.
    pub fn outcomes(config: &FilterConfig, keys: &Keys) -> Self {
        Self {
            ring: SharedRing::new(&keys.outcomes(), config.max_pending_outcomes),
            max_record_bytes: 3 * MAX_NAME_BYTES + 256,
            max_batch_records: MAX_OUTCOMES_PER_BATCH,
            batch_budget: records_budget(config) / 8,
            retries: config.cas_retries,
            enqueued: Metric::OutcomesEnqueued,
            dropped: Metric::OutcomesDropped,
            kind: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> RecordQueue<T> {
    /// The shared-data keys the queue can use.
    pub fn keys(&self) -> impl Iterator<Item = String> + '_ {
        self.ring.keys()
    }

    /// Appends records; counts enqueued and dropped ones.
    pub fn enqueue<H: Host + ?Sized>(&self, host: &H, records: Vec<T>) {
        for record in records {
            let bytes = serde_json::to_vec(&record).unwrap_or_default();
            let fits = !bytes.is_empty() && bytes.len() <= self.max_record_bytes;
            if fits && self.ring.push(host, &bytes, self.retries) {
                host.count(self.enqueued, 1);
            } else {
                host.count(self.dropped, 1);
            }
        }
    }

    /// Takes the oldest records that fit one batch, and the dropped count.
    pub fn take<H: Host + ?Sized>(&self, host: &H) -> Pending<T> {
        let taken = self
            .ring
            .take(host, self.max_batch_records, self.batch_budget, |record| {
                record.len().saturating_add(1)
            });
        let mut pending = Pending {
            dropped: taken.dropped,
            records: Vec::with_capacity(taken.records.len()),
        };
        for record in taken.records {
            match serde_json::from_slice::<T>(&record) {
                Ok(r) => pending.records.push(r),
                Err(_) => pending.dropped = pending.dropped.saturating_add(1),
            }
        }
        if pending.dropped > 0 {
            host.count(self.dropped, pending.dropped);
        }
        pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use prewarm_core::wire::{PatternState, PinSignal, PrefillSignal, MAX_SIGNAL_BATCH_BYTES};
    use prewarm_core::{BlockHash, Endpoint};

    fn pin(name: &str) -> Signal {
        Signal::Pin(PinSignal {
            adapter: name.into(),
            tenant: None,
            rate_per_minute: 6.0,
            priority: 1,
        })
    }

    fn prefill(text_bytes: usize) -> Signal {
        Signal::Prefill(PrefillSignal {
            model: "m".into(),
            tenant: None,
            endpoint: Endpoint::Completions,
            prefix: vec![BlockHash(1); 512],
            prefix_tokens: 512 * 64,
            prefix_text: "x".repeat(text_bytes),
            state: PatternState::New,
            priority: 1,
            keep_warm: true,
            shape: None,
        })
    }

    fn queue(config: FilterConfig) -> SignalQueue {
        SignalQueue::new(&config, &Keys::new("p/"))
    }

    #[test]
    fn bounded_oldest_dropped_and_reported() {
        let h = FakeHost::new();
        let q = queue(FilterConfig {
            max_pending_signals: 3,
            max_batch_signals: 2,
            ..FilterConfig::default()
        });
        q.enqueue(&h, (0..5).map(|i| pin(&format!("a{i}"))).collect());
        let taken = q.take(&h);
        assert_eq!(taken.dropped, 2);
        assert_eq!(taken.records, vec![pin("a2"), pin("a3")]);
        let rest = q.take(&h);
        assert_eq!((rest.dropped, rest.records), (0, vec![pin("a4")]));
        assert!(q.take(&h).records.is_empty());
        assert_eq!(h.metric(Metric::SignalsDropped), 2);
    }

    #[test]
    fn a_signal_above_its_cap_is_dropped_at_enqueue() {
        let h = FakeHost::new();
        let q = queue(FilterConfig::default());
        q.enqueue(&h, vec![prefill(300 << 10), pin("a")]);
        assert_eq!(h.metric(Metric::SignalsDropped), 1);
        assert_eq!(q.take(&h).records, vec![pin("a")]);
    }

    /// A full queue of the largest signals drains in batches the gateway's default limit
    /// accepts, every one of them within `max_batch_bytes`.
    #[test]
    fn batches_from_a_full_queue_fit_the_gateway_limit() {
        let h = FakeHost::new();
        let config = FilterConfig {
            max_batch_bytes: MAX_SIGNAL_BATCH_BYTES,
            max_pending_signals: 40,
            ..FilterConfig::default()
        };
        let q = queue(config.clone());
        let big = prefill(config.max_signal_bytes - (20 << 10));
        let n = config.max_pending_signals;
        q.enqueue(&h, vec![big; n]);
        let mut sent = 0;
        for _ in 0..n {
            let taken = q.take(&h);
            if taken.records.is_empty() {
                break;
            }
            sent += taken.records.len();
            let body = SignalBatch::new(config.source.clone(), u64::MAX, taken.records).encode();
            assert!(body.len() <= config.max_batch_bytes, "{}", body.len());
            assert!(SignalBatch::decode(&body).is_ok());
        }
        assert_eq!(sent, n, "every signal went out, none dropped");
    }

    /// Appending to a full queue costs the signal, not the queue (the old queue re-read and
    /// re-wrote the whole JSON document, up to 4 MiB, per append).
    #[test]
    fn enqueue_on_a_full_queue_moves_only_the_signal() {
        let h = FakeHost::new();
        let q = queue(FilterConfig::default());
        let signal = prefill(16 << 10);
        let size = serde_json::to_vec(&signal).unwrap().len();
        q.enqueue(&h, vec![signal.clone(); 300]);
        h.reset_shared_traffic();
        q.enqueue(&h, vec![signal]);
        let (read, written) = h.shared_traffic();
        assert!(read <= 8 && written <= size + 16, "{read} {written}");
    }
}
