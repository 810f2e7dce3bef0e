//! prewarm-gateway: the service that turns the filter's signals into warm caches on the pods
//! and serves the routing table.
//!
//! - [`policy`]: the pure state machines (hotness, KV and LoRA residency, warm-up planning,
//!   routing table) — events and `now` in, decisions out;
//! - [`config`]: TOML configuration and its validation;
//! - [`engine`]: pod clients (vLLM, SGLang) behind one trait;
//! - [`registry`]: adapters, their metadata and SHA-256 manifests;
//! - [`service`]: the running gateway (pool, table, signals, snapshots, background loops);
//! - [`warmup`]: executing warm-up plans against pods;
//! - [`api`]: the HTTP API; [`telemetry`]: Prometheus metrics; [`state`]: snapshot files;
//! - [`server`]: the `serve` lifecycle (bind, spawn, drain, final snapshot).

pub mod api;
pub mod config;
pub mod dashboard;
pub mod engine;
pub mod policy;
pub mod registry;
pub mod server;
pub mod service;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod warmup;
