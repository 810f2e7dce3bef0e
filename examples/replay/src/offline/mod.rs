//! Offline evaluation: the trace in virtual time over podsim pod models, one run per policy.
//!
//! - [`fleet`]: the pods and their lifecycle (joins, restarts);
//! - [`policy`]: the interface a policy implements, and the request context it sees;
//! - [`baselines`]: `round_robin` and `affinity`;
//! - [`prewarm`]: the gateway's policies (hotness, KV and LoRA residency, warm-up, routing
//!   table) and the filter's triggers, driven in virtual time;
//! - [`oracle`]: Belady bounds and the per-request envelope that makes the oracle never lose;
//! - [`run`]: the event loop that replays a trace through one policy, and the whole evaluation.

pub mod baselines;
pub mod fleet;
pub mod oracle;
pub mod policy;
pub mod prewarm;
pub mod run;
