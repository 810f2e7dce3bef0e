//! Snapshots of the service: [`Gateway::restore`] at start, [`Gateway::write_snapshot`]
//! periodically, on demand (`POST /admin/snapshot`) and at shutdown.
//!
//! A corrupt or truncated current generation falls back to the previous one (a log line and
//! `prewarm_snapshot_fallbacks_total{reason="previous_generation"}`); the unusable file is set
//! aside, never overwritten. When files exist and none is usable, starting empty is the
//! operator's explicit choice (`state.on_unusable_snapshot = "start_empty"`: the files are set
//! aside, `reason="none_usable"`); otherwise the gateway refuses (`reason="refused"`): it stays
//! unready with `/readyz` naming the files and the key, writes no snapshot and touches no file,
//! so a repair or a manual restore is never raced by a write.

use serde::Serialize;

use super::Gateway;
use crate::config::OnUnusableSnapshot;
use crate::policy::fleet::RunningExperiment;
use crate::state::snapshot_file::{self, Generation};
use crate::state::{Snapshot, SnapshotToWrite};
use crate::telemetry::Telemetry;

/// What a restore found.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub generation: Generation,
    pub prompts: usize,
    pub adapters: usize,
    pub problems: Vec<String>,
}

/// What a write did.
#[derive(Debug, Clone, Serialize)]
pub struct Written {
    pub bytes: u64,
    pub prompts: usize,
    pub adapters: usize,
}

impl Gateway {
    /// Loads the newest usable snapshot generation into the state and marks the gateway ready,
    /// or refuses (see the module doc).
    pub fn restore(&self) -> Restored {
        let loaded = snapshot_file::load::<Snapshot>(&self.config.state.dir);
        for problem in &loaded.problems {
            tracing::warn!(%problem, "snapshot generation unusable");
        }
        let none_usable = loaded.generation == Generation::None && !loaded.unusable.is_empty();
        if none_usable && self.config.state.on_unusable_snapshot == OnUnusableSnapshot::Refuse {
            return self.refuse_restore(loaded.problems);
        }
        match loaded.generation {
            Generation::Previous => {
                tracing::warn!(
                    "snapshot: the current generation is unusable, using the previous one"
                );
                Telemetry::count(
                    &self.telemetry.snapshot_fallbacks,
                    &[("reason", "previous_generation")],
                );
            }
            Generation::None if none_usable => {
                tracing::error!(
                    "snapshot: no usable generation, starting empty (state.on_unusable_snapshot = \"start_empty\")"
                );
                Telemetry::count(
                    &self.telemetry.snapshot_fallbacks,
                    &[("reason", "none_usable")],
                );
            }
            _ => {}
        }
        let mut problems = loaded.problems;
        for path in &loaded.unusable {
            match snapshot_file::set_aside(path) {
                Ok(aside) => {
                    tracing::warn!(file = %aside.display(), "snapshot: unusable generation set aside")
                }
                Err(e) => problems.push(format!("{}: not set aside: {e}", path.display())),
            }
        }
        let mut restored = Restored {
            generation: loaded.generation,
            prompts: 0,
            adapters: 0,
            problems,
        };
        let mut experiment = None;
        if let Some(snapshot) = loaded.value {
            let mut state = self.state();
            let fleet = &mut state.fleet;
            let refused = fleet.pool_mut().restore(snapshot.prompts, self.now());
            restored
                .problems
                .extend(refused.iter().map(|e| format!("prompt refused: {e}")));
            restored.prompts = fleet.pool().len();
            restored.adapters = snapshot.registry.len();
            *fleet.registry_mut() = snapshot.registry;
            fleet.resume_generations(snapshot.table_generation);
            experiment = snapshot.experiment;
            *self.outcomes.lock().unwrap_or_else(|p| p.into_inner()) =
                snapshot.outcomes.bounded(self.now());
            *self.warm_embeddings() = snapshot
                .warm_embeddings
                .restored(&self.config.warm_embeddings);
        }
        self.restore_experiment(experiment);
        tracing::info!(generation = ?restored.generation, prompts = restored.prompts, adapters = restored.adapters, "snapshot loaded");
        self.republish_table();
        self.set_ready();
        restored
    }

    /// Stays unready with the reason `/readyz` gives (no usable generation; the operator chose
    /// nothing): no file is touched.
    fn refuse_restore(&self, problems: Vec<String>) -> Restored {
        let reason = format!(
            "snapshot: no usable generation in {} ({}); restore a generation, or set state.on_unusable_snapshot = \"start_empty\" to start without it",
            self.config.state.dir.display(),
            problems.join("; ")
        );
        tracing::error!("{reason}");
        Telemetry::count(&self.telemetry.snapshot_fallbacks, &[("reason", "refused")]);
        let _ = self.restore_refused.set(reason);
        Restored {
            generation: Generation::None,
            prompts: 0,
            adapters: 0,
            problems,
        }
    }

    /// The state to write: the lock is held for reference counts of the pool's entries and a
    /// copy of the (small) adapter registry; serialising happens after it is released.
    fn snapshot_to_write(&self) -> SnapshotToWrite {
        let state = self.state();
        SnapshotToWrite {
            written_at_ms: self.now(),
            prompts: state.fleet.pool().export_shared(),
            registry: state.fleet.registry().clone(),
            table_generation: state.fleet.table().generation,
            experiment: state.fleet.experiment().cloned(),
            outcomes: self
                .outcomes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            warm_embeddings: self.warm_embeddings().clone(),
        }
    }

    /// Writes a snapshot now (blocking file I/O: call from `spawn_blocking` on the runtime).
    /// Writes are serialised ([`snapshot_file::write_with`]): concurrent callers each write in
    /// turn, every one a complete generation.
    pub fn write_snapshot(&self) -> std::io::Result<Written> {
        if let Some(reason) = self.restore_refused() {
            Telemetry::count(&self.telemetry.snapshots_written, &[("outcome", "refused")]);
            return Err(std::io::Error::other(reason.to_string()));
        }
        let (mut prompts, mut adapters) = (0, 0);
        let outcome = snapshot_file::write_with(&self.config.state.dir, || {
            let snapshot = self.snapshot_to_write();
            prompts = snapshot.prompts.len();
            adapters = snapshot.registry.len();
            snapshot
        });
        match outcome {
            Ok(bytes) => {
                Telemetry::count(&self.telemetry.snapshots_written, &[("outcome", "ok")]);
                tracing::info!(bytes, prompts, adapters, "snapshot written");
                Ok(Written {
                    bytes,
                    prompts,
                    adapters,
                })
            }
            Err(e) => {
                Telemetry::count(&self.telemetry.snapshots_written, &[("outcome", "error")]);
                tracing::error!(error = %e, dir = %self.config.state.dir.display(), "snapshot write failed");
                Err(e)
            }
        }
    }
}

impl Gateway {
    /// Puts back the experiment: the snapshot's, as it was (its weights, release and events),
    /// unless the configuration declares another id, which then starts afresh.
    fn restore_experiment(&self, from_snapshot: Option<RunningExperiment>) {
        let mut state = self.state();
        let fleet = &mut state.fleet;
        match &self.config.experiment {
            Some(declared)
                if from_snapshot.as_ref().map(|r| &r.definition.id) != Some(&declared.id) =>
            {
                fleet.restore_experiment(None);
                // validated with the configuration: it starts
                if let Err(e) = fleet.start_experiment(declared.clone(), self.now()) {
                    tracing::error!(error = %e, "the declared experiment did not start");
                }
            }
            _ => fleet.restore_experiment(from_snapshot),
        }
        drop(state);
        self.export_experiment();
    }
}
