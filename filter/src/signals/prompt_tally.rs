//! One VM's tally of shared prompts (core's `trigger::shared`): per routing key, the requests
//! since the last tick, the block prefix they share and — from the key's second request on —
//! that prefix's text and shape. Folded into shared data on the tick (`observe::fold_tally`),
//! so the request path writes no shared data for it. Bounded: at most [`MAX_GROUPS`] keys and
//! `shared_prompt_tally_bytes` bytes (the group being added may exceed that by itself); beyond,
//! the least recently seen keys are dropped (`prewarm_filter_shared_prompts_evicted_total`) with their
//! requests since the last tick and their text. VM-local: a VM reload loses it.

use std::cell::{Cell, RefCell};

use lru::LruCache;
use prewarm_core::trigger::shared::{GroupFold, PromptGroup};
use prewarm_core::trigger::PromptOrigin;
use prewarm_core::{BlockHash, FingerprintConfig};

pub use prewarm_core::trigger::shared::MAX_GROUPS;

/// The tally; see the module doc.
#[derive(Debug)]
pub struct PromptTally {
    groups: RefCell<LruCache<u64, PromptGroup>>,
    bytes: Cell<usize>,
    max_bytes: usize,
    text_copies: Cell<u64>,
}

impl PromptTally {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            groups: RefCell::new(LruCache::unbounded()),
            bytes: Cell::new(0),
            max_bytes,
            text_copies: Cell::new(0),
        }
    }

    /// Tallies a request whose routing key is `key` and whose fingerprinted blocks are
    /// `blocks`; returns the groups it evicted.
    pub fn observe(
        &self,
        key: BlockHash,
        origin: &PromptOrigin<'_>,
        blocks: &[BlockHash],
        keep_warm: bool,
        fingerprint: &FingerprintConfig,
    ) -> u64 {
        let mut groups = self.groups.borrow_mut();
        let mut bytes = self.bytes.get();
        match groups.get_mut(&key.0) {
            Some(group) if group.is_for(origin.model) => {
                bytes = bytes.saturating_sub(group.bytes());
                if group.add(origin, blocks, keep_warm, fingerprint) {
                    self.text_copies
                        .set(self.text_copies.get().saturating_add(1));
                }
                bytes = bytes.saturating_add(group.bytes());
            }
            // another model's key (a hash collision): the newcomer takes the entry
            Some(group) => {
                bytes = bytes.saturating_sub(group.bytes());
                *group = PromptGroup::first(origin, blocks, keep_warm);
                bytes = bytes.saturating_add(group.bytes());
            }
            None => {
                let group = PromptGroup::first(origin, blocks, keep_warm);
                bytes = bytes.saturating_add(group.bytes());
                groups.put(key.0, group);
            }
        }
        let mut evicted = 0;
        while (groups.len() > MAX_GROUPS || bytes > self.max_bytes) && groups.len() > 1 {
            let Some((_, group)) = groups.pop_lru() else {
                break;
            };
            bytes = bytes.saturating_sub(group.bytes());
            evicted += 1;
        }
        self.bytes.set(bytes);
        evicted
    }

    /// Calls `each` with every group a fold takes at `now_ms` (core's `take_fold`: those with
    /// requests since the last fold, and those holding their text within `window_ms` of their
    /// last request), and what the fold takes of it (the group's requests start again from
    /// zero).
    pub fn fold(
        &self,
        now_ms: u64,
        window_ms: u64,
        mut each: impl FnMut(BlockHash, &PromptGroup, GroupFold),
    ) {
        let mut groups = self.groups.borrow_mut();
        for (key, group) in groups.iter_mut() {
            if let Some(fold) = group.take_fold(now_ms, window_ms) {
                each(BlockHash(*key), group, fold);
            }
        }
    }

    /// Bytes held (core's `PromptGroup::bytes` summed).
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }

    /// Routing keys held.
    pub fn len(&self) -> usize {
        self.groups.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Times a request's text was copied (a group's second request, a shrunk prefix).
    pub fn text_copies(&self) -> u64 {
        self.text_copies.get()
    }

    /// Bytes of copied text held.
    pub fn text_bytes(&self) -> usize {
        self.groups
            .borrow()
            .iter()
            .map(|(_, g)| g.text_bytes())
            .fold(0, usize::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::{BlockChain, Endpoint};

    fn tally(tally: &PromptTally, text: &str) -> u64 {
        let fp = FingerprintConfig::default();
        let chain = BlockChain::of("m", text.as_bytes(), &fp);
        let origin = PromptOrigin {
            model: "m",
            tenant: None,
            endpoint: Endpoint::Completions,
            canonical: text,
            request: None,
        };
        let key = chain.routing_key(&fp).unwrap();
        tally.observe(key, &origin, &chain.blocks, true, &fp)
    }

    #[test]
    fn groups_and_bytes_stay_bounded_and_the_recent_stay() {
        let t = PromptTally::new(256 << 10);
        let hot = "h".repeat(2048);
        for i in 0..(MAX_GROUPS * 2) {
            tally(&t, &format!("{i:08} {}", "x".repeat(300)));
            if i % 100 == 0 {
                tally(&t, &hot);
            }
            assert!(t.len() <= MAX_GROUPS);
            assert!(t.bytes() <= 256 << 10);
        }
        // the hot prompt was seen often enough to stay, and only it copied text
        assert!(t.text_copies() > 0);
        assert_eq!(t.text_bytes(), 2048);
        let mut folded = 0;
        t.fold(0, 60_000, |_, g, f| {
            folded += f.requests;
            assert!(g.text_bytes() == 0 || g.text_bytes() == 2048);
        });
        assert!(folded > 0);
        let mut again = 0;
        t.fold(60_000, 60_000, |_, _, _| again += 1);
        assert_eq!(
            again, 0,
            "a fold takes the requests; past the window none is rechecked"
        );
    }

    #[test]
    fn the_byte_bound_evicts_least_recent_first() {
        let t = PromptTally::new(64 << 10);
        let mut evicted = 0;
        for i in 0..100 {
            // twice: the second copies the text
            let prompt = format!("{i:04}{}", "y".repeat(4000));
            evicted += tally(&t, &prompt) + tally(&t, &prompt);
        }
        assert!(evicted > 0);
        assert!(t.bytes() <= 64 << 10);
        assert_eq!(t.len() as u64 + evicted, 100);
        // the most recent stayed, with their text
        assert_eq!(t.text_bytes(), t.len() * 15 * 256);
    }
}
