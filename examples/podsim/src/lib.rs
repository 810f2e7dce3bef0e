//! podsim: a vLLM-faithful inference pod simulator.
//!
//! The library is a pure model of one pod ([`Pod`]): a block-hashed prefix cache with vLLM's
//! LRU and reverse-order freeing, LoRA adapters in vLLM's three sets (registered, host cache,
//! GPU slots), a batch of `max_num_seqs` with LoRA-slot waiting, and a latency model. It
//! has no clock and no I/O: `now` is model time in seconds, passed in. The binary wraps it in an
//! OpenAI-compatible HTTP server ([`server`]) that behaves like `vllm serve` (or SGLang).
//!
//! Tokens are prewarm-core's stand-in (4 bytes of prompt a token). A completion's prompt is
//! prewarm's canonical prompt of it, so podsim's `prompt_tokens` and `cached_tokens` agree with
//! the filter's and gateway's fingerprints; a chat request's prompt is what the served model's
//! chat template renders ([`chat`]), as on the engine, so a completion of prewarm's canonical
//! rendering of a conversation does not warm the chat request.
//!
//! ```
//! use podsim::{AdapterSpec, Pod, PodConfig, RequestSpec};
//!
//! let mut pod = Pod::new(PodConfig { enable_lora: true, ..PodConfig::default() }).unwrap();
//! pod.load_adapter(AdapterSpec { name: "sql-lora".into(), path: "/a/sql".into(), rank: 8, pinned: false }, false)
//!     .unwrap();
//! let prompt = "x".repeat(4 * 100); // 100 tokens
//! let spec = RequestSpec { model: "sql-lora".into(), canonical_prompt: prompt.clone(), max_tokens: Some(4) };
//! let first = pod.submit(0.0, &spec).unwrap();
//! assert_eq!((first.prompt_tokens, first.cached_tokens), (100, 0));
//! assert!(first.adapter_activation_seconds > 0.0); // cold GPU slot
//! pod.advance(first.finish_at);
//! let again = pod.submit(first.finish_at, &spec).unwrap();
//! assert_eq!(again.cached_tokens, 96); // 6 full blocks of 16
//! assert_eq!(pod.gpu_adapters(), vec!["sql-lora"]);
//! assert_eq!(pod.cached_prefix_tokens(Some("sql-lora"), &prompt), 96);
//! let m = pod.metrics(again.finish_at);
//! assert_eq!((m.finished_length, m.prefix_hits_tokens), (2, 96));
//! ```

pub mod adapters;
pub mod chat;
pub mod cli;
pub mod config;
pub mod embedding;
pub mod lru;
pub mod pod;
pub mod prefix_cache;
pub mod profile;
pub mod request;
pub mod schedule;
pub mod server;

pub use adapters::AdapterSpec;
pub use chat::ChatTemplate;
pub use config::{Engine, PodConfig, PrefillCompute};
pub use pod::{AdapterError, Admission, FinishedReason, Pod, PodMetrics, RequestError, RequestId};
pub use profile::LatencyProfile;
pub use request::{PrepareError, PreparedRequest, RequestSpec};
