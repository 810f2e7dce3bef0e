//! prewarm-core: the pure logic both sides of prewarm share, and the wire contract between them.
//!
//! The filter (proxy-wasm, on the request path) and the gateway (off the request path) link this
//! crate so they agree by construction: the same request parsing ([`request`]), the same canonical
//! prompt ([`canonical`]), the same block fingerprints ([`fingerprint`]), the same placement
//! function ([`placement`]). A fingerprint the filter routes to pod P is the fingerprint the
//! gateway warmed on pod P.
//!
//! No I/O, no proxy-wasm, no tokio; everything compiles for `wasm32-wasip1`,
//! `wasm32-unknown-unknown` and the host. Nothing here panics on any input: the panic paths are
//! denied by clippy lints, and the parsers are property-tested on arbitrary bytes.

pub mod address;
pub mod canonical;
pub mod embed_cache;
pub mod experiment;
pub mod fingerprint;
pub mod identity;
pub mod kv_events;
pub mod placement;
pub mod prefix;
pub mod published_load;
pub mod rate;
pub mod request;
pub mod residency;
pub mod route;
pub mod similarity;
pub mod table_delta;
pub mod tokens;
pub mod trigger;
pub mod warm_call;
pub mod warm_shape;
pub mod wire;

pub use canonical::canonical_prompt;
pub use fingerprint::{BlockChain, BlockHash, FingerprintConfig, Shard};
pub use placement::{place, place_bounded, rank, PlacementCandidate};
pub use request::{parse_request, Endpoint, InferenceRequest, ParseError};
pub use similarity::Sketch;
