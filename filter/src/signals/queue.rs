//! The queues every worker appends to and a root tick drains into one batch: pending signals,
//! served records (core's `ServedRecord`: which pod each routed request went to, for the
//! gateway's KV model) and outcome records (core's `OutcomeRecord`, for experiments). Each is a [`SharedRing`] of slots, one encoded record (JSON) per slot.
//! Appending costs one 8-byte compare-and-swap and one write of that record, whatever the queue
//! holds; a record longer than its cap is dropped (counted) so that a queue's memory is bounded
//! by `slots × cap`. Beyond `slots` pending, the oldest are overwritten; the taker counts them
//! and the count travels in the next batch (`dropped`, `served_dropped`).
//!
//! Served and outcome records are made on the request path, one per routed request: there they
//! are kept in the VM ([`RecordQueue::defer`]) and appended [`FLUSH_AT`] at a time
//! ([`RecordQueue::flush`]: one compare-and-swap claims them all, then a write a record) by the
//! request that fills the chunk, and what is left by the root tick before it takes the batch. A
//! record so costs its request about one shared-data write instead of three calls and a metric,
//! and the tick never appends more than a chunk (appending a whole tick's records there, ~3,600
//! a second at 2 KB bodies, held the worker ~10 ms: p99 15 ms against 6). A request's records
//! reach the gateway in the batch of a tick after their chunk was appended. Signals are enqueued
//! at once (they are few: a streak's end, the tick's tallies).
//!
//! A take is cut to fit a batch: at most `max_batch_signals` signals (and core's
//! `MAX_SERVED_PER_BATCH` records), and at most `max_batch_bytes` for the whole encoded
//! `SignalBatch`: core's envelope bound, then five eighths of the rest for signals (each with
//! its comma), a quarter for served records and an eighth for outcome records (core's
//! `MAX_OUTCOMES_PER_BATCH` of ~150 bytes fit in the default's). `max_batch_bytes` is at most core's
//! `MAX_SIGNAL_BATCH_BYTES`, the gateway's default body limit, so a batch is never refused for
//! its size.

use std::cell::RefCell;
use std::collections::VecDeque;
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

/// Records a VM keeps before the request that makes the last of them appends them all: its
/// extra cost is this many slot writes (~0.1 ms), while the claim's two calls amortise to ~0.06
/// a record.
pub const FLUSH_AT: usize = 32;

/// Records taken for one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending<T> {
    /// Records dropped since the last batch was taken.
    pub dropped: u64,
    pub records: Vec<T>,
}

/// A queue of one record kind.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordQueue<T> {
    ring: SharedRing,
    max_record_bytes: usize,
    max_batch_records: usize,
    /// Bytes of records (and commas) a batch may carry.
    batch_budget: usize,
    retries: u32,
    enqueued: Metric,
    dropped: Metric,
    /// This VM's records since its last tick (`defer`), at most the ring's slots.
    deferred: RefCell<VecDeque<T>>,
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
        .signals
        .max_batch_bytes
        .saturating_sub(SignalBatch::envelope_bytes(&config.gateway.source))
}

impl SignalQueue {
    pub fn new(config: &FilterConfig, keys: &Keys) -> Self {
        let budget = records_budget(config);
        Self {
            ring: SharedRing::new(&keys.signals(), config.signals.max_pending_signals),
            max_record_bytes: config.signals.max_signal_bytes,
            max_batch_records: config.signals.max_batch_signals,
            batch_budget: budget - budget / 4 - budget / 8,
            retries: config.shared_data.cas_retries,
            enqueued: Metric::SignalsEnqueued,
            dropped: Metric::SignalsDropped,
            deferred: RefCell::default(),
            kind: PhantomData,
        }
    }
}

impl ServedQueue {
    /// A served record is a pod id, a model name (each at most core's name cap), a hash per
    /// 512-token shard of the fingerprinted prefix and two counts.
    pub fn served(config: &FilterConfig, keys: &Keys) -> Self {
        let shards = config.requests.max_prefix_tokens.div_ceil(512);
        Self {
            ring: SharedRing::new(&keys.served(), config.signals.max_pending_served),
            max_record_bytes: shards.saturating_mul(24).saturating_add(1024),
            max_batch_records: MAX_SERVED_PER_BATCH,
            batch_budget: records_budget(config) / 4,
            retries: config.shared_data.cas_retries,
            enqueued: Metric::ServedEnqueued,
            dropped: Metric::ServedDropped,
            deferred: RefCell::default(),
            kind: PhantomData,
        }
    }
}

