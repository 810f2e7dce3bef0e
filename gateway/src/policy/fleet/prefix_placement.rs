//! Where the fleet places prompt prefixes, and which it tells the filters about.
//!
//! ## The key
//!
//! A prefix is keyed past the shards that are common to the fleet,
//! as the filter's prefix rule keys a request past the shards its index holds as common
//! (`prewarm_core::prefix`). A system prompt every conversation starts with ends up cached on
//! every pod: keying on it (the first shard) would place every hot prefix that starts with it
//! on one pod; keying on the first shard past it places each by its own content, where the
//! filter sends its requests.
//!
//! Common here is the KV model's view: a shard modelled resident on at least
//! [`COMMON_HOLDERS`] pods, the pods a prefix reaches when the filter's index saw it move
//! [`COMMON_MOVES`] times. The two views agree only approximately (the index sees every
//! request at once; the model sees served records a filter tick later and ages them by
//! capacity): where they differ, a hot prefix is warmed on another pod than the one its
//! requests go to — a wasted prefill, never a failed request.
//!
//! ## The placed prefixes
//!
//! The filters' index names the pod each prefix was last sent to, and a request that branches
//! off a prefix sticks to that pod. When a pod joins, the new placement gives it some hot
//! prefixes and its warm-up prefills them — but the index still names their old pods. So the
//! routing table carries [`PlacedPrefix`]es: the hottest prefixes ([`PLACED_PREFIXES`] of
//! them, the first warm-up tier's size) that are modelled resident on the pod the placement
//! gives them, which the filters write into their index (`prewarm_core::prefix::seed`). A
//! prefix not (yet) warm where it is placed is left out: its requests keep going where the
//! index says it is cached. So is a prefix that reaches the fingerprint's `max_prefix_tokens`
//! (32,768 tokens by default): it is the head of longer prompts — an agent session's context —
//! and a warm-up prefills only the head, so seeding it would send the session's next turn to
//! a pod that must prefill the rest (on agentic sessions, ~70 k tokens: the new pods' p95 was
//! 20.6 s). Its requests stay where the index says the whole context went. Recomputed every
//! keep-warm period.

use prewarm_core::fingerprint::{key_past_shards, shards_of, BlockHash, Shard};
use prewarm_core::place;
use prewarm_core::prefix::{PromptKeys, COMMON_MOVES};
use prewarm_core::wire::PlacedPrefix;

use super::Fleet;
use crate::policy::candidates_for;
use crate::policy::warmup::SPREAD_HOLDERS;
use crate::policy::HotPrefix;

/// Hot prefixes the table places at most.
pub const PLACED_PREFIXES: usize = 100;

/// Pods a shard must be modelled on to count as common: the pods [`COMMON_MOVES`] moves reach.
pub const COMMON_HOLDERS: usize = COMMON_MOVES as usize + 1;

impl Fleet {
    /// Pods `shard` is modelled resident on, counted up to [`COMMON_HOLDERS`].
    fn shard_holders(&self, shard: &Shard) -> usize {
        self.pods
            .values()
            .filter(|p| p.kv.shards_resident(std::slice::from_ref(shard)))
            .take(COMMON_HOLDERS)
            .count()
    }

    /// Leading shards of `blocks` modelled resident on at least [`COMMON_HOLDERS`] pods.
    pub fn common_shards(&self, blocks: &[BlockHash]) -> usize {
        shards_of(blocks, &self.config.fingerprint)
            .iter()
            .take_while(|s| self.shard_holders(s) >= COMMON_HOLDERS)
            .count()
    }

    /// The leading `shards` modelled on at least [`COMMON_HOLDERS`] pods (as
    /// [`Fleet::common_shards`]), and the fewest pods any of them is modelled on (up to
    /// [`COMMON_HOLDERS`]; 0 without shards): one count per shard. Counting stops at the first
    /// shard on fewer than [`SPREAD_HOLDERS`] pods (the common run has ended there, and the plan
    /// reads no more): a prefix whose head is on one pod costs what `common_shards` did, not a
    /// count of every shard over every pod.
    fn shard_spread(&self, shards: &[Shard]) -> (usize, usize) {
        let mut common = 0;
        let mut fewest = if shards.is_empty() { 0 } else { COMMON_HOLDERS };
        for (i, s) in shards.iter().enumerate() {
            let holders = self.shard_holders(s);
            if holders >= COMMON_HOLDERS && common == i {
                common += 1;
            }
            fewest = fewest.min(holders);
            if fewest < SPREAD_HOLDERS {
                break;
            }
        }
        (common, fewest)
    }

    /// The key a prefix of `blocks` is placed by: past its common shards.
    pub fn placement_key(&self, blocks: &[BlockHash]) -> Option<BlockHash> {
        key_past_shards(blocks, self.common_shards(blocks), &self.config.fingerprint)
    }

    /// The pool's `limit` hottest prefixes, each with its [`Fleet::placement_key`].
    pub fn hot_prefixes(&self, limit: usize) -> Vec<HotPrefix> {
        let mut hot = self.pool.hot_prefixes(limit, &self.config.fingerprint);
        for h in &mut hot {
            let Some(blocks) = self.pool.get(&h.key).map(|v| v.blocks) else {
                continue;
            };
            let fingerprint = &self.config.fingerprint;
            let shards = shards_of(blocks, fingerprint);
            let (common, holders) = self.shard_spread(&shards);
            h.fleet_wide = common > 0 && common == shards.len();
            h.holders = holders;
            // `placement_key`, from the common shards counted once
            if let Some(key) = key_past_shards(blocks, common, fingerprint) {
                h.routing_key = key;
            }
        }
        hot
    }

    /// The hottest prefixes modelled warm on the pod the placement gives them, among the pods
    /// routable at `now_ms`; see the module docs.
    pub fn placed_prefixes(&self, now_ms: u64) -> Vec<PlacedPrefix> {
        let candidates = self.routable_candidates(now_ms);
        let scopes = self.adapter_scopes(&candidates, now_ms);
        let mut placed = Vec::new();
        for hot in self.hot_prefixes(PLACED_PREFIXES) {
            let among = candidates_for(hot.key.model, &candidates, &scopes);
            let Some(c) = place(hot.routing_key.0, among).and_then(|i| among.get(i)) else {
                continue;
            };
            let warm = self
                .pods
                .get(c.id)
                .is_some_and(|p| p.kv.is_resident(&hot.key));
            let Some(view) = self.pool.get(&hot.key).filter(|_| warm) else {
                continue;
            };
            // the head of longer prompts (module doc)
            if self.config.fingerprint.reaches_cap(view.blocks.len()) {
                continue;
            }
            let keys = PromptKeys::of_blocks(view.blocks, &self.config.fingerprint).placed();
            if !keys.is_empty() {
                placed.push(PlacedPrefix {
                    keys: keys.into_iter().map(BlockHash).collect(),
                    pod: c.id.to_string(),
                });
            }
        }
        placed
    }
}
