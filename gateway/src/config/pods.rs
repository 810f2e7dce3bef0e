//! `[pods]`: where pods come from (a static list, DNS re-resolution of a headless service, the
//! admin API) and how the gateway talks to them (timeouts, retries, concurrency).

use prewarm_core::address::{is_pod_address, ADDRESS_RULE};
use prewarm_core::wire::MAX_RESIDENT_ADAPTERS;
use serde::{Deserialize, Serialize};

/// Which HTTP dialect a pod speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// vLLM's OpenAI server (default).
    #[default]
    Vllm,
    /// SGLang's server: adapter routes without `/v1`, JSON replies, `base:adapter` model names.
    Sglang,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// One pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    /// Stable identity in placement and in the routing table.
    pub id: String,
    /// `host:port` of the pod's HTTP server (what the filter puts in the endpoint header).
    pub address: String,
    /// Engine dialect (default `vllm`).
    #[serde(default)]
    pub engine: EngineKind,
    /// Placement weight (default 1.0, > 0).
    #[serde(default = "unit")]
    pub weight: f64,
    /// GPU LoRA slots, vLLM's `--max-loras` (default 1).
    #[serde(default = "one")]
    pub max_loras: usize,
    /// Registered-adapter capacity, vLLM's `--max-cpu-loras` (default: `max_loras`).
    #[serde(default)]
    pub max_cpu_loras: Option<usize>,
    /// KV block size in tokens, when `vllm:cache_config_info` does not say (default 16).
    #[serde(default)]
    pub block_size: Option<usize>,
    /// KV blocks on the GPU, when `vllm:cache_config_info` does not say (default 8,192).
    #[serde(default)]
    pub num_blocks: Option<usize>,
    /// `host:port` where the pod publishes its KV-cache events (vLLM's `--kv-events-config`
    /// `endpoint`, ZeroMQ over TCP; default none: the gateway models the cache from the traffic
    /// it sees and the pod's counters alone). See `docs/routing.md`, "What the gateway knows of
    /// a pod's cache".
    #[serde(default)]
    pub kv_events: Option<String>,
    /// `host:port` of the pod's replay socket (vLLM's `--kv-events-config` `replay_endpoint`,
    /// which it binds): batches the gateway missed are asked for there (default none: a gap
    /// stays a gap).
    #[serde(default)]
    pub kv_events_replay: Option<String>,
}

fn unit() -> f64 {
    1.0
}

fn one() -> usize {
    1
}

impl PodSpec {
    pub fn new(id: impl Into<String>, address: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            address: address.into(),
            engine: EngineKind::Vllm,
            weight: 1.0,
            max_loras: 1,
            max_cpu_loras: None,
            block_size: None,
            num_blocks: None,
            kv_events: None,
            kv_events_replay: None,
        }
    }

    /// Every problem with this pod as `field: value: rule`, fields prefixed by `at`.
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut p = Vec::new();
        if self.id.is_empty() || self.id.len() > 253 || self.id.chars().any(|c| c.is_whitespace()) {
            p.push(format!(
                "{at}.id: {:?}: must be 1..253 characters without spaces",
                self.id
            ));
        }
        if !is_pod_address(&self.address) {
            p.push(format!("{at}.address: {:?}: {ADDRESS_RULE}", self.address));
        }
        if !(self.weight > 0.0 && self.weight.is_finite()) {
            p.push(format!("{at}.weight: {}: must be > 0", self.weight));
        }
        if self.max_loras == 0 || self.max_loras > MAX_RESIDENT_ADAPTERS {
            p.push(format!(
                "{at}.max_loras: {}: must be 1..{MAX_RESIDENT_ADAPTERS}",
                self.max_loras
            ));
        }
        if let Some(c) = self.max_cpu_loras {
            if c < self.max_loras || c > 65_536 {
                p.push(format!(
                    "{at}.max_cpu_loras: {c}: must be between max_loras and 65536"
                ));
            }
        }
        if let Some(b) = self.block_size {
            if b == 0 || b > 4096 {
                p.push(format!("{at}.block_size: {b}: must be 1..4096"));
            }
        }
        for (field, value) in [
            ("kv_events", &self.kv_events),
            ("kv_events_replay", &self.kv_events_replay),
        ] {
            if let Some(e) = value {
                if !is_pod_address(e) {
                    p.push(format!("{at}.{field}: {e:?}: {ADDRESS_RULE}"));
                }
            }
        }
        if let Some(n) = self.num_blocks {
            if n == 0 || n > 1 << 26 {
                p.push(format!("{at}.num_blocks: {n}: must be 1..67108864"));
            }
        }
        p
    }
}

