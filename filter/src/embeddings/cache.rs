//! One VM's embedding cache: per-input entries (core's `embed_cache` rule) in an LRU bounded by
//! bytes, each answering for `ttl_ms` after the pod computed it. Envoy runs one VM per worker,
//! so each worker keeps its own: a lookup is a local hash probe, no shared-data copy of a
//! vector (shared data copies a whole value in and out under one process-wide lock), at the
//! cost of up to one miss per worker for each input.

use lru::LruCache;
use prewarm_core::embed_cache::{CachedEmbedding, EmbeddingKey};

#[derive(Debug)]
struct Entry {
    value: CachedEmbedding,
    expires_ms: u64,
}

/// The cache; see the module doc.
#[derive(Debug)]
pub struct EmbeddingCache {
    entries: LruCache<EmbeddingKey, Entry>,
    bytes: usize,
    max_bytes: usize,
    ttl_ms: u64,
}

/// What an insertion did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    pub stored: u64,
    /// Entries larger than the whole cache, not stored.
    pub too_large: u64,
    pub evicted: u64,
}

impl Stored {
    fn add(&mut self, other: Stored) {
        self.stored += other.stored;
        self.too_large += other.too_large;
        self.evicted += other.evicted;
    }
}

impl EmbeddingCache {
    pub fn new(max_bytes: usize, ttl_ms: u64) -> Self {
        Self {
            entries: LruCache::unbounded(),
            bytes: 0,
            max_bytes,
            ttl_ms,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `key`'s entry when present and fresh at `now_ms` (it becomes the most recently used; an
    /// expired one is dropped).
    pub fn get(&mut self, key: &EmbeddingKey, now_ms: u64) -> Option<CachedEmbedding> {
        match self.entries.get(key) {
            Some(e) if e.expires_ms > now_ms => Some(e.value.clone()),
            Some(_) => {
                if let Some(old) = self.entries.pop(key) {
                    self.bytes = self.bytes.saturating_sub(old.value.cost());
                }
                None
            }
            None => None,
        }
    }

    /// Every key's entry, when all are present and fresh at `now_ms` (the present ones become
    /// the most recently used either way; expired ones are dropped).
    pub fn get_all(&mut self, keys: &[EmbeddingKey], now_ms: u64) -> Option<Vec<CachedEmbedding>> {
        let found: Vec<Option<CachedEmbedding>> =
            keys.iter().map(|k| self.get(k, now_ms)).collect();
        found.into_iter().collect()
    }

    /// Stores `entries` under `keys` (pairwise), computed at `now_ms`, evicting the least
    /// recently used beyond the byte bound.
    pub fn insert(
        &mut self,
        keys: &[EmbeddingKey],
        entries: Vec<CachedEmbedding>,
        now_ms: u64,
    ) -> Stored {
        let expires_ms = now_ms.saturating_add(self.ttl_ms);
        let mut out = Stored::default();
        for (key, value) in keys.iter().zip(entries) {
            out.add(self.insert_until(*key, value, expires_ms));
        }
        out
    }

    /// The expiry an entry computed at `now_ms` gets.
    pub fn expiry(&self, now_ms: u64) -> u64 {
        now_ms.saturating_add(self.ttl_ms)
    }

    /// Stores one entry that expires at `expires_ms`.
    pub fn insert_until(
        &mut self,
        key: EmbeddingKey,
        value: CachedEmbedding,
        expires_ms: u64,
    ) -> Stored {
        let mut out = Stored::default();
        let cost = value.cost();
        if cost > self.max_bytes {
            out.too_large = 1;
            return out;
        }
        if let Some(old) = self.entries.pop(&key) {
            self.bytes = self.bytes.saturating_sub(old.value.cost());
        }
        while self.bytes + cost > self.max_bytes {
            match self.entries.pop_lru() {
                Some((_, old)) => {
                    self.bytes = self.bytes.saturating_sub(old.value.cost());
                    out.evicted += 1;
                }
                None => break,
            }
        }
        self.bytes += cost;
        self.entries.put(key, Entry { value, expires_ms });
        out.stored = 1;
        out
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> EmbeddingKey {
        [n; 32]
    }

    fn vector(bytes: usize) -> CachedEmbedding {
        CachedEmbedding {
            embedding: "1".repeat(bytes).into(),
            prompt_tokens: 3,
        }
    }

    #[test]
    fn a_request_hits_only_when_every_input_is_present_and_fresh() {
        let mut c = EmbeddingCache::new(1 << 20, 1000);
        c.insert(&[key(1), key(2)], vec![vector(10), vector(20)], 0);
        assert_eq!(c.get_all(&[key(2), key(1)], 500).map(|v| v.len()), Some(2));
        assert!(c.get_all(&[key(1), key(3)], 500).is_none());
        assert!(c.get_all(&[key(1)], 1000).is_none(), "expired at its TTL");
        assert_eq!(c.len(), 1, "the expired entry is dropped");
    }

    #[test]
    fn the_byte_bound_evicts_the_least_recently_used() {
        let cost = vector(100).cost();
        let mut c = EmbeddingCache::new(cost * 3, 60_000);
        c.insert(&[key(1), key(2), key(3)], vec![vector(100); 3], 0);
        assert!(
            c.get_all(&[key(1)], 1).is_some(),
            "1 is now the most recent"
        );
        let s = c.insert(&[key(4)], vec![vector(100)], 2);
        assert_eq!(s.evicted, 1);
        assert!(
            c.get_all(&[key(2)], 3).is_none(),
            "2 was the least recently used"
        );
        assert!(c.get_all(&[key(1), key(3), key(4)], 3).is_some());
        assert!(c.bytes() <= cost * 3);
    }

    #[test]
    fn an_entry_larger_than_the_cache_is_skipped_not_an_error() {
        let mut c = EmbeddingCache::new(4096, 60_000);
        let s = c.insert(&[key(1), key(2)], vec![vector(10_000), vector(10)], 0);
        assert_eq!((s.stored, s.too_large), (1, 1));
        assert!(c.get_all(&[key(2)], 1).is_some());
    }

    #[test]
    fn replacing_an_entry_does_not_count_its_bytes_twice() {
        let mut c = EmbeddingCache::new(1 << 20, 60_000);
        for _ in 0..5 {
            c.insert(&[key(1)], vec![vector(100)], 0);
        }
        assert_eq!(c.bytes(), vector(100).cost());
    }
}
