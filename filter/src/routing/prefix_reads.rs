//! The prefix index's slots as this VM read them since its last root tick, so the requests of
//! one tick that probe the same slots (a hot prefix: an application's system prompt, one
//! conversation's turns, the shards every prompt of a template shares) read each from shared
//! data once per tick instead of once per request. Every read of shared data is a host call that
//! takes Envoy's process-wide lock and copies the value into the VM.
//!
//! What it changes: this VM sees another worker's index writes at its own next tick after they
//! land (they land at the writer's tick), so within two ticks instead of one; its own writes it
//! sees at once, as before (they are folded over what it read, `prefix_pending`, or written
//! through a store that updates what is kept here). The index tolerates the lag already: a
//! request whose prefix another worker just sent somewhere routes as a new prompt, by the
//! placement. Bounded ([`MAX_KEPT_SLOTS`]); past the bound slots are read as before.

use std::cell::RefCell;
use std::collections::HashMap;

/// Slots kept between ticks at most (each value is an index entry, 74 bytes, or none).
pub const MAX_KEPT_SLOTS: usize = 4_096;

/// This VM's reads of the prefix index since its last tick.
#[derive(Debug, Default)]
pub struct PrefixReads {
    slots: RefCell<HashMap<u32, Option<Vec<u8>>>>,
}

impl PrefixReads {
    /// `slot` as this VM last read or wrote it this tick, if it did.
    pub fn get(&self, slot: u32) -> Option<Option<Vec<u8>>> {
        self.slots.borrow().get(&slot).cloned()
    }

    /// Keeps what `slot` holds (none: nothing), while there is room or it is kept already.
    pub fn keep(&self, slot: u32, value: Option<Vec<u8>>) {
        let mut slots = self.slots.borrow_mut();
        if slots.len() < MAX_KEPT_SLOTS || slots.contains_key(&slot) {
            slots.insert(slot, value);
        }
    }

    /// Forgets `slot` (a write of it was refused: what shared data holds is not known).
    pub fn forget(&self, slot: u32) {
        self.slots.borrow_mut().remove(&slot);
    }

    /// Forgets everything: the root tick, after this VM's pending writes reached shared data.
    pub fn clear(&self) {
        self.slots.borrow_mut().clear();
    }

    /// Slots kept.
    pub fn len(&self) -> usize {
        self.slots.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_keeps_at_most_its_bound_but_updates_what_it_keeps() {
        let reads = PrefixReads::default();
        for slot in 0..MAX_KEPT_SLOTS as u32 + 10 {
            reads.keep(slot, None);
        }
        assert_eq!(reads.len(), MAX_KEPT_SLOTS);
        assert_eq!(reads.get(MAX_KEPT_SLOTS as u32 + 1), None, "past the bound");
        reads.keep(3, Some(vec![1]));
        assert_eq!(reads.get(3), Some(Some(vec![1])));
        reads.forget(3);
        assert_eq!(reads.get(3), None);
        reads.clear();
        assert!(reads.is_empty());
    }
}
