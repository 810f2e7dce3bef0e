//! The HTTP shell around one [`Pod`]: an OpenAI-compatible server that behaves like
//! `vllm serve` (or SGLang with `--engine sglang`); [`fleet`] serves several from one process.
//!
//! Endpoints:
//! - `POST /v1/completions`, `POST /v1/chat/completions` (JSON or server-sent events)
//! - `POST /v1/embeddings` (vLLM's pooling-model reply over deterministic vectors)
//! - `GET /v1/models`, `GET /health`, `GET /metrics`
//! - vLLM: `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`, only with
//!   `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING` in {1, true}
//! - SGLang: `POST /load_lora_adapter`, `POST /unload_lora_adapter` with `--enable-lora`
//! - anything else: 404 `{"detail": "Not Found"}`
//!
//! Chat requests are rendered with the served model's chat template ([`crate::chat`]) before
//! they reach the model; `cache_salt` is honoured on both inference routes.
//!
//! Requests are admitted by the pure model at the current model time; the shell then only
//! waits (real time = model time / `--time-scale`) and writes what the model decided.

pub mod adapter_dir;
pub mod clock;
pub mod embeddings;
pub mod errors;
pub mod fleet;
pub mod inference;
pub mod kv_events;
pub mod lora;
pub mod metrics;
pub mod models;
pub mod run;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::chat::ChatTemplate;
use crate::config::Engine;
use crate::pod::Pod;
use crate::PodConfig;
use clock::ModelClock;
use errors::{ApiError, ErrorFormat};
use metrics::PodExporter;

/// The server's settings beyond the pod model's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub pod: PodConfig,
    /// Model seconds per real second (default 1); waits are divided by it.
    pub time_scale: f64,
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING` is 1 or true.
    pub allow_runtime_lora_updating: bool,
    pub error_format: ErrorFormat,
    /// `--enable-prompt-tokens-details`: report `usage.prompt_tokens_details.cached_tokens`.
    pub enable_prompt_tokens_details: bool,
    /// Largest request body in bytes (default 8 MiB).
    pub max_body_bytes: usize,
    /// Components of a `/v1/embeddings` vector (default 384, all-MiniLM-L6-v2's size).
    pub embedding_dim: usize,
    /// The served model's chat template (default: the built-in Llama 3.1 layout).
    pub chat_template: Arc<ChatTemplate>,
    /// `--kv-events-config`: where the pod publishes its KV-cache events (default: nowhere).
    pub kv_events: Option<kv_events::KvEventsConfig>,
    /// `VLLM_SERVER_DEV_MODE` is 1 or true: vLLM's development routes
    /// (`POST /reset_prefix_cache`).
    pub dev_mode: bool,
}

impl ServerConfig {
    pub fn new(pod: PodConfig) -> Self {
        Self {
            pod,
            time_scale: 1.0,
            allow_runtime_lora_updating: false,
            error_format: ErrorFormat::Nested,
            enable_prompt_tokens_details: false,
            max_body_bytes: 8 << 20,
            embedding_dim: 384,
            chat_template: Arc::new(ChatTemplate::builtin()),
            kv_events: None,
            dev_mode: false,
        }
    }
}

/// Shared state of the handlers.
pub struct AppState {
    pub config: ServerConfig,
    pub clock: ModelClock,
    pub exporter: PodExporter,
    /// Unix seconds at start (`created` of the model cards).
    pub created: u64,
    pod: Mutex<Pod>,
    /// Ids of replies that the pod model does not number (embeddings).
    replies: AtomicU64,
}

impl AppState {
    /// The state around `pod`, with the model clock starting now.
    pub fn new(config: ServerConfig, pod: Pod) -> Arc<Self> {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Arc::new(Self {
            clock: ModelClock::new(config.time_scale),
            exporter: PodExporter::new(&config.pod),
            created,
            pod: Mutex::new(pod),
            replies: AtomicU64::new(0),
            config,
        })
    }

    /// The pod, locked. A panic elsewhere never makes the pod unusable.
    pub fn lock_pod(&self) -> MutexGuard<'_, Pod> {
        self.pod.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh number for a reply id.
    pub fn next_request_id(&self) -> u64 {
        self.replies.fetch_add(1, Ordering::Relaxed)
    }

    pub fn error(&self, e: impl Into<ApiError>) -> Response {
        e.into().into_reply(self.config.error_format)
    }
}

/// The body of a JSON POST, or the error reply vLLM gives for a wrong content type or an
/// unreadable (e.g. oversized) body.
pub fn json_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !is_json {
        return Err(ApiError::validation(
            None,
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
        ));
    }
    body.map_err(|e| ApiError::bad_request(format!("body: {e}")))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// vLLM's development route: `{"success": bool}` (false while a request holds blocks).
async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Response {
    let success = state.lock_pod().reset_prefix_cache(state.clock.now());
    axum::Json(serde_json::json!({ "success": success })).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    {
        let mut pod = state.lock_pod();
        let snapshot = pod.metrics(state.clock.now());
        state.exporter.sync(&snapshot);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.exporter.encode(),
    )
        .into_response()
}

/// The routes of one pod.
pub fn router(state: Arc<AppState>) -> Router {
    let config = &state.config;
    let mut router = Router::new()
        .route("/v1/completions", post(inference::completions))
        .route("/v1/chat/completions", post(inference::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models::list_models))
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    match config.pod.engine {
        Engine::Vllm if config.pod.enable_lora && config.allow_runtime_lora_updating => {
            router = router
                .route("/v1/load_lora_adapter", post(lora::vllm_load))
                .route("/v1/unload_lora_adapter", post(lora::vllm_unload));
        }
        Engine::Sglang if config.pod.enable_lora => {
            router = router
                .route("/load_lora_adapter", post(lora::sglang_load))
                .route("/unload_lora_adapter", post(lora::sglang_unload));
        }
        _ => {}
    }
    if config.dev_mode && config.pod.engine == Engine::Vllm {
        router = router.route("/reset_prefix_cache", post(reset_prefix_cache));
    }
    router
        .fallback(errors::route_not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}
