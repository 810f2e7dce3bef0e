//! The modelled prefix (KV) cache of one pod, and keep-warm: which prefixes to re-prefill.
//!
//! vLLM cannot pin KV blocks, so warmth is kept by re-touching. The model:
//! - The pod has `capacity_blocks` blocks of `block_tokens` tokens (from `vllm:cache_config_info`
//!   when the pod reports it, else configured). Blocks held by running requests cannot be
//!   evicted, so the cache's effective capacity is `capacity × (1 − kv_usage)`.
//! - Residency is tracked per 512-token shard (core's [`Shard`], identified by its last block
//!   hash, so prefixes sharing a first shard share it). Each touch stamps a shard with the *block
//!   clock*, which advances by the blocks of every shard newly inserted (by prefills, by observed
//!   traffic, and by uncached tokens the pod's metrics report). A shard's modelled LRU age is the
//!   clock minus its stamp; past the effective capacity it is modelled evicted. (Re-touches of
//!   older shards do not advance the clock: the age is a lower bound of LRU stack distance,
//!   which the `near_eviction` margin absorbs.)
//! - The *warm set* is the prefixes the gateway keeps warm ([`KvResidency::keep_warm_prefix`],
//!   [`KvResidency::record_prefill`]). The most recently requested of them, up to the reserved
//!   warm budget, are kept: one whose age reaches `near_eviction × effective capacity`, or that is
//!   modelled evicted, is due for a re-prefill, oldest first, within a token bucket of
//!   `prefill_tokens_per_s` (burst `prefill_burst_tokens`) so warming never starves traffic.
//! - The reserved budget follows demand (the warm set's blocks) between
//!   `reserved_initial_blocks` and `reserved_max_blocks`, and falls back to the initial size while
//!   the pod's KV usage is at or above `pressure_usage`.
//! - The modelled hit ratio is the share of observed traffic tokens whose leading shards were
//!   modelled resident.

use std::collections::BTreeMap;

// The per-pod shard and warm-set maps are touched for every served request and tick.
use ahash::AHashMap as HashMap;

use prewarm_core::fingerprint::{BlockHash, Shard};
use serde::{Deserialize, Serialize};

use super::rules::Problems;
use super::PrefixKey;

/// The `[kv]` configuration (per-pod geometry from the pod's metrics overrides the first two).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvConfig {
    /// Tokens per KV block on the pod (default 16, vLLM's CUDA default).
    pub block_tokens: usize,
    /// KV blocks on the pod (default 8,192).
    pub capacity_blocks: u64,
    /// Blocks reserved for kept-warm prefixes at start and under pressure (default 512).
    pub reserved_initial_blocks: u64,
    /// The most blocks the warm budget grows to (default 2,048).
    pub reserved_max_blocks: u64,
    /// Fraction of the effective capacity at which a kept prefix is due for a re-prefill
    /// (default 0.75; in (0, 1]).
    pub near_eviction: f64,
    /// Prefill budget in prompt tokens a second per pod (default 4,096).
    pub prefill_tokens_per_s: f64,
    /// Largest burst of the prefill budget in tokens (default 32,768).
    pub prefill_burst_tokens: f64,
    /// KV usage (0..1) at or above which the warm budget shrinks to its initial size (default 0.9).
    pub pressure_usage: f64,
    /// Most prefixes in the warm set (default 10,000).
    pub max_tracked_prefixes: usize,
    /// Most shards modelled per pod (default 200,000).
    pub max_tracked_shards: usize,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            block_tokens: 16,
            capacity_blocks: 8_192,
            reserved_initial_blocks: 512,
            reserved_max_blocks: 2_048,
            near_eviction: 0.75,
            prefill_tokens_per_s: 4_096.0,
            prefill_burst_tokens: 32_768.0,
            pressure_usage: 0.9,
            max_tracked_prefixes: 10_000,
            max_tracked_shards: 200_000,
        }
    }
}