impl OutcomeQueue {
    /// An outcome record is three names (each at most core's name cap) and six numbers.
    pub fn outcomes(config: &FilterConfig, keys: &Keys) -> Self {
        Self {
            ring: SharedRing::new(&keys.outcomes(), config.signals.max_pending_outcomes),
            max_record_bytes: 3 * MAX_NAME_BYTES + 256,
            max_batch_records: MAX_OUTCOMES_PER_BATCH,
            batch_budget: records_budget(config) / 8,
            retries: config.shared_data.cas_retries,
            enqueued: Metric::OutcomesEnqueued,
            dropped: Metric::OutcomesDropped,
            deferred: RefCell::default(),
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

    /// Keeps a record of this VM's, and appends the kept ones when they make a chunk
    /// ([`FLUSH_AT`]); the tick's [`flush`](Self::flush) appends the rest. Beyond the ring's
    /// slots the oldest kept is dropped (counted), as the ring would drop it.
    pub fn defer<H: Host + ?Sized>(&self, host: &H, record: T) {
        let full = {
            let mut deferred = self.deferred.borrow_mut();
            if deferred.len() as u64 >= self.ring.slots() {
                deferred.pop_front();
                host.count(self.dropped, 1);
            }
            deferred.push_back(record);
            deferred.len() >= FLUSH_AT
        };
        if full {
            self.flush(host);
        }
    }

    /// Appends the records kept since the last flush to the ring, oldest first, with one
    /// compare-and-swap for all of them; counts enqueued and dropped ones (one metric call
    /// each at most).
    pub fn flush<H: Host + ?Sized>(&self, host: &H) {
        let records = std::mem::take(&mut *self.deferred.borrow_mut());
        if records.is_empty() {
            return;
        }
        let total = records.len();
        let encoded: Vec<Vec<u8>> = records
            .iter()
            .filter_map(|r| serde_json::to_vec(r).ok())
            .filter(|b| !b.is_empty() && b.len() <= self.max_record_bytes)
            .collect();
        let written = self.ring.push_all(host, &encoded, self.retries);
        if written > 0 {
            host.count(self.enqueued, written as u64);
        }
        let lost = total.saturating_sub(written);
        if lost > 0 {
            host.count(self.dropped, lost as u64);
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
    use crate::config::SignalsConfig;
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
            signals: SignalsConfig {
                max_pending_signals: 3,
                max_batch_signals: 2,
                ..SignalsConfig::default()
            },
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
            signals: SignalsConfig {
                max_batch_bytes: MAX_SIGNAL_BATCH_BYTES,
                max_pending_signals: 40,
                ..SignalsConfig::default()
            },
            ..FilterConfig::default()
        };
        let q = queue(config.clone());
        let big = prefill(config.signals.max_signal_bytes - (20 << 10));
        let n = config.signals.max_pending_signals;
        q.enqueue(&h, vec![big; n]);
        let mut sent = 0;
        for _ in 0..n {
            let taken = q.take(&h);
            if taken.records.is_empty() {
                break;
            }
            sent += taken.records.len();
            let body =
                SignalBatch::new(config.gateway.source.clone(), u64::MAX, taken.records).encode();
            assert!(
                body.len() <= config.signals.max_batch_bytes,
                "{}",
                body.len()
            );
            assert!(SignalBatch::decode(&body).is_ok());
        }
        assert_eq!(sent, n, "every signal went out, none dropped");
    }

    fn served(pod: &str) -> ServedRecord {
        ServedRecord {
            pod: pod.into(),
            model: "m".into(),
            shards: vec![BlockHash(7)],
            chained_tokens: 64,
            prompt_tokens: 70,
        }
    }

    /// A request's record costs it no host call until a chunk is full; the tick appends what
    /// is kept with one claim of the ring's tail, in the order they were made, and counts them
    /// once.
    #[test]
    fn deferred_records_cost_no_host_call_and_reach_the_ring_in_order_on_flush() {
        let h = FakeHost::new();
        let q = ServedQueue::served(&FilterConfig::default(), &Keys::new("p/"));
        h.take_host_calls();
        for pod in ["a", "b", "c"] {
            q.defer(&h, served(pod));
        }
        assert_eq!(h.take_host_calls().total(), 0);
        assert!(
            q.take(&h).records.is_empty(),
            "nothing in the ring before the tick"
        );
        h.take_host_calls();
        q.flush(&h);
        let calls = h.take_host_calls();
        // one read and one compare-and-swap of the tail, a write a record, one metric
        assert_eq!(
            (calls.shared_get, calls.shared_set, calls.metric),
            (1, 4, 1)
        );
        assert_eq!(h.metric(Metric::ServedEnqueued), 3);
        let pods: Vec<String> = q.take(&h).records.into_iter().map(|r| r.pod).collect();
        assert_eq!(pods, ["a", "b", "c"]);
        q.flush(&h);
        assert!(
            q.take(&h).records.is_empty(),
            "a flush empties what the VM kept"
        );
    }

    /// The request that fills a chunk appends it, so a tick never appends more than a chunk.
    #[test]
    fn the_request_that_fills_a_chunk_appends_it() {
        let h = FakeHost::new();
        let q = ServedQueue::served(&FilterConfig::default(), &Keys::new("p/"));
        h.take_host_calls();
        for i in 0..FLUSH_AT - 1 {
            q.defer(&h, served(&format!("p{i}")));
        }
        assert_eq!(h.take_host_calls().total(), 0);
        q.defer(&h, served("last"));
        let calls = h.take_host_calls();
        assert_eq!(calls.shared_set, 1 + FLUSH_AT as u64, "{calls:?}");
        assert_eq!(h.metric(Metric::ServedEnqueued), FLUSH_AT as u64);
        h.take_host_calls();
        q.flush(&h);
        assert_eq!(h.take_host_calls().total(), 0, "nothing left for the tick");
        assert_eq!(q.take(&h).records.len(), FLUSH_AT);
    }

    /// A VM keeps at most the ring's slots between ticks: beyond, the oldest go, counted.
    #[test]
    fn deferred_records_beyond_the_slots_drop_the_oldest_counted() {
        let h = FakeHost::new();
        let config = FilterConfig {
            signals: SignalsConfig {
                max_pending_served: 2,
                ..SignalsConfig::default()
            },
            ..FilterConfig::default()
        };
        let q = ServedQueue::served(&config, &Keys::new("p/"));
        for pod in ["a", "b", "c"] {
            q.defer(&h, served(pod));
        }
        assert_eq!(h.metric(Metric::ServedDropped), 1);
        q.flush(&h);
        let pods: Vec<String> = q.take(&h).records.into_iter().map(|r| r.pod).collect();
        assert_eq!(pods, ["b", "c"]);
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
