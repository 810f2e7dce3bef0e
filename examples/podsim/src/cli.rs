//! The command line, in the style of `vllm serve`, and its translation into a
//! [`ServerConfig`]. Every flag is documented in docs/podsim.md.

use std::sync::Arc;

use clap::Parser;

use crate::chat::{ChatTemplate, ContentFormatArg};
use crate::config::{Engine, PodConfig, PrefillCompute};
use crate::profile::LatencyProfile;
use crate::server::errors::ErrorFormat;
use crate::server::fleet::{pod_addrs, MAX_PODS};
use crate::server::kv_events::KvEventsConfig;
use crate::server::ServerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    Vllm,
    Sglang,
}

/// podsim: a simulated vLLM (or SGLang) inference pod with a prefix cache, LoRA slots and a
/// latency model. All reported latencies are model time; `--time-scale` only shortens waits.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "podsim",
    version,
    after_help = "Environment:\n  VLLM_ALLOW_RUNTIME_LORA_UPDATING  1 or true: serve /v1/load_lora_adapter and \
                  /v1/unload_lora_adapter (vLLM engine, with --enable-lora); otherwise they are 404.\n\n\
                  Prints `podsim listening on http://ADDR` once bound (one line a pod, once all are bound); exits 64 on bad flags; \
                  SIGTERM or Ctrl-C drains in-flight replies for --shutdown-grace-seconds."
)]
pub struct Args {
    /// The model path (`root` of the base model card).
    #[arg(default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,
    /// The name clients use in `model`; defaults to MODEL.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind; 0 picks a free one (printed in the readiness line). With `--pods N`, the
    /// first of N consecutive ports (0: N free ones).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Pods served by this process, 1..=4096, each with its own cache, adapter slots, metrics
    /// and model clock, as that many podsim processes would be; one readiness line each.
    #[arg(long, default_value_t = 1)]
    pub pods: usize,
    /// Which server to imitate: routes, reply shapes, adapter naming, metric names.
    #[arg(long, value_enum, default_value = "vllm")]
    pub engine: EngineArg,
    /// Latency profile: llama-8b-h100 or llama-70b-8xh100.
    #[arg(long, default_value = "llama-8b-h100")]
    pub profile: String,
    /// Override the profile's fixed first-token cost, milliseconds.
    #[arg(long)]
    pub prefill_overhead_ms: Option<f64>,
    /// Override the profile's cost per uncached prompt token, microseconds.
    #[arg(long)]
    pub per_token_us: Option<f64>,
    /// Override the profile's time between output tokens, milliseconds.
    #[arg(long)]
    pub inter_token_ms: Option<f64>,
    /// Override the fixed part of an adapter's disk load (host-cache miss), milliseconds.
    #[arg(long)]
    pub adapter_load_ms: Option<f64>,
    /// Override the fixed part of an adapter's host→GPU copy (slot miss), milliseconds.
    #[arg(long)]
    pub adapter_activation_ms: Option<f64>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV blocks on the GPU (including the reserved null block); default: what `--profile`'s
    /// model has on its GPUs (26,624 for `llama-8b-h100`, derived in `profile.rs`).
    #[arg(long, alias = "num-gpu-blocks-override")]
    pub num_gpu_blocks: Option<usize>,
    /// Turn the prefix cache off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Context window: prompt plus max_tokens, in tokens.
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: u64,
    /// Most requests in the running batch; more wait.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Output tokens when a request gives no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: u64,
    /// Serve LoRA adapters.
    #[arg(long)]
    pub enable_lora: bool,
    /// GPU adapter slots.
    #[arg(long, default_value_t = 1)]
    pub max_loras: usize,
    /// Host-memory adapter cache; defaults to --max-loras.
    #[arg(long)]
    pub max_cpu_loras: Option<usize>,
    /// Highest adapter rank accepted.
    #[arg(long, default_value_t = 16)]
    pub max_lora_rank: u32,
    /// Cap on registered adapters (SGLang's --max-loaded-loras); unbounded when absent.
    #[arg(long)]
    pub max_loaded_loras: Option<usize>,
    /// Adapters registered at start, as NAME=PATH (PATH holds adapter_config.json).
    #[arg(long, num_args = 1..)]
    pub lora_modules: Vec<String>,
    /// Return usage.prompt_tokens_details.cached_tokens.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// Error body format: nested (vLLM ≥ 0.10.1) or flat (older).
    #[arg(long, value_enum, default_value = "nested")]
    pub error_format: ErrorFormat,
    /// Model seconds per real second: waits are divided by it, reported figures are not.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// How concurrent prefills share the pod's compute: unshared (each at the full rate) or
    /// shared (one after another at the profile's rate: a piled pod queues).
    #[arg(long, value_enum, default_value = "unshared")]
    pub prefill_compute: PrefillCompute,
    /// Relative noise on prefill and decode times, in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub noise: f64,
    /// Seed of the noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Components of a `/v1/embeddings` vector (all-MiniLM-L6-v2's 384 by default).
    #[arg(long, default_value_t = 384)]
    pub embedding_dim: usize,
    /// The chat template: a file, or the template text itself. Default: MODEL's folder
    /// (`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`) when MODEL is a
    /// local folder, else the built-in Llama 3.1 template.
    #[arg(long)]
    pub chat_template: Option<String>,
    /// How message content reaches the template: auto (detected), string or openai (parts).
    #[arg(long, value_enum, default_value = "auto")]
    pub chat_template_content_format: ContentFormatArg,
    /// KV-cache events as vLLM's flag takes them, e.g.
    /// `{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557"}` (ZeroMQ PUB; with
    /// `--pods N` pod i binds the port + i).
    #[arg(long)]
    pub kv_events_config: Option<String>,
    /// Seconds to let in-flight replies finish after SIGTERM.
    #[arg(long, default_value_t = 5.0)]
    pub shutdown_grace_seconds: f64,
}

