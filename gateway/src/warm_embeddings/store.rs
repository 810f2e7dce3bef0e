//! The gateway's store of embedding-cache entries worth keeping warm (module doc of
//! [`super`]): one entry per input key the filters reported, with the request that recomputes
//! it, its hits over the last TTL, and — once the gateway computed it on a pod — the pod's
//! embedding and its expiry. Every computed entry gets the next generation, so a filter asks
//! only for what changed since its last poll ([`WarmStore::since`]).
//!
//! Invariants: at most `max_entries` entries and about `max_bytes` of requests and
//! embeddings (the coldest eighth is dropped when either is passed); an entry's generation is
//! unique and grows with every computation; the generation index holds exactly the computed
//! entries (a poll is a range read of it, not a scan of the store).

use std::collections::{BTreeMap, HashMap};

use prewarm_core::rate::RateWindow;
use prewarm_core::wire::{EmbeddingSeen, WarmEmbedding, WarmEmbeddings, WIRE_VERSION};
use serde::{Deserialize, Serialize};

use super::WarmEmbeddingsConfig;

/// One input the filters reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub model: String,
    /// The input as a request of its own (what recomputes it).
    pub request: String,
    /// The pod's `embedding` (raw JSON), once computed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<String>,
    #[serde(default)]
    pub prompt_tokens: u64,
    /// When the computed embedding expires in the filters' caches (0: not computed).
    #[serde(default)]
    pub expires_ms: u64,
    /// Requests the filters answered from their caches, over the last TTL.
    pub hits: RateWindow,
    pub last_seen_ms: u64,
    /// The generation of its last computation (0: none).
    #[serde(default)]
    pub generation: u64,
    /// No computation before this (a failed one backs off).
    #[serde(default)]
    pub retry_after_ms: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.request.len() + self.embedding.as_ref().map_or(0, String::len) + 200
    }
}

/// A computation to run: recompute `key` with `request` on a pod serving `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub key: String,
    pub model: String,
    pub request: String,
}

/// What a batch of records did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    pub added: u64,
    pub hits: u64,
    /// Unusable records (`EmbeddingSeen::problem`), or hits for a key never reported.
    pub ignored: u64,
    pub evicted: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmStore {
    entries: HashMap<String, Entry>,
    generation: u64,
    #[serde(skip)]
    bytes: usize,
    /// Computed entries by generation, so a poll reads only what is newer than its `after`.
    #[serde(skip)]
    by_generation: BTreeMap<u64, String>,
}

impl WarmStore {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The store after a restore: its byte count recomputed, then held to `config`'s bounds.
    pub fn restored(mut self, config: &WarmEmbeddingsConfig) -> Self {
        self.reindex();
        self.evict_if_full(config);
        self
    }

    /// The byte count and the generation index, from the entries.
    fn reindex(&mut self) {
        self.bytes = self.entries.values().map(Entry::bytes).sum();
        self.by_generation = self
            .entries
            .iter()
            .filter(|(_, e)| e.generation > 0)
            .map(|(k, e)| (e.generation, k.clone()))
            .collect();
    }

    /// Folds a batch's records in at `now_ms`.
    pub fn seen(
        &mut self,
        records: &[EmbeddingSeen],
        now_ms: u64,
        config: &WarmEmbeddingsConfig,
    ) -> Seen {
        let mut seen = Seen::default();
        for r in records {
            if r.problem().is_some() {
                seen.ignored += 1;
                continue;
            }
            if let Some(e) = self.entries.get_mut(&r.key) {
                e.last_seen_ms = now_ms;
                if r.hits > 0 {
                    e.hits.record(now_ms, r.hits);
                    seen.hits += u64::from(r.hits);
                }
                continue;
            }
            let Some(request) = &r.request else {
                seen.ignored += 1;
                continue;
            };
            let mut hits = RateWindow::new(config.ttl_ms);
            hits.record(now_ms, r.hits);
            let entry = Entry {
                model: r.model.clone(),
                request: request.clone(),
                embedding: None,
                prompt_tokens: 0,
                expires_ms: 0,
                hits,
                last_seen_ms: now_ms,
                generation: 0,
                retry_after_ms: 0,
            };
            self.bytes += entry.bytes();
            self.entries.insert(r.key.clone(), entry);
            seen.added += 1;
            seen.hits += u64::from(r.hits);
        }
        seen.evicted = self.evict_if_full(config);
        seen
    }

    /// Whether `e` is hot at `now_ms`: at least `min_hits` hits over the last TTL.
    fn hot(e: &Entry, now_ms: u64, config: &WarmEmbeddingsConfig) -> bool {
        e.hits.count(now_ms) >= config.min_hits
    }

