//! A bounded multi-writer queue of byte records in shared data, whose append costs O(record)
//! whatever the queue holds: a ring of `slots` fixed keys plus two counters.
//!
//! | key | value |
//! |---|---|
//! | `<name>/tail` | next sequence number to write (8) |
//! | `<name>/head` | next sequence number to take (8) |
//! | `<name>/<seq % slots>` | the record's sequence number (8) + its bytes |
//!
//! A writer claims a sequence number with one compare-and-swap of `tail` (8 bytes) and writes its
//! slot (one set of its own bytes): it never reads or rewrites other records. A taker (the tick)
//! reads the slots from `head`, and moves `head` with a compare-and-swap, so two takers never
//! both take a record. Overflow needs no writer to look: when `tail - head` exceeds `slots`, the
//! oldest records were overwritten, and a slot whose sequence number is not the one expected
//! (overwritten, or claimed and not yet written) is skipped. The taker counts all of these as
//! dropped. Records are opaque bytes, so another record kind gets its own ring (its own `name`).

use crate::host::Host;
use crate::shared::{read_u64, update};

/// What a take returned.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Taken {
    /// Records, oldest first.
    pub records: Vec<Vec<u8>>,
    /// Records lost since the last take (overwritten, or not written in time).
    pub dropped: u64,
}

/// One ring in shared data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedRing {
    name: String,
    slots: u64,
}

impl SharedRing {
    /// The ring `name` (a shared-data key prefix) of `slots` records (at least 1).
    pub fn new(name: &str, slots: usize) -> Self {
        Self {
            name: name.to_string(),
            slots: u64::try_from(slots.max(1)).unwrap_or(u64::MAX),
        }
    }

    fn counter(&self, which: &str) -> String {
        format!("{}/{which}", self.name)
    }

    fn slot(&self, seq: u64) -> String {
        format!("{}/{}", self.name, seq % self.slots)
    }

