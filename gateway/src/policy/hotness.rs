//! The prompt pool: which prompt prefixes are hot, how hot, and which to warm next.
//!
//! Entries are keyed by [`PrefixKey`] and hold the bounded canonical prefix text, model,
//! tenant, endpoint, tags (templates), the prefix's block hashes, a hotness, and the shape of
//! their traffic ([`shape`]: how its requests reached the engine, which every warm call repeats).
//! - *Static* entries are operator templates ([`PromptPool::add_template`]); their chain is
//!   computed from the text with core's `BlockChain::of`, so it matches what the filter
//!   fingerprints. They are never evicted and never decay below `template_hotness`.
//! - *Dynamic* entries come from the filter's prefill signals; each signal adds
//!   `signal_boost × (1 + priority/100)`.
//! - Feedback adds `adoption_boost` (0.3) or `success_boost` (0.5) per request it stands for.
//! - Every hotness is multiplied by `decay_factor` (0.95) once per `decay_period_ms`; dynamic
//!   entries that fall below `retire_below` are retired.
//! - At `max_entries` dynamic entries, or at `max_pool_bytes` (texts, hashes, shapes and a
//!   fixed per-entry overhead), a new entry evicts the coldest dynamic entries.
//! - Names (model, tenant) are at most [`MAX_NAME_BYTES`]; one batch's feedback for one prefix
//!   stands for at most `max_feedback_count` requests.
//! - Signals from the network are screened first ([`screen`]): a prefill whose block hashes are
//!   not core's fingerprint of its text is refused.
//! - A signal's shape must lie on its text (`WarmShape::check`), or the signal is refused naming
//!   the field. The traffic's current shape wins: each signal for a known entry replaces its
//!   shape (a signal without one leaves it unshaped). A template may carry a shape too. The
//!   shape's bytes count against `max_pool_bytes`.
//! - A snapshot keeps a shape without its `cache_salt` and says one was dropped; such an entry
//!   is not warmed ([`Unwarmed::SaltDropped`]: its calls would fill blocks no request looks up)
//!   until a signal brings its traffic's shape again.
//! - A warm call an engine rejects (a 4xx: a template error on the shape, say) backs the entry
//!   off ([`PromptPool::prefill_rejected`]): no warm call for one decay period, doubling with
//!   each rejection in a row up to [`MAX_BACKOFF_PERIODS`] periods (64 min at the default
//!   60 s period: longer than an entry signalled once lives unsignalled); an accepted call ends
//!   the series.
//!
//! Decay is lazy: an entry stores `hotness × g^e` with `g = 1/decay_factor` and `e` the decay
//! periods elapsed since a base epoch, so decaying everything costs nothing and the order of
//! entries (a `BTreeSet` of dynamic entries by stored score) never changes with time; the base is
//! moved forward (one O(n) pass) every 512 periods, long before `g^e` could overflow.
//! Reads (`get`, `top`, `sample`) see the pool as of the last mutation or [`PromptPool::tick`].

mod config;
pub mod screen;
pub mod shape;
mod signals;
mod snapshot;
mod templates;

pub use config::{HotnessConfig, MAX_TAG_BYTES};
pub use shape::{ShapeSummary, SharedShape};
pub use snapshot::{PromptRecord, SharedRecord};
pub use templates::Template;

use std::collections::BTreeSet;

// The pool is read by every signal, plan and table build.
use ahash::AHashMap as HashMap;
use std::sync::Arc;

use prewarm_core::fingerprint::{blocks_to_tokens, routing_key, BlockHash, FingerprintConfig};
use prewarm_core::request::Endpoint;
use prewarm_core::tokens::BYTES_PER_TOKEN;
use prewarm_core::warm_shape::ShapeError;
use prewarm_core::wire::PinSignal;
use serde::{Deserialize, Serialize};

use super::interner::{Interner, NameId};
use super::{HotPrefix, PrefixKey};

/// Longest model or tenant name, bytes: vLLM served-model and LoRA names are Hugging Face repo
/// ids (at most 96 characters) or short operator-chosen names; 256 leaves room for a path-like
/// name and keeps a flood of distinct long names from costing more than the pool's `max_names`.
pub const MAX_NAME_BYTES: usize = 256;

