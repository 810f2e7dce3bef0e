//! The filter's configuration: the JSON in the plugin's `configuration`, with a default for
//! every field (see `docs/filter-config.md`) and a validation that names every bad field as
//! `field: value: rule`. A configuration that does not validate is refused at `on_configure`.

use std::collections::BTreeMap;

use prewarm_core::trigger::TriggerConfig;
use prewarm_core::wire::{SignalBatch, MAX_NAME_BYTES, MAX_SIGNAL_BATCH_BYTES};
use prewarm_core::{Endpoint, FingerprintConfig};
use serde::Deserialize;

pub use crate::direct::config::{DirectMode, DirectPod};
pub use crate::embeddings::config::EmbeddingCacheConfig;
pub use crate::request::stage::Stage;

/// Most signals in one batch (the gateway refuses more).
pub const MAX_BATCH_SIGNALS: usize = 10_000;

/// Most `credential_headers` (each is a header lookup on a request without a user).
pub const MAX_CREDENTIAL_HEADERS: usize = 8;

/// Everything the filter can be told. Durations are milliseconds, sizes bytes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Envoy cluster of the prewarm gateway (default `prewarm-gateway`).
    pub gateway_cluster: String,
    /// `:authority` of calls to the gateway (default `prewarm-gateway`).
    pub gateway_authority: String,
    /// Bearer token sent to the gateway as `authorization: Bearer …` (default none).
    pub gateway_token: Option<String>,
    /// Timeout of each call to the gateway, ms (default 500).
    pub gateway_timeout_ms: u64,
    /// Root-context tick: batch flush and table poll period, ms (default 1000).
    pub tick_period_ms: u64,
    /// Most signals in one POST (default 64).
    pub max_batch_signals: usize,
    /// Most bytes of one POST's body (default 1 MiB; at most core's `MAX_SIGNAL_BATCH_BYTES`,
    /// the gateway's default limit).
    pub max_batch_bytes: usize,
    /// Most signals waiting in the shared queue (its slots); the oldest are dropped beyond
    /// (default 256).
    pub max_pending_signals: usize,
    /// Most served records (which pod each routed request went to, for the gateway's KV model)
    /// waiting in their shared queue; the oldest are dropped beyond (default 4096).
    pub max_pending_served: usize,
    /// Whether the filter records each inference request's outcome (time to first byte,
    /// status, usage) for experiments (default true; docs/experiments.md#outcomes).
    pub outcomes: bool,
    /// Outcome records waiting in their shared queue; the oldest are dropped beyond (default
    /// 4096).
    pub max_pending_outcomes: usize,
    /// Longest signal queued, bytes of JSON; longer ones are dropped (default 256 KiB: a
    /// prefill of the default 32768 prefix tokens, 128 KiB of text, fits with room for escapes).
    pub max_signal_bytes: usize,
    /// Bodies are inspected only when `content-length` is at most this, bytes (default 1 MiB).
    pub max_body_bytes: usize,
    /// Header naming the chosen pod (default `x-gateway-destination-endpoint`).
    pub endpoint_header: String,
    /// Who sets `endpoint_header`: `prewarm` (default: a client's value is removed from every
    /// request, only this filter names a pod) or `external` (another router, the Inference
    /// Extension's endpoint picker or llm-d's, sets it before this filter: it is never removed
    /// or set here, `routing` must be false, and the pod it names is recorded as served).
    pub endpoint_header_owner: EndpointHeaderOwner,
    /// Header naming a request's experiment arm, `<experiment>/<arm>` (default `x-prewarm-arm`):
    /// removed from every request, set on those the filter assigns to an arm.
    pub arm_header: String,
    /// Header carrying the tenant, `null` for none (default `x-prewarm-tenant`). Trusted as
    /// is: name a header the mesh sets (and strips from clients), see docs/filter-config.md.
    pub tenant_header: Option<String>,
    /// Header carrying the user, `null` for none (default `x-prewarm-user`); same trust rule.
    pub user_header: Option<String>,
    /// Whether the body's `user` field is the user when the header gives none (default true).
    pub user_from_body: bool,
    /// Headers whose credential (a bearer token, an API key) identifies a request that names no
    /// user, for its streak, by a keyed hash (default `authorization`, `x-api-key`, `api-key`;
    /// empty: none).
    pub credential_headers: Vec<String>,
    /// The key of that hash, at least 16 bytes (default none: a random key per proxy, kept in
    /// shared data).
    pub credential_key: Option<String>,
    /// Request paths inspected, and the OpenAI endpoint each is parsed as (default the three
    /// `/v1/...` paths of prewarm-core).
    pub inference_paths: BTreeMap<String, Endpoint>,
    /// Models that are base models, not LoRA adapters: never pinned (default none).
    pub base_models: Vec<String>,
    /// Trigger thresholds (defaults 0.85 / 3 / 5 per minute / 20 per minute).
    pub triggers: TriggerConfig,
    /// Tokens per fingerprint block; must equal the gateway's to route (default 64).
    pub block_tokens: usize,
    /// Leading tokens fingerprinted and sketched per request (default 32768).
    pub max_prefix_tokens: usize,
    /// Hashes in a prompt's similarity sketch (default 64).
    pub sketch_size: usize,
    /// Window of the pattern and adapter rates, ms (default 60000).
    pub rate_window_ms: u64,
    /// Whether to set the endpoint header from the routing table (default true).
    pub routing: bool,
    /// Retry alternatives after the chosen pod in the endpoint header, in rank order
    /// (default 2, matching the shipped route's `num_retries`).
    pub endpoint_alternatives: usize,
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
    /// Hashed slots of the prefix index, one shared-data key of 26 bytes each (default 16,384:
    /// about 416 KiB of values per Envoy; at most 1,048,576).
    pub prefix_slots: u32,
    /// Age past which a prefix-index entry is ignored, ms (default 1,310,720: a Llama 8B H100
    /// pod's KV capacity over a tenth of its prefill rate; see `docs/routing.md`).
    pub prefix_horizon_ms: u64,
    /// Compare-and-swap attempts per shared-data update before giving up (default 8).
    pub cas_retries: u32,
    /// Names this filter in the batches it sends (default `prewarm-filter`).
    pub source: String,
    /// Who sends prefills and adapter touches to the pods: `off` (only the gateway),
    /// `when_gateway_down` (the filter takes over while the gateway's calls fail; default) or
    /// `always` (standalone, no gateway; the pods are `direct_pods`).
    pub direct_calls: DirectMode,
    /// Envoy cluster of the direct calls: an `ORIGINAL_DST` cluster reading `direct_host_header`
    /// that no route references (default `prewarm-direct`).
    pub direct_cluster: String,
    /// Header naming the pod of a direct call; stripped from every client request (default
    /// `x-prewarm-direct-host`).
    pub direct_host_header: String,
    /// The pods in `always` mode (id + `host:port`); the routing table is built from them.
    pub direct_pods: Vec<DirectPod>,
    /// Most direct calls a minute per Envoy (default 60: one a default tick).
    pub direct_calls_per_min: u64,
    /// Most prompt tokens of direct prefills a minute per Envoy (default 240,000: one pod's
    /// prefill minute at 4,000 tokens/s, so one Envoy's warming never takes more than one pod's
    /// whole prefill capacity; at least `max_prefix_tokens` + 1, the largest prefill).
    pub direct_prefill_tokens_per_min: u64,
    /// Timeout of each direct call, ms (default 10,000: a prefill of the largest fingerprinted
    /// prefix, 32,768 tokens, at 4,000 tokens/s takes 8.2 s).
    pub direct_timeout_ms: u64,
    /// How long the gateway's calls must have failed before the filter takes over, ms
    /// (default 5,000: five default ticks, so a gateway restart does not trigger it).
    pub direct_takeover_after_ms: u64,
    /// The embedding cache: models answered from it, TTL and bounds (default off).
    pub embedding_cache: EmbeddingCacheConfig,
    /// For `make bench-filter`'s stage ladder only: inspect each request up to this stage and
    /// let it go on unrouted (default none: the whole path). See `request::stage`.
    pub bench_stop_after: Option<Stage>,
}

