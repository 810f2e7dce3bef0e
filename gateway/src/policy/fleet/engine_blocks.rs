//! What a pod's engine says its prefix cache holds: the ledger of its KV-cache events
//! (`[[pods]] kv_events`, vLLM's `--kv-events-config`; the wire format is core's
//! [`prewarm_core::kv_events`]).
//!
//! **The ledger.** The set of blocks the engine reported stored in its GPU cache and not since
//! removed: `BlockStored` adds its blocks, `BlockRemoved` takes them out, `AllBlocksCleared`
//! empties the set. Events of an offload tier (`medium` other than GPU) are counted, not held.
//! The set is *complete* — the pod's whole GPU prefix cache, not only what changed since the
//! gateway subscribed — when the first batch it read was its process's first (sequence 0), or
//! since a clear, and no batch was missed since. Missed batches (a sequence number skipped:
//! ZeroMQ PUB drops messages a slow subscriber cannot take) are counted and make the set
//! incomplete until the next clear or restart.
//!
//! **What it tells the fleet.** A batch whose sequence number is not above the last one read is
//! a new process (sequence numbers start at 0 with the engine and only grow): the pod restarted
//! and its cache is gone. A clear empties the cache without a restart (vLLM's
//! `/reset_prefix_cache`, an operator's or another tool's). Either is the `kv_events` evidence
//! of [`super::restart`]: the pod is re-warmed like a joining pod at its next health check,
//! even when its scrapes show nothing (vLLM with several API servers exports no start time).
//! A new process found by the first batch after the pod (re)joined is the one that join is
//! already warming (its scrape showed the restart first), not another restart. A (re)join the
//! events did not cause — its scrape showed a restart, or the pod came back from down — also
//! empties the set unless the ledger already started over since the last join (a new process
//! or a clear read): the blocks of the process before it are gone, and the set is incomplete
//! until the new process's first batch or a clear.
//!
//! **Bounds.** At most `max_blocks` hashes are held (4 × the pod's modelled capacity: the
//! engine holds at most its capacity); past it further stores are counted as dropped and the
//! set is incomplete. A batch is applied whole under the fleet's lock: its size is bounded by
//! core's decoder (16 MiB a payload).

use ahash::AHashSet as HashSet;
use serde::Serialize;

use prewarm_core::kv_events::{EngineBlock, KvEvent, KvEventBatch, Medium};

/// A pod's KV-event ledger (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct EngineBlocks {
    held: HashSet<EngineBlock>,
    last_seq: Option<i64>,
    complete: bool,
    counts: EngineBlockCounts,
    last_event_ms: Option<u64>,
    /// The pod (re)joined since the last batch: a new process in the next batch is that join's.
    rejoined: bool,
    /// A new process or a clear was read since the pod last (re)joined.
    started_over: bool,
}

/// What the ledger has read, for the admin API and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EngineBlockCounts {
    pub batches: u64,
    pub stored: u64,
    pub removed: u64,
    pub cleared: u64,
    /// Blocks stored or removed on an offload tier (not held).
    pub offloaded: u64,
    /// Batches skipped (sequence gaps).
    pub missed_batches: u64,
    /// Events of a kind this gateway does not know.
    pub unknown: u64,
    /// Stores not held because the set was full.
    pub dropped: u64,
    /// New processes seen (the sequence went back).
    pub restarts: u64,
}

/// What one batch told of the pod's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheChange {
    /// The engine kept its cache (blocks came and went).
    Kept,
    /// The engine dropped its whole cache (`AllBlocksCleared`).
    Cleared,
    /// A new engine process: the sequence went back.
    Restarted,
}

/// The ledger's view for the admin API.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineBlocksView {
    /// GPU blocks the engine reported and still holds.
    pub cached_blocks: usize,
    /// Whether `cached_blocks` is the engine's whole cache (see the module docs).
    pub complete: bool,
    pub last_seq: Option<i64>,
    pub last_event_ms: Option<u64>,
    #[serde(flatten)]
    pub counts: EngineBlockCounts,
}

