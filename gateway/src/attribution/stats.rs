//! The statistics of attribution: exact moments of a sample (Welford's update, mergeable),
//! Welch's t-test on two means (unequal variances), the Mann-Whitney U test on two samples
//! (normal approximation with tie and continuity corrections: the samples here are hundreds to
//! hundreds of thousands of requests) and sample quantiles. Distributions' CDFs are `statrs`'.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Count, mean and sum of squared deviations of a sample, updated one value at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Moments {
    pub n: u64,
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    m2: f64,
}

impl Moments {
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// The moments of both samples together (Chan et al.'s parallel update).
    pub fn merge(&mut self, other: &Moments) {
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *other;
            return;
        }
        let n = self.n + other.n;
        let d = other.mean - self.mean;
        self.mean += d * other.n as f64 / n as f64;
        self.m2 += other.m2 + d * d * (self.n as f64 * other.n as f64) / n as f64;
        self.n = n;
    }

    /// The unbiased sample variance (`None` below two values).
    pub fn variance(&self) -> Option<f64> {
        (self.n >= 2).then(|| self.m2 / (self.n - 1) as f64)
    }
}

/// The moments of a sample of pairs (x, y): both means, both sums of squared deviations and the
/// sum of cross-deviations, updated one pair at a time and mergeable like [`Moments`]. The
/// report's covariate adjustment reads them (x: a request's prompt tokens, y: its time to first
/// byte).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CoMoments {
    pub n: u64,
    pub mean_x: f64,
    pub mean_y: f64,
    m2_x: f64,
    m2_y: f64,
    /// Σ (x − x̄)(y − ȳ).
    c_xy: f64,
}

impl CoMoments {
    pub fn push(&mut self, x: f64, y: f64) {
        self.n += 1;
        let n = self.n as f64;
        let (dx, dy) = (x - self.mean_x, y - self.mean_y);
        self.mean_x += dx / n;
        self.mean_y += dy / n;
        self.m2_x += dx * (x - self.mean_x);
        self.m2_y += dy * (y - self.mean_y);
        self.c_xy += dx * (y - self.mean_y);
    }

    /// The co-moments of both samples together.
    pub fn merge(&mut self, other: &CoMoments) {
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *other;
            return;
        }
        let (na, nb) = (self.n as f64, other.n as f64);
        let n = na + nb;
        let (dx, dy) = (other.mean_x - self.mean_x, other.mean_y - self.mean_y);
        self.mean_x += dx * nb / n;
        self.mean_y += dy * nb / n;
        self.m2_x += other.m2_x + dx * dx * na * nb / n;
        self.m2_y += other.m2_y + dy * dy * na * nb / n;
        self.c_xy += other.c_xy + dx * dy * na * nb / n;
        self.n += other.n;
    }

    /// The common within-sample slope of y on x of `samples` (ANCOVA's pooled slope:
    /// Σ c_xy / Σ m2_x): what one more unit of x adds to y inside each sample, so a difference
    /// of the samples' means does not enter it. `None` when x does not vary inside them.
    pub fn pooled_slope(samples: &[&CoMoments]) -> Option<f64> {
        let sxx: f64 = samples.iter().map(|m| m.m2_x).sum();
        let sxy: f64 = samples.iter().map(|m| m.c_xy).sum();
        let slope = sxy / sxx;
        (sxx > 0.0 && slope.is_finite()).then_some(slope)
    }

    /// The moments of the adjusted values `y − slope·(x − x_center)`: the mean moves by
    /// `slope·(x̄ − x_center)`, the squared deviations become
    /// `m2_y − 2·slope·c_xy + slope²·m2_x`.
    pub fn adjusted(&self, slope: f64, x_center: f64) -> Moments {
        let m2 = self.m2_y - 2.0 * slope * self.c_xy + slope * slope * self.m2_x;
        Moments {
            n: self.n,
            mean: self.mean_y - slope * (self.mean_x - x_center),
            m2: m2.max(0.0),
        }
    }
}

/// A two-sided test's statistic and p-value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Test {
    pub statistic: f64,
    pub p: f64,
}

/// Welch's t-test of `a`'s mean against `b`'s: `t = (ā − b̄) / √(s²ₐ/nₐ + s²ᵦ/nᵦ)` with the
/// Welch–Satterthwaite degrees of freedom. `None` below two values a side, or when both
/// samples are constant (no spread to test against).
pub fn welch(a: &Moments, b: &Moments) -> Option<Test> {
    let (va, vb) = (a.variance()?, b.variance()?);
    let (sa, sb) = (va / a.n as f64, vb / b.n as f64);
    let se2 = sa + sb;
    if !(se2 > 0.0 && se2.is_finite()) {
        return None;
    }
    let t = (a.mean - b.mean) / se2.sqrt();
    let df = se2 * se2 / (sa * sa / (a.n - 1) as f64 + sb * sb / (b.n - 1) as f64);
    let dist = StudentsT::new(0.0, 1.0, df).ok()?;
    Some(Test {
        statistic: t,
        p: (2.0 * (1.0 - dist.cdf(t.abs()))).clamp(0.0, 1.0),
    })
}

