//! An experiment's grey release: where it is (its current step and, once rolled back, why),
//! kept by the fleet core with the running experiment ([`super::fleet::RunningExperiment`]),
//! and the decision that moves it ([`decide`]) from figures of the experiment's report, which
//! `attribution::release` reads out of it (the rules are listed there).

use prewarm_core::experiment::Release;
use serde::{Deserialize, Serialize};

use crate::error_rate::{errors_exceed, ERROR_RATE_LIMIT};

/// Why a release was rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RollbackReason {
    /// Another arm's time to first byte is significantly shorter.
    Ttfb,
    /// The first arm's error rate is above [`crate::error_rate::ERROR_RATE_LIMIT`].
    Errors,
    /// The warm-up the first arm alone brings is above its p95 per key.
    Warmup,
}

impl RollbackReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ttfb => "ttfb",
            Self::Errors => "errors",
            Self::Warmup => "warmup",
        }
    }
}

/// Where a release is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseState {
    /// Index of the current step in the release's steps.
    pub step: usize,
    pub step_started_ms: u64,
    /// Set once it was rolled back (the first arm's weight is 0 from then on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back: Option<Rollback>,
}

/// A rollback: why, when, and the figures that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollback {
    pub reason: RollbackReason,
    pub at_ms: u64,
    pub detail: String,
}

/// What a check decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Hold,
    /// To this step.
    Advance(usize),
    RollBack(RollbackReason, String),
}

/// What a check reads of the current step: the first arm's outcomes in it, and the warm-up's
/// p95 per key in it when the first arm alone brings warm-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepEvidence {
    pub requests: u64,
    pub warmup: Option<WarmupP95>,
}

/// The p95 of the warm-up keys that ended in a window, and how many there were.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupP95 {
    pub p95_ms: f64,
    pub keys: usize,
}

/// What a check reads of the experiment's report (since the start; `attribution::release`
/// builds it): the first arm's requests and errors, and another arm significantly faster.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseEvidence {
    pub requests: u64,
    pub errors: u64,
    pub faster: Option<FasterArm>,
}

/// An arm whose time to first byte is significantly shorter than the first arm's.
#[derive(Debug, Clone, PartialEq)]
pub struct FasterArm {
    pub arm: String,
    /// How much shorter on the mean, ms.
    pub faster_by_ms: f64,
    pub welch_p: f64,
    pub mann_whitney_p: f64,
}

/// The decision for `release` in `state`, from the report's `evidence` and the current step's
/// `step`, at `now_ms`. In order: a rolled-back release holds; roll back for errors, then for
/// time to first byte, then for warm-up; advance once the step lasted and saw enough requests.
pub fn decide(
    release: &Release,
    state: &ReleaseState,
    evidence: &ReleaseEvidence,
    step: StepEvidence,
    now_ms: u64,
) -> Decision {
    if state.rolled_back.is_some() {
        return Decision::Hold;
    }
    let first = evidence;
    if errors_exceed(first.errors, first.requests, release.min_requests) {
        return Decision::RollBack(
            RollbackReason::Errors,
            format!(
                "{} errors in {} requests: above {} % of at least {}",
                first.errors,
                first.requests,
                ERROR_RATE_LIMIT * 100.0,
                release.min_requests
            ),
        );
    }
    if let Some(c) = &evidence.faster {
        return Decision::RollBack(
            RollbackReason::Ttfb,
            format!(
                "arm {} is faster by {:.1} ms on the mean (welch p {:.2e}, mann-whitney p {:.2e})",
                c.arm, c.faster_by_ms, c.welch_p, c.mann_whitney_p
            ),
        );
    }
    if let Some(w) = step
        .warmup
        .filter(|w| w.p95_ms > release.warmup_p95_ms as f64)
    {
        return Decision::RollBack(
            RollbackReason::Warmup,
            format!(
                "warm-up p95 {:.0} ms per key over {} keys in the step: above {} ms",
                w.p95_ms, w.keys, release.warmup_p95_ms
            ),
        );
    }
    let lasted = now_ms.saturating_sub(state.step_started_ms) >= release.step_seconds * 1000;
    let next = state.step + 1;
    if lasted && step.requests >= release.min_requests && next < release.steps.len() {
        return Decision::Advance(next);
    }
    Decision::Hold
}
