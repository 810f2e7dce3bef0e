//! The running experiment: its definition (`prewarm_core::experiment`), which the routing table
//! carries to the filters, and when it started. One at a time: arms of two experiments on the
//! same traffic would confound each other's outcomes.

use prewarm_core::experiment::Experiment;
use serde::{Deserialize, Serialize};

use super::Fleet;

/// An experiment and its start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningExperiment {
    pub definition: Experiment,
    /// Gateway clock when it started, ms since the Unix epoch (kept when its weights change).
    pub started_ms: u64,
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

impl Fleet {
    /// The running experiment.
    pub fn experiment(&self) -> Option<&RunningExperiment> {
        self.experiment.as_ref()
    }

    /// Starts `definition` at `now_ms`, or changes the running one's arms when it has the same
    /// id (its start is kept). Returns the running experiment and whether it is new; the next
    /// table carries it.
    pub fn start_experiment(
        &mut self,
        definition: Experiment,
        now_ms: u64,
    ) -> Result<(RunningExperiment, bool), ExperimentError> {
        if let Some(problem) = definition.problem() {
            return Err(ExperimentError::Invalid(problem));
        }
        let started_ms = match &self.experiment {
            Some(r) if r.definition.id == definition.id => Some(r.started_ms),
            Some(r) => {
                return Err(ExperimentError::AnotherRunning {
                    running: r.definition.id.clone(),
                    new: definition.id,
                })
            }
            None => None,
        };
        let running = RunningExperiment {
            definition,
            started_ms: started_ms.unwrap_or(now_ms),
        };
        self.experiment = Some(running.clone());
        Ok((running, started_ms.is_none()))
    }

    /// Ends the experiment `id`; the next table carries none.
    pub fn end_experiment(&mut self, id: &str) -> Result<RunningExperiment, ExperimentError> {
        match self.experiment.take() {
            Some(r) if r.definition.id == id => Ok(r),
            other => {
                self.experiment = other;
                Err(ExperimentError::NotRunning(id.to_string()))
            }
        }
    }

    /// Puts back an experiment from a snapshot or the configuration, as it was.
    pub fn restore_experiment(&mut self, running: Option<RunningExperiment>) {
        self.experiment = running;
    }
}
