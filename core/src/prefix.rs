//! Longest-prefix routing: where each 512-token shard of past prompts was sent, and the rule that
//! sends a request to the pod holding the longest run of its shards. The filter (index in Envoy's
//! shared data, one key per slot) and the evaluator (index in memory) store exactly the same
//! bytes and choose with exactly this code; each host provides only a [`PrefixStore`].
//!
//! ## The index
//!
//! A bounded table of `slots` hashed slots: the shard with chain hash `h` (its last full block's
//! hash, which covers every token before it) lives in slot `h mod slots`. A slot holds one
//! [`PrefixEntry`] of [`ENTRY_BYTES`] bytes: a version byte, a flags byte (the *interior* flag
//! and a 7-bit count of *moves*), the full shard hash (a slot holding another shard is a miss,
//! so collisions cost accuracy, never a wrong match), and up to [`HOLDERS`] pods with the time
//! each was last written: the pod it was last sent to, then the others it was sent to while
//! fresh, most recent first (each ages on its own; a fifth pushes out the least recent). Newest
//! write wins; there is no delete. A pod is stored as a 64-bit hash of its id, not as an
//! index into the table (the table's pod order changes between generations) nor as the id
//! itself (fixed, small entries): a lookup compares it with the hashes of the pool's ids.
//!
//! When a request is routed, every full shard of its prompt is written with the chosen pod, and
//! each full block of its last, partial shard ([`PromptKeys`], [`record`]): a conversation's next
//! turn extends the prompt, so its shard at that depth hashes differently but contains those
//! blocks. Every written key but the prompt's deepest is flagged *interior*: some prompt went on
//! past it; the flag stays while the entry is rewritten within the horizon. A write that names
//! a pod the fresh entry does not hold among its holders counts a *move* (a prompt sent back to
//! a pod that still holds it does not): an entry that moved [`COMMON_MOVES`] times (two: sent
//! to at least three pods within the horizon) is *common* — a prefix many
//! pods hold, like a system prompt every conversation starts with, which says nothing about
//! where a request should go. The gateway also seeds entries ([`seed`]): the hot prefixes it
//! warmed, on the pods it warmed them on.
//!
//! ## The rule ([`route_prefix`])
//!
//! 0. A prompt shorter than one block has no cached prefix to find. For an adapter the table
//!    lists, it goes to one of the adapter's holders — those with it resident in a GPU slot
//!    first ([`resident_first`]), bounded load, keyed on the adapter's name (the key it is
//!    placed by). Before, it was left unrouted like a base-model request, and the proxy's load
//!    balancer sent it to any pod, which then had to load the adapter: on the shared
//!    synthetic trace, where 18 % of prompts are under 64 tokens, that was two thirds of
//!    prewarm's adapter misses. For any other model it stays unrouted: the proxy's load
//!    balancer, which sees every request as it happens, spreads it better than a table's
//!    minute-old loads.
//! 1. The pool: the pods holding the requested adapter, all pods when none does
//!    ([`serving_pods`]); the table only lists routable pods. Residency does not narrow it
//!    (measured: `route`'s module doc).
//! 2. The longest match: a binary search over the request's full shards' hashes for the deepest
//!    one in the index, then the same search over the blocks of the next shard (a previous
//!    turn's partial shard) — at most ⌈log2(shards + 1)⌉ + ⌈log2(blocks per shard + 1)⌉ reads
//!    (7 + 4 with 64-token blocks). It relies on "a prompt whose shard k is in the index has
//!    shards < k in it", which is an approximation: a routed request writes all its keys, so it
//!    holds when written, and the engine's LRU frees a finished request's blocks deepest first,
//!    so in the cache the deep end goes first too. But a slot can be overwritten by a colliding
//!    key, so a miss at depth k next to a hit at k + 1 happens; the search then settles on a
//!    shallower or deeper hit than the true longest, never on a pod that did not receive it.
//! 3. The deepest entry's pod (the *holder*) wins when the entry is younger than the horizon
//!    and not common, its pod is in the pool and keeps the request (below) — or else the
//!    entry's next most recent holder that keeps it (a template, a repeat or a long session
//!    that overflowed its pod, a seeded prefix and the pod that served it before: each is on
//!    both, up to what was matched) — and the request
//!    finds there at least as much as it brings: its matched blocks are at least half of the
//!    blocks it keys ([`finds_most`]) — a conversation's next turn, a new question on a
//!    template, a repeat. The holder has every matched block, whatever follows them, so a
//!    repeat (a prompt ending where the entry ends) sticks too. A request that brings more new
//!    tokens than it finds is mostly new content, and where new content goes is step 4's
//!    placement (bounded load, so the fleet's KV fills evenly): the holder's cache would save
//!    it less than half its prefill, and its new blocks would evict as much of the holder's.
//!    It is SGLang's router's `cache_threshold` rule with the threshold where "found" and
//!    "brought" are equal, the point where neither side of that exchange is larger. A prompt
//!    longer than the index (past [`MAX_SHARDS`] or the fingerprint's `max_prefix_tokens`) is
//!    judged on the blocks the index keys: an agent session's context past them is on the
//!    pod of its deepest key too.
//!
//!    The holder keeps the request while the wait there costs no more than moving it: when the
//!    table prices a move (`prefill_us_per_token`) and gives the holder's `wait_ms`, it keeps
//!    it while `wait(holder) ≤ matched tokens × prefill_us_per_token + wait(step 4's pod)` —
//!    moving prefills the matched prefix again on a pod that has its own queue (taken as
//!    uncached there: the entry's other holders were tried first, and a pod that holds the
//!    prefix too only makes moving cheaper). Moving off the entry's newest holder a prompt
//!    longer than the index prices its whole context ([`PromptKeys::held_tokens`]); off an
//!    earlier one, the pod the session left, only the matched blocks.
//!    The waits are the gateway's predicted queue waits (Little's law over the last minute);
//!    a batching engine starts a request at once while its batch has room, so a pod busy but
//!    not full costs nothing to stay on. Without a price or the holder's wait, the holder
//!    keeps it while under the load cap (core's [`load_cap`]: `load_factor` × the pool's
//!    mean load, never below half busy).
//! 4. Otherwise: bounded-load rendezvous keyed on the request's first shard past its common
//!    ones ([`PromptKeys::key_past`]; a third binary search, over common entries, ≤ 7 reads) —
//!    its first shard when nothing is common, which is the key the gateway places and warms hot
//!    prefixes by, past the shards its KV model sees on several pods. A system prompt every
//!    conversation starts with goes to one pod until that pod is full; the overflow moves it
//!    to others, it becomes common, and from then on new conversations are keyed on their own
//!    first shard past it, and their next turns stick (step 3). A prompt that finds at least as
//!    much in the common prefix as it brings past it (its common blocks at least half of its
//!    keyed blocks: step 3's exchange again) is placed by that key among the common entry's
//!    holders under the load cap: they hold the shared part, any other pod would prefill it.
//!    When every holder is over the cap, or the prompt brings more than it shares (mostly new
//!    content, which should fill the fleet's caches evenly), it is placed over the whole pool.
//!    Placing all of them over the whole pool left 1.0–1.3 % of the application workload's
//!    prompt tokens cached on another pod than the chosen one (docs/evaluation.md).
//!    Without a `load_factor` nothing is full, nothing moves and they collapse onto one pod.
//!    A match whose holder does not keep it goes here too (and stays when this step places it
//!    on the holder after all): the next candidates by match length would be
//!    the pods of shallower entries, but every routed request writes all its keys, so those name
//!    the same pod nearly always. Last, the waits: when the placed pod's wait exceeds the
//!    shortest wait in the pool by more than prefilling the whole prompt costs (the most the
//!    placed pod can hold of it: a warmed hot prefix, a common system prompt), the request goes
//!    to the pod with the shortest wait — step 3's rule with the whole prompt as the matched
//!    part. The load cap, a minute's busy share, cannot tell a pod whose batch is full (requests
//!    queue for a slot or a LoRA slot) from one that is busy with room to spare; the wait can.
//!
//! Measured on the shared synthetic trace (8 pods + 2, the offline evaluator, no adapters): with
//! a shared 512-token system prompt prewarm's token hit went from 0.1128 (new conversations
//! collapsed onto the system prompt's pod) to 0.3813, with 2,048 tokens from 0.1934 to 0.4425;
//! without a system prompt it fell from 0.4094 to 0.3787, the cost of sticking at branches and
//! of the load bound. The figures for every scenario and policy are in `docs/evaluation.md`;
//! `docs/routing.md` has the rule's measured variants.

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
mod move_cost;
mod seed;

