//! Keep-warm: vLLM cannot pin KV blocks nor adapters, so warmth is kept by re-touching. Every
//! keep-warm period each routable pod's KV model names the warm prefixes nearing eviction
//! (within its prefill budget) and its LoRA model the adapters to touch. A warm prefix the pool
//! has retired leaves the pod's warm set, so it stops holding a slot of the warm budget, and so
//! does one only experiment arms without keep-warm signal (`keep_warm: false`, whatever put it
//! there: a signal's prefill, a warm-up). One the pool does not warm now (its salt dropped by a
//! snapshot, or backing off after a rejection) stays in the warm set, is not sent, and is
//! counted each period it comes due.
//!
//! Also the modelled hit ratio of each routable pod: of the hot prefixes (the pool's hottest, up
//! to the warm-up tiers' size) that placement routes to the pod, the share its KV model believes
//! resident.

use prewarm_core::place;
use prewarm_core::wire::PlacedPrefix;

use super::action::{Action, Cause};
use super::{adapter_calls, Fleet};
use crate::policy::candidates_for;

/// The fleet's keep-warm period: when the next is due, and the prefixes the last placement
/// placed (which every table carries until the next) among which routable pods. Invariant: the
/// placed prefixes change only when a period is due or the routable pods change, so filters
/// seed their index from one view a period, not one a tick — and a pod that becomes routable
/// is in the same table as the prefixes its warm-up prefilled, so the requests that continue
/// them go to it from its first table on (the filter's rule keeps a request on the pod its
/// index names, and a seed is what names the new pod).
#[derive(Debug, Clone, Default)]
pub struct KeepWarmPeriod {
    next_ms: u64,
    placed: Vec<PlacedPrefix>,
    among: Vec<String>,
}

impl KeepWarmPeriod {
    /// Whether a period is due at `now_ms` (the first always is).
    pub fn due(&self, now_ms: u64) -> bool {
        now_ms >= self.next_ms
    }

    /// A period ran at `now_ms` and placed `placed` among the routable pods `among`; the next
    /// is due `period_ms` later.
    pub fn ran(
        &mut self,
        now_ms: u64,
        period_ms: u64,
        placed: Vec<PlacedPrefix>,
        among: Vec<String>,
    ) {
        self.next_ms = now_ms.saturating_add(period_ms.max(1));
        self.replace(placed, among);
    }

    /// Whether the placed prefixes were placed among exactly the routable pods `among`.
    pub fn placed_among(&self, among: &[String]) -> bool {
        self.among == among
    }

    /// The routable pods changed between periods to `among`: the placement is `placed` now.
    pub fn replace(&mut self, placed: Vec<PlacedPrefix>, among: Vec<String>) {
        self.placed = placed;
        self.among = among;
    }

    /// The prefixes the last period placed.
    pub fn placed(&self) -> &[PlacedPrefix] {
        &self.placed
    }
}

impl Fleet {
    pub(super) fn keep_warm(&mut self, now_ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut prefills = 0u64;
        let ids: Vec<String> = self
            .pods
            .values()
            .filter(|p| p.routable(now_ms))
            .map(|p| p.shape.id.clone())
            .collect();
        for id in ids {
            let pool = &self.pool;
            let (due, touches) = match self.pods.get_mut(&id) {
                Some(pod) => {
                    pod.kv
                        .retain_warm(|k| pool.get(k).is_some_and(|v| v.keep_warm));
                    (pod.kv.keep_warm(now_ms), pod.lora.keep_warm(now_ms))
                }
                None => continue,
            };
            for k in due {
                match self.prefill_action(&id, k.key, Cause::KeepWarm, now_ms) {
                    Ok(a) => {
                        prefills += 1;
                        actions.push(a);
                    }
                    // An adapter's prefix on a pod that lost the adapter, or one the pool does
                    // not warm now: not sent, so not modelled done; its turn comes back when
                    // the pod gets the adapter again, the back-off ends or a signal brings the
                    // salt.
                    Err(not_sent) => {
                        self.count_not_sent(not_sent);
                        if let Some(pod) = self.pods.get_mut(&id) {
                            pod.kv.prefill_failed(&k.key);
                        }
                    }
                }
            }
            if let Some(pod) = self.pods.get(&id) {
                actions.extend(adapter_calls(pod, touches, Cause::KeepWarm));
            }
        }
        self.outputs.decision("kv", "keep_warm", prefills);
        actions
    }

    /// (pod id, ratio in [0, 1]) for every routable pod some hot prefix routes to.
    pub fn modelled_hit_ratios(&self, now_ms: u64) -> Vec<(String, f64)> {
        let candidates = self.routable_candidates(now_ms);
        let limit = self
            .config
            .warmup
            .first_tier
            .saturating_add(self.config.warmup.second_tier);
        let scopes = self.adapter_scopes(&candidates, now_ms);
        let mut counts = vec![(0u64, 0u64); candidates.len()];
        for hot in self.hot_prefixes(limit) {
            let among = candidates_for(hot.key.model, &candidates, &scopes);
            let Some(c) = place(hot.routing_key.0, among).and_then(|i| among.get(i)) else {
                continue;
            };
            let Some(count) = candidates
                .iter()
                .position(|x| x.id == c.id)
                .and_then(|i| counts.get_mut(i))
            else {
                continue;
            };
            count.1 += 1;
            if self
                .pods
                .get(c.id)
                .is_some_and(|p| p.kv.is_resident(&hot.key))
            {
                count.0 += 1;
            }
        }
        candidates
            .iter()
            .zip(counts)
            .filter(|(_, (_, total))| *total > 0)
            .map(|(c, (hits, total))| (c.id.to_string(), hits as f64 / total as f64))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::KeepWarmPeriod;

    #[test]
    fn the_first_period_is_due_at_once_and_the_next_a_period_later() {
        let mut period = KeepWarmPeriod::default();
        assert!(period.due(0));
        period.ran(5_000, 1_000, Vec::new(), Vec::new());
        assert!(!period.due(5_999));
        assert!(period.due(6_000));
        // a zero period still moves time on: one period a millisecond, not one a call
        period.ran(6_000, 0, Vec::new(), Vec::new());
        assert!(!period.due(6_000));
        assert!(period.due(6_001));
    }
}
