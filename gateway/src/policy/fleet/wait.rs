//! The queue wait the routing table publishes for a pod: how long a request arriving now is
//! predicted to wait before the engine starts it. Little's law over the last
//! [`BUSY_WINDOW_MS`]: the mean number of queued requests `L` (the health checks'
//! `vllm:num_requests_waiting`) over the rate `λ` at which the pod finishes requests (the
//! increase of `vllm:request_success_total`), `W = L ÷ λ`.
//!
//! What it assumes and why:
//! - A request waits only while it is queued: an engine with continuous batching starts a
//!   request at once while its batch has room (`max_num_seqs`, KV blocks, a LoRA slot), so a
//!   pod that is busy (the [`BusyShare`](super::busy::BusyShare)) but not full costs a new
//!   request no wait. Compute shared with the running batch slows its prefill and decode
//!   without queueing it; that is not in `W` (it is in the busy share the load cap reads).
//! - The window is the busy share's: both are a minute old at worst, and a queue that formed
//!   in the last seconds shows in `L` as a fraction of the minute.
//! - Nothing finished in a window with a queue: the wait is at least the window.
//! - An engine that exports no completion counter (SGLang's names differ) has no wait; the
//!   routing rule then falls back on the load cap for it.
//!
//! `prewarm_core::prefix::route_prefix` weighs this wait against what moving a request costs
//! (its matched prefix prefilled again elsewhere).
//!
//! [`BUSY_WINDOW_MS`]: super::busy::BUSY_WINDOW_MS

use prewarm_core::rate::RateWindow;

use super::busy::BUSY_WINDOW_MS;

/// The shortest time completions are counted over (one default health interval).
const MIN_SPAN_MS: f64 = 1_000.0;

/// A pod's queue lengths and completions over the window; see the module docs.
#[derive(Debug, Clone)]
pub struct QueueWait {
    queued: RateWindow,
    checks: RateWindow,
    finished: RateWindow,
    /// The completion counter at the last check that read one.
    last_successes: Option<u64>,
    /// The first check's time: a pod watched for less than the window finished its requests
    /// in less time.
    first_check_ms: Option<u64>,
}

impl Default for QueueWait {
    fn default() -> Self {
        Self {
            queued: RateWindow::new(BUSY_WINDOW_MS),
            checks: RateWindow::new(BUSY_WINDOW_MS),
            finished: RateWindow::new(BUSY_WINDOW_MS),
            last_successes: None,
            first_check_ms: None,
        }
    }
}

impl QueueWait {
    /// A health check at `now_ms` that found `waiting` requests queued and the completion
    /// counter at `successes` (`None`: not exported). A counter below the last one was reset
    /// (the process restarted): what it counts now finished since.
    pub fn observe(&mut self, waiting: u64, successes: Option<u64>, now_ms: u64) {
        self.checks.record(now_ms, 1);
        self.first_check_ms.get_or_insert(now_ms);
        self.queued
            .record(now_ms, u32::try_from(waiting).unwrap_or(u32::MAX));
        if let Some(s) = successes {
            let done = match self.last_successes {
                Some(last) if s >= last => s - last,
                Some(_) => s,
                None => 0,
            };
            self.finished
                .record(now_ms, u32::try_from(done).unwrap_or(u32::MAX));
            self.last_successes = Some(s);
        }
    }

    /// The predicted wait, ms (at most the window); `None` before a check read the completion
    /// counter.
    pub fn wait_ms(&self, now_ms: u64) -> Option<f64> {
        self.last_successes?;
        let checks = self.checks.count(now_ms);
        let queued = self.queued.count(now_ms);
        if checks == 0 || queued == 0 {
            return Some(0.0);
        }
        let window = BUSY_WINDOW_MS as f64;
        let mean_queue = queued as f64 / checks as f64;
        let finished = self.finished.count(now_ms);
        if finished == 0 {
            return Some(window);
        }
        let watched = now_ms.saturating_sub(self.first_check_ms.unwrap_or(now_ms));
        let span = (watched as f64).clamp(MIN_SPAN_MS, window);
        let per_ms = finished as f64 / span;
        Some((mean_queue / per_ms).min(window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(waiting: u64, finished_per_s: u64) -> QueueWait {
        let mut w = QueueWait::default();
        for s in 0..=60u64 {
            w.observe(waiting, Some(s * finished_per_s), s * 1_000);
        }
        w
    }

    #[test]
    fn a_pod_without_a_queue_costs_no_wait_however_busy() {
        assert_eq!(steady(0, 5).wait_ms(60_000), Some(0.0));
    }

    #[test]
    fn the_wait_is_the_queue_over_the_completion_rate() {
        // 4 queued, 2 finished a second: a new request waits about 2 s (the windows count in
        // buckets, so within one bucket's share).
        let w = steady(4, 2).wait_ms(60_000).unwrap();
        assert!((1_800.0..=2_200.0).contains(&w), "{w}");
        // twice the queue at the same rate waits twice as long
        let w2 = steady(8, 2).wait_ms(60_000).unwrap();
        assert!((w2 / w - 2.0).abs() < 0.05, "{w} {w2}");
    }

    #[test]
    fn a_queue_that_never_moves_waits_the_whole_window() {
        assert_eq!(steady(3, 0).wait_ms(60_000), Some(BUSY_WINDOW_MS as f64));
    }

    #[test]
    fn an_engine_without_a_completion_counter_has_no_wait() {
        let mut w = QueueWait::default();
        w.observe(5, None, 1_000);
        assert_eq!(w.wait_ms(1_000), None);
    }

    #[test]
    fn a_reset_counter_counts_what_finished_since_the_restart() {
        let mut w = QueueWait::default();
        w.observe(2, Some(1_000), 1_000);
        w.observe(2, Some(30), 2_000);
        // 30 finished in the second since the first check, not 0 and not a wrapped difference
        let wait = w.wait_ms(2_000).unwrap();
        let expected = 2.0 / (30.0 / 1_000.0);
        assert!((wait - expected).abs() < 1.0, "{wait} {expected}");
    }

    #[test]
    fn a_pod_watched_for_seconds_counts_its_rate_over_those_seconds() {
        let mut w = QueueWait::default();
        for s in 0..=10u64 {
            w.observe(4, Some(s * 2), s * 1_000);
        }
        let wait = w.wait_ms(10_000).unwrap();
        assert!((1_900.0..=2_300.0).contains(&wait), "{wait}");
    }

    #[test]
    fn a_quiet_minute_forgets_a_queue() {
        let mut w = steady(6, 1);
        for s in 61..=125u64 {
            w.observe(0, Some(60 + (s - 60) * 3), s * 1_000);
        }
        assert_eq!(w.wait_ms(125_000), Some(0.0));
    }
}
