//! Warm-up of the filters' embedding cache (docs/embedding-warmup.md). A filter caches each
//! `/v1/embeddings` input it forwarded (per proxy: its VMs and the proxy's shared level); an
//! entry lives `ttl_ms`, and an Envoy restart empties it. The gateway keeps the inputs that are
//! hot warm ahead of the traffic:
//!
//! 1. the filters report every input they stored from a pod's response (with the request that
//!    recomputes it) and how often they answered each from the cache
//!    (`SignalBatch::embeddings`, [`store::WarmStore::seen`]);
//! 2. an input hit at least `min_hits` times over the last TTL is *hot*; the gateway computes
//!    it on a pod serving its model — once it is hot, then again `lead_ms` before each
//!    computation expires, at most `calls_per_second`, hottest first
//!    ([`store::WarmStore::due`], `service::warm_embeddings`);
//! 3. every filter polls `GET /v1/embeddings/warm?after=<generation>` and writes the entries
//!    computed since into its proxy's shared level, with their expiry — so a hot input is
//!    answered across a TTL boundary, and by a proxy that just restarted before its first
//!    request for it;
//! 4. the store is in the gateway's snapshot, so a gateway restart keeps it (and the
//!    filters' own caches do not depend on the gateway at all).
//!
//! What it assumes: the gateway's `ttl_ms` is the filters' `embedding_cache.ttl_ms` (an entry
//! computed here expires in the filters when the gateway thinks it does); an input hit once
//! within a TTL is likely to be asked again within the next (a repeat, the RAG re-index and
//! repeated-query traffic the cache is for); a computation costs one forward pass of one input
//! on an embedding pod, so the default budget of 20 a second is a small share of one pod
//! (MiniLM-class encoders take milliseconds an input).

pub mod store;

pub use crate::config::WarmEmbeddingsConfig;
