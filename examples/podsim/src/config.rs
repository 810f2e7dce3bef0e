//! The configuration of one simulated pod, with vLLM's defaults, and its validation.

use serde::Serialize;

use crate::profile::LatencyProfile;

/// Which server the pod imitates: its routes, reply shapes, adapter naming and metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM's OpenAI server (default).
    #[default]
    Vllm,
    /// SGLang: `/load_lora_adapter` without `/v1`, JSON replies, `model` as `base:adapter`.
    Sglang,
}

/// How the prompts being prefilled share the pod's compute.
///
/// `Shared` is the physical one: a GPU prefills so many tokens a second whatever the batch, so
/// the uncached tokens of requests admitted together are computed one request after another
/// (in admission order; a request waits in the queue, as vLLM's V1 scheduler keeps a request
/// waiting while the step's token budget is spent on earlier prefills), and a pod that
/// receives more prompt tokens than it can prefill queues them. The fixed first-token cost
/// (`prefill_overhead`) is per batch step, not per request, so it is not serialised.
/// `Unshared` is podsim's older model: every request prefills at the full rate beside any
/// number of others, limited only by `max_num_seqs` and LoRA slots; piling requests onto one
/// pod then costs nothing, which flatters routers that pile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PrefillCompute {
    /// Every request prefills at the profile's full rate (default, podsim's older model).
    #[default]
    Unshared,
    /// One prefill at a time at the profile's rate: contention queues.
    Shared,
}

/// Everything that shapes a pod's behaviour. Times are model time in seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodConfig {
    /// The served model name: what `/v1/models` lists and what `model` must say for the base.
    pub served_model_name: String,
    /// The model path (`root` of the base card).
    pub model_path: String,
    pub engine: Engine,
    /// Context window in tokens (default 8192): prompt plus `max_tokens` may not exceed it.
    pub max_model_len: u64,
    /// Tokens per KV block (default 16).
    pub block_size: usize,
    /// KV blocks on the GPU, including vLLM's reserved null block (default: the default
    /// profile's, 26,624: an 8B model on one H100).
    pub num_gpu_blocks: usize,
    /// Prefix caching on (default true, as in vLLM's v1 engine).
    pub enable_prefix_caching: bool,
    /// Most requests in the running batch (default 256).
    pub max_num_seqs: usize,
    /// Output tokens when a request gives no `max_tokens` (default 16).
    pub default_max_tokens: u64,
    /// LoRA support (default false).
    pub enable_lora: bool,
    /// GPU adapter slots (default 1).
    pub max_loras: usize,
    /// Host-memory adapter cache; defaults to `max_loras`.
    pub max_cpu_loras: usize,
    /// Highest adapter rank accepted (default 16).
    pub max_lora_rank: u32,
    /// Most registered adapters (SGLang's `--max-loaded-loras`); `None` = unbounded (vLLM).
    pub max_loaded_loras: Option<usize>,
    pub latency: LatencyProfile,
    /// How concurrent prefills share the pod's compute (default `Unshared`).
    pub prefill_compute: PrefillCompute,
    /// Relative noise on prefill and decode times: each figure is multiplied by a factor drawn
    /// uniformly from [1 − noise, 1 + noise] (default 0 = deterministic).
    pub noise: f64,
    /// Seed of the noise (default 0).
    pub seed: u64,
}

impl Default for PodConfig {
    fn default() -> Self {
        Self {
            served_model_name: "meta-llama/Llama-3.1-8B-Instruct".into(),
            model_path: "meta-llama/Llama-3.1-8B-Instruct".into(),
            engine: Engine::Vllm,
            max_model_len: 8192,
            block_size: 16,
            num_gpu_blocks: LatencyProfile::default().kv_blocks,
            enable_prefix_caching: true,
            max_num_seqs: 256,
            default_max_tokens: 16,
            enable_lora: false,
            max_loras: 1,
            max_cpu_loras: 1,
            max_lora_rank: 16,
            max_loaded_loras: None,
            latency: LatencyProfile::default(),
            prefill_compute: PrefillCompute::Unshared,
            noise: 0.0,
            seed: 0,
        }
    }
}

impl PodConfig {
    /// Every problem with this configuration, as `field: value: rule`.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, field: &str, value: String, rule: &str| {
            if !ok {
                problems.push(format!("{field}: {value}: {rule}"));
            }
        };
        check(
            !self.served_model_name.is_empty(),
            "served_model_name",
            "\"\"".into(),
            "must not be empty",
        );
        check(
            (1..=1 << 20).contains(&self.max_model_len),
            "max_model_len",
            self.max_model_len.to_string(),
            "must be between 1 and 1048576",
        );
        check(
            [1, 2, 4, 8, 16, 32, 64, 128, 256].contains(&self.block_size),
            "block_size",
            self.block_size.to_string(),
            "must be a power of two between 1 and 256",
        );
        check(
            (2..=1 << 24).contains(&self.num_gpu_blocks),
            "num_gpu_blocks",
            self.num_gpu_blocks.to_string(),
            "must be between 2 and 16777216",
        );
        check(
            (1..=65_536).contains(&self.max_num_seqs),
            "max_num_seqs",
            self.max_num_seqs.to_string(),
            "must be between 1 and 65536",
        );
        check(
            (1..=1 << 20).contains(&self.default_max_tokens),
            "default_max_tokens",
            self.default_max_tokens.to_string(),
            "must be between 1 and 1048576",
        );
        check(
            (1..=4096).contains(&self.max_loras),
            "max_loras",
            self.max_loras.to_string(),
            "must be between 1 and 4096",
        );
        check(
            self.max_cpu_loras >= self.max_loras && self.max_cpu_loras <= 65_536,
            "max_cpu_loras",
            self.max_cpu_loras.to_string(),
            "must be at least max_loras and at most 65536",
        );
        check(
            (1..=4096).contains(&self.max_lora_rank),
            "max_lora_rank",
            self.max_lora_rank.to_string(),
            "must be between 1 and 4096",
        );
        check(
            self.max_loaded_loras != Some(0),
            "max_loaded_loras",
            "0".into(),
            "must be at least 1 when set",
        );
        check(
            (0.0..1.0).contains(&self.noise),
            "noise",
            self.noise.to_string(),
            "must be in [0, 1)",
        );
        let l = &self.latency;
        for (field, v) in [
            ("latency.prefill_overhead", l.prefill_overhead),
            ("latency.per_uncached_token", l.per_uncached_token),
            ("latency.inter_token", l.inter_token),
            ("latency.adapter_load_base", l.adapter_load_base),
            ("latency.adapter_load_per_rank", l.adapter_load_per_rank),
            ("latency.adapter_activation_base", l.adapter_activation_base),
            (
                "latency.adapter_activation_per_rank",
                l.adapter_activation_per_rank,
            ),
        ] {
            check(
                v.is_finite() && (0.0..=3600.0).contains(&v),
                field,
                v.to_string(),
                "must be between 0 and 3600 seconds",
            );
        }
        problems
    }

    /// Bytes of prompt in one KV block (4 bytes a token).
    pub fn block_bytes(&self) -> usize {
        prewarm_core::tokens::token_bytes(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_problems_name_fields() {
        assert!(PodConfig::default().validate().is_empty());
        let bad = PodConfig {
            block_size: 12,
            max_loras: 4,
            max_cpu_loras: 2,
            noise: 2.0,
            ..PodConfig::default()
        };
        let problems = bad.validate();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("block_size: 12:"));
        assert!(problems[1].starts_with("max_cpu_loras: 2:"));
        assert!(problems[2].starts_with("noise: 2:"));
    }
}
