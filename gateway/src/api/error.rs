//! The API's one error type and its mapping to HTTP statuses. Every error body is
//! `{"error": "<field>: <value>: <rule>"}` (or another message naming what was wrong); internals
//! are never leaked.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::engine::EngineError;
use crate::policy::fleet::FleetError;
use crate::registry::RegistryError;
use crate::service::pods::PoolError;

/// An API failure.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input: the message names the field.
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A pod refused or failed.
    #[error("{0}")]
    Upstream(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status(), Json(json!({"error": self.to_string()}))).into_response();
        if matches!(self, Self::Unauthorized) {
            if let Ok(v) = "Bearer".parse() {
                response
                    .headers_mut()
                    .insert(axum::http::header::WWW_AUTHENTICATE, v);
            }
        }
        response
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::Invalid { .. } => Self::BadRequest(e.to_string()),
            RegistryError::Unknown(_) => Self::NotFound(e.to_string()),
            RegistryError::Full => Self::Conflict(e.to_string()),
            RegistryError::ManifestMismatch { .. } | RegistryError::Unverifiable { .. } => {
                Self::Conflict(e.to_string())
            }
        }
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Invalid(_) => Self::BadRequest(e.to_string()),
            PoolError::Fleet(FleetError::Exists(_) | FleetError::Full(_)) => {
                Self::Conflict(e.to_string())
            }
            PoolError::Fleet(FleetError::Unknown(_)) => Self::NotFound(e.to_string()),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        Self::Upstream(e.to_string())
    }
}
