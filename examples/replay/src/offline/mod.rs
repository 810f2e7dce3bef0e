//! Offline evaluation: the trace in virtual time over podsim pod models, one run per policy.
//!
//! - [`fleet`]: the pods and their lifecycle (joins, restarts);
//! - [`policy`]: the interface a policy implements, and the request context it sees;
//! - [`baselines`]: `round_robin` and `first_shard_affinity`;
//! - [`sglang_cache_aware`]: SGLang's router's cache-aware policy (approximate radix trees);
//! - [`dynamo_kv`]: Dynamo's KV router (exact cached blocks against load);
//! - [`prewarm`]: the gateway's policies (hotness, KV and LoRA residency, warm-up, routing
//!   table) and the filter's triggers, driven in virtual time;
//! - [`oracle`]: Belady bounds and the per-request envelope that makes the oracle never lose;
//! - [`run`]: the event loop that replays a trace through one policy, and the whole evaluation.

pub mod baselines;
pub mod dynamo_kv;
pub mod fleet;
pub mod oracle;
pub mod policy;
pub mod prewarm;
pub mod run;
pub mod sglang_cache_aware;
