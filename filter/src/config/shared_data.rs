//! The Shared data section of the filter's configuration: the key prefix and the fixed slot
//! counts of everything the filter keeps in the proxy's shared data, and how hard it retries a
//! compare-and-swap.

use serde::Deserialize;

use super::range;

/// Shared data's keys and slots (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SharedDataConfig {
    /// Prefix of every shared-data key (default `prewarm/`).
    pub shared_prefix: String,
    /// Hashed slots for users' prompt patterns (default 4096).
    pub user_slots: u32,
    /// Hashed slots for hot patterns' rates (default 4096).
    pub pattern_slots: u32,
    /// Hashed slots for adapters' rates (default 1024).
    pub adapter_slots: u32,
    /// Hashed slots for shared prompts' rates, one per routing key (default 4096).
    pub shared_prompt_slots: u32,
    /// Bytes of one VM's tally of shared prompts: their common prefixes' hashes, texts and
    /// shapes (default 4 MiB).
    pub shared_prompt_tally_bytes: usize,
    /// Hashed slots of the prefix index, one shared-data key of 74 bytes each (default 16,384:
    /// about 1.2 MiB of values per Envoy; at most 1,048,576).
    pub prefix_slots: u32,
    /// Age past which a prefix-index entry is ignored, ms (default 1,310,720: a Llama 8B H100
    /// pod's KV capacity over a tenth of its prefill rate; see `docs/routing.md`).
    pub prefix_horizon_ms: u64,
    /// Compare-and-swap attempts per shared-data update before giving up (default 8).
    pub cas_retries: u32,
}

impl Default for SharedDataConfig {
    fn default() -> Self {
        Self {
            shared_prefix: "prewarm/".into(),
            user_slots: 4096,
            pattern_slots: 4096,
            adapter_slots: 1024,
            shared_prompt_slots: 4096,
            shared_prompt_tally_bytes: 4 << 20,
            prefix_slots: prewarm_core::prefix::DEFAULT_SLOTS,
            prefix_horizon_ms: prewarm_core::prefix::DEFAULT_HORIZON_MS,
            cas_retries: 8,
        }
    }
}

impl SharedDataConfig {
    /// This section's problems, as `field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.shared_prefix.is_empty() || self.shared_prefix.len() > 64 {
            p.push(format!(
                "shared_prefix: {:?}: must be 1 to 64 bytes",
                self.shared_prefix
            ));
        }
        for (field, slots) in [
            ("user_slots", self.user_slots),
            ("pattern_slots", self.pattern_slots),
            ("adapter_slots", self.adapter_slots),
            ("shared_prompt_slots", self.shared_prompt_slots),
        ] {
            range(p, field, slots, 1, 1 << 20);
        }
        range(
            p,
            "shared_prompt_tally_bytes",
            self.shared_prompt_tally_bytes,
            64 << 10,
            1 << 30,
        );
        range(
            p,
            "prefix_slots",
            self.prefix_slots,
            1,
            prewarm_core::prefix::MAX_SLOTS,
        );
        range(
            p,
            "prefix_horizon_ms",
            self.prefix_horizon_ms,
            1000,
            86_400_000,
        );
        range(p, "cas_retries", self.cas_retries, 1, 100);
    }
}
