//! The embedding cache: `/v1/embeddings` answers of opted-in models kept at the proxy, so a
//! repeated input never reaches a pod. Core's `embed_cache` decides how an input is keyed and
//! what an entry is; this part owns where entries live and when a request is answered from them.
//!
//! - [`config`]: the `embedding_cache` section of the configuration (off without `models`).
//! - [`cache`]: one VM's cache, an LRU bounded by bytes.
//! - [`shared_level`]: the proxy's shared level, a fixed ring of shared-data slots every worker
//!   reads on a local miss (named for its role: `shared` is the crate's shared-data layout).
//! - [`flow`]: the cache on a request's path: answer a full hit, else watch the pod's response
//!   and store it.
//! - [`reports`], [`warm`]: with `warm_from_gateway`, what this VM tells the gateway of its cache,
//!   and the warm entries the gateway sends back into the shared level.
//!
//! Invariants: a request is answered from the cache only when every one of its inputs is there
//! and fresh (the one case the filter ends a request itself); otherwise the request and its
//! response go on unchanged: the response is watched as it streams, never held, and stored only
//! after its last chunk reached the client. Anything the rule cannot key, a non-200, an encoded,
//! oversized or unparsable response is left alone and counted. Every level is bounded (bytes
//! per VM, a fixed ring of slots per proxy, since shared data has no delete, TTL or listing),
//! and every entry carries its expiry.

pub mod cache;
pub mod config;
pub mod flow;
pub mod reports;
pub mod shared_level;
pub mod warm;