pub use entry::{
    pod_hash, slot_of, Holder, MemoryStore, PrefixEntry, PrefixStore, COMMON_MOVES, DEFAULT_SLOTS,
    ENTRY_BYTES, ENTRY_VERSION, HOLDERS, MAX_MOVES, MAX_SLOTS,
};
pub use seed::seed;

use crate::fingerprint::{chain_seed, end_past_shards, BlockChain, FingerprintConfig};
use crate::placement::{clean_load, load_cap};
use crate::route::{holders, place_among, resident_first, serving_pods};
use crate::wire::{RoutedPod, RoutingTable};
use move_cost::{holder_keeps, shorter_wait};

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
    block_tokens: usize,
    /// Tokens of the whole prompt, keyed or not.
    prompt_tokens: usize,
}

impl PromptKeys {
    pub fn of(chain: &BlockChain, fingerprint: &FingerprintConfig) -> Self {
        Self {
            prompt_tokens: chain.prompt_tokens,
            ..Self::of_blocks(&chain.blocks, fingerprint)
        }
    }

    /// The keys of a prompt of `blocks` (a hot prefix's chain, say).
    pub fn of_blocks(blocks: &[crate::BlockHash], fingerprint: &FingerprintConfig) -> Self {
        let per_shard = fingerprint.blocks_per_shard().max(1);
        let limit = per_shard.saturating_mul(MAX_SHARDS);
        let block_tokens = fingerprint.block_tokens;
        Self {
            blocks: blocks.iter().take(limit).map(|b| b.0).collect(),
            per_shard,
            block_tokens,
            prompt_tokens: blocks.len().saturating_mul(block_tokens),
        }
    }

