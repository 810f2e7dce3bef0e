//! prewarm-replay: trace replay and the offline evaluator.
//!
//! - [`trace`]: Mooncake-format JSONL traces; [`render`]: block ids → deterministic text and
//!   memoised fingerprint chains; [`assign`]: adapters, tenants and tiers (ServeGen or Zipf);
//! - [`scenario`]: the fleet and its events; [`system_prompt`]: the shared system prompt
//!   scenario; [`outcome`]: per-request outcomes and the metrics;
//!   [`report`]: the table and the JSON document;
//! - [`record`]: a live run's per-request records (JSON lines); [`comparison`]: `report`, live
//!   runs' figures side by side from their records (what `make demo` prints);
//! - [`offline`]: virtual time over podsim pod models — `round_robin`, `first_shard_affinity`,
//!   the field's routers (`sglang_cache_aware`, `dynamo_kv`), `prewarm` (the gateway's own
//!   policies) and `oracle`;
//! - [`live`]: the trace over HTTP against real servers (Envoy or pods), streaming;
//! - [`embeddings`]: the embeddings workload (ShareGPT prompts, Zipf repeats) over HTTP;
//! - [`workload`]: the application workload (applications with system prompts, tools and
//!   adapters, ServeGen popularity, conversations of ShareGPT/MT-Bench lengths) as a trace;
//! - [`plot`]: PNG charts of the time series;
//! - [`cli`]: the `prewarm-replay` command line.

pub mod assign;
pub mod cli;
pub mod comparison;
pub mod embeddings;
pub mod live;
pub mod offline;
pub mod outcome;
pub mod plot;
pub mod record;
pub mod render;
pub mod report;
pub mod scenario;
pub mod servegen;
pub mod system_prompt;
pub mod trace;
pub mod workload;
