//! The cross-user trigger: a prefix many requests share is hot whoever sends it, with a user or
//! without one (an application's system prompt and tools sent once by each of many end users).
//!
//! - **Group.** Requests are grouped by their routing key (the chain hash ending their first
//!   512-token shard, or their last full block when shorter; seeded by the model, so a key is
//!   per model): every request of a group shares at least those blocks. A prompt without a full
//!   block is not counted. A worker keeps per group ([`PromptGroup`]) the requests since its
//!   last fold and the block prefix all the requests it saw share; from the group's *second*
//!   request on, the canonical text of that prefix and its warm shape — so a prompt seen once
//!   never costs a copy of its text. The text and shape are taken again from the current
//!   request only when the common prefix shrinks.
//! - **Rule** ([`count_shared_prompt`]). Each fold adds the group's requests to the proxy's
//!   rate window of the key. The prefix is hot when that window holds at least
//!   `shared_prompts` requests (default `similar_prompts`, 3): across all users, the same
//!   evidence a user's streak needs, so a double submit or one retry is not a template. A hot
//!   prefix not signalled within the last window is signalled — `new` the first time, `known`
//!   after — so a prefix that stays hot is signalled once a window, keeping the gateway's
//!   decaying hotness at the rate its traffic sustains. Only a worker holding the group's text
//!   signals it; a fold without text counts its requests and leaves the signal to the next one.
//! - **Signal** ([`shared_prefix_signal`]): the group's common prefix with its text and shape,
//!   the priority of the window's rate.
//!
//! Why the threshold holds: a warm prefill of the prefix costs its tokens once, and pays back
//! as soon as one later request finds it cached. At 3 requests a window (a minute by default)
//! the next request is expected within ~20 s, far inside the time a pod keeps a prefix cached
//! (the routing index's horizon, ~22 min for a Llama 8B H100 pod), so the rule asks for more
//! evidence than the engine's break-even and no less than a streak. What it assumes: the count
//! is per proxy (shared data is per Envoy), so with E proxies splitting traffic evenly a prefix
//! is hot at E × `shared_prompts` requests a window in all; and a session's own turns share
//! their conversation's first shard, so a user repeating a conversation three times a window
//! makes it hot too (as its streak would).

use crate::fingerprint::{blocks_to_tokens, common_prefix_len, BlockHash, FingerprintConfig};
use crate::rate::RateWindow;
use crate::request::Endpoint;
use crate::warm_shape::WarmShape;
use crate::wire::{PatternState, PrefillSignal};

use super::{prefix_text_and_shape, priority, shape_expected, PromptOrigin, TriggerConfig};

/// Bytes a group costs beyond its model, hashes, text and shape (its map entry, its fields).
pub const GROUP_OVERHEAD_BYTES: usize = 128;

/// Most routing keys one worker tallies (the filter's VM, the evaluator's stand-in); the least
/// recently seen go first beyond.
pub const MAX_GROUPS: usize = 2048;

/// What one worker keeps of the requests sharing one routing key. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptGroup {
    model: String,
    /// The block prefix every request of the group seen here shares.
    common: Vec<BlockHash>,
    /// From the second request on.
    text: Option<GroupText>,
    /// Requests since the last fold.
    requests: u32,
    /// Whether any of those came from an arm that keeps its prefixes warm.
    keep_warm: bool,
    /// Until when a fold takes the group even without new requests (a rate window after its
    /// last one), so a worker holding its text signals it when another worker's requests made
    /// it hot: with several workers a group's requests split among them, and the worker whose
    /// fold crosses the threshold may hold no text.
    recheck_until_ms: u64,
    /// `keep_warm` of the last fold that had requests (what a recheck signals with).
    last_keep_warm: bool,
}

/// The part of a group copied from a request: the common prefix's text and shape, and the
/// request's tenant and endpoint.
#[derive(Debug, Clone, PartialEq)]
struct GroupText {
    text: String,
    shape: Option<WarmShape>,
    /// The request should have had a shape and was past its bounds.
    unshaped: bool,
    tenant: Option<String>,
    endpoint: Endpoint,
}