/// Bytes an entry costs beyond its text and hashes (the entry, its map slot and order node):
/// what [`HotnessConfig::max_pool_bytes`] counts per entry. An estimate, on the high side.
pub const ENTRY_OVERHEAD_BYTES: usize = 192;

/// What an entry of `text_bytes` and `blocks` hashes counts against `max_pool_bytes`.
pub fn entry_bytes(text_bytes: usize, blocks: usize) -> usize {
    text_bytes
        .saturating_add(blocks.saturating_mul(std::mem::size_of::<BlockHash>()))
        .saturating_add(ENTRY_OVERHEAD_BYTES)
}

/// What a kept shape adds to its entry's bytes.
fn shape_bytes(shape: Option<&SharedShape>) -> usize {
    shape.map_or(0, |s| s.bytes())
}

/// Most decay periods a back-off lasts: 2^6, reached at the seventh rejection in a row (64 min
/// at the default 60 s period, when an entry signalled once has retired: at the default decay
/// and `retire_below`, one signal of priority 0 keeps it 59 periods).
pub const MAX_BACKOFF_PERIODS: u64 = 64;

/// Periods after which the lazy-decay base is moved (0.95^-512 ≈ 2.5e11: far from overflow).
const REBASE_PERIODS: u64 = 512;

/// Where an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// An operator template: never evicted, never below `template_hotness`.
    Static,
    /// From the filter's signals.
    Dynamic,
}

/// Why an entry is not warmed now (a prefill of it is not sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwarmed {
    /// A snapshot dropped its shape's salt; a signal brings it back.
    SaltDropped,
    /// An engine rejected its warm call; the back-off has not ended.
    BackedOff,
}

impl Unwarmed {
    /// The `decision` label it is counted under (policy `pool`).
    pub fn label(self) -> &'static str {
        match self {
            Unwarmed::SaltDropped => "salt_dropped",
            Unwarmed::BackedOff => "backed_off",
        }
    }
}

/// Why the pool refused an input. Messages read `field: value: rule`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("prefix: empty: must hold at least one block")]
    EmptyPrefix,
    #[error("text: {0} bytes: shorter than one block")]
    ShorterThanABlock(usize),
    #[error("text: {bytes} bytes: must be at most {max}")]
    TextTooLong { bytes: usize, max: usize },
    #[error("prefix: {blocks} blocks: more than the text can cover")]
    TooManyBlocks { blocks: usize },
    #[error("prefix_tokens: {tokens}: must be the blocks' tokens, covered by the text ({text_bytes} bytes)")]
    InconsistentLength { tokens: usize, text_bytes: usize },
    #[error("model: empty: must be a model or adapter name")]
    EmptyModel,
    #[error("model: {0:?}: too many distinct model and tenant names")]
    TooManyNames(String),
    #[error("{field}: {bytes} bytes: must be at most {MAX_NAME_BYTES}")]
    NameTooLong { field: &'static str, bytes: usize },
    #[error(
        "prefix: does not match the text: block {block} of the text fingerprints to another hash"
    )]
    HashMismatch { block: usize },
    #[error("pool: {0} bytes: no room within hotness.max_pool_bytes")]
    PoolFull(usize),
    #[error("templates: {0}: the maximum is reached")]
    TooManyTemplates(usize),
    #[error("tags: {0}: too many or too long (max {1} tags of {MAX_TAG_BYTES} bytes)")]
    BadTags(usize, usize),
    /// The shape is past a bound or does not lie on the text (the message names the field).
    #[error("{0}")]
    Shape(#[from] ShapeError),
}

/// What [`PromptPool::ingest`] did with a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngestReport {
    /// Prefill signals applied (new entries and re-signals).
    pub prefills: usize,
    /// Feedback signals applied to a known entry.
    pub feedback: usize,
    /// Feedback for prefixes not in the pool (ignored).
    pub feedback_unknown: usize,
    /// Feedback signals ignored because their prefix's batch cap was used up.
    pub feedback_capped: usize,
    /// Signals refused, with the first few reasons (at most 8) for a log line.
    pub rejected: usize,
    pub reasons: Vec<PoolError>,
    /// Pin signals, not the pool's business: for the LoRA policy.
    pub pins: Vec<PinSignal>,
}

