//! prewarm-gateway: the service that turns the filter's signals into warm caches on the pods
//! and serves the routing table. Its modules are in layers (`docs/architecture.md`, kept by
//! `tests/layers.rs`): [`tier`] and [`error_rate`] → [`registry`] and [`policy`] →
//! [`attribution`] → [`config`] → the shell → [`api`] and [`dashboard`] → [`server`].
//!
//! - [`policy`]: the pure state machines (hotness, KV and LoRA residency, warm-up planning,
//!   routing table) and the fleet core that drives them — events and `now` in, actions out;
//! - [`config`]: TOML configuration and its validation;
//! - [`engine`]: pod clients (vLLM, SGLang) behind one trait;
//! - [`registry`]: adapters, their metadata and SHA-256 manifests, rollout watches;
//! - [`attribution`]: outcome ledgers, experiment reports and the release check;
//! - [`service`]: the running gateway, a shell around the fleet core (pods' I/O, executing
//!   actions, table, signals, snapshots, background loops);
//! - [`embeddings`]: local prompt embeddings (all-MiniLM-L6-v2 on candle) and the IVF-PQ prompt
//!   index, off without `embeddings.model_dir`;
//! - [`api`]: the HTTP API; [`telemetry`]: Prometheus metrics; [`traces`]: OpenTelemetry spans
//!   of warm-up; [`state`]: snapshot files;
//! - [`server`]: the `serve` lifecycle (bind, spawn, drain, final snapshot).

pub mod api;
pub mod attribution;
pub mod config;
pub mod dashboard;
pub mod embeddings;
pub mod engine;
pub mod error_rate;
pub mod policy;
pub mod registry;
pub mod server;
pub mod service;
pub mod state;
pub mod telemetry;
pub mod tier;
pub mod traces;
pub mod warm_embeddings;
