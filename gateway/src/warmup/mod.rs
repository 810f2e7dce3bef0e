//! Executing warm-ups: the policy (`policy::warmup`) plans a joining pod's warm-up and paces
//! it; this module runs it against the pod. [`PodWarmup`] is a pod's warm-up as the service holds
//! it (the policy's progress and the executor task); [`executor`] runs the plan: adapters first,
//! then prefills, as many at once as the progress allows; [`prefill_prefix`] and
//! [`load_adapter`] are its two steps.

pub mod executor;
pub mod load_adapter;
pub mod prefill_prefix;

use tokio::task::AbortHandle;

use crate::policy::warmup::WarmupStatus;
use crate::policy::WarmupProgress;

/// A pod's warm-up: the progress of its current plan (absent before the first) and the task
/// executing it.
#[derive(Default)]
pub struct PodWarmup {
    pub progress: Option<WarmupProgress>,
    /// The progress of the plan before the pod was lost, kept to number the next attempt.
    pub previous: Option<WarmupProgress>,
    pub task: Option<AbortHandle>,
    /// The pod entered the routing table in this epoch: a re-warm triggered later (admin API)
    /// does not take it out again. Cleared when the pod re-joins.
    pub admitted: bool,
}

impl PodWarmup {
    /// A pod may take traffic once its first tier is done or its deadline passed.
    pub fn routable(&self, now_ms: u64) -> bool {
        self.admitted || self.progress.as_ref().is_some_and(|p| p.routable(now_ms))
    }

    /// Before a new plan of the same epoch replaces the current one: remember whether the pod
    /// was already admitted.
    pub fn note_admission(&mut self, now_ms: u64) {
        self.admitted = self.routable(now_ms);
    }

    /// Stops the executor; the progress is marked lost (the pod is down or gone).
    pub fn abort(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(p) = self.progress.as_mut() {
            p.pod_lost();
        }
    }

    /// Makes way for a new plan: the current progress becomes the previous attempt.
    pub fn reset_for_rejoin(&mut self) {
        self.abort();
        self.admitted = false;
        if let Some(p) = self.progress.take() {
            self.previous = Some(p);
        }
    }

    pub fn status(&self, now_ms: u64) -> Option<WarmupStatus> {
        self.progress.as_ref().map(|p| p.status(now_ms))
    }
}
