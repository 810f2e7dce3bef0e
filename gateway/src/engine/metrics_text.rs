//! Reading a pod's `/metrics` (Prometheus text) into [`PodLoad`]: queue, running batch, KV
//! usage, the cache config (`vllm:cache_config_info` labels) and LoRA activity
//! (`vllm:lora_requests_info`: every label combination stays as its own series, so the reader
//! takes the series with the largest value and skips ones whose lists are both empty).
//! The prefix-cache counters (`vllm:prefix_cache_queries_total`, `_hits_total`, in tokens) are
//! summed over their label sets, and so is `vllm:request_success_total` (requests finished, for
//! the queue wait: `policy::fleet::wait`). SGLang's names (`sglang:num_queue_reqs`, `sglang:num_running_reqs`, `sglang:token_usage`) are
//! read too. Beside the load, a scrape keeps `process_start_time_seconds` (the Prometheus
//! client's process metric, which vLLM's API server exports), by which the fleet core tells a
//! restarted pod (`policy::fleet::restart`).

pub use crate::policy::fleet::PodLoad;

/// One `/metrics` scrape: the pod's load and its process start time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsScrape {
    pub load: PodLoad,
    /// `process_start_time_seconds`, unix seconds; `None` when not exported (SGLang, vLLM with
    /// several API servers).
    pub process_start_s: Option<f64>,
}

impl From<PodLoad> for MetricsScrape {
    fn from(load: PodLoad) -> Self {
        Self {
            load,
            process_start_s: None,
        }
    }
}

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one sample line; comments, blank and malformed lines give `None`.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            let name = line.get(..open)?;
            let inner = line.get(open + 1..close)?;
            (name, parse_labels(inner)?, line.get(close + 1..)?)
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, Vec::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some(Sample {
        name: name.trim(),
        labels,
        value,
    })
}

fn parse_labels(inner: &str) -> Option<Vec<(&str, String)>> {
    let mut labels = Vec::new();
    let mut rest = inner.trim_start();
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let key = rest.get(..eq)?.trim();
        let after = rest.get(eq + 1..)?.trim_start();
        let body = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = body.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                other => value.push(other),
            }
        }
        let end = end?;
        labels.push((key, value));
        rest = body.get(end + 1..)?.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(labels)
}

fn names(list: Option<&str>) -> Vec<String> {
    list.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Reads a whole exposition into a [`PodLoad`]. Gauges summed over `engine` labels; unknown
/// metrics ignored.
pub fn parse_pod_load(text: &str) -> PodLoad {
    parse_scrape(text).load
}

/// Reads a whole exposition into a [`MetricsScrape`]: [`parse_pod_load`]'s load and the
/// process start time (a finite, positive `process_start_time_seconds`).
pub fn parse_scrape(text: &str) -> MetricsScrape {
    let mut load = PodLoad::default();
    let mut process_start_s = None;
    let mut newest_lora: Option<f64> = None;
    for sample in text.lines().filter_map(parse_line) {
        let v = sample.value;
        match sample.name {
            "process_start_time_seconds" if v.is_finite() && v > 0.0 => process_start_s = Some(v),
            "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => {
                load.waiting = load.waiting.saturating_add(v.max(0.0) as u64)
            }
            "vllm:num_requests_running" | "sglang:num_running_reqs" => {
                load.running = load.running.saturating_add(v.max(0.0) as u64)
            }
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
                load.kv_usage = load.kv_usage.max(v.clamp(0.0, 1.0))
            }
            "vllm:prefix_cache_queries_total" => {
                load.prefix_cache_queries = Some(counter(load.prefix_cache_queries, v))
            }
            "vllm:prefix_cache_hits_total" => {
                load.prefix_cache_hits = Some(counter(load.prefix_cache_hits, v))
            }
            "vllm:request_success_total" => {
                load.request_successes = Some(counter(load.request_successes, v))
            }
            "vllm:cache_config_info" => {
                load.block_size = sample.label("block_size").and_then(|s| s.parse().ok());
                load.num_gpu_blocks = sample.label("num_gpu_blocks").and_then(|s| s.parse().ok());
            }
            "vllm:lora_requests_info" => {
                let running = names(sample.label("running_lora_adapters"));
                let waiting = names(sample.label("waiting_lora_adapters"));
                if let Some(m) = sample.label("max_lora").and_then(|s| s.parse().ok()) {
                    load.max_lora = Some(m);
                }
                if running.is_empty() && waiting.is_empty() {
                    continue;
                }
                if newest_lora.is_none_or(|n| v > n) {
                    newest_lora = Some(v);
                    load.running_adapters = running;
                    load.waiting_adapters = waiting;
                }
            }
            _ => {}
        }
    }
    MetricsScrape {
        load,
        process_start_s,
    }
}

