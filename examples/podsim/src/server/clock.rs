//! Model time for the HTTP shell: real time since start multiplied by `--time-scale`. Every
//! figure podsim reports (TTFT, latencies, histograms) is model time; only the waiting the
//! shell does is divided by the scale.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct ModelClock {
    origin: Instant,
    scale: f64,
}

impl ModelClock {
    /// A clock starting now that runs `scale` times faster than real time (scale > 0).
    pub fn new(scale: f64) -> Self {
        Self {
            origin: Instant::now(),
            scale,
        }
    }

    /// Model seconds since the clock started.
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * self.scale
    }

    /// The real instant at which model time `t` comes.
    pub fn instant_of(&self, t: f64) -> Instant {
        let real = if t.is_finite() && t > 0.0 {
            t / self.scale
        } else {
            0.0
        };
        self.origin + Duration::from_secs_f64(real.min(1e9))
    }

    /// Waits until model time `t`.
    pub async fn sleep_until(&self, t: f64) {
        tokio::time::sleep_until(self.instant_of(t).into()).await;
    }

    /// Waits `seconds` of model time.
    pub async fn sleep(&self, seconds: f64) {
        let t = self.now() + seconds.max(0.0);
        self.sleep_until(t).await;
    }
}
