//! From requests to the signals they cause, with the state kept in shared data: the user's
//! prompt pattern (core's `observe_prompt`, on the request: one compare-and-swap), the hot
//! pattern's rate and whether it was signalled before, the adapter's rate with its pinned
//! flag (core's `should_pin`, once per crossing), and each shared prompt's rate across users
//! (core's `trigger::shared`: a prefix many requests share is hot whoever sends it). Adapter
//! requests, adopted uses of hot prefixes and requests per routing key (`prompt_tally`) are
//! tallied per VM on the request path and folded into shared data on the tick
//! ([`fold_tally`]), so a request of a hot template costs one shared-data update, not four,
//! and a request without a user none. The decisions are core's; this module only loads and
//! stores their state.

use prewarm_core::experiment::ArmSettings;
use prewarm_core::trigger::shared::{count_shared_prompt, shared_prefix_signal};
use prewarm_core::trigger::{
    observe_prompt, priority, shape_expected, should_pin, PromptOrigin, UserPattern,
};
use prewarm_core::wire::{FeedbackOutcome, FeedbackSignal, PinSignal, Signal};
use prewarm_core::{BlockChain, BlockHash, Endpoint, InferenceRequest, Sketch};

use crate::config::FilterConfig;
use crate::host::{Host, Metric};
use crate::shared::{read_u64, update, Keys, RateSlot, SharedPromptSlot};
use crate::signals::prompt_tally::PromptTally;
use crate::signals::tally::{AdapterTally, Tallied, Tally};

/// One inspected request, as the observers need it.
pub struct Observation<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    pub tenant: Option<&'a str>,
    /// Whose streak the prompt continues: the user, else its credential's identity.
    pub user: Option<&'a str>,
    pub canonical: &'a str,
    pub chain: &'a BlockChain,
    /// The request, whose shape (chat messages, tools, kwargs, salt) a signal carries.
    pub request: &'a InferenceRequest,
    /// The text to sketch (the canonical prompt cut to `max_prefix_tokens`): sketched only
    /// when the request has a user, since only users' patterns compare sketches.
    pub sketched: &'a str,
    /// The request's experiment arm's settings (the defaults without one): an arm with warm-up
    /// off keeps its prompts out of the shared-prompt tally.
    pub arm: ArmSettings,
}

impl<'a> Observation<'a> {
    /// What a prefill signal of this request's prompt is made from.
    fn origin(&self) -> PromptOrigin<'a> {
        PromptOrigin {
            model: self.model,
            tenant: self.tenant,
            endpoint: self.endpoint,
            canonical: self.canonical,
            request: Some(self.request),
        }
    }
}

/// What one request caused.
#[derive(Debug, Default)]
pub struct Observed {
    /// The prefill signal of a completed streak.
    pub prefill: Option<Signal>,
    /// The hot prefix the request used (tallied as adopted), whose answer is worth watching.
    pub adopted: Option<BlockHash>,
}

/// The prefill signal one request causes, if any; tallies the rest for the tick.
pub fn observe<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    tallies: (&Tally, &PromptTally),
    seen: Observation<'_>,
) -> Observed {
    let (tally, prompts) = tallies;
    if !config.signals.base_models.iter().any(|m| m == seen.model)
        && !tally.adapter_request(seen.model, seen.tenant)
    {
        host.count(Metric::TallyOverflow, 1);
    }
    if seen.arm.warmup {
        tally_prompt(host, config, prompts, &seen);
    }
    match seen.user {
        Some(user) => observe_user(host, config, keys, tally, user, &seen).unwrap_or_default(),
        None => Observed::default(),
    }
}

/// Tallies the request under its routing key (none without a full block) for the cross-user
/// trigger; nothing is written to shared data here.
fn tally_prompt<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    prompts: &PromptTally,
    seen: &Observation<'_>,
) {
    let fingerprint = config.requests.fingerprint();
    let Some(key) = seen.chain.routing_key(&fingerprint) else {
        return;
    };
    let origin = seen.origin();
    let evicted = prompts.observe(
        key,
        &origin,
        &seen.chain.blocks,
        seen.arm.keep_warm,
        &fingerprint,
    );
    if evicted > 0 {
        host.count(Metric::SharedPromptEvicted, evicted);
    }
}

/// Folds one tick's tallies into shared data: adopted feedback (with its count) for each hot
/// prefix used, a pin signal for each adapter whose rate crossed the threshold, and a prefill
/// signal for each shared prompt that is hot and was not signalled within the last window.
pub fn fold_tally<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    tallied: Tallied,
    prompts: &PromptTally,
) -> Vec<Signal> {
    let now = host.now_ms();
    let mut signals = fold_prompts(host, config, keys, prompts, now);
    for ((model, prefix), count) in tallied.adopted {
        if count_pattern(host, config, keys, prefix, count, now).is_some() {
            signals.push(Signal::Feedback(FeedbackSignal {
                model,
                prefix,
                outcome: FeedbackOutcome::Adopted,
                count,
            }));
        }
    }
    // successes were counted as adopted uses already: feedback only
    for ((model, prefix), count) in tallied.succeeded {
        signals.push(Signal::Feedback(FeedbackSignal {
            model,
            prefix,
            outcome: FeedbackOutcome::Succeeded,
            count,
        }));
    }
    for (adapter, t) in tallied.adapters {
        if let Some(pin) = count_adapter(host, config, keys, &adapter, &t, now) {
            signals.push(pin);
        }
    }
    signals
}

