//! When an application's conversations start: a gamma renewal process — independent gamma
//! gaps of mean `1 / rate` and coefficient of variation `cv` (shape `1/cv²`) — the family
//! ServeGen fits to its customers' inter-arrival times (its `pattern` column names Gamma or
//! Weibull per window). CV 1 is Poisson; above 1, arrivals come in bursts with long gaps.
//! Stationary from time 0: the first arrival is the forward recurrence time (a length-biased
//! gap, `Gamma(shape + 1)`, times a uniform), so the start of the trace is not special. No
//! diurnal shape: the rate is constant over the span.

use super::draws::Draws;

/// Conversation starts in `[0, duration_s)`, seconds, ascending.
pub fn conversation_starts(
    rate_per_s: f64,
    cv: f64,
    duration_s: f64,
    draws: &mut Draws,
) -> Vec<f64> {
    if !(rate_per_s > 0.0 && cv > 0.0 && duration_s > 0.0) {
        return Vec::new();
    }
    let shape = 1.0 / (cv * cv);
    let scale = 1.0 / (rate_per_s * shape);
    let mut out = Vec::new();
    let mut t = draws.gamma(shape + 1.0, scale) * draws.unit();
    while t < duration_s {
        out.push(t);
        t += draws.gamma(shape, scale);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::draws::Purpose;

    /// Counts in consecutive windows of `window_s`.
    fn counts(starts: &[f64], duration_s: f64, window_s: f64) -> Vec<f64> {
        let mut c = vec![0.0; (duration_s / window_s) as usize];
        for t in starts {
            if let Some(slot) = c.get_mut((t / window_s) as usize) {
                *slot += 1.0;
            }
        }
        c
    }

    #[test]
    fn burstier_customers_have_more_variable_counts_at_the_same_rate() {
        // index of dispersion of counts in long windows ≈ cv² for a renewal process
        let dispersion = |cv: f64| {
            let mut d = Draws::new(9, Purpose::Arrivals, cv.to_bits());
            let starts = conversation_starts(2.0, cv, 200_000.0, &mut d);
            let c = counts(&starts, 200_000.0, 200.0);
            let mean = c.iter().sum::<f64>() / c.len() as f64;
            let var = c.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (c.len() - 1) as f64;
            (mean, var / mean)
        };
        let (m1, d1) = dispersion(1.0);
        let (m3, d3) = dispersion(3.0);
        // 400,000 expected starts: the mean per window within a few percent
        assert!(
            (m1 - 400.0).abs() < 8.0 && (m3 - 400.0).abs() < 24.0,
            "{m1} {m3}"
        );
        assert!((0.8..1.25).contains(&d1), "poisson dispersion {d1}");
        assert!((6.0..12.0).contains(&d3), "cv 3 dispersion {d3}");
    }

    #[test]
    fn no_rate_no_arrivals() {
        let mut d = Draws::new(1, Purpose::Arrivals, 0);
        assert!(conversation_starts(0.0, 1.0, 100.0, &mut d).is_empty());
    }
}
