//! The fleet's experiment part ([`Experiments`]): the running experiment — its definition
//! (`prewarm_core::experiment`), which the routing table carries to the filters, when it
//! started, where its grey release is (`policy::release`) — and the residency rules its arms
//! give their tenants' adapters.
//!
//! Invariants it keeps:
//! - at most one experiment runs: arms of two experiments on the same traffic would confound
//!   each other's outcomes; a definition with the running one's id re-weights it and keeps its
//!   start, events and joined pods;
//! - an experiment's events are at most [`MAX_EVENTS`] (the oldest dropped) and its joined pods
//!   at most [`MAX_JOINED_PODS`], each once, and only pods that joined after the fleet
//!   [settled](Experiments::settle) (the pods found up when the gateway starts are not new);
//! - the arms' residency rules ([`ArmRules`]) change generation exactly when the set of rules
//!   changes, so pods copy them only then.

use std::collections::BTreeMap;

use prewarm_core::experiment::{Experiment, ResidencyRule, Unit};
use serde::{Deserialize, Serialize};

use super::Fleet;
use crate::policy::release::{ReleaseState, Rollback};
use crate::registry::{AdapterRecord, AdapterRegistry};

/// Events an experiment keeps (the oldest are dropped).
pub const MAX_EVENTS: usize = 64;

/// An experiment, its start and its release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningExperiment {
    /// The live definition: with a release, the weights are the release's current step.
    pub definition: Experiment,
    /// Gateway clock when it started, ms since the Unix epoch (kept when its weights change).
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseState>,
    /// What happened to it: started, re-weighted, steps, rollbacks.
    #[serde(default)]
    pub events: Vec<ExperimentEvent>,
    /// Pods that (re)joined since it started (at most [`MAX_JOINED_PODS`]), whose outcomes the
    /// report also gives apart.
    #[serde(default)]
    pub joined_pods: Vec<String>,
    /// The comparisons (`arm`, or `arm@new` on the new pods) whose first significance was
    /// noted as an event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub significant: Vec<String>,
}

/// Joined pods an experiment remembers.
pub const MAX_JOINED_PODS: usize = 256;

/// One event of an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentEvent {
    pub at_ms: u64,
    pub event: String,
}

impl RunningExperiment {
    fn note(&mut self, at_ms: u64, event: String) {
        if self.events.len() >= MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(ExperimentEvent { at_ms, event });
    }
}

/// Why an experiment could not start or end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExperimentError {
    #[error("{0}")]
    Invalid(String),
    #[error("id: {new:?}: experiment {running:?} is running; end it first")]
    AnotherRunning { running: String, new: String },
    #[error("experiment {0:?}: not running")]
    NotRunning(String),
}

/// The residency rules of an experiment by tenant: each registered adapter whose tenant's arm
/// sets `residency_rule` has that rule on every pod (the others keep `[lora]`'s), so an arm's
/// rule decides the GPU slots of its tenants' adapters and no other's. `generation` grows
/// with each change; a pod copies the rules when it has not seen the generation.
#[derive(Debug, Clone, Default)]
pub struct ArmRules {
    rules: BTreeMap<String, ResidencyRule>,
    generation: u64,
}

/// The experiment part of the fleet (module doc).
#[derive(Debug, Clone, Default)]
pub struct Experiments {
    running: Option<RunningExperiment>,
    /// The residency rules the running tenant experiment's arms give their tenants' adapters.
    arm_rules: ArmRules,
    /// The gateway's first health round is done ([`Experiments::settle`]).
    settled: bool,
}

impl Experiments {
    /// The running experiment.
    pub fn running(&self) -> Option<&RunningExperiment> {
        self.running.as_ref()
    }

    /// The tenant experiment running, if one is.
    fn tenant_experiment(&self) -> Option<&Experiment> {
        self.running
            .as_ref()
            .map(|r| &r.definition)
            .filter(|e| e.unit == Unit::Tenant)
    }

