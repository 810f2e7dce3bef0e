//! An arm against the reference on times to first byte adjusted for prompt length.
//!
//! A time to first byte is mostly prefill, which grows with the prompt's tokens; one trace's
//! prompts span a few hundred to tens of thousands of tokens, so their lengths, more than the
//! arms, set the spread of the times, and an arm whose users drew the longer prompts looks
//! slower. A request's arm is a hash of its user, fixed before the arm acts, so its prompt
//! length is a covariate the arm cannot change, and regression adjustment (ANCOVA; CUPED in
//! online experiments) may remove it: each comparison is repeated
//! (`Comparison::prompt_adjusted`) on `t − b·(x − x̄)`, x the request's prompt tokens, x̄ their
//! mean over both arms and b the arms' common within-arm slope
//! (`stats::CoMoments::pooled_slope`, so the arms' own difference does not enter it). Under the
//! random split the difference of adjusted means estimates the same effect as the raw one
//! (consistent even when the arms' slopes differ, as a warm-up's do, Lin 2013), with the
//! residual's variance, `(1 − ρ²)` of the raw one's. It assumes a time grows about linearly
//! with the prompt (prefill's work a token is constant up to the engine's batch limit); where
//! it does not, the adjustment removes less, not wrongly. Only requests whose responses reported `usage.prompt_tokens` enter it. The grey
//! release reads the raw comparison.

use serde::Serialize;

use super::ledger::Bucket;
use super::report::{reading, Reading};
use super::stats::{CoMoments, Moments};

/// An arm against the reference on times to first byte adjusted for prompt length (the module
/// doc): `t − slope·(prompt − mean prompt)`, over the requests whose responses reported
/// their prompt tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptAdjusted {
    /// The arm's and the reference's requests with prompt tokens.
    pub requests: u64,
    pub reference_requests: u64,
    /// The common within-arm slope of time to first byte on prompt length, ms per 1,000 tokens.
    pub ms_per_1k_prompt_tokens: f64,
    /// The arm's adjusted mean minus the reference's, ms.
    pub ttfb_mean_diff_ms: f64,
    /// The tests of the adjusted times and what they say (serialised as this struct's own
    /// fields).
    #[serde(flatten)]
    pub reading: Reading,
}

/// One side of a comparison adjusted for prompt length: the co-moments of all of its
/// (prompt tokens, time) pairs and a uniform sample of its (time, prompt tokens) pairs.
pub struct ByPrompt<'a> {
    pub moments: &'a CoMoments,
    pub sample: Vec<(f64, f64)>,
}

impl<'a> ByPrompt<'a> {
    /// The side of a ledger bucket: its co-moments and its sample's pairs.
    pub(super) fn of(b: &'a Bucket) -> Self {
        Self {
            moments: &b.by_prompt,
            sample: b.sample_with_prompt().collect(),
        }
    }
}

/// `arm` against `reference` with each time adjusted for its prompt's length by the two arms'
/// common slope, centred on their pooled mean prompt; `None` when no prompt length varies.
pub fn prompt_adjusted(arm: &ByPrompt, reference: &ByPrompt) -> Option<PromptAdjusted> {
    let slope = CoMoments::pooled_slope(&[arm.moments, reference.moments])?;
    let mut pooled = *arm.moments;
    pooled.merge(reference.moments);
    let center = pooled.mean_x;
    let adjust = |side: &ByPrompt| -> (Moments, Vec<f64>) {
        let sample = side
            .sample
            .iter()
            .map(|(t, p)| t - slope * (p - center))
            .collect();
        (side.moments.adjusted(slope, center), sample)
    };
    let ((a, a_sample), (r, r_sample)) = (adjust(arm), adjust(reference));
    let diff = a.mean - r.mean;
    Some(PromptAdjusted {
        requests: a.n,
        reference_requests: r.n,
        ms_per_1k_prompt_tokens: slope * 1000.0,
        ttfb_mean_diff_ms: diff,
        reading: reading(&a, &a_sample, &r, &r_sample, Some(diff)),
    })
}
