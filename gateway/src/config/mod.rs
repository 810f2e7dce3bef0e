//! The gateway's configuration: TOML (`prewarm.toml`) into typed structs with documented
//! defaults and `deny_unknown_fields`, environment overrides for secrets, and [`validate`] that
//! lists every problem as `field: value: rule` before any port is bound.
//!
//! The reference for every field is `docs/gateway-config.md`.

pub mod embeddings;
mod pods;
pub mod traces;
pub mod validate;
pub mod warm_embeddings;

pub use embeddings::EmbeddingsConfig;
pub use pods::{DnsDiscovery, EngineKind, PodSpec, PodsConfig};
pub use traces::TracesConfig;
pub use validate::validate;
pub use warm_embeddings::WarmEmbeddingsConfig;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use prewarm_core::FingerprintConfig;
use serde::{Deserialize, Serialize};

use crate::policy;

/// Environment variable that overrides `server.admin_token`.
pub const ADMIN_TOKEN_ENV: &str = "PREWARM_ADMIN_TOKEN";
/// Environment variable that overrides `server.signal_token`.
pub const SIGNAL_TOKEN_ENV: &str = "PREWARM_SIGNAL_TOKEN";
/// Environment variable that overrides `server.read_token`.
pub const READ_TOKEN_ENV: &str = "PREWARM_READ_TOKEN";

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    pub server: ServerConfig,
    pub state: StateConfig,
    pub fingerprint: FingerprintSection,
    pub pods: PodsConfig,
    pub registry: RegistryConfig,
    /// The policies' sections, defined (with defaults and validation) in `policy`.
    pub hotness: policy::HotnessConfig,
    pub kv: policy::KvConfig,
    pub lora: policy::LoraConfig,
    pub warmup: policy::WarmupConfig,
    pub routing: policy::RoutingConfig,
    /// `[embeddings]`: the local prompt embedder and index (off without `model_dir`).
    pub embeddings: EmbeddingsConfig,
    /// `[experiment]`: an experiment that runs from start (docs/experiments.md); it replaces one
    /// started through the admin API when the gateway restarts.
    pub experiment: Option<prewarm_core::experiment::Experiment>,
    /// `[traces]`: OpenTelemetry spans of warm-up over OTLP/HTTP (off without `otlp_endpoint`).
    pub traces: TracesConfig,
    /// `[warm_embeddings]`: warm-up of the filters' embedding cache (docs/embedding-warmup.md).
    pub warm_embeddings: WarmEmbeddingsConfig,
}

/// `[server]`: listener, secrets, limits, shutdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the HTTP API binds (default `127.0.0.1:9100`; port 0 picks a free port).
    pub listen: String,
    /// Bearer token of the mutating admin endpoints (default empty: every mutating admin call is
    /// refused with 401). Overridden by `PREWARM_ADMIN_TOKEN`.
    pub admin_token: String,
    /// Bearer token filters present on `/v1/signals` and `/v1/routing` (default empty: both are
    /// refused with 401 until one is set). Overridden by `PREWARM_SIGNAL_TOKEN`.
    pub signal_token: String,
    /// Bearer token of the admin reads (`GET /admin/...`, what the dashboard and `status` read);
    /// the admin token is accepted too (default empty: only the admin token reads). Overridden by
    /// `PREWARM_READ_TOKEN`.
    pub read_token: String,
    /// Largest accepted request body on admin endpoints, bytes (default 65,536).
    pub max_body_bytes: usize,
    /// Largest accepted `POST /v1/signals` body, bytes (default 4,194,304: core's
    /// `MAX_SIGNAL_BATCH_BYTES`, the most a filter's batch can be).
    pub max_signal_body_bytes: usize,
    /// Grace period for draining at shutdown, seconds (default 10).
    pub drain_seconds: u64,
    /// A request's headers must arrive within this many ms, and a kept-alive connection idle
    /// this long is closed (default 10,000: a filter polls every second (`tick_period_ms`) and
    /// sends its headers at once; 10 s also covers a human typing into `curl`-like tools slowly
    /// enough, while a slowloris client holds a connection 10 s, not forever).
    pub header_read_timeout_ms: u64,
    /// A second address serving only the data plane (`/v1/signals`, `/v1/routing`,
    /// `/v1/embeddings/warm`, the pods' warm gate `/v1/pods/{id}/ready`) and the probes, with its own connection cap, so a flood of admin
    /// or stray connections never delays a table poll (default empty: filters use `listen`).
    pub filter_listen: String,
    /// Most connections `listen` holds open at once; past it the listener stops accepting until
    /// one closes (default 0: half the process's file descriptors, see `server::connections`).
    pub max_connections: usize,
    /// Most connections `filter_listen` holds open at once (default 0: a quarter of the process's
    /// file descriptors).
    pub filter_max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9100".into(),
            admin_token: String::new(),
            signal_token: String::new(),
            read_token: String::new(),
            max_body_bytes: 64 * 1024,
            max_signal_body_bytes: prewarm_core::wire::MAX_SIGNAL_BATCH_BYTES,
            drain_seconds: 10,
            header_read_timeout_ms: 10_000,
            filter_listen: String::new(),
            max_connections: 0,
            filter_max_connections: 0,
        }
    }
}

/// `[state]`: where snapshots live and how often they are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// Directory of `snapshot.json` and `snapshot.prev.json` (default `prewarm-state`; created
    /// when missing).
    pub dir: PathBuf,
    /// Seconds between periodic snapshots (default 30; 0 disables periodic snapshots, the one at
    /// shutdown is still written).
    pub snapshot_interval_seconds: u64,
    /// What to do when snapshot files exist but none is usable (default `refuse`).
    pub on_unusable_snapshot: OnUnusableSnapshot,
}

