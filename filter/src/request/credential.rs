//! A request's identity for streaks when it names no user: a keyed hash of its credential
//! (core's `identity`), read from the first of `credential_headers` the request carries.
//!
//! The key is `credential_key` when configured; otherwise the proxy's own, 32 random bytes
//! from std's `RandomState` (seeded from the host's random source, WASI `random_get` on Envoy),
//! kept in shared data (`identity/key`) so every worker of the proxy hashes alike: a worker
//! that finds none (on its tick, or a request before its first tick) writes its own and then
//! uses whatever the key holds, and each tick re-reads it, so workers that raced at start agree
//! from their next tick on. A restarted Envoy has a new key: streaks restart, nothing else
//! depends on it.
//!
//! The credential itself is never stored, logged, counted by value or sent: only its identity
//! leaves [`IdentityKey::identity`], and it is used for streaks alone (not for experiment arms:
//! each proxy's key differs, so an arm chosen by it would differ between proxies).

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use prewarm_core::identity::{credential_identity, credential_of, KEY_BYTES};

use crate::config::FilterConfig;
use crate::host::Host;
use crate::shared::{update, Keys};

/// The key credential identities are hashed with.
#[derive(Debug)]
pub struct IdentityKey {
    configured: Option<Vec<u8>>,
    /// The proxy's key, once read from shared data.
    proxy: RefCell<Option<Vec<u8>>>,
}

impl IdentityKey {
    pub fn new(config: &FilterConfig) -> Self {
        Self {
            configured: config
                .identity
                .credential_key
                .as_ref()
                .map(|k| k.as_bytes().to_vec()),
            proxy: RefCell::new(None),
        }
    }

    /// The identity of the request's credential (the first configured header that has one);
    /// `None` when it carries none, or when the proxy's key could not be read or made.
    pub fn identity<H: Host + ?Sized>(
        &self,
        host: &H,
        keys: &Keys,
        config: &FilterConfig,
    ) -> Option<String> {
        let value = config.identity.credential_headers.iter().find_map(|h| {
            host.request_header(h)
                .filter(|v| credential_of(v).is_some())
        })?;
        let credential = credential_of(&value)?;
        if let Some(key) = &self.configured {
            return Some(credential_identity(key, credential));
        }
        if self.proxy.borrow().is_none() {
            let key = read_or_make(host, keys, config.shared_data.cas_retries)?;
            *self.proxy.borrow_mut() = Some(key);
        }
        let proxy = self.proxy.borrow();
        Some(credential_identity(proxy.as_deref()?, credential))
    }

    /// On the tick: the proxy's key, read again (made first when there is none, so requests
    /// seldom have to make it).
    pub fn refresh<H: Host + ?Sized>(&self, host: &H, keys: &Keys, config: &FilterConfig) {
        if self.configured.is_some() || config.identity.credential_headers.is_empty() {
            return;
        }
        if let Some(key) = read_or_make(host, keys, config.shared_data.cas_retries) {
            *self.proxy.borrow_mut() = Some(key);
        }
    }
}

/// The proxy's key from shared data, written first when there is none.
fn read_or_make<H: Host + ?Sized>(host: &H, keys: &Keys, retries: u32) -> Option<Vec<u8>> {
    let key = keys.identity_key();
    update(host, &key, retries, |stored| {
        if stored.len() == KEY_BYTES {
            (None, ())
        } else {
            (Some(random_key().to_vec()), ())
        }
    })?;
    // another worker may have written between: every worker uses what the key holds
    let (stored, _) = host.shared_get(&key);
    stored.filter(|k| k.len() == KEY_BYTES)
}

