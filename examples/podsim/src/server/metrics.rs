//! `/metrics`: the pod's figures under vLLM's names, labels, types and buckets (or SGLang's
//! names with `--engine sglang`), encoded by prometheus-client.
//!
//! Gauges are set from a [`PodMetrics`] snapshot at scrape time; the pod's cumulative counters
//! are carried over as increments; histograms are observed per admitted request (its figures
//! are all known at admission, in model time). `vllm:lora_requests_info` is vLLM's odd gauge:
//! one series per (max_lora, running, waiting) combination ever seen, each holding the unix time
//! it was last current.
//!
//! Like vLLM's API server (one API server: prometheus_client's default registry, whose process
//! collector it keeps), the vLLM dialect exports `process_start_time_seconds`, the unix time the
//! process started, in the collector's 1/100 s resolution: a restarted pod shows a new one.
//! SGLang serves its metrics from a multiprocess registry, which has no process metrics.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::config::{Engine, PodConfig};
use crate::pod::{Admission, PodMetrics};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// vLLM's `vllm:time_to_first_token_seconds` buckets.
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's `vllm:e2e_request_latency_seconds` buckets.
pub const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The metric families of one pod.
pub struct PodExporter {
    registry: Registry,
    base: Labels,
    max_loras: usize,
    lora_enabled: bool,
    running: Family<Labels, Gauge>,
    waiting: Family<Labels, Gauge>,
    kv_usage: Family<Labels, FloatGauge>,
    prefix_queries: Family<Labels, Counter>,
    prefix_hits: Family<Labels, Counter>,
    prompt_tokens: Family<Labels, Counter>,
    generation_tokens: Family<Labels, Counter>,
    success: Family<Labels, Counter>,
    ttft: Family<Labels, Histogram>,
    itl: Family<Labels, Histogram>,
    e2e: Family<Labels, Histogram>,
    cache_config: Family<Labels, Gauge>,
    lora_info: Family<Labels, FloatGauge>,
    cache_hit_rate: Family<Labels, FloatGauge>,
    process_start: FloatGauge,
}

/// The unix time this process started, seconds, at the 1/100 s resolution of
/// `/proc/<pid>/stat` (what prometheus_client reads): taken once, by the first exporter.
pub fn process_start_time_seconds() -> f64 {
    static START: OnceLock<f64> = OnceLock::new();
    *START.get_or_init(|| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        (now * 100.0).floor() / 100.0
    })
}

fn python_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

