//! Pod clients: one [`Engine`] trait over the HTTP dialects of inference servers, with vLLM
//! ([`vllm`], the default) and SGLang ([`sglang`]) implementations on a shared transport
//! ([`http::HttpPod`]: timeouts, retries with backoff and jitter, a per-pod concurrency limit).
//!
//! Replies are decoded by pure functions ([`reply`], [`metrics_text`], [`models`]) that accept
//! every shape ENGINE-FACTS lists: plain-text and JSON successes, nested and flat errors.

pub mod common;
pub mod http;
pub mod metrics_text;
pub mod models;
pub mod reply;
pub mod sglang;
pub mod vllm;

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;

use crate::config::EngineKind;
pub use http::{HttpPod, RetryPolicy};
pub use metrics_text::PodLoad;
pub use models::ServedModels;

/// The extra text a prefill appends (core's, so the filter's direct prefills send the same).
pub use prewarm_core::warm_call::{prefill_prompt, PREFILL_SUFFIX};

/// A prefill: fill the pod's prefix cache with `prefix_text` for `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillRequest {
    /// The base model, or an adapter name when the prefix belongs to an adapter.
    pub model: String,
    pub prefix_text: String,
}

/// Load `name` from `path` on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterLoad {
    pub name: String,
    pub path: String,
}

/// What a successful load or unload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterOutcome {
    /// The pod did it.
    Done,
    /// The pod already had it that way (load of a loaded name, unload of an unknown one).
    AlreadyThere,
}

/// Why a call to a pod failed, classified for retries and for the HTTP status an admin call
/// answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("pod {pod}: {url}: unreachable: {message}")]
    Unreachable {
        pod: String,
        url: String,
        message: String,
    },
    #[error("pod {pod}: {url}: timed out")]
    Timeout { pod: String, url: String },
    #[error("pod {pod}: {url}: HTTP {status}: {kind}: {message}")]
    Rejected {
        pod: String,
        url: String,
        status: u16,
        kind: String,
        message: String,
    },
    #[error("pod {pod}: {url}: unreadable reply: {message}")]
    BadReply {
        pod: String,
        url: String,
        message: String,
    },
}

impl EngineError {
    /// Transport failures and 5xx may succeed on another attempt.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Timeout { .. } => true,
            Self::Rejected { status, .. } => *status >= 500,
            Self::BadReply { .. } => false,
        }
    }

    /// A short label for metrics: `unreachable`, `timeout`, `rejected`, `bad_reply`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unreachable { .. } => "unreachable",
            Self::Timeout { .. } => "timeout",
            Self::Rejected { .. } => "rejected",
            Self::BadReply { .. } => "bad_reply",
        }
    }
}

/// One inference server, whatever its dialect.
pub trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;
    /// `GET /health` answered 200.
    fn health(&self) -> BoxFuture<'_, Result<(), EngineError>>;
    /// A completion with `max_tokens: 1` of the prefix plus [`PREFILL_SUFFIX`].
    fn prefill<'a>(&'a self, request: &'a PrefillRequest)
        -> BoxFuture<'a, Result<(), EngineError>>;
    fn load_adapter<'a>(
        &'a self,
        load: &'a AdapterLoad,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>>;
    fn unload_adapter<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>>;
    /// `POST /v1/embeddings` of `request`: the pod's 200 reply body.
    fn embeddings<'a>(
        &'a self,
        request: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Vec<u8>, EngineError>>;
    /// `GET /v1/models`: the base model and the registered adapters.
    fn models(&self) -> BoxFuture<'_, Result<ServedModels, EngineError>>;
    /// `GET /metrics`: queue, running, KV usage, cache config, LoRA activity.
    fn load(&self) -> BoxFuture<'_, Result<PodLoad, EngineError>>;
}

/// The client for a pod of `kind`.
pub fn engine_for(kind: EngineKind, pod: HttpPod, base_model: &str) -> Arc<dyn Engine> {
    match kind {
        EngineKind::Vllm => Arc::new(vllm::VllmEngine::new(pod)),
        EngineKind::Sglang => Arc::new(sglang::SglangEngine::new(pod, base_model)),
    }
}