/// 32 random bytes: four of std's randomly keyed SipHash states (each `RandomState` draws
/// fresh keys or steps the thread's seeded ones), each hashing its index.
fn random_key() -> [u8; KEY_BYTES] {
    let mut out = [0u8; KEY_BYTES];
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IdentityConfig;
    use crate::host::fake::FakeHost;

    #[test]
    fn workers_of_one_proxy_share_the_key_and_proxies_do_not() {
        let config = FilterConfig::default();
        let keys = Keys::new(&config.shared_data.shared_prefix);
        let a = FakeHost::new();
        let b = a.sibling();
        let other_proxy = FakeHost::new();
        for h in [&a, &b, &other_proxy] {
            h.set_request(&[("authorization", b"Bearer sk-one")], b"");
        }
        let ids: Vec<String> = [&a, &b, &other_proxy]
            .iter()
            .map(|h| {
                IdentityKey::new(&config)
                    .identity(*h, &keys, &config)
                    .unwrap()
            })
            .collect();
        assert_eq!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        assert_eq!(
            a.shared_value(&keys.identity_key()).unwrap().len(),
            KEY_BYTES
        );
    }

    #[test]
    fn a_worker_that_lost_the_race_adopts_the_stored_key_on_its_tick() {
        let config = FilterConfig::default();
        let keys = Keys::new(&config.shared_data.shared_prefix);
        let host = FakeHost::new();
        host.set_request(&[("x-api-key", b"k-1")], b"");
        let mine = IdentityKey::new(&config);
        let first = mine.identity(&host, &keys, &config).unwrap();
        // another worker overwrote the key (both saw none at start)
        host.shared_set(&keys.identity_key(), &[7u8; KEY_BYTES], None)
            .unwrap();
        mine.refresh(&host, &keys, &config);
        let after = mine.identity(&host, &keys, &config).unwrap();
        assert_ne!(first, after);
        assert_eq!(after, credential_identity(&[7u8; KEY_BYTES], b"k-1"));
    }

    #[test]
    fn the_tick_makes_the_key_before_any_request_needs_it() {
        let config = FilterConfig::default();
        let keys = Keys::new(&config.shared_data.shared_prefix);
        let host = FakeHost::new();
        IdentityKey::new(&config).refresh(&host, &keys, &config);
        let stored = host.shared_value(&keys.identity_key()).unwrap();
        assert_eq!(stored.len(), KEY_BYTES);
        assert_ne!(stored, vec![0u8; KEY_BYTES]);
        // a worker's request reads it, writes nothing
        let worker = IdentityKey::new(&config);
        host.reset_shared_traffic();
        host.set_request(&[("api-key", b"k")], b"");
        let id = worker.identity(&host, &keys, &config).unwrap();
        assert_eq!(id, credential_identity(&stored, b"k"));
        assert_eq!(host.shared_traffic().1, 0, "no write on the request path");
        // without credential headers the tick makes none
        let off = FilterConfig {
            identity: IdentityConfig {
                credential_headers: vec![],
                ..IdentityConfig::default()
            },
            ..FilterConfig::default()
        };
        let other = FakeHost::new();
        IdentityKey::new(&off).refresh(&other, &keys, &off);
        assert!(other.shared_keys().is_empty());
    }

    #[test]
    fn a_configured_key_needs_no_shared_data_and_no_credential_no_identity() {
        let config = FilterConfig {
            identity: IdentityConfig {
                credential_key: Some("0123456789abcdef".into()),
                ..IdentityConfig::default()
            },
            ..FilterConfig::default()
        };
        let keys = Keys::new(&config.shared_data.shared_prefix);
        let host = FakeHost::new();
        host.set_request(&[("authorization", b"Bearer ")], b"");
        assert_eq!(
            IdentityKey::new(&config).identity(&host, &keys, &config),
            None
        );
        host.set_request(&[("authorization", b"Bearer "), ("api-key", b"k")], b"");
        let id = IdentityKey::new(&config).identity(&host, &keys, &config);
        assert_eq!(id, Some(credential_identity(b"0123456789abcdef", b"k")));
        assert!(host.shared_keys().is_empty());
    }
}
