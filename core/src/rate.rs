//! Sliding-window rate counters with bounded memory: a fixed ring of [`BUCKETS`] time buckets,
//! each tagged with the slot (time / bucket length) it counts, so reading needs no mutation and
//! old events are forgotten simply by their slot falling out of the window.
//!
//! The encoded form (12 bytes a bucket, 144 bytes in all) is what the filter keeps in Envoy's
//! shared data per adapter slot.

/// Buckets in a window.
pub const BUCKETS: usize = 12;

/// Bytes of [`RateWindow::to_bytes`].
pub const ENCODED_LEN: usize = BUCKETS * 12;

/// Events counted over a sliding window of `window_ms`, in [`BUCKETS`] buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RateWindow {
    window_ms: u64,
    /// (slot, count) per bucket; slot `s` lives in bucket `s % BUCKETS`.
    buckets: [(u64, u32); BUCKETS],
}

impl RateWindow {
    /// An empty window of `window_ms` milliseconds (at least [`BUCKETS`]).
    pub fn new(window_ms: u64) -> Self {
        Self {
            window_ms: window_ms.max(BUCKETS as u64),
            buckets: [(0, 0); BUCKETS],
        }
    }

    fn bucket_ms(&self) -> u64 {
        (self.window_ms / BUCKETS as u64).max(1)
    }

    fn slot(&self, now_ms: u64) -> u64 {
        // slot 0 is reserved for "never written"
        (now_ms / self.bucket_ms()).saturating_add(1)
    }

    /// Counts `n` events at `now_ms`.
    pub fn record(&mut self, now_ms: u64, n: u32) {
        let slot = self.slot(now_ms);
        let idx = (slot % BUCKETS as u64) as usize;
        if let Some(bucket) = self.buckets.get_mut(idx) {
            if bucket.0 == slot {
                bucket.1 = bucket.1.saturating_add(n);
            } else if bucket.0 < slot {
                *bucket = (slot, n);
            }
            // an event older than what the bucket holds is outside the window: dropped
        }
    }

    /// Events in the window ending at `now_ms`.
    pub fn count(&self, now_ms: u64) -> u64 {
        let now = self.slot(now_ms);
        let oldest = now.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .filter(|(slot, _)| *slot >= oldest && *slot <= now && *slot != 0)
            .map(|(_, c)| u64::from(*c))
            .sum()
    }

    /// Events per minute over the window ending at `now_ms`.
    pub fn per_minute(&self, now_ms: u64) -> f64 {
        self.count(now_ms) as f64 * 60_000.0 / self.window_ms as f64
    }

    /// The window's length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Fixed-size little-endian encoding.
    pub fn to_bytes(&self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        for (chunk, (slot, count)) in out.chunks_exact_mut(12).zip(self.buckets.iter()) {
            let (s, c) = chunk.split_at_mut(8);
            s.copy_from_slice(&slot.to_le_bytes());
            c.copy_from_slice(&count.to_le_bytes());
        }
        out
    }

    /// Reads [`to_bytes`](Self::to_bytes); anything of the wrong length is an empty window.
    pub fn from_bytes(bytes: &[u8], window_ms: u64) -> Self {
        let mut w = Self::new(window_ms);
        if bytes.len() != ENCODED_LEN {
            return w;
        }
        for (chunk, bucket) in bytes.chunks_exact(12).zip(w.buckets.iter_mut()) {
            let mut s = [0u8; 8];
            let mut c = [0u8; 4];
            s.copy_from_slice(chunk.get(..8).unwrap_or(&[0; 8]));
            c.copy_from_slice(chunk.get(8..).unwrap_or(&[0; 4]));
            *bucket = (u64::from_le_bytes(s), u32::from_le_bytes(c));
        }
        w
    }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn counts_within_the_window() {
        let mut w = RateWindow::new(60_000);
        for i in 0..5 {
            w.record(1_000 + i * 1_000, 1);
        }
        assert_eq!(w.count(6_000), 5);
        assert_eq!(w.per_minute(6_000), 5.0);
    }

    #[test]
    fn forgets_old_events() {
        let mut w = RateWindow::new(60_000);
        w.record(0, 10);
        assert_eq!(w.count(50_000), 10);
        assert_eq!(w.count(61_000), 0);
        w.record(61_000, 1);
        assert_eq!(w.count(61_000), 1);
    }

    #[test]
    fn encoding_round_trips_and_tolerates_garbage() {
        let mut w = RateWindow::new(60_000);
        w.record(12_345, 3);
        assert_eq!(RateWindow::from_bytes(&w.to_bytes(), 60_000), w);
        assert_eq!(RateWindow::from_bytes(&[1, 2, 3], 60_000).count(0), 0);
    }

    proptest! {
        /// Whatever happened before, nothing older than the window is ever counted.
        #[test]
        fn nothing_older_than_the_window_counts(
            events in proptest::collection::vec((0u64..600_000, 1u32..5), 0..200),
            later in 0u64..600_000,
        ) {
            let mut w = RateWindow::new(60_000);
            let mut sorted = events.clone();
            sorted.sort();
            for (t, n) in &sorted { w.record(*t, *n); }
            let last = sorted.last().map(|e| e.0).unwrap_or(0);
            let now = last + 60_000 + 5_000 + later;
            prop_assert_eq!(w.count(now), 0);
            // and everything within the last bucket-aligned window is counted
            let in_window: u64 = sorted.iter()
                .filter(|(t, _)| t / 5_000 + BUCKETS as u64 > last / 5_000)
                .map(|(_, n)| u64::from(*n)).sum();
            prop_assert_eq!(w.count(last), in_window);
        }
    }
}