    /// Tokens of the prompt a pod holding its first `matched` blocks has: those blocks' — and,
    /// when they are every block the index keys of a prompt longer than that (an agent
    /// session's context past the fingerprint's reach), the whole prompt's, the assumption step
    /// 3 sticks on (module doc): the session's context past its deepest key went where that
    /// key went. What a move off that pod would prefill again.
    pub fn held_tokens(&self, matched: usize) -> usize {
        let keyed = self.blocks.len().saturating_mul(self.block_tokens);
        let past_keys = self.prompt_tokens >= keyed.saturating_add(self.block_tokens);
        if matched >= self.blocks.len() && past_keys {
            self.prompt_tokens
        } else {
            matched.saturating_mul(self.block_tokens)
        }
    }

    /// Tokens of the whole prompt (at least those of its keyed blocks).
    pub fn prompt_tokens(&self) -> usize {
        let keyed = self.blocks.len().saturating_mul(self.block_tokens);
        self.prompt_tokens.max(keyed)
    }

    /// The keys a placed prefix seeds ([`seed`]): its deepest full shard's end, then its last
    /// partial shard's blocks — what a lookup of a prompt going on past the prefix reads last
    /// (the shallower shards' ends it finds where traffic wrote them).
    pub fn placed(&self) -> Vec<u64> {
        let full = self.full();
        let deepest = full.checked_sub(1).and_then(|k| self.end(k));
        let tail = self.blocks.get(full.saturating_mul(self.per_shard)..);
        deepest
            .into_iter()
            .chain(tail.unwrap_or(&[]).iter().copied())
            .collect()
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
        self.key_past(0)
    }

    /// The key of a prompt whose first `blocks` blocks are held by several pods (or by a full
    /// one): the end of the first shard past them — the hash that tells this prompt's own part
    /// apart, the first shard's end when nothing is held — or the deepest block when the prompt
    /// ends within that shard.
    pub fn key_past(&self, blocks: usize) -> Option<u64> {
        end_past_shards(&self.blocks, blocks / self.per_shard, self.per_shard)
    }

