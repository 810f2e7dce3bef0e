//! The `[hotness]` configuration of the prompt pool.

use serde::{Deserialize, Serialize};

use crate::policy::rules::Problems;

/// The `[hotness]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HotnessConfig {
    /// Multiplier applied to every hotness once per period (default 0.95; in (0, 1]).
    pub decay_factor: f64,
    /// Decay period in milliseconds (default 60,000).
    pub decay_period_ms: u64,
    /// Hotness added per adopted request (default 0.3).
    pub adoption_boost: f64,
    /// Hotness added per successful response (default 0.5).
    pub success_boost: f64,
    /// Hotness a prefill signal adds, scaled by `1 + priority/100` (default 1.0).
    pub signal_boost: f64,
    /// Initial hotness of a template and the floor it never decays below (default 1.0).
    pub template_hotness: f64,
    /// Dynamic entries colder than this are retired (default 0.05).
    pub retire_below: f64,
    /// Maximum dynamic entries; the coldest is evicted beyond (default 100,000).
    pub max_entries: usize,
    /// Maximum templates (default 1,000).
    pub max_templates: usize,
    /// Maximum bytes of prefix text per entry (default 131,072 = 32,768 tokens: the filter's
    /// default `max_prefix_tokens`, so every prefix a default filter signals is accepted).
    pub max_prefix_bytes: usize,
    /// Maximum distinct model and tenant names held (default 10,000).
    pub max_names: usize,
    /// Maximum tags per template (default 16), each at most 64 bytes.
    pub max_tags: usize,
    /// Bound on the pool's memory, bytes (default 268,435,456 = 256 MiB): every entry's text,
    /// block hashes, traffic shape and a fixed per-entry overhead
    /// ([`super::ENTRY_OVERHEAD_BYTES`]). At the
    /// bound a new entry evicts the coldest dynamic entries. The default holds the text of
    /// 64 M tokens (4 bytes a token): the whole KV cache of 256 pods of 262,144 tokens each
    /// (an 8B model on one H100, 16,384 blocks of 16 tokens), so the pool is never what keeps
    /// a fleet of that size from warming what its caches can hold.
    pub max_pool_bytes: usize,
    /// Requests one prefix's feedback may stand for per signal batch (default 1,024). A filter
    /// merges a tick's (1 s) feedback per prefix; a pod runs at most `max_num_seqs` (vLLM: 256
    /// by default) requests at once, so a legitimate count per tick stays far below; the cap
    /// keeps one batch from pushing an entry to the top with a huge count.
    pub max_feedback_count: u32,
}

impl Default for HotnessConfig {
    fn default() -> Self {
        Self {
            decay_factor: 0.95,
            decay_period_ms: 60_000,
            adoption_boost: 0.3,
            success_boost: 0.5,
            signal_boost: 1.0,
            template_hotness: 1.0,
            retire_below: 0.05,
            max_entries: 100_000,
            max_templates: 1_000,
            max_prefix_bytes: 131_072,
            max_names: 10_000,
            max_tags: 16,
            max_pool_bytes: 256 << 20,
            max_feedback_count: 1_024,
        }
    }
}

/// Maximum bytes of one tag.
pub const MAX_TAG_BYTES: usize = 64;

impl HotnessConfig {
    /// Every problem, as `field: value: rule`, each field name preceded by `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Problems::new(prefix);
        p.fraction("decay_factor", self.decay_factor);
        p.between("decay_period_ms", self.decay_period_ms, 1_000, 86_400_000);
        for (name, v) in [
            ("adoption_boost", self.adoption_boost),
            ("success_boost", self.success_boost),
            ("signal_boost", self.signal_boost),
            ("template_hotness", self.template_hotness),
        ] {
            p.check(v > 0.0 && v <= 1e6, name, v, "must be in (0, 1000000]");
        }
        let retire_ok = self.retire_below >= 0.0 && self.retire_below < self.signal_boost;
        p.check(
            retire_ok,
            "retire_below",
            self.retire_below,
            "must be at least 0 and below signal_boost",
        );
        for (name, v, max) in [
            ("max_entries", self.max_entries, 10_000_000),
            ("max_templates", self.max_templates, 100_000),
            ("max_prefix_bytes", self.max_prefix_bytes, 4 << 20),
            ("max_names", self.max_names, 1_000_000),
            ("max_tags", self.max_tags, 256),
        ] {
            p.between(name, v, 1, max);
        }
        p.between("max_pool_bytes", self.max_pool_bytes, 1 << 20, 64 << 30);
        p.between("max_feedback_count", self.max_feedback_count, 1, 1_000_000);
        p.into_vec()
    }
}
