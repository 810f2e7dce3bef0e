//! The wire contract between filter and gateway: [`SignalBatch`] (filter → gateway,
//! `POST /v1/signals`) and [`RoutingTable`] (gateway → filter, `GET /v1/routing`).
//!
//! Both are JSON with a `version` field `"MAJOR.MINOR"`. Unknown fields are ignored, so a newer
//! minor version can add fields; a different major version is rejected with
//! [`WireError::IncompatibleVersion`]. Block hashes travel as 16-digit hex strings (a u64 does
//! not survive a JavaScript JSON reader).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::address::{is_pod_address, ADDRESS_RULE};
use crate::experiment::Experiment;
use crate::fingerprint::BlockHash;
use crate::request::Endpoint;

/// The major version this build speaks.
pub const WIRE_MAJOR: u32 = 1;
/// The full version this build writes.
pub const WIRE_VERSION: &str = "1.0";

/// Longest name that travels in a signal or a table (a `model`, an adapter, a tenant, a pod id),
/// bytes. A Hugging Face repo id is at most 96 + 1 + 96 bytes and the gateway registers adapter
/// names of at most 128; 256 leaves room for a local path as a served model name while keeping
/// every per-name tally small.
pub const MAX_NAME_BYTES: usize = 256;

/// Largest `POST /v1/signals` body the gateway accepts by default, bytes. The filter's batches
/// are cut to at most this (its `max_batch_bytes` cannot exceed it), so the two agree by
/// construction.
pub const MAX_SIGNAL_BATCH_BYTES: usize = 4 << 20;

/// Most pods a routing table may list.
pub const MAX_TABLE_PODS: usize = 4096;

/// Most adapters a pod's table entry may mark resident, and most GPU adapter slots the gateway
/// accepts for a pod (`max_loras`; vLLM's `--max-loras` is single digits to a few dozen in
/// practice). The bound keeps the filter's per-request residency check and the table's
/// validation small.
pub const MAX_RESIDENT_ADAPTERS: usize = 1024;

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
    /// Whether the prefix joins its pod's warm set (kept warm); `false` from an experiment arm
    /// with `keep_warm: false`. Absent: `true`.
    #[serde(default = "keep_warm_default", skip_serializing_if = "is_true")]
    pub keep_warm: bool,
    /// How the prefix's requests reached the engine (chat messages over `prefix_text`, tools,
    /// kwargs, salt), so warm calls repeat it (`crate::warm_shape`). Absent: a completion, or
    /// a filter older than this field (warmed as a completion of `prefix_text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<crate::warm_shape::WarmShape>,
}

fn keep_warm_default() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
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

/// One request's outcome as the client saw it at the proxy, for experiments' attribution
/// (`docs/experiments.md#outcomes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeRecord {
    /// The request's arm, `<experiment>/<arm>`; `None` outside an experiment (the period
    /// before one is the baseline of difference-in-differences).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arm: Option<String>,
    /// The pod the filter sent it to (`None`: not routed by the filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The request's `model` (an adapter's name for a LoRA request): an adapter rollout is
    /// judged on its requests' errors. `None` from filters older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// When its headers reached the filter, ms since the Unix epoch.
    pub at_ms: u64,
    /// From its headers reaching the filter to the first response body byte (no body: the
    /// response headers), ms.
    pub ttfb_ms: u64,
    /// The response status (Envoy's own for a local reply).
    pub status: u16,
    /// Whether the request asked to stream.
    pub stream: bool,
    /// `usage.prompt_tokens` of the response, when it carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`, when it carried one (vLLM with
    /// `--enable-prompt-tokens-details`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// The prompt's routing key (core's `BlockChain::routing_key`: the chain hash of its first
    /// 512-token shard's last full block, or of its last full block when it is shorter): a
    /// prefix identity every arm computes alike, whatever it routes by, so the gateway can tell
    /// a pod's first request of a prefix; `None` for a prompt without a full block, or from
    /// filters older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<BlockHash>,
}

