//! The prefix index in Envoy's shared data: core's [`PrefixStore`] over one key per slot
//! (`<shared_prefix>px/<slot>`), so every worker of a proxy routes with the same index. Writes
//! are plain sets (newest wins, as the index wants; no compare-and-swap), reads are gets; a
//! missing or unreadable value is a miss, and every refused write is counted in
//! `prewarm_filter_prefix_write_failures_total`. Memory: `prefix_slots` × 26 bytes of values plus Envoy's
//! per-key overhead, per proxy. A table the root adopts seeds the index with its placed
//! prefixes ([`seed_from_table`], core's `prefix::seed`).

use prewarm_core::prefix::{seed, PrefixStore, ENTRY_BYTES};
use prewarm_core::wire::RoutingTable;

use crate::host::{Host, Metric};
use crate::shared::Keys;
use crate::worker::Worker;

/// Writes `table`'s placed prefixes into the index (refused writes counted).
pub fn seed_from_table<H: Host + ?Sized>(host: &H, worker: &Worker, table: &RoutingTable) {
    if table.prefixes.is_empty() {
        return;
    }
    let config = &worker.config;
    let mut store = SharedPrefixStore::new(host, &worker.keys, config.prefix_slots);
    let refused = seed(
        &mut store,
        &table.prefixes,
        host.now_ms(),
        config.prefix_horizon_ms,
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
}

impl<'a, H: Host + ?Sized> SharedPrefixStore<'a, H> {
    pub fn new(host: &'a H, keys: &'a Keys, slots: u32) -> Self {
        Self {
            host,
            keys,
            slots: slots.max(1),
        }
    }
}

impl<H: Host + ?Sized> PrefixStore for SharedPrefixStore<'_, H> {
    fn slots(&self) -> u32 {
        self.slots
    }

    fn read(&self, slot: u32) -> Option<Vec<u8>> {
        self.host.shared_get(&self.keys.prefix_slot(slot)).0
    }

    fn write(&mut self, slot: u32, entry: &[u8; ENTRY_BYTES]) -> bool {
        self.host
            .shared_set(&self.keys.prefix_slot(slot), entry, None)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_host::FakeHost;
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
