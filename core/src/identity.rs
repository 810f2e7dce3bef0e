//! Who a request is when it names no user: a keyed hash of the credential it carries (a bearer
//! token, an API key), so the requests of one API key continue one streak.
//!
//! The identity is `credential:` followed by 32 hex digits: the first 16 bytes of SHA-256 over a
//! domain tag, the key's length, the key and the credential. The key is the proxy's own (random,
//! kept in its shared data) or a configured one, so an identity is not a function of the
//! credential alone: a leaked identity cannot be matched against candidate tokens without the
//! key, and two proxies with their own keys do not link a client. The credential itself is
//! never kept: only the identity leaves this function.

use sha2::{Digest, Sha256};

/// Bytes of a proxy's generated key.
pub const KEY_BYTES: usize = 32;

const DOMAIN: &[u8] = b"prewarm/credential-identity/v1\0";

/// The credential in a header's value: the token of a `Bearer` value (the scheme matched
/// without case), else the whole value; surrounding whitespace trimmed. `None` when empty (a
/// scheme without a token too).
pub fn credential_of(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    if value.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = match value.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => {
            value.get(7..).unwrap_or_default().trim_ascii()
        }
        _ => value,
    };
    (!token.is_empty()).then_some(token)
}

/// The identity of `credential` under `key`; see the module docs.
pub fn credential_identity(key: &[u8], credential: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(DOMAIN);
    h.update((key.len() as u64).to_le_bytes());
    h.update(key);
    h.update(credential);
    let digest = h.finalize();
    let mut out = String::with_capacity(11 + 32);
    out.push_str("credential:");
    for b in digest.iter().take(16) {
        out.push(char::from(
            HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'),
        ));
        out.push(char::from(
            HEX.get(usize::from(b & 15)).copied().unwrap_or(b'0'),
        ));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_bearer_token_is_its_token_and_other_values_are_whole() {
        assert_eq!(credential_of(b"Bearer sk-abc"), Some(&b"sk-abc"[..]));
        assert_eq!(credential_of(b"  bearer   sk-abc "), Some(&b"sk-abc"[..]));
        assert_eq!(
            credential_of(b"Basic dXNlcjpwdw=="),
            Some(&b"Basic dXNlcjpwdw=="[..])
        );
        assert_eq!(credential_of(b"sk-key"), Some(&b"sk-key"[..]));
        assert_eq!(credential_of(b"Bearer "), None);
        assert_eq!(credential_of(b"   "), None);
        assert_eq!(credential_of(b"bearer"), None);
    }

    #[test]
    fn the_identity_depends_on_key_and_credential_and_hides_both() {
        let a = credential_identity(b"key-1", b"sk-secret-token");
        assert_eq!(a, credential_identity(b"key-1", b"sk-secret-token"));
        assert_ne!(a, credential_identity(b"key-2", b"sk-secret-token"));
        assert_ne!(a, credential_identity(b"key-1", b"sk-secret-tokem"));
        // the key's length is hashed: moving bytes between key and credential changes it
        assert_ne!(
            credential_identity(b"ab", b"c"),
            credential_identity(b"a", b"bc")
        );
        assert_eq!(a.len(), 11 + 32);
        assert!(a.starts_with("credential:"));
        assert!(!a.contains("secret") && !a.contains("key-1"));
        // a vector computed apart (Python's hashlib): the same on every platform
        assert_eq!(
            credential_identity(&[0u8; KEY_BYTES], b"token"),
            "credential:9e1a8090fa4e5281968217c9d2c33bd8"
        );
    }
}