    /// The prompt's deepest block's hash (its whole fingerprinted chain).
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
        let slot = slot_of(hash, store.slots());
        let old = store.read(slot);
        let Some(entry) = recorded_entry(old.as_deref(), hash, pod, i < last, now_ms, horizon_ms)
        else {
            continue;
        };
        if !store.write(slot, &entry.encode()) {
            refused = refused.saturating_add(1);
        }
    }
    refused
}

/// What [`record`] writes for one key: `old` is its slot's bytes, `hash` the key, `pod` the
/// [`pod_hash`] it was sent to, `interior` whether the prompt went on past it. `None` when the
/// slot already says the same, written less than [`REFRESH_FRACTION`] of the horizon ago (no
/// write). A host that applies a prompt's writes later (the filter batches them per tick)
/// folds them through this, key by key in [`PromptKeys::written`] order, and stores what
/// [`record`] would have stored.
pub fn recorded_entry(
    old: Option<&[u8]>,
    hash: u64,
    pod: u64,
    interior: bool,
    now_ms: u64,
    horizon_ms: u64,
) -> Option<PrefixEntry> {
    let old = old
        .and_then(PrefixEntry::decode)
        .filter(|e| e.shard == hash && e.fresh(now_ms, horizon_ms));
    let entry = PrefixEntry {
        interior: interior || old.is_some_and(|e| e.interior),
        moves: old.map_or(0, |e| {
            let moved = u8::from(!e.holders(now_ms, horizon_ms).any(|h| h == pod));
            e.moves.saturating_add(moved).min(MAX_MOVES)
        }),
        ..PrefixEntry::sent_to(old.as_ref(), hash, pod, now_ms, horizon_ms)
    };
    let refresh = horizon_ms / REFRESH_FRACTION;
    let same = old.is_some_and(|e| {
        e.pod == pod
            && e.interior == entry.interior
            && e.moves == entry.moves
            && now_ms.saturating_sub(e.at_ms) < refresh
    });
    (!same).then_some(entry)
}

/// The deepest entry a prompt finds in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Blocks of the prompt it covers.
    pub blocks: usize,
    pub entry: PrefixEntry,
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
    let found = best.map(|(blocks, entry)| PrefixMatch { blocks, entry });
    (found, reads)
}

/// The deepest of the prompt's leading full shards that the index holds as common (fresh and
/// [`PrefixEntry::common`]), with the blocks up to its end, by binary search (commonness is
/// prefix-closed: a prompt that sent shard k to a pod sent it shards < k too, so a shallower
/// shard moved at least as often).
fn deepest_common<S: PrefixStore + ?Sized>(
    store: &S,
    keys: &PromptKeys,
    now_ms: u64,
    horizon_ms: u64,
    reads: &mut u32,
) -> Option<PrefixMatch> {
    let found = deepest(keys.full(), reads, |k| {
        keys.end(k)
            .and_then(|h| entry_of(store, h))
            .filter(|e| e.fresh(now_ms, horizon_ms) && e.common())
    });
    found.map(|(k, entry)| PrefixMatch {
        blocks: k.saturating_add(1).saturating_mul(keys.per_shard),
        entry,
    })
}

/// Whether a prompt finds at its deepest match at least as many blocks as it brings past it
/// (module doc, step 3): matched blocks at least half of the blocks the index keys of it.
pub fn finds_most(found: &PrefixMatch, keys: &PromptKeys) -> bool {
    found.blocks.saturating_mul(2) >= keys.blocks.len()
}