/// A counter summed over its label sets (one per engine and model).
fn counter(sum: Option<u64>, v: f64) -> u64 {
    let v = if v.is_finite() { v.max(0.0) as u64 } else { 0 };
    sum.unwrap_or(0).saturating_add(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
vllm:num_requests_waiting{engine="0",model_name="base"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.42
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_cpu_blocks="0",num_gpu_blocks="2048"} 1.0
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="c",waiting_lora_adapters="d"} 1.8e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.9e9
vllm:prefix_cache_queries_total{engine="0",model_name="base"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="base"} 500.0
vllm:prefix_cache_hits_total{engine="0",model_name="base"} 640.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="base"} 90.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="base"} 9.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="base"} 1.0
"#;

    #[test]
    fn reads_vllm_gauges_and_the_newest_nonempty_lora_series() {
        let l = parse_pod_load(VLLM);
        assert_eq!((l.waiting, l.running), (7, 3));
        assert!((l.kv_usage - 0.42).abs() < 1e-9);
        assert_eq!((l.block_size, l.num_gpu_blocks), (Some(16), Some(2048)));
        assert_eq!(l.max_lora, Some(4));
        assert_eq!(l.running_adapters, ["c"]);
        assert_eq!(l.waiting_adapters, ["d"]);
        assert_eq!(l.prefix_cache_queries, Some(1500), "summed over engines");
        assert_eq!(l.prefix_cache_hits, Some(640));
        assert_eq!(l.request_successes, Some(100), "summed over finish reasons");
    }

    /// The head of vLLM 0.32's `/metrics` (CPU, one API server: prometheus_client's default
    /// registry with its process collector), as served.
    const VLLM_PROCESS: &str = r#"# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 4.815745024e+09
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.084772352e+09
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.79656982687e+09
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 13.200000000000001
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7965699112314289e+09
"#;

    #[test]
    fn reads_the_process_start_time_vllm_exports() {
        let s = parse_scrape(VLLM_PROCESS);
        assert_eq!(s.process_start_s, Some(1_796_569_826.87));
        assert_eq!(s.load.prefix_cache_queries, Some(0));
        assert_eq!(parse_scrape(VLLM).process_start_s, None, "not exported");
        for bad in [
            "process_start_time_seconds NaN",
            "process_start_time_seconds -1",
        ] {
            assert_eq!(parse_scrape(bad).process_start_s, None, "{bad}");
        }
    }

    #[test]
    fn reads_sglang_names() {
        let l = parse_pod_load(
            "sglang:num_queue_reqs{x=\"1\"} 2\nsglang:num_running_reqs 5\nsglang:token_usage 0.5\n",
        );
        assert_eq!((l.waiting, l.running), (2, 5));
        assert_eq!(l.kv_usage, 0.5);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        for line in [
            "x{a=\"1\" 3",
            "x{a=1} 3",
            "x{} nan-ish",
            "{} 1",
            "y{a=\"\\",
            "z",
        ] {
            let _ = parse_line(line);
        }
        assert_eq!(parse_pod_load("garbage {{{ \n\u{0}\n"), PodLoad::default());
        let s = parse_line(r#"m{a="x\"y",b="2"} 4"#).unwrap();
        assert_eq!(s.label("a"), Some("x\"y"));
        assert_eq!(s.value, 4.0);
    }
}