impl Default for FilterConfig {
    fn default() -> Self {
        let fingerprint = FingerprintConfig::default();
        Self {
            gateway_cluster: "prewarm-gateway".into(),
            gateway_authority: "prewarm-gateway".into(),
            gateway_token: None,
            gateway_timeout_ms: 500,
            tick_period_ms: 1000,
            max_batch_signals: 64,
            max_batch_bytes: 1 << 20,
            max_pending_signals: 256,
            max_pending_served: 4096,
            outcomes: true,
            max_pending_outcomes: 4096,
            max_signal_bytes: 256 << 10,
            max_body_bytes: 1 << 20,
            endpoint_header: "x-gateway-destination-endpoint".into(),
            endpoint_header_owner: EndpointHeaderOwner::Prewarm,
            arm_header: "x-prewarm-arm".into(),
            tenant_header: Some("x-prewarm-tenant".into()),
            user_header: Some("x-prewarm-user".into()),
            user_from_body: true,
            credential_headers: ["authorization", "x-api-key", "api-key"]
                .map(String::from)
                .to_vec(),
            credential_key: None,
            inference_paths: [
                Endpoint::Completions,
                Endpoint::ChatCompletions,
                Endpoint::Embeddings,
            ]
            .into_iter()
            .map(|e| (e.path().to_string(), e))
            .collect(),
            base_models: Vec::new(),
            triggers: TriggerConfig::default(),
            block_tokens: fingerprint.block_tokens,
            max_prefix_tokens: fingerprint.max_prefix_tokens,
            sketch_size: prewarm_core::similarity::DEFAULT_SKETCH_SIZE,
            rate_window_ms: 60_000,
            routing: true,
            endpoint_alternatives: 2,
            shared_prefix: "prewarm/".into(),
            user_slots: 4096,
            pattern_slots: 4096,
            adapter_slots: 1024,
            shared_prompt_slots: 4096,
            shared_prompt_tally_bytes: 4 << 20,
            prefix_slots: prewarm_core::prefix::DEFAULT_SLOTS,
            prefix_horizon_ms: prewarm_core::prefix::DEFAULT_HORIZON_MS,
            cas_retries: 8,
            source: "prewarm-filter".into(),
            direct_calls: DirectMode::WhenGatewayDown,
            direct_cluster: "prewarm-direct".into(),
            direct_host_header: "x-prewarm-direct-host".into(),
            direct_pods: Vec::new(),
            direct_calls_per_min: 60,
            direct_prefill_tokens_per_min: 240_000,
            direct_timeout_ms: 10_000,
            direct_takeover_after_ms: 5_000,
            bench_stop_after: None,
            embedding_cache: EmbeddingCacheConfig::default(),
        }
    }
}

