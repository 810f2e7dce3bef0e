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
pub use metrics_text::{MetricsScrape, PodLoad};
pub use models::ServedModels;

/// The extra text a prefill appends (core's, so the filter's direct prefills send the same).
pub use prewarm_core::warm_call::{prefill_prompt, PREFILL_SUFFIX};

use prewarm_core::request::Endpoint;
use prewarm_core::warm_call::{prefill_call, WarmCall};

use crate::policy::hotness::SharedShape;

/// A prefill: fill the pod's prefix cache with a prefix for `model`, in its traffic's shape.
/// `Debug` shows the shape's summary, never its salt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillRequest {
    /// The base model, or an adapter name when the prefix belongs to an adapter.
    pub model: String,
    /// The endpoint the prefix's traffic used.
    pub endpoint: Endpoint,
    /// The prefix's canonical text (shared with the prompt pool).
    pub prefix_text: Arc<str>,
    /// How the traffic reached the engine (shared with the prompt pool).
    pub shape: Option<SharedShape>,
}

/// The form a prefill is sent in (`prewarm_prefill_shapes_total{shape}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillForm {
    /// A chat prefix through the chat endpoint, with its messages, tools, kwargs and salt.
    Chat,
    /// A completion prefix as a completion (with its salt).
    Completion,
    /// A chat prefix known without a shape (an entry from an older snapshot or filter), sent
    /// as a completion of its canonical text: it caches nothing the chat traffic looks up.
    Unshaped,
}

impl PrefillForm {
    pub fn label(self) -> &'static str {
        match self {
            PrefillForm::Chat => "chat",
            PrefillForm::Completion => "completion",
            PrefillForm::Unshaped => "unshaped",
        }
    }

    /// The form of `call`.
    pub fn of(call: &WarmCall) -> Self {
        if !call.shaped {
            PrefillForm::Unshaped
        } else if call.path == Endpoint::ChatCompletions.path() {
            PrefillForm::Chat
        } else {
            PrefillForm::Completion
        }
    }
}

impl PrefillRequest {
    /// A plain completion of `prefix_text` (an adapter touch, a prefix of unknown traffic).
    pub fn completion(model: &str, prefix_text: &str) -> Self {
        Self {
            model: model.to_string(),
            endpoint: Endpoint::Completions,
            prefix_text: Arc::from(prefix_text),
            shape: None,
        }
    }

    /// The request to send, with `model` as the engine names it (core's [`prefill_call`]:
    /// the one builder of a prefill, the filter's direct calls included).
    pub fn call(&self, model: &str) -> WarmCall {
        prefill_call(
            self.endpoint,
            model,
            &self.prefix_text,
            self.shape.as_ref().map(SharedShape::get),
        )
    }

    /// The form it is sent in (what [`PrefillRequest::call`] builds, without building it:
    /// the pool keeps only shapes that lie on their text, so a chat shape always yields its
    /// messages).
    pub fn form(&self) -> PrefillForm {
        match (self.endpoint, &self.shape) {
            (Endpoint::ChatCompletions, Some(s)) if s.is_chat() => PrefillForm::Chat,
            (Endpoint::ChatCompletions, _) => PrefillForm::Unshaped,
            _ => PrefillForm::Completion,
        }
    }

    /// `text` with the request's salt, if any, masked (an engine's error may echo the
    /// request; a salt never reaches a log or the admin API).
    pub fn redact(&self, text: &str) -> String {
        match self.shape.as_ref().and_then(|s| s.cache_salt.as_deref()) {
            Some(salt) if !salt.is_empty() => text.replace(salt, "<cache_salt>"),
            _ => text.to_string(),
        }
    }
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
    /// A `max_tokens: 1` request of the prefix in its traffic's shape
    /// ([`PrefillRequest::call`]): a chat prefix through the chat endpoint, else a completion
    /// of the prefix plus [`PREFILL_SUFFIX`]. A rejection's message never carries the salt.
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
    /// `GET /metrics` with the pod's process start time where it exports one (what the health
    /// loop reads). By default [`load`](Self::load) without one.
    fn scrape(&self) -> BoxFuture<'_, Result<MetricsScrape, EngineError>> {
        Box::pin(async move { self.load().await.map(MetricsScrape::from) })
    }
}

/// The client for a pod of `kind`.
pub fn engine_for(kind: EngineKind, pod: HttpPod, base_model: &str) -> Arc<dyn Engine> {
    match kind {
        EngineKind::Vllm => Arc::new(vllm::VllmEngine::new(pod)),
        EngineKind::Sglang => Arc::new(sglang::SglangEngine::new(pod, base_model)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::warm_shape::{MessageSpan, WarmShape};

    fn request(endpoint: Endpoint, shape: Option<WarmShape>) -> PrefillRequest {
        PrefillRequest {
            model: "m".into(),
            endpoint,
            prefix_text: Arc::from("<|system|>\nBe brief and exact, always."),
            shape: shape.map(SharedShape::new),
        }
    }

    #[test]
    fn the_counted_form_is_the_form_of_the_call_sent() {
        let chat = WarmShape {
            messages: vec![MessageSpan {
                role: "system".into(),
                len: 27,
                parts: false,
            }],
            ..WarmShape::default()
        };
        let salted = WarmShape {
            cache_salt: Some("s".into()),
            ..WarmShape::default()
        };
        for (r, form) in [
            (
                request(Endpoint::ChatCompletions, Some(chat.clone())),
                "chat",
            ),
            (request(Endpoint::ChatCompletions, None), "unshaped"),
            (
                request(Endpoint::ChatCompletions, Some(salted.clone())),
                "unshaped",
            ),
            (request(Endpoint::Completions, Some(salted)), "completion"),
            (request(Endpoint::Completions, Some(chat)), "completion"),
            (request(Endpoint::Completions, None), "completion"),
        ] {
            assert_eq!(r.form().label(), form);
            assert_eq!(PrefillForm::of(&r.call("m")), r.form(), "{r:?}");
        }
        let touch = PrefillRequest::completion("sql", "");
        assert_eq!(
            touch.call("sql").body,
            serde_json::from_slice::<serde_json::Value>(&prewarm_core::warm_call::touch_body(
                "sql"
            ))
            .unwrap(),
            "a touch is the completion it always was"
        );
    }
}