/// One compare-and-swap per routing key with requests since the last fold: its requests join
/// the proxy's rate window, and core's rule says whether to signal it now.
fn fold_prompts<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    prompts: &PromptTally,
    now: u64,
) -> Vec<Signal> {
    let fingerprint = config.requests.fingerprint();
    let mut signals = Vec::new();
    prompts.fold(now, config.signals.rate_window_ms, |key, group, fold| {
        let slot = keys.shared_prompt(key.0, config.shared_data.shared_prompt_slots);
        let hot = update(host, &slot, config.shared_data.cas_retries, |bytes| {
            let mut slot = SharedPromptSlot::read(bytes, key.0, config.signals.rate_window_ms);
            let hot = count_shared_prompt(
                &mut slot.state,
                fold.requests,
                now,
                group.can_signal(),
                &config.signals.triggers,
            );
            (Some(slot.to_bytes()), hot)
        })
        .flatten();
        let signal = hot.and_then(|mut hot| {
            // the prefix's pattern flag, shared with streaks: whichever signals it first says
            // `new`, so a prefix is prefilled as new once (the gateway, direct calls)
            let last = *group.common().last()?;
            let (streak_signalled, _) = count_pattern(host, config, keys, last, 0, now)?;
            hot.signalled_before |= streak_signalled;
            shared_prefix_signal(
                group,
                hot,
                fold.keep_warm,
                &fingerprint,
                &config.signals.triggers,
            )
        });
        if let Some(signal) = signal {
            if signal.shape.is_none() && group.unshaped() {
                host.count(Metric::SignalsUnshaped, 1);
            }
            host.count(Metric::SharedPromptSignals, 1);
            signals.push(Signal::Prefill(signal));
        }
    });
    host.gauge(Metric::SharedPromptBytes, prompts.bytes() as u64);
    signals
}

/// Feeds the prompt into the user's pattern; a completed streak becomes a prefill signal, a
/// later prompt of the same hot pattern is tallied as an adopted use of its prefix.
fn observe_user<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    tally: &Tally,
    user: &str,
    seen: &Observation<'_>,
) -> Option<Observed> {
    let owner = Keys::owner_hash(user);
    let key = keys.user(owner, config.shared_data.user_slots);
    let sketch = Sketch::of(seen.sketched, config.requests.sketch_size);
    let (state, decision) = update(host, &key, config.shared_data.cas_retries, |bytes| {
        let previous = (read_u64(bytes, 0) == Some(owner))
            .then(|| {
                UserPattern::from_bytes(bytes.get(8..).unwrap_or(&[]), config.requests.sketch_size)
            })
            .flatten();
        let (state, decision) = observe_prompt(
            previous.as_ref(),
            sketch.clone(),
            &seen.chain.blocks,
            &config.signals.triggers,
        );
        let mut value = owner.to_le_bytes().to_vec();
        value.extend_from_slice(&state.to_bytes());
        (Some(value), (state, decision))
    })?;
    if let Some(decision) = decision {
        let last = *decision.prefix.last()?;
        let now = host.now_ms();
        let (was_signalled, rate) = count_pattern(host, config, keys, last, 1, now)?;
        let signal = decision.into_signal(
            seen.origin(),
            &config.requests.fingerprint(),
            was_signalled,
            rate,
            &config.signals.triggers,
        );
        if signal.shape.is_none() && shape_expected(seen.request) {
            // past a shape's bounds: warmed as a completion of its text, counted
            host.count(Metric::SignalsUnshaped, 1);
        }
        let prefill = Signal::Prefill(signal);
        return Some(Observed {
            prefill: Some(prefill),
            adopted: None,
        });
    }
    let hot = state.streak > config.signals.triggers.similar_prompts;
    let last = *state.common.last()?;
    if !hot {
        return None;
    }
    if !tally.adopted(seen.model, last) {
        host.count(Metric::TallyOverflow, 1);
    }
    Some(Observed {
        prefill: None,
        adopted: Some(last),
    })
}

/// Counts `uses` of a hot pattern; returns whether it had been signalled before and its rate.
fn count_pattern<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    pattern: BlockHash,
    uses: u32,
    now: u64,
) -> Option<(bool, f64)> {
    let key = keys.pattern(pattern.0, config.shared_data.pattern_slots);
    update(host, &key, config.shared_data.cas_retries, |bytes| {
        let mut slot = RateSlot::read(bytes, pattern.0, config.signals.rate_window_ms);
        let was_signalled = slot.flag;
        slot.window.record(now, uses);
        slot.flag = true;
        (
            Some(slot.to_bytes()),
            (was_signalled, slot.window.per_minute(now)),
        )
    })
}

/// Counts an adapter's tallied requests; a pin signal when its rate crosses the threshold.
fn count_adapter<H: Host + ?Sized>(
    host: &H,
    config: &FilterConfig,
    keys: &Keys,
    adapter: &str,
    tallied: &AdapterTally,
    now: u64,
) -> Option<Signal> {
    let owner = Keys::owner_hash(adapter);
    let key = keys.adapter(owner, config.shared_data.adapter_slots);
    let (crossed, rate) = update(host, &key, config.shared_data.cas_retries, |bytes| {
        let mut slot = RateSlot::read(bytes, owner, config.signals.rate_window_ms);
        // an adapter that cooled down while idle (no fold saw it below the rate) crosses anew
        let was_hot =
            slot.flag && should_pin(slot.window.per_minute(now), &config.signals.triggers);
        slot.window.record(now, tallied.requests);
        let rate = slot.window.per_minute(now);
        let hot = should_pin(rate, &config.signals.triggers);
        let crossed = hot && !was_hot;
        slot.flag = hot;
        (Some(slot.to_bytes()), (crossed, rate))
    })?;
    crossed.then(|| {
        Signal::Pin(PinSignal {
            adapter: adapter.to_string(),
            tenant: tallied.tenant.clone(),
            rate_per_minute: rate,
            priority: priority(rate, &config.signals.triggers),
        })
    })
}
