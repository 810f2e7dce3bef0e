//! Two samples compared by the report's rule ([`super::report::reading`]), for tools that hold
//! the samples themselves (`prewarm-gateway compare`): a benchmark's per-request cohorts that
//! the gateway does not label (a new pod's first request of each prefix), a client's own
//! records.
//! One implementation of the tests and of "significant", whoever asks.

use serde::{Deserialize, Serialize};

use super::adjusted::{prompt_adjusted, ByPrompt, PromptAdjusted};
use super::report::{reading, Reading, SIGNIFICANCE};
use super::stats::{CoMoments, Moments};

/// The most values a side may have (the report's own samples are smaller).
pub const MAX_VALUES: usize = 1_000_000;
/// The most bytes of input read: room for both sides at the limit, ~25 bytes a value.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// The input: `arm`'s values against `reference`'s (the report's orientation: a positive
/// difference means the arm's values are the larger).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Samples {
    pub arm: Vec<f64>,
    pub reference: Vec<f64>,
    /// Each value's prompt tokens, one a value (both or neither): the comparison is then also
    /// made adjusted for prompt length, as the report's `prompt_adjusted`.
    #[serde(default)]
    pub arm_prompt_tokens: Option<Vec<f64>>,
    #[serde(default)]
    pub reference_prompt_tokens: Option<Vec<f64>>,
}

/// What `prewarm-gateway compare` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleComparison {
    pub arm_n: u64,
    pub reference_n: u64,
    pub arm_mean: Option<f64>,
    pub reference_mean: Option<f64>,
    /// The arm's mean minus the reference's.
    pub mean_diff: Option<f64>,
    /// The tests and what they say, as the report's comparisons read them (serialised as this
    /// struct's own fields; `requests_needed`: values a side).
    #[serde(flatten)]
    pub reading: Reading,
    pub significance: f64,
    /// The same adjusted for prompt length, when the input gave prompt tokens that vary.
    pub prompt_adjusted: Option<PromptAdjusted>,
}

/// Reads the input (JSON, at most [`MAX_INPUT_BYTES`]) and compares its two samples.
pub fn compare_input(input: impl std::io::Read) -> Result<SampleComparison, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    input
        .take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!("more than {MAX_INPUT_BYTES} bytes"));
    }
    let samples: Samples = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    compare(&samples)
}

