//! The identity section of the filter's configuration: who the user and the tenant of a request
//! are (headers trusted as they arrive, the body's `user`, a credential's keyed hash).

use serde::Deserialize;

use super::header_name;

/// Most `credential_headers` (each is a header lookup on a request without a user).
pub const MAX_CREDENTIAL_HEADERS: usize = 8;

/// Who a request's user is (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct IdentityConfig {
    /// Header carrying the tenant, `null` for none (default `x-prewarm-tenant`). Trusted as
    /// is: name a header the mesh sets (and strips from clients), see docs/filter-config.md.
    pub tenant_header: Option<String>,
    /// Header carrying the user, `null` for none (default `x-prewarm-user`); same trust rule.
    pub user_header: Option<String>,
    /// Whether the body's `user` field is the user when the header gives none (default true).
    pub user_from_body: bool,
    /// Headers whose credential (a bearer token, an API key) identifies a request that names no
    /// user, for its streak, by a keyed hash (default `authorization`, `x-api-key`, `api-key`;
    /// empty: none).
    pub credential_headers: Vec<String>,
    /// The key of that hash, at least 16 bytes (default none: a random key per proxy, kept in
    /// shared data).
    pub credential_key: Option<String>,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        Self {
            tenant_header: Some("x-prewarm-tenant".into()),
            user_header: Some("x-prewarm-user".into()),
            user_from_body: true,
            credential_headers: ["authorization", "x-api-key", "api-key"]
                .map(String::from)
                .to_vec(),
            credential_key: None,
        }
    }
}

impl IdentityConfig {
    /// This section's problems, as `field: value: rule`; a key is never echoed.
    pub fn validate(&self, p: &mut Vec<String>) {
        for (field, header) in [
            ("tenant_header", &self.tenant_header),
            ("user_header", &self.user_header),
        ] {
            if let Some(h) = header {
                header_name(p, field, h);
            }
        }
        if self.credential_headers.len() > MAX_CREDENTIAL_HEADERS {
            p.push(format!(
                "credential_headers: {} headers: must be at most {MAX_CREDENTIAL_HEADERS}",
                self.credential_headers.len()
            ));
        }
        for h in &self.credential_headers {
            header_name(p, "credential_headers", h);
        }
        if let Some(key) = &self.credential_key {
            if !(16..=256).contains(&key.len()) || !key.bytes().all(|b| b.is_ascii_graphic()) {
                p.push("credential_key: (hidden): must be 16 to 256 bytes of visible ASCII".into());
            }
        }
    }
}
