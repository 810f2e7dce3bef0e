//! Longest-prefix routing: where each 512-token shard of past prompts was sent, and the rule that
//! sends a request to the pod holding the longest run of its shards. The filter (index in Envoy's
//! shared data, one key per slot) and the evaluator (index in memory) store exactly the same
//! bytes and choose with exactly this code; each host provides only a [`PrefixStore`].
//!
//! ## The index
//!
//! A bounded table of `slots` hashed slots: the shard with chain hash `h` (its last full block's
//! hash, which covers every token before it) lives in slot `h mod slots`. A slot holds one
//! [`PrefixEntry`] of [`ENTRY_BYTES`] bytes: a version byte, a flags byte, the full shard hash
//! (a slot holding another shard is a miss, so collisions cost accuracy, never a wrong match), the
//! pod, and the time of the write. Newest write wins; there is no delete. The pod is stored as a
//! 64-bit hash of its id, not as an index into the table (the table's pod order changes between
//! generations) nor as the id itself (fixed, small entries): a lookup compares it with the hashes
//! of the pool's ids.
//!
//! When a request is routed, every full shard of its prompt is written with the chosen pod, and
//! each full block of its last, partial shard ([`PromptKeys`], [`record`]): a conversation's next
//! turn extends the prompt, so its shard at that depth hashes differently but contains those
//! blocks. Every written key but the prompt's deepest is flagged *interior*: some prompt went on
//! past it; the flag stays while the entry is rewritten within the horizon.
//!
//! ## The rule ([`route_prefix`])
//!
//! 1. The pool: the pods holding the requested adapter, all pods when none does
//!    ([`serving_pods`]); the table only lists routable pods.
//! 2. The longest match: a binary search over the request's full shards' hashes for the deepest
//!    one in the index, then the same search over the blocks of the next shard (a previous
//!    turn's partial shard) — at most ⌈log2(shards + 1)⌉ + ⌈log2(blocks per shard + 1)⌉ reads
//!    (7 + 4 with 64-token blocks). It relies on "a prompt whose shard k is in the index has
//!    shards < k in it", which is an approximation: a routed request writes all its keys, so it
//!    holds when written, and the engine's LRU frees a finished request's blocks deepest first,
//!    so in the cache the deep end goes first too. But a slot can be overwritten by a colliding
//!    key, so a miss at depth k next to a hit at k + 1 happens; the search then settles on a
//!    shallower or deeper hit than the true longest, never on a pod that did not receive it.
//! 3. The deepest entry's pod wins when the entry is younger than the horizon, its pod is in the
//!    pool, its load is under the bounded-load cap (`load_factor` × the pool's mean load, as
//!    [`place_bounded`] bounds it), and the request *continues* it: the entry is the end of the
//!    prompts that wrote it (not interior) and the request goes on past it — a conversation's
//!    next turn, which holds its previous turn and something more. Nothing else sticks. A
//!    branch (an interior entry the request goes on past differently: a template, a system
//!    prompt) is held by every pod its branches went to, and a repeat (a prompt ending where the
//!    entry ends: the same template with a short question) is what the gateway warms: both go
//!    by step 4, where the gateway's warm-up placed them — above all on a pod that joined, whose
//!    warm-up prefilled the templates that now place on it (the index still names the pods that
//!    served them before the join; the gateway does not seed it yet). When the matched pod is
//!    over the cap, the next candidates by match length would be the pods of shallower entries,
//!    but every routed request writes all its keys, so those name the same pod nearly always;
//!    the rule goes to step 4 rather than spend reads on them.
//! 4. Otherwise: bounded-load rendezvous, keyed on the request's first shard's hash — the key
//!    the gateway's warm-up places hot prefixes by, so the request goes where the gateway warmed
//!    it — except for a branch whose first-shard pod is over the load cap: that one is keyed on
//!    its deepest block's hash (the whole fingerprinted chain). That is the case of a system
//!    prompt every conversation starts with: its first-shard pod takes new conversations until
//!    it is full, then they spread. Pure "least loaded" would be the ideal for a new
//!    conversation, but the table's loads are about a second old, so it would send every new
//!    conversation of that second to the same pod (and so would the first-shard ranking's next
//!    pod); rendezvous on a key unique to the conversation spreads them like a hash, the load
//!    bound keeps the full pods out, and the conversation's next turns then stick (step 3).
//!    Without a `load_factor` in the table there is no cap, nothing is full and branches all go
//!    to their first-shard pod: new conversations on one system prompt collapse onto one pod as
//!    before (only their next turns gain). `docs/routing.md` has the figures, and why telling a
//!    universal system prompt from a group's template needs more than this index knows.
//!
//! Measured on the shared synthetic trace (8 pods + 2, ServeGen adapters, the gateway's default
//! table without a load factor), prewarm's token hit: this rule 0.4081, first-shard routing
//! before it 0.4081 (the trace's requests are repeats and branches, hardly continuations);
//! sticking at branches and repeats too 0.395 (and a joining pod's warmed templates kept going
//! to their old pods); keying every fallback on the whole chain 0.361, with 5× the warm-up
//! prefill (the gateway kept warming where traffic did not go); spreading every branch off a
//! prefix two pods wrote (a "shared" flag) 0.394, as a pod join makes a template's prefix
//! shared and its branches then scattered.

