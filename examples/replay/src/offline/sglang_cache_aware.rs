//! `sglang_cache_aware`: the cache-aware policy of SGLang's router (sgl-router, now the SGLang
//! Model Gateway, "SMG"), as a baseline.
//!
//! The router never sees an engine's cache. It keeps, per worker, an *approximate* radix tree of
//! the prompts it routed there, and decides per request:
//! 1. if load is imbalanced — `max − min > balance_abs_threshold` and
//!    `max > balance_rel_threshold × min`, over the router's own counts of requests it sent and
//!    that have not finished — the least loaded worker;
//! 2. else, if the longest match over the workers' trees, as a share of the request's length,
//!    is above `cache_threshold`, the worker with that match;
//! 3. else the worker with the smallest tree (the most free cache, as the router guesses).
//!
//! The request's prompt is then inserted into the chosen worker's tree (also in case 1). Every
//! `eviction_interval` seconds each tree is cut to `max_tree_size` by evicting least recently
//! used leaves. Defaults are SMG's documented ones ([`CacheAwareConfig::default`]).
//!
//! Granularity: SMG's HTTP tree is over text characters, per model. Here a tree holds the
//! chained hashes of the prompt's 16-token engine blocks, seeded by the model (the adapter or the
//! base model), as podsim and vLLM hash them. Because each hash covers everything before it, a
//! set of chain hashes *is* a prefix tree, and the longest match is the number of leading hashes
//! present — the character tree's match rounded down to a block (< 16 tokens of difference).
//! `max_tree_size` (characters in SMG) is converted at 4 bytes a token (the replayer's token
//! model). Ties (equal match, equal tree size, equal load) go to the lowest pod index, as a
//! first-minimum scan does. No adapter awareness: SMG has none.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use podsim::prefix_cache::prompt_block_hashes;
use podsim::Admission;

use super::fleet::Fleet;
use super::policy::{Policy, RequestCtx};
use crate::scenario::FleetEvent;

/// The policy's knobs; defaults from SMG's documentation (docs/baselines.md cites them).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheAwareConfig {
    /// Match rate (matched / prompt tokens) above which the best-matching worker is chosen.
    pub cache_threshold: f64,
    /// Imbalance needs `max − min` running requests above this…
    pub balance_abs_threshold: usize,
    /// …and `max > min ×` this.
    pub balance_rel_threshold: f64,
    /// Seconds between eviction rounds.
    pub eviction_interval_s: f64,
    /// Characters a worker's tree may hold after an eviction round.
    pub max_tree_size_chars: usize,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_s: 120.0,
            max_tree_size_chars: 1 << 26,
        }
    }
}

impl CacheAwareConfig {
    /// Whether the router's running-request counts are imbalanced.
    pub fn is_imbalanced(&self, loads: &[usize]) -> bool {
        let (Some(&max), Some(&min)) = (loads.iter().max(), loads.iter().min()) else {
            return false;
        };
        max - min > self.balance_abs_threshold
            && max as f64 > min as f64 * self.balance_rel_threshold
    }
}

/// One worker's approximate tree: the chain hashes routed there, each with its last use.
///
/// A hash is touched whenever a deeper one of the same prompt is, so a parent is never older
/// than its children; evicting oldest first, deepest first among equals, removes leaves only,
/// and the set stays prefix-closed.
#[derive(Debug, Default)]
pub struct ApproxTree {
    nodes: HashMap<u64, (u64, usize)>,
    by_age: BTreeSet<(u64, Reverse<usize>, u64)>,
}

impl ApproxTree {
    /// Blocks in the tree.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Leading blocks of `chain` in the tree.
    pub fn longest_match(&self, chain: &[u64]) -> usize {
        chain
            .iter()
            .take_while(|h| self.nodes.contains_key(h))
            .count()
    }

    /// Inserts (or touches) every block of `chain` at time `tick`.
    pub fn insert(&mut self, chain: &[u64], tick: u64) {
        for (depth, &h) in chain.iter().enumerate() {
            if let Some((old_tick, old_depth)) = self.nodes.insert(h, (tick, depth)) {
                self.by_age.remove(&(old_tick, Reverse(old_depth), h));
            }
            self.by_age.insert((tick, Reverse(depth), h));
        }
    }