/// Counters since the pool was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    /// Dynamic entries evicted to make room.
    pub evicted: u64,
    /// Dynamic entries retired by decay.
    pub retired: u64,
}

/// A read-only view of one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptView<'a> {
    pub key: PrefixKey,
    pub text: &'a str,
    pub model: &'a str,
    pub tenant: Option<&'a str>,
    pub endpoint: Endpoint,
    pub tags: &'a [String],
    pub blocks: &'a [BlockHash],
    pub hotness: f64,
    pub origin: Origin,
    pub adoptions: u32,
    pub successes: u32,
    pub last_signal_ms: u64,
    /// Keep-warm keeps it warm on its pod: `false` while only experiment arms without
    /// keep-warm have signalled it.
    pub keep_warm: bool,
    /// How its traffic reached the engine (`None`: a completion without salt, a filter older
    /// than shapes, an entry from an older snapshot).
    pub shape: Option<&'a SharedShape>,
    /// A snapshot dropped its shape's salt: not warmed until a signal brings it again.
    pub salt_dropped: bool,
    /// Warm calls an engine rejected in a row (since the last it accepted).
    pub rejections: u32,
    /// No warm call before this time, ms (0: never backed off).
    pub backoff_until_ms: u64,
}

impl PromptView<'_> {
    /// Why it is not warmed at `now_ms`, if it is not.
    pub fn unwarmed(&self, now_ms: u64) -> Option<Unwarmed> {
        if self.salt_dropped {
            Some(Unwarmed::SaltDropped)
        } else if now_ms < self.backoff_until_ms {
            Some(Unwarmed::BackedOff)
        } else {
            None
        }
    }
}

const NO_NAME: NameId = NameId::MAX;

/// A name's length limit ([`MAX_NAME_BYTES`]).
fn check_name(field: &'static str, name: &str) -> Result<(), PoolError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(PoolError::NameTooLong {
            field,
            bytes: name.len(),
        });
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct Entry {
    /// Shared (not copied) with a snapshot being written outside the lock.
    text: Arc<str>,
    blocks: Arc<[BlockHash]>,
    /// hotness × growth^(epoch − base_epoch).
    score: f64,
    last_signal_ms: u64,
    model: NameId,
    tenant: NameId,
    adoptions: u32,
    successes: u32,
    endpoint: Endpoint,
    origin: Origin,
    keep_warm: bool,
    /// See [`PromptView::shape`]; shared with the warm calls in flight.
    shape: Option<SharedShape>,
    salt_dropped: bool,
    rejections: u32,
    backoff_until_ms: u64,
}

impl Entry {
    /// What it counts against `max_pool_bytes`.
    fn bytes(&self) -> usize {
        entry_bytes(self.text.len(), self.blocks.len())
            .saturating_add(shape_bytes(self.shape.as_ref()))
    }
}

/// The prompt pool. See the module docs.
#[derive(Debug, Clone)]
pub struct PromptPool {
    config: HotnessConfig,
    entries: HashMap<PrefixKey, Entry>,
    /// Dynamic entries by stored score (non-negative floats order like their bits).
    order: BTreeSet<(u64, PrefixKey)>,
    tags: HashMap<PrefixKey, Box<[String]>>,
    templates: usize,
    names: Interner,
    origin_ms: u64,
    base_epoch: u64,
    epoch: u64,
    /// growth^(epoch − base_epoch).
    factor: f64,
    last_now_ms: u64,
    stats: PoolStats,
    /// What the entries held count against `max_pool_bytes` ([`entry_bytes`]).
    bytes: usize,
    /// The part of `bytes` that is templates (never evicted).
    template_bytes: usize,
}

impl PromptPool {
    /// An empty pool whose decay periods start at `now_ms`. `config` should be valid
    /// ([`HotnessConfig::validate`]); out-of-range values are clamped to something usable.
    pub fn new(config: HotnessConfig, now_ms: u64) -> Self {
        Self {
            config,
            entries: HashMap::new(),
            order: BTreeSet::new(),
            tags: HashMap::new(),
            templates: 0,
            names: Interner::default(),
            origin_ms: now_ms,
            base_epoch: 0,
            epoch: 0,
            factor: 1.0,
            last_now_ms: now_ms,
            stats: PoolStats::default(),
            bytes: 0,
            template_bytes: 0,
        }
    }

