//! The filter's configuration: the JSON in the plugin's `configuration`, with a default for
//! every field (see `docs/filter-config.md`) and a validation that names every bad field as
//! `field: value: rule`. A configuration that does not validate is refused at `on_configure`.
//!
//! In code the fields are grouped by concern into sections, each a struct that validates its
//! own fields: [`GatewayConfig`], [`SignalsConfig`], [`RequestsConfig`], [`RoutingConfig`],
//! [`IdentityConfig`], [`SharedDataConfig`], [`DirectConfig`] and [`EmbeddingsConfig`] (the
//! `embedding_cache` table). The JSON stays flat: every section is `#[serde(flatten)]`ed, so a
//! key is written at the top level as it always was (`"tick_period_ms": 1000`, not
//! `"gateway": {...}`) and every shipped manifest, test and the reference keep working. Problems
//! still name the flat key. Rules between sections are [`FilterConfig::validate`]'s.
//!
//! serde's `flatten` refuses an unknown key without listing the accepted ones, which an operator
//! needs to see a typo's right spelling (and `tests/docs_match_code.rs` reads them): the
//! top-level keys are checked first against the union of the sections' keys, read from serde
//! itself ([`field_names`]), and an unknown one is refused with that list.

mod field_names;
mod gateway;
mod identity;
mod requests;
mod routing;
mod shared_data;
mod signals;

use std::sync::OnceLock;

use prewarm_core::wire::SignalBatch;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use self::field_names::field_names;
pub use self::gateway::GatewayConfig;
pub use self::identity::{IdentityConfig, MAX_CREDENTIAL_HEADERS};
pub use self::requests::RequestsConfig;
pub use self::routing::{EndpointHeaderOwner, RoutingConfig};
pub use self::shared_data::SharedDataConfig;
pub use self::signals::{SignalsConfig, MAX_BATCH_SIGNALS};
pub use crate::direct::config::{DirectConfig, DirectMode, DirectPod};
pub use crate::embeddings::config::{EmbeddingCacheConfig, EmbeddingsConfig};
pub use crate::request::stage::Stage;

/// Everything the filter can be told, by section; the JSON is flat (every section's keys at the
/// top level). Durations are milliseconds, sizes bytes.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
// `remote = "Self"`: the derive becomes an inherent `FilterConfig::deserialize`, which the
// `Deserialize` impl below calls once the top-level keys are known to be accepted ones.
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Calls to the gateway and the tick.
    #[serde(flatten)]
    pub gateway: GatewayConfig,
    /// What makes signals, and the bounds of what waits for and goes in a batch.
    #[serde(flatten)]
    pub signals: SignalsConfig,
    /// What is inspected of a request and how its prompt is fingerprinted.
    #[serde(flatten)]
    pub requests: RequestsConfig,
    /// The headers the filter writes: the pod, its alternatives, the experiment arm.
    #[serde(flatten)]
    pub routing: RoutingConfig,
    /// Who a request's user and tenant are.
    #[serde(flatten)]
    pub identity: IdentityConfig,
    /// Shared data's key prefix and slots.
    #[serde(flatten)]
    pub shared_data: SharedDataConfig,
    /// The prefills and adapter touches the filter sends to the pods itself.
    #[serde(flatten)]
    pub direct: DirectConfig,
    /// The embedding cache (the `embedding_cache` table; off by default).
    #[serde(flatten)]
    pub embeddings: EmbeddingsConfig,
}

/// Every key the configuration accepts at its top level: the union of its sections' keys, in
/// section order.
pub fn top_level_keys() -> &'static [&'static str] {
    static KEYS: OnceLock<Vec<&'static str>> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            field_names::<GatewayConfig>(),
            field_names::<SignalsConfig>(),
            field_names::<RequestsConfig>(),
            field_names::<RoutingConfig>(),
            field_names::<IdentityConfig>(),
            field_names::<SharedDataConfig>(),
            field_names::<DirectConfig>(),
            field_names::<EmbeddingsConfig>(),
        ]
        .concat()
    })
}

impl<'de> Deserialize<'de> for FilterConfig {
    /// Refuses an unknown top-level key as serde refuses one of a plain struct, listing every
    /// accepted key, then reads the sections.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let object = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let keys = top_level_keys();
        if let Some(unknown) = object.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(D::Error::unknown_field(unknown, keys));
        }
        FilterConfig::deserialize(serde_json::Value::Object(object)).map_err(D::Error::custom)
    }
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

    /// Every problem, as `field: value: rule`: each section's, then the rules between
    /// sections.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.gateway.validate(&mut p);
        self.signals.validate(&mut p);
        self.requests.validate(&mut p);
        self.routing.validate(&mut p);
        self.identity.validate(&mut p);
        self.shared_data.validate(&mut p);
        self.direct.validate(&mut p);
        self.embeddings.validate(&mut p);
        // one signal of the largest size must fit a batch with its envelope (which names the
        // `source`), or it would never be sent
        let most = self
            .signals
            .max_batch_bytes
            .saturating_sub(SignalBatch::envelope_bytes(&self.gateway.source))
            .saturating_sub(1);
        range(
            &mut p,
            "max_signal_bytes",
            self.signals.max_signal_bytes,
            256,
            most,
        );
        if self.direct.direct_host_header == self.routing.endpoint_header {
            p.push(format!(
                "direct_host_header: {:?}: must differ from endpoint_header",
                self.direct.direct_host_header
            ));
        }
        // the largest prefill (the whole fingerprinted prefix and one token) must fit a minute
        let largest = (self.requests.max_prefix_tokens as u64).saturating_add(1);
        range(
            &mut p,
            "direct_prefill_tokens_per_min",
            self.direct.direct_prefill_tokens_per_min,
            largest,
            1 << 40,
        );
        p
    }
}