/// Who owns the endpoint header (`endpoint_header_owner`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointHeaderOwner {
    /// This filter: a client's value is removed from every request; with `routing` the filter
    /// sets it from the routing table.
    #[default]
    Prewarm,
    /// Another router that runs before this filter and overwrites a client's value (the
    /// Inference Extension's endpoint picker, llm-d): the filter never removes or sets the
    /// header, does not route, and records the pod it names as served (`external_route`).
    External,
}

pub(crate) fn range<T: PartialOrd + std::fmt::Display + Copy>(
    problems: &mut Vec<String>,
    field: &str,
    value: T,
    min: T,
    max: T,
) {
    if value < min || value > max {
        problems.push(format!("{field}: {value}: must be between {min} and {max}"));
    }
}

pub(crate) fn header_name(problems: &mut Vec<String>, field: &str, value: &str) {
    let valid = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        problems.push(format!(
            "{field}: {value:?}: must be a non-empty lower-case header name"
        ));
    }
}

/// serde_json's type errors do not say which field: find the top-level field that fails alone.
fn name_bad_field(bytes: &[u8], error: &serde_json::Error) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(bytes) else {
        return format!("configuration: {error}");
    };
    for (name, value) in fields {
        let mut alone = serde_json::Map::new();
        alone.insert(name.clone(), value.clone());
        if let Err(e) = serde_json::from_value::<FilterConfig>(serde_json::Value::Object(alone)) {
            return format!("{name}: {value}: {e}");
        }
    }
    format!("configuration: {error}")
}

