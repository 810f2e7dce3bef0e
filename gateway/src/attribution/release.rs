//! The grey release's check over the experiment's report: [`release_evidence`] reads what the
//! decision needs from the report, [`crate::policy::release::decide`] decides (its rules are
//! below, kept here because the figures are the report's).
//!
//! Grey release of an experiment's first arm (`prewarm_core::experiment::Release`): its weight
//! climbs the release's steps while it is not significantly worse than the other arms, and goes
//! back to 0 by itself when it is. One decision per check, from the report:
//!
//! - **roll back for time to first byte** when another arm is significantly better than the
//!   first (both tests at p < 0.01, `report::Comparison::better`);
//! - **roll back for errors** when the first arm's error rate (5xx and 429) over at least
//!   `min_requests` requests exceeds [`crate::error_rate::ERROR_RATE_LIMIT`] — known as soon as
//!   its errors alone exceed that share of `min_requests`, whatever the requests still to come;
//! - **advance** to the next step once the current one has lasted `step_seconds` and the first
//!   arm has `min_requests` outcomes in it; hold at the last step (making it the default is the
//!   operator's call).
//!
//! - **roll back for warm-up** when the first arm is the only arm with warm-up and the warm-up
//!   keys that ended in the current step have a p95 above `warmup_p95_ms`
//!   ([`super::warmup`] says what the default assumes), over at least
//!   [`super::warmup::MIN_KEYS`] keys. Warm-ups are the fleet's, shared by every arm with
//!   warm-up on, so their cost is the first arm's only when no other arm has warm-up: then the
//!   candidate *is* the warm-up, and its keys slowing down means it is taking the pods' time.
//!   With warm-up on in another arm too, the criterion cannot tell the arms apart and is not
//!   applied.

use super::report::ExperimentReport;
use crate::policy::release::{
    self, Decision, FasterArm, ReleaseEvidence, ReleaseState, StepEvidence,
};
use prewarm_core::experiment::Release;

/// What the report says for the check: the first arm's outcomes since the start, and the first
/// arm that is significantly faster than it. `None` while the report has no arm.
pub fn release_evidence(report: &ExperimentReport) -> Option<ReleaseEvidence> {
    let first = report.arms.first()?;
    let p = |t: Option<super::report::TestResult>| t.map_or(f64::NAN, |t| t.p);
    let faster = report
        .comparisons
        .iter()
        .find(|c| c.reading.better)
        .map(|c| FasterArm {
            arm: c.arm.clone(),
            faster_by_ms: -c.ttfb_mean_diff_ms.unwrap_or(f64::NAN),
            welch_p: p(c.reading.welch),
            mann_whitney_p: p(c.reading.mann_whitney),
        });
    Some(ReleaseEvidence {
        requests: first.requests,
        errors: first.errors,
        faster,
    })
}

