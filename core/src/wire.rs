//! The wire contract between filter and gateway: [`SignalBatch`] (filter → gateway,
//! `POST /v1/signals`) and [`RoutingTable`] (gateway → filter, `GET /v1/routing`).
//!
//! Both are JSON with a `version` field `"MAJOR.MINOR"`. Unknown fields are ignored, so a newer
//! minor version can add fields; a different major version is rejected with
//! [`WireError::IncompatibleVersion`]. Block hashes travel as 16-digit hex strings (a u64 does
//! not survive a JavaScript JSON reader).

use serde::{Deserialize, Serialize};

use crate::fingerprint::BlockHash;
use crate::request::Endpoint;

/// The major version this build speaks.
pub const WIRE_MAJOR: u32 = 1;
/// The full version this build writes.
pub const WIRE_VERSION: &str = "1.0";

/// Why a wire document was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("version: {found:?}: incompatible, this build speaks {WIRE_MAJOR}.x")]
    IncompatibleVersion { found: String },
    #[error("{0}")]
    Malformed(String),
}

fn check_version(version: &str) -> Result<(), WireError> {
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major == Some(WIRE_MAJOR) {
        Ok(())
    } else {
        Err(WireError::IncompatibleVersion {
            found: version.to_string(),
        })
    }
}

/// Whether a prefill pattern was seen before by the filter that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternState {
    /// First time this pattern is seen.
    New,
    /// Seen before.
    Known,
}

/// A template became hot: its common prefix should be warm where it is routed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillSignal {
    /// The `model` of the requests: base model or adapter name (the chain's seed).
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub endpoint: Endpoint,
    /// The common block prefix, chained hashes in order.
    pub prefix: Vec<BlockHash>,
    /// Tokens the prefix covers (`prefix.len() × block_tokens`).
    pub prefix_tokens: usize,
    /// The canonical text of the prefix (cut back to a character boundary), what a prefill sends.
    pub prefix_text: String,
    pub state: PatternState,
    /// In [0, 100).
    pub priority: u8,
}

/// An adapter is busy: keep it resident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinSignal {
    pub adapter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub rate_per_minute: f64,
    /// In [0, 100).
    pub priority: u8,
}

/// What became of a hot prefix: feedback that raises its hotness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackOutcome {
    /// A request used the prefix (+0.3 hotness).
    Adopted,
    /// A request that used it got a successful response (+0.5 hotness).
    Succeeded,
}

/// Feedback on a prefix that was signalled before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackSignal {
    pub model: String,
    /// The last hash of the prefix that was signalled.
    pub prefix: BlockHash,
    pub outcome: FeedbackOutcome,
    /// Requests this feedback stands for (≥ 1).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// One signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Signal {
    Prefill(PrefillSignal),
    Pin(PinSignal),
    Feedback(FeedbackSignal),
}

/// A request the filter routed, as the gateway's KV model needs it to age the pod's modelled
/// cache as the pod's own cache ages: the pod, the model, the chain hash of each 512-token
/// shard's last full block, and the prompt's tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedRecord {
    /// The pod's id in the routing table.
    pub pod: String,
    /// The request's `model`: the base model or an adapter.
    pub model: String,
    /// One hash a shard, in order (core's `shards_of` over the prompt's chain).
    pub shards: Vec<BlockHash>,
    /// Tokens the chain's full blocks cover.
    pub chained_tokens: u64,
    /// The prompt's tokens (estimated as the filter estimates them).
    pub prompt_tokens: u64,
}

/// Records one batch carries at most; a filter drops (and counts) the rest.
pub const MAX_SERVED_PER_BATCH: usize = 1024;

impl ServedRecord {
    /// The record of a request for `model` with `chain`, sent to `pod`.
    pub fn of(
        pod: &str,
        model: &str,
        chain: &crate::BlockChain,
        prompt_tokens: u64,
        config: &crate::FingerprintConfig,
    ) -> Self {
        Self {
            pod: pod.to_string(),
            model: model.to_string(),
            shards: chain.shards(config).iter().map(|s| s.last_block).collect(),
            chained_tokens: (chain.blocks.len() as u64).saturating_mul(config.block_tokens as u64),
            prompt_tokens,
        }
    }

    /// The shards again, as core's `shards_of` made them.
    pub fn shards(&self) -> Vec<crate::Shard> {
        crate::fingerprint::shards_from_hashes(&self.shards, self.chained_tokens)
    }
}

/// Signals one filter sends in one POST.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalBatch {
    pub version: String,
    /// Which filter instance sent it (free text, for logs).
    #[serde(default)]
    pub source: String,
    /// Sender's clock, ms since the Unix epoch.
    #[serde(default)]
    pub sent_at_ms: u64,
    /// Signals the sender had to drop since its last batch (queue full).
    #[serde(default)]
    pub dropped: u64,
    pub signals: Vec<Signal>,
    /// Requests the filter routed since its last batch (at most [`MAX_SERVED_PER_BATCH`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served: Vec<ServedRecord>,
    /// Served records the sender had to drop since its last batch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub served_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl SignalBatch {
    /// A batch of the current version.
    pub fn new(source: impl Into<String>, sent_at_ms: u64, signals: Vec<Signal>) -> Self {
        Self {
            version: WIRE_VERSION.to_string(),
            source: source.into(),
            sent_at_ms,
            dropped: 0,
            signals,
            served: Vec::new(),
            served_dropped: 0,
        }
    }

    /// Decodes and checks the version.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode_versioned(bytes, "signals", |b: &Self| &b.version)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[derive(Deserialize)]
