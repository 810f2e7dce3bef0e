//! The filter's shared-data layout and the compare-and-swap update every writer goes through.
//!
//! Envoy's shared data has no delete, no TTL and no listing, so the key space is bounded by
//! design: every key is `<shared_prefix>` followed by one of
//!
//! | key | value |
//! |---|---|
//! | `user/<slot>` (`user_slots` of them) | user hash (8) + core `UserPattern` bytes |
//! | `pattern/<slot>` (`pattern_slots`) | [`RateSlot`]: pattern hash, signalled flag, rate window |
//! | `adapter/<slot>` (`adapter_slots`) | [`RateSlot`]: adapter hash, pinned flag, rate window |
//! | `shared_prompt/<slot>` (`shared_prompt_slots`) | [`SharedPromptSlot`]: routing key, when last signalled, rate window |
//! | `identity/key` | the proxy's key of credential identities (32 random bytes; see `request::credential`) |
//! | `signals/head`, `signals/tail`, `signals/<slot>` (`max_pending_signals` slots) | the pending-signal ring (see `signals::ring`, `signals::queue`) |
//! | `px/<slot>` (`prefix_slots`) | core's prefix-index entry (74 bytes; see `routing::prefix_index`; a routed request's writes land on its VM's next tick, `routing::prefix_pending`) |
//! | `routing/table` | the last routing table body the gateway sent (JSON) |
//! | `routing/generation` | generation (8) + fetched-at ms (8) of that table |
//! | `routing/poll` | ms at which a worker last claimed the table poll (8) |
//! | `direct/gateway` | ms of the first failed gateway call of the current failure streak, 0 when the last call succeeded (8; see `direct::gateway_health`) |
//! | `direct/budget`, `direct/pod/<slot>` (256 slots) | the direct calls' minute budget and per-pod in-flight flags (see `direct::budget`) |
//!
//! A slot is chosen by hashing the name into a fixed number of slots; a slot holding another
//! owner's state is taken over (its owner hash differs), so collisions cost accuracy, not memory.

use prewarm_core::fingerprint::chain_seed;
use prewarm_core::rate::{RateWindow, ENCODED_LEN};
use prewarm_core::trigger::shared::SharedPromptState;

use crate::host::{Host, Metric};

/// The fixed set of shared-data keys of one configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
        }
    }

    /// Hash of a name (user, adapter) as stored with its slot.
    pub fn owner_hash(name: &str) -> u64 {
        chain_seed(name)
    }

    fn slot(&self, family: &str, hash: u64, slots: u32) -> String {
        let slot = hash % u64::from(slots.max(1));
        format!("{}{family}/{slot}", self.prefix)
    }

    pub fn user(&self, user_hash: u64, slots: u32) -> String {
        self.slot("user", user_hash, slots)
    }

    pub fn pattern(&self, pattern_hash: u64, slots: u32) -> String {
        self.slot("pattern", pattern_hash, slots)
    }

    pub fn adapter(&self, adapter_hash: u64, slots: u32) -> String {
        self.slot("adapter", adapter_hash, slots)
    }

    /// A shared prompt's slot, by its routing key.
    pub fn shared_prompt(&self, routing_key: u64, slots: u32) -> String {
        self.slot("shared_prompt", routing_key, slots)
    }

    /// The proxy's key of credential identities.
    pub fn identity_key(&self) -> String {
        format!("{}identity/key", self.prefix)
    }

    /// An embedding-cache slot of the proxy's shared level.
    pub fn embedding(&self, key_hash: u64, slots: u32) -> String {
        self.slot("emb", key_hash, slots)
    }

    /// The generation of the gateway's warm embedding entries this proxy has.
    pub fn embedding_generation(&self) -> String {
        format!("{}emb/generation", self.prefix)
    }

    /// A prefix-index slot (the slot is core's `prefix::slot_of`).
    pub fn prefix_slot(&self, slot: u32) -> String {
        format!("{}px/{slot}", self.prefix)
    }

    pub fn served(&self) -> String {
        format!("{}served", self.prefix)
    }

    pub fn outcomes(&self) -> String {
        format!("{}outcomes", self.prefix)
    }

    pub fn signals(&self) -> String {
        format!("{}signals", self.prefix)
    }

    pub fn table(&self) -> String {
        format!("{}routing/table", self.prefix)
    }

    pub fn generation(&self) -> String {
        format!("{}routing/generation", self.prefix)
    }

    pub fn poll(&self) -> String {
        format!("{}routing/poll", self.prefix)
    }

    /// A fixed key of another module's (`direct/...`), prefixed.
    pub fn custom(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }
}

/// Read-modify-write of one key with compare-and-swap: `change` gets the current value (empty
/// when missing) and returns the new value (or `None` to leave it) and a result. Retried up to
/// `retries` times when another worker wrote in between; then it gives up quietly, counted in
/// `prewarm_filter_shared_data_cas_give_ups_total`, and returns `None`.
pub fn update<H: Host + ?Sized, T>(
    host: &H,
    key: &str,
    retries: u32,
    mut change: impl FnMut(&[u8]) -> (Option<Vec<u8>>, T),
) -> Option<T> {
    for _ in 0..retries.max(1) {
        let (value, cas) = host.shared_get(key);
        let (new, result) = change(value.as_deref().unwrap_or(&[]));
        match new {
            None => return Some(result),
            Some(bytes) => {
                if host.shared_set(key, &bytes, cas).is_ok() {
                    return Some(result);
                }
            }
        }
    }
    host.count(Metric::CasGiveUps, 1);
    None
}

