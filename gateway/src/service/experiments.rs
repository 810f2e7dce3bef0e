//! Starting and ending the experiment (`policy::fleet::experiment`): each change rebuilds and
//! publishes the table at once, so the filters' next poll routes with it, and writes a
//! snapshot, so it survives a restart.

use prewarm_core::experiment::Experiment;

use super::Gateway;
use crate::attribution::release::decide;
use crate::attribution::report::{label, report, ExperimentReport, TestResult, PROMPT_ADJUSTED};
use crate::policy::fleet::{ExperimentError, RunningExperiment};
use crate::policy::release::{Decision, Rollback, StepEvidence};
use crate::telemetry::Telemetry;

impl Gateway {
    /// Starts `definition`, or changes the arms of the running experiment with its id; returns
    /// it and whether it is new.
    pub async fn start_experiment(
        self: &std::sync::Arc<Self>,
        definition: Experiment,
    ) -> Result<(RunningExperiment, bool), ExperimentError> {
        let now = self.now();
        let started = self.fleet(|f| f.start_experiment(definition, now))?;
        tracing::info!(experiment = %started.0.definition.id, new = started.1, "experiment started");
        self.experiment_changed().await;
        Ok(started)
    }

    /// Ends experiment `id`.
    pub async fn end_experiment(
        self: &std::sync::Arc<Self>,
        id: &str,
    ) -> Result<RunningExperiment, ExperimentError> {
        let ended = self.fleet(|f| f.end_experiment(id))?;
        tracing::info!(experiment = %id, "experiment ended");
        self.experiment_changed().await;
        Ok(ended)
    }

    async fn experiment_changed(self: &std::sync::Arc<Self>) {
        self.republish_table();
        self.export_experiment();
        let g = self.clone();
        // a failed write is logged and counted by `write_snapshot`; the periodic one retries
        let _ = tokio::task::spawn_blocking(move || g.write_snapshot()).await;
    }

    /// The running experiment `id` and its report (with its hours when `with_hours`).
    pub fn experiment_report(
        &self,
        id: &str,
        with_hours: bool,
    ) -> Option<(RunningExperiment, ExperimentReport)> {
        let running = self
            .state()
            .fleet
            .experiment()
            .filter(|r| r.definition.id == id)
            .cloned()?;
        let now = self.now();
        let ledger = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        let report = report(&ledger, &running, now, with_hours);
        Some((running, report))
    }

    /// The running experiment and its report without hours.
    fn current_report(&self) -> Option<(RunningExperiment, ExperimentReport)> {
        let id = self
            .state()
            .fleet
            .experiment()
            .map(|r| r.definition.id.clone())?;
        self.experiment_report(&id, false)
    }

    /// Exports the running experiment's arms and report as metrics.
    pub fn export_experiment(&self) {
        let current = self.current_report();
        self.telemetry
            .set_experiment(current.as_ref().map(|(r, report)| (r, report)));
    }

    /// One check of the running experiment, on one report: its first significances noted
    /// ([`Self::note_significance`]), then its grey release ([`Self::check_release`]).
    pub async fn check_experiment(self: &std::sync::Arc<Self>) {
        let Some((running, report)) = self.current_report() else {
            return;
        };
        self.note_significance(&report);
        self.check_release(running, report).await;
    }

    /// Notes as an event, once each, every comparison (overall, on the new pods, on their first
    /// requests of hot prefixes; raw and adjusted for prompt length) that became significant,
    /// with the requests it took.
    fn note_significance(&self, report: &ExperimentReport) {
        let mut found = Vec::new();
        for cohort in report.cohorts() {
            let (arms, on) = (cohort.arms, cohort.on);
            let requests = |name: &str| {
                arms.iter()
                    .find(|a| a.arm == name)
                    .map_or(0, |a| a.requests)
            };
            let p = |t: Option<TestResult>| t.map_or(f64::NAN, |t| t.p);
            for c in cohort.comparisons {
                let adjusted = c.prompt_adjusted.as_ref().map(|a| a.reading);
                let readings = std::iter::once(("", "", c.reading))
                    .chain(adjusted.map(|r| (PROMPT_ADJUSTED, " adjusted for prompt length", r)));
                for (suffix, how, r) in readings.filter(|(_, _, r)| r.significant) {
                    let event = format!(
                        "arm {} significantly {} than {}{on}{how} after {} + {} requests (welch p {:.2e}, mann-whitney p {:.2e})",
                        c.arm,
                        if r.better { "faster" } else { "slower" },
                        c.reference,
                        requests(&c.arm),
                        requests(&c.reference),
                        p(r.welch),
                        p(r.mann_whitney),
                    );
                    found.push((format!("{}{}{suffix}", c.arm, cohort.suffix), event));
                }
            }
        }
        if !found.is_empty() {
            let now = self.now();
            self.fleet(|f| f.note_significant(found, now));
        }
    }

    /// One check of the running experiment's grey release (`attribution::release`): advances
    /// it, rolls it back (with an event, a metric and a log line naming the reason) or holds.
    async fn check_release(
        self: &std::sync::Arc<Self>,
        running: RunningExperiment,
        report: ExperimentReport,
    ) {
        let (Some(release), Some(state), Some(first)) = (
            &running.definition.release,
            &running.release,
            running.definition.arms.first(),
        ) else {
            return;
        };
        let now = self.now();
        let requests = self
            .outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .total(
                &label(&running, &first.name),
                state.step_started_ms,
                now + 1,
            )
            .requests;
        let alone_warms = first.settings.warmup
            && running.definition.arms[1..]
                .iter()
                .all(|a| !a.settings.warmup);
        let warmup = alone_warms
            .then(|| {
                self.warmup_latencies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .p95_since(state.step_started_ms)
            })
            .flatten();
        let step = StepEvidence { requests, warmup };
        let id = running.definition.id.as_str();
        match decide(release, state, &report, step, now) {
            Decision::Hold => return,
            Decision::Advance(step) => {
                let weight = self.fleet(|f| f.advance_release(step, now));
                tracing::info!(experiment = %id, step, ?weight, "release advanced");
            }
            Decision::RollBack(reason, detail) => {
                let rollback = Rollback {
                    reason,
                    at_ms: now,
                    detail: detail.clone(),
                };
                let arm = self.fleet(|f| f.roll_back_release(rollback));
                let arm = arm.unwrap_or_default();
                tracing::warn!(experiment = %id, %arm, reason = reason.as_str(), %detail, "release rolled back");
                Telemetry::count(
                    &self.telemetry.experiment_rollbacks,
                    &[
                        ("experiment", id),
                        ("arm", &arm),
                        ("reason", reason.as_str()),
                    ],
                );
            }
        }
        self.experiment_changed().await;
    }
}
