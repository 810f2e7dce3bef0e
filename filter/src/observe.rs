//! From one parsed request to the signals it causes, with the state kept in shared data:
//! the user's prompt pattern (core's `observe_prompt`), the hot pattern's rate and whether it
//! was signalled before, and the adapter's rate with its pinned flag (core's `should_pin`,
//! once per crossing). The decisions are core's; this module only loads and stores their state.

use prewarm_core::fingerprint::blocks_to_tokens;
use prewarm_core::tokens::truncate_to_tokens;
use prewarm_core::trigger::{observe_prompt, priority, should_pin, UserPattern};
use prewarm_core::wire::{
    FeedbackOutcome, FeedbackSignal, PatternState, PinSignal, PrefillSignal, Signal,
};
use prewarm_core::{BlockChain, BlockHash, Endpoint, Sketch};

use crate::config::FilterConfig;
use crate::host::Host;
use crate::shared::{read_u64, update, Keys, RateSlot};

/// One inspected request, as the observers need it.
pub struct Observation<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    pub tenant: Option<&'a str>,
    pub user: Option<&'a str>,
    pub canonical: &'a str,
    pub chain: &'a BlockChain,
    /// The text to sketch (the canonical prompt cut to `max_prefix_tokens`): sketched only
    /// when the request has a user, since only users' patterns compare sketches.
    pub sketched: &'a str,
}

/// The signals one request causes (possibly none).
pub fn observe<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    seen: Observation<'_>,
) -> Vec<Signal> {
    let now = host.now_ms();
    let mut signals = Vec::new();
    if let Some(user) = seen.user {
        if let Some(signal) = observe_user(host, config, keys, user, &seen, now) {
            signals.push(signal);
        }
    }
    if !config.base_models.iter().any(|m| m == seen.model) {
        if let Some(signal) = observe_adapter(host, config, keys, &seen, now) {
            signals.push(signal);
        }
    }
    signals
}

/// Feeds the prompt into the user's pattern; a completed streak becomes a prefill signal, a
/// later prompt of the same hot pattern an adopted feedback.
fn observe_user<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    user: &str,
    seen: &Observation<'_>,
    now: u64,
) -> Option<Signal> {
    let owner = Keys::owner_hash(user);
    let key = keys.user(owner, config.user_slots);
    let sketch = Sketch::of(seen.sketched, config.sketch_size);
    let (state, decision) = update(host, &key, config.cas_retries, |bytes| {
        let previous = (read_u64(bytes, 0) == Some(owner))
            .then(|| UserPattern::from_bytes(bytes.get(8..).unwrap_or(&[]), config.sketch_size))
            .flatten();
        let (state, decision) = observe_prompt(
            previous.as_ref(),
            sketch.clone(),
            &seen.chain.blocks,
            &config.triggers,
        );
        let mut value = owner.to_le_bytes().to_vec();
        value.extend_from_slice(&state.to_bytes());
        (Some(value), (state, decision))
    })?;
    if let Some(decision) = decision {
        let last = *decision.prefix.last()?;
        let (was_signalled, rate) = count_pattern(host, config, keys, last, now)?;
        let tokens = blocks_to_tokens(decision.prefix.len(), &config.fingerprint());
        return Some(Signal::Prefill(PrefillSignal {
            model: seen.model.to_string(),
            tenant: seen.tenant.map(str::to_string),
            endpoint: seen.endpoint,
            prefix_tokens: tokens,
            prefix_text: truncate_to_tokens(seen.canonical, tokens).to_string(),
            prefix: decision.prefix,
            state: if was_signalled {
                PatternState::Known
            } else {
                PatternState::New
            },
            priority: priority(rate, &config.triggers),
        }));
    }
    let hot = state.streak > config.triggers.similar_prompts;
    let last = *state.common.last()?;
    if hot {
        count_pattern(host, config, keys, last, now)?;
        return Some(Signal::Feedback(FeedbackSignal {
            model: seen.model.to_string(),
            prefix: last,
            outcome: FeedbackOutcome::Adopted,
            count: 1,
        }));
    }
    None
}

/// Counts one use of a hot pattern; returns whether it had been signalled before and its rate.
fn count_pattern<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    pattern: BlockHash,
    now: u64,
) -> Option<(bool, f64)> {
    let key = keys.pattern(pattern.0, config.pattern_slots);
    update(host, &key, config.cas_retries, |bytes| {
        let mut slot = RateSlot::read(bytes, pattern.0, config.rate_window_ms);
        let was_signalled = slot.flag;
        slot.window.record(now, 1);
        slot.flag = true;
        (
            Some(slot.to_bytes()),
            (was_signalled, slot.window.per_minute(now)),
        )
    })
}

/// Counts the request for its adapter; a pin signal when the rate crosses the threshold.
fn observe_adapter<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    seen: &Observation<'_>,
    now: u64,
) -> Option<Signal> {
    let owner = Keys::owner_hash(seen.model);
    let key = keys.adapter(owner, config.adapter_slots);
    let (crossed, rate) = update(host, &key, config.cas_retries, |bytes| {
        let mut slot = RateSlot::read(bytes, owner, config.rate_window_ms);
        slot.window.record(now, 1);
        let rate = slot.window.per_minute(now);
        let hot = should_pin(rate, &config.triggers);
        let crossed = hot && !slot.flag;
        slot.flag = hot;
        (Some(slot.to_bytes()), (crossed, rate))
    })?;
    crossed.then(|| {
        Signal::Pin(PinSignal {
            adapter: seen.model.to_string(),
            tenant: seen.tenant.map(str::to_string),
            rate_per_minute: rate,
            priority: priority(rate, &config.triggers),
        })
    })
}
