//! `[warm_embeddings]`: warm-up of the filters' embedding cache (`crate::warm_embeddings` and
//! `service::warm_embeddings` run it; docs/embedding-warmup.md).

use serde::{Deserialize, Serialize};

use super::validate::out_of_range;

/// `[warm_embeddings]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmEmbeddingsConfig {
    /// Computes hot entries; off: the filters' reports are still kept (default true).
    pub enabled: bool,
    /// The filters' `embedding_cache.ttl_ms` (default 600,000).
    pub ttl_ms: u64,
    /// An entry is recomputed this long before it expires (default 60,000).
    pub lead_ms: u64,
    /// Hits over the last TTL that make an input hot (default 1).
    pub min_hits: u64,
    /// Computations a second at most (default 20).
    pub calls_per_second: usize,
    /// Computations in flight at most (default 4).
    pub concurrency: usize,
    /// A failed computation is not retried for this long (default 30,000).
    pub backoff_ms: u64,
    /// Entries kept at most (default 100,000).
    pub max_entries: usize,
    /// Bytes of requests and embeddings kept at most (default 64 MiB).
    pub max_bytes: usize,
    /// Bytes of embeddings one `GET /v1/embeddings/warm` reply carries at most (default 1 MiB).
    pub reply_bytes: usize,
}

impl Default for WarmEmbeddingsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl_ms: 600_000,
            lead_ms: 60_000,
            min_hits: 1,
            calls_per_second: 20,
            concurrency: 4,
            backoff_ms: 30_000,
            max_entries: 100_000,
            max_bytes: 64 << 20,
            reply_bytes: 1 << 20,
        }
    }
}

impl WarmEmbeddingsConfig {
    /// Every problem, each naming its field.
    pub fn validate(&self) -> Vec<String> {
        [
            ("ttl_ms", self.ttl_ms, 1_000, 86_400_000),
            ("lead_ms", self.lead_ms, 0, self.ttl_ms.saturating_sub(1)),
            ("min_hits", self.min_hits, 1, 1_000_000),
            ("calls_per_second", self.calls_per_second as u64, 1, 10_000),
            ("concurrency", self.concurrency as u64, 1, 256),
            ("backoff_ms", self.backoff_ms, 0, 3_600_000),
            ("max_entries", self.max_entries as u64, 8, 10_000_000),
            ("max_bytes", self.max_bytes as u64, 1 << 16, 1 << 34),
            ("reply_bytes", self.reply_bytes as u64, 1 << 12, 1 << 24),
        ]
        .into_iter()
        .filter_map(|(field, value, lo, hi)| {
            out_of_range(&format!("warm_embeddings.{field}"), value, lo, hi)
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_every_bad_field_is_named() {
        assert!(WarmEmbeddingsConfig::default().validate().is_empty());
        let bad = WarmEmbeddingsConfig {
            ttl_ms: 10_000,
            lead_ms: 10_000,
            calls_per_second: 0,
            reply_bytes: 1,
            ..WarmEmbeddingsConfig::default()
        };
        let fields: Vec<String> = bad
            .validate()
            .iter()
            .map(|p| p.split(':').next().unwrap_or("").to_string())
            .collect();
        assert_eq!(
            fields,
            [
                "warm_embeddings.lead_ms",
                "warm_embeddings.calls_per_second",
                "warm_embeddings.reply_bytes"
            ]
        );
    }
}