/// Pods found by resolving a (headless) service name periodically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscovery {
    /// Service name to resolve, e.g. `vllm.default.svc.cluster.local`.
    pub name: String,
    /// Port of every resolved pod (default 8000).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Seconds between resolutions (default 10).
    #[serde(default = "default_dns_interval")]
    pub interval_seconds: u64,
    /// Template of every discovered pod (its `id` and `address` are ignored: the id is the
    /// resolved `ip:port`).
    #[serde(default)]
    pub engine: EngineKind,
    /// GPU LoRA slots of discovered pods (default 1).
    #[serde(default = "one")]
    pub max_loras: usize,
    /// Registered-adapter capacity of discovered pods (default: `max_loras`).
    #[serde(default)]
    pub max_cpu_loras: Option<usize>,
    /// The port where every discovered pod publishes its KV-cache events (vLLM's
    /// `--kv-events-config` endpoint port; default none). A pod's events are read from the
    /// resolved address at this port.
    #[serde(default)]
    pub kv_events_port: Option<u16>,
    /// The port of every discovered pod's replay socket (default none).
    #[serde(default)]
    pub kv_events_replay_port: Option<u16>,
}

fn default_port() -> u16 {
    8000
}

fn default_dns_interval() -> u64 {
    10
}

/// `[pods]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PodsConfig {
    /// Name of the base model the pods serve (default `base`): the `model` of base-model
    /// prefills, and the parent of adapters.
    pub base_model: String,
    /// The static pod list (`[[pods.static]]`, default none).
    #[serde(rename = "static")]
    pub static_pods: Vec<PodSpec>,
    /// DNS discovery (`[pods.dns]`, default off).
    pub dns: Option<DnsDiscovery>,
    /// Milliseconds between health checks of every pod (default 1,000).
    pub health_interval_ms: u64,
    /// Consecutive failed health checks after which a pod counts as down (default 2).
    pub unhealthy_after: u32,
    /// Timeout of one request to a pod, milliseconds (default 10,000).
    pub request_timeout_ms: u64,
    /// Timeout of connecting to a pod, milliseconds (default 1,000).
    pub connect_timeout_ms: u64,
    /// Retries of a failed idempotent request (transport error or 5xx) (default 2).
    pub retries: u32,
    /// First retry backoff, milliseconds; doubles per attempt, plus up to 100% jitter
    /// (default 50).
    pub retry_backoff_ms: u64,
    /// Requests in flight to one pod from the gateway at most (default 8).
    pub max_in_flight_per_pod: usize,
    /// Pods each adapter is placed on at least (default 1; gold at least 2): the replica set
    /// grows with the adapter's share of demand (`policy::replicas`).
    pub adapter_replicas: usize,
    /// Gold tenants' adapters on a pool of pods of their own, sized from the tiers' demand and
    /// the pods' GPU slots (`policy::pools`; default true).
    pub tier_pools: bool,
    /// Share of the pods that serve gold tenants' adapters, the others serving the other tiers'
    /// (`policy::pools`), set by hand; 0 (default): sized from demand with `tier_pools`.
    pub gold_pool_share: f64,
    /// `host:port` where the gateway listens for pods that *send* their KV-cache events (vLLM
    /// connects its publisher to a non-wildcard `--kv-events-config` endpoint, e.g.
    /// `{"endpoint": "tcp://prewarm-gateway:5557", "topic": "<pod address>"}`); a message's
    /// topic names its pod: the pod's `id` or its `address` (default none).
    pub kv_events_listen: Option<String>,
}

impl Default for PodsConfig {
    fn default() -> Self {
        Self {
            base_model: "base".into(),
            static_pods: Vec::new(),
            dns: None,
            health_interval_ms: 1000,
            unhealthy_after: 2,
            request_timeout_ms: 10_000,
            connect_timeout_ms: 1000,
            retries: 2,
            retry_backoff_ms: 50,
            max_in_flight_per_pod: 8,
            adapter_replicas: 1,
            tier_pools: true,
            gold_pool_share: 0.0,
            kv_events_listen: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_core_rule() {
        for ok in ["127.0.0.1:8000", "pod-a.svc:80", "[::1]:8000"] {
            assert!(PodSpec::new("p", ok).problems("p").is_empty(), "{ok}");
        }
        // hostile addresses a routing table would carry into the endpoint header
        for bad in [
            "http://x:80",
            "x",
            "x:99999",
            ":80",
            "a:1,b:2",
            "u@h:80",
            "h\u{7}:80",
            "x:0",
            "",
        ] {
            let problems = PodSpec::new("p", bad).problems("pods.static[0]");
            assert_eq!(problems.len(), 1, "{bad:?}: {problems:?}");
            assert!(
                problems[0].starts_with("pods.static[0].address: "),
                "{problems:?}"
            );
        }
    }

    #[test]
    fn pod_problems_name_fields() {
        let mut p = PodSpec::new("", "nope");
        p.max_loras = 0;
        p.weight = -1.0;
        let problems = p.problems("pods.static[0]");
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].starts_with("pods.static[0].id: "));
        assert!(PodSpec::new("a", "h:1").problems("x").is_empty());
    }
}