    /// Evicts least recently used leaves until at most `max_blocks` remain.
    pub fn evict_to(&mut self, max_blocks: usize) {
        while self.nodes.len() > max_blocks {
            let Some((_, _, h)) = self.by_age.pop_first() else {
                break;
            };
            self.nodes.remove(&h);
        }
    }
}

/// The decision for one request, from the router's view of every worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerView {
    /// Requests sent to the worker that have not finished.
    pub load: usize,
    /// Leading tokens of the request found in the worker's tree.
    pub matched_tokens: usize,
    /// Blocks in the worker's tree.
    pub tree_blocks: usize,
}

/// SMG's rule over `workers` for a request of `prompt_tokens`; `None` without workers.
pub fn select_worker(
    config: &CacheAwareConfig,
    workers: &[WorkerView],
    prompt_tokens: usize,
) -> Option<usize> {
    let first_min_by = |key: &dyn Fn(&WorkerView) -> usize| {
        workers
            .iter()
            .enumerate()
            .min_by_key(|(i, w)| (key(w), *i))
            .map(|(i, _)| i)
    };
    let loads: Vec<usize> = workers.iter().map(|w| w.load).collect();
    if config.is_imbalanced(&loads) {
        return first_min_by(&|w| w.load);
    }
    let best = workers
        .iter()
        .enumerate()
        .max_by_key(|(i, w)| (w.matched_tokens, Reverse(*i)))?;
    let rate = best.1.matched_tokens as f64 / prompt_tokens.max(1) as f64;
    if rate > config.cache_threshold {
        Some(best.0)
    } else {
        first_min_by(&|w| w.tree_blocks)
    }
}

/// SMG's cache-aware routing over the fleet.
#[derive(Debug)]
pub struct SglangCacheAware {
    config: CacheAwareConfig,
    block_tokens: usize,
    block_bytes: usize,
    trees: Vec<ApproxTree>,
    /// Finish times of the requests sent to each worker (the router's running counts).
    in_flight: Vec<Vec<f64>>,
    tick: u64,
    next_eviction_s: f64,
    /// The chain of the request being routed, inserted once it is served.
    pending: Option<(usize, Vec<u64>)>,
}

impl SglangCacheAware {
    pub fn new(config: CacheAwareConfig, fleet: &Fleet) -> Self {
        let next_eviction_s = config.eviction_interval_s;
        Self {
            config,
            block_tokens: fleet.config().block_size,
            block_bytes: fleet.config().block_bytes(),
            trees: Vec::new(),
            in_flight: Vec::new(),
            tick: 0,
            next_eviction_s,
            pending: None,
        }
    }

    fn max_tree_blocks(&self) -> usize {
        self.config.max_tree_size_chars / self.block_bytes.max(1)
    }

    fn grow_to(&mut self, pods: usize) {
        if self.trees.len() < pods {
            self.trees.resize_with(pods, ApproxTree::default);
        }
        if self.in_flight.len() < pods {
            self.in_flight.resize_with(pods, Vec::new);
        }
    }
}