/// Outcome records one batch carries at most; a filter drops (and counts) the rest.
pub const MAX_OUTCOMES_PER_BATCH: usize = 1024;
/// Longest time to first byte an outcome may report, ms (an hour).
pub const MAX_OUTCOME_TTFB_MS: u64 = 3_600_000;

impl OutcomeRecord {
    /// What makes the record impossible, if anything: a status outside 100..=599, a time to
    /// first byte above [`MAX_OUTCOME_TTFB_MS`], more cached than prompt tokens, a prompt above
    /// 10 M tokens, an arm, pod or model name above the name cap.
    pub fn problem(&self) -> Option<&'static str> {
        if !(100..=599).contains(&self.status) {
            return Some("status");
        }
        if self.ttfb_ms > MAX_OUTCOME_TTFB_MS {
            return Some("ttfb_ms");
        }
        if self.prompt_tokens.is_some_and(|p| p > 10_000_000) {
            return Some("prompt_tokens");
        }
        if let (Some(cached), prompt) = (self.cached_tokens, self.prompt_tokens) {
            if prompt.is_none_or(|p| cached > p) {
                return Some("cached_tokens");
            }
        }
        let too_long =
            |name: &Option<String>| name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES);
        if too_long(&self.arm) || too_long(&self.pod) || too_long(&self.model) {
            return Some("name");
        }
        None
    }
}

fn check_name(field: &str, i: usize, name: &str) -> Result<(), WireError> {
    check_named("signals", field, i, name)
}

fn check_named(list: &str, field: &str, i: usize, name: &str) -> Result<(), WireError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(WireError::Malformed(format!(
            "{list}[{i}].{field}: {} bytes: at most {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

impl Signal {
    /// The name the signal is about: a prefill's or feedback's `model`, a pin's `adapter`.
    pub fn model(&self) -> &str {
        match self {
            Signal::Prefill(p) => &p.model,
            Signal::Pin(p) => &p.adapter,
            Signal::Feedback(f) => &f.model,
        }
    }

    fn check_names(&self, i: usize) -> Result<(), WireError> {
        let (field, tenant) = match self {
            Signal::Prefill(p) => ("model", p.tenant.as_deref()),
            Signal::Pin(p) => ("adapter", p.tenant.as_deref()),
            Signal::Feedback(_) => ("model", None),
        };
        check_name(field, i, self.model())?;
        check_name("tenant", i, tenant.unwrap_or(""))
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
    /// Requests' outcomes since its last batch (at most [`MAX_OUTCOMES_PER_BATCH`]); the
    /// gateway checks each ([`OutcomeRecord::problem`]) and drops, counted, the impossible ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outcomes: Vec<OutcomeRecord>,
    /// Outcome records the sender had to drop since its last batch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outcomes_dropped: u64,
    /// Embedding inputs the filter stored or answered since its last batch, for the gateway's
    /// warm-up of the embedding cache (at most [`MAX_EMBEDDINGS_PER_BATCH`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub embeddings: Vec<EmbeddingSeen>,
}

/// Embedding records one batch carries at most.
pub const MAX_EMBEDDINGS_PER_BATCH: usize = 1024;
/// Longest single-input request an [`EmbeddingSeen`] carries, bytes.
pub const MAX_EMBEDDING_REQUEST_BYTES: usize = 16 << 10;

/// An embedding input the filter's cache stored (with the request that recomputes it) or
/// answered from the cache (`hits`), for the gateway's warm-up of the cache
/// (`crate::embed_cache`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingSeen {
    pub model: String,
    /// The input's key ([`crate::embed_cache::key_hex`]).
    pub key: String,
    /// The input as a request of its own ([`crate::embed_cache::ParsedEmbeddings::single_input_requests`]), at most
    /// [`MAX_EMBEDDING_REQUEST_BYTES`]; sent when the entry is stored from a pod's response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Requests answered from the cache since the last batch.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub hits: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl EmbeddingSeen {
    /// What makes the record unusable: a bad key, a name above the cap, a request above its
    /// cap or whose key is not `key`.
    pub fn problem(&self) -> Option<&'static str> {
        let Some(key) = crate::embed_cache::key_from_hex(&self.key) else {
            return Some("key");
        };
        if self.model.is_empty() || self.model.len() > MAX_NAME_BYTES {
            return Some("model");
        }
        if let Some(request) = &self.request {
            if request.len() > MAX_EMBEDDING_REQUEST_BYTES {
                return Some("request");
            }
            let keyed = crate::embed_cache::request_keys(request.as_bytes());
            if !matches!(keyed, Ok(r) if r.keys == [key] && r.model == self.model) {
                return Some("request");
            }
        }
        None
    }
}

/// The gateway's warm embedding entries newer than a generation (`GET /v1/embeddings/warm`),
/// which a filter writes into its proxy's shared level of the cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmEmbeddings {
    pub version: String,
    /// The generation of the newest entry listed: the next poll's `after`.
    pub generation: u64,
    /// More entries are newer than `generation` (the reply was cut at its byte bound).
    #[serde(default)]
    pub more: bool,
    pub entries: Vec<WarmEmbedding>,
}

/// One warm entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmEmbedding {
    pub key: String,
    pub expires_ms: u64,
    pub prompt_tokens: u64,
    /// The pod's `embedding` value, raw JSON.
    pub embedding: String,
}