    pub fn config(&self) -> &HotnessConfig {
        &self.config
    }

    /// Entries held, static and dynamic.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Templates held.
    pub fn templates(&self) -> usize {
        self.templates
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// What the entries count against `max_pool_bytes`.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Evicts the coldest dynamic entries until an entry of `cost` bytes fits within
    /// `max_pool_bytes` (and, for a `dynamic` one, below `max_entries`). An entry that could
    /// not fit beside the templates alone is refused before anything is evicted.
    fn make_room(&mut self, cost: usize, dynamic: bool) -> Result<(), PoolError> {
        self.make_room_except(cost, dynamic, None)
    }

    /// [`make_room`](Self::make_room), never evicting `keep` (an entry that grows).
    fn make_room_except(
        &mut self,
        cost: usize,
        dynamic: bool,
        keep: Option<&PrefixKey>,
    ) -> Result<(), PoolError> {
        if self.template_bytes.saturating_add(cost) > self.config.max_pool_bytes {
            return Err(PoolError::PoolFull(cost));
        }
        loop {
            let over_bytes = self.bytes.saturating_add(cost) > self.config.max_pool_bytes;
            let over_count = dynamic && self.dynamic_len() >= self.config.max_entries.max(1);
            if !over_bytes && !over_count {
                return Ok(());
            }
            let Some(&(_, coldest)) = self.order.iter().find(|(_, k)| Some(k) != keep) else {
                return Err(PoolError::PoolFull(cost));
            };
            self.remove_entry(&coldest);
            self.stats.evicted += 1;
        }
    }

    /// Counts (`added`) or uncounts an entry's bytes.
    fn account(&mut self, e: &Entry, added: bool) {
        self.account_bytes(e.bytes(), e.origin == Origin::Static, added);
    }

    fn account_bytes(&mut self, n: usize, templates: bool, added: bool) {
        if added {
            self.bytes = self.bytes.saturating_add(n);
            if templates {
                self.template_bytes = self.template_bytes.saturating_add(n);
            }
        } else {
            self.bytes = self.bytes.saturating_sub(n);
            if templates {
                self.template_bytes = self.template_bytes.saturating_sub(n);
            }
        }
    }

    /// Inserts a new entry (the caller made room) and counts its bytes.
    fn insert_entry(&mut self, key: PrefixKey, entry: Entry) {
        self.account(&entry, true);
        if let Some(old) = self.entries.insert(key, entry) {
            self.account(&old, false);
        }
    }

    /// Advances decay to `now_ms` and retires dynamic entries that fell below `retire_below`.
    /// Time never goes backwards: an earlier `now_ms` counts as the latest seen.
    pub fn tick(&mut self, now_ms: u64) {
        let now = now_ms.max(self.last_now_ms);
        self.last_now_ms = now;
        let period = self.config.decay_period_ms.max(1);
        let epoch = now.saturating_sub(self.origin_ms) / period;
        if epoch == self.epoch {
            return;
        }
        self.epoch = epoch;
        if epoch.saturating_sub(self.base_epoch) >= REBASE_PERIODS {
            self.rebase();
        } else {
            let n = i32::try_from(epoch.saturating_sub(self.base_epoch)).unwrap_or(i32::MAX);
            self.factor = self.growth().powi(n);
        }
        self.retire();
    }

    fn growth(&self) -> f64 {
        let d = self.config.decay_factor;
        if d > 0.0 && d <= 1.0 {
            1.0 / d
        } else {
            1.0
        }
    }

    /// Moves the lazy-decay base to the current epoch: every stored score becomes the hotness.
    fn rebase(&mut self) {
        let n = i32::try_from(self.epoch.saturating_sub(self.base_epoch)).unwrap_or(i32::MAX);
        let decay = self.growth().recip().powi(n);
        for e in self.entries.values_mut() {
            e.score *= decay;
        }
        self.base_epoch = self.epoch;
        self.factor = 1.0;
        self.order = self
            .entries
            .iter()
            .filter(|(_, e)| e.origin == Origin::Dynamic)
            .map(|(k, e)| (e.score.to_bits(), *k))
            .collect();
    }

    fn retire(&mut self) {
        let floor = self.config.retire_below * self.factor;
        while let Some(&(bits, key)) = self.order.first() {
            if f64::from_bits(bits) >= floor {
                break;
            }
            self.remove_entry(&key);
            self.stats.retired += 1;
        }
    }

    fn hotness_of(&self, e: &Entry) -> f64 {
        let h = e.score / self.factor;
        match e.origin {
            Origin::Static => h.max(self.config.template_hotness),
            Origin::Dynamic => h,
        }
    }

    /// Current hotness of `key`.
    pub fn hotness(&self, key: &PrefixKey) -> Option<f64> {
        self.entries.get(key).map(|e| self.hotness_of(e))
    }

    /// Adds `amount` of current-epoch hotness to `key`'s entry.
    fn boost(&mut self, key: &PrefixKey, amount: f64) {
        let factor = self.factor;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        let old = e.score;
        let new = (old + amount * factor).min(f64::MAX);
        e.score = new;
        if e.origin == Origin::Dynamic {
            self.order.remove(&(old.to_bits(), *key));
            self.order.insert((new.to_bits(), *key));
        }
    }

    fn remove_entry(&mut self, key: &PrefixKey) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.account(&e, false);
        match e.origin {
            Origin::Dynamic => {
                self.order.remove(&(e.score.to_bits(), *key));
            }
            Origin::Static => {
                self.templates = self.templates.saturating_sub(1);
                self.tags.remove(key);
            }
        }
        self.names.release(e.model);
        if e.tenant != NO_NAME {
            self.names.release(e.tenant);
        }
        Some(e)
    }

