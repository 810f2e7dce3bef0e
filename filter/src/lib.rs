//! prewarm-filter: the proxy-wasm filter that watches OpenAI-style traffic in Envoy, sends
//! prewarm signals to the gateway and routes requests with the gateway's routing table; when the
//! gateway is down (or in standalone mode, without one) it sends the prefills and adapter touches
//! to the pods itself (`direct`).
//!
//! Glue only: every decision (parsing, canonical prompt, fingerprints, similarity, triggers,
//! rates, placement, wire format) is `prewarm-core`'s. The modules map host hooks to core
//! calls through the [`host::Host`] trait; `host::wasm` implements it with
//! `proxy_wasm::hostcalls` and `host::entry` registers the contexts (both only in the wasm build),
//! while native tests drive the same code through a double.

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