/// Requests each side needs for Welch's test to reach p < `alpha` (two-sided) with probability
/// `power`, if the observed difference of means and the observed spreads hold:
/// `n = (z₁₋α/₂ + z_power)² (s²ₐ + s²ᵦ) / (āₐ − ā_b)²` (the normal approximation, fine at the
/// hundreds of requests a verdict takes). `None` without spread or without a difference.
pub fn requests_for(a: &Moments, b: &Moments, alpha: f64, power: f64) -> Option<u64> {
    let (va, vb) = (a.variance()?, b.variance()?);
    let d = a.mean - b.mean;
    let normal = Normal::new(0.0, 1.0).ok()?;
    let z = normal.inverse_cdf(1.0 - alpha / 2.0) + normal.inverse_cdf(power);
    let n = z * z * (va + vb) / (d * d);
    (n.is_finite() && n > 0.0).then(|| n.ceil().min(u64::MAX as f64) as u64)
}

/// The Mann-Whitney U test of `a` against `b`: `U` of `a` (the number of pairs in which `a`'s
/// value is the larger, ties counting half), `z` from its normal approximation with the tie
/// correction of the variance and a continuity correction of ½. `None` when a side is empty or
/// every value is equal.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<Test> {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len() as f64;
    let (mut rank_sum_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while all.get(j + 1).is_some_and(|next| next.0 == all[i].0) {
            j += 1;
        }
        // ranks i+1 ..= j+1 share their mean
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let group = all.get(i..=j).unwrap_or_default();
        rank_sum_a += rank * group.iter().filter(|v| v.1).count() as f64;
        let t = group.len() as f64;
        ties += t * t * t - t;
        i = j + 1;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let var = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if !(var > 0.0 && var.is_finite()) {
        return None;
    }
    let diff = u - mean;
    let corrected = (diff.abs() - 0.5).max(0.0);
    let z = corrected / var.sqrt();
    let normal = Normal::new(0.0, 1.0).ok()?;
    Some(Test {
        statistic: u,
        p: (2.0 * (1.0 - normal.cdf(z))).clamp(0.0, 1.0),
    })
}