impl EngineBlocks {
    /// Applies one batch with sequence number `seq`, read at `now_ms`; at most `max_blocks`
    /// hashes are held.
    pub fn apply(
        &mut self,
        seq: i64,
        batch: &KvEventBatch,
        max_blocks: usize,
        now_ms: u64,
    ) -> CacheChange {
        let mut change = CacheChange::Kept;
        match self.last_seq {
            None => self.complete = seq == 0,
            Some(last) if seq <= last => {
                self.held.clear();
                self.complete = seq == 0;
                self.counts.restarts += 1;
                self.started_over = true;
                if !self.rejoined {
                    change = CacheChange::Restarted;
                }
            }
            Some(last) if seq > last.saturating_add(1) => {
                // any two i64 numbers: the difference is taken without overflow
                self.counts.missed_batches = self
                    .counts
                    .missed_batches
                    .saturating_add(seq.abs_diff(last).saturating_sub(1));
                self.complete = false;
            }
            Some(_) => {}
        }
        self.rejoined = false;
        self.last_seq = Some(seq);
        self.last_event_ms = Some(now_ms);
        self.counts.batches += 1;
        for event in &batch.events {
            match event {
                KvEvent::Stored { blocks, medium, .. } => {
                    if *medium == Medium::Offloaded {
                        self.counts.offloaded += blocks.len() as u64;
                        continue;
                    }
                    self.counts.stored += blocks.len() as u64;
                    for &b in blocks {
                        if self.held.len() < max_blocks || self.held.contains(&b) {
                            self.held.insert(b);
                        } else {
                            self.counts.dropped += 1;
                            self.complete = false;
                        }
                    }
                }
                KvEvent::Removed { blocks, medium } => {
                    if *medium == Medium::Offloaded {
                        self.counts.offloaded += blocks.len() as u64;
                        continue;
                    }
                    self.counts.removed += blocks.len() as u64;
                    for b in blocks {
                        self.held.remove(b);
                    }
                }
                KvEvent::Cleared => {
                    self.held.clear();
                    self.complete = true;
                    self.started_over = true;
                    self.counts.cleared += 1;
                    if change == CacheChange::Kept {
                        change = CacheChange::Cleared;
                    }
                }
                KvEvent::Unknown => self.counts.unknown += 1,
            }
        }
        change
    }

    /// The pod (re)joined (its own evidence, or back from down): a new process in the next
    /// batch is the one that join found.
    pub fn note_rejoin(&mut self) {
        self.rejoined = true;
        if !std::mem::take(&mut self.started_over) && self.last_seq.is_some() {
            self.held.clear();
            self.complete = false;
        }
    }

    /// The sequence number the next batch should carry (`None` before the first).
    pub fn next_seq(&self) -> Option<i64> {
        self.last_seq.map(|s| s.saturating_add(1))
    }

    /// Whether the engine reported `block` stored and not since removed.
    #[cfg(test)]
    pub fn holds(&self, block: EngineBlock) -> bool {
        self.held.contains(&block)
    }

    pub fn counts(&self) -> EngineBlockCounts {
        self.counts
    }