struct VersionOnly {
    version: String,
}

/// One parse in the common case; only a document that does not parse is read again for its
/// version, so that another major version is reported as such rather than as malformed.
fn decode_versioned<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    version: impl Fn(&T) -> &String,
) -> Result<T, WireError> {
    match serde_json::from_slice::<T>(bytes) {
        Ok(doc) => {
            check_version(version(&doc))?;
            Ok(doc)
        }
        Err(e) => match serde_json::from_slice::<VersionOnly>(bytes) {
            Ok(v) => {
                check_version(&v.version)?;
                Err(WireError::Malformed(format!("{what}: {e}")))
            }
            Err(not_a_document) => Err(WireError::Malformed(format!("body: {not_a_document}"))),
        },
    }
}

/// A pod as the filter routes to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutedPod {
    /// The pod's identity in placement (stable across restarts of the pod).
    pub id: String,
    /// What goes in the endpoint header: `host:port` of the pod as Envoy's cluster knows it.
    pub address: String,
    /// Placement weight (> 0).
    #[serde(default = "unit_weight")]
    pub weight: f64,
    /// Adapters resident (or being kept resident) on the pod.
    #[serde(default)]
    pub adapters: Vec<String>,
    /// Utilisation in [0, 1] for bounded-load placement, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
}

fn unit_weight() -> f64 {
    1.0
}

/// The routing table the gateway serves and every filter worker routes with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingTable {
    pub version: String,
    /// Increases with every change of the table's content.
    pub generation: u64,
    /// Gateway clock at build, ms since the Unix epoch.
    #[serde(default)]
    pub generated_at_ms: u64,
    /// Block size the gateway fingerprints with; a filter configured otherwise does not route.
    pub block_tokens: usize,
    /// Bounded-load factor (≥ 1) when loads are given; `None`: plain rendezvous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_factor: Option<f64>,
    /// Pods in the table: only pods whose first warm-up tier is done (or whose deadline passed).
    pub pods: Vec<RoutedPod>,
}

impl RoutingTable {
    /// Decodes and checks the version.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode_versioned(bytes, "table", |t: &Self| &t.version)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> SignalBatch {
        SignalBatch::new(
            "envoy-1",
            42,
            vec![
                Signal::Prefill(PrefillSignal {
                    model: "m".into(),
                    tenant: Some("acme".into()),
                    endpoint: Endpoint::ChatCompletions,
                    prefix: vec![BlockHash(u64::MAX), BlockHash(1)],
                    prefix_tokens: 128,
                    prefix_text: "text".into(),
                    state: PatternState::New,
                    priority: 12,
                }),
                Signal::Pin(PinSignal {
                    adapter: "sql-lora".into(),
                    tenant: None,
                    rate_per_minute: 6.0,
                    priority: 23,
                }),
                Signal::Feedback(FeedbackSignal {
                    model: "m".into(),
                    prefix: BlockHash(7),
                    outcome: FeedbackOutcome::Adopted,
                    count: 2,
                }),
            ],
        )
    }

    #[test]
    fn batch_round_trips_with_hex_hashes() {
        let b = batch();
        let bytes = b.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains(r#""prefix":["ffffffffffffffff","0000000000000001"]"#));
        assert!(text.contains(r#""kind":"prefill""#));
        assert_eq!(SignalBatch::decode(&bytes).unwrap(), b);
    }

    #[test]
    fn unknown_fields_are_ignored_and_minor_versions_accepted() {
        let doc = br#"{"version":"1.7","future":true,"signals":[{"kind":"pin","adapter":"a","rate_per_minute":5,"priority":1,"new_field":[]}]}"#;
        let b = SignalBatch::decode(doc).unwrap();
        assert_eq!(b.signals.len(), 1);
    }

    #[test]
    fn other_major_versions_are_rejected_clearly() {
        let e = SignalBatch::decode(br#"{"version":"2.0","signals":[]}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"version: "2.0": incompatible, this build speaks 1.x"#
        );
        let e = RoutingTable::decode(br#"{"version":"x","generation":1}"#).unwrap_err();
        assert!(matches!(e, WireError::IncompatibleVersion { .. }));
        assert!(matches!(
            RoutingTable::decode(b"garbage").unwrap_err(),
            WireError::Malformed(_)
        ));
    }

    #[test]
    fn table_round_trips() {
        let t = RoutingTable {
            version: WIRE_VERSION.into(),
            generation: 3,
            generated_at_ms: 9,
            block_tokens: 64,
            load_factor: None,
            pods: vec![RoutedPod {
                id: "pod-a".into(),
                address: "127.0.0.1:8001".into(),
                weight: 1.0,
                adapters: vec!["sql-lora".into()],
                load: Some(0.5),
            }],
        };
        assert_eq!(RoutingTable::decode(&t.encode()).unwrap(), t);
        let minimal = br#"{"version":"1.0","generation":1,"block_tokens":64,"pods":[{"id":"a","address":"h:1"}]}"#;
        let m = RoutingTable::decode(minimal).unwrap();
        assert_eq!(m.pods[0].weight, 1.0);
    }
}
