//! The Requests section of the filter's configuration: which requests are inspected, how much
//! of each, and how its prompt is cut into blocks and sketched.

use std::collections::BTreeMap;

use prewarm_core::{Endpoint, FingerprintConfig};
use serde::Deserialize;

use super::range;
use crate::request::stage::Stage;

/// What is inspected of a request (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RequestsConfig {
    /// Request paths inspected, and the OpenAI endpoint each is parsed as (default the three
    /// `/v1/...` paths of prewarm-core).
    pub inference_paths: BTreeMap<String, Endpoint>,
    /// Bodies are inspected only when `content-length` is at most this, bytes (default 1 MiB).
    pub max_body_bytes: usize,
    /// Leading tokens fingerprinted and sketched per request (default 32768).
    pub max_prefix_tokens: usize,
    /// Tokens per fingerprint block; must equal the gateway's to route (default 64).
    pub block_tokens: usize,
    /// Hashes in a prompt's similarity sketch (default 64).
    pub sketch_size: usize,
    /// For `make bench-filter`'s stage ladder only: inspect each request up to this stage and
    /// let it go on unrouted (default none: the whole path). See `request::stage`.
    pub bench_stop_after: Option<Stage>,
}

impl Default for RequestsConfig {
    fn default() -> Self {
        let fingerprint = FingerprintConfig::default();
        Self {
            inference_paths: [
                Endpoint::Completions,
                Endpoint::ChatCompletions,
                Endpoint::Embeddings,
            ]
            .into_iter()
            .map(|e| (e.path().to_string(), e))
            .collect(),
            max_body_bytes: 1 << 20,
            max_prefix_tokens: fingerprint.max_prefix_tokens,
            block_tokens: fingerprint.block_tokens,
            sketch_size: prewarm_core::similarity::DEFAULT_SKETCH_SIZE,
            bench_stop_after: None,
        }
    }
}

impl RequestsConfig {
    /// How prompts are cut into blocks.
    pub fn fingerprint(&self) -> FingerprintConfig {
        FingerprintConfig {
            block_tokens: self.block_tokens,
            max_prefix_tokens: self.max_prefix_tokens,
        }
    }

    /// The endpoint a request path is parsed as, ignoring any query string.
    pub fn endpoint_of(&self, path: &str) -> Option<Endpoint> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        self.inference_paths.get(path).copied()
    }

    /// This section's problems, as `field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        p.extend(self.fingerprint().validate());
        if self.inference_paths.is_empty() {
            p.push("inference_paths: {}: must name at least one path".into());
        }
        for path in self.inference_paths.keys() {
            if !path.starts_with('/') || path.contains(['?', '#']) {
                p.push(format!(
                    "inference_paths: {path:?}: must be a path starting with / without query"
                ));
            }
        }
        range(p, "max_body_bytes", self.max_body_bytes, 1, 16 << 20);
        range(p, "sketch_size", self.sketch_size, 1, 1024);
    }
}
