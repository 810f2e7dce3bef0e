//! The filter's side in virtual time: per request, the user's prompt pattern (core's
//! `observe_prompt`), the hot pattern's rate, the adapter's rate with its pin crossing (core's
//! `should_pin`) and the request's shared-prompt group (core's `trigger::shared`); per tick
//! (the filter's default 1 s), the fold of those groups into each routing key's rate and the
//! cross-user prefill signals it makes — the same decisions as `filter/src/observe.rs`, with
//! plain maps instead of Envoy shared data and one worker. The tick is taken on the first
//! request at or after it (the policy calls this side per request only), so a fold's signals
//! reach the gateway with that request.

use std::collections::HashMap;

use prewarm_core::rate::RateWindow;
use prewarm_core::trigger::shared::{
    count_shared_prompt, shared_prefix_signal, PromptGroup, SharedPromptState, MAX_GROUPS,
};
use prewarm_core::trigger::{
    observe_prompt, priority, should_pin, PromptOrigin, TriggerConfig, UserPattern,
};
use prewarm_core::wire::{FeedbackOutcome, FeedbackSignal, PinSignal, Signal};
use prewarm_core::{Endpoint, FingerprintConfig, Sketch};

use super::super::policy::RequestCtx;

/// The filter's default tick, ms (`tick_period_ms`).
const FILTER_TICK_MS: u64 = 1_000;

/// The filter's default `shared_prompt_slots`: a key shares its slot with others, as there.
const SHARED_PROMPT_SLOTS: u64 = 4096;

/// The filter's thresholds and windows (its defaults).
#[derive(Debug, Clone)]
pub struct FilterSide {
    triggers: TriggerConfig,
    fingerprint: FingerprintConfig,
    sketch_size: usize,
    rate_window_ms: u64,
    users: HashMap<String, UserPattern>,
    patterns: HashMap<u64, (RateWindow, bool)>,
    adapters: HashMap<String, (RateWindow, bool)>,
    /// The worker's shared-prompt groups by routing key, with when each was last seen.
    groups: HashMap<u64, (PromptGroup, u64)>,
    /// Each slot's routing key, with its rate and last signal (the filter's
    /// `shared_prompt/<slot>`).
    shared: HashMap<u64, (u64, SharedPromptState)>,
    next_fold_ms: u64,
}

/// What a prefill signal of a trace request is made from: the evaluator replays completions,
/// so a request has no chat shape.
fn origin_of<'a>(r: &RequestCtx<'a>) -> PromptOrigin<'a> {
    PromptOrigin {
        model: r.model,
        tenant: r.tenant,
        endpoint: Endpoint::Completions,
        canonical: r.canonical,
        request: None,
    }
}

impl FilterSide {
    pub fn new(triggers: TriggerConfig, fingerprint: FingerprintConfig) -> Self {
        Self {
            triggers,
            fingerprint,
            sketch_size: prewarm_core::similarity::DEFAULT_SKETCH_SIZE,
            rate_window_ms: 60_000,
            users: HashMap::new(),
            patterns: HashMap::new(),
            adapters: HashMap::new(),
            groups: HashMap::new(),
            shared: HashMap::new(),
            next_fold_ms: 0,
        }
    }

    /// The signals request `r` causes at `now_ms`, after those of a tick due before it.
    pub fn observe(&mut self, r: &RequestCtx<'_>, now_ms: u64) -> Vec<Signal> {
        let mut out = Vec::new();
        if now_ms >= self.next_fold_ms {
            out.extend(self.fold(now_ms));
            self.next_fold_ms = (now_ms / FILTER_TICK_MS + 1) * FILTER_TICK_MS;
        }
        self.tally_prompt(r, now_ms);
        if let Some(s) = self.observe_user(r, now_ms) {
            out.push(s);
        }
        if let Some(adapter) = r.adapter {
            if let Some(s) = self.observe_adapter(adapter, r.tenant, now_ms) {
                out.push(s);
            }
        }
        out
    }

    /// The request's shared-prompt group (none without a full block), as the filter's
    /// `prompt_tally` keeps it.
    fn tally_prompt(&mut self, r: &RequestCtx<'_>, now_ms: u64) {
        let Some(key) = r.chain.routing_key(&self.fingerprint) else {
            return;
        };
        let origin = origin_of(r);
        let blocks = &r.chain.blocks;
        match self.groups.get_mut(&key.0) {
            Some((group, seen)) if group.is_for(r.model) => {
                group.add(&origin, blocks, true, &self.fingerprint);
                *seen = now_ms;
            }
            _ => {
                let group = PromptGroup::first(&origin, blocks, true);
                self.groups.insert(key.0, (group, now_ms));
            }
        }
    }

