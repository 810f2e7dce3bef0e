//! The Embedding cache section of the filter's configuration, the `embedding_cache` table: which
//! models' `/v1/embeddings` responses the filter answers from its cache, for how long, and within
//! how many bytes.

use prewarm_core::wire::MAX_NAME_BYTES;
use serde::Deserialize;

use crate::config::range;

/// Most models one configuration opts in.
pub const MAX_CACHED_MODELS: usize = 1024;

/// The section holding the table: the configuration's sections are flattened into its top
/// level, so the table is the one key of its section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct EmbeddingsConfig {
    /// `embedding_cache`: the cache's models, TTL and bounds (default off).
    #[serde(rename = "embedding_cache")]
    pub cache: EmbeddingCacheConfig,
}

impl EmbeddingsConfig {
    /// This section's problems, as `embedding_cache.field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        self.cache.validate(p);
    }
}

/// `embedding_cache`; off (no model) by default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingCacheConfig {
    /// Models whose embeddings are cached (default none: the cache is off). Per-model opt-in:
    /// only a model whose vectors are deterministic for a given input should be listed.
    pub models: Vec<String>,
    /// How long an entry answers requests after the pod computed it, ms (default 600,000).
    pub ttl_ms: u64,
    /// Bytes of entries one VM (one Envoy worker) holds at most; the least recently used are
    /// evicted beyond (default 16 MiB: about 2,000 384-dimension float vectors).
    pub max_bytes: usize,
    /// Largest pod response the filter reads to store, bytes; larger responses pass and are
    /// not stored (default 1 MiB).
    pub max_response_bytes: usize,
    /// Slots of the proxy's shared level (one shared-data key each, holding one entry; default
    /// 1024; 0: each worker keeps only its own cache).
    pub shared_slots: u32,
    /// Largest entry put in the shared level, bytes (default 64 KiB: a 1,536-dimension float
    /// vector as JSON with room).
    pub max_shared_entry_bytes: usize,
    /// Reports stored inputs and hits to the gateway and writes the entries it keeps warm
    /// (`GET /v1/embeddings/warm`) into the shared level (default true; nothing is sent with
    /// `direct_calls: always`, which has no gateway).
    pub warm_from_gateway: bool,
}

impl Default for EmbeddingCacheConfig {
    fn default() -> Self {
        Self {
            models: Vec::new(),
            ttl_ms: 600_000,
            max_bytes: 16 << 20,
            max_response_bytes: 1 << 20,
            shared_slots: 1024,
            max_shared_entry_bytes: 64 << 10,
            warm_from_gateway: true,
        }
    }
}

impl EmbeddingCacheConfig {
    /// Whether any model is cached.
    pub fn enabled(&self) -> bool {
        !self.models.is_empty()
    }

    /// Whether the gateway hears of the cache and warms it.
    pub fn warmed_by_gateway(&self) -> bool {
        self.enabled() && self.warm_from_gateway
    }

    /// Whether `model`'s embeddings are cached.
    pub fn caches(&self, model: &str) -> bool {
        self.models.iter().any(|m| m == model)
    }

    /// Every problem, as `embedding_cache.field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.models.len() > MAX_CACHED_MODELS {
            p.push(format!(
                "embedding_cache.models: {} models: must be at most {MAX_CACHED_MODELS}",
                self.models.len()
            ));
        }
        for m in &self.models {
            if m.is_empty() || m.len() > MAX_NAME_BYTES {
                p.push(format!(
                    "embedding_cache.models: {m:?}: must be 1 to {MAX_NAME_BYTES} bytes"
                ));
            }
        }
        range(p, "embedding_cache.ttl_ms", self.ttl_ms, 1000, 86_400_000);
        range(
            p,
            "embedding_cache.max_bytes",
            self.max_bytes,
            4096,
            1 << 30,
        );
        range(
            p,
            "embedding_cache.shared_slots",
            self.shared_slots,
            0,
            1 << 16,
        );
        range(
            p,
            "embedding_cache.max_shared_entry_bytes",
            self.max_shared_entry_bytes,
            64,
            4 << 20,
        );
        range(
            p,
            "embedding_cache.max_response_bytes",
            self.max_response_bytes,
            256,
            self.max_bytes.max(256),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_off_and_valid() {
        let c = EmbeddingCacheConfig::default();
        let mut problems = Vec::new();
        c.validate(&mut problems);
        assert!(!c.enabled() && problems.is_empty());
    }

    #[test]
    fn every_bad_field_is_named() {
        let c = EmbeddingCacheConfig {
            models: vec![String::new(), "x".repeat(MAX_NAME_BYTES + 1)],
            ttl_ms: 0,
            max_bytes: 10,
            max_response_bytes: 1 << 20,
            shared_slots: 1024,
            max_shared_entry_bytes: 64 << 10,
            warm_from_gateway: true,
        };
        let mut problems = Vec::new();
        c.validate(&mut problems);
        let problems = problems.join("\n");
        for field in [
            "models: \"\"",
            "models: \"xxx",
            "ttl_ms",
            "max_bytes",
            "max_response_bytes",
        ] {
            assert!(problems.contains(field), "{field} in {problems}");
        }
    }
}
