//! The proxy's shared level of the embedding cache: a fixed ring of `shared_slots` shared-data
//! keys (`<prefix>emb/<slot>`, the slot from the entry's key), each holding the last entry
//! stored there, so an input one worker's pod response stored answers the other workers too.
//! Shared data has no delete, no TTL and no listing (PROXY-WASM-FACTS), so the key space is the
//! fixed ring, an entry carries its expiry, and a newer entry for the same slot replaces it
//! (entries are immutable results of the pod: two workers racing to write one slot both write
//! a correct entry, so no compare-and-swap). Read only on a local miss, a value at most
//! `max_shared_entry_bytes` plus 48 bytes.
//!
//! Value layout: the entry's 32-byte key, its expiry (ms, u64 LE), its prompt tokens (u64 LE),
//! then the embedding's raw JSON.

use prewarm_core::embed_cache::{CachedEmbedding, EmbeddingKey};

use crate::host::Host;
use crate::shared::Keys;

const HEADER: usize = 48;

fn slot_key(keys: &Keys, key: &EmbeddingKey, slots: u32) -> String {
    let mut first = [0u8; 8];
    first.copy_from_slice(key.get(..8).unwrap_or(&[0; 8]));
    keys.embedding(u64::from_le_bytes(first), slots)
}

/// The entry for `key` in the shared level, when present and fresh at `now_ms`.
pub fn get<H: Host + ?Sized>(
    host: &H,
    keys: &Keys,
    slots: u32,
    key: &EmbeddingKey,
    now_ms: u64,
) -> Option<(CachedEmbedding, u64)> {
    if slots == 0 {
        return None;
    }
    let (value, _) = host.shared_get(&slot_key(keys, key, slots));
    let value = value?;
    if value.get(..32)? != key.as_slice() {
        return None;
    }
    let number = |at: usize| -> Option<u64> {
        let bytes: [u8; 8] = value.get(at..at + 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(bytes))
    };
    let expires_ms = number(32)?;
    if expires_ms <= now_ms {
        return None;
    }
    let embedding = std::str::from_utf8(value.get(HEADER..)?).ok()?;
    Some((
        CachedEmbedding {
            embedding: embedding.into(),
            prompt_tokens: number(40)?,
        },
        expires_ms,
    ))
}

/// Puts `entry` for `key`, expiring at `expires_ms`, in its slot; false when it is too large
/// or the host refused.
pub fn put<H: Host + ?Sized>(
    host: &H,
    keys: &Keys,
    (slots, max_bytes): (u32, usize),
    key: &EmbeddingKey,
    entry: &CachedEmbedding,
    expires_ms: u64,
) -> bool {
    if slots == 0 || entry.embedding.len() > max_bytes {
        return false;
    }
    let mut value = Vec::with_capacity(HEADER + entry.embedding.len());
    value.extend_from_slice(key);
    value.extend_from_slice(&expires_ms.to_le_bytes());
    value.extend_from_slice(&entry.prompt_tokens.to_le_bytes());
    value.extend_from_slice(entry.embedding.as_bytes());
    host.shared_set(&slot_key(keys, key, slots), &value, None)
        .is_ok()
}