    fn dynamic_len(&self) -> usize {
        self.order.len()
    }

    fn acquire_names(
        &mut self,
        model: &str,
        tenant: Option<&str>,
    ) -> Result<(NameId, NameId), PoolError> {
        if model.is_empty() {
            return Err(PoolError::EmptyModel);
        }
        check_name("model", model)?;
        if let Some(t) = tenant {
            check_name("tenant", t)?;
        }
        let limit = self.config.max_names;
        let m = self
            .names
            .acquire(model, limit)
            .ok_or_else(|| PoolError::TooManyNames(model.chars().take(64).collect()))?;
        let t = match tenant {
            None => NO_NAME,
            Some(t) => match self.names.acquire(t, limit) {
                Some(t) => t,
                None => {
                    self.names.release(m);
                    return Err(PoolError::TooManyNames(t.chars().take(64).collect()));
                }
            },
        };
        Ok((m, t))
    }

    fn check_prefix(&self, text: &str, blocks: usize) -> Result<(), PoolError> {
        if blocks == 0 {
            return Err(PoolError::EmptyPrefix);
        }
        if text.len() > self.config.max_prefix_bytes {
            return Err(PoolError::TextTooLong {
                bytes: text.len(),
                max: self.config.max_prefix_bytes,
            });
        }
        // A block covers at least one token; the filter cuts text back to a character
        // boundary, so the text may be a few bytes short of its last block.
        if blocks > text.len() / BYTES_PER_TOKEN + 1 {
            return Err(PoolError::TooManyBlocks { blocks });
        }
        Ok(())
    }

    /// Gives `key`'s entry `shape` (and takes back a dropped salt's flag), evicting colder
    /// entries when it grows past `max_pool_bytes`; refused (the entry as it was) when it
    /// cannot fit.
    fn replace_shape(
        &mut self,
        key: &PrefixKey,
        shape: Option<SharedShape>,
    ) -> Result<(), PoolError> {
        let Some(e) = self.entries.get(key) else {
            return Ok(());
        };
        let (old, new) = (shape_bytes(e.shape.as_ref()), shape_bytes(shape.as_ref()));
        if new > old {
            self.make_room_except(new - old, false, Some(key))?;
        }
        let Some(e) = self.entries.get_mut(key) else {
            return Ok(());
        };
        let templates = e.origin == Origin::Static;
        e.shape = shape;
        e.salt_dropped = false;
        self.account_bytes(old, templates, false);
        self.account_bytes(new, templates, true);
        Ok(())
    }