/// An adapter named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

impl Args {
    /// The server configuration, or every problem as `flag: value: rule`.
    pub fn server_config(&self, allow_runtime_lora: bool) -> Result<ServerConfig, Vec<String>> {
        let mut problems = Vec::new();
        let mut latency = LatencyProfile::named(&self.profile).unwrap_or_else(|| {
            problems.push(format!(
                "--profile: {}: must be one of {}",
                self.profile,
                LatencyProfile::NAMES.join(", ")
            ));
            LatencyProfile::default()
        });
        let overrides = [
            (
                "--prefill-overhead-ms",
                self.prefill_overhead_ms,
                1e-3,
                &mut latency.prefill_overhead,
            ),
            (
                "--per-token-us",
                self.per_token_us,
                1e-6,
                &mut latency.per_uncached_token,
            ),
            (
                "--inter-token-ms",
                self.inter_token_ms,
                1e-3,
                &mut latency.inter_token,
            ),
            (
                "--adapter-load-ms",
                self.adapter_load_ms,
                1e-3,
                &mut latency.adapter_load_base,
            ),
            (
                "--adapter-activation-ms",
                self.adapter_activation_ms,
                1e-3,
                &mut latency.adapter_activation_base,
            ),
        ];
        for (flag, value, unit, field) in overrides {
            let Some(v) = value else { continue };
            if v.is_finite() && v >= 0.0 && v * unit <= 3600.0 {
                *field = v * unit;
            } else {
                problems.push(format!("{flag}: {v}: must be between 0 and one hour"));
            }
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0 && self.time_scale <= 1e6) {
            problems.push(format!(
                "--time-scale: {}: must be in (0, 1000000]",
                self.time_scale
            ));
        }
        if !(self.shutdown_grace_seconds.is_finite() && self.shutdown_grace_seconds >= 0.0) {
            problems.push(format!(
                "--shutdown-grace-seconds: {}: must be ≥ 0",
                self.shutdown_grace_seconds
            ));
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > 1 << 30 {
            problems.push(format!(
                "--max-body-bytes: {}: must be between 1 and 1073741824",
                self.max_body_bytes
            ));
        }
        if self.embedding_dim == 0 || self.embedding_dim > 16_384 {
            problems.push(format!(
                "--embedding-dim: {}: must be between 1 and 16384",
                self.embedding_dim
            ));
        }
        if let Err(e) = self.lora_modules() {
            problems.push(e);
        }
        let chat_template = ChatTemplate::load(
            self.chat_template.as_deref(),
            &self.model,
            self.chat_template_content_format,
        )
        .map_err(|e| problems.push(e))
        .ok();
        let kv_events = match self
            .kv_events_config
            .as_deref()
            .map(KvEventsConfig::from_flag)
        {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                problems.push(e);
                None
            }
            None => None,
        };
        let pod = PodConfig {
            served_model_name: self
                .served_model_name
                .clone()
                .unwrap_or_else(|| self.model.clone()),
            model_path: self.model.clone(),
            engine: match self.engine {
                EngineArg::Vllm => Engine::Vllm,
                EngineArg::Sglang => Engine::Sglang,
            },
            max_model_len: self.max_model_len,
            block_size: self.block_size,
            num_gpu_blocks: self.num_gpu_blocks.unwrap_or(latency.kv_blocks),
            enable_prefix_caching: !self.no_enable_prefix_caching,
            max_num_seqs: self.max_num_seqs,
            default_max_tokens: self.default_max_tokens,
            enable_lora: self.enable_lora,
            max_loras: self.max_loras,
            max_cpu_loras: self.max_cpu_loras.unwrap_or(self.max_loras),
            max_lora_rank: self.max_lora_rank,
            max_loaded_loras: self.max_loaded_loras,
            latency,
            prefill_compute: self.prefill_compute,
            noise: self.noise,
            seed: self.seed,
        };
        problems.extend(pod.validate().into_iter().map(|p| flag_problem(&p)));
        let Some(chat_template) = chat_template.filter(|_| problems.is_empty()) else {
            return Err(problems);
        };
        Ok(ServerConfig {
            pod,
            time_scale: self.time_scale,
            allow_runtime_lora_updating: allow_runtime_lora,
            error_format: self.error_format,
            enable_prompt_tokens_details: self.enable_prompt_tokens_details,
            max_body_bytes: self.max_body_bytes,
            embedding_dim: self.embedding_dim,
            chat_template: Arc::new(chat_template),
            kv_events,
            dev_mode: false,
        })
    }