/// Rendezvous on `key` among the pods `among` of `pool` (its positions; the holders of a
/// common prefix under the load cap); `None` when there are none.
fn place_among_holders(pool: &[&RoutedPod], among: &[usize], key: u64) -> Option<usize> {
    let holders: Vec<&RoutedPod> = among.iter().filter_map(|&i| pool.get(i).copied()).collect();
    let pick = place_among(&holders, key, None)?;
    among.get(pick).copied()
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

/// A prompt without a full block for an adapter the table lists: no cache to look for, so
/// bounded-load rendezvous among its holders (resident ones first) keyed on the adapter's name
/// ([`chain_seed`], the key it is placed by). `None` for any other model: the proxy's own load
/// balancer spreads such requests best (module doc, step 0).
fn route_short<'t>(table: &'t RoutingTable, model: &str) -> Option<PrefixRoute<'t>> {
    let pool = resident_first(holders(table, model), model, table.load_factor);
    let key = chain_seed(model);
    let primary = pool
        .get(place_among(&pool, key, table.load_factor)?)
        .copied()?;
    Some(PrefixRoute {
        primary,
        pool,
        matched_blocks: 0,
        key,
        reads: 0,
    })
}

/// The pod for a request for `model` whose prompt has `keys`, by the rule of the module docs;
/// `None` without pods, or without a full block unless the model is an adapter the table lists.
pub fn route_prefix<'t, S: PrefixStore + ?Sized>(
    table: &'t RoutingTable,
    model: &str,
    keys: &PromptKeys,
    store: &S,
    now_ms: u64,
    horizon_ms: u64,
) -> Option<PrefixRoute<'t>> {
    let Some(key) = keys.key() else {
        return route_short(table, model);
    };
    let pool = serving_pods(table, model);
    if pool.is_empty() {
        return None;
    }
    let loads: Vec<f64> = pool.iter().map(|p| clean_load(p.load)).collect();
    let cap = table
        .load_factor
        .map(|f| load_cap(loads.iter().copied(), f));
    let (found, mut reads) = longest_match(store, keys);
    let under_cap = |i: usize| cap.is_none_or(|cap| loads.get(i).is_some_and(|l| *l <= cap));
    // the pool's id hashes, once per request and only when an entry names holders (an entry
    // names up to `HOLDERS`, and two entries may be read: hashing per holder was 8 × the pool)
    let pool_hashes = std::cell::OnceCell::new();
    let in_pool = |m: &PrefixMatch| -> Vec<usize> {
        let hashes: &Vec<u64> =
            pool_hashes.get_or_init(|| pool.iter().map(|p| pod_hash(&p.id)).collect());
        m.entry
            .holders(now_ms, horizon_ms)
            .filter_map(|h| hashes.iter().position(|x| *x == h))
            .collect()
    };
    let matched = found.filter(|m| !m.entry.common() && finds_most(m, keys));
    let held = matched.as_ref().map(in_pool).unwrap_or_default();
    let blocks = matched.map_or(0, |m| m.blocks);
    // what a move off the `nth` holder prefills again: the newest has what went on past the
    // deepest key, an earlier one (the pod the prompt left) only what it matched
    let held_tokens = |nth: usize| match nth {
        0 => keys.held_tokens(blocks),
        _ => blocks.saturating_mul(keys.block_tokens),
    };
    let keeps = |(nth, pod): (usize, usize), alt: Option<usize>| {
        holder_keeps(table, &pool, (pod, held_tokens(nth)), alt).unwrap_or_else(|| under_cap(pod))
    };
    let by_recency = || held.iter().copied().enumerate();
    let (chosen, matched_blocks, key) = match by_recency().find(|&h| keeps(h, None)) {
        Some((_, pod)) => (pod, blocks, key),
        None => {
            let common = deepest_common(store, keys, now_ms, horizon_ms, &mut reads);
            let past = common.as_ref().map_or(0, |c| c.blocks);
            let placed_key = keys.key_past(past).unwrap_or(key);
            let among: Vec<usize> = common
                .filter(|c| finds_most(c, keys))
                .map(|c| in_pool(&c).into_iter().filter(|&i| under_cap(i)).collect())
                .unwrap_or_default();
            let alt = place_among_holders(&pool, &among, placed_key)
                .or_else(|| place_among(&pool, placed_key, table.load_factor))?;
            match by_recency().find(|&(nth, pod)| pod == alt || keeps((nth, pod), Some(alt))) {
                Some((_, pod)) => (pod, blocks, key),
                None => (shorter_wait(table, &pool, alt, keys), 0, placed_key),
            }
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
