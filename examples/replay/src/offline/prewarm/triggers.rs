//! The filter's side in virtual time: per request, the user's prompt pattern (core's
//! `observe_prompt`), the hot pattern's rate, and the adapter's rate with its pin crossing
//! (core's `should_pin`), turned into the signals the filter would send — the same decisions as
//! `filter/src/observe.rs`, with plain maps instead of Envoy shared data.

use std::collections::HashMap;

use prewarm_core::rate::RateWindow;
use prewarm_core::trigger::{
    observe_prompt, priority, should_pin, PromptOrigin, TriggerConfig, UserPattern,
};
use prewarm_core::wire::{FeedbackOutcome, FeedbackSignal, PinSignal, Signal};
use prewarm_core::{Endpoint, FingerprintConfig, Sketch};

use super::super::policy::RequestCtx;

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
        }
    }

    /// The signals request `r` causes at `now_ms`.
    pub fn observe(&mut self, r: &RequestCtx<'_>, now_ms: u64) -> Vec<Signal> {
        let mut out = Vec::new();
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

    fn count_pattern(&mut self, pattern: u64, now_ms: u64) -> (bool, f64) {
        let window = self.rate_window_ms;
        let slot = self
            .patterns
            .entry(pattern)
            .or_insert_with(|| (RateWindow::new(window), false));
        let was = slot.1;
        slot.0.record(now_ms, 1);
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
            let (was, rate) = self.count_pattern(last.0, now_ms);
            let origin = PromptOrigin {
                model: r.model,
                tenant: r.tenant,
                endpoint: Endpoint::Completions,
                canonical: r.canonical,
                request: None,
            };
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
            self.count_pattern(last.0, now_ms);
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
