//! Request input: bearer-token checks and JSON bodies decoded with the failing field named
//! (`rank: invalid type: string "x", expected u32`). Body size limits are enforced by the router
//! (`DefaultBodyLimit`), which answers 413 before a handler runs.

use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Whether `headers` carry `Authorization: Bearer <token>`; an empty configured token never
/// matches (mutating admin calls are then refused).
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

/// 401 unless the admin token is presented.
pub fn require_admin(headers: &HeaderMap, admin_token: &str) -> Result<(), ApiError> {
    if bearer_matches(headers, admin_token) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// 401 when a signal token is configured and not presented.
pub fn require_signal_token(headers: &HeaderMap, signal_token: &str) -> Result<(), ApiError> {
    if signal_token.is_empty() || bearer_matches(headers, signal_token) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Decodes a JSON body; errors name the path of the failing field.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "body: empty: a JSON object is required".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::BadRequest(format!("body: {inner}"))
        } else {
            ApiError::BadRequest(format!("{path}: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::BadRequest(format!("body: trailing data: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        name: String,
        rank: u32,
    }

    #[test]
    fn errors_name_the_field() {
        let e = json_body::<T>(br#"{"name":"a","rank":"x"}"#).unwrap_err();
        assert!(e.to_string().starts_with("rank: "), "{e}");
        let e = json_body::<T>(br#"{"name":"a"}"#).unwrap_err();
        assert!(e.to_string().contains("rank"), "{e}");
        let e = json_body::<T>(b"").unwrap_err();
        assert!(e.to_string().starts_with("body:"), "{e}");
    }

    #[test]
    fn bearer() {
        let mut h = HeaderMap::new();
        assert!(!bearer_matches(&h, "t"));
        h.insert("authorization", "Bearer t".parse().unwrap());
        assert!(bearer_matches(&h, "t"));
        assert!(!bearer_matches(&h, "u"));
        assert!(!bearer_matches(&h, ""));
        assert!(require_signal_token(&HeaderMap::new(), "").is_ok());
    }
}
