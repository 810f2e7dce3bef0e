//! The gateway's policies: pure state machines, events and `now` in, decisions out.
//!
//! Nothing here does I/O, spawns tasks or reads a clock: time is passed in as milliseconds
//! (`now_ms`, any monotone origin — the service uses the Unix epoch, the offline evaluator
//! virtual time). The async shell executes the decisions against pods and feeds back what it
//! observed, so the same code runs live and over a trace.
//!
//! - [`hotness`]: the prompt pool (static templates and dynamic prefixes, feedback, decay,
//!   roulette sampling, top-K, bounded memory).
//! - [`kv`]: the modelled prefix (KV) cache of one pod and its keep-warm re-prefills.
//! - [`lora`]: LoRA adapter residency on one pod (LRU-2, tiers, pins) → load/unload/touch.
//! - [`warmup`]: the warm-up plan of a joining pod and its progress state machine.
//! - [`routing`]: the routing table built from pod states, versioned by content.
//! - [`pools`]: which pods serve gold tenants' adapters and which the other tiers'.
//! - [`replicas`]: how many pods each adapter is placed on, from its demand, and which.
//! - [`release`]: where an experiment's grey release is (its step, its rollback).
//! - [`rollout`]: what follows an adapter rollout and its error watch's verdict (watch it, or
//!   which version to roll back to, on which pods, and why).
//! - [`fleet`]: the fleet core above them all: one owner of every fleet decision (which pod
//!   warms what, when, the table), shared by the gateway's shell and the evaluator.
//!
//! Every config struct has serde defaults, refuses unknown fields and has a `validate(prefix)`
//! returning every problem as `field: value: rule` (the prefix names the TOML section, e.g.
//! `"hotness."`).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod fleet;
pub mod hotness;
mod interner;
pub mod kv;
pub mod lora;
pub mod pools;
mod prefix_key;
pub mod release;
pub mod replicas;
pub mod rollout;
pub mod routing;
mod rules;
pub mod warmup;

pub use hotness::{HotnessConfig, PromptPool};
pub use kv::{KvConfig, KvResidency};
pub use lora::{LoraConfig, LoraDecision, LoraResidency, Tier};
pub use pools::{gold_pool_size, PoolFleet, TierDemand, TierPools};
pub use prefix_key::{HotPrefix, PrefixKey};
pub use replicas::{replica_sets, AdapterDemand, SlotCandidate};
pub use routing::{PodRoute, RoutingConfig, RoutingTableBuilder};
pub use warmup::{
    candidates_for, plan_warmup, plan_warmup_scoped, PlanScope, Sampling, ScopedCandidates,
    SemanticGroups, WarmupAction, WarmupConfig, WarmupPlan, WarmupProgress,
};