/// Why the VM does not run with a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The host could not give the configuration: run unconfigured (pass requests untouched).
    Unreadable(String),
    /// The configuration is wrong: every problem as `field: value: rule`; refuse it.
    Invalid(Vec<String>),
}

impl FilterConfig {
    /// The configuration from what the host gave at `on_configure`: `Ok(None)` (no
    /// configuration) means all defaults; a host failure is never read as "no configuration".
    pub fn from_plugin(read: Result<Option<Vec<u8>>, ()>) -> Result<Self, Refusal> {
        match read {
            Ok(bytes) => {
                Self::from_json(bytes.as_deref().unwrap_or_default()).map_err(Refusal::Invalid)
            }
            Err(()) => Err(Refusal::Unreadable(
                "the host could not give the plugin configuration: running unconfigured, every \
                 request passes untouched (prewarm_filter_unconfigured_total)"
                    .into(),
            )),
        }
    }

    /// Parses the plugin configuration (empty means all defaults) and validates it.
    pub fn from_json(bytes: &[u8]) -> Result<Self, Vec<String>> {
        let config: Self = if bytes.iter().all(u8::is_ascii_whitespace) {
            Self::default()
        } else {
            serde_json::from_slice(bytes).map_err(|e| vec![name_bad_field(bytes, &e)])?
        };
        let problems = config.validate();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems)
        }
    }

    /// How prompts are cut into blocks.
    pub fn fingerprint(&self) -> FingerprintConfig {
        FingerprintConfig {
            block_tokens: self.block_tokens,
            max_prefix_tokens: self.max_prefix_tokens,
        }
    }

    /// Every problem, as `field: value: rule`.
    pub fn validate(&self) -> Vec<String> {
        let mut p = self.fingerprint().validate();
        p.extend(self.triggers.validate("triggers."));
        if self.gateway_cluster.is_empty() {
            p.push("gateway_cluster: \"\": must not be empty".into());
        }
        if self.gateway_authority.is_empty() {
            p.push("gateway_authority: \"\": must not be empty".into());
        }
        if let Some(token) = &self.gateway_token {
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                p.push("gateway_token: (hidden): must be non-empty visible ASCII".into());
            }
        }
        range(
            &mut p,
            "gateway_timeout_ms",
            self.gateway_timeout_ms,
            1,
            60_000,
        );
        range(&mut p, "tick_period_ms", self.tick_period_ms, 10, 60_000);
        range(
            &mut p,
            "max_batch_signals",
            self.max_batch_signals,
            1,
            MAX_BATCH_SIGNALS,
        );
        range(
            &mut p,
            "max_pending_signals",
            self.max_pending_signals,
            1,
            100_000,
        );
        range(
            &mut p,
            "max_pending_served",
            self.max_pending_served,
            1,
            100_000,
        );
        range(
            &mut p,
            "max_pending_outcomes",
            self.max_pending_outcomes,
            1,
            100_000,
        );
        range(
            &mut p,
            "max_batch_bytes",
            self.max_batch_bytes,
            4096,
            MAX_SIGNAL_BATCH_BYTES,
        );
        if self.source.len() > MAX_NAME_BYTES {
            p.push(format!(
                "source: {} bytes: must be at most {MAX_NAME_BYTES}",
                self.source.len()
            ));
        }
        // one signal of the largest size must fit a batch, or it would never be sent
        let most = self
            .max_batch_bytes
            .saturating_sub(SignalBatch::envelope_bytes(&self.source))
            .saturating_sub(1);
        range(&mut p, "max_signal_bytes", self.max_signal_bytes, 256, most);
        range(&mut p, "max_body_bytes", self.max_body_bytes, 1, 16 << 20);
        range(&mut p, "sketch_size", self.sketch_size, 1, 1024);
        range(
            &mut p,
            "rate_window_ms",
            self.rate_window_ms,
            1000,
            3_600_000,
        );
        range(&mut p, "user_slots", self.user_slots, 1, 1 << 20);
        range(&mut p, "pattern_slots", self.pattern_slots, 1, 1 << 20);
        range(&mut p, "adapter_slots", self.adapter_slots, 1, 1 << 20);
        range(
            &mut p,
            "shared_prompt_slots",
            self.shared_prompt_slots,
            1,
            1 << 20,
        );
        range(
            &mut p,
            "shared_prompt_tally_bytes",
            self.shared_prompt_tally_bytes,
            64 << 10,
            1 << 30,
        );
        range(
            &mut p,
            "prefix_slots",
            self.prefix_slots,
            1,
            prewarm_core::prefix::MAX_SLOTS,
        );
        range(
            &mut p,
            "prefix_horizon_ms",
            self.prefix_horizon_ms,
            1000,
            86_400_000,
        );
        range(&mut p, "cas_retries", self.cas_retries, 1, 100);
        range(
            &mut p,
            "endpoint_alternatives",
            self.endpoint_alternatives,
            0,
            16,
        );
        header_name(&mut p, "endpoint_header", &self.endpoint_header);
        if self.endpoint_header_owner == EndpointHeaderOwner::External && self.routing {
            p.push(
                "endpoint_header_owner: \"external\": needs \"routing\": false (the other router \
                 names the pod; the filter only records it)"
                    .into(),
            );
        }
        header_name(&mut p, "arm_header", &self.arm_header);
        for (field, header) in [
            ("tenant_header", &self.tenant_header),
            ("user_header", &self.user_header),
        ] {
            if let Some(h) = header {
                header_name(&mut p, field, h);
            }
        }
        if self.credential_headers.len() > MAX_CREDENTIAL_HEADERS {
            p.push(format!(
                "credential_headers: {} headers: must be at most {MAX_CREDENTIAL_HEADERS}",
                self.credential_headers.len()
            ));
        }
        for h in &self.credential_headers {
            header_name(&mut p, "credential_headers", h);
        }
        if let Some(key) = &self.credential_key {
            if !(16..=256).contains(&key.len()) || !key.bytes().all(|b| b.is_ascii_graphic()) {
                p.push("credential_key: (hidden): must be 16 to 256 bytes of visible ASCII".into());
            }
        }
        if self.inference_paths.is_empty() {
            p.push("inference_paths: {}: must name at least one path".into());
        }
        for path in self.inference_paths.keys() {
            if !path.starts_with('/') || path.contains(['?', '#']) {
                p.push(format!(
                    "inference_paths: {path:?}: must be a path starting with / without query"
                ));
            }
        }
        p.extend(crate::direct::config::validate(self));
        p.extend(self.embedding_cache.validate());
        if self.shared_prefix.is_empty() || self.shared_prefix.len() > 64 {
            p.push(format!(
                "shared_prefix: {:?}: must be 1 to 64 bytes",
                self.shared_prefix
            ));
        }
        p
    }

    /// The endpoint a request path is parsed as, ignoring any query string.
    pub fn endpoint_of(&self, path: &str) -> Option<Endpoint> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        self.inference_paths.get(path).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_configuration_is_the_defaults() {
        let c = FilterConfig::from_json(b"").unwrap();
        assert_eq!(c, FilterConfig::default());
        assert_eq!(c.triggers.similar_prompts, 3);
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(
            c.endpoint_of("/v1/chat/completions?x=1"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(c.endpoint_of("/v1/models"), None);
    }

    #[test]
    fn bad_values_name_field_value_and_rule() {
        let e = FilterConfig::from_json(
            br#"{"tick_period_ms":0,"endpoint_header":"X Bad","triggers":{"similarity_threshold":2.0}}"#,
        )
        .unwrap_err();
        assert!(e.contains(&"tick_period_ms: 0: must be between 10 and 60000".to_string()));
        assert!(e
            .iter()
            .any(|p| p.starts_with("endpoint_header: \"X Bad\":")));
        assert!(e
            .iter()
            .any(|p| p.starts_with("triggers.similarity_threshold: 2:")));
    }

    #[test]
    fn a_configuration_the_host_could_not_give_is_not_the_defaults() {
        assert!(matches!(
            FilterConfig::from_plugin(Err(())),
            Err(Refusal::Unreadable(_))
        ));
        assert_eq!(
            FilterConfig::from_plugin(Ok(None)),
            Ok(FilterConfig::default())
        );
        assert!(matches!(
            FilterConfig::from_plugin(Ok(Some(b"{".to_vec()))),
            Err(Refusal::Invalid(_))
        ));
    }

    #[test]
    fn batch_limits_agree_with_the_gateway_by_construction() {
        let e = FilterConfig::from_json(br#"{"max_batch_bytes":4194305}"#).unwrap_err();
        assert!(
            e[0].starts_with("max_batch_bytes: 4194305: must be between 4096 and 4194304"),
            "{e:?}"
        );
        let e = FilterConfig::from_json(br#"{"max_batch_bytes":65536,"max_signal_bytes":65536}"#)
            .unwrap_err();
        assert!(
            e[0].starts_with("max_signal_bytes: 65536: must be between 256 and "),
            "{e:?}"
        );
        assert!(FilterConfig::from_json(br#"{"max_pending_bytes":1024}"#).is_err());
    }

    #[test]
    fn shared_prompt_and_credential_settings_are_checked_by_name() {
        let e = FilterConfig::from_json(
            br#"{"triggers":{"shared_prompts":1},"shared_prompt_slots":0,
                "shared_prompt_tally_bytes":10,"credential_headers":["Authorization"],
                "credential_key":"short-secret"}"#,
        )
        .unwrap_err();
        for field in [
            "triggers.shared_prompts: 1:",
            "shared_prompt_slots: 0:",
            "shared_prompt_tally_bytes: 10:",
            "credential_headers: \"Authorization\":",
            "credential_key: (hidden):",
        ] {
            assert!(e.iter().any(|p| p.starts_with(field)), "{field} in {e:?}");
        }
        assert!(
            !e.iter().any(|p| p.contains("short-secret")),
            "a key is never echoed"
        );
        let c = FilterConfig::from_json(br#"{"triggers":{"shared_prompts":null}}"#).unwrap();
        assert_eq!(c.triggers.shared_prompt_threshold(), 3);
    }

    #[test]
    fn the_endpoint_header_owner_is_checked_by_name() {
        assert_eq!(
            FilterConfig::default().endpoint_header_owner,
            EndpointHeaderOwner::Prewarm
        );
        let c = FilterConfig::from_json(br#"{"endpoint_header_owner":"external","routing":false}"#)
            .unwrap();
        assert_eq!(c.endpoint_header_owner, EndpointHeaderOwner::External);
        let e = FilterConfig::from_json(br#"{"endpoint_header_owner":"epp","routing":false}"#)
            .unwrap_err();
        assert!(
            e[0].starts_with("endpoint_header_owner: \"epp\": unknown variant"),
            "{e:?}"
        );
        // the other router names the pod: a filter that also routes would fight it
        let e = FilterConfig::from_json(br#"{"endpoint_header_owner":"external"}"#).unwrap_err();
        assert_eq!(
            e,
            vec![
                "endpoint_header_owner: \"external\": needs \"routing\": false (the other \
                  router names the pod; the filter only records it)"
                    .to_string()
            ]
        );
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused_by_name() {
        let e = FilterConfig::from_json(br#"{"tick_period":5}"#).unwrap_err();
        assert!(e[0].contains("unknown field `tick_period`"), "{e:?}");
        let e = FilterConfig::from_json(br#"{"block_tokens":"x"}"#).unwrap_err();
        assert!(
            e[0].starts_with("block_tokens: \"x\": invalid type"),
            "{e:?}"
        );
        let e = FilterConfig::from_json(br#"{"block_tokens":48}"#).unwrap_err();
        assert!(e[0].starts_with("block_tokens: 48:"), "{e:?}");
    }
}
