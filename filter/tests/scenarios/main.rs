//! The filter's scenario tests: whole requests and root ticks driven through the filter's glue
//! against its host double ([`prewarm_filter::host::fake`]), with nothing but the crate's
//! public API, as Envoy would drive them. One test binary for all of them (one link); the unit
//! tests of each module stay beside its code in `src/`.

// A test crate: its helpers fail loudly on purpose (the crate's lints target the request path).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod credential;
mod direct;
mod embeddings;
mod experiments;
mod external_router;
mod host_calls;
mod outcomes;
mod requests;
mod shared_prompts;
mod table_delta;