    /// The rule `experiment`'s arms give adapter `record` (none: `[lora]`'s).
    fn arm_rule_of(experiment: &Experiment, record: &AdapterRecord) -> Option<ResidencyRule> {
        let tenant = record.tenant.as_deref()?;
        let arm = experiment.arms.get(experiment.arm_of(tenant.as_bytes()))?;
        arm.settings.residency_rule
    }

    /// The arms' residency rules for the adapters of `registry`, recomputed (with a new
    /// generation) only when they changed: a grey release's step or a registration changes
    /// them; checked each tick, without allocating while they stand.
    fn arm_rules(&mut self, registry: &AdapterRegistry) -> &ArmRules {
        let current = &self.arm_rules.rules;
        let changed = match self.tenant_experiment() {
            None => !current.is_empty(),
            Some(e) => {
                let mut ruled = 0;
                let differs = registry.iter().any(|a| {
                    let rule = Self::arm_rule_of(e, a);
                    ruled += usize::from(rule.is_some());
                    rule != current.get(&a.name).copied()
                });
                differs || ruled != current.len()
            }
        };
        if changed {
            let rules = match self.tenant_experiment() {
                None => BTreeMap::new(),
                Some(e) => registry
                    .iter()
                    .filter_map(|a| Some((a.name.clone(), Self::arm_rule_of(e, a)?)))
                    .collect(),
            };
            self.arm_rules.rules = rules;
            self.arm_rules.generation += 1;
        }
        &self.arm_rules
    }

    /// Starts `definition` at `now_ms`, or changes the running one's arms when it has the same
    /// id (its start is kept). With a release, the first arm starts at the release's first step
    /// (a re-post restarts the release). Returns the running experiment and whether it is new.
    pub fn start(
        &mut self,
        definition: Experiment,
        now_ms: u64,
    ) -> Result<(RunningExperiment, bool), ExperimentError> {
        if let Some(problem) = definition.problem() {
            return Err(ExperimentError::Invalid(problem));
        }
        let started_ms = match &self.running {
            Some(r) if r.definition.id == definition.id => Some(r.started_ms),
            Some(r) => {
                return Err(ExperimentError::AnotherRunning {
                    running: r.definition.id.clone(),
                    new: definition.id,
                })
            }
            None => None,
        };
        let (events, joined_pods, significant) = match &self.running {
            Some(r) if started_ms.is_some() => (
                r.events.clone(),
                r.joined_pods.clone(),
                r.significant.clone(),
            ),
            _ => (Vec::new(), Vec::new(), Vec::new()),
        };
        let first_step = definition.release.as_ref().and_then(|r| r.steps.first());
        let release = first_step.map(|_| ReleaseState {
            step: 0,
            step_started_ms: now_ms,
            rolled_back: None,
        });
        let definition = match first_step {
            Some(w) => definition.with_first_weight(*w),
            None => definition,
        };
        let mut running = RunningExperiment {
            definition,
            started_ms: started_ms.unwrap_or(now_ms),
            release,
            events,
            joined_pods,
            significant,
        };
        let weights: Vec<f64> = running.definition.arms.iter().map(|a| a.weight).collect();
        let what = if started_ms.is_some() {
            "re-weighted"
        } else {
            "started"
        };
        running.note(now_ms, format!("{what}: weights {weights:?}"));
        self.running = Some(running.clone());
        Ok((running, started_ms.is_none()))
    }

    /// Ends the experiment `id`.
    pub fn end(&mut self, id: &str) -> Result<RunningExperiment, ExperimentError> {
        match self.running.take() {
            Some(r) if r.definition.id == id => Ok(r),
            other => {
                self.running = other;
                Err(ExperimentError::NotRunning(id.to_string()))
            }
        }
    }

    /// Moves the running release to `step` (its first arm's weight with it).
    pub fn advance_release(&mut self, step: usize, now_ms: u64) -> Option<f64> {
        let running = self.running.as_mut()?;
        let release = running.definition.release.clone()?;
        let weight = *release.steps.get(step)?;
        let state = running.release.as_mut()?;
        state.step = step;
        state.step_started_ms = now_ms;
        running.definition = running.definition.with_first_weight(weight);
        running.note(
            now_ms,
            format!("release step {step}: first arm at {weight}"),
        );
        Some(weight)
    }

