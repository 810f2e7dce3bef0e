//! The KV block pool and its prefix cache, as vLLM's v1 block manager keeps them.
//!
//! - Blocks hold `block_size` tokens; block 0 is vLLM's reserved null block, so `blocks − 1`
//!   are usable.
//! - A full prompt block is registered under its chained hash (seeded by the adapter or base
//!   model name, so the same text for another adapter is another entry). Only full blocks are
//!   cached. A request's `cache_salt` is mixed into its first block's hash.
//! - Free blocks sit in one LRU queue; allocation takes from its front, and taking a block that
//!   still carries a hash evicts that hash. A cache hit on a free block takes it out of the queue.
//! - A finished request returns its blocks in reverse order, so its deepest block is evicted
//!   first.
//!
//! - With its event log on ([`BlockPool::log_events`]), every hash that enters the index and
//!   every hash evicted from it is logged in order, as vLLM's KV-cache events report them: a
//!   block enters when a request's prefill allocates it, not when the request finishes.
//!
//! Nothing here scans all blocks: lookups are hash-map probes along one prompt's chain.

use std::collections::HashMap;

use prewarm_core::fingerprint::{chain_seed, next_block_hash};

use crate::lru::LruQueue;

/// Index of a KV block in the pool.
pub type BlockId = usize;

#[derive(Debug, Clone, Copy, Default)]
struct Block {
    hash: Option<u64>,
    refs: u32,
}

/// A change to the pool's hash index, for the KV-cache events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolEvent {
    /// `hash` was registered; `parent` is the hash of the block before it in its prompt's chain.
    Stored { hash: u64, parent: Option<u64> },
    /// `hash` was evicted.
    Removed { hash: u64 },
    /// Every hash was dropped ([`BlockPool::reset`]).
    Cleared,
}

/// The pool of KV blocks with its hash index and free queue.
#[derive(Debug, Clone)]
pub struct BlockPool {
    block_bytes: usize,
    blocks: Vec<Block>,
    free: LruQueue<BlockId>,
    index: HashMap<u64, BlockId>,
    /// The index's changes since the last [`BlockPool::take_events`]; `None`: not logged.
    events: Option<Vec<PoolEvent>>,
}

/// The chained hashes of a prompt's full blocks, seeded by the cache key (adapter or base name).
pub fn prompt_block_hashes(cache_key: &str, canonical: &[u8], block_bytes: usize) -> Vec<u64> {
    salted_prompt_block_hashes(cache_key, None, canonical, block_bytes)
}

/// Marks the salt's bytes so that no block text can stand for them.
const SALT_DOMAIN: &[u8] = b"\0podsim cache_salt\0";