/// Little-endian u64 at `at`, if there.
pub fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(b);
    Some(u64::from_le_bytes(word))
}

/// A rate counted for one owner (a pattern, an adapter) with one flag (signalled, pinned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSlot {
    pub owner: u64,
    pub flag: bool,
    pub window: RateWindow,
}

/// Bytes of an encoded [`RateSlot`].
pub const RATE_SLOT_LEN: usize = 9 + ENCODED_LEN;

impl RateSlot {
    /// The slot's state for `owner`: what is stored when it is `owner`'s, else a fresh one.
    pub fn read(bytes: &[u8], owner: u64, window_ms: u64) -> Self {
        let mine = bytes.len() == RATE_SLOT_LEN && read_u64(bytes, 0) == Some(owner);
        if !mine {
            return Self {
                owner,
                flag: false,
                window: RateWindow::new(window_ms),
            };
        }
        Self {
            owner,
            flag: bytes.get(8).is_some_and(|b| *b != 0),
            window: RateWindow::from_bytes(bytes.get(9..).unwrap_or(&[]), window_ms),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RATE_SLOT_LEN);
        out.extend_from_slice(&self.owner.to_le_bytes());
        out.push(u8::from(self.flag));
        out.extend_from_slice(&self.window.to_bytes());
        out
    }
}

/// A shared prompt's state for one routing key (core's `trigger::shared`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPromptSlot {
    pub owner: u64,
    pub state: SharedPromptState,
}

/// Bytes of an encoded [`SharedPromptSlot`]: owner (8), last signalled ms (8, 0 for never),
/// the rate window.
pub const SHARED_PROMPT_SLOT_LEN: usize = 16 + ENCODED_LEN;

impl SharedPromptSlot {
    /// The slot's state for `owner`: what is stored when it is `owner`'s, else a fresh one.
    pub fn read(bytes: &[u8], owner: u64, window_ms: u64) -> Self {
        let mine = bytes.len() == SHARED_PROMPT_SLOT_LEN && read_u64(bytes, 0) == Some(owner);
        let mut state = SharedPromptState::new(window_ms);
        if mine {
            state.signalled_at_ms = read_u64(bytes, 8).filter(|t| *t != 0);
            state.window = RateWindow::from_bytes(bytes.get(16..).unwrap_or(&[]), window_ms);
        }
        Self { owner, state }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SHARED_PROMPT_SLOT_LEN);
        out.extend_from_slice(&self.owner.to_le_bytes());
        let signalled = self.state.signalled_at_ms.map_or(0, |t| t.max(1));
        out.extend_from_slice(&signalled.to_le_bytes());
        out.extend_from_slice(&self.state.window.to_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    #[test]
    fn shared_prompt_slot_round_trips_and_resets_for_another_key() {
        let mut s = SharedPromptSlot::read(&[], 9, 60_000);
        assert_eq!(s.state.signalled_at_ms, None);
        s.state.window.record(5_000, 2);
        s.state.signalled_at_ms = Some(5_000);
        let bytes = s.to_bytes();
        assert_eq!(bytes.len(), SHARED_PROMPT_SLOT_LEN);
        assert_eq!(SharedPromptSlot::read(&bytes, 9, 60_000), s);
        let other = SharedPromptSlot::read(&bytes, 10, 60_000);
        assert_eq!(other.state.signalled_at_ms, None);
        assert_eq!(other.state.window.count(5_000), 0);
        assert_eq!(Keys::new("p/").shared_prompt(10, 4), "p/shared_prompt/2");
    }

    #[test]
    fn keys_are_prefixed_and_slotted() {
        let k = Keys::new("p/");
        assert_eq!(k.user(10, 4), "p/user/2");
        assert_eq!(k.adapter(7, 1), "p/adapter/0");
        assert_eq!(k.signals(), "p/signals");
        assert_eq!(k.table(), "p/routing/table");
    }

    #[test]
    fn rate_slot_round_trips_and_resets_for_another_owner() {
        let mut s = RateSlot::read(&[], 5, 60_000);
        s.window.record(1_000, 3);
        s.flag = true;
        let bytes = s.to_bytes();
        assert_eq!(RateSlot::read(&bytes, 5, 60_000), s);
        let other = RateSlot::read(&bytes, 6, 60_000);
        assert!(!other.flag);
        assert_eq!(other.window.count(1_000), 0);
    }

    #[test]
    fn update_retries_then_gives_up_counted() {
        let host = FakeHost::new();
        host.fail_next_sets(2);
        let r = update(&host, "k", 3, |v| (Some([v, b"x"].concat()), v.len()));
        assert_eq!(r, Some(0));
        assert_eq!(host.shared_value("k"), Some(b"x".to_vec()));
        host.fail_next_sets(5);
        assert_eq!(update(&host, "k", 3, |_| (Some(vec![]), ())), None);
        assert_eq!(host.metric(Metric::CasGiveUps), 1);
    }
}