/// The `q` quantile of `sorted` (ascending) by the nearest rank; `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1).min(sorted.len() - 1))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(xs: &[f64]) -> Moments {
        let mut m = Moments::default();
        for x in xs {
            m.push(*x);
        }
        m
    }

    #[test]
    fn moments_are_exact_and_merge_like_one_sample() {
        let m = moments(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((m.n, m.mean), (8, 5.0));
        assert!((m.variance().unwrap() - 32.0 / 7.0).abs() < 1e-12);
        let mut left = moments(&[2.0, 4.0, 4.0]);
        left.merge(&moments(&[4.0, 5.0, 5.0, 7.0, 9.0]));
        assert_eq!(left.n, 8);
        assert!((left.mean - 5.0).abs() < 1e-12);
        assert!((left.variance().unwrap() - 32.0 / 7.0).abs() < 1e-12);
        assert_eq!(moments(&[1.0]).variance(), None);
    }

    fn co_moments(pairs: &[(f64, f64)]) -> CoMoments {
        let mut m = CoMoments::default();
        for (x, y) in pairs {
            m.push(*x, *y);
        }
        m
    }

    #[test]
    fn co_moments_merge_like_one_sample_and_agree_with_the_one_variable_moments() {
        let pairs: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i), f64::from(i * i % 17)))
            .collect();
        let whole = co_moments(&pairs);
        let mut parts = co_moments(&pairs[..13]);
        parts.merge(&co_moments(&pairs[13..]));
        for (a, b) in [
            (whole.mean_x, parts.mean_x),
            (whole.mean_y, parts.mean_y),
            (whole.m2_x, parts.m2_x),
            (whole.m2_y, parts.m2_y),
            (whole.c_xy, parts.c_xy),
        ] {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
        let ys = moments(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
        let unadjusted = whole.adjusted(0.0, 0.0);
        assert_eq!(unadjusted.n, ys.n);
        assert!((unadjusted.mean - ys.mean).abs() < 1e-9);
        assert!((unadjusted.variance().unwrap() - ys.variance().unwrap()).abs() < 1e-9);
    }

    /// Two samples on parallel lines y = 2x + c: the pooled slope is 2 whatever their offsets
    /// and x ranges, and adjusting removes all of the spread and the x ranges' difference.
    #[test]
    fn the_pooled_slope_is_the_common_slope_and_adjusting_by_it_leaves_the_offset() {
        let line = |c: f64, xs: std::ops::Range<i32>| {
            co_moments(
                &xs.map(|x| (f64::from(x), 2.0 * f64::from(x) + c))
                    .collect::<Vec<_>>(),
            )
        };
        let (a, b) = (line(5.0, 0..10), line(0.0, 20..40));
        let slope = CoMoments::pooled_slope(&[&a, &b]).unwrap();
        assert!((slope - 2.0).abs() < 1e-12, "{slope}");
        let (aa, bb) = (a.adjusted(slope, 10.0), b.adjusted(slope, 10.0));
        assert!((aa.mean - bb.mean - 5.0).abs() < 1e-9);
        assert!(aa.variance().unwrap() < 1e-9 && bb.variance().unwrap() < 1e-9);
        let flat = co_moments(&[(3.0, 1.0), (3.0, 2.0)]);
        assert_eq!(CoMoments::pooled_slope(&[&flat]), None, "x does not vary");
    }

    /// With two values a side and equal variances Welch's df is 2, whose t CDF has a closed
    /// form: p = 1 − |t| / √(2 + t²).
    #[test]
    fn welch_matches_the_closed_form_at_two_degrees_of_freedom() {
        let test = welch(&moments(&[0.0, 2.0]), &moments(&[1.0, 3.0])).unwrap();
        let t: f64 = -1.0 / 2f64.sqrt();
        assert!((test.statistic - t).abs() < 1e-12);
        let p = 1.0 - t.abs() / (2.0 + t * t).sqrt();
        assert!((test.p - p).abs() < 1e-9, "{} vs {p}", test.p);
    }

    #[test]
    fn welch_finds_a_shift_of_large_samples_and_not_an_equal_one() {
        let a: Vec<f64> = (0..2000).map(|i| (i % 100) as f64).collect();
        let shifted: Vec<f64> = a.iter().map(|x| x + 5.0).collect();
        assert!(welch(&moments(&shifted), &moments(&a)).unwrap().p < 1e-6);
        let same = welch(&moments(&a), &moments(&a)).unwrap();
        assert_eq!((same.statistic, same.p), (0.0, 1.0));
        assert_eq!(welch(&moments(&[1.0, 1.0]), &moments(&[1.0, 1.0])), None);
    }

    /// x = 1, 2, 3 against 4, 5, 6: U = 0, z = (4.5 − ½) / √5.25, p = 0.0809 (the asymptotic
    /// p-value with continuity correction, as SciPy's `mannwhitneyu` gives it).
    #[test]
    fn mann_whitney_matches_the_textbook_case_and_handles_ties() {
        let test = mann_whitney(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
        assert_eq!(test.statistic, 0.0);
        assert!((test.p - 0.080_855_6).abs() < 1e-6, "{}", test.p);
        let reversed = mann_whitney(&[4.0, 5.0, 6.0], &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(reversed.statistic, 9.0);
        assert!((reversed.p - test.p).abs() < 1e-12, "two-sided");
        let tied = mann_whitney(&[1.0, 2.0, 2.0], &[2.0, 3.0]).unwrap();
        assert_eq!(tied.statistic, 1.0, "a tie counts half");
        assert_eq!(mann_whitney(&[1.0], &[1.0]), None, "no spread");
        assert_eq!(mann_whitney(&[], &[1.0]), None);
    }

    #[test]
    fn requests_for_a_verdict_follow_the_power_formula() {
        let sample = |mean: f64, sd: f64| {
            let mut m = Moments::default();
            for x in [mean - sd, mean + sd] {
                m.push(x);
            }
            m
        };
        // sd 100 ms each side (variance 2·100² with n=2 is 20,000), difference 50 ms:
        // (2.5758 + 0.8416)² · 40,000 / 2,500 = 186.9
        let a = sample(250.0, 100.0);
        let b = sample(200.0, 100.0);
        assert_eq!(requests_for(&a, &b, 0.01, 0.8), Some(187));
        // twice the difference, a quarter of the requests
        assert_eq!(requests_for(&sample(300.0, 100.0), &b, 0.01, 0.8), Some(47));
        assert_eq!(requests_for(&b, &b, 0.01, 0.8), None, "no difference");
        assert_eq!(requests_for(&Moments::default(), &b, 0.01, 0.8), None);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.5), Some(50.0));
        assert_eq!(quantile(&xs, 0.95), Some(95.0));
        assert_eq!(quantile(&xs, 0.0), Some(1.0));
        assert_eq!(quantile(&xs, 1.0), Some(100.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
