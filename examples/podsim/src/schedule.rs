//! When an admitted request starts: the running batch as the scheduler will see it.
//!
//! Requests start in admission order (FIFO), each at the earliest time at or after its arrival
//! and the previous start at which the batch has fewer than `max_num_seqs` requests and, for an
//! adapter request, its adapter is already in the batch or the batch holds fewer than
//! `max_loras` distinct adapters (pinned adapters count as held). Output lengths are known at
//! admission, so every finish time is known and the start can be computed at once; the batch
//! only shrinks between starts, so the search walks finish times in order.
//!
//! vLLM skips a LoRA-blocked request and starts later ones whose adapter fits; podsim keeps
//! FIFO order, so a blocked request also holds back those behind it (documented in docs/podsim.md).

use std::collections::{BTreeMap, HashMap};

/// Model time in whole microseconds, for ordering.
pub fn micros(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e6).round() as u64
    } else {
        0
    }
}

/// The committed batch from the latest start on.
#[derive(Debug, Clone, Default)]
pub struct BatchSchedule {
    last_start: f64,
    /// (finish µs, request id) → adapter.
    live: BTreeMap<(u64, u64), Option<String>>,
    adapters: HashMap<String, usize>,
}

impl BatchSchedule {
    /// The earliest start for a request arriving at `arrival` for `adapter`, retiring requests
    /// finished by then. `pinned` are adapters that occupy a slot regardless.
    pub fn earliest_start(
        &mut self,
        arrival: f64,
        adapter: Option<&str>,
        max_num_seqs: usize,
        max_loras: usize,
        pinned: &[&str],
    ) -> f64 {
        let mut t = arrival.max(self.last_start);
        self.retire(t);
        loop {
            let seq_ok = self.live.len() < max_num_seqs;
            let lora_ok = match adapter {
                None => true,
                Some(a) => {
                    let pinned_idle = pinned
                        .iter()
                        .filter(|p| **p != a && !self.adapters.contains_key(**p))
                        .count();
                    self.adapters.contains_key(a) || self.adapters.len() + pinned_idle < max_loras
                }
            };
            if seq_ok && lora_ok {
                return t;
            }
            let Some((&(finish, _), _)) = self.live.first_key_value() else {
                return t;
            };
            t = t.max(finish as f64 / 1e6);
            self.retire(t);
        }
    }

    fn retire(&mut self, t: f64) {
        let now = micros(t);
        while let Some(entry) = self.live.first_entry() {
            if entry.key().0 > now {
                break;
            }
            if let Some(a) = entry.remove() {
                self.release_adapter(&a);
            }
        }
    }

    fn release_adapter(&mut self, a: &str) {
        if let Some(n) = self.adapters.get_mut(a) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.adapters.remove(a);
            }
        }
    }

    /// Adapters of the batch at the latest start, with their request counts.
    pub fn busy_adapters(&self) -> &HashMap<String, usize> {
        &self.adapters
    }

    /// Commits a request that starts at `start` and finishes at `finish`.
    pub fn commit(&mut self, id: u64, start: f64, finish: f64, adapter: Option<String>) {
        self.last_start = self.last_start.max(start);
        if let Some(a) = &adapter {
            *self.adapters.entry(a.clone()).or_default() += 1;
        }
        self.live.insert((micros(finish), id), adapter);
    }

    /// Withdraws a request (an abort) so it no longer holds its place.
    pub fn withdraw(&mut self, id: u64, finish: f64) {
        if let Some(Some(a)) = self.live.remove(&(micros(finish), id)) {
            self.release_adapter(&a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_sequence_slot() {
        let mut s = BatchSchedule::default();
        s.commit(1, 0.0, 2.0, None);
        s.commit(2, 0.0, 1.0, None);
        assert_eq!(s.earliest_start(0.5, None, 2, 1, &[]), 1.0);
        s.commit(3, 1.0, 5.0, None);
        // FIFO: no start before the previous one.
        assert_eq!(s.earliest_start(0.7, None, 3, 1, &[]), 1.0);
    }

    #[test]
    fn waits_for_a_lora_slot_unless_its_adapter_is_running() {
        let mut s = BatchSchedule::default();
        s.commit(1, 0.0, 3.0, Some("a".into()));
        assert_eq!(s.earliest_start(1.0, Some("a"), 8, 1, &[]), 1.0);
        assert_eq!(s.earliest_start(1.0, Some("b"), 8, 1, &[]), 3.0);
        assert_eq!(s.earliest_start(3.0, None, 8, 1, &[]), 3.0);
        assert_eq!(s.earliest_start(3.0, Some("c"), 8, 1, &["p"]), 3.0);
        assert_eq!(s.earliest_start(3.0, Some("c"), 8, 2, &["p"]), 3.0);
    }
}
