//! The load the routing table publishes for a pod: the share of the last [`BUSY_WINDOW_MS`]
//! it was busy — the health checks that found a request on it (`vllm:num_requests_running` +
//! `vllm:num_requests_waiting` > 0) out of those made — in [0, 1]: the utilisation ρ of
//! queueing theory, measured.
//!
//! With core's load cap (`load_factor` × the mean, never below [`LOAD_FLOOR`]) this makes
//! routing work-conserving: a pod is full only while other pods sit idle for a good part of
//! the minute. Measured alternatives (docs/routing.md has the figures) all spread more, and
//! on a prefill-bound fleet spreading is what makes load: a request sent away from its cache
//! prefills its whole prompt again.
//! - the requests a pod received in the last minute against 1.25 × the mean: a template's
//!   repeats and a conversation's turns exceed their pod's share whenever they are the
//!   popular ones, and every excess request is a miss;
//! - prefill utilisation (uncached prompt tokens a second over the pod's prefill rate): the
//!   misses it causes raise it, so it feeds itself;
//! - `num_requests_running + waiting` as a number: small integers that batching serves alike,
//!   read a health interval late.
//!
//! [`LOAD_FLOOR`]: prewarm_core::placement::LOAD_FLOOR

use prewarm_core::rate::RateWindow;

/// The window the busy share is measured over.
pub const BUSY_WINDOW_MS: u64 = 60_000;

/// A pod's health checks and those that found it busy; see the module docs.
#[derive(Debug, Clone)]
pub struct BusyShare {
    busy: RateWindow,
    checks: RateWindow,
}

impl Default for BusyShare {
    fn default() -> Self {
        Self {
            busy: RateWindow::new(BUSY_WINDOW_MS),
            checks: RateWindow::new(BUSY_WINDOW_MS),
        }
    }
}

impl BusyShare {
    /// A health check at `now_ms` that found `requests` on the pod.
    pub fn observe(&mut self, requests: u64, now_ms: u64) {
        self.checks.record(now_ms, 1);
        if requests > 0 {
            self.busy.record(now_ms, 1);
        }
    }

    /// The checks made in the window: the sample the share is measured over (the routing
    /// table's step for the load is its standard error, `prewarm_core::published_load`).
    pub fn checks(&self, now_ms: u64) -> u64 {
        self.checks.count(now_ms)
    }

    /// The share of the window's checks that found the pod busy (0 without checks).
    pub fn share(&self, now_ms: u64) -> f64 {
        let checks = self.checks.count(now_ms);
        if checks == 0 {
            return 0.0;
        }
        (self.busy.count(now_ms) as f64 / checks as f64).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_the_checks_that_found_a_request() {
        let mut b = BusyShare::default();
        for s in 1..=40u64 {
            b.observe(u64::from(s % 4 == 0) * 3, s * 1_000);
        }
        let share = b.share(40_000);
        assert!((0.2..=0.3).contains(&share), "{share}");
        assert_eq!(BusyShare::default().share(1_000), 0.0);
    }

    #[test]
    fn an_idle_minute_forgets_a_busy_one() {
        let mut b = BusyShare::default();
        for s in 1..=60u64 {
            b.observe(5, s * 1_000);
        }
        assert_eq!(b.share(60_000), 1.0);
        for s in 61..=140u64 {
            b.observe(0, s * 1_000);
        }
        assert_eq!(b.share(140_000), 0.0);
    }
}