/// The requests a fold takes from a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupFold {
    pub requests: u32,
    pub keep_warm: bool,
}

impl PromptGroup {
    /// A group's first request: its model and its (fingerprinted) blocks; no text.
    pub fn first(origin: &PromptOrigin<'_>, blocks: &[BlockHash], keep_warm: bool) -> Self {
        Self {
            model: origin.model.to_string(),
            common: blocks.to_vec(),
            text: None,
            requests: 1,
            keep_warm,
            recheck_until_ms: 0,
            last_keep_warm: keep_warm,
        }
    }

    /// Whether the group is `model`'s (a routing key is seeded by its model; a different model
    /// under the same key is a hash collision).
    pub fn is_for(&self, model: &str) -> bool {
        self.model == model
    }

    /// Adds a later request; returns whether its text was copied (the group had none, or the
    /// common prefix shrank).
    pub fn add(
        &mut self,
        origin: &PromptOrigin<'_>,
        blocks: &[BlockHash],
        keep_warm: bool,
        fingerprint: &FingerprintConfig,
    ) -> bool {
        self.requests = self.requests.saturating_add(1);
        self.keep_warm |= keep_warm;
        let n = common_prefix_len(&self.common, blocks);
        let shrank = n < self.common.len();
        if shrank {
            self.common.truncate(n);
            self.common.shrink_to_fit();
        }
        if self.text.is_some() && !shrank {
            return false;
        }
        let (_, text, shape) = prefix_text_and_shape(origin, &self.common, fingerprint);
        let unshaped = shape.is_none() && origin.request.is_some_and(shape_expected);
        self.text = Some(GroupText {
            text: text.to_string(),
            shape,
            unshaped,
            tenant: origin.tenant.map(str::to_string),
            endpoint: origin.endpoint,
        });
        true
    }

    /// Takes the requests since the last fold; with none, a fold of zero requests while the
    /// group holds its text and is within a rate window of its last request (`None` otherwise).
    pub fn take_fold(&mut self, now_ms: u64, window_ms: u64) -> Option<GroupFold> {
        if self.requests == 0 {
            // no requests of its own: taken again while another worker's may make it hot
            return (self.can_signal() && now_ms < self.recheck_until_ms).then_some(GroupFold {
                requests: 0,
                keep_warm: self.last_keep_warm,
            });
        }
        let fold = GroupFold {
            requests: self.requests,
            keep_warm: self.keep_warm,
        };
        self.requests = 0;
        self.keep_warm = false;
        self.last_keep_warm = fold.keep_warm;
        self.recheck_until_ms = now_ms.saturating_add(window_ms);
        Some(fold)
    }

    /// Whether a signal can be made of the group: it has its text and a common prefix.
    pub fn can_signal(&self) -> bool {
        self.text.is_some() && !self.common.is_empty()
    }

    /// Whether the group's request should have given its signal a shape and did not.
    pub fn unshaped(&self) -> bool {
        self.text.as_ref().is_some_and(|t| t.unshaped)
    }

    /// The common block prefix.
    pub fn common(&self) -> &[BlockHash] {
        &self.common
    }

    /// Bytes of copied text (0 until the second request).
    pub fn text_bytes(&self) -> usize {
        self.text.as_ref().map_or(0, |t| t.text.len())
    }

    /// Bytes the group holds, for a worker's bound.
    pub fn bytes(&self) -> usize {
        let copied = self.text.as_ref().map_or(0, |t| {
            t.text
                .len()
                .saturating_add(t.shape.as_ref().map_or(0, WarmShape::bytes))
                .saturating_add(t.tenant.as_ref().map_or(0, String::len))
        });
        GROUP_OVERHEAD_BYTES
            .saturating_add(self.model.len())
            .saturating_add(self.common.len().saturating_mul(8))
            .saturating_add(copied)
    }
}

/// What a proxy keeps of one routing key across its workers: its requests' rate window and
/// when it was last signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPromptState {
    pub window: RateWindow,
    /// When the prefix was last signalled, ms since the epoch (`None`: never).
    pub signalled_at_ms: Option<u64>,
}