    /// `None` before the first batch.
    pub fn view(&self) -> Option<EngineBlocksView> {
        self.last_seq.map(|_| EngineBlocksView {
            cached_blocks: self.held.len(),
            complete: self.complete,
            last_seq: self.last_seq,
            last_event_ms: self.last_event_ms,
            counts: self.counts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(events: Vec<KvEvent>) -> KvEventBatch {
        KvEventBatch {
            ts: 0.0,
            events,
            data_parallel_rank: None,
        }
    }

    fn stored(blocks: &[u64], medium: Medium) -> KvEvent {
        KvEvent::Stored {
            blocks: blocks.to_vec(),
            parent: None,
            token_ids: vec![],
            block_size: 16,
            lora_id: None,
            medium,
        }
    }

    fn removed(blocks: &[u64]) -> KvEvent {
        KvEvent::Removed {
            blocks: blocks.to_vec(),
            medium: Medium::Gpu,
        }
    }

    #[test]
    fn the_ledger_holds_what_was_stored_and_not_removed_on_the_gpu() {
        let mut l = EngineBlocks::default();
        assert_eq!(l.view(), None);
        let c = l.apply(
            0,
            &batch(vec![
                stored(&[1, 2, 3], Medium::Gpu),
                stored(&[7], Medium::Offloaded),
                removed(&[2]),
            ]),
            100,
            5,
        );
        assert_eq!(c, CacheChange::Kept);
        assert!(l.holds(1) && l.holds(3) && !l.holds(2) && !l.holds(7));
        let v = l.view().unwrap();
        assert_eq!((v.cached_blocks, v.complete), (2, true));
        assert_eq!(
            (v.counts.stored, v.counts.removed, v.counts.offloaded),
            (3, 1, 1)
        );
    }

    #[test]
    fn a_ledger_that_starts_late_or_misses_a_batch_is_incomplete_until_a_clear() {
        let mut l = EngineBlocks::default();
        l.apply(5, &batch(vec![stored(&[1], Medium::Gpu)]), 100, 0);
        assert!(
            !l.view().unwrap().complete,
            "joined at 5: blocks before are unknown"
        );
        let mut l = EngineBlocks::default();
        l.apply(0, &batch(vec![stored(&[1], Medium::Gpu)]), 100, 0);
        l.apply(3, &batch(vec![stored(&[2], Medium::Gpu)]), 100, 0);
        let v = l.view().unwrap();
        assert_eq!((v.complete, v.counts.missed_batches), (false, 2));
        assert_eq!(
            l.apply(
                4,
                &batch(vec![KvEvent::Cleared, stored(&[9], Medium::Gpu)]),
                100,
                0
            ),
            CacheChange::Cleared
        );
        let v = l.view().unwrap();
        assert_eq!((v.complete, v.cached_blocks), (true, 1));
    }

    #[test]
    fn a_sequence_that_goes_back_is_a_new_process_with_an_empty_cache() {
        let mut l = EngineBlocks::default();
        l.apply(0, &batch(vec![stored(&[1, 2], Medium::Gpu)]), 100, 0);
        l.apply(1, &batch(vec![stored(&[3], Medium::Gpu)]), 100, 0);
        assert_eq!(
            l.apply(0, &batch(vec![stored(&[4], Medium::Gpu)]), 100, 0),
            CacheChange::Restarted
        );
        assert!(!l.holds(1) && l.holds(4));
        let v = l.view().unwrap();
        assert_eq!(
            (v.complete, v.counts.restarts, v.cached_blocks),
            (true, 1, 1)
        );
    }

    #[test]
    fn a_new_process_the_pods_rejoin_already_found_is_not_another_restart() {
        let mut l = EngineBlocks::default();
        l.apply(0, &batch(vec![stored(&[1], Medium::Gpu)]), 100, 0);
        l.apply(1, &batch(vec![stored(&[2], Medium::Gpu)]), 100, 0);
        l.note_rejoin();
        let first = l.apply(0, &batch(vec![stored(&[3], Medium::Gpu)]), 100, 0);
        assert_eq!(first, CacheChange::Kept);
        assert!(
            !l.holds(1) && l.holds(3),
            "the old process's blocks are gone"
        );
        assert!(l.view().unwrap().complete);
        // a rejoin of the same process (a network blip) expects nothing after its next batch
        l.note_rejoin();
        l.apply(1, &batch(vec![]), 100, 0);
        assert_eq!(l.apply(0, &batch(vec![]), 100, 0), CacheChange::Restarted);
    }

    #[test]
    fn a_rejoin_the_events_did_not_show_forgets_the_blocks_of_the_process_before() {
        let mut l = EngineBlocks::default();
        l.apply(0, &batch(vec![stored(&[1, 2], Medium::Gpu)]), 100, 0);
        // the scrape showed a restart; the new process published more batches than the old
        // one before the gateway read it again, so its numbers look like a gap
        l.note_rejoin();
        assert!(!l.holds(1));
        l.apply(7, &batch(vec![stored(&[9], Medium::Gpu)]), 100, 0);
        let v = l.view().unwrap();
        assert_eq!((v.cached_blocks, v.complete), (1, false), "{v:?}");
        // a rejoin the events caused keeps what they read since
        l.apply(
            8,
            &batch(vec![KvEvent::Cleared, stored(&[4], Medium::Gpu)]),
            100,
            0,
        );
        l.note_rejoin();
        let v = l.view().unwrap();
        assert_eq!((v.cached_blocks, v.complete), (1, true), "{v:?}");
    }

    #[test]
    fn sequence_numbers_at_the_ends_of_the_range_are_counted_without_overflow() {
        let mut l = EngineBlocks::default();
        l.apply(i64::MIN, &batch(vec![]), 100, 0);
        l.apply(i64::MAX, &batch(vec![]), 100, 0);
        assert_eq!(l.view().unwrap().counts.missed_batches, u64::MAX - 1);
        assert_eq!(
            l.apply(i64::MIN, &batch(vec![]), 100, 0),
            CacheChange::Restarted
        );
        assert_eq!(l.next_seq(), Some(i64::MIN + 1));
    }

    #[test]
    fn the_set_never_grows_past_its_bound() {
        let mut l = EngineBlocks::default();
        l.apply(0, &batch(vec![stored(&[1, 2, 3, 4], Medium::Gpu)]), 3, 0);
        let v = l.view().unwrap();
        assert_eq!(
            (v.cached_blocks, v.counts.dropped, v.complete),
            (3, 1, false)
        );
        // a block already held is no new entry
        l.apply(1, &batch(vec![stored(&[1], Medium::Gpu)]), 3, 0);
        assert_eq!(l.view().unwrap().counts.dropped, 1);
    }
}
