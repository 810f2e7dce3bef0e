//! The prefix index in Envoy's shared data: core's [`PrefixStore`] over one key per slot
//! (`<shared_prefix>px/<slot>`), so every worker of a proxy routes with the same index. Writes
//! are plain sets (newest wins, as the index wants; no compare-and-swap), reads are gets; a
//! missing or unreadable value is a miss, and every refused write is counted in
//! `prewarm_filter_prefix_write_failures_total`. Memory: `prefix_slots` × 74 bytes of values plus Envoy's
//! per-key overhead, per proxy. A table the root adopts seeds the index with its placed
//! prefixes ([`seed_from_table`], core's `prefix::seed`).
//!
//! A routed request's own writes do not go through here at once: they wait in the VM's
//! [`PendingPrefixWrites`] for the root tick, and a store made [`SharedPrefixStore::with_pending`]
//! reads them folded over shared data. A store also keeps what it read (a request's lookups
//! probe some keys twice), so it lives for one request or one tick; one made
//! [`SharedPrefixStore::with_reads`] also reads and updates the VM's reads of this tick
//! ([`PrefixReads`]), so a slot is read from shared data once a tick.

use prewarm_core::prefix::{seed, PrefixStore, ENTRY_BYTES};
use prewarm_core::wire::RoutingTable;

use std::cell::RefCell;

use crate::host::{Host, Metric};
use crate::routing::prefix_pending::PendingPrefixWrites;
use crate::routing::prefix_reads::PrefixReads;
use crate::shared::Keys;
use crate::worker::Worker;

/// Writes `table`'s placed prefixes into the index (refused writes counted).
pub fn seed_from_table<H: Host + ?Sized>(host: &H, worker: &Worker, table: &RoutingTable) {
    if table.prefixes.is_empty() {
        return;
    }
    let config = &worker.config;
    let mut store = SharedPrefixStore::new(host, &worker.keys, config.shared_data.prefix_slots)
        .with_reads(&worker.prefix_reads);
    let refused = seed(
        &mut store,
        &table.prefixes,
        host.now_ms(),
        config.shared_data.prefix_horizon_ms,
    );
    if refused > 0 {
        host.count(Metric::PrefixWriteFailures, refused);
    }
}

/// The slots of one configured prefix, read and written through `host`.
pub struct SharedPrefixStore<'a, H: Host + ?Sized> {
    host: &'a H,
    keys: &'a Keys,
    slots: u32,
    /// This VM's writes not yet in shared data, and the horizon they are folded with.
    pending: Option<(&'a PendingPrefixWrites, u64)>,
    /// Slots read (or written) through this store, as shared data gave them.
    seen: RefCell<Vec<(u32, Option<Vec<u8>>)>>,
    /// The VM's reads of this tick, read and kept up to date through this store.
    reads: Option<&'a PrefixReads>,
}

impl<'a, H: Host + ?Sized> SharedPrefixStore<'a, H> {
    pub fn new(host: &'a H, keys: &'a Keys, slots: u32) -> Self {
        Self {
            host,
            keys,
            slots: slots.max(1),
            pending: None,
            seen: RefCell::new(Vec::new()),
            reads: None,
        }
    }

    /// Reads slots through the VM's reads of this tick, and keeps what it reads and writes there.
    pub fn with_reads(mut self, reads: &'a PrefixReads) -> Self {
        self.reads = Some(reads);
        self
    }

    /// Reads this VM's pending writes folded over shared data (with `horizon_ms`).
    pub fn with_pending(mut self, pending: &'a PendingPrefixWrites, horizon_ms: u64) -> Self {
        self.pending = Some((pending, horizon_ms));
        self
    }

    /// `slot` as shared data holds it, read at most once through this store.
    fn stored(&self, slot: u32) -> Option<Vec<u8>> {
        if let Some((_, bytes)) = self.seen.borrow().iter().find(|(s, _)| *s == slot) {
            return bytes.clone();
        }
        let kept = self.reads.and_then(|r| r.get(slot));
        let bytes = match kept {
            Some(bytes) => bytes,
            None => {
                let bytes = self.host.shared_get(&self.keys.prefix_slot(slot)).0;
                if let Some(reads) = self.reads {
                    reads.keep(slot, bytes.clone());
                }
                bytes
            }
        };
        self.seen.borrow_mut().push((slot, bytes.clone()));
        bytes
    }
}

impl<H: Host + ?Sized> PrefixStore for SharedPrefixStore<'_, H> {
    fn slots(&self) -> u32 {
        self.slots
    }

    fn read(&self, slot: u32) -> Option<Vec<u8>> {
        let stored = self.stored(slot);
        match self.pending {
            Some((pending, horizon_ms)) => pending.fold(slot, stored, horizon_ms),
            None => stored,
        }
    }

    fn write(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> bool {
        let ok = self
            .host
            .shared_set(&self.keys.prefix_slot(slot), entry, None)
            .is_ok();
        let mut seen = self.seen.borrow_mut();
        seen.retain(|(s, _)| *s != slot);
        if ok {
            seen.push((slot, Some(entry.to_vec())));
        }
        if let Some(reads) = self.reads {
            if ok {
                reads.keep(slot, Some(entry.to_vec()));
            } else {
                reads.forget(slot);
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use prewarm_core::prefix::{record, PromptKeys};
    use prewarm_core::{BlockChain, FingerprintConfig};

    #[test]
    fn writes_one_key_per_slot_and_counts_refusals() {
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        let fp = FingerprintConfig::default();
        let prompt = PromptKeys::of(&BlockChain::of("m", &[b'a'; 5_000], &fp), &fp);
        let mut store = SharedPrefixStore::new(&host, &keys, 8);
        assert_eq!(record(&mut store, &prompt, "pod-0", 1, 10), 0);
        let written = prompt.written();
        let slot = prewarm_core::prefix::slot_of(written[0], 8);
        assert_eq!(
            host.shared_value(&format!("p/px/{slot}")).map(|v| v.len()),
            Some(ENTRY_BYTES)
        );
        host.fail_next_sets(2);
        assert_eq!(record(&mut store, &prompt, "pod-0", 2, 10), 2);
    }
}
