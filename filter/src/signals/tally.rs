//! Per-VM tallies that keep shared-data writes off the request path: requests per adapter,
//! adopted uses and successful answers per hot prefix are counted locally and folded into shared data once per tick
//! (see `observe::fold_tally`). Bounded: beyond [`MAX_ENTRIES`] distinct keys a tick, new keys
//! are not counted (`prewarm_filter_tally_overflow_total`). VM-local, so a VM reload loses at most one tick.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use prewarm_core::BlockHash;

/// Most distinct adapters, and most distinct prefixes, tallied between two ticks.
pub const MAX_ENTRIES: usize = 4096;

/// Requests of one adapter since the last tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterTally {
    pub tenant: Option<String>,
    pub requests: u32,
}

#[derive(Debug, Default)]
pub struct Tally {
    adapters: RefCell<HashMap<String, AdapterTally>>,
    adopted: RefCell<HashMap<(String, BlockHash), u32>>,
    succeeded: RefCell<HashMap<(String, BlockHash), u32>>,
}

/// What was tallied since the last tick, in key order: a tick's signals come out in one order
/// whatever order the requests came in (a pool or a LoRA model fed the same signals in another
/// order can break ties otherwise; the evaluator's runs differed so).
#[derive(Debug, Default)]
pub struct Tallied {
    pub adapters: BTreeMap<String, AdapterTally>,
    pub adopted: BTreeMap<(String, BlockHash), u32>,
    /// Successful, untruncated answers to requests that used a hot prefix.
    pub succeeded: BTreeMap<(String, BlockHash), u32>,
}

impl Tally {
    /// Counts a request for `adapter`; false when the tally is full.
    pub fn adapter_request(&self, adapter: &str, tenant: Option<&str>) -> bool {
        let mut adapters = self.adapters.borrow_mut();
        if let Some(t) = adapters.get_mut(adapter) {
            t.requests = t.requests.saturating_add(1);
            return true;
        }
        if adapters.len() >= MAX_ENTRIES {
            return false;
        }
        adapters.insert(
            adapter.to_string(),
            AdapterTally {
                tenant: tenant.map(str::to_string),
                requests: 1,
            },
        );
        true
    }

    /// Counts a request that used the hot prefix ending in `prefix`; false when full.
    pub fn adopted(&self, model: &str, prefix: BlockHash) -> bool {
        count_prefix(&self.adopted, model, prefix)
    }

    /// Counts a successful answer to a request that used `prefix`; false when full.
    pub fn succeeded(&self, model: &str, prefix: BlockHash) -> bool {
        count_prefix(&self.succeeded, model, prefix)
    }

    /// Everything tallied, leaving the tally empty.
    pub fn take(&self) -> Tallied {
        Tallied {
            adapters: std::mem::take(&mut *self.adapters.borrow_mut())
                .into_iter()
                .collect(),
            adopted: std::mem::take(&mut *self.adopted.borrow_mut())
                .into_iter()
                .collect(),
            succeeded: std::mem::take(&mut *self.succeeded.borrow_mut())
                .into_iter()
                .collect(),
        }
    }
}

fn count_prefix(
    map: &RefCell<HashMap<(String, BlockHash), u32>>,
    model: &str,
    prefix: BlockHash,
) -> bool {
    let mut map = map.borrow_mut();
    let key = (model.to_string(), prefix);
    if let Some(n) = map.get_mut(&key) {
        *n = n.saturating_add(1);
        return true;
    }
    if map.len() >= MAX_ENTRIES {
        return false;
    }
    map.insert(key, 1);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticks_tallies_come_out_in_key_order_whatever_the_requests_order() {
        let t = Tally::default();
        for i in (0..64u64).rev() {
            t.adapter_request(&format!("lora-{i:02}"), None);
            t.adopted("m", BlockHash(i * 7919 % 64));
            t.succeeded("m", BlockHash(i));
        }
        let tallied = t.take();
        let adapters: Vec<&String> = tallied.adapters.keys().collect();
        let mut sorted = adapters.clone();
        sorted.sort();
        assert_eq!(adapters, sorted);
        let adopted: Vec<u64> = tallied.adopted.keys().map(|(_, b)| b.0).collect();
        assert_eq!(adopted, (0..64).collect::<Vec<u64>>());
        assert_eq!(tallied.succeeded.len(), 64);
    }

    #[test]
    fn counts_and_bounds() {
        let t = Tally::default();
        assert!(t.adapter_request("a", Some("x")));
        assert!(t.adapter_request("a", None));
        assert!(t.adopted("m", BlockHash(1)));
        for i in 0..MAX_ENTRIES {
            t.adopted("m", BlockHash(i as u64 + 2));
        }
        assert!(!t.adopted("m", BlockHash(u64::MAX)));
        assert!(
            t.adopted("m", BlockHash(1)),
            "a known key still counts when full"
        );
        let taken = t.take();
        assert_eq!(taken.adapters["a"].requests, 2);
        assert_eq!(taken.adapters["a"].tenant.as_deref(), Some("x"));
        assert_eq!(taken.adopted[&("m".to_string(), BlockHash(1))], 2);
        assert!(t.take().adopted.is_empty());
    }
}