impl WarmEmbeddings {
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode_versioned(bytes, "embeddings", |d: &Self| &d.version)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
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
            outcomes: Vec::new(),
            outcomes_dropped: 0,
            embeddings: Vec::new(),
        }
    }

    /// Decodes, checks the version and the length of every name (see [`MAX_NAME_BYTES`]).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let batch: Self = decode_versioned(bytes, "signals", |b: &Self| &b.version)?;
        for (i, signal) in batch.signals.iter().enumerate() {
            signal.check_names(i)?;
        }
        for (i, record) in batch.served.iter().enumerate() {
            check_named("served", "pod", i, &record.pod)?;
            check_named("served", "model", i, &record.model)?;
        }
        Ok(batch)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Bytes an encoded batch from `source` takes beyond its signals and records: the
    /// envelope with the longest numbers and empty `served` and `outcomes` lists. A batch's
    /// body is at most this plus, per signal and per record, its encoded length + 1 (the
    /// comma), which is how a sender keeps batches under [`MAX_SIGNAL_BATCH_BYTES`].
    pub fn envelope_bytes(source: &str) -> usize {
        let mut empty = Self::new(source, u64::MAX, Vec::new());
        empty.dropped = u64::MAX;
        empty.served_dropped = u64::MAX;
        empty.outcomes_dropped = u64::MAX;
        empty.encode().len()
            + r#","served":[]"#.len()
            + r#","outcomes":[]"#.len()
            + r#","embeddings":[]"#.len()
    }
}

#[derive(Deserialize)]
struct VersionOnly {
    version: String,
}

