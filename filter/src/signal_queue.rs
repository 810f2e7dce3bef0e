//! The pending-signal queue every worker appends to and a root tick drains: one shared-data
//! value (JSON `{"dropped":N,"signals":[...]}`) updated with compare-and-swap. It is bounded in
//! count and bytes: beyond either bound the oldest signals are dropped and counted, and the
//! count travels in the next batch's `dropped`. Adopted-feedback signals for the same prefix
//! are merged into one with a count, so a hot template costs one entry per tick, not one per
//! request.

use prewarm_core::wire::Signal;
use serde::{Deserialize, Serialize};

use crate::host::{Host, Metric};
use crate::shared::update;

/// What the queue holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingSignals {
    /// Signals dropped since the last batch was taken.
    #[serde(default)]
    pub dropped: u64,
    #[serde(default)]
    pub signals: Vec<Signal>,
}

impl PendingSignals {
    fn read(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or_default()
    }

    fn push(&mut self, signal: Signal) {
        if let Signal::Feedback(new) = &signal {
            for queued in &mut self.signals {
                if let Signal::Feedback(f) = queued {
                    if f.model == new.model && f.prefix == new.prefix && f.outcome == new.outcome {
                        f.count = f.count.saturating_add(new.count);
                        return;
                    }
                }
            }
        }
        self.signals.push(signal);
    }

    /// Drops the oldest signals beyond the bounds; returns how many.
    fn bound(&mut self, max_signals: usize, max_bytes: usize) -> u64 {
        let sizes: Vec<usize> = self
            .signals
            .iter()
            .map(|s| serde_json::to_vec(s).map_or(0, |v| v.len().saturating_add(1)))
            .collect();
        let mut total: usize = sizes.iter().sum();
        let mut cut = 0;
        for size in &sizes {
            if self.signals.len().saturating_sub(cut) <= max_signals && total <= max_bytes {
                break;
            }
            total = total.saturating_sub(*size);
            cut += 1;
        }
        self.signals.drain(..cut.min(self.signals.len()));
        cut as u64
    }
}

/// Appends signals to the queue; counts enqueued and dropped ones.
pub fn enqueue<H: Host + ?Sized>(
    host: &H,
    key: &str,
    signals: Vec<Signal>,
    max_signals: usize,
    max_bytes: usize,
    retries: u32,
) {
    if signals.is_empty() {
        return;
    }
    let n = signals.len() as u64;
    let dropped = update(host, key, retries, |bytes| {
        let mut queue = PendingSignals::read(bytes);
        for s in signals.iter().cloned() {
            queue.push(s);
        }
        let dropped = queue.bound(max_signals, max_bytes);
        queue.dropped = queue.dropped.saturating_add(dropped);
        (serde_json::to_vec(&queue).ok(), dropped)
    });
    match dropped {
        Some(d) => {
            host.count(Metric::SignalsEnqueued, n);
            host.count(Metric::SignalsDropped, d);
        }
        None => host.count(Metric::SignalsDropped, n),
    }
}

/// Takes up to `max` of the oldest signals (and the dropped count) off the queue.
pub fn take<H: Host + ?Sized>(host: &H, key: &str, max: usize, retries: u32) -> PendingSignals {
    update(host, key, retries, |bytes| {
        let mut queue = PendingSignals::read(bytes);
        if queue.signals.is_empty() && queue.dropped == 0 {
            return (None, PendingSignals::default());
        }
        let n = max.min(queue.signals.len());
        let taken = PendingSignals {
            dropped: queue.dropped,
            signals: queue.signals.drain(..n).collect(),
        };
        queue.dropped = 0;
        (serde_json::to_vec(&queue).ok(), taken)
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_host::FakeHost;
    use prewarm_core::wire::{FeedbackOutcome, FeedbackSignal, PinSignal};
    use prewarm_core::BlockHash;

    fn pin(name: &str) -> Signal {
        Signal::Pin(PinSignal {
            adapter: name.into(),
            tenant: None,
            rate_per_minute: 6.0,
            priority: 1,
        })
    }

    fn adopted(prefix: u64) -> Signal {
        Signal::Feedback(FeedbackSignal {
            model: "m".into(),
            prefix: BlockHash(prefix),
            outcome: FeedbackOutcome::Adopted,
            count: 1,
        })
    }

    #[test]
    fn bounded_oldest_dropped_and_reported() {
        let h = FakeHost::new();
        let signals = (0..5).map(|i| pin(&format!("a{i}"))).collect();
        enqueue(&h, "q", signals, 3, 1 << 20, 4);
        assert_eq!(h.metric(Metric::SignalsDropped), 2);
        let taken = take(&h, "q", 2, 4);
        assert_eq!(taken.dropped, 2);
        assert_eq!(taken.signals, vec![pin("a2"), pin("a3")]);
        let rest = take(&h, "q", 10, 4);
        assert_eq!((rest.dropped, rest.signals), (0, vec![pin("a4")]));
        assert!(take(&h, "q", 10, 4).signals.is_empty());
    }

    #[test]
    fn byte_bound_drops_oldest() {
        let h = FakeHost::new();
        enqueue(
            &h,
            "q",
            (0..100).map(|i| pin(&format!("a{i}"))).collect(),
            1000,
            1024,
            4,
        );
        let taken = take(&h, "q", 1000, 4);
        assert!(taken.signals.len() < 100 && !taken.signals.is_empty());
        assert_eq!(taken.dropped as usize + taken.signals.len(), 100);
        assert_eq!(taken.signals.last(), Some(&pin("a99")));
    }

    #[test]
    fn adopted_feedback_is_merged() {
        let h = FakeHost::new();
        for _ in 0..3 {
            enqueue(&h, "q", vec![adopted(7)], 10, 1 << 20, 4);
        }
        enqueue(&h, "q", vec![adopted(8)], 10, 1 << 20, 4);
        let taken = take(&h, "q", 10, 4);
        assert_eq!(taken.signals.len(), 2);
        let Signal::Feedback(f) = &taken.signals[0] else {
            panic!("feedback expected")
        };
        assert_eq!(f.count, 3);
    }
}
