//! The decisions about an adapter rollout: whether it left its holders consistent, what the
//! gateway does by itself after it (watch it, or roll it back at once), and what an error
//! watch's verdict leads to. A rollback is returned as a [`RollbackPlan`] (the version made
//! current again, the pods it is re-loaded on, the reason); the shell
//! (`service::rollouts`) verifies the version's files, moves the registry, calls the pods and
//! counts it. Pure, so the evaluator and the property tests reach it.

use std::collections::BTreeMap;

use crate::registry::{Verdict, WatchOutcome};

/// Why the gateway rolls a rollout back by itself (the `reason` label of
/// `prewarm_adapter_auto_rollbacks_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackCause {
    /// The rollout left the holders on different versions.
    Inconsistent,
    /// The rollout's requests erred (its watch failed).
    Errors,
}

impl RollbackCause {
    pub fn label(self) -> &'static str {
        match self {
            Self::Inconsistent => "inconsistent",
            Self::Errors => "errors",
        }
    }
}

/// A rollback the gateway makes by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPlan {
    pub adapter: String,
    /// The version made current again.
    pub to: String,
    /// The pods it is re-loaded on.
    pub reload_on: Vec<String>,
    pub cause: RollbackCause,
    pub reason: String,
}

/// What follows a rollout of a new version over a previous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterRollout {
    /// Consistent: its requests are watched, rolling back to `previous` if they err.
    Watch { previous: String },
    /// Inconsistent: undone at once.
    RollBack(RollbackPlan),
}

/// The end a watch's verdict records, and the rollback it leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchDecision {
    pub outcome: WatchOutcome,
    /// The ended watch's detail (for a rollback, its reason).
    pub detail: String,
    pub rollback: Option<RollbackPlan>,
}

/// Whether every one of `holders` has `version` in `after` (the versions on pods after a load).
pub fn is_consistent(holders: &[String], after: &BTreeMap<String, String>, version: &str) -> bool {
    holders
        .iter()
        .all(|p| after.get(p).map(String::as_str) == Some(version))
}

/// What follows a rollout of `adapter`'s `version` over `previous`, given the versions on pods
/// `before` and `after` it and whether it left its holders `consistent`. An inconsistent one is
/// rolled back to `previous` on every pod that held the adapter before, including one the
/// failed load left without it.
pub fn after_rollout(
    adapter: &str,
    version: &str,
    previous: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    consistent: bool,
) -> AfterRollout {
    if consistent {
        return AfterRollout::Watch {
            previous: previous.to_string(),
        };
    }
    let odd: Vec<String> = after
        .iter()
        .filter(|(_, v)| v.as_str() != version)
        .map(|(p, v)| format!("{p}={v}"))
        .chain(
            before
                .keys()
                .filter(|p| !after.contains_key(*p))
                .map(|p| format!("{p}=none")),
        )
        .collect();
    let reason = format!(
        "rollout of {adapter:?} version {version:?} left pods inconsistent ({}): rolled back to {previous:?}",
        odd.join(", ")
    );
    AfterRollout::RollBack(RollbackPlan {
        adapter: adapter.to_string(),
        to: previous.to_string(),
        reload_on: before.keys().cloned().collect(),
        cause: RollbackCause::Inconsistent,
        reason,
    })
}

/// What `adapter`'s watch `verdict` leads to: nothing while watching; a passed end; or a
/// rolled-back end whose detail is the rollback's reason and a rollback to `previous` on
/// `holders` (the pods holding the adapter now). The watch ends before the rollback starts, so
/// a reader never sees an ended watch without what was done about it.
pub fn on_watch_verdict(
    adapter: &str,
    previous: &str,
    verdict: Verdict,
    holders: Vec<String>,
) -> Option<WatchDecision> {
    match verdict {
        Verdict::Watching => None,
        Verdict::Passed(detail) => Some(WatchDecision {
            outcome: WatchOutcome::Passed,
            detail,
            rollback: None,
        }),
        Verdict::Failed(detail) => {
            let reason = format!("rollout of {adapter:?}: {detail}: rolled back to {previous:?}");
            Some(WatchDecision {
                outcome: WatchOutcome::RolledBack,
                detail: reason.clone(),
                rollback: Some(RollbackPlan {
                    adapter: adapter.to_string(),
                    to: previous.to_string(),
                    reload_on: holders,
                    cause: RollbackCause::Errors,
                    reason,
                }),
            })
        }
    }
}

