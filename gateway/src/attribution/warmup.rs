//! The warm-up's own latency per key, for the grey release's third criterion
//! (`release::decide`): each prefill and adapter load the gateway sends, with when it ended and
//! how long it took (retries included, failures too: a timeout is the slowest key of all).
//!
//! A warm-up key is a `max_tokens: 1` completion of a prefix, or an adapter load. On a pod
//! that is not queueing, a prefill costs one forward pass plus a few tens of µs per token
//! (ENGINE-FACTS: ≈6–10 ms + 20–65 µs/token for 7–8B on H100/A100), so ≈50–140 ms for a
//! 2,048-token prefix, and an adapter load from host memory milliseconds. The default limit of
//! 300 ms at p95 therefore assumes warmed prefixes of at most ≈4k tokens on such a model: above
//! it the keys queue behind traffic (the warm-up is taking the pods' time from requests) or the
//! adapters come from disk. Larger models or longer prefixes want a higher
//! `release.warmup_p95_ms`.
//!
//! Bounded: the last [`CAPACITY`] keys, oldest dropped first.

use std::collections::VecDeque;

use super::stats::quantile;
pub use crate::policy::release::WarmupP95;

/// Keys kept.
pub const CAPACITY: usize = 4096;

/// Fewest keys for a p95: with fewer, the nearest-rank 95th is the slowest key itself.
pub const MIN_KEYS: usize = 20;

/// The last [`CAPACITY`] warm-up keys' (end ms, latency ms), in the order they ended.
#[derive(Debug, Default)]
pub struct WarmupLatencies {
    keys: VecDeque<(u64, f64)>,
}

impl WarmupLatencies {
    pub fn record(&mut self, ended_ms: u64, latency_ms: f64) {
        if !latency_ms.is_finite() || latency_ms < 0.0 {
            return;
        }
        if self.keys.len() == CAPACITY {
            self.keys.pop_front();
        }
        self.keys.push_back((ended_ms, latency_ms));
    }

    /// The p95 of the keys that ended at or after `since_ms`; `None` below [`MIN_KEYS`].
    pub fn p95_since(&self, since_ms: u64) -> Option<WarmupP95> {
        let mut window: Vec<f64> = self
            .keys
            .iter()
            .filter(|(at, _)| *at >= since_ms)
            .map(|(_, ms)| *ms)
            .collect();
        if window.len() < MIN_KEYS {
            return None;
        }
        window.sort_by(f64::total_cmp);
        Some(WarmupP95 {
            p95_ms: quantile(&window, 0.95)?,
            keys: window.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_p95_below_the_fewest_keys() {
        let mut l = WarmupLatencies::default();
        for i in 0..MIN_KEYS - 1 {
            l.record(i as u64, 900.0);
        }
        assert_eq!(l.p95_since(0), None);
        l.record(100, 900.0);
        assert_eq!(
            l.p95_since(0),
            Some(WarmupP95 {
                p95_ms: 900.0,
                keys: MIN_KEYS
            })
        );
    }

    #[test]
    fn only_keys_in_the_window_count() {
        let mut l = WarmupLatencies::default();
        for i in 0..40 {
            l.record(i, if i < 20 { 1_000.0 } else { 10.0 });
        }
        assert_eq!(l.p95_since(20).map(|p| p.p95_ms), Some(10.0));
        // 40 keys, two slow ones are the top 5 %
        let p = l.p95_since(0).unwrap();
        assert_eq!((p.keys, p.p95_ms), (40, 1_000.0));
    }

    #[test]
    fn the_store_is_bounded_and_drops_the_oldest() {
        let mut l = WarmupLatencies::default();
        for i in 0..(CAPACITY as u64 + 10) {
            l.record(i, i as f64);
        }
        assert_eq!(l.keys.len(), CAPACITY);
        assert_eq!(l.keys.front().map(|k| k.0), Some(10));
        l.record(1, f64::NAN);
        l.record(1, -1.0);
        assert_eq!(l.keys.len(), CAPACITY, "impossible latencies are not kept");
    }
}
