//! Latency profiles: what a forward pass, a prompt token, an output token and a LoRA adapter cost
//! on a given model and GPU. All figures are model time in seconds.
//!
//! The prefill and decode figures are the llm-d simulator's "per-token" profiles that
//! ENGINE-FACTS quotes; the adapter figures follow its LoRA notes (a disk load of tens to hundreds
//! of milliseconds that grows with the adapter's size, i.e. its rank; a host→GPU copy of a few
//! milliseconds).
//!
//! A profile also says how big the model's KV cache is on its GPUs ([`LatencyProfile::kv_blocks`]),
//! derived as vLLM sizes it: the GPU's memory × `gpu_memory_utilization` (default 0.9), less the
//! weights (bf16, 2 bytes a parameter) and the profiled activation peak (≈ 4 GiB at the default
//! `max_num_batched_tokens`), divided by the KV bytes of one token (layers × 2 × KV heads × head
//! dim × 2 bytes), in 16-token blocks:
//!
//! - Llama 3.1 8B on one H100 80 GB (79.2 GiB visible): 71.3 − 15.0 − 4.3 ≈ 52 GiB; a token is
//!   32 × 2 × 8 × 128 × 2 B = 128 KiB; 52 GiB / 128 KiB = 425,984 tokens = 26,624 blocks;
//! - Llama 3.1 70B on 8 × H100 (tensor parallel 8, each GPU holds 1/8 of the weights and of
//!   every token's KV): 71.3 − 16.4 − 4.3 ≈ 50.6 GiB a GPU; a token is 80 × 2 × 8 × 128 × 2 B /
//!   8 = 40 KiB a GPU; 50.6 GiB / 40 KiB ≈ 1.33 M tokens = 82,944 blocks.

use serde::Serialize;

/// The cost model of one pod.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyProfile {
    /// Fixed cost of the first token (one forward pass plus scheduling), seconds.
    pub prefill_overhead: f64,
    /// Cost of each uncached prompt token, seconds.
    pub per_uncached_token: f64,
    /// Time between output tokens, seconds.
    pub inter_token: f64,
    /// Loading an adapter from disk into the host cache (host-cache miss): fixed part, seconds.
    pub adapter_load_base: f64,
    /// Loading an adapter from disk: additional seconds per unit of LoRA rank.
    pub adapter_load_per_rank: f64,
    /// Copying an adapter from the host cache into a GPU slot (slot miss): fixed part, seconds.
    pub adapter_activation_base: f64,
    /// Copying an adapter into a GPU slot: additional seconds per unit of LoRA rank.
    pub adapter_activation_per_rank: f64,
    /// KV blocks (16 tokens each) the model's cache has on these GPUs (module docs).
    pub kv_blocks: usize,
}

impl LatencyProfile {
    /// Llama 3.1 8B on one H100: 30 ms + 250 µs per uncached token, 12 ms between tokens;
    /// adapter load 40 ms + 5 ms/rank (rank 16: 120 ms), activation 2 ms + 0.25 ms/rank.
    pub const LLAMA_8B_H100: Self = Self {
        prefill_overhead: 0.030,
        per_uncached_token: 0.000_250,
        inter_token: 0.012,
        adapter_load_base: 0.040,
        adapter_load_per_rank: 0.005,
        adapter_activation_base: 0.002,
        adapter_activation_per_rank: 0.000_25,
        kv_blocks: 26_624,
    };

    /// Llama 3.1 70B on 8×H100: 80 ms + 500 µs per uncached token, 25 ms between tokens;
    /// adapter load 80 ms + 10 ms/rank (rank 16: 240 ms), activation 4 ms + 0.5 ms/rank.
    pub const LLAMA_70B_8XH100: Self = Self {
        prefill_overhead: 0.080,
        per_uncached_token: 0.000_500,
        inter_token: 0.025,
        adapter_load_base: 0.080,
        adapter_load_per_rank: 0.010,
        adapter_activation_base: 0.004,
        adapter_activation_per_rank: 0.000_5,
        kv_blocks: 82_944,
    };

    /// Names accepted by [`LatencyProfile::named`].
    pub const NAMES: [&'static str; 2] = ["llama-8b-h100", "llama-70b-8xh100"];

    /// The profile called `name`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "llama-8b-h100" => Some(Self::LLAMA_8B_H100),
            "llama-70b-8xh100" => Some(Self::LLAMA_70B_8XH100),
            _ => None,
        }
    }

    /// The profile called `name`; `Err` says which names there are (`"x": must be one of …`),
    /// for the caller to prefix with its flag or field.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::named(name).ok_or_else(|| format!("{name:?}: must be one of {:?}", Self::NAMES))
    }

    /// Prefill time of `uncached` prompt tokens (without adapter costs).
    pub fn prefill(&self, uncached: usize) -> f64 {
        self.prefill_overhead + self.per_uncached_token * uncached as f64
    }

    /// Disk load of an adapter of rank `rank`.
    pub fn adapter_load(&self, rank: u32) -> f64 {
        self.adapter_load_base + self.adapter_load_per_rank * f64::from(rank)
    }

    /// Host→GPU copy of an adapter of rank `rank`.
    pub fn adapter_activation(&self, rank: u32) -> f64 {
        self.adapter_activation_base + self.adapter_activation_per_rank * f64::from(rank)
    }
}

impl Default for LatencyProfile {
    fn default() -> Self {
        Self::LLAMA_8B_H100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_profiles_carry_the_field_figures() {
        let p = LatencyProfile::named("llama-8b-h100").unwrap();
        assert!((p.prefill(1000) - 0.280).abs() < 1e-9);
        let p = LatencyProfile::named("llama-70b-8xh100").unwrap();
        assert!((p.prefill(1000) - 0.580).abs() < 1e-9);
        assert!((p.inter_token - 0.025).abs() < 1e-12);
        assert!(LatencyProfile::named("gpt-5").is_none());
        assert!((LatencyProfile::LLAMA_8B_H100.adapter_load(16) - 0.120).abs() < 1e-9);
    }
}