impl KvConfig {
    /// Every problem, as `field: value: rule`, each field name preceded by `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Problems::new(prefix);
        p.between("block_tokens", self.block_tokens, 1, 4096);
        p.between("capacity_blocks", self.capacity_blocks, 1, 1 << 32);
        p.check(
            self.reserved_initial_blocks <= self.reserved_max_blocks,
            "reserved_initial_blocks",
            self.reserved_initial_blocks,
            format_args!(
                "must be at most reserved_max_blocks ({})",
                self.reserved_max_blocks
            ),
        );
        p.check(
            self.reserved_max_blocks <= self.capacity_blocks,
            "reserved_max_blocks",
            self.reserved_max_blocks,
            format_args!("must be at most capacity_blocks ({})", self.capacity_blocks),
        );
        p.fraction("near_eviction", self.near_eviction);
        p.positive("prefill_tokens_per_s", self.prefill_tokens_per_s);
        p.between("prefill_burst_tokens", self.prefill_burst_tokens, 1.0, 1e12);
        p.fraction("pressure_usage", self.pressure_usage);
        p.between(
            "max_tracked_prefixes",
            self.max_tracked_prefixes,
            1,
            10_000_000,
        );
        p.between("max_tracked_shards", self.max_tracked_shards, 1, 10_000_000);
        p.into_vec()
    }
}

/// A re-prefill decision: send the prefix of `key` (plus one token) to the pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepWarm {
    pub key: PrefixKey,
    /// Tokens the prefix covers (charged to the prefill budget).
    pub tokens: u64,
    /// Its modelled LRU age in blocks at decision time (`None`: modelled evicted).
    pub age_blocks: Option<u64>,
}

/// A prefix of the warm set, for the admin API.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmPrefixView<'a> {
    pub key: PrefixKey,
    pub shards: &'a [Shard],
    pub tokens: u64,
    /// Modelled LRU age in blocks; `None` when modelled evicted.
    pub age_blocks: Option<u64>,
    /// Milliseconds since any of its shards was last touched (`None`: evicted).
    pub age_ms: Option<u64>,
    /// Whether it is within the reserved warm budget (kept warm).
    pub within_budget: bool,
}

#[derive(Debug, Clone, Copy)]
struct ShardState {
    clock: u64,
    seq: u64,
    touched_ms: u64,
}

#[derive(Debug, Clone)]
struct WarmPrefix {
    shards: Box<[Shard]>,
    tokens: u64,
    blocks: u64,
    requested: u64,
}

/// The KV model of one pod. See the module docs.
#[derive(Debug, Clone)]
pub struct KvResidency {
    config: KvConfig,
    clock: u64,
    seq: u64,
    shards: HashMap<BlockHash, ShardState>,
    lru: BTreeMap<u64, BlockHash>,
    warm: HashMap<PrefixKey, WarmPrefix>,
    usage: f64,
    bucket: f64,
    bucket_ms: u64,
    query_tokens: u64,
    hit_tokens: u64,
    /// Tokens the model's own prefills (warm-up, keep-warm) made the pod compute.
    prefill_computed: u64,
}

impl KvResidency {
    /// A cold pod at `now_ms` with a full prefill bucket.
    pub fn new(config: KvConfig, now_ms: u64) -> Self {
        Self {
            bucket: config.prefill_burst_tokens.max(0.0),
            config,
            clock: 0,
            seq: 0,
            shards: HashMap::new(),
            lru: BTreeMap::new(),
            warm: HashMap::new(),
            usage: 0.0,
            bucket_ms: now_ms,
            query_tokens: 0,
            hit_tokens: 0,
            prefill_computed: 0,
        }
    }

    pub fn config(&self) -> &KvConfig {
        &self.config
    }

    /// Sets the pod's geometry as it reports it (`vllm:cache_config_info`).
    pub fn set_geometry(&mut self, block_tokens: usize, capacity_blocks: u64) {
        self.config.block_tokens = block_tokens.max(1);
        self.config.capacity_blocks = capacity_blocks.max(1);
        self.prune();
    }