/// One parse in the common case; only a document that does not parse is read again for its
/// version, so that another major version is reported as such rather than as malformed.
pub(crate) fn decode_versioned<T: serde::de::DeserializeOwned>(
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
    /// Adapters the pod serves without a disk load that requests for them may go to (the
    /// gateway lists an adapter on the pods of its replica set).
    #[serde(default)]
    pub adapters: Vec<String>,
    /// Of `adapters`, those the gateway models as holding one of the pod's GPU slots now (what
    /// it loaded and touched, the requests it saw served, the pod's running lists): a request
    /// for one of them goes to these pods first ([`crate::route::resident_first`]). At most
    /// [`MAX_RESIDENT_ADAPTERS`]; the gateway sends it sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resident: Vec<String>,
    /// Utilisation in [0, 1] for bounded-load placement, when known (the gateway publishes the
    /// share of the last minute the pod was busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// The wait, in ms, a request arriving now is predicted to spend queued on the pod before
    /// it starts, when known (the gateway publishes the last minute's mean queue length over its
    /// completion rate: Little's law, `policy::fleet::wait`); with the table's
    /// `prefill_us_per_token` it decides when a request leaves the pod holding its prefix
    /// (`prefix::route_prefix`). At most [`MAX_WAIT_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// The longest queue wait a table may publish: an hour.
pub const MAX_WAIT_MS: u64 = 3_600_000;

/// The slowest prefill a table may publish, µs per uncached prompt token: a tenth of a second.
pub const MAX_PREFILL_US_PER_TOKEN: f64 = 100_000.0;

impl RoutedPod {
    /// A pod of weight 1 at `address` serving `adapters`, with no residency, load or wait known
    /// (a static pod, or a test's fixture).
    pub fn new(id: &str, address: &str, adapters: &[&str]) -> Self {
        Self {
            id: id.to_string(),
            address: address.to_string(),
            weight: 1.0,
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            resident: Vec::new(),
            load: None,
            wait_ms: None,
        }
    }

    fn problem(&self, i: usize) -> Option<String> {
        if !is_pod_address(&self.address) {
            return Some(format!(
                "pods[{i}].address: {:?}: {ADDRESS_RULE}",
                self.address
            ));
        }
        if self.id.is_empty() || self.id.len() > MAX_NAME_BYTES {
            return Some(format!(
                "pods[{i}].id: {} bytes: must be 1 to {MAX_NAME_BYTES}",
                self.id.len()
            ));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Some(format!(
                "pods[{i}].weight: {}: must be a finite number > 0",
                self.weight
            ));
        }
        if let Some(load) = self.load {
            if !(0.0..=1.0).contains(&load) {
                return Some(format!("pods[{i}].load: {load}: must be in [0, 1]"));
            }
        }
        if let Some(wait) = self.wait_ms.filter(|w| *w > MAX_WAIT_MS) {
            return Some(format!("pods[{i}].wait_ms: {wait}: at most {MAX_WAIT_MS}"));
        }
        if let Some(j) = self
            .adapters
            .iter()
            .position(|a| a.is_empty() || a.len() > MAX_NAME_BYTES)
        {
            return Some(format!(
                "pods[{i}].adapters[{j}]: must be 1 to {MAX_NAME_BYTES} bytes"
            ));
        }
        if self.resident.len() > MAX_RESIDENT_ADAPTERS {
            return Some(format!(
                "pods[{i}].resident: {} adapters: at most {MAX_RESIDENT_ADAPTERS}",
                self.resident.len()
            ));
        }
        if self.resident.is_empty() {
            return None;
        }
        let listed: HashSet<&str> = self.adapters.iter().map(String::as_str).collect();
        self.resident
            .iter()
            .position(|r| !listed.contains(r.as_str()))
            .map(|j| format!("pods[{i}].resident[{j}]: must be one of the pod's adapters"))
    }
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
    /// What prefilling one uncached prompt token costs a pod, µs: with the pods' `wait_ms`, the
    /// price of moving a request off the pod holding its prefix (`prefix::route_prefix`, step
    /// 3). `None`: the load factor's cap decides alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_us_per_token: Option<f64>,
    /// Pods in the table: only pods whose first warm-up tier is done (or whose deadline passed).
    pub pods: Vec<RoutedPod>,
    /// Hot prefixes and the pod the gateway warmed each on: filters write them into their
    /// prefix index (`prefix::seed`) so the prefixes' next requests go there. At most
    /// [`MAX_TABLE_PREFIXES`], each naming a pod of the table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<PlacedPrefix>,
    /// Pods that are up but still in their warm-up: listed only while the experiment has an arm
    /// that routes to cold pods (`ArmSettings::warmup` false), and routed to only by that arm.
    /// A filter without experiments ignores them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warming: Vec<RoutedPod>,
    /// The running experiment: the filters assign each request to one of its arms and route it
    /// with that arm's settings (`experiment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<Experiment>,
}

/// A hot prefix the gateway warmed on a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PlacedPrefix {
    /// The prefix's keys in the filters' index (`prefix::PromptKeys::placed`): its deepest
    /// full shard's end, then its last partial shard's blocks; 1 to [`MAX_PLACED_KEYS`].
    pub keys: Vec<BlockHash>,
    /// The id of the pod it is warm on.
    pub pod: String,
}