/// The decision for `release` in `state`, from `report` and the current step's `step`, at
/// `now_ms` ([`crate::policy::release::decide`] over [`release_evidence`]; holds while the
/// report has no arm).
pub fn decide(
    release: &Release,
    state: &ReleaseState,
    report: &ExperimentReport,
    step: StepEvidence,
    now_ms: u64,
) -> Decision {
    match release_evidence(report) {
        Some(evidence) => release::decide(release, state, &evidence, step, now_ms),
        None => Decision::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::report::{ArmSummary, Comparison, Reading, TestResult};
    use crate::policy::release::{Rollback, RollbackReason, WarmupP95};

    fn arm(name: &str, requests: u64, errors: u64) -> ArmSummary {
        ArmSummary {
            arm: name.into(),
            requests,
            errors,
            error_rate: None,
            ttfb_p50_ms: None,
            ttfb_p95_ms: None,
            ttfb_mean_ms: None,
            cached_token_ratio: None,
            with_usage: 0,
        }
    }

    fn report(first: ArmSummary, better: bool) -> ExperimentReport {
        ExperimentReport {
            generated_ms: 0,
            significance: 0.01,
            before: arm("before", 0, 0),
            arms: vec![first, arm("old", 1000, 0)],
            comparisons: vec![Comparison {
                arm: "old".into(),
                reference: "new".into(),
                ttfb_mean_diff_ms: Some(if better { -40.0 } else { 1.0 }),
                arm_vs_before_ms: None,
                reference_vs_before_ms: None,
                reading: Reading {
                    welch: Some(TestResult {
                        statistic: 5.0,
                        p: if better { 1e-5 } else { 0.4 },
                    }),
                    mann_whitney: None,
                    significant: better,
                    better,
                    worse: false,
                    requests_needed: None,
                },
                prompt_adjusted: None,
            }],
            new_pods: crate::attribution::report::NewPods {
                pods: Vec::new(),
                arms: Vec::new(),
                comparisons: Vec::new(),
                first_requests: crate::attribution::report::Cohort {
                    arms: Vec::new(),
                    comparisons: Vec::new(),
                },
            },
            hours: Vec::new(),
        }
    }

    fn release() -> Release {
        Release {
            steps: vec![0.01, 0.05, 0.25, 0.5],
            step_seconds: 60,
            min_requests: 200,
            warmup_p95_ms: 300,
        }
    }

    fn n(requests: u64) -> StepEvidence {
        StepEvidence {
            requests,
            warmup: None,
        }
    }

    fn at(step: usize) -> ReleaseState {
        ReleaseState {
            step,
            step_started_ms: 1_000,
            rolled_back: None,
        }
    }

    #[test]
    fn a_step_advances_only_once_it_lasted_and_saw_enough_requests() {
        let r = report(arm("new", 300, 0), false);
        assert_eq!(
            decide(&release(), &at(0), &r, n(300), 60_999),
            Decision::Hold
        );
        assert_eq!(
            decide(&release(), &at(0), &r, n(199), 61_000),
            Decision::Hold
        );
        assert_eq!(
            decide(&release(), &at(0), &r, n(200), 61_000),
            Decision::Advance(1)
        );
        assert_eq!(
            decide(&release(), &at(3), &r, n(5_000), 999_999),
            Decision::Hold,
            "the last step holds"
        );
    }

    #[test]
    fn another_arm_significantly_faster_rolls_the_release_back() {
        let r = report(arm("new", 300, 0), true);
        match decide(&release(), &at(1), &r, n(10), 2_000) {
            Decision::RollBack(RollbackReason::Ttfb, detail) => {
                assert!(detail.contains("old is faster by 40.0 ms"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_roll_back_as_soon_as_the_limit_is_certain() {
        // 0.5 % of 200 is 1 error: a second one already decides
        assert_eq!(
            decide(
                &release(),
                &at(0),
                &report(arm("new", 20, 1), false),
                n(20),
                2_000
            ),
            Decision::Hold
        );
        assert!(matches!(
            decide(
                &release(),
                &at(0),
                &report(arm("new", 20, 2), false),
                n(20),
                2_000
            ),
            Decision::RollBack(RollbackReason::Errors, _)
        ));
        // past min_requests the rate itself counts: 5 in 1000 is the limit, 6 is over
        let at_limit = report(arm("new", 1000, 5), false);
        assert_eq!(
            decide(&release(), &at(3), &at_limit, n(0), 2_000),
            Decision::Hold
        );
        assert!(matches!(
            decide(
                &release(),
                &at(3),
                &report(arm("new", 1000, 6), false),
                n(0),
                2_000
            ),
            Decision::RollBack(RollbackReason::Errors, _)
        ));
    }

    #[test]
    fn a_rolled_back_release_stays_back() {
        let mut state = at(2);
        state.rolled_back = Some(Rollback {
            reason: RollbackReason::Errors,
            at_ms: 5,
            detail: String::new(),
        });
        let r = report(arm("new", 300, 100), true);
        assert_eq!(
            decide(&release(), &state, &r, n(1_000), 999_999),
            Decision::Hold
        );
    }

    #[test]
    fn a_slow_warm_up_rolls_back_only_the_arm_that_alone_brings_it() {
        let r = report(arm("new", 300, 0), false);
        let slow = |p95_ms| StepEvidence {
            requests: 10,
            warmup: Some(WarmupP95 { p95_ms, keys: 25 }),
        };
        assert_eq!(
            decide(&release(), &at(1), &r, slow(300.0), 2_000),
            Decision::Hold
        );
        match decide(&release(), &at(1), &r, slow(412.4), 2_000) {
            Decision::RollBack(RollbackReason::Warmup, detail) => assert_eq!(
                detail,
                "warm-up p95 412 ms per key over 25 keys in the step: above 300 ms"
            ),
            other => panic!("{other:?}"),
        }
        // no evidence (another arm warms too, or too few keys): no warm-up verdict
        assert_eq!(decide(&release(), &at(1), &r, n(10), 2_000), Decision::Hold);
    }
}