/// [`prompt_block_hashes`] with a request's `cache_salt` mixed into the first block's hash, as
/// vLLM mixes it into that block's extra keys: every later hash chains from it, so a salted
/// prompt shares no block with the same prompt under another salt or none. `None` gives the
/// unsalted chain.
pub fn salted_prompt_block_hashes(
    cache_key: &str,
    cache_salt: Option<&str>,
    prompt: &[u8],
    block_bytes: usize,
) -> Vec<u64> {
    let mut previous = chain_seed(cache_key);
    prompt
        .chunks_exact(block_bytes.max(1))
        .enumerate()
        .map(|(i, block)| {
            previous = next_block_hash(previous, block).0;
            if let (0, Some(salt)) = (i, cache_salt) {
                let mut keyed = Vec::with_capacity(SALT_DOMAIN.len() + salt.len());
                keyed.extend_from_slice(SALT_DOMAIN);
                keyed.extend_from_slice(salt.as_bytes());
                previous = next_block_hash(previous, &keyed).0;
            }
            previous
        })
        .collect()
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (one reserved) of `block_bytes` bytes of prompt each.
    pub fn new(num_blocks: usize, block_bytes: usize) -> Self {
        let mut free = LruQueue::default();
        for id in 1..num_blocks {
            free.push_back(id);
        }
        Self {
            block_bytes,
            blocks: vec![Block::default(); num_blocks.max(1)],
            free,
            index: HashMap::new(),
            events: None,
        }
    }

    /// Starts logging the index's changes (see [`PoolEvent`]).
    pub fn log_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The changes logged since the last call, oldest first (empty when not logging).
    pub fn take_events(&mut self) -> Vec<PoolEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn log(&mut self, event: PoolEvent) {
        if let Some(events) = self.events.as_mut() {
            events.push(event);
        }
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Usable blocks (all but the null block).
    pub fn usable_blocks(&self) -> usize {
        self.blocks.len().saturating_sub(1)
    }

    /// Blocks no request holds, cached or not (vLLM counts idle cached blocks as free).
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks that carry a hash (cached), held or free.
    pub fn cached_blocks(&self) -> usize {
        self.index.len()
    }

    /// vLLM's `kv_cache_usage_perc`: 1 − free / (blocks − 1).
    pub fn usage(&self) -> f64 {
        let usable = self.usable_blocks();
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.free_blocks() as f64 / usable as f64
    }

    /// Number of leading `hashes` that are cached. No side effects.
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.index.contains_key(h))
            .count()
    }

    /// Takes `hit` cached blocks for the first hashes and `total − hit` fresh ones, registering
    /// the hashes of the fresh full prompt blocks. When the pool runs dry the request gets fewer
    /// blocks (podsim does not preempt); the returned list is what it holds.
    pub fn allocate(&mut self, hashes: &[u64], hit: usize, total: usize) -> Vec<BlockId> {
        let mut held = Vec::with_capacity(total);
        for h in hashes.iter().take(hit) {
            if let Some(&id) = self.index.get(h) {
                self.hold(id);
                held.push(id);
            }
        }
        let mut position = held.len();
        while held.len() < total {
            let Some(id) = self.free.pop_front() else {
                break;
            };
            if let Some(old) = self.blocks.get_mut(id).and_then(|b| b.hash.take()) {
                self.index.remove(&old);
                self.log(PoolEvent::Removed { hash: old });
            }
            if let Some(&h) = hashes.get(position) {
                // A hash already cached elsewhere stays with its first block, as in vLLM.
                if let std::collections::hash_map::Entry::Vacant(e) = self.index.entry(h) {
                    e.insert(id);
                    if let Some(b) = self.blocks.get_mut(id) {
                        b.hash = Some(h);
                    }
                    let parent = position.checked_sub(1).and_then(|p| hashes.get(p)).copied();
                    self.log(PoolEvent::Stored { hash: h, parent });
                }
            }
            if let Some(b) = self.blocks.get_mut(id) {
                b.refs = b.refs.saturating_add(1);
            }
            held.push(id);
            position += 1;
        }
        held
    }

    fn hold(&mut self, id: BlockId) {
        if let Some(b) = self.blocks.get_mut(id) {
            if b.refs == 0 {
                self.free.remove(&id);
            }
            b.refs = b.refs.saturating_add(1);
        }
    }

    /// vLLM's `reset_prefix_cache`: drops every hash, when no request holds a block (else
    /// nothing changes and it answers false).
    pub fn reset(&mut self) -> bool {
        if self.free.len() < self.usable_blocks() {
            return false;
        }
        self.index.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.log(PoolEvent::Cleared);
        true
    }

    /// Returns a finished request's blocks: in reverse order, so its deepest block reaches the
    /// front of the free queue first and is evicted first.
    pub fn release(&mut self, held: &[BlockId]) {
        for &id in held.iter().rev() {
            if let Some(b) = self.blocks.get_mut(id) {
                b.refs = b.refs.saturating_sub(1);
                if b.refs == 0 {
                    self.free.push_back(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_need_cached_leading_blocks_and_eviction_takes_the_deepest_first() {
        // 4 usable blocks of 4 bytes.
        let mut pool = BlockPool::new(5, 4);
        let a = prompt_block_hashes("m", b"aaaabbbbcccc", 4);
        let held = pool.allocate(&a, 0, 3);
        assert_eq!(pool.free_blocks(), 1);
        pool.release(&held);
        assert_eq!(pool.free_blocks(), 4);
        assert_eq!(pool.cached_prefix_blocks(&a), 3);
        assert_eq!(pool.usage(), 0.0);
        // Two fresh blocks: the untouched free block, then the deepest block of `a`.
        let other = prompt_block_hashes("m", b"zzzzyyyy", 4);
        let held = pool.allocate(&other, 0, 2);
        assert_eq!(pool.cached_prefix_blocks(&a), 2);
        pool.release(&held);
        // Same text, other adapter: nothing shared.
        let b = prompt_block_hashes("adapter", b"aaaabbbbcccc", 4);
        assert_eq!(pool.cached_prefix_blocks(&b), 0);
    }

    #[test]
    fn the_event_log_reports_every_hash_registered_and_evicted_in_order() {
        let mut pool = BlockPool::new(4, 4); // 3 usable blocks
        assert!(pool.take_events().is_empty(), "not logging by default");
        pool.log_events();
        let a = prompt_block_hashes("m", b"aaaabbbb", 4);
        let held = pool.allocate(&a, 0, 2);
        pool.release(&held);
        let b = prompt_block_hashes("m", b"ccccdddd", 4);
        let hit = pool.cached_prefix_blocks(&a);
        assert_eq!(hit, 2);
        let held_b = pool.allocate(&b, 0, 2);
        assert_eq!(
            pool.take_events(),
            vec![
                PoolEvent::Stored {
                    hash: a[0],
                    parent: None
                },
                PoolEvent::Stored {
                    hash: a[1],
                    parent: Some(a[0])
                },
                // the free queue's front: the pool's never-used block, then a's deepest block
                PoolEvent::Stored {
                    hash: b[0],
                    parent: None
                },
                PoolEvent::Removed { hash: a[1] },
                PoolEvent::Stored {
                    hash: b[1],
                    parent: Some(b[0])
                },
            ]
        );
        assert!(pool.take_events().is_empty());
        assert!(!pool.reset(), "a request holds blocks");
        pool.release(&held_b);
        assert_eq!(pool.cached_blocks(), 3);
        assert!(pool.reset());
        assert_eq!(pool.cached_blocks(), 0);
        assert_eq!(pool.cached_prefix_blocks(&a), 0);
        assert_eq!(pool.take_events(), vec![PoolEvent::Cleared]);
    }

    #[test]
    fn a_salt_changes_every_block_and_no_salt_is_the_plain_chain() {
        let plain = prompt_block_hashes("m", b"aaaabbbbcccc", 4);
        assert_eq!(
            salted_prompt_block_hashes("m", None, b"aaaabbbbcccc", 4),
            plain
        );
        let t1 = salted_prompt_block_hashes("m", Some("t1"), b"aaaabbbbcccc", 4);
        let t2 = salted_prompt_block_hashes("m", Some("t2"), b"aaaabbbbcccc", 4);
        assert!(t1.iter().zip(&plain).all(|(a, b)| a != b));
        assert!(t1.iter().zip(&t2).all(|(a, b)| a != b));
        assert_eq!(
            t1,
            salted_prompt_block_hashes("m", Some("t1"), b"aaaabbbbcccc", 4)
        );
    }
}