/// Compares `s.arm` with `s.reference`; a side with too many values is an error naming it.
pub fn compare(s: &Samples) -> Result<SampleComparison, String> {
    for (field, values) in [("arm", &s.arm), ("reference", &s.reference)] {
        if values.len() > MAX_VALUES {
            return Err(format!(
                "{field}: {} values, at most {MAX_VALUES}",
                values.len()
            ));
        }
    }
    let pairs = |field: &str, values: &[f64], prompts: &Option<Vec<f64>>| match prompts {
        None => Ok(None),
        Some(p) if p.len() != values.len() => Err(format!(
            "{field}_prompt_tokens: {} values for {} times",
            p.len(),
            values.len()
        )),
        Some(p) if p.iter().any(|x| !(x.is_finite() && *x >= 0.0)) => Err(format!(
            "{field}_prompt_tokens: a value that is not a count"
        )),
        Some(p) => Ok(Some(
            values
                .iter()
                .copied()
                .zip(p.iter().copied())
                .collect::<Vec<_>>(),
        )),
    };
    let arm_pairs = pairs("arm", &s.arm, &s.arm_prompt_tokens)?;
    let reference_pairs = pairs("reference", &s.reference, &s.reference_prompt_tokens)?;
    let co_moments = |pairs: &[(f64, f64)]| {
        let mut m = CoMoments::default();
        pairs.iter().for_each(|&(t, p)| m.push(p, t));
        m
    };
    let adjusted = match (arm_pairs, reference_pairs) {
        (Some(a), Some(r)) => {
            let (am, rm) = (co_moments(&a), co_moments(&r));
            prompt_adjusted(
                &ByPrompt {
                    moments: &am,
                    sample: a,
                },
                &ByPrompt {
                    moments: &rm,
                    sample: r,
                },
            )
        }
        (None, None) => None,
        _ => return Err("arm_prompt_tokens, reference_prompt_tokens: both or neither".into()),
    };
    let moments = |values: &[f64]| {
        let mut m = Moments::default();
        values.iter().for_each(|&x| m.push(x));
        m
    };
    let (a, r) = (moments(&s.arm), moments(&s.reference));
    let mean = |m: &Moments| (m.n > 0).then_some(m.mean);
    let mean_diff = mean(&a).zip(mean(&r)).map(|(a, r)| a - r);
    Ok(SampleComparison {
        arm_n: a.n,
        reference_n: r.n,
        arm_mean: mean(&a),
        reference_mean: mean(&r),
        mean_diff,
        reading: reading(&a, &s.arm, &r, &s.reference, mean_diff),
        significance: SIGNIFICANCE,
        prompt_adjusted: adjusted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn spread(centre: f64, n: usize) -> Vec<f64> {
        (0..n).map(|i| centre + (i % 20) as f64).collect()
    }

    #[test]
    fn a_clearly_larger_sample_is_significant_and_an_equal_one_is_not() {
        let larger = compare(&Samples {
            arm: spread(100.0, 200),
            reference: spread(50.0, 200),
            ..Samples::default()
        })
        .unwrap();
        assert!(larger.reading.significant, "{larger:?}");
        assert!(larger.mean_diff.unwrap() > 49.0);
        let equal = compare(&Samples {
            arm: spread(50.0, 200),
            reference: spread(50.0, 200),
            ..Samples::default()
        })
        .unwrap();
        assert!(!equal.reading.significant, "{equal:?}");
        assert!(
            equal.reading.welch.unwrap().p > 0.5 && equal.reading.mann_whitney.unwrap().p > 0.5
        );
    }

    #[test]
    fn tiny_samples_have_no_verdict() {
        let c = compare(&Samples {
            arm: vec![1.0],
            reference: vec![],
            ..Samples::default()
        })
        .unwrap();
        assert!(!c.reading.significant && c.reading.welch.is_none() && c.reference_mean.is_none());
    }

    #[test]
    fn input_over_the_byte_limit_or_malformed_is_refused() {
        let huge = std::io::repeat(b' ').take(MAX_INPUT_BYTES + 1);
        assert!(compare_input(huge).unwrap_err().starts_with("more than"));
        let e = compare_input(&br#"{"arm": [1], "ref": []}"#[..]).unwrap_err();
        assert!(e.contains("unknown field `ref`"), "{e}");
        let ok = compare_input(&br#"{"arm": [1, 2, 3], "reference": [4, 5, 6]}"#[..]).unwrap();
        assert_eq!(ok.mean_diff, Some(-3.0));
    }

    /// The reference's prompts are 3,000 tokens longer, each token 0.1 ms: raw, the arm is
    /// faster; adjusted, the arms are alike. Prompt tokens that do not pair with the times are
    /// refused naming their field.
    #[test]
    fn given_prompt_tokens_the_samples_are_also_compared_adjusted_for_them() {
        let prompts = |longer: f64| -> Vec<f64> {
            (0..300)
                .map(|i| 1_000.0 + f64::from((i * 7_919) % 29_000) + longer)
                .collect()
        };
        let times = |prompts: &[f64]| -> Vec<f64> {
            prompts
                .iter()
                .enumerate()
                .map(|(i, p)| p / 10.0 + (i % 20) as f64)
                .collect()
        };
        let (ap, rp) = (prompts(0.0), prompts(3_000.0));
        let c = compare(&Samples {
            arm: times(&ap),
            reference: times(&rp),
            arm_prompt_tokens: Some(ap.clone()),
            reference_prompt_tokens: Some(rp),
        })
        .unwrap();
        assert!(
            c.reading.significant && c.mean_diff.unwrap() < -250.0,
            "{c:?}"
        );
        let a = c.prompt_adjusted.unwrap();
        assert!(
            !a.reading.significant && a.ttfb_mean_diff_ms.abs() < 1.0,
            "{a:?}"
        );
        assert_eq!(compare(&Samples::default()).unwrap().prompt_adjusted, None);

        let short = compare(&Samples {
            arm: times(&ap),
            arm_prompt_tokens: Some(ap[1..].to_vec()),
            reference_prompt_tokens: Some(vec![]),
            ..Samples::default()
        })
        .unwrap_err();
        assert!(short.starts_with("arm_prompt_tokens:"), "{short}");
        let one = compare(&Samples {
            arm_prompt_tokens: Some(vec![]),
            ..Samples::default()
        })
        .unwrap_err();
        assert!(one.contains("both or neither"), "{one}");
    }

    #[test]
    fn a_side_over_the_limit_is_refused_by_name() {
        let e = compare(&Samples {
            arm: vec![],
            reference: vec![0.0; MAX_VALUES + 1],
            ..Samples::default()
        })
        .unwrap_err();
        assert!(e.starts_with("reference:"), "{e}");
    }
}
