//! The filter in virtual time: one filter VM — the filter's own [`Worker`] (configuration,
//! tallies, shared-data keys) over an in-memory host ([`MemoryHost`]) — driven by the filter's
//! own code, so the evaluator's signals are the filter's and no copy of its glue can drift:
//!
//! - per request, as the filter's request path does once it has the body: core's parser reads
//!   the body the request would carry (a completion of its canonical text with its `max_tokens`;
//!   a body over the filter's `max_body_bytes` is skipped as there), then `observe::observe`
//!   (the user's streak, the shared-prompt tally, the adapter tally); a streak's prefill signal
//!   is queued, as the filter queues it;
//! - its answer: a request that used a hot prefix is watched by the filter's `SuccessWatch`
//!   over the answer podsim gives (`200`, `finish_reason: "length"` at the `max_tokens` the
//!   request asked for), which tallies the success;
//! - where it went: `request::served_record` for a request the table routed (none for one the
//!   filter did not route: a fallback's pod is Envoy's choice, unknown to the filter);
//! - every `tick_period_ms` (the filter's default 1 s): `observe::fold_tally` (adopted and
//!   succeeded feedback, pins, cross-user prefills), and the tick's batch — queued signals and
//!   served records — goes to the gateway, as the root context flushes them.
//!
//! What the VM does not model: several Envoy workers (one VM sees every request), queue bounds
//! (nothing is dropped), and the batch's trip (it arrives at the tick that sends it).

use prewarm_core::wire::{ServedRecord, Signal, SignalBatch, MAX_SERVED_PER_BATCH};
use prewarm_core::{parse_request, Endpoint};
use prewarm_filter::config::{FilterConfig, SignalsConfig};
use prewarm_filter::host::memory::MemoryHost;
use prewarm_filter::request::served_record;
use prewarm_filter::request::success::SuccessWatch;
use prewarm_filter::signals::observe::{fold_tally, observe, Observation};
use prewarm_filter::worker::Worker;

use super::super::policy::RequestCtx;

/// The answer podsim gives a request: complete at the `max_tokens` it asked for.
const ANSWER: &[u8] =
    br#"{"object":"text_completion","choices":[{"index":0,"finish_reason":"length"}]}"#;

/// One filter VM; see the module docs.
#[derive(Debug)]
pub struct FilterVm {
    host: MemoryHost,
    worker: Worker,
    queued: Vec<Signal>,
    served: Vec<ServedRecord>,
    next_tick_ms: u64,
}

impl FilterVm {
    /// A VM with the filter's defaults, `base_model` named a base model (never pinned).
    pub fn new(base_model: &str) -> Self {
        let config = FilterConfig {
            signals: SignalsConfig {
                base_models: vec![base_model.to_string()],
                ..SignalsConfig::default()
            },
            ..FilterConfig::default()
        };
        Self {
            host: MemoryHost::new(),
            worker: Worker::new(config),
            queued: Vec::new(),
            served: Vec::new(),
            next_tick_ms: 0,
        }
    }

    /// When the VM's next tick is due, ms.
    pub fn next_tick_ms(&self) -> u64 {
        self.next_tick_ms
    }

    /// The filter's request path for `r` at `now_ms`, before it is routed.
    pub fn observe(&mut self, r: &RequestCtx<'_>, now_ms: u64) {
        self.host.set_now(now_ms);
        let config = &self.worker.config;
        let body = serde_json::json!({
            "model": r.model,
            "prompt": r.canonical,
            "max_tokens": r.max_tokens,
        });
        let Ok(body) = serde_json::to_vec(&body) else {
            return;
        };
        let Ok(request) =
            parse_request(Endpoint::Completions, &body, config.requests.max_body_bytes)
        else {
            return;
        };
        let sketched = prewarm_core::tokens::truncate_to_tokens(
            r.canonical,
            config.requests.max_prefix_tokens,
        );
        let observed = observe(
            &self.host,
            config,
            &self.worker.keys,
            (&self.worker.tally, &self.worker.prompts),
            Observation {
                endpoint: request.endpoint,
                model: &request.model,
                tenant: r.tenant,
                user: r.user,
                canonical: r.canonical,
                chain: r.chain,
                request: &request,
                sketched,
                arm: Default::default(),
            },
        );
        self.queued.extend(observed.prefill);
        if let Some(prefix) = observed.adopted {
            let mut watch = SuccessWatch::new(&request.model, prefix, request.max_tokens.is_some());
            self.host.set_response(&[(":status", b"200")], ANSWER);
            watch.on_headers(&self.host);
            watch.on_body(&self.host, &self.worker, ANSWER.len(), true);
        }
    }