    /// The tick's fold: each group's requests into its key's rate, a prefill signal for each
    /// key core's rule says is hot now; then the least recently seen groups beyond the
    /// filter's bound are dropped.
    pub fn fold(&mut self, now_ms: u64) -> Vec<Signal> {
        let mut out = Vec::new();
        let mut hot = Vec::new();
        for (key, (group, _)) in self.groups.iter_mut() {
            let window = self.rate_window_ms;
            let Some(fold) = group.take_fold(now_ms, window) else {
                continue;
            };
            let slot = self
                .shared
                .entry(*key % SHARED_PROMPT_SLOTS)
                .or_insert_with(|| (*key, SharedPromptState::new(window)));
            if slot.0 != *key {
                // another key's slot: taken over, as in shared data
                *slot = (*key, SharedPromptState::new(window));
            }
            let decided = count_shared_prompt(
                &mut slot.1,
                fold.requests,
                now_ms,
                group.can_signal(),
                &self.triggers,
            );
            if let Some(h) = decided {
                hot.push((*key, h, fold.keep_warm));
            }
        }
        // in key order: a map's order would make runs differ
        hot.sort_by_key(|(key, _, _)| *key);
        for (key, mut h, keep_warm) in hot {
            let last = self
                .groups
                .get(&key)
                .and_then(|(g, _)| g.common().last().copied());
            let Some(last) = last else {
                continue;
            };
            // the pattern flag shared with streaks, as the filter reads it
            let (streak_signalled, _) = self.count_pattern(last.0, now_ms, 0);
            h.signalled_before |= streak_signalled;
            let signal = self.groups.get(&key).and_then(|(group, _)| {
                shared_prefix_signal(group, h, keep_warm, &self.fingerprint, &self.triggers)
            });
            out.extend(signal.map(Signal::Prefill));
        }
        if self.groups.len() > MAX_GROUPS {
            let mut by_age: Vec<(u64, u64)> = self
                .groups
                .iter()
                .map(|(k, (_, seen))| (*seen, *k))
                .collect();
            by_age.sort_unstable();
            let excess = self.groups.len() - MAX_GROUPS;
            for (_, key) in by_age.into_iter().take(excess) {
                self.groups.remove(&key);
            }
        }
        out
    }

    fn count_pattern(&mut self, pattern: u64, now_ms: u64, uses: u32) -> (bool, f64) {
        let window = self.rate_window_ms;
        let slot = self
            .patterns
            .entry(pattern)
            .or_insert_with(|| (RateWindow::new(window), false));
        let was = slot.1;
        slot.0.record(now_ms, uses);
        slot.1 = true;
        (was, slot.0.per_minute(now_ms))
    }

    fn observe_user(&mut self, r: &RequestCtx<'_>, now_ms: u64) -> Option<Signal> {
        let sketch = Sketch::of(r.canonical, self.sketch_size);
        let previous = self.users.get(r.user);
        let (state, decision) = observe_prompt(previous, sketch, &r.chain.blocks, &self.triggers);
        let hot = state.streak > self.triggers.similar_prompts;
        let last = state.common.last().copied();
        self.users.insert(r.user.to_string(), state);
        if let Some(decision) = decision {
            let last = *decision.prefix.last()?;
            let (was, rate) = self.count_pattern(last.0, now_ms, 1);
            let origin = origin_of(r);
            return Some(Signal::Prefill(decision.into_signal(
                origin,
                &self.fingerprint,
                was,
                rate,
                &self.triggers,
            )));
        }
        let last = last?;
        if hot {
            self.count_pattern(last.0, now_ms, 1);
            return Some(Signal::Feedback(FeedbackSignal {
                model: r.model.to_string(),
                prefix: last,
                outcome: FeedbackOutcome::Adopted,
                count: 1,
            }));
        }
        None
    }

    fn observe_adapter(
        &mut self,
        adapter: &str,
        tenant: Option<&str>,
        now_ms: u64,
    ) -> Option<Signal> {
        let window = self.rate_window_ms;
        let slot = self
            .adapters
            .entry(adapter.to_string())
            .or_insert_with(|| (RateWindow::new(window), false));
        slot.0.record(now_ms, 1);
        let rate = slot.0.per_minute(now_ms);
        let hot = should_pin(rate, &self.triggers);
        let crossed = hot && !slot.1;
        slot.1 = hot;
        crossed.then(|| {
            Signal::Pin(PinSignal {
                adapter: adapter.to_string(),
                tenant: tenant.map(str::to_string),
                rate_per_minute: rate,
                priority: priority(rate, &self.triggers),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::wire::PatternState;
    use prewarm_core::BlockChain;
    use prewarm_gateway::policy::Tier;

    /// Sends `canonical` as `user` at `now_ms`; returns the prefill signals it brings.
    fn send(side: &mut FilterSide, user: &str, canonical: &str, now_ms: u64) -> Vec<PatternState> {
        let fp = FingerprintConfig::default();
        let chain = BlockChain::of("m", canonical.as_bytes(), &fp);
        let r = RequestCtx {
            index: 0,
            now_s: now_ms as f64 / 1000.0,
            model: "m",
            adapter: None,
            tenant: None,
            tier: Tier::default(),
            user,
            canonical,
            chain: &chain,
        };
        side.observe(&r, now_ms)
            .into_iter()
            .filter_map(|s| match s {
                Signal::Prefill(p) => Some(p.state),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_shot_users_of_a_template_make_it_hot_on_the_tick_after_its_third_request() {
        let mut side = FilterSide::new(TriggerConfig::default(), FingerprintConfig::default());
        let system = "You are the billing assistant. Cite the policy. ".repeat(60);
        let mut signals = Vec::new();
        for i in 0..8u64 {
            let prompt = format!("{system}\nquestion {i}: where is my invoice?");
            let now = 10_000 + i * 1_000;
            signals.push(send(&mut side, &format!("user-{i}"), &prompt, now));
        }
        // requests 0..2 are folded at the ticks before requests 1..3: hot at the fourth's
        let fired: Vec<usize> = (0..8).filter(|i| !signals[*i].is_empty()).collect();
        assert_eq!(fired, vec![3]);
        assert_eq!(signals[3], vec![PatternState::New]);
        // still sent: within a window of the signal nothing more, a window after it once more,
        // known
        let later = format!("{system}\nquestion 9: refunds?");
        assert_eq!(send(&mut side, "user-9", &later, 72_000), Vec::new());
        assert_eq!(
            send(&mut side, "user-10", &later, 74_000),
            vec![PatternState::Known]
        );
    }
}