    /// The hot entries to compute now, hottest first, at most `limit`: never computed here, or
    /// expiring within `lead_ms`.
    pub fn due(&self, now_ms: u64, config: &WarmEmbeddingsConfig, limit: usize) -> Vec<Due> {
        let mut due: Vec<(&String, &Entry)> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.retry_after_ms <= now_ms
                    && Self::hot(e, now_ms, config)
                    && (e.embedding.is_none()
                        || e.expires_ms <= now_ms.saturating_add(config.lead_ms))
            })
            .collect();
        due.sort_by(|a, b| {
            b.1.hits
                .count(now_ms)
                .cmp(&a.1.hits.count(now_ms))
                .then_with(|| a.0.cmp(b.0))
        });
        due.into_iter()
            .take(limit)
            .map(|(k, e)| Due {
                key: k.clone(),
                model: e.model.clone(),
                request: e.request.clone(),
            })
            .collect()
    }

    /// `key` was computed at `now_ms`: its embedding is fresh for a TTL, under a new generation.
    pub fn computed(
        &mut self,
        key: &str,
        embedding: String,
        prompt_tokens: u64,
        now_ms: u64,
        config: &WarmEmbeddingsConfig,
    ) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        self.bytes = self.bytes.saturating_sub(e.bytes());
        e.embedding = Some(embedding);
        e.prompt_tokens = prompt_tokens;
        e.expires_ms = now_ms.saturating_add(config.ttl_ms);
        self.generation += 1;
        self.by_generation.remove(&e.generation);
        e.generation = self.generation;
        self.by_generation.insert(e.generation, key.to_string());
        e.retry_after_ms = 0;
        self.bytes += e.bytes();
    }

    /// `key`'s computation failed at `now_ms`: no new try for `backoff_ms`.
    pub fn failed(&mut self, key: &str, now_ms: u64, backoff_ms: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            e.retry_after_ms = now_ms.saturating_add(backoff_ms);
        }
    }

    /// The computed, unexpired entries with a generation above `after`, oldest generation
    /// first, as many as fit `max_bytes` of embeddings (at least one). An `after` above the
    /// store's generation (a filter older than a store that lost its snapshot) counts as 0.
    pub fn since(&self, after: u64, now_ms: u64, max_bytes: usize) -> WarmEmbeddings {
        let after = if after > self.generation { 0 } else { after };
        let newer = self
            .by_generation
            .range(after + 1..)
            .filter_map(|(_, k)| Some((k, self.entries.get(k)?)))
            .filter(|(_, e)| e.expires_ms > now_ms)
            .filter_map(|(k, e)| Some((k, e, e.embedding.as_ref()?)));
        let mut doc = WarmEmbeddings {
            version: WIRE_VERSION.to_string(),
            generation: self.generation,
            more: false,
            entries: Vec::new(),
        };
        let mut bytes = 0usize;
        let mut last = after;
        for (key, e, embedding) in newer {
            let cost = embedding.len() + key.len() + 64;
            if !doc.entries.is_empty() && bytes + cost > max_bytes {
                doc.more = true;
                doc.generation = last;
                break;
            }
            bytes += cost;
            last = e.generation;
            doc.entries.push(WarmEmbedding {
                key: key.clone(),
                expires_ms: e.expires_ms,
                prompt_tokens: e.prompt_tokens,
                embedding: embedding.clone(),
            });
        }
        doc
    }

    /// Drops entries that are cold and no longer fresh anywhere: no hit over the last TTL, not
    /// seen over the last TTL, and (when computed) expired.
    pub fn expire(&mut self, now_ms: u64, config: &WarmEmbeddingsConfig) -> usize {
        let before = self.entries.len();
        let horizon = now_ms.saturating_sub(config.ttl_ms);
        self.entries.retain(|_, e| {
            e.hits.count(now_ms) > 0 || e.last_seen_ms > horizon || e.expires_ms > now_ms
        });
        if self.entries.len() != before {
            self.reindex();
        }
        before - self.entries.len()
    }

    /// Above a bound, drops the coldest eighth (fewest hits, then least recently seen).
    fn evict_if_full(&mut self, config: &WarmEmbeddingsConfig) -> u64 {
        if self.entries.len() <= config.max_entries && self.bytes <= config.max_bytes {
            return 0;
        }
        let now = self
            .entries
            .values()
            .map(|e| e.last_seen_ms)
            .max()
            .unwrap_or(0);
        let mut order: Vec<(u64, u64, String)> = self
            .entries
            .iter()
            .map(|(k, e)| (e.hits.count(now), e.last_seen_ms, k.clone()))
            .collect();
        order.sort();
        let mut dropped = 0u64;
        let target_entries = config.max_entries - config.max_entries / 8;
        let target_bytes = config.max_bytes - config.max_bytes / 8;
        for (_, _, key) in order {
            if self.entries.len() <= target_entries && self.bytes <= target_bytes {
                break;
            }
            if let Some(e) = self.entries.remove(&key) {
                self.bytes = self.bytes.saturating_sub(e.bytes());
                self.by_generation.remove(&e.generation);
                dropped += 1;
            }
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::embed_cache::{key_hex, request_keys};

    fn config() -> WarmEmbeddingsConfig {
        WarmEmbeddingsConfig {
            ttl_ms: 600_000,
            lead_ms: 60_000,
            min_hits: 1,
            max_entries: 16,
            max_bytes: 1 << 20,
            ..WarmEmbeddingsConfig::default()
        }
    }

    fn seen(text: &str, request: bool, hits: u32) -> EmbeddingSeen {
        let body = serde_json::json!({"model": "m", "input": text}).to_string();
        let key = request_keys(body.as_bytes()).unwrap().keys[0];
        EmbeddingSeen {
            model: "m".into(),
            key: key_hex(&key),
            request: request.then_some(body),
            hits,
        }
    }

    #[test]
    fn an_entry_is_due_once_hit_and_again_only_near_its_expiry() {
        let c = config();
        let mut s = WarmStore::default();
        let got = s.seen(&[seen("a", true, 0)], 1_000, &c);
        assert_eq!((got.added, got.hits), (1, 0));
        assert!(
            s.due(1_000, &c, 10).is_empty(),
            "stored once, never hit: cold"
        );
        s.seen(&[seen("a", false, 2)], 2_000, &c);
        let due = s.due(2_000, &c, 10);
        assert_eq!(due.len(), 1);
        s.computed(&due[0].key, "[1,2]".into(), 3, 2_000, &c);
        assert!(s.due(2_000 + 600_000 - 60_001, &c, 10).is_empty());
        // still hit within the last TTL, now within the lead of its expiry
        s.seen(&[seen("a", false, 1)], 500_000, &c);
        assert_eq!(s.due(2_000 + 600_000 - 60_000, &c, 10).len(), 1);
    }

    #[test]
    fn a_cold_entry_is_not_refreshed_and_is_dropped_once_expired() {
        let c = config();
        let mut s = WarmStore::default();
        s.seen(&[seen("a", true, 1)], 0, &c);
        let key = s.due(0, &c, 1)[0].key.clone();
        s.computed(&key, "[1]".into(), 1, 0, &c);
        // no hit for a TTL: not refreshed
        assert!(s.due(600_000, &c, 10).is_empty());
        assert_eq!(s.expire(599_999, &c), 0, "fresh in the filters still");
        assert_eq!(s.expire(600_001, &c), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn a_filter_gets_only_what_is_newer_than_its_generation_in_bounded_replies() {
        let c = config();
        let mut s = WarmStore::default();
        for (i, t) in ["a", "b", "c"].iter().enumerate() {
            s.seen(&[seen(t, true, 1)], 0, &c);
            let k = key_hex(
                &request_keys(
                    serde_json::json!({"model": "m", "input": t})
                        .to_string()
                        .as_bytes(),
                )
                .unwrap()
                .keys[0],
            );
            s.computed(&k, format!("[{i}]"), 1, 10, &c);
        }
        let all = s.since(0, 20, 1 << 20);
        assert_eq!((all.entries.len(), all.generation, all.more), (3, 3, false));
        let first = s.since(0, 20, 1);
        assert_eq!(
            (first.entries.len(), first.generation, first.more),
            (1, 1, true)
        );
        let rest = s.since(first.generation, 20, 1 << 20);
        assert_eq!(rest.entries.len(), 2);
        assert!(s.since(3, 20, 1 << 20).entries.is_empty());
        assert_eq!(s.since(3, 20, 1 << 20).generation, 3);
        assert!(s.since(0, 600_011, 1 << 20).entries.is_empty(), "expired");
    }

    #[test]
    fn bad_records_and_hits_of_unknown_keys_are_ignored() {
        let c = config();
        let mut s = WarmStore::default();
        let mut wrong_key = seen("a", true, 0);
        wrong_key.key = key_hex(&[7; 32]);
        let mut wrong_model = seen("a", true, 0);
        wrong_model.model = "other".into();
        let got = s.seen(&[wrong_key, wrong_model, seen("b", false, 4)], 0, &c);
        assert_eq!((got.added, got.ignored), (0, 3));
    }

    #[test]
    fn the_store_is_bounded_and_keeps_the_hottest() {
        let c = config();
        let mut s = WarmStore::default();
        s.seen(&[seen("hot", true, 50)], 0, &c);
        for i in 0..40 {
            s.seen(&[seen(&format!("cold {i}"), true, 0)], i + 1, &c);
        }
        assert!(s.len() <= c.max_entries, "{}", s.len());
        let hot = seen("hot", false, 0).key;
        assert!(s.get(&hot).is_some());
        // computed entries stay indexed through evictions and a restore
        let due = s.due(100, &c, 1);
        s.computed(&due[0].key, "[1]".into(), 1, 100, &c);
        for i in 0..40 {
            s.seen(&[seen(&format!("later {i}"), true, 0)], 200 + i, &c);
        }
        assert_eq!(s.since(0, 300, 1 << 20).entries.len(), 1);
        let restored: WarmStore =
            serde_json::from_str::<WarmStore>(&serde_json::to_string(&s).unwrap())
                .unwrap()
                .restored(&c);
        assert_eq!(restored.since(0, 300, 1 << 20), s.since(0, 300, 1 << 20));
        assert_eq!(restored.bytes(), s.bytes());
    }
}
