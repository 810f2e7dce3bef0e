//! prewarm-filter: the proxy-wasm filter that watches OpenAI-style traffic in Envoy, sends
//! prewarm signals to the gateway and routes requests with the gateway's routing table; when the
//! gateway is down (or in standalone mode, without one) it sends the prefills and adapter touches
//! to the pods itself (`direct`).
//!
//! Glue only: every decision (parsing, canonical prompt, fingerprints, similarity, triggers,
//! rates, placement, wire format) is `prewarm-core`'s. The modules map host hooks to core
//! calls through the [`host::Host`] trait; `host::wasm` implements it with
//! `proxy_wasm::hostcalls` and `host::entry` registers the contexts (both only in the wasm
//! build), while native tests drive the same code through a double.
//!
//! The parts, by concern (each folder's module doc says what it owns and the invariants it
//! keeps):
//! - [`host`]: the host boundary (the trait, Envoy's side of it, the in-memory hosts);
//! - [`request`]: one request through the filter, and what it reads of the response;
//! - [`routing`]: the pod for a request (the table, the prefix index, another router's pick);
//! - [`signals`]: observations, per-VM tallies and the queues a tick sends to the gateway;
//! - [`embeddings`]: the embedding cache;
//! - [`direct`]: the calls the filter sends to the pods itself;
//! - [`experiments`]: a request's experiment arm and its outcome record;
//! - [`config`], [`worker`], [`root`], [`shared`]: the configuration, what one VM holds, the
//!   root context's tick, and the shared-data key layout every part writes through.
//!
//! Scenario tests (whole requests and ticks against `host::fake`) are in `filter/tests/scenarios`.

pub mod config;
pub mod direct;
pub mod embeddings;
pub mod experiments;
pub mod host;
pub mod request;
pub mod root;
pub mod routing;
pub mod shared;
pub mod signals;
pub mod worker;