    /// The address of each pod (`--host`, `--port`, `--pods`), or the problem naming its flag.
    pub fn listen_addrs(&self) -> Result<Vec<String>, String> {
        if self.pods == 0 || self.pods > MAX_PODS {
            return Err(format!(
                "--pods: {}: must be between 1 and {MAX_PODS}",
                self.pods
            ));
        }
        pod_addrs(&self.host, self.port, self.pods).ok_or_else(|| {
            format!(
                "--pods: {}: ports {}.. of --port {} pass 65535",
                self.pods, self.port, self.port
            )
        })
    }

    /// `--lora-modules` parsed.
    pub fn lora_modules(&self) -> Result<Vec<LoraModule>, String> {
        self.lora_modules
            .iter()
            .map(|m| match m.split_once('=') {
                Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok(LoraModule {
                    name: name.to_string(),
                    path: path.to_string(),
                }),
                _ => Err(format!("--lora-modules: {m}: must be NAME=PATH")),
            })
            .collect()
    }
}

/// A `PodConfig` problem (`field: value: rule`) named by its flag (`--field: value: rule`).
fn flag_problem(problem: &str) -> String {
    match problem.split_once(':') {
        Some((field, rest)) => {
            let field = field.strip_prefix("latency.").unwrap_or(field);
            format!("--{}:{rest}", field.replace('_', "-"))
        }
        None => problem.to_string(),
    }
}

/// vLLM's reading of a boolean environment variable (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`,
/// `VLLM_SERVER_DEV_MODE`): "1" or "true", any case.
pub fn vllm_env_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_lora_flag_reads_like_vllm() {
        for (v, want) in [
            (Some("1"), true),
            (Some("True"), true),
            (Some(" true "), true),
            (Some("0"), false),
            (Some("yes"), false),
            (None, false),
        ] {
            assert_eq!(vllm_env_flag(v), want, "{v:?}");
        }
    }

    #[test]
    fn pods_and_port_become_one_address_a_pod_or_a_problem_naming_the_flag() {
        let addrs =
            |flags: &[&str]| Args::parse_from(["podsim"].iter().chain(flags.iter())).listen_addrs();
        assert_eq!(addrs(&[]).unwrap(), ["127.0.0.1:8000"]);
        assert_eq!(
            addrs(&["--port", "0", "--pods", "2"]).unwrap(),
            ["127.0.0.1:0", "127.0.0.1:0"]
        );
        assert_eq!(
            addrs(&["--port", "65534", "--pods", "2"]).unwrap(),
            ["127.0.0.1:65534", "127.0.0.1:65535"]
        );
        for (flags, problem) in [
            (
                &["--pods", "0"][..],
                "--pods: 0: must be between 1 and 4096",
            ),
            (
                &["--pods", "4097"],
                "--pods: 4097: must be between 1 and 4096",
            ),
            (
                &["--port", "65535", "--pods", "2"],
                "--pods: 2: ports 65535.. of --port 65535 pass 65535",
            ),
        ] {
            assert_eq!(addrs(flags).unwrap_err(), problem, "{flags:?}");
        }
    }

    #[test]
    fn flags_become_a_validated_config() {
        let args = Args::parse_from([
            "podsim",
            "--served-model-name",
            "m",
            "--max-loras",
            "2",
            "--inter-token-ms",
            "5",
            "--lora-modules",
            "a=/x",
            "b=/y",
        ]);
        let c = args.server_config(true).unwrap();
        assert_eq!(c.pod.served_model_name, "m");
        assert_eq!(c.pod.max_cpu_loras, 2);
        assert!((c.pod.latency.inter_token - 0.005).abs() < 1e-12);
        assert_eq!(args.lora_modules().unwrap().len(), 2);
        let bad = Args::parse_from(["podsim", "--lora-modules", "noequals", "--time-scale", "0"]);
        let problems = bad.server_config(false).unwrap_err();
        assert!(problems.iter().any(|p| p.starts_with("--time-scale: 0:")));
        assert!(problems
            .iter()
            .any(|p| p.starts_with("--lora-modules: noequals:")));
    }
}