/// `state.on_unusable_snapshot`: starting without the state the files held is the operator's
/// choice, never a silent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnusableSnapshot {
    /// Stay unready (`/readyz` 503 naming the files), write no snapshot, touch no file.
    #[default]
    Refuse,
    /// Set the unusable files aside and start empty.
    StartEmpty,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("prewarm-state"),
            snapshot_interval_seconds: 30,
            on_unusable_snapshot: OnUnusableSnapshot::default(),
        }
    }
}

/// `[fingerprint]`: must match the filters' configuration (the routing table carries
/// `block_tokens`; a filter configured otherwise does not route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FingerprintSection {
    /// Tokens per block (default 64; a divisor of 512).
    pub block_tokens: usize,
    /// Leading tokens fingerprinted (default 32,768).
    pub max_prefix_tokens: usize,
}

impl Default for FingerprintSection {
    fn default() -> Self {
        let d = FingerprintConfig::default();
        Self {
            block_tokens: d.block_tokens,
            max_prefix_tokens: d.max_prefix_tokens,
        }
    }
}

impl FingerprintSection {
    pub fn core(&self) -> FingerprintConfig {
        FingerprintConfig {
            block_tokens: self.block_tokens,
            max_prefix_tokens: self.max_prefix_tokens,
        }
    }
}

/// `[registry]`: adapter registration limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// Largest file count in an adapter directory's manifest (default 1,000).
    pub max_manifest_files: usize,
    /// Seconds a consistent rollout's requests are watched for errors (default 600; 0: off).
    pub rollout_watch_seconds: u64,
    /// Requests the error rate of a watch is taken over at least (default 200).
    pub rollout_min_requests: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            max_manifest_files: 1000,
            rollout_watch_seconds: 600,
            rollout_min_requests: 200,
        }
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{} problem(s):\n  {}", .0.len(), .0.join("\n  "))]
    Invalid(Vec<String>),
}

impl GatewayConfig {
    /// The fleet core's configuration: the policies' sections and the pool's placement knobs.
    pub fn fleet(&self) -> policy::fleet::FleetConfig {
        policy::fleet::FleetConfig {
            fingerprint: self.fingerprint.core(),
            hotness: self.hotness.clone(),
            lora: self.lora.clone(),
            warmup: self.warmup.clone(),
            routing: self.routing.clone(),
            adapter_replicas: self.pods.adapter_replicas,
            tier_pools: self.pods.tier_pools,
            gold_pool_share: self.pods.gold_pool_share,
            unhealthy_after: self.pods.unhealthy_after,
            keep_warm_period_ms: 1_000,
            base_model: self.pods.base_model.clone(),
        }
    }

    /// The fleet core's view of pod `spec`: its address, weight, LoRA slots, and the `[kv]`
    /// section with the pod's geometry overrides.
    pub fn pod_shape(&self, spec: &PodSpec) -> policy::fleet::PodShape {
        let mut kv = self.kv.clone();
        if let Some(b) = spec.block_size {
            kv.block_tokens = b;
        }
        if let Some(n) = spec.num_blocks {
            kv.capacity_blocks = n as u64;
        }
        policy::fleet::PodShape {
            id: spec.id.clone(),
            address: spec.address.clone(),
            weight: spec.weight,
            slots: policy::lora::LoraSlots {
                max_loras: spec.max_loras,
                max_cpu_loras: spec.max_cpu_loras.unwrap_or(spec.max_loras),
            },
            kv,
        }
    }

    /// Parses TOML text (no environment overrides, no validation).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Reads `path`, applies the environment overrides, and validates: every problem is listed.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        config.apply_env(|k| std::env::var(k).ok());
        let problems = validate(&config);
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Secrets from the environment win over the file (an empty variable counts as unset).
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(t) = var(ADMIN_TOKEN_ENV).filter(|t| !t.is_empty()) {
            self.server.admin_token = t;
        }
        if let Some(t) = var(SIGNAL_TOKEN_ENV).filter(|t| !t.is_empty()) {
            self.server.signal_token = t;
        }
        if let Some(t) = var(READ_TOKEN_ENV).filter(|t| !t.is_empty()) {
            self.server.read_token = t;
        }
    }

    /// The filters' own listen address, when one is configured (validated by [`validate`]).
    pub fn filter_listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        if self.server.filter_listen.is_empty() {
            return Ok(None);
        }
        self.server
            .filter_listen
            .parse()
            .map(Some)
            .map_err(|e| format!("server.filter_listen: {:?}: {e}", self.server.filter_listen))
    }

    /// The listen address (validated by [`validate`]).
    pub fn listen_addr(&self) -> Result<SocketAddr, String> {
        self.server
            .listen
            .parse()
            .map_err(|e| format!("server.listen: {:?}: {e}", self.server.listen))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_documented_defaults() {
        let c = GatewayConfig::from_toml("").unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:9100");
        assert_eq!(c.registry.max_manifest_files, 1000);
        assert_eq!(c.fingerprint.block_tokens, 64);
        assert!(validate(&c).is_empty());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = GatewayConfig::from_toml("[server]\nlisten_on = 1\n").unwrap_err();
        assert!(e.contains("listen_on"), "{e}");
    }

    #[test]
    fn env_overrides_secrets() {
        let mut c = GatewayConfig::from_toml("[server]\nadmin_token = \"file\"\n").unwrap();
        c.apply_env(|k| (k == ADMIN_TOKEN_ENV).then(|| "env".to_string()));
        assert_eq!(c.server.admin_token, "env");
        c.apply_env(|k| (k == SIGNAL_TOKEN_ENV).then(String::new));
        assert_eq!(c.server.signal_token, "");
    }
}