/// A rollback's reason when its version could not be re-loaded (its files no longer match
/// its manifest, or the registry refused it): nothing was touched.
pub fn not_reloaded(reason: &str, error: &str) -> String {
    format!("{reason}; not re-loaded: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NEW: &str = "v2";
    const OLD: &str = "v1";

    /// Versions on up to 8 pods: `None` is a pod without the adapter.
    fn versions() -> impl Strategy<Value = Vec<Option<&'static str>>> {
        proptest::collection::vec(
            prop_oneof![
                Just(None),
                Just(Some(OLD)),
                Just(Some(NEW)),
                Just(Some("v0"))
            ],
            0..8,
        )
    }

    fn map(vs: &[Option<&str>]) -> BTreeMap<String, String> {
        vs.iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (format!("pod-{i}"), v.to_string())))
            .collect()
    }

    fn rollout_of(before: &[Option<&str>], after: &[Option<&str>]) -> AfterRollout {
        let (before, after) = (map(before), map(after));
        let holders: Vec<String> = before.keys().cloned().collect();
        let consistent = is_consistent(&holders, &after, NEW);
        after_rollout("sql", NEW, OLD, &before, &after, consistent)
    }

    #[test]
    fn an_inconsistent_rollout_names_each_odd_pod_and_the_target() {
        let before = map(&[Some(OLD), Some(OLD), Some(OLD)]);
        let after = map(&[Some(NEW), Some(OLD), None]);
        let holders: Vec<String> = before.keys().cloned().collect();
        assert!(!is_consistent(&holders, &after, NEW));
        match after_rollout("sql", NEW, OLD, &before, &after, false) {
            AfterRollout::RollBack(plan) => {
                assert_eq!(
                    plan.reason,
                    "rollout of \"sql\" version \"v2\" left pods inconsistent \
                     (pod-1=v1, pod-2=none): rolled back to \"v1\""
                );
                assert_eq!(plan.reload_on, ["pod-0", "pod-1", "pod-2"]);
                assert_eq!(plan.cause.label(), "inconsistent");
            }
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// A rollback for inconsistency re-loads the previous version on exactly the pods that
        /// held the adapter before the rollout, including ones the failed load left without it.
        #[test]
        fn a_rollbacks_reload_set_is_exactly_the_pods_that_held_the_adapter_before(
            before in versions(),
            after in versions(),
        ) {
            if let AfterRollout::RollBack(plan) = rollout_of(&before, &after) {
                let held: Vec<String> = map(&before).into_keys().collect();
                prop_assert_eq!(&plan.reload_on, &held);
                prop_assert_eq!(plan.to.as_str(), OLD);
                prop_assert_eq!(plan.cause, RollbackCause::Inconsistent);
                for pod in held.iter().filter(|p| !map(&after).contains_key(*p)) {
                    let named = format!("{pod}=none");
                    prop_assert!(plan.reason.contains(&named));
                }
            }
        }

        /// A rollout that leaves every holder on the new version is watched, never rolled back
        /// for inconsistency; one that leaves any holder otherwise is rolled back.
        #[test]
        fn a_consistent_rollout_is_never_rolled_back_for_inconsistency(
            before in versions(),
            stray in versions(),
        ) {
            // every pod that held the adapter now has the new version; others may hold anything
            let after: Vec<Option<&str>> = (0..before.len().max(stray.len()))
                .map(|i| match before.get(i).copied().flatten() {
                    Some(_) => Some(NEW),
                    None => stray.get(i).copied().flatten(),
                })
                .collect();
            prop_assert_eq!(
                rollout_of(&before, &after),
                AfterRollout::Watch { previous: OLD.to_string() }
            );
            let lost = before.iter().position(Option::is_some);
            if let Some(i) = lost {
                let mut broken = after.clone();
                broken[i] = None;
                let undone = matches!(rollout_of(&before, &broken), AfterRollout::RollBack(_));
                prop_assert!(undone, "a holder left without the adapter is inconsistent");
            }
        }

        /// A failed watch always rolls back to the watch's `previous` on the current holders,
        /// and ends the watch with a detail naming the errors and the target.
        #[test]
        fn a_failed_watch_always_rolls_back_to_its_previous(
            errors in 0u64..1_000,
            requests in 0u64..100_000,
            previous in "[a-z0-9.]{1,8}",
            holders in versions(),
        ) {
            let detail = format!("version \"v9\": {errors} errors in {requests} requests");
            let holders: Vec<String> = map(&holders).into_keys().collect();
            let failed = Verdict::Failed(detail.clone());
            let decision = on_watch_verdict("sql", &previous, failed, holders.clone());
            let Some(decision) = decision else {
                return Err(TestCaseError::fail("a failed verdict decided nothing"));
            };
            prop_assert_eq!(decision.outcome, WatchOutcome::RolledBack);
            prop_assert!(decision.detail.contains(&detail));
            let target = format!("rolled back to {previous:?}");
            prop_assert!(decision.detail.contains(&target));
            let Some(plan) = decision.rollback else {
                return Err(TestCaseError::fail("a failed verdict without a rollback"));
            };
            prop_assert_eq!(&plan.to, &previous);
            prop_assert_eq!(&plan.reload_on, &holders);
            prop_assert_eq!(plan.cause, RollbackCause::Errors);
            prop_assert_eq!(&plan.reason, &decision.detail);
        }

        /// A passed watch (or one still watching) never rolls back.
        #[test]
        fn a_passed_watch_never_rolls_back(
            detail in ".{0,40}",
            previous in "[a-z0-9.]{1,8}",
            holders in versions(),
        ) {
            let holders: Vec<String> = map(&holders).into_keys().collect();
            let verdict = Verdict::Passed(detail.clone());
            let passed = on_watch_verdict("sql", &previous, verdict, holders.clone());
            prop_assert_eq!(
                passed,
                Some(WatchDecision { outcome: WatchOutcome::Passed, detail, rollback: None })
            );
            prop_assert_eq!(on_watch_verdict("sql", &previous, Verdict::Watching, holders), None);
        }
    }
}