impl PodExporter {
    pub fn new(config: &PodConfig) -> Self {
        let base: Labels = vec![
            ("model_name".into(), config.served_model_name.clone()),
            ("engine".into(), "0".into()),
        ];
        let ttft = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(TTFT_BUCKETS.iter().copied())
        });
        let itl = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(ITL_BUCKETS.iter().copied())
        });
        let e2e = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(E2E_BUCKETS.iter().copied())
        });
        let mut exporter = Self {
            registry: Registry::default(),
            base,
            max_loras: config.max_loras,
            lora_enabled: config.enable_lora,
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            ttft,
            itl,
            e2e,
            cache_config: Family::default(),
            lora_info: Family::default(),
            cache_hit_rate: Family::default(),
            process_start: FloatGauge::default(),
        };
        match config.engine {
            Engine::Vllm => exporter.register_vllm(config),
            Engine::Sglang => exporter.register_sglang(),
        }
        exporter
    }

    fn register_vllm(&mut self, config: &PodConfig) {
        self.process_start.set(process_start_time_seconds());
        let r = &mut self.registry;
        r.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            self.process_start.clone(),
        );
        r.register(
            "vllm:num_requests_running",
            "Number of requests in model execution batches",
            self.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed",
            self.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage",
            self.kv_usage.clone(),
        );
        r.register(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens",
            self.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens",
            self.prefix_hits.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed",
            self.prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Number of generation tokens processed",
            self.generation_tokens.clone(),
        );
        r.register(
            "vllm:request_success",
            "Count of successfully processed requests",
            self.success.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            self.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds",
            self.itl.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds",
            self.e2e.clone(),
        );
        r.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            self.cache_config.clone(),
        );
        let cache_labels: Labels = vec![
            ("block_size".into(), config.block_size.to_string()),
            ("cache_dtype".into(), "auto".into()),
            (
                "enable_prefix_caching".into(),
                python_bool(config.enable_prefix_caching),
            ),
            ("engine".into(), "0".into()),
            ("gpu_memory_utilization".into(), "0.9".into()),
            ("num_cpu_blocks".into(), "None".into()),
            ("num_gpu_blocks".into(), config.num_gpu_blocks.to_string()),
            ("prefix_caching_hash_algo".into(), "sha256".into()),
        ];
        self.cache_config.get_or_create(&cache_labels).set(1);
        if self.lora_enabled {
            self.registry.register(
                "vllm:lora_requests_info",
                "Running stats on lora requests",
                self.lora_info.clone(),
            );
        }
        // Zero series exist from the start, as in vLLM.
        for reason in ["stop", "length", "abort"] {
            let _ = self.success.get_or_create(&self.with_reason(reason));
        }
        let _ = self.ttft.get_or_create(&self.base);
        let _ = self.itl.get_or_create(&self.base);
        let _ = self.e2e.get_or_create(&self.base);
    }

    fn register_sglang(&mut self) {
        self.base = vec![self.base.swap_remove(0)];
        let r = &mut self.registry;
        r.register(
            "sglang:num_running_reqs",
            "The number of running requests",
            self.running.clone(),
        );
        r.register(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue",
            self.waiting.clone(),
        );
        r.register(
            "sglang:token_usage",
            "The token usage",
            self.kv_usage.clone(),
        );
        r.register(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate",
            self.cache_hit_rate.clone(),
        );
        r.register(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds",
            self.ttft.clone(),
        );
    }

    fn with_reason(&self, reason: &str) -> Labels {
        let mut labels = self.base.clone();
        labels.push(("finished_reason".into(), reason.into()));
        labels
    }

    /// Records an admitted request's latency figures (model time).
    pub fn observe_admission(&self, a: &Admission) {
        self.ttft.get_or_create(&self.base).observe(a.ttft_seconds);
        let itl = self.itl.get_or_create(&self.base);
        for _ in 1..a.output_tokens.min(1 << 16) {
            itl.observe(a.inter_token_seconds);
        }
        self.e2e
            .get_or_create(&self.base)
            .observe(a.finish_at - a.arrival);
        self.prompt_tokens
            .get_or_create(&self.base)
            .inc_by(a.prompt_tokens as u64);
        self.generation_tokens
            .get_or_create(&self.base)
            .inc_by(a.output_tokens);
    }

    /// Brings gauges and counters to `m`, and stamps the current LoRA combination with the wall
    /// clock. Call with the pod locked so concurrent syncs cannot double-count.
    pub fn sync(&self, m: &PodMetrics) {
        let b = &self.base;
        self.running.get_or_create(b).set(m.running as i64);
        self.waiting.get_or_create(b).set(m.waiting as i64);
        self.kv_usage.get_or_create(b).set(m.kv_cache_usage);
        let rate = if m.prefix_queries_tokens == 0 {
            0.0
        } else {
            m.prefix_hits_tokens as f64 / m.prefix_queries_tokens as f64
        };
        self.cache_hit_rate.get_or_create(b).set(rate);
        catch_up(
            &self.prefix_queries.get_or_create(b),
            m.prefix_queries_tokens,
        );
        catch_up(&self.prefix_hits.get_or_create(b), m.prefix_hits_tokens);
        for (reason, total) in [
            ("stop", m.finished_stop),
            ("length", m.finished_length),
            ("abort", m.finished_abort),
        ] {
            catch_up(
                &self.success.get_or_create(&self.with_reason(reason)),
                total,
            );
        }
        if self.lora_enabled {
            let labels: Labels = vec![
                ("max_lora".into(), self.max_loras.to_string()),
                ("waiting_lora_adapters".into(), m.waiting_adapters.join(",")),
                ("running_lora_adapters".into(), m.running_adapters.join(",")),
            ];
            let unix = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.lora_info.get_or_create(&labels).set(unix);
        }
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}
