//! The prefix-index writes of this VM's routed requests, applied to shared data on the root
//! tick instead of on the request path. A routed prompt writes up to 64 shard keys and 7 block
//! keys, each a read and a write of its own slot: on the request path that was up to ~140 host
//! calls (each takes Envoy's process-wide shared-data lock), growing with the prompt. Here a
//! request only appends its keys to a VM-local list (no host call); the tick folds them into
//! each touched slot with core's [`recorded_entry`], in request order, and writes a slot only
//! when its bytes changed — what core's `record` would have stored had each request written
//! its keys itself, one get and at most one set per slot per tick.
//!
//! A write the slot's previous pending write already covers is not kept
//! ([`PendingPrefixWrites::push`]), so a hot prefix costs its keys once per tick, not once per
//! request.
//!
//! This VM reads its own pending writes at once (`SharedPrefixStore` folds them over what it
//! reads); other workers see them within a tick. The list is bounded
//! ([`MAX_PENDING_WRITES`]): when it is full, a request writes its keys itself as before.
//! A refused write at the tick is counted in `prewarm_filter_prefix_write_failures_total`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use prewarm_core::prefix::{pod_hash, recorded_entry, slot_of, PromptKeys, REFRESH_FRACTION};

use crate::host::{Host, Metric};
use crate::shared::Keys;

/// Most pending key writes a VM holds between ticks (each ~32 bytes: ≤ 128 KiB plus the map).
pub const MAX_PENDING_WRITES: usize = 4_096;

/// One key of a routed prompt, as `record` would write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingWrite {
    hash: u64,
    pod: u64,
    at_ms: u64,
    /// The prompt went on past this key.
    interior: bool,
}

/// This VM's pending prefix-index writes by slot, in request order within a slot.
#[derive(Debug, Default)]
pub struct PendingPrefixWrites {
    by_slot: RefCell<HashMap<u32, Vec<PendingWrite>>>,
    len: Cell<usize>,
}

impl PendingPrefixWrites {
    /// Queues a routed prompt's keys as sent to `pod_id` at `now_ms`, among `slots` slots,
    /// with the index's `horizon_ms`; false (nothing queued) when the list has no room for all
    /// of them.
    ///
    /// A write its slot's last pending write already covers (same key and pod, at least as
    /// interior, less than core's refresh interval earlier) is not kept: after that write,
    /// `record` would leave the entry alone. So a hot prefix holds one pending write per key,
    /// not one per request. (`record` measures the refresh interval from the entry's stored
    /// time, which may be older than that write: the entry's time then errs by up to two
    /// refresh intervals instead of one.)
    pub fn push(
        &self,
        keys: &PromptKeys,
        pod_id: &str,
        now_ms: u64,
        slots: u32,
        horizon_ms: u64,
    ) -> bool {
        let written = keys.written();
        let mut len = self.len.get();
        if len.saturating_add(written.len()) > MAX_PENDING_WRITES {
            return false;
        }
        let pod = pod_hash(pod_id);
        let refresh = horizon_ms / REFRESH_FRACTION;
        let last = written.len().saturating_sub(1);
        let mut by_slot = self.by_slot.borrow_mut();
        for (i, hash) in written.iter().enumerate() {
            let write = PendingWrite {
                hash: *hash,
                pod,
                at_ms: now_ms,
                interior: i < last,
            };
            let writes = by_slot.entry(slot_of(*hash, slots)).or_default();
            let covered = writes.last().is_some_and(|w| {
                w.hash == write.hash
                    && w.pod == write.pod
                    && (w.interior || !write.interior)
                    && write.at_ms.saturating_sub(w.at_ms) < refresh
            });
            if !covered {
                writes.push(write);
                len = len.saturating_add(1);
            }
        }
        self.len.set(len);
        true
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len.get() == 0
    }

    /// `slot`'s bytes once this VM's pending writes to it are applied over `stored`.
    pub fn fold(&self, slot: u32, stored: Option<Vec<u8>>, horizon_ms: u64) -> Option<Vec<u8>> {
        let by_slot = self.by_slot.borrow();
        match by_slot.get(&slot) {
            Some(writes) => apply(writes, stored, horizon_ms),
            None => stored,
        }
    }

    /// Applies every pending write to shared data (one get and at most one set per touched
    /// slot), refused writes counted; the list is empty afterwards.
    pub fn flush<H: Host + ?Sized>(&self, host: &H, keys: &Keys, horizon_ms: u64) {
        if self.is_empty() {
            return;
        }
        let by_slot = std::mem::take(&mut *self.by_slot.borrow_mut());
        self.len.set(0);
        let mut refused = 0u64;
        for (slot, writes) in by_slot {
            let key = keys.prefix_slot(slot);
            let (stored, _) = host.shared_get(&key);
            let new = apply(&writes, stored.clone(), horizon_ms);
            if new == stored {
                continue;
            }
            let ok = new
                .as_deref()
                .is_some_and(|bytes| host.shared_set(&key, bytes, None).is_ok());
            if !ok {
                refused = refused.saturating_add(1);
            }
        }
        if refused > 0 {
            host.count(Metric::PrefixWriteFailures, refused);
        }
    }
}

