//! Bearer-token access to the API, as one layer per group of routes
//! ([`axum::middleware::from_fn_with_state`] with a [`Guard`]) instead of a check in each handler.
//!
//! Three tokens, each from `[server]` (or its environment variable):
//! - `signal_token`: the filters' `POST /v1/signals` and `GET /v1/routing`;
//! - `read_token`: admin reads (`GET`/`HEAD` under `/admin/`), which show users' prompt
//!   previews, tenants, adapter paths and pod errors; the admin token is accepted too;
//! - `admin_token`: every other admin method.
//!
//! An empty configured token matches nothing, so an unconfigured gateway refuses these routes
//! (401) rather than leaving them open. Probes, `/metrics` and the dashboard's static assets
//! carry no layer.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use super::AppState;

/// Which group of routes a layer guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The filters' routes: the signal token.
    Signal,
    /// The admin routes: the read (or admin) token for `GET`/`HEAD`, the admin token otherwise.
    Admin,
}

/// The state of one auth layer: the gateway (for its tokens) and the group it guards.
#[derive(Clone)]
pub struct Guard {
    pub gateway: AppState,
    pub access: Access,
}

/// Whether `headers` carry `Authorization: Bearer <token>`; an empty configured token never
/// matches.
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    if token.is_empty() {
        return false;
    }
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| constant_time_eq(given.trim().as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a request with `method` and `headers` may use the routes of `access`.
pub fn allowed(
    server: &crate::config::ServerConfig,
    access: Access,
    method: &Method,
    headers: &HeaderMap,
) -> bool {
    match access {
        Access::Signal => bearer_matches(headers, &server.signal_token),
        Access::Admin if *method == Method::GET || *method == Method::HEAD => {
            bearer_matches(headers, &server.read_token)
                || bearer_matches(headers, &server.admin_token)
        }
        Access::Admin => bearer_matches(headers, &server.admin_token),
    }
}

/// The middleware: 401 (with `WWW-Authenticate: Bearer`) before the handler runs and before
/// the body is read, unless the request carries the right token.
pub async fn require_token(
    State(guard): State<Guard>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let server = &guard.gateway.config.server;
    if allowed(server, guard.access, request.method(), request.headers()) {
        Ok(next.run(request).await)
    } else {
        Err(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn with(token: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        h
    }

    #[test]
    fn each_group_takes_its_token() {
        let server = ServerConfig {
            admin_token: "adm".into(),
            read_token: "rd".into(),
            signal_token: "sig".into(),
            ..ServerConfig::default()
        };
        let ok = |access, method: Method, token| allowed(&server, access, &method, &with(token));
        assert!(ok(Access::Signal, Method::POST, Some("sig")));
        assert!(!ok(Access::Signal, Method::POST, Some("adm")));
        assert!(!ok(Access::Signal, Method::GET, None));
        assert!(ok(Access::Admin, Method::GET, Some("rd")));
        assert!(ok(Access::Admin, Method::GET, Some("adm")));
        assert!(!ok(Access::Admin, Method::GET, Some("sig")));
        assert!(!ok(Access::Admin, Method::GET, None));
        assert!(!ok(Access::Admin, Method::POST, Some("rd")));
        assert!(ok(Access::Admin, Method::DELETE, Some("adm")));
    }

    #[test]
    fn unconfigured_tokens_refuse_everything() {
        let server = ServerConfig::default();
        for access in [Access::Signal, Access::Admin] {
            for method in [Method::GET, Method::POST] {
                assert!(!allowed(&server, access, &method, &with(Some(""))));
                assert!(!allowed(&server, access, &method, &with(None)));
            }
        }
        assert!(!bearer_matches(&with(Some("t")), ""));
    }
}
