//! Adapter rollouts and the gateway's own rollbacks of them. A rollout re-loads an adapter's new
//! current version on every pod that holds it and reports the versions before and after. The
//! gateway undoes a rollout by itself when
//!
//! - it leaves the holders on different versions (a pod refused or failed the new version): at
//!   once, in the registration's reply (`reason` `inconsistent`);
//! - its requests fail: a consistent rollout is watched for `registry.rollout_watch_seconds`
//!   ([`crate::registry::watch`]) and rolled back when more than 0.5 % of its requests err
//!   (`reason` `errors`), checked every second.
//!
//! What follows a rollout or a watch's verdict (which version, which pods, the reason) is
//! decided by [`crate::policy::rollout`]; this file executes it: the previous version's files
//! are verified against its manifest, it becomes current again and is re-loaded on the pods the
//! plan names; a warning is logged and `prewarm_adapter_auto_rollbacks_total{reason}` counted.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use super::adapters::DecisionOutcome;
use super::Gateway;
use crate::policy::rollout::{self, AfterRollout, RollbackPlan};
use crate::registry::{verify_for_load, Registered, RolloutWatch};
use crate::telemetry::Telemetry;

/// What a rollout (or rollback) found and did.
#[derive(Debug, Serialize)]
pub struct RolloutReport {
    /// Version loaded on each pod holding the adapter, before.
    pub before: BTreeMap<String, String>,
    pub outcomes: Vec<DecisionOutcome>,
    /// Version on each pod holding the adapter, after.
    pub after: BTreeMap<String, String>,
    /// Every pod holding the adapter has the new version.
    pub consistent: bool,
}

/// What the gateway did by itself to undo a rollout.
#[derive(Debug, Serialize)]
pub struct AutoRollback {
    /// The version made current again.
    pub to: String,
    pub reason: String,
    /// The re-load of `to` on the holders (`None` when its files no longer match its manifest
    /// and nothing was touched).
    pub rollout: Option<RolloutReport>,
}

impl Gateway {
    /// The version loaded on each pod holding `name`.
    pub fn versions_on_pods(&self, name: &str) -> BTreeMap<String, String> {
        self.state()
            .pods
            .values()
            .filter_map(|p| {
                p.versions
                    .get(name)
                    .map(|v| (p.spec.id.clone(), v.version.clone()))
            })
            .collect()
    }

    /// Re-loads the adapter's new current version on every pod that holds it.
    pub async fn roll_out(self: &Arc<Self>, registered: &Registered) -> RolloutReport {
        let holders: Vec<String> = self
            .versions_on_pods(&registered.name)
            .into_keys()
            .collect();
        self.roll_out_on(registered, holders).await
    }

    /// Loads the adapter's current version on `holders`.
    async fn roll_out_on(
        self: &Arc<Self>,
        registered: &Registered,
        holders: Vec<String>,
    ) -> RolloutReport {
        let before = self.versions_on_pods(&registered.name);
        let actions = self.fleet(|f| f.reload_adapter(&registered.name, &holders));
        let outcomes = self.execute_all(actions).await;
        let after = self.versions_on_pods(&registered.name);
        let consistent = rollout::is_consistent(&holders, &after, &registered.version);
        if !consistent {
            tracing::error!(adapter = %registered.name, ?after, "rollout left pods inconsistent");
        }
        RolloutReport {
            before,
            outcomes,
            after,
            consistent,
        }
    }

    /// Does what follows a rollout of `registered` from `previous` that `report` describes:
    /// watches a consistent one; rolls an inconsistent one back at once, returning what that did.
    pub async fn settle_rollout(
        self: &Arc<Self>,
        registered: &Registered,
        previous: &str,
        report: &RolloutReport,
    ) -> Option<AutoRollback> {
        let next = rollout::after_rollout(
            &registered.name,
            &registered.version,
            previous,
            &report.before,
            &report.after,
            report.consistent,
        );
        match next {
            AfterRollout::Watch { previous } => {
                self.watch_rollout(registered, &previous);
                None
            }
            AfterRollout::RollBack(plan) => Some(self.roll_back_by_itself(plan).await),
        }
    }

    /// Starts the error watch of a consistent rollout of `registered` from `previous`
    /// (nothing when `registry.rollout_watch_seconds` is 0).
    fn watch_rollout(&self, registered: &Registered, previous: &str) {
        let seconds = self.config.registry.rollout_watch_seconds;
        if seconds == 0 {
            return;
        }
        let watch = RolloutWatch::new(&registered.version, previous, self.now(), seconds * 1000);
        self.state()
            .fleet
            .registry_mut()
            .watch(&registered.name, watch);
    }

    /// One check of the rollouts under watch: a watch past its end passes; one whose requests
    /// err rolls its adapter back.
    pub async fn check_rollout_watches(self: &Arc<Self>) {
        let now = self.now();
        let min_requests = self.config.registry.rollout_min_requests;
        let verdicts = self
            .state()
            .fleet
            .registry()
            .watch_verdicts(now, min_requests);
        for (name, previous, verdict) in verdicts {
            let holders = self.versions_on_pods(&name).into_keys().collect();
            let Some(decision) = rollout::on_watch_verdict(&name, &previous, verdict, holders)
            else {
                continue;
            };
            if decision.rollback.is_none() {
                tracing::info!(adapter = %name, detail = %decision.detail, "rollout watch passed");
            }
            // the watch ends with its whole detail before the rollback starts, so a reader never
            // sees an ended watch without what was done about it
            self.state().fleet.registry_mut().end_watch(
                &name,
                now,
                decision.outcome,
                decision.detail,
            );
            if let Some(plan) = decision.rollback {
                let reason = plan.reason.clone();
                let undone = self.roll_back_by_itself(plan).await;
                if undone.reason != reason {
                    self.state()
                        .fleet
                        .registry_mut()
                        .amend_ended_watch(&name, undone.reason);
                }
            }
        }
    }

    /// Executes `plan`: makes its version current again and re-loads it on its pods, the
    /// version's files verified first.
    async fn roll_back_by_itself(self: &Arc<Self>, plan: RollbackPlan) -> AutoRollback {
        let RollbackPlan {
            adapter: name,
            to: previous,
            reload_on: holders,
            cause,
            reason,
        } = plan;
        tracing::warn!(adapter = %name, %reason, "automatic rollback");
        Telemetry::count(&self.telemetry.auto_rollbacks, &[("reason", cause.label())]);
        let target = self
            .state()
            .fleet
            .registry()
            .get(&name)
            .and_then(|r| r.history.iter().find(|v| v.version == previous).cloned());
        if let Some(version) = target {
            let max_files = self.config.registry.max_manifest_files;
            let n = name.clone();
            let verified =
                tokio::task::spawn_blocking(move || verify_for_load(&n, &version, max_files))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
            if let Err(e) = verified {
                return AutoRollback {
                    reason: rollout::not_reloaded(&reason, &e),
                    to: previous,
                    rollout: None,
                };
            }
        }
        let back = self.state().fleet.registry_mut().rollback(&name, &previous);
        match back {
            Ok(back) => AutoRollback {
                rollout: Some(self.roll_out_on(&back, holders).await),
                to: previous,
                reason,
            },
            Err(e) => AutoRollback {
                reason: rollout::not_reloaded(&reason, &e.to_string()),
                to: previous,
                rollout: None,
            },
        }
    }
}
