//! Seeded draws for the workload: one splitmix64 stream per (seed, purpose, index), so an
//! application's draws do not depend on how many others there are or in which order they are
//! drawn. Floating-point draws use `ln`, `sqrt` and `powf` from the platform's libm: the same
//! binary on the same platform writes the same bytes.

use crate::render::splitmix64;

/// A seeded stream of draws.
#[derive(Debug, Clone)]
pub struct Draws {
    state: u64,
}

/// What a stream is for (kept apart so one purpose's draws never shift another's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// System prompt and tool lengths of each application.
    Application = 1,
    /// Which applications have tools.
    ToolChoice = 2,
    /// Which applications serve through an adapter.
    AdapterChoice = 3,
    /// Conversation starts of each application.
    Arrivals = 4,
    /// Turns, lengths, users and think times of each application's conversations.
    Conversations = 5,
}

impl Draws {
    /// The stream of `purpose` for item `index` under `seed`.
    pub fn new(seed: u64, purpose: Purpose, index: u64) -> Self {
        let mut state = seed ^ 0x776f_726b_6c6f_6164;
        let mixed = splitmix64(&mut state) ^ (purpose as u64).wrapping_mul(0xa076_1d64_78bd_642f);
        let mut state = mixed ^ index.wrapping_mul(0xe703_7ed1_a0b4_28db);
        splitmix64(&mut state);
        Self { state }
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (splitmix64(&mut self.state) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in (0, 1]: safe under `ln`.
    fn open_unit(&mut self) -> f64 {
        1.0 - self.unit()
    }

    /// Whether an event of probability `p` happens.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// A uniformly drawn item (`None` for no items).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len())).copied()
    }

    /// `0..n` in a seeded order (Fisher–Yates).
    pub fn shuffled(&mut self, n: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, self.below(i + 1));
        }
        order
    }

    /// Exponential with mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -self.open_unit().ln() * mean
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.open_unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Gamma with `shape` > 0 and `scale` > 0 (Marsaglia–Tsang; below shape 1 boosted by
    /// `U^(1/shape)`).
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            let boost = self.open_unit().powf(1.0 / shape);
            return self.gamma(shape + 1.0, scale) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.open_unit();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_and_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn gamma_draws_have_the_asked_mean_and_cv() {
        // mean k·θ, CV 1/√k; 200,000 draws: the sample mean's standard error is CV/447
        for cv in [0.5f64, 1.0, 2.0, 4.0] {
            let shape = 1.0 / (cv * cv);
            let mut d = Draws::new(3, Purpose::Arrivals, cv.to_bits());
            let xs: Vec<f64> = (0..200_000).map(|_| d.gamma(shape, 2.0 / shape)).collect();
            let (mean, got_cv) = mean_and_cv(&xs);
            assert!(
                (mean - 2.0).abs() < 2.0 * 5.0 * cv / 447.0,
                "cv {cv}: mean {mean}"
            );
            assert!((got_cv - cv).abs() < 0.1 * cv, "cv {cv}: got {got_cv}");
        }
    }

    #[test]
    fn streams_are_reproducible_and_apart() {
        let draw = |seed, purpose, index| {
            let mut d = Draws::new(seed, purpose, index);
            (0..4).map(|_| d.unit().to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, Purpose::Arrivals, 0), draw(1, Purpose::Arrivals, 0));
        assert_ne!(draw(1, Purpose::Arrivals, 0), draw(2, Purpose::Arrivals, 0));
        assert_ne!(draw(1, Purpose::Arrivals, 0), draw(1, Purpose::Arrivals, 1));
        assert_ne!(
            draw(1, Purpose::Arrivals, 0),
            draw(1, Purpose::Conversations, 0)
        );
        let mut d = Draws::new(1, Purpose::ToolChoice, 0);
        let mut order = d.shuffled(10);
        order.sort_unstable();
        assert_eq!(order, (0..10).collect::<Vec<_>>());
    }
}