#[cfg(test)]
mod tests {
    use prewarm_core::Endpoint;

    use super::*;

    #[test]
    fn empty_configuration_is_the_defaults() {
        let c = FilterConfig::from_json(b"").unwrap();
        assert_eq!(c, FilterConfig::default());
        assert_eq!(c.signals.triggers.similar_prompts, 3);
        assert_eq!(c.requests.max_body_bytes, 1 << 20);
        assert_eq!(
            c.requests.endpoint_of("/v1/chat/completions?x=1"),
            Some(Endpoint::ChatCompletions)
        );
        assert_eq!(c.requests.endpoint_of("/v1/models"), None);
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
        assert_eq!(c.signals.triggers.shared_prompt_threshold(), 3);
    }

    #[test]
    fn the_endpoint_header_owner_is_checked_by_name() {
        assert_eq!(
            FilterConfig::default().routing.endpoint_header_owner,
            EndpointHeaderOwner::Prewarm
        );
        let c = FilterConfig::from_json(br#"{"endpoint_header_owner":"external","routing":false}"#)
            .unwrap();
        assert_eq!(
            c.routing.endpoint_header_owner,
            EndpointHeaderOwner::External
        );
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

    #[test]
    fn the_defaults_are_what_an_empty_object_reads_and_they_validate() {
        assert_eq!(FilterConfig::from_json(b"{}"), Ok(FilterConfig::default()));
        assert_eq!(FilterConfig::default().validate(), Vec::<String>::new());
    }

    #[test]
    fn every_section_has_its_own_keys() {
        let keys = top_level_keys();
        let mut unique = keys.to_vec();
        unique.sort_unstable();
        unique.dedup();
        // a key in two sections would be read by the first alone
        assert_eq!(unique.len(), keys.len(), "{keys:?}");
        assert_eq!(keys.len(), 50, "{keys:?}");
        for key in [
            "routing",
            "embedding_cache",
            "triggers",
            "direct_pods",
            "source",
        ] {
            assert!(keys.contains(&key), "{key} in {keys:?}");
        }
    }

    #[test]
    fn an_unknown_key_is_refused_with_every_accepted_key() {
        let e = FilterConfig::from_json(br#"{"tick_period_ms":5,"probe":1}"#).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        let expected = e[0]
            .split_once("unknown field `probe`, expected one of ")
            .unwrap_or_else(|| panic!("{e:?}"))
            .1;
        // keys of several sections, the first and the last
        for key in [
            "`gateway_cluster`",
            "`max_batch_bytes`",
            "`block_tokens`",
            "`routing`",
            "`credential_key`",
            "`prefix_slots`",
            "`direct_takeover_after_ms`",
            "`embedding_cache`",
        ] {
            assert!(expected.contains(key), "{key} in {expected}");
        }
        assert_eq!(expected.matches('`').count(), 2 * top_level_keys().len());
        // straight from serde too (what the docs test reads)
        let e = serde_json::from_str::<FilterConfig>(r#"{"probe":1}"#).unwrap_err();
        assert!(e.to_string().contains("`shared_prefix`"), "{e}");
    }

    #[test]
    fn a_misspelt_key_of_a_section_is_refused_by_name() {
        let e = FilterConfig::from_json(br#"{"direct_timeout":5}"#).unwrap_err();
        assert!(
            e[0].contains("unknown field `direct_timeout`, expected one of")
                && e[0].contains("`direct_timeout_ms`"),
            "{e:?}"
        );
        let e = FilterConfig::from_json(br#"{"embedding_cache":{"ttl":5}}"#).unwrap_err();
        assert!(
            e[0].starts_with("embedding_cache: {\"ttl\":5}: unknown field `ttl`, expected one of")
                && e[0].contains("`ttl_ms`"),
            "{e:?}"
        );
        let e = FilterConfig::from_json(br#"{"triggers":{"similar_prompt":3}}"#).unwrap_err();
        assert!(e[0].contains("unknown field `similar_prompt`"), "{e:?}");
        assert!(FilterConfig::from_json(b"[]").is_err());
    }

    #[test]
    fn rules_between_sections_name_their_field() {
        let e = FilterConfig::from_json(
            br#"{"direct_host_header":"x-pod","endpoint_header":"x-pod",
                "max_prefix_tokens":65536,"direct_prefill_tokens_per_min":65536}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            [
                "direct_host_header: \"x-pod\": must differ from endpoint_header",
                "direct_prefill_tokens_per_min: 65536: must be between 65537 and 1099511627776",
            ]
        );
    }
}