impl SharedPromptState {
    /// A key never seen, with a window of `window_ms`.
    pub fn new(window_ms: u64) -> Self {
        Self {
            window: RateWindow::new(window_ms),
            signalled_at_ms: None,
        }
    }
}

/// A shared prefix to signal now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedPromptHot {
    /// It was signalled before (the signal's state is `known`).
    pub signalled_before: bool,
    /// Its requests a minute over the window.
    pub rate_per_minute: f64,
}

/// Counts one fold's `requests` of a routing key at `now_ms`; `Some` when the prefix is to be
/// signalled now: the window holds at least [`TriggerConfig::shared_prompt_threshold`]
/// requests and it was not signalled within the last window (a time ahead of `now_ms`, a
/// clock stepped back, counts as long ago). `can_signal` false (the folding worker has no text
/// for it) counts the requests and leaves the signal to a later fold.
pub fn count_shared_prompt(
    state: &mut SharedPromptState,
    requests: u32,
    now_ms: u64,
    can_signal: bool,
    config: &TriggerConfig,
) -> Option<SharedPromptHot> {
    state.window.record(now_ms, requests);
    let hot = state.window.count(now_ms) >= u64::from(config.shared_prompt_threshold());
    let window = state.window.window_ms();
    let recent = state
        .signalled_at_ms
        .is_some_and(|t| t <= now_ms && now_ms - t < window);
    if !hot || recent || !can_signal {
        return None;
    }
    let signalled_before = state.signalled_at_ms.is_some();
    state.signalled_at_ms = Some(now_ms);
    Some(SharedPromptHot {
        signalled_before,
        rate_per_minute: state.window.per_minute(now_ms),
    })
}