    /// `r` was routed to `pod` by the table (`routed`), or by Envoy's fallback.
    pub fn routed(&mut self, r: &RequestCtx<'_>, pod: &str, routed: bool) {
        if !routed {
            return;
        }
        self.served
            .extend(served_record(&self.worker, pod, r.model, r.chain));
    }

    /// The tick due by `now_ms`, if any: it folds the tallies, and what it sends goes out as
    /// batches of at most [`MAX_SERVED_PER_BATCH`] served records (none when there is nothing).
    pub fn tick(&mut self, now_ms: u64) -> Vec<SignalBatch> {
        if now_ms < self.next_tick_ms {
            return Vec::new();
        }
        let period = self.worker.config.gateway.tick_period_ms.max(1);
        self.host.set_now(now_ms);
        let tallied = self.worker.tally.take();
        let signals = fold_tally(
            &self.host,
            &self.worker.config,
            &self.worker.keys,
            tallied,
            &self.worker.prompts,
        );
        self.queued.extend(signals);
        self.next_tick_ms = (now_ms / period + 1) * period;
        let mut signals = std::mem::take(&mut self.queued);
        let mut served = std::mem::take(&mut self.served).into_iter().peekable();
        let mut batches = Vec::new();
        while !signals.is_empty() || served.peek().is_some() {
            let source = self.worker.config.gateway.source.clone();
            let mut batch = SignalBatch::new(source, now_ms, std::mem::take(&mut signals));
            batch.served = served.by_ref().take(MAX_SERVED_PER_BATCH).collect();
            batches.push(batch);
        }
        batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::wire::PatternState;
    use prewarm_core::{BlockChain, FingerprintConfig};
    use prewarm_gateway::policy::Tier;

    /// Sends `canonical` as `user` at `now_ms` (routed by the table to `pod-0`), then runs the
    /// tick due; returns the prefill states and served records the tick sent.
    fn send(
        vm: &mut FilterVm,
        user: &str,
        canonical: &str,
        now_ms: u64,
    ) -> (Vec<PatternState>, usize) {
        let chain = BlockChain::of("m", canonical.as_bytes(), &FingerprintConfig::default());
        let r = RequestCtx {
            index: 0,
            now_s: now_ms as f64 / 1000.0,
            model: "m",
            adapter: None,
            tenant: None,
            tier: Tier::default(),
            user: Some(user),
            canonical,
            chain: &chain,
            max_tokens: 8,
        };
        vm.observe(&r, now_ms);
        vm.routed(&r, "pod-0", true);
        let batches = vm.tick(now_ms);
        let states = batches
            .iter()
            .flat_map(|b| &b.signals)
            .filter_map(|s| match s {
                Signal::Prefill(p) => Some(p.state),
                _ => None,
            })
            .collect();
        (states, batches.iter().map(|b| b.served.len()).sum())
    }

    #[test]
    fn a_template_of_one_shot_users_is_signalled_by_a_tick_not_by_a_request() {
        let mut vm = FilterVm::new("base");
        let system = "You are the billing assistant. Cite the policy. ".repeat(60);
        let mut fired = Vec::new();
        for i in 0..8u64 {
            let prompt = format!("{system}\nquestion {i}: where is my invoice?");
            let (states, served) = send(&mut vm, &format!("user-{i}"), &prompt, 10_000 + i * 1_000);
            assert_eq!(
                served, 1,
                "each routed request's record goes out with its tick"
            );
            if !states.is_empty() {
                fired.push((i, states));
            }
        }
        // the filter's rule (`triggers.shared_prompts`, 3 by default) decides on a tick: the
        // tick after the third request, and once (a window passes before it says it again)
        assert_eq!(fired, vec![(2, vec![PatternState::New])]);
    }

    #[test]
    fn a_request_the_table_did_not_route_sends_no_served_record() {
        let mut vm = FilterVm::new("base");
        let text = "a prompt long enough to fill a block ".repeat(20);
        let chain = BlockChain::of("base", text.as_bytes(), &FingerprintConfig::default());
        let r = RequestCtx {
            index: 0,
            now_s: 1.0,
            model: "base",
            adapter: None,
            tenant: None,
            tier: Tier::default(),
            user: None,
            canonical: &text,
            chain: &chain,
            max_tokens: 8,
        };
        vm.observe(&r, 1_000);
        vm.routed(&r, "pod-0", false);
        assert!(vm.tick(1_000).is_empty());
    }
}
