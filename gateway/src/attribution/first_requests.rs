//! A new pod's first requests of hot prefixes: the requests a warm-up is for.
//!
//! A warm-up prefills, on a joining pod, the prefixes the filters found hot; what it can change
//! is the time to first byte of the pod's *first* request of each of them — every later request
//! of a prefix finds it cached whether a warm-up put it there or the first request did. Over all
//! of a new pod's requests that effect is diluted by the many that are alike in every arm (on the
//! shared trace with three pods joining three, ~30 first requests of hot prefixes among ~180
//! new-pod requests an arm, docs/benchmarks.md), so the report also compares this cohort alone.
//!
//! **The rule.** Every outcome record carries its prompt's routing key (`OutcomeRecord::prefix`,
//! core's `BlockChain::routing_key`, computed alike in every arm whatever the arm routes by).
//! The gateway counts the records of each prefix, from every arm, pod and the time before an
//! experiment. A record served by a new pod is a *first request of a hot prefix* when the pod had
//! served no earlier record of its prefix and its prefix had been seen at least [`HOT_AFTER`]
//! times before it: a repeated prefix, the least the filters' `similar_prompts` trigger can be
//! set to before it signals one hot (its default is 3, the demo's 2). With a higher trigger the
//! cohort also holds prefixes no warm-up was asked for, which dilutes the arms' difference and
//! never inflates it. Membership is decided by what happened before the request, never by its
//! outcome, alike for every arm.
//!
//! **Assumes** records arrive about in the order the requests were made (a filter sends its
//! batch each second, so a record may come a second or two after a later one of another filter):
//! a first request whose record arrives after a second one's of the same pod and prefix is not
//! counted and the second is. A pod's first requests are counted from its first join in the
//! gateway's life; a pod that rejoins under the same id starts with what it served before.
//!
//! **Bounds.** [`MAX_PREFIXES`] prefixes counted: when full, the prefixes seen once are
//! forgotten first, and if none is, new prefixes are not counted. [`MAX_SERVED`] (pod, prefix)
//! pairs of new pods: when full, no further first request is counted. Both go into the snapshot
//! with the ledger (~2 MB at the bounds).

use std::collections::{HashMap, HashSet};

use prewarm_core::BlockHash;
use serde::{Deserialize, Serialize};

/// Requests of a prefix before which it is hot: a repeated prefix (the least the filters'
/// `similar_prompts` trigger may be set to).
pub const HOT_AFTER: u32 = 2;
/// Prefixes counted at most.
pub const MAX_PREFIXES: usize = 65_536;
/// (new pod, prefix) pairs remembered at most.
pub const MAX_SERVED: usize = 65_536;

/// How often each prefix was seen, and which prefixes each new pod served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixHistory {
    /// Records seen of each prefix, counted up to [`HOT_AFTER`].
    seen: HashMap<BlockHash, u32>,
    /// The prefixes each new pod served.
    served: HashSet<(String, BlockHash)>,
}

impl PrefixHistory {
    /// Notes a record of `prefix` served by `pod` (`new_pod`: one that joined since the
    /// experiment started) and says whether it is the pod's first request of a hot prefix.
    pub fn note(&mut self, pod: Option<&str>, prefix: Option<BlockHash>, new_pod: bool) -> bool {
        let Some(prefix) = prefix else {
            return false;
        };
        let count = self.seen.get(&prefix).copied().unwrap_or(0);
        let first = match pod {
            Some(pod) if new_pod && self.served.len() < MAX_SERVED => {
                self.served.insert((pod.to_string(), prefix)) && count >= HOT_AFTER
            }
            _ => false,
        };
        if count < HOT_AFTER {
            if count == 0 && self.seen.len() >= MAX_PREFIXES {
                self.seen.retain(|_, n| *n >= HOT_AFTER);
            }
            if count > 0 || self.seen.len() < MAX_PREFIXES {
                *self.seen.entry(prefix).or_default() += 1;
            }
        }
        first
    }

    /// The history within its bounds (a restored snapshot's).
    pub fn bounded(mut self) -> Self {
        if self.seen.len() > MAX_PREFIXES {
            self.seen.retain(|_, n| *n >= HOT_AFTER);
        }
        if self.seen.len() > MAX_PREFIXES || self.served.len() > MAX_SERVED {
            return Self::default();
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Option<BlockHash> = Some(BlockHash(7));

    #[test]
    fn only_a_new_pods_first_request_of_a_prefix_seen_twice_before_counts() {
        let mut h = PrefixHistory::default();
        assert!(!h.note(Some("old"), P, false), "an old pod's");
        assert!(
            !h.note(Some("new"), P, true),
            "seen once before: not hot yet"
        );
        assert!(!h.note(Some("new"), P, true), "the pod served it already");
        assert!(
            h.note(Some("other-new"), P, true),
            "seen twice, its first there"
        );
        assert!(!h.note(Some("other-new"), P, true), "its second there");
        assert!(
            !h.note(Some("new"), None, true),
            "a prompt without a prefix"
        );
    }

    #[test]
    fn the_counts_are_bounded_and_hot_prefixes_outlive_the_once_seen() {
        let mut h = PrefixHistory::default();
        let hot = Some(BlockHash(u64::MAX));
        h.note(None, hot, false);
        h.note(None, hot, false);
        for i in 0..(MAX_PREFIXES as u64 + 10) {
            h.note(None, Some(BlockHash(i)), false);
        }
        assert!(h.seen.len() <= MAX_PREFIXES);
        assert!(
            h.note(Some("new"), hot, true),
            "a hot prefix is not forgotten"
        );
        let mut full = PrefixHistory::default();
        for i in 0..(MAX_SERVED as u64) {
            full.note(Some("new"), Some(BlockHash(i)), true);
        }
        full.seen.insert(BlockHash(u64::MAX), HOT_AFTER);
        assert!(
            !full.note(Some("new-2"), hot, true),
            "no room for another pair"
        );
        assert_eq!(full.served.len(), MAX_SERVED);
    }

    #[test]
    fn a_history_survives_its_json() {
        let mut h = PrefixHistory::default();
        h.note(Some("a"), P, true);
        h.note(Some("b"), P, true);
        let back: PrefixHistory =
            serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.bounded(), h);
    }
}