//! ## The horizon
//!
//! An entry counts only while younger than a horizon, after which the pod has probably evicted
//! the shard: the time the pod takes to write its whole KV cache with new tokens,
//! `kv_tokens ÷ (prefill_tokens_per_s × duty)` ([`eviction_horizon_ms`]). Only uncached prefill
//! evicts (a cache hit writes nothing; decode fills blocks thousands of times slower), and
//! `duty`, the share of its time a pod spends prefilling uncached tokens, is an assumption:
//! [`UNCACHED_PREFILL_DUTY`] = 10 %. The two errors cost differently: an entry trusted after its
//! shard was evicted costs one miss (what no entry would cost too), while an entry dropped
//! while still cached loses the conversation's stickiness; so the horizon errs long. At duty
//! 1 (the floor: younger than that, the pod cannot have evicted it) the prewarm policy's token
//! hit on the shared synthetic trace fell from 0.395 to 0.364; at duty 0.01 it did not move
//! (measured with an earlier variant of the rule that also stuck at branches and repeats).
//! The right figure is each pod's measured uncached-token rate (the gateway sees it in the
//! pods' prefix-cache counters); carrying it in the routing table is not done yet.

mod entry;

pub use entry::{
    pod_hash, slot_of, MemoryStore, PrefixEntry, PrefixStore, DEFAULT_SLOTS, ENTRY_BYTES,
    ENTRY_VERSION, MAX_SLOTS,
};

use crate::fingerprint::{BlockChain, FingerprintConfig};
use crate::placement::{clean_load, load_cap, place, place_bounded, PlacementCandidate};
use crate::route::serving_pods;
use crate::wire::{RoutedPod, RoutingTable};

/// Shards of a prompt the index writes and searches (64 = 32,768 tokens, the default
/// fingerprinted prefix); deeper shards are ignored.
pub const MAX_SHARDS: usize = 64;

/// The horizon of a Llama 3.1 8B pod on one H100 as podsim models it (the field's figures):
/// 32,768 KV blocks of 16 tokens (524,288 tokens) prefilled at 4,000 tokens/s (250 µs a token)
/// a tenth of the time: 1,311 s. The filter's default; [`eviction_horizon_ms`] for other pods.
pub const DEFAULT_HORIZON_MS: u64 = 1_310_720;

/// An unchanged entry is rewritten once it is older than the horizon ÷ this.
pub const REFRESH_FRACTION: u64 = 16;

/// Assumed share of a pod's time spent prefilling uncached tokens; see the module docs.
pub const UNCACHED_PREFILL_DUTY: f64 = 0.1;

