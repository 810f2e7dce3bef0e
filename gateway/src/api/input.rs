//! Request input: JSON bodies decoded with the failing field named
//! (`rank: invalid type: string "x", expected u32`). Body size limits are enforced by the router
//! (`DefaultBodyLimit`), which answers 413 before a handler runs.

use serde::de::DeserializeOwned;

use super::error::ApiError;

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
}
