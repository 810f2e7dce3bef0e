//! The gateway's HTTP API (axum). Reference with JSON shapes: `docs/admin-api.md`.
//!
//! Access is one layer per group of routes ([`auth`]); an unconfigured token refuses its group.
//!
//! Filters (bearer token `server.signal_token`, else 401):
//! - `POST /v1/signals` — a core `SignalBatch`; 202 with counts.
//! - `GET  /v1/routing` — the core `RoutingTable`; `ETag: "<generation>"`, 304 when
//!   `If-None-Match` equals it.
//!
//! Probes and metrics (open):
//! - `GET /healthz` — 200 while the process runs.
//! - `GET /readyz` — 200 once the snapshot is loaded, else 503.
//! - `GET /metrics` — Prometheus text.
//! - `GET /v1/pods/{id}/ready` — 200 when the pod is in the routing table, 503 otherwise, 404
//!   for an unknown pod (Kubernetes readiness gates).
//!
//! Admin reads (bearer token `server.read_token` or `server.admin_token`, else 401):
//! - `GET /admin/pods`, `GET /admin/pods/{id}`, `GET /admin/pods/{id}/warmup`,
//!   `GET /admin/pods/{id}/plan`
//! - `GET /admin/adapters`, `GET /admin/adapters/{name}`, `GET /admin/adapters/heatmap`
//! - `GET /admin/prompts?k=N`
//! - `GET /admin/prompts/similar?text=T&k=N`, `GET /admin/prompts/groups?k=N` (with
//!   `embeddings.model_dir`)
//! - `GET /admin/experiments`, `GET /admin/experiments/{id}`
//!
//! Admin writes (bearer token `server.admin_token`, else 401):
//! - `POST /admin/pods`, `DELETE /admin/pods/{id}`, `POST /admin/pods/{id}/warmup`
//! - `POST /admin/adapters` (register; a new version of a known name is a rollout),
//!   `POST /admin/adapters/{name}/rollback`, `POST /admin/adapters/{name}/pin`,
//!   `POST /admin/adapters/{name}/unpin`, `DELETE /admin/adapters/{name}`
//! - `POST /admin/prompts` (add a template), `DELETE /admin/prompts/{key}`
//! - `POST /admin/experiments` (start one, or re-weight the running one),
//!   `DELETE /admin/experiments/{id}` (end it)
//! - `POST /admin/snapshot` (write a snapshot now)
//!
//! Bodies over `server.max_body_bytes` (`server.max_signal_body_bytes` for signals) get 413;
//! malformed input gets 400 with `{"error": "<field>: ..."}`.

mod adapters;
pub mod auth;
mod error;
mod experiments;
mod filter;
mod input;
mod pods;
mod probes;
mod prompts;
mod similar;
mod views;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;

use auth::{require_token, Access, Guard};

use crate::service::Gateway;

/// The application state handlers share.
pub type AppState = Arc<Gateway>;

/// What filters call, behind the signal token.
fn filter_routes(gateway: &Arc<Gateway>) -> Router<AppState> {
    let signal_limit = gateway.config.server.max_signal_body_bytes;
    Router::new()
        .route("/v1/signals", post(filter::post_signals))
        .layer(DefaultBodyLimit::max(signal_limit))
        .route("/v1/routing", get(filter::get_routing))
        .route("/v1/embeddings/warm", get(filter::get_warm_embeddings))
        .route_layer(from_fn_with_state(
            Guard {
                gateway: gateway.clone(),
                access: Access::Signal,
            },
            require_token,
        ))
}

/// The probes, open: the gateway's liveness and readiness, and each pod's warm gate.
fn probe_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/v1/pods/{id}/ready", get(probes::pod_ready))
}

/// The data plane's own listener (`server.filter_listen`): the filters' routes, the pods' warm
/// gates and the probes.
pub fn filter_router(gateway: Arc<Gateway>) -> Router {
    probe_routes()
        .merge(filter_routes(&gateway))
        .with_state(gateway)
}

/// The whole API.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let admin_limit = gateway.config.server.max_body_bytes;
    let admin = Router::new()
        .route("/admin/pods", get(pods::list).post(pods::add))
        .route("/admin/pods/{id}", get(pods::detail).delete(pods::remove))
        .route(
            "/admin/pods/{id}/warmup",
            get(pods::warmup_progress).post(pods::trigger_warmup),
        )
        .route("/admin/pods/{id}/plan", get(pods::plan))
        .route(
            "/admin/adapters",
            get(adapters::list).post(adapters::register),
        )
        .route("/admin/adapters/heatmap", get(adapters::heatmap))
        .route(
            "/admin/adapters/{name}",
            get(adapters::detail).delete(adapters::remove),
        )
        .route("/admin/adapters/{name}/pin", post(adapters::pin))
        .route("/admin/adapters/{name}/unpin", post(adapters::unpin))
        .route("/admin/adapters/{name}/rollback", post(adapters::rollback))
        .route("/admin/prompts", get(prompts::top).post(prompts::add))
        .route("/admin/prompts/similar", get(similar::similar))
        .route("/admin/prompts/groups", get(similar::groups))
        .route(
            "/admin/prompts/{key}",
            axum::routing::delete(prompts::remove),
        )
        .route(
            "/admin/experiments",
            get(experiments::list).post(experiments::start),
        )
        .route(
            "/admin/experiments/{id}",
            get(experiments::detail).delete(experiments::end),
        )
        .route("/admin/snapshot", post(probes::snapshot))
        .route_layer(from_fn_with_state(
            Guard {
                gateway: gateway.clone(),
                access: Access::Admin,
            },
            require_token,
        ))
        .layer(DefaultBodyLimit::max(admin_limit));
    probe_routes()
        .route("/metrics", get(probes::metrics))
        .merge(filter_routes(&gateway))
        .merge(admin)
        .merge(crate::dashboard::router())
        .with_state(gateway)
}