/// The prefill signal of a hot group: its common prefix, the text and shape copied with it, the
/// tenant and endpoint of the request they came from, `keep_warm` of the fold's requests, the
/// priority of the rate. `None` when the group cannot be signalled ([`PromptGroup::can_signal`]).
pub fn shared_prefix_signal(
    group: &PromptGroup,
    hot: SharedPromptHot,
    keep_warm: bool,
    fingerprint: &FingerprintConfig,
    config: &TriggerConfig,
) -> Option<PrefillSignal> {
    let copied = group.text.as_ref()?;
    if group.common.is_empty() {
        return None;
    }
    Some(PrefillSignal {
        model: group.model.clone(),
        tenant: copied.tenant.clone(),
        endpoint: copied.endpoint,
        prefix: group.common.clone(),
        prefix_tokens: blocks_to_tokens(group.common.len(), fingerprint),
        prefix_text: copied.text.clone(),
        shape: copied.shape.clone(),
        state: if hot.signalled_before {
            PatternState::Known
        } else {
            PatternState::New
        },
        priority: priority(hot.rate_per_minute, config),
        keep_warm,
    })
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use crate::canonical_prompt;
    use crate::fingerprint::BlockChain;
    use crate::request::{parse_request, InferenceRequest};
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const MINUTE: u64 = 60_000;

    fn system() -> String {
        (0..120)
            .map(|i| format!("Policy {i}: answer billing questions precisely."))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn chat(system: &str, question: &str) -> InferenceRequest {
        let body = serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "tools": [{"type": "function", "function": {"name": "invoice"}}],
        });
        parse_request(
            Endpoint::ChatCompletions,
            &serde_json::to_vec(&body).unwrap(),
            1 << 20,
        )
        .unwrap()
    }

    /// Feeds `request` into `group` (creating it), as a worker does.
    fn feed(group: &mut Option<PromptGroup>, request: &InferenceRequest, keep_warm: bool) -> bool {
        let fp = FingerprintConfig::default();
        let canonical = canonical_prompt(request);
        let chain = BlockChain::of(&request.model, canonical.as_bytes(), &fp);
        let origin = PromptOrigin {
            model: &request.model,
            tenant: Some("acme"),
            endpoint: request.endpoint,
            canonical: &canonical,
            request: Some(request),
        };
        match group {
            Some(g) => g.add(&origin, &chain.blocks, keep_warm, &fp),
            None => {
                *group = Some(PromptGroup::first(&origin, &chain.blocks, keep_warm));
                false
            }
        }
    }

    #[test]
    fn the_threshold_is_a_streaks_evidence_unless_configured() {
        let mut c = TriggerConfig::default();
        assert_eq!(c.shared_prompt_threshold(), 3);
        c.similar_prompts = 5;
        assert_eq!(c.shared_prompt_threshold(), 5);
        c.shared_prompts = Some(8);
        assert_eq!(c.shared_prompt_threshold(), 8);
        assert!(c.validate("").is_empty());
    }

    #[test]
    fn hot_at_the_threshold_then_once_a_window_while_it_stays_hot() {
        let c = TriggerConfig::default();
        let mut s = SharedPromptState::new(MINUTE);
        let t0 = 10 * MINUTE;
        assert_eq!(count_shared_prompt(&mut s, 1, t0, true, &c), None);
        assert_eq!(count_shared_prompt(&mut s, 1, t0 + 1_000, true, &c), None);
        let hot = count_shared_prompt(&mut s, 1, t0 + 2_000, true, &c).expect("third request");
        assert!(!hot.signalled_before);
        assert_eq!(hot.rate_per_minute, 3.0);
        // still hot, but signalled within the window
        for i in 3..20 {
            assert_eq!(
                count_shared_prompt(&mut s, 2, t0 + i * 2_000, true, &c),
                None
            );
        }
        // a window after the signal, still hot: signalled again, known
        let again = count_shared_prompt(&mut s, 2, t0 + 2_000 + MINUTE, true, &c).unwrap();
        assert!(again.signalled_before);
        assert!(again.rate_per_minute >= 3.0);
    }

    #[test]
    fn a_prefix_that_cooled_is_not_signalled_again() {
        let c = TriggerConfig::default();
        let mut s = SharedPromptState::new(MINUTE);
        assert!(count_shared_prompt(&mut s, 3, MINUTE, true, &c).is_some());
        // two requests in the next window: below the threshold
        assert_eq!(count_shared_prompt(&mut s, 2, 3 * MINUTE, true, &c), None);
        assert!(count_shared_prompt(&mut s, 1, 3 * MINUTE + 1, true, &c).is_some());
    }

    #[test]
    fn a_fold_without_text_counts_and_leaves_the_signal_to_one_with_text() {
        let c = TriggerConfig::default();
        let mut s = SharedPromptState::new(MINUTE);
        assert_eq!(count_shared_prompt(&mut s, 3, MINUTE, false, &c), None);
        assert_eq!(s.signalled_at_ms, None);
        let hot = count_shared_prompt(&mut s, 1, MINUTE + 1_000, true, &c).unwrap();
        assert!(!hot.signalled_before, "first signal is new");
    }

    #[test]
    fn a_clock_stepped_back_does_not_silence_a_prefix() {
        let c = TriggerConfig::default();
        let mut s = SharedPromptState::new(MINUTE);
        s.signalled_at_ms = Some(100 * MINUTE);
        assert!(count_shared_prompt(&mut s, 3, 10 * MINUTE, true, &c).is_some());
    }

    #[test]
    fn the_first_request_copies_no_text_the_second_copies_the_common_prefix() {
        let system = system();
        let mut g = None;
        assert!(!feed(
            &mut g,
            &chat(&system, "Why was I charged twice?"),
            true
        ));
        let group = g.as_ref().unwrap();
        assert_eq!(group.text_bytes(), 0);
        assert!(!group.can_signal());
        assert!(feed(
            &mut g,
            &chat(&system, "How do I get a refund?"),
            false
        ));
        assert!(!feed(&mut g, &chat(&system, "Can I pay by card?"), false));
        let group = g.as_mut().unwrap();
        let fp = FingerprintConfig::default();
        let canonical = format!("<|system|>\n{system}\n<|user|>\n");
        let whole = BlockChain::of("m", canonical.as_bytes(), &fp);
        assert_eq!(
            group.common(),
            &whole.blocks[..],
            "the system prompt's full blocks"
        );
        let fold = group.take_fold(1_000, 60_000).unwrap();
        assert_eq!(
            fold,
            GroupFold {
                requests: 3,
                keep_warm: true
            }
        );
        // no new requests: rechecked within the window (another worker's may make it hot),
        // not after it
        let recheck = GroupFold {
            requests: 0,
            keep_warm: true,
        };
        assert_eq!(group.take_fold(2_000, 60_000), Some(recheck));
        assert_eq!(group.take_fold(61_000, 60_000), None);
        let hot = SharedPromptHot {
            signalled_before: false,
            rate_per_minute: 20.0,
        };
        let c = TriggerConfig::default();
        let s = shared_prefix_signal(group, hot, fold.keep_warm, &fp, &c).unwrap();
        assert_eq!(s.prefix, whole.blocks);
        assert_eq!(s.prefix_tokens, whole.blocks.len() * 64);
        assert_eq!(s.prefix_text.len(), s.prefix_tokens * 4);
        assert!(canonical.starts_with(&s.prefix_text));
        assert_eq!(s.tenant.as_deref(), Some("acme"));
        assert_eq!(s.state, PatternState::New);
        assert_eq!(s.priority, 50);
        assert!(s.keep_warm);
        let shape = s.shape.expect("a chat prefix has a shape");
        shape.check(&s.prefix_text).unwrap();
        assert_eq!(shape.messages[0].role, "system");
        assert!(shape.tools.is_some());
        assert!(!group.unshaped());
    }

    #[test]
    fn a_shrinking_common_prefix_takes_its_text_again() {
        let system = system();
        let mut g = None;
        let long_question = format!("{} and more", "details ".repeat(80));
        feed(&mut g, &chat(&system, &long_question), true);
        feed(&mut g, &chat(&system, &long_question), true);
        let before = g.as_ref().unwrap().text_bytes();
        assert!(
            feed(&mut g, &chat(&system, "short"), true),
            "shrank: copied again"
        );
        let group = g.unwrap();
        assert!(group.text_bytes() < before);
        assert_eq!(group.text_bytes(), group.common().len() * 256);
    }

    #[test]
    fn a_group_without_text_makes_no_signal() {
        let mut g = None;
        feed(&mut g, &chat(&system(), "q"), true);
        let hot = SharedPromptHot {
            signalled_before: true,
            rate_per_minute: 1.0,
        };
        let c = TriggerConfig::default();
        let fp = FingerprintConfig::default();
        assert!(shared_prefix_signal(g.as_ref().unwrap(), hot, true, &fp, &c).is_none());
    }

    proptest! {
        /// Whatever requests a group sees, its prefix is the blocks they all share and its
        /// text is exactly what those blocks hash.
        #[test]
        fn the_signal_text_hashes_to_the_common_prefix(
            tails in proptest::collection::vec("[a-z ]{0,900}", 2..6),
        ) {
            let system = system();
            let mut g = None;
            for tail in &tails {
                feed(&mut g, &chat(&system, tail), true);
            }
            let group = g.unwrap();
            let fp = FingerprintConfig::default();
            let chains: Vec<BlockChain> = tails
                .iter()
                .map(|t| BlockChain::of("m", canonical_prompt(&chat(&system, t)).as_bytes(), &fp))
                .collect();
            let shared = chains
                .iter()
                .map(|c| common_prefix_len(&chains[0].blocks, &c.blocks))
                .min()
                .unwrap();
            prop_assert_eq!(group.common(), &chains[0].blocks[..shared]);
            let hot = SharedPromptHot {
                signalled_before: false,
                rate_per_minute: 3.0,
            };
            let config = TriggerConfig::default();
            let s = shared_prefix_signal(&group, hot, true, &fp, &config).unwrap();
            prop_assert_eq!(BlockChain::of("m", s.prefix_text.as_bytes(), &fp).blocks, s.prefix);
        }
    }
}