    /// Every key the ring can use (bounded: `slots` + 2).
    pub fn keys(&self) -> impl Iterator<Item = String> + '_ {
        ["head", "tail"]
            .into_iter()
            .map(|c| self.counter(c))
            .chain((0..self.slots).map(|s| self.slot(s)))
    }

    /// The records it holds at most.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Appends a record; false when the claim lost every compare-and-swap (counted by `update`).
    pub fn push<H: Host + ?Sized>(&self, host: &H, record: &[u8], retries: u32) -> bool {
        self.push_all(host, std::slice::from_ref(&record), retries) == 1
    }

    /// Appends records in order, claiming their sequence numbers with one compare-and-swap of
    /// `tail`; returns how many were written (none when the claim lost every compare-and-swap,
    /// counted by `update`).
    pub fn push_all<H: Host + ?Sized, R: AsRef<[u8]>>(
        &self,
        host: &H,
        records: &[R],
        retries: u32,
    ) -> usize {
        if records.is_empty() {
            return 0;
        }
        let n = records.len() as u64;
        let first = update(host, &self.counter("tail"), retries, |bytes| {
            let seq = read_u64(bytes, 0).unwrap_or(0);
            (Some(seq.saturating_add(n).to_le_bytes().to_vec()), seq)
        });
        let Some(first) = first else {
            return 0;
        };
        let mut written = 0;
        for (seq, record) in (first..).zip(records) {
            let record = record.as_ref();
            let mut value = Vec::with_capacity(record.len().saturating_add(8));
            value.extend_from_slice(&seq.to_le_bytes());
            value.extend_from_slice(record);
            // the slot is this writer's until the ring wraps: no compare-and-swap needed
            if host.shared_set(&self.slot(seq), &value, None).is_ok() {
                written += 1;
            }
        }
        written
    }

    /// Takes the oldest records: at most `max` of them and, after the first, at most
    /// `max_bytes` of them in all (`cost` says what a record costs).
    pub fn take<H: Host + ?Sized>(
        &self,
        host: &H,
        max: usize,
        max_bytes: usize,
        cost: impl Fn(&[u8]) -> usize,
    ) -> Taken {
        let (head_bytes, head_cas) = host.shared_get(&self.counter("head"));
        let (tail_bytes, _) = host.shared_get(&self.counter("tail"));
        let head = head_bytes
            .as_deref()
            .and_then(|b| read_u64(b, 0))
            .unwrap_or(0);
        let tail = tail_bytes
            .as_deref()
            .and_then(|b| read_u64(b, 0))
            .unwrap_or(0);
        if tail <= head {
            return Taken::default();
        }
        let oldest_kept = tail.saturating_sub(self.slots).max(head);
        let mut taken = Taken {
            records: Vec::new(),
            dropped: oldest_kept.saturating_sub(head),
        };
        let mut bytes = 0usize;
        let mut next = oldest_kept;
        while next < tail && taken.records.len() < max {
            let (value, _) = host.shared_get(&self.slot(next));
            let value = value.unwrap_or_default();
            if value.get(..8).and_then(|s| read_u64(s, 0)) != Some(next) {
                taken.dropped = taken.dropped.saturating_add(1);
                next = next.saturating_add(1);
                continue;
            }
            let record = value.get(8..).unwrap_or_default();
            let c = cost(record);
            if !taken.records.is_empty() && bytes.saturating_add(c) > max_bytes {
                break;
            }
            bytes = bytes.saturating_add(c);
            taken.records.push(record.to_vec());
            next = next.saturating_add(1);
        }
        // another taker moved head since we read it: it has these records, we give ours up
        if host
            .shared_set(&self.counter("head"), &next.to_le_bytes(), head_cas)
            .is_err()
        {
            return Taken::default();
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    fn ring() -> SharedRing {
        SharedRing::new("q", 4)
    }

    fn all(h: &FakeHost, r: &SharedRing) -> Taken {
        r.take(h, 100, usize::MAX, <[u8]>::len)
    }

    #[test]
    fn records_come_out_in_order_once() {
        let h = FakeHost::new();
        let r = ring();
        for rec in [b"a", b"b", b"c"] {
            assert!(r.push(&h, rec, 4));
        }
        let t = r.take(&h, 2, usize::MAX, <[u8]>::len);
        assert_eq!(t.records, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(all(&h, &r).records, vec![b"c".to_vec()]);
        assert_eq!(all(&h, &r), Taken::default());
    }

    #[test]
    fn overflow_keeps_the_newest_and_counts_the_rest() {
        let h = FakeHost::new();
        let r = ring();
        for i in 0..7u8 {
            r.push(&h, &[i], 4);
        }
        let t = all(&h, &r);
        assert_eq!(t.dropped, 3);
        assert_eq!(t.records, vec![vec![3], vec![4], vec![5], vec![6]]);
        assert!(h.shared_keys().iter().all(|k| r.keys().any(|rk| &rk == k)));
    }

    #[test]
    fn the_byte_budget_cuts_a_take_but_never_below_one_record() {
        let h = FakeHost::new();
        let r = ring();
        for rec in [&[1u8; 10][..], &[2; 10], &[3; 10]] {
            r.push(&h, rec, 4);
        }
        assert_eq!(r.take(&h, 10, 25, <[u8]>::len).records.len(), 2);
        assert_eq!(r.take(&h, 10, 5, <[u8]>::len).records.len(), 1);
    }

    #[test]
    fn a_claimed_slot_not_written_is_dropped_not_waited_for() {
        let h = FakeHost::new();
        let r = ring();
        r.push(&h, b"a", 4);
        // a writer on another worker claimed seq 1 and has not written it yet
        h.shared_set("q/tail", &2u64.to_le_bytes(), None).unwrap();
        r.push(&h, b"c", 4);
        let t = all(&h, &r);
        assert_eq!(t.records, vec![b"a".to_vec(), b"c".to_vec()]);
        assert_eq!(t.dropped, 1);
    }

    #[test]
    fn a_push_reads_and_writes_only_its_own_record() {
        let h = FakeHost::new();
        let r = SharedRing::new("q", 256);
        for _ in 0..300 {
            r.push(&h, &[7u8; 1000], 4);
        }
        h.reset_shared_traffic();
        r.push(&h, &[7u8; 1000], 4);
        let (read, written) = h.shared_traffic();
        assert!(read <= 8, "read {read} bytes");
        assert!(written <= 8 + 8 + 1000, "wrote {written} bytes");
    }
}
