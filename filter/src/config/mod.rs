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
//! needs to see a typo's right spelling (and `tests/docs_match_code.rs` reads them), and takes a
//! repeated key silently: the top-level keys are checked as they are read against the union of
//! the sections' keys, read from serde itself ([`field_names`]); an unknown one is refused with
//! that list, a repeated one by name ([`CheckedKeys`]).

mod checked_keys;
mod field_names;
mod gateway;
mod identity;
mod requests;
mod routing;
mod shared_data;
mod signals;

use std::sync::OnceLock;

use prewarm_core::wire::SignalBatch;
use serde::{Deserialize, Deserializer};

use self::checked_keys::CheckedKeys;
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
// `Deserialize` impl below calls with the top-level keys checked (called alone it still refuses
// an unknown key, `deny_unknown_fields`, but without the list, and takes a repeated one).
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
    /// Reads the sections with the top-level keys checked as they are read
    /// ([`CheckedKeys`]: an unknown key is refused listing every accepted one).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        FilterConfig::deserialize(CheckedKeys {
            inner: deserializer,
            keys: top_level_keys(),
        })
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
mod tests;