    /// Notes, once each, the comparisons that became significant: (`key`, event) pairs.
    pub fn note_significant(&mut self, found: Vec<(String, String)>, now_ms: u64) {
        let Some(running) = self.running.as_mut() else {
            return;
        };
        for (key, event) in found {
            if !running.significant.contains(&key) {
                running.significant.push(key);
                running.note(now_ms, event);
            }
        }
    }

    /// Rolls the running release back: its first arm's weight goes to 0.
    pub fn roll_back_release(&mut self, rollback: Rollback) -> Option<String> {
        let running = self.running.as_mut()?;
        let state = running.release.as_mut()?;
        let arm = running.definition.arms.first()?.name.clone();
        let event = format!(
            "rolled back ({}): {}",
            rollback.reason.as_str(),
            rollback.detail
        );
        let at = rollback.at_ms;
        state.rolled_back = Some(rollback);
        running.definition = running.definition.with_first_weight(0.0);
        running.note(at, event);
        Some(arm)
    }

    /// Notes that pod `id` (re)joined, for the report's new pods: only once the fleet settled.
    fn note_joined(&mut self, id: &str) {
        if !self.settled {
            return;
        }
        if let Some(r) = self.running.as_mut() {
            if !r.joined_pods.iter().any(|p| p == id) && r.joined_pods.len() < MAX_JOINED_PODS {
                r.joined_pods.push(id.to_string());
            }
        }
    }

    /// The gateway's first health round is done: later joins are new pods.
    pub fn settle(&mut self) {
        self.settled = true;
    }

    /// Whether the gateway's first health round is done.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Puts back an experiment from a snapshot or the configuration, as it was.
    pub fn restore(&mut self, running: Option<RunningExperiment>) {
        self.running = running;
    }
}

/// The fleet's inputs to its experiment part (what the gateway's shell and the API call).
impl Fleet {
    /// Brings every pod's LoRA model to the arms' residency rules.
    pub(super) fn apply_arm_rules(&mut self) {
        let ArmRules { rules, generation } = self.experiments.arm_rules(&self.registry);
        for pod in self.pods.values_mut() {
            pod.lora.set_rules(*generation, rules);
        }
    }

    /// The running experiment.
    pub fn experiment(&self) -> Option<&RunningExperiment> {
        self.experiments.running()
    }

    /// [`Experiments::start`]; the next table carries it.
    pub fn start_experiment(
        &mut self,
        definition: Experiment,
        now_ms: u64,
    ) -> Result<(RunningExperiment, bool), ExperimentError> {
        self.experiments.start(definition, now_ms)
    }

    /// Ends the experiment `id`; the next table carries none.
    pub fn end_experiment(&mut self, id: &str) -> Result<RunningExperiment, ExperimentError> {
        self.experiments.end(id)
    }

    /// [`Experiments::advance_release`].
    pub fn advance_release(&mut self, step: usize, now_ms: u64) -> Option<f64> {
        self.experiments.advance_release(step, now_ms)
    }

    /// [`Experiments::note_significant`].
    pub fn note_significant(&mut self, found: Vec<(String, String)>, now_ms: u64) {
        self.experiments.note_significant(found, now_ms)
    }

    /// [`Experiments::roll_back_release`].
    pub fn roll_back_release(&mut self, rollback: Rollback) -> Option<String> {
        self.experiments.roll_back_release(rollback)
    }

    /// Notes that pod `id` (re)joined ([`Experiments`]' joined pods).
    pub(super) fn note_joined(&mut self, id: &str) {
        self.experiments.note_joined(id);
    }

    /// [`Experiments::settle`].
    pub fn settle(&mut self) {
        self.experiments.settle();
    }

    /// [`Experiments::restore`].
    pub fn restore_experiment(&mut self, running: Option<RunningExperiment>) {
        self.experiments.restore(running);
    }
}
