//! What survives a restart: the prompt pool (dynamic prefixes and operator templates), the adapter
//! registry (with pins), the running experiment and its outcome ledger, the embedding inputs kept
//! warm for the filters' caches, and the routing table's
//! last generation (so filters never see it go backwards). Written atomically with the previous generation kept ([`snapshot_file`]).

pub mod snapshot_file;

use serde::{Deserialize, Serialize};

use crate::attribution::ledger::OutcomeLedger;
use crate::policy::fleet::RunningExperiment;
use crate::policy::hotness::{PromptRecord, SharedRecord};
use crate::registry::AdapterRegistry;
use crate::warm_embeddings::store::WarmStore;

/// One snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub written_at_ms: u64,
    /// Hottest first; templates included (origin `static`).
    pub prompts: Vec<PromptRecord>,
    pub registry: AdapterRegistry,
    #[serde(default)]
    pub table_generation: u64,
    /// The experiment running when it was written.
    #[serde(default)]
    pub experiment: Option<RunningExperiment>,
    /// The filters' outcome records, summed (experiments' evidence).
    #[serde(default)]
    pub outcomes: OutcomeLedger,
    /// The embedding inputs kept warm for the filters' caches.
    #[serde(default)]
    pub warm_embeddings: WarmStore,
}

/// A snapshot as it is written: the same JSON as [`Snapshot`], its prompts sharing their texts
/// with the pool (taken under the state lock without copying texts, serialised after it).
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotToWrite {
    pub written_at_ms: u64,
    pub prompts: Vec<SharedRecord>,
    pub registry: AdapterRegistry,
    pub table_generation: u64,
    pub experiment: Option<RunningExperiment>,
    pub outcomes: OutcomeLedger,
    pub warm_embeddings: WarmStore,
}