/// The horizon for pods of `kv_tokens` tokens of KV cache prefilling at most
/// `prefill_tokens_per_s`: the time to write the whole cache with new tokens at
/// [`UNCACHED_PREFILL_DUTY`]; see the module docs.
pub fn eviction_horizon_ms(kv_tokens: u64, prefill_tokens_per_s: f64) -> u64 {
    if !(prefill_tokens_per_s.is_finite() && prefill_tokens_per_s > 0.0) {
        return 0;
    }
    let ms = kv_tokens as f64 / (prefill_tokens_per_s * UNCACHED_PREFILL_DUTY) * 1000.0;
    if ms.is_finite() && ms >= 0.0 {
        ms.min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// What the index keys a prompt by: the chain hash at the end of each full 512-token shard (at
/// most [`MAX_SHARDS`]) and, for a last partial shard, the hash of each of its full blocks. The
/// partial shard's blocks are written too because the next turn of a conversation extends the
/// prompt: its shard at that depth is fuller and hashes differently, but it contains the
/// previous turn's blocks, and a lookup finds them by a second binary search inside that shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptKeys {
    blocks: Vec<u64>,
    per_shard: usize,
}

impl PromptKeys {
    pub fn of(chain: &BlockChain, fingerprint: &FingerprintConfig) -> Self {
        let per_shard = fingerprint.blocks_per_shard().max(1);
        let limit = per_shard.saturating_mul(MAX_SHARDS);
        Self {
            blocks: chain.blocks.iter().take(limit).map(|b| b.0).collect(),
            per_shard,
        }
    }

    /// Full shards.
    fn full(&self) -> usize {
        self.blocks.len() / self.per_shard
    }

    /// The chain hash ending full shard `k`.
    fn end(&self, k: usize) -> Option<u64> {
        let i = k
            .checked_add(1)?
            .checked_mul(self.per_shard)?
            .checked_sub(1)?;
        self.blocks.get(i).copied()
    }

    /// The hashes a routed prompt writes: every full shard's end, then the partial shard's blocks.
    pub fn written(&self) -> Vec<u64> {
        let full = self.full();
        let tail = self.blocks.get(full.saturating_mul(self.per_shard)..);
        (0..full)
            .filter_map(|k| self.end(k))
            .chain(tail.unwrap_or(&[]).iter().copied())
            .collect()
    }

    /// The key of a prompt the index knows nothing of: its first shard's hash (the first-shard
    /// routing key, `BlockChain::routing_key`), where the gateway's warm-up places hot prefixes.
    pub fn first_shard_key(&self) -> Option<u64> {
        let n = self.blocks.len().min(self.per_shard);
        n.checked_sub(1).and_then(|i| self.blocks.get(i)).copied()
    }

    /// The key of a prompt that branches off a prefix whose pod is full: its deepest block's
    /// hash.
    pub fn key(&self) -> Option<u64> {
        self.blocks.last().copied()
    }
}

/// The entry stored for `hash`, if the slot holds it.
fn entry_of<S: PrefixStore + ?Sized>(store: &S, hash: u64) -> Option<PrefixEntry> {
    let bytes = store.read(slot_of(hash, store.slots()))?;
    PrefixEntry::decode(&bytes).filter(|e| e.shard == hash)
}

/// Writes a routed prompt's keys as sent to `pod_id` at `now_ms`; returns the writes the store
/// refused. Every key but the deepest is written interior (the prompt continued past it), and
/// an entry that was interior within the horizon stays so. An entry that would only change its
/// time, written less than [`REFRESH_FRACTION`] of the horizon ago, is left as it is: a hot
/// prefix costs one read per request, not a write (the entry's age errs by at most that much).
pub fn record<S: PrefixStore + ?Sized>(
    store: &mut S,
    keys: &PromptKeys,
    pod_id: &str,
    now_ms: u64,
    horizon_ms: u64,
) -> u64 {
    let pod = pod_hash(pod_id);
    let written = keys.written();
    let last = written.len().saturating_sub(1);
    let mut refused = 0u64;
    for (i, hash) in written.into_iter().enumerate() {
        let old = entry_of(store, hash).filter(|e| e.fresh(now_ms, horizon_ms));
        let entry = PrefixEntry {
            shard: hash,
            pod,
            at_ms: now_ms,
            interior: i < last || old.is_some_and(|e| e.interior),
        };
        let refresh = horizon_ms / REFRESH_FRACTION;
        let same = old.is_some_and(|e| {
            e.pod == pod && e.interior == entry.interior && now_ms.saturating_sub(e.at_ms) < refresh
        });
        if same {
            continue;
        }
        if !store.write(slot_of(hash, store.slots()), &entry.encode()) {
            refused = refused.saturating_add(1);
        }
    }
    refused
}

/// The deepest entry a prompt finds in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Blocks of the prompt it covers.
    pub blocks: usize,
    pub entry: PrefixEntry,
    /// Whether the prompt goes on past it.
    pub continues: bool,
}

impl PrefixMatch {
    /// Whether the prompt branches off a path an earlier prompt already continued: the entry is
    /// interior and this prompt goes on past it differently (its next key was not found).
    pub fn branches(&self) -> bool {
        self.entry.interior && self.continues
    }

    /// Whether the prompt continues one that ended there (a conversation's next turn): the
    /// entry is not interior and this prompt goes on past it.
    pub fn continues_a_leaf(&self) -> bool {
        !self.entry.interior && self.continues
    }
}