impl Policy for SglangCacheAware {
    fn name(&self) -> &'static str {
        "sglang_cache_aware"
    }

    fn on_event(&mut self, fleet: &mut Fleet, event: FleetEvent, _now_s: f64) {
        self.grow_to(fleet.pods.len());
        // A restarted worker's requests fail and leave the router's count; its tree stays (the
        // router is not told the cache is gone).
        if let FleetEvent::RestartPod { index, .. } = event {
            if let Some(f) = self.in_flight.get_mut(index) {
                f.clear();
            }
        }
    }

    fn next_wakeup(&self) -> Option<f64> {
        Some(self.next_eviction_s)
    }

    fn advance(&mut self, _fleet: &mut Fleet, now_s: f64) {
        let max = self.max_tree_blocks();
        for tree in &mut self.trees {
            tree.evict_to(max);
        }
        let interval = self.config.eviction_interval_s.max(1.0);
        while self.next_eviction_s <= now_s {
            self.next_eviction_s += interval;
        }
    }

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        self.grow_to(fleet.pods.len());
        let now = request.now_s;
        let chain = prompt_block_hashes(
            request.model,
            request.canonical.as_bytes(),
            self.block_bytes,
        );
        let workers: Vec<WorkerView> = (0..fleet.pods.len())
            .map(|i| {
                let load = self.in_flight.get_mut(i).map_or(0, |f| {
                    f.retain(|&t| t > now);
                    f.len()
                });
                let tree = self.trees.get(i);
                WorkerView {
                    load,
                    matched_tokens: tree.map_or(0, |t| t.longest_match(&chain)) * self.block_tokens,
                    tree_blocks: tree.map_or(0, ApproxTree::len),
                }
            })
            .collect();
        let pod = select_worker(&self.config, &workers, request.chain.prompt_tokens).unwrap_or(0);
        self.pending = Some((pod, chain));
        pod
    }

    fn served(
        &mut self,
        _fleet: &mut Fleet,
        _request: &RequestCtx<'_>,
        pod: usize,
        admission: &Admission,
    ) {
        self.tick += 1;
        if let Some((routed, chain)) = self.pending.take() {
            if let Some(tree) = self.trees.get_mut(routed) {
                tree.insert(&chain, self.tick);
            }
        }
        if let Some(f) = self.in_flight.get_mut(pod) {
            f.push(admission.finish_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trees_longest_match_is_exact_on_a_built_example() {
        // chain hashes: a hash names its whole prefix, so 7 after [1, 2] is never 3's sibling 7
        let mut tree = ApproxTree::default();
        tree.insert(&[1, 2, 3, 4], 1);
        tree.insert(&[1, 2, 7], 2);
        assert_eq!(tree.longest_match(&[1, 2, 3, 4, 5]), 4);
        assert_eq!(tree.longest_match(&[1, 2, 7, 8]), 3);
        assert_eq!(tree.longest_match(&[1, 2, 9]), 2);
        assert_eq!(tree.longest_match(&[9, 1, 2]), 0);
        assert_eq!(tree.longest_match(&[]), 0);
        assert_eq!(tree.len(), 5);
    }

    #[test]
    fn eviction_removes_least_recently_used_leaves_first() {
        let mut tree = ApproxTree::default();
        tree.insert(&[1, 2, 3, 4], 1);
        tree.insert(&[1, 2, 7], 2);
        // [3, 4] is the oldest branch: 4 then 3 go, the shared [1, 2] and the newer 7 stay
        tree.evict_to(3);
        assert_eq!(tree.len(), 3);
        assert_eq!(tree.longest_match(&[1, 2, 3, 4]), 2);
        assert_eq!(tree.longest_match(&[1, 2, 7]), 3);
        tree.evict_to(1);
        assert_eq!(tree.longest_match(&[1, 2, 7]), 1);
    }

    fn view(load: usize, matched_tokens: usize, tree_blocks: usize) -> WorkerView {
        WorkerView {
            load,
            matched_tokens,
            tree_blocks,
        }
    }

    #[test]
    fn the_imbalance_rule_sends_to_the_least_loaded() {
        let config = CacheAwareConfig::default();
        // worker 0 holds the whole prompt, but runs 100 requests against 10 elsewhere
        let workers = [view(100, 1000, 10), view(10, 0, 5), view(12, 0, 1)];
        assert_eq!(select_worker(&config, &workers, 1000), Some(1));
        // 65 apart but not 1.5 times: balanced, the match wins
        let workers = [view(200, 1000, 10), view(135, 0, 5), view(140, 0, 1)];
        assert_eq!(select_worker(&config, &workers, 1000), Some(0));
        // 1.5 times apart but only 60 requests: balanced
        let workers = [view(90, 1000, 10), view(30, 0, 5)];
        assert_eq!(select_worker(&config, &workers, 1000), Some(0));
    }

    #[test]
    fn a_match_above_the_threshold_wins_else_the_smallest_tree() {
        let config = CacheAwareConfig::default();
        let workers = [view(0, 0, 50), view(0, 400, 90), view(0, 0, 20)];
        // 400 / 1000 > 0.3: the best match
        assert_eq!(select_worker(&config, &workers, 1000), Some(1));
        // 400 / 2000 ≤ 0.3: the smallest tree
        assert_eq!(select_worker(&config, &workers, 2000), Some(2));
        assert_eq!(select_worker(&config, &[], 10), None);
    }
}