/// Most placed prefixes a table carries.
pub const MAX_TABLE_PREFIXES: usize = 1024;
/// Most keys a placed prefix carries (a shard's blocks at the smallest block size, 8 tokens).
pub const MAX_PLACED_KEYS: usize = 64;

impl RoutingTable {
    /// A table of this wire version at `generation` for `block_tokens`-token blocks, routing
    /// among `pods`, with no load factor, prefill price, placed prefixes, warming pods or
    /// experiment (a builder's start, a static table, a test's fixture).
    pub fn of_pods(generation: u64, block_tokens: usize, pods: Vec<RoutedPod>) -> Self {
        Self {
            version: WIRE_VERSION.into(),
            generation,
            generated_at_ms: 0,
            block_tokens,
            load_factor: None,
            prefill_us_per_token: None,
            prefixes: Vec::new(),
            warming: Vec::new(),
            experiment: None,
            pods,
        }
    }

    /// Decodes, checks the version, and checks every pod strictly (see [`RoutingTable::problem`]).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let table: Self = decode_versioned(bytes, "table", |t: &Self| &t.version)?;
        match table.problem() {
            Some(p) => Err(WireError::Malformed(p)),
            None => Ok(table),
        }
    }

    /// The first thing wrong with the table, as `field: value: rule`: more than
    /// [`MAX_TABLE_PODS`] pods, an address that is not a pod address (it goes verbatim into a
    /// request header), an empty or too long id or adapter name, a weight that is not a finite
    /// positive number, a load outside [0, 1], a load factor below 1.
    pub fn problem(&self) -> Option<String> {
        if self.pods.len() > MAX_TABLE_PODS {
            return Some(format!(
                "pods: {} pods: at most {MAX_TABLE_PODS}",
                self.pods.len()
            ));
        }
        if let Some(f) = self.load_factor {
            if !(f.is_finite() && f >= 1.0) {
                return Some(format!("load_factor: {f}: must be a number >= 1"));
            }
        }
        if let Some(us) = self.prefill_us_per_token {
            if !(us.is_finite() && us > 0.0 && us <= MAX_PREFILL_US_PER_TOKEN) {
                return Some(format!(
                    "prefill_us_per_token: {us}: must be a number in (0, {MAX_PREFILL_US_PER_TOKEN}]"
                ));
            }
        }
        if self.prefixes.len() > MAX_TABLE_PREFIXES {
            return Some(format!(
                "prefixes: {} prefixes: at most {MAX_TABLE_PREFIXES}",
                self.prefixes.len()
            ));
        }
        if let Some(i) = self
            .prefixes
            .iter()
            .position(|p| p.keys.is_empty() || p.keys.len() > MAX_PLACED_KEYS)
        {
            return Some(format!(
                "prefixes[{i}].keys: must be 1 to {MAX_PLACED_KEYS} keys"
            ));
        }
        let ids: std::collections::BTreeSet<&str> =
            self.pods.iter().map(|p| p.id.as_str()).collect();
        if let Some(i) = self
            .prefixes
            .iter()
            .position(|p| !ids.contains(p.pod.as_str()))
        {
            return Some(format!("prefixes[{i}].pod: not a pod of the table"));
        }
        if self.warming.len() > MAX_TABLE_PODS {
            return Some(format!(
                "warming: {} pods: at most {MAX_TABLE_PODS}",
                self.warming.len()
            ));
        }
        if let Some(p) = self.experiment.as_ref().and_then(Experiment::problem) {
            return Some(format!("experiment.{p}"));
        }
        let warming = self
            .warming
            .iter()
            .enumerate()
            .find_map(|(i, pod)| pod.problem(i))
            .map(|p| p.replacen("pods[", "warming[", 1));
        self.pods
            .iter()
            .enumerate()
            .find_map(|(i, pod)| pod.problem(i))
            .or(warming)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
                    keep_warm: true,
                    shape: None,
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
    fn keep_warm_is_sent_only_when_off_and_absent_means_on() {
        let mut b = batch();
        let text = String::from_utf8(b.encode()).unwrap();
        assert!(!text.contains("keep_warm"), "{text}");
        if let Some(Signal::Prefill(p)) = b.signals.first_mut() {
            p.keep_warm = false;
        }
        let bytes = b.encode();
        assert!(String::from_utf8(bytes.clone())
            .unwrap()
            .contains(r#""keep_warm":false"#));
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

    fn table_with(address: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "version": "1.0", "generation": 1, "block_tokens": 64,
            "pods": [{"id": "a", "address": "10.0.0.1:80"}, {"id": "b", "address": address}],
        }))
        .unwrap()
    }

    #[test]
    fn hostile_table_addresses_are_refused_naming_the_pod() {
        for bad in ["", "a:1,b:2", "u@h:80", "h\r\nx: y:80", "h\u{1}:80", "h:0"] {
            let e = RoutingTable::decode(&table_with(bad)).unwrap_err();
            assert!(
                e.to_string().starts_with("pods[1].address:"),
                "{bad:?}: {e}"
            );
        }
        assert!(RoutingTable::decode(&table_with("[::1]:8000")).is_ok());
        let e = RoutingTable::decode(
            br#"{"version":"1.0","generation":1,"block_tokens":64,"pods":[{"id":"a","address":"h:1","weight":-1}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("pods[0].weight: -1:"), "{e}");
    }

    #[test]
    fn long_names_in_signals_are_refused_naming_the_field() {
        let long = "m".repeat(MAX_NAME_BYTES + 1);
        let mut b = batch();
        if let Signal::Pin(p) = &mut b.signals[1] {
            p.adapter = long.clone();
        }
        let e = SignalBatch::decode(&b.encode()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("signals[1].adapter: 257 bytes: at most {MAX_NAME_BYTES}")
        );
        let mut b = batch();
        if let Signal::Prefill(p) = &mut b.signals[0] {
            p.tenant = Some(long);
        }
        let e = SignalBatch::decode(&b.encode()).unwrap_err();
        assert!(e.to_string().starts_with("signals[0].tenant:"), "{e}");
        let mut b = batch();
        if let Signal::Feedback(f) = &mut b.signals[2] {
            f.model = "m".repeat(MAX_NAME_BYTES);
        }
        assert!(
            SignalBatch::decode(&b.encode()).is_ok(),
            "the cap itself is allowed"
        );
    }

    #[test]
    fn a_batch_is_at_most_its_envelope_plus_each_signal_and_record_and_a_comma() {
        let mut b = batch();
        b.dropped = u64::MAX;
        b.served_dropped = u64::MAX;
        let chain = crate::BlockChain::of("m", &[b'x'; 5000], &crate::FingerprintConfig::default());
        let record = ServedRecord::of("pod-a", "m", &chain, 1300, &Default::default());
        b.served = vec![record.clone(), record];
        b.outcomes_dropped = u64::MAX;
        b.outcomes = vec![outcome(), outcome()];
        let signals: usize = b
            .signals
            .iter()
            .map(|s| serde_json::to_vec(s).unwrap().len() + 1)
            .sum();
        let served: usize = b
            .served
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap().len() + 1)
            .sum();
        let outcomes: usize = b
            .outcomes
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap().len() + 1)
            .sum();
        let bound = SignalBatch::envelope_bytes("envoy-1") + signals + served + outcomes;
        assert!(b.encode().len() <= bound);
        assert!(b.encode().len() + 40 > bound, "the bound is tight");
        // Without served records the envelope's `served` list is left out: still within.
        let mut plain = batch();
        plain.dropped = u64::MAX;
        let signals_only = SignalBatch::envelope_bytes("envoy-1") + signals;
        assert!(plain.encode().len() <= signals_only);
    }

    fn outcome() -> OutcomeRecord {
        OutcomeRecord {
            arm: Some("exp/warm".into()),
            pod: Some("pod-a".into()),
            model: Some("sql-lora".into()),
            at_ms: u64::MAX,
            ttfb_ms: 120,
            status: 200,
            stream: true,
            prompt_tokens: Some(651),
            cached_tokens: Some(640),
            prefix: Some(BlockHash(u64::MAX)),
        }
    }

    #[test]
    fn impossible_outcomes_name_their_field() {
        assert_eq!(outcome().problem(), None);
        type Change = fn(&mut OutcomeRecord);
        let cases: [(Change, &str); 8] = [
            (|o| o.status = 99, "status"),
            (|o| o.status = 600, "status"),
            (|o| o.ttfb_ms = MAX_OUTCOME_TTFB_MS + 1, "ttfb_ms"),
            (|o| o.cached_tokens = Some(652), "cached_tokens"),
            (|o| o.prompt_tokens = None, "cached_tokens"),
            (|o| o.prompt_tokens = Some(u64::MAX), "prompt_tokens"),
            (|o| o.arm = Some("a".repeat(MAX_NAME_BYTES + 1)), "name"),
            (|o| o.model = Some("m".repeat(MAX_NAME_BYTES + 1)), "name"),
        ];
        for (change, field) in cases {
            let mut o = outcome();
            change(&mut o);
            assert_eq!(o.problem(), Some(field));
        }
        let minimal = br#"{"version":"1.0","signals":[],"outcomes":[{"at_ms":1,"ttfb_ms":2,"status":503,"stream":false}]}"#;
        let b = SignalBatch::decode(minimal).unwrap();
        assert_eq!(
            (b.outcomes[0].arm.as_ref(), b.outcomes[0].status),
            (None, 503)
        );
    }

    #[test]
    fn table_round_trips() {
        let t = RoutingTable {
            version: WIRE_VERSION.into(),
            generation: 3,
            generated_at_ms: 9,
            block_tokens: 64,
            load_factor: None,
            prefill_us_per_token: None,
            prefixes: Vec::new(),
            warming: Vec::new(),
            experiment: None,
            pods: vec![RoutedPod {
                id: "pod-a".into(),
                address: "127.0.0.1:8001".into(),
                weight: 1.0,
                adapters: vec!["sql-lora".into()],
                resident: vec!["sql-lora".into()],
                load: Some(0.5),
                wait_ms: None,
            }],
        };
        assert_eq!(RoutingTable::decode(&t.encode()).unwrap(), t);
        let minimal = br#"{"version":"1.0","generation":1,"block_tokens":64,"pods":[{"id":"a","address":"h:1"}]}"#;
        let m = RoutingTable::decode(minimal).unwrap();
        assert_eq!(m.pods[0].weight, 1.0);
    }

    #[test]
    fn an_experiment_and_warming_pods_round_trip_and_are_checked() {
        let doc = br#"{"version":"1.0","generation":1,"block_tokens":64,
            "pods":[{"id":"a","address":"h:1"}],"warming":[{"id":"b","address":"h:2"}],
            "experiment":{"id":"e","arms":[{"name":"warm","weight":0.5},
                {"name":"cold","weight":0.5,"settings":{"warmup":false}}]}}"#;
        let t = RoutingTable::decode(doc).unwrap();
        assert_eq!(t.warming[0].id, "b");
        assert!(t
            .experiment
            .as_ref()
            .is_some_and(|e| e.needs_warming_pods()));
        assert_eq!(RoutingTable::decode(&t.encode()).unwrap(), t);

        let mut bad = t.clone();
        bad.experiment.as_mut().unwrap().arms[1].weight = 0.9;
        let err = RoutingTable::decode(&bad.encode()).unwrap_err().to_string();
        assert!(err.contains("experiment.arms: weights sum to"), "{err}");
        let mut bad = t;
        bad.warming[0].address = "not an address".into();
        let err = RoutingTable::decode(&bad.encode()).unwrap_err().to_string();
        assert!(err.contains("warming[0].address"), "{err}");
    }

    #[test]
    fn a_resident_adapter_must_be_one_the_pod_lists() {
        let table = |resident: &str| {
            format!(
                r#"{{"version":"1.0","generation":1,"block_tokens":64,"pods":[{{"id":"a","address":"h:1","adapters":["x"],"resident":[{resident}]}}]}}"#
            )
        };
        assert_eq!(
            RoutingTable::decode(table(r#""x""#).as_bytes())
                .unwrap()
                .pods[0]
                .resident,
            vec!["x".to_string()]
        );
        let err = RoutingTable::decode(table(r#""y""#).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("pods[0].resident[0]"), "{err}");
        let many = vec![r#""x""#; MAX_RESIDENT_ADAPTERS + 1].join(",");
        let err = RoutingTable::decode(table(&many).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("pods[0].resident: 1025"), "{err}");
    }

    #[test]
    fn waits_and_the_prefill_price_are_bounded_and_named() {
        let table = |top: &str, pod: &str| {
            format!(
                r#"{{"version":"1.0","generation":1,"block_tokens":64{top},"pods":[{{"id":"a","address":"h:1"{pod}}}]}}"#
            )
        };
        let t = RoutingTable::decode(
            table(r#","prefill_us_per_token":250"#, r#","wait_ms":1200"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(
            (t.prefill_us_per_token, t.pods[0].wait_ms),
            (Some(250.0), Some(1200))
        );
        let old = RoutingTable::decode(table("", "").as_bytes()).unwrap();
        assert_eq!(
            (old.prefill_us_per_token, old.pods[0].wait_ms),
            (None, None)
        );
        let err = |top: &str, pod: &str| {
            RoutingTable::decode(table(top, pod).as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert!(err("", r#","wait_ms":3600001"#).contains("pods[0].wait_ms: 3600001"));
        for bad in ["0", "-3", "100001"] {
            let e = err(&format!(r#","prefill_us_per_token":{bad}"#), "");
            assert!(e.starts_with("prefill_us_per_token: "), "{e}");
        }
    }

    #[test]
    fn placed_prefixes_round_trip_and_must_name_a_pod_of_the_table() {
        let mut t = RoutingTable::decode(
            br#"{"version":"1.0","generation":1,"block_tokens":64,"pods":[{"id":"a","address":"h:1"}]}"#,
        )
        .unwrap();
        t.prefixes = vec![PlacedPrefix {
            keys: vec![BlockHash(u64::MAX), BlockHash(3)],
            pod: "a".into(),
        }];
        assert_eq!(RoutingTable::decode(&t.encode()).unwrap(), t);
        t.prefixes[0].pod = "b".into();
        assert_eq!(
            RoutingTable::decode(&t.encode()),
            Err(WireError::Malformed(
                "prefixes[0].pod: not a pod of the table".into()
            ))
        );
        t.prefixes[0].pod = "a".into();
        t.prefixes[0].keys.clear();
        assert_eq!(
            RoutingTable::decode(&t.encode()),
            Err(WireError::Malformed(
                "prefixes[0].keys: must be 1 to 64 keys".into()
            ))
        );
        t.prefixes = vec![
            PlacedPrefix {
                keys: vec![BlockHash(1)],
                pod: "a".into(),
            };
            MAX_TABLE_PREFIXES + 1
        ];
        assert!(matches!(
            RoutingTable::decode(&t.encode()),
            Err(WireError::Malformed(m)) if m.starts_with("prefixes: 1025 prefixes")
        ));
    }
}