/// `writes` applied in order over `stored`, each as core's `record` applies one key.
fn apply(writes: &[PendingWrite], stored: Option<Vec<u8>>, horizon_ms: u64) -> Option<Vec<u8>> {
    writes.iter().fold(stored, |current, w| {
        match recorded_entry(
            current.as_deref(),
            w.hash,
            w.pod,
            w.interior,
            w.at_ms,
            horizon_ms,
        ) {
            Some(entry) => Some(entry.encode().to_vec()),
            None => current,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;
    use crate::routing::prefix_index::SharedPrefixStore;
    use prewarm_core::prefix::{record, MemoryStore, PrefixStore, DEFAULT_HORIZON_MS};
    use prewarm_core::{BlockChain, FingerprintConfig};

    fn prompt(text: &[u8]) -> PromptKeys {
        let fp = FingerprintConfig::default();
        PromptKeys::of(&BlockChain::of("m", text, &fp), &fp)
    }

    /// Requests routed one after another, applied at the tick, leave shared data as core's
    /// `record` leaves a store it writes at once — collisions, moves and refreshes included.
    #[test]
    fn a_flush_stores_what_recording_at_once_would_have() {
        let slots = 8; // few slots: keys of different prompts collide
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        let pending = PendingPrefixWrites::default();
        let mut direct = MemoryStore::new(slots);
        let a = prompt(&[b'a'; 9_000]);
        let b = prompt(&[b'b'; 3_000]);
        let horizon = DEFAULT_HORIZON_MS;
        let requests = [
            (&a, "pod-0", 1_000),
            (&b, "pod-1", 2_000),
            (&a, "pod-1", 3_000),
            (&a, "pod-2", 4_000),
            (&b, "pod-1", 5_000 + horizon / 8),
        ];
        for (i, (prompt, pod, now)) in requests.into_iter().enumerate() {
            record(&mut direct, prompt, pod, now, horizon);
            assert!(pending.push(prompt, pod, now, slots, horizon));
            // this VM reads its own pending writes at once
            let store = SharedPrefixStore::new(&host, &keys, slots).with_pending(&pending, horizon);
            for slot in 0..slots {
                assert_eq!(
                    store.read(slot),
                    direct.read(slot),
                    "request {i} slot {slot}"
                );
            }
            if i == 2 {
                pending.flush(&host, &keys, horizon);
                assert!(pending.is_empty());
            }
        }
        host.take_host_calls();
        pending.flush(&host, &keys, horizon);
        let calls = host.take_host_calls();
        assert!(calls.shared_get <= u64::from(slots), "{calls:?}");
        for slot in 0..slots {
            assert_eq!(
                host.shared_value(&keys.prefix_slot(slot)),
                direct.read(slot),
                "slot {slot}"
            );
        }
    }

    /// A hot prefix repeated within the refresh interval keeps one pending write per key.
    #[test]
    fn repeats_of_a_prefix_keep_one_pending_write_per_key() {
        let pending = PendingPrefixWrites::default();
        let p = prompt(&[b'h'; 20_000]);
        for at in 0..100 {
            assert!(pending.push(&p, "pod-0", 1_000 + at, 1 << 14, DEFAULT_HORIZON_MS));
        }
        assert_eq!(pending.len.get(), p.written().len());
        // another pod, or a refresh later, is a write of its own
        assert!(pending.push(&p, "pod-1", 2_000, 1 << 14, DEFAULT_HORIZON_MS));
        assert_eq!(pending.len.get(), 2 * p.written().len());
    }

    #[test]
    fn a_full_list_refuses_and_refused_writes_are_counted() {
        let pending = PendingPrefixWrites::default();
        let long = prompt(&[b'z'; 200_000]);
        let n = long.written().len();
        let mut pushed = 0;
        let mut at = 1;
        // each push a refresh interval later: nothing is covered by the last one
        while pending.push(&long, "pod-0", at, 1 << 14, DEFAULT_HORIZON_MS) {
            pushed += n;
            at += DEFAULT_HORIZON_MS;
        }
        assert!(pushed <= MAX_PENDING_WRITES && pushed + n > MAX_PENDING_WRITES);
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        host.fail_next_sets(2);
        pending.flush(&host, &keys, DEFAULT_HORIZON_MS);
        assert_eq!(host.metric(Metric::PrefixWriteFailures), 2);
        assert!(pending.is_empty());
    }
}