/// The last index in `0..n` at which `probe` finds an entry, by binary search (assuming hits
/// form a prefix of the range), counting reads.
fn deepest(
    n: usize,
    reads: &mut u32,
    mut probe: impl FnMut(usize) -> Option<PrefixEntry>,
) -> Option<(usize, PrefixEntry)> {
    let (mut lo, mut hi) = (0usize, n);
    let mut best = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        *reads = reads.saturating_add(1);
        match probe(mid) {
            Some(entry) => {
                best = Some((mid, entry));
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    best
}

/// The deepest entry of `keys` in the store: a binary search over full shards' ends, then one
/// over the blocks of the next shard (a previous turn's partial shard); at most
/// ⌈log2(shards + 1)⌉ + ⌈log2(blocks per shard + 1)⌉ reads. Returns it and the reads made.
pub fn longest_match<S: PrefixStore + ?Sized>(
    store: &S,
    keys: &PromptKeys,
) -> (Option<PrefixMatch>, u32) {
    let mut reads = 0u32;
    let per = keys.per_shard;
    let shard = deepest(keys.full(), &mut reads, |k| {
        keys.end(k).and_then(|h| entry_of(store, h))
    });
    let mut best = shard.map(|(k, entry)| (k.saturating_add(1).saturating_mul(per), entry));
    let from = shard.map_or(0, |(k, _)| k.saturating_add(1).saturating_mul(per));
    let inside = keys.blocks.get(from..).unwrap_or(&[]);
    let inside = inside.get(..inside.len().min(per)).unwrap_or(&[]);
    if let Some((i, entry)) = deepest(inside.len(), &mut reads, |i| {
        inside.get(i).and_then(|h| entry_of(store, *h))
    }) {
        best = Some((from.saturating_add(i).saturating_add(1), entry));
    }
    let found = best.map(|(blocks, entry)| PrefixMatch {
        blocks,
        entry,
        continues: blocks < keys.blocks.len(),
    });
    (found, reads)
}

/// A request's route by the prefix rule.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixRoute<'t> {
    pub primary: &'t RoutedPod,
    /// The pods it was chosen among.
    pub pool: Vec<&'t RoutedPod>,
    /// Blocks matched on `primary` (0: placed by rendezvous).
    pub matched_blocks: usize,
    /// The rendezvous key (the deepest block's hash), for ranking alternatives.
    pub key: u64,
    /// Index reads made.
    pub reads: u32,
}

/// The pod for a request for `model` whose prompt has `keys`, by the rule of the module docs;
/// `None` without pods or without a full block.
pub fn route_prefix<'t, S: PrefixStore + ?Sized>(
    table: &'t RoutingTable,
    model: &str,
    keys: &PromptKeys,
    store: &S,
    now_ms: u64,
    horizon_ms: u64,
) -> Option<PrefixRoute<'t>> {
    let key = keys.key()?;
    let pool = serving_pods(table, model);
    if pool.is_empty() {
        return None;
    }
    let loads: Vec<f64> = pool.iter().map(|p| clean_load(p.load)).collect();
    let cap = table
        .load_factor
        .map(|f| load_cap(loads.iter().copied(), f));
    let (found, reads) = longest_match(store, keys);
    let sticky = found
        .filter(|m| m.entry.fresh(now_ms, horizon_ms) && m.continues_a_leaf())
        .and_then(|m| {
            let pod = pool.iter().position(|p| pod_hash(&p.id) == m.entry.pod)?;
            let under_cap = match cap {
                Some(cap) => loads.get(pod).is_some_and(|l| *l <= cap),
                None => true,
            };
            under_cap.then_some((pod, m.blocks))
        });
    let candidates: Vec<PlacementCandidate<'_>> = pool
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, p.weight))
        .collect();
    let first = keys.first_shard_key().unwrap_or(key);
    // a branch whose first-shard pod is over the load cap: the whole chain, to spread; else
    // where the gateway warms
    let full = |i: usize| cap.is_some_and(|cap| loads.get(i).is_none_or(|l| *l > cap));
    let spread = found.is_some_and(|m| m.entry.fresh(now_ms, horizon_ms) && m.branches())
        && place(first, &candidates).is_some_and(full);
    let key = if spread { key } else { first };
    let (chosen, matched_blocks) = match sticky {
        Some(m) => m,
        None => {
            let placed = match table.load_factor {
                Some(f) => place_bounded(key, &candidates, &loads, f),
                None => place(key, &candidates),
            }?;
            (placed, 0)
        }
    };
    let primary = pool.get(chosen).copied()?;
    Some(PrefixRoute {
        primary,
        pool,
        matched_blocks,
        key,
        reads,
    })
}

#[cfg(test)]
mod tests;