    fn view<'a>(&'a self, key: &PrefixKey, e: &'a Entry) -> PromptView<'a> {
        PromptView {
            key: *key,
            text: &e.text,
            model: self.names.get(e.model),
            tenant: (e.tenant != NO_NAME).then(|| self.names.get(e.tenant)),
            endpoint: e.endpoint,
            tags: self.tags.get(key).map(|t| &t[..]).unwrap_or(&[]),
            blocks: &e.blocks,
            hotness: self.hotness_of(e),
            origin: e.origin,
            adoptions: e.adoptions,
            successes: e.successes,
            last_signal_ms: e.last_signal_ms,
            keep_warm: e.keep_warm,
            shape: e.shape.as_ref(),
            salt_dropped: e.salt_dropped,
            rejections: e.rejections,
            backoff_until_ms: e.backoff_until_ms,
        }
    }

    /// The entry of `key`.
    pub fn get(&self, key: &PrefixKey) -> Option<PromptView<'_>> {
        self.entries.get(key).map(|e| self.view(key, e))
    }

    /// The text of `key`'s entry, shared (a warm call carries it without a copy).
    pub fn shared_text(&self, key: &PrefixKey) -> Option<Arc<str>> {
        self.entries.get(key).map(|e| e.text.clone())
    }

    /// Keys of every entry hottest first (ties by key), templates included.
    fn hottest_keys(&self, k: usize) -> Vec<(f64, PrefixKey)> {
        let mut out: Vec<(f64, PrefixKey)> = self
            .order
            .iter()
            .rev()
            .take(k)
            .map(|&(bits, key)| (f64::from_bits(bits) / self.factor, key))
            .collect();
        if self.templates > 0 {
            out.extend(
                self.entries
                    .iter()
                    .filter(|(_, e)| e.origin == Origin::Static)
                    .map(|(key, e)| (self.hotness_of(e), *key)),
            );
            out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            out.truncate(k);
        }
        out
    }

    /// The `k` hottest entries, hottest first.
    pub fn top(&self, k: usize) -> Vec<PromptView<'_>> {
        self.hottest_keys(k)
            .into_iter()
            .filter_map(|(_, key)| self.get(&key))
            .collect()
    }

    /// The `limit` hottest prefixes with their routing keys, for warm-up planning.
    pub fn hot_prefixes(&self, limit: usize, fingerprint: &FingerprintConfig) -> Vec<HotPrefix> {
        self.hottest_keys(limit)
            .into_iter()
            .filter_map(|(hotness, key)| {
                let e = self.entries.get(&key)?;
                Some(HotPrefix {
                    key,
                    routing_key: routing_key(&e.blocks, fingerprint)?,
                    tokens: blocks_to_tokens(e.blocks.len(), fingerprint),
                    hotness,
                    fleet_wide: false,
                    holders: 0,
                })
            })
            .collect()
    }

    /// Roulette-wheel sampling: up to `count` distinct keys, each draw picking an entry with
    /// probability proportional to its hotness. `unit` returns uniform draws in [0, 1) (the
    /// caller's random source; values outside are clamped). At most `4 × count` draws are made,
    /// so fewer keys come back when a few entries dominate.
    pub fn sample(&self, count: usize, unit: &mut dyn FnMut() -> f64) -> Vec<PrefixKey> {
        let mut wheel: Vec<(f64, PrefixKey)> = Vec::with_capacity(self.entries.len());
        let mut total = 0.0;
        for (key, e) in &self.entries {
            let h = self.hotness_of(e);
            if h > 0.0 && h.is_finite() {
                total += h;
                wheel.push((total, *key));
            }
        }
        let mut picked: Vec<PrefixKey> = Vec::with_capacity(count.min(wheel.len()));
        let want = count.min(wheel.len());
        let mut draws = 0usize;
        while picked.len() < want && draws < count.saturating_mul(4) {
            draws += 1;
            let u = unit();
            let u = if u.is_finite() {
                u.clamp(0.0, 1.0)
            } else {
                0.0
            };
            let target = u * total;
            let i = wheel
                .partition_point(|(cum, _)| *cum <= target)
                .min(wheel.len().saturating_sub(1));
            if let Some(&(_, key)) = wheel.get(i) {
                if !picked.contains(&key) {
                    picked.push(key);
                }
            }
        }
        picked
    }
}

#[cfg(test)]
pub(crate) mod shape_tests;
#[cfg(test)]
mod tests;