    /// Records the pod's reported KV usage (0..1, `vllm:kv_cache_usage_perc`).
    pub fn observe_usage(&mut self, kv_usage: f64) {
        self.usage = if kv_usage.is_finite() {
            kv_usage.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.prune();
    }

    /// The pod restarted or was replaced: its cache is cold. The warm set is kept (to re-warm).
    pub fn reset(&mut self) {
        self.shards.clear();
        self.lru.clear();
        self.clock = 0;
        self.usage = 0.0;
    }

    /// Blocks the cache can hold now: capacity less what running requests hold.
    pub fn effective_capacity(&self) -> u64 {
        let cap = self.config.capacity_blocks.max(1) as f64 * (1.0 - self.usage);
        (cap as u64).max(1)
    }

    /// The reserved warm budget in blocks now.
    pub fn reserved_blocks(&self) -> u64 {
        let initial = self.config.reserved_initial_blocks;
        if self.usage >= self.config.pressure_usage {
            return initial;
        }
        let demand: u64 = self.warm.values().map(|w| w.blocks).sum();
        demand.clamp(initial, self.config.reserved_max_blocks.max(initial))
    }

    fn shard_blocks(&self, shard: &Shard) -> u64 {
        (shard.valid_len as u64).div_ceil(self.config.block_tokens.max(1) as u64)
    }

    fn prune(&mut self) {
        let cap = self.effective_capacity();
        let max = self.config.max_tracked_shards.max(1);
        while let Some((&seq, &hash)) = self.lru.first_key_value() {
            let too_old = self
                .shards
                .get(&hash)
                .is_none_or(|s| self.clock.saturating_sub(s.clock) > cap);
            if !too_old && self.shards.len() <= max {
                break;
            }
            self.lru.remove(&seq);
            self.shards.remove(&hash);
        }
    }

    fn is_cached(&self, hash: &BlockHash) -> bool {
        let cap = self.effective_capacity();
        self.shards
            .get(hash)
            .is_some_and(|s| self.clock.saturating_sub(s.clock) <= cap)
    }

    /// Touches a chain's shards; returns tokens of its leading shards that were cached.
    fn touch(&mut self, shards: &[Shard], now_ms: u64) -> u64 {
        let mut hit = 0u64;
        let mut leading = true;
        for shard in shards {
            if self.is_cached(&shard.last_block) {
                if leading {
                    hit = hit.saturating_add(shard.valid_len as u64);
                }
            } else {
                leading = false;
                self.clock = self.clock.saturating_add(self.shard_blocks(shard));
            }
        }
        // Stamp after inserting, deepest shard oldest (vLLM frees a finished request's blocks
        // in reverse order, so its deepest block is evicted first).
        for shard in shards.iter().rev() {
            self.seq += 1;
            let state = ShardState {
                clock: self.clock,
                seq: self.seq,
                touched_ms: now_ms,
            };
            if let Some(old) = self.shards.insert(shard.last_block, state) {
                self.lru.remove(&old.seq);
            }
            self.lru.insert(self.seq, shard.last_block);
        }
        self.prune();
        hit
    }

    /// Observed traffic on the pod with this chain's shards; returns the modelled hit in tokens.
    pub fn record_traffic(&mut self, shards: &[Shard], now_ms: u64) -> u64 {
        let tokens: u64 = shards.iter().map(|s| s.valid_len as u64).sum();
        let hit = self.touch(shards, now_ms);
        self.query_tokens = self.query_tokens.saturating_add(tokens);
        self.hit_tokens = self.hit_tokens.saturating_add(hit);
        hit
    }

    /// Uncached prompt tokens the pod processed that no tracked chain accounts for (e.g. the
    /// delta of `prefix_cache_queries_total − prefix_cache_hits_total`): they age everything.
    pub fn record_uncached_tokens(&mut self, tokens: u64) {
        let blocks = tokens.div_ceil(self.config.block_tokens.max(1) as u64);
        self.clock = self.clock.saturating_add(blocks);
        self.prune();
    }

    /// Adds `key` to the warm set (most recently requested), without touching the cache.
    pub fn keep_warm_prefix(&mut self, key: PrefixKey, shards: &[Shard]) {
        self.seq += 1;
        let blocks = shards.iter().map(|s| self.shard_blocks(s)).sum();
        let tokens = shards.iter().map(|s| s.valid_len as u64).sum();
        self.warm.insert(
            key,
            WarmPrefix {
                shards: shards.into(),
                tokens,
                blocks,
                requested: self.seq,
            },
        );
        let max = self.config.max_tracked_prefixes.max(1);
        while self.warm.len() > max {
            let oldest = self
                .warm
                .iter()
                .min_by_key(|(_, w)| w.requested)
                .map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    self.warm.remove(&k);
                }
                None => break,
            }
        }
    }

    /// A prefill of `key` succeeded on the pod: it is cached and in the warm set.
    pub fn record_prefill(&mut self, key: PrefixKey, shards: &[Shard], now_ms: u64) {
        self.keep_warm_prefix(key, shards);
        let tokens: u64 = shards.iter().map(|s| s.valid_len as u64).sum();
        let hit = self.touch(shards, now_ms);
        self.prefill_computed = self
            .prefill_computed
            .saturating_add(tokens.saturating_sub(hit));
    }

    /// Prompt tokens the model believes the pod computed (not served from its cache), for
    /// recorded traffic and the model's own prefills alike.
    pub fn computed_tokens(&self) -> u64 {
        self.query_tokens
            .saturating_sub(self.hit_tokens)
            .saturating_add(self.prefill_computed)
    }

    /// A re-prefill of `key` failed: it is modelled evicted, so it is due again.
    pub fn prefill_failed(&mut self, key: &PrefixKey) {
        let Some(w) = self.warm.get(key) else { return };
        if let Some(deepest) = w.shards.last() {
            if let Some(s) = self.shards.remove(&deepest.last_block) {
                self.lru.remove(&s.seq);
            }
        }
    }

    /// Keeps in the warm set only the prefixes `keep` says to.
    pub fn retain_warm(&mut self, mut keep: impl FnMut(&PrefixKey) -> bool) {
        self.warm.retain(|k, _| keep(k));
    }

    /// Removes `key` from the warm set; returns whether it was there.
    pub fn forget(&mut self, key: &PrefixKey) -> bool {
        self.warm.remove(key).is_some()
    }

    /// Modelled LRU age in blocks of a chain (its oldest shard), `None` when any shard is
    /// modelled evicted.
    fn age_of(&self, shards: &[Shard]) -> Option<u64> {
        let cap = self.effective_capacity();
        let mut oldest = 0u64;
        for s in shards {
            let st = self.shards.get(&s.last_block)?;
            let age = self.clock.saturating_sub(st.clock);
            if age > cap {
                return None;
            }
            oldest = oldest.max(age);
        }
        Some(oldest)
    }

    /// Whether every shard of a chain is modelled resident (from traffic or prefills).
    pub fn shards_resident(&self, shards: &[Shard]) -> bool {
        self.age_of(shards).is_some()
    }

    /// Whether every shard of `key` (in the warm set) is modelled resident.
    pub fn is_resident(&self, key: &PrefixKey) -> bool {
        self.warm
            .get(key)
            .is_some_and(|w| self.age_of(&w.shards).is_some())
    }

    /// Warm-set prefixes within the budget, most recently requested first.
    fn within_budget(&self) -> Vec<(&PrefixKey, &WarmPrefix)> {
        let mut all: Vec<(&PrefixKey, &WarmPrefix)> = self.warm.iter().collect();
        all.sort_by_key(|(_, w)| std::cmp::Reverse(w.requested));
        let budget = self.reserved_blocks();
        let mut used = 0u64;
        all.retain(|(_, w)| {
            if used.saturating_add(w.blocks) <= budget {
                used += w.blocks;
                true
            } else {
                false
            }
        });
        all
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.bucket_ms) as f64 / 1000.0;
        self.bucket_ms = self.bucket_ms.max(now_ms);
        self.bucket = (self.bucket + elapsed * self.config.prefill_tokens_per_s.max(0.0))
            .min(self.config.prefill_burst_tokens.max(0.0));
    }

    /// Tokens the prefill budget holds at `now_ms`.
    pub fn prefill_budget(&mut self, now_ms: u64) -> f64 {
        self.refill(now_ms);
        self.bucket
    }

    /// The re-prefills due now, most at risk first (modelled evicted, then oldest), as many as
    /// the prefill budget allows. Each is charged to the budget and modelled as done (call
    /// [`prefill_failed`](Self::prefill_failed) when one fails).
    pub fn keep_warm(&mut self, now_ms: u64) -> Vec<KeepWarm> {
        self.refill(now_ms);
        let threshold = (self.effective_capacity() as f64 * self.config.near_eviction) as u64;
        let mut due: Vec<KeepWarm> = self
            .within_budget()
            .into_iter()
            .filter_map(|(key, w)| {
                let age = self.age_of(&w.shards);
                let is_due = age.is_none_or(|a| a >= threshold);
                is_due.then_some(KeepWarm {
                    key: *key,
                    tokens: w.tokens,
                    age_blocks: age,
                })
            })
            .collect();
        due.sort_by(|a, b| {
            let ra = a.age_blocks.map_or(u64::MAX, |x| x);
            let rb = b.age_blocks.map_or(u64::MAX, |x| x);
            rb.cmp(&ra).then_with(|| a.key.cmp(&b.key))
        });
        let mut out = Vec::new();
        for d in due {
            let cost = d.tokens as f64;
            if cost > self.bucket {
                break;
            }
            self.bucket -= cost;
            if let Some(shards) = self.warm.get(&d.key).map(|w| w.shards.clone()) {
                self.touch(&shards, now_ms);
            }
            out.push(d);
        }
        out
    }

    /// The warm set, most recently requested first.
    pub fn warm_prefixes(&self, now_ms: u64) -> Vec<WarmPrefixView<'_>> {
        let kept: ahash::AHashSet<PrefixKey> =
            self.within_budget().into_iter().map(|(k, _)| *k).collect();
        let mut all: Vec<(&PrefixKey, &WarmPrefix)> = self.warm.iter().collect();
        all.sort_by_key(|(_, w)| std::cmp::Reverse(w.requested));
        all.into_iter()
            .map(|(key, w)| {
                let age = self.age_of(&w.shards);
                let touched = w
                    .shards
                    .iter()
                    .filter_map(|s| self.shards.get(&s.last_block).map(|st| st.touched_ms))
                    .min();
                WarmPrefixView {
                    key: *key,
                    shards: &w.shards,
                    tokens: w.tokens,
                    age_blocks: age,
                    age_ms: age.and(touched).map(|t| now_ms.saturating_sub(t)),
                    within_budget: kept.contains(key),
                }
            })
            .collect()
    }

    /// Tokens of recorded traffic and the modelled hits among them, since the model was made.
    pub fn traffic_tokens(&self) -> (u64, u64) {
        (self.query_tokens, self.hit_tokens)
    }

    /// Modelled hit ratio of observed traffic (tokens), `None` before any traffic.
    pub fn hit_ratio(&self) -> Option<f64> {
        (self.query_tokens > 0).then(|| self.hit_tokens as f64 / self.query_tokens as f64)
    }

    /// Shards modelled resident.
    pub fn resident_shards(&self) -> usize {
        let cap = self.effective_capacity();
        self.shards
            .values()
            .filter(|s| self.clock.saturating_sub(s.clock) <= cap)
            .count()
    }
}

#[cfg(test)]
mod tests;
