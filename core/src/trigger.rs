//! Trigger rules: pure functions from observed state to decisions.
//!
//! - *prefill*: one user sends `similar_prompts` (default 3) consecutive prompts whose estimated
//!   Jaccard similarity with the previous one (over their first shard, `similarity`) is at least
//!   `similarity_threshold` (default 0.85):
//!   the template they share is hot. The decision carries the common block prefix of those
//!   prompts — the template, not the whole prompt. It fires once per streak.
//! - *pin*: an adapter seen at `pin_rate_per_minute` (default 5) requests a minute or more is
//!   kept resident.
//! - *shared prefix* ([`shared`]): a prefix many requests share — whoever sends them, with a
//!   user or without — is hot when a proxy sees it `shared_prompts` times (default: the
//!   streak's `similar_prompts`) within one rate window; re-signalled once a window while hot.
//! - *priority*: `floor(100 · r / (r + priority_half_rate))`, capped at 99, for a rate `r` in
//!   requests a minute: 0 at rest, 50 at `priority_half_rate` (default 20/min), approaching 99
//!   as the rate grows; monotone in `r`.

pub mod shared;

use serde::{Deserialize, Serialize};

use crate::fingerprint::{blocks_to_tokens, common_prefix_len, BlockHash, FingerprintConfig};
use crate::request::{Endpoint, InferenceRequest};
use crate::similarity::Sketch;
use crate::tokens::truncate_to_tokens;
use crate::warm_shape::WarmShape;
use crate::wire::{PatternState, PrefillSignal};

/// The thresholds of the trigger rules.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TriggerConfig {
    /// Minimum estimated Jaccard similarity between consecutive prompts of a user (default 0.85).
    pub similarity_threshold: f64,
    /// Consecutive similar prompts that make a template hot (default 3).
    pub similar_prompts: u32,
    /// Requests a minute at which an adapter is pinned (default 5).
    pub pin_rate_per_minute: f64,
    /// Rate in requests a minute at which priority reaches 50 (default 20).
    pub priority_half_rate: f64,
    /// Requests of one prefix, from any users, within one rate window that make it hot
    /// (default `None`: `similar_prompts`, the evidence a user's streak needs; see [`shared`]).
    pub shared_prompts: Option<u32>,
}

impl Default for TriggerConfig {
    fn default() -> Self {
        Self {
            similarity_threshold: 0.85,
            similar_prompts: 3,
            pin_rate_per_minute: 5.0,
            priority_half_rate: 20.0,
            shared_prompts: None,
        }
    }
}

impl TriggerConfig {
    /// Every problem, as `field: value: rule`, with `prefix` before each field name.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Vec::new();
        if !(self.similarity_threshold > 0.0 && self.similarity_threshold <= 1.0) {
            p.push(format!(
                "{prefix}similarity_threshold: {}: must be in (0, 1]",
                self.similarity_threshold
            ));
        }
        if !(2..=100).contains(&self.similar_prompts) {
            p.push(format!(
                "{prefix}similar_prompts: {}: must be between 2 and 100",
                self.similar_prompts
            ));
        }
        if !(self.pin_rate_per_minute > 0.0 && self.pin_rate_per_minute.is_finite()) {
            p.push(format!(
                "{prefix}pin_rate_per_minute: {}: must be a positive number",
                self.pin_rate_per_minute
            ));
        }
        if !(self.priority_half_rate > 0.0 && self.priority_half_rate.is_finite()) {
            p.push(format!(
                "{prefix}priority_half_rate: {}: must be a positive number",
                self.priority_half_rate
            ));
        }
        if let Some(n) = self.shared_prompts.filter(|n| !(2..=100_000).contains(n)) {
            p.push(format!(
                "{prefix}shared_prompts: {n}: must be between 2 and 100000, or null"
            ));
        }
        p
    }

    /// Requests within one rate window that make a shared prefix hot: `shared_prompts`, else
    /// `similar_prompts`.
    pub fn shared_prompt_threshold(&self) -> u32 {
        self.shared_prompts.unwrap_or(self.similar_prompts)
    }
}

/// What the filter remembers of one user's recent prompts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UserPattern {
    /// Sketch of the user's last prompt.
    pub sketch: Sketch,
    /// Consecutive similar prompts so far, the last one included.
    pub streak: u32,
    /// The block prefix those prompts share.
    pub common: Vec<BlockHash>,
}

/// A template became hot: prefill its common prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillDecision {
    /// The shared block prefix (non-empty).
    pub prefix: Vec<BlockHash>,
}

/// The request a prefill decision came from, as its signal needs it.
#[derive(Debug, Clone, Copy)]
pub struct PromptOrigin<'a> {
    pub model: &'a str,
    pub tenant: Option<&'a str>,
    pub endpoint: Endpoint,
    /// The request's canonical prompt; the signal carries the part its prefix covers.
    pub canonical: &'a str,
    /// The request itself, whose shape the signal carries (`None`: no shape).
    pub request: Option<&'a InferenceRequest>,
}

impl PrefillDecision {
    /// The signal this decision becomes: the prefix's hashes, the tokens and canonical text they
    /// cover, the shape of its traffic over that text, whether the pattern was signalled
    /// before, and the priority of its rate. A request past a shape's bounds gives a signal
    /// without one (the caller counts it: [`PrefillSignal::shape`] is `None` while
    /// [`shape_expected`] holds).
    pub fn into_signal(
        self,
        origin: PromptOrigin<'_>,
        fingerprint: &FingerprintConfig,
        signalled_before: bool,
        rate_per_minute: f64,
        config: &TriggerConfig,
    ) -> PrefillSignal {
        let (tokens, prefix_text, shape) =
            prefix_text_and_shape(&origin, &self.prefix, fingerprint);
        PrefillSignal {
            model: origin.model.to_string(),
            tenant: origin.tenant.map(str::to_string),
            endpoint: origin.endpoint,
            prefix_tokens: tokens,
            prefix_text: prefix_text.to_string(),
            shape,
            prefix: self.prefix,
            state: if signalled_before {
                PatternState::Known
            } else {
                PatternState::New
            },
            priority: priority(rate_per_minute, config),
            keep_warm: true,
        }
    }
}

/// The tokens, canonical text and shape of `prefix` (a block prefix of `origin`'s prompt), as a
/// signal of it carries them: the text cut to the prefix's tokens, the shape of the request over
/// that text (`None` for a request past a shape's bounds, see [`shape_expected`]).
pub fn prefix_text_and_shape<'a>(
    origin: &PromptOrigin<'a>,
    prefix: &[BlockHash],
    fingerprint: &FingerprintConfig,
) -> (usize, &'a str, Option<WarmShape>) {
    let tokens = blocks_to_tokens(prefix.len(), fingerprint);
    let text = truncate_to_tokens(origin.canonical, tokens);
    let shape = origin
        .request
        .and_then(|r| WarmShape::of(r, text.len()).ok().flatten());
    (tokens, text, shape)
}

/// Whether a signal of `request`'s prefix should carry a shape: a chat request, or one with
/// tools, kwargs or a salt.
pub fn shape_expected(request: &InferenceRequest) -> bool {
    request.endpoint == Endpoint::ChatCompletions || !request.extras.is_empty()
}

/// Feeds one prompt of a user into its pattern state; returns the new state and, when this
/// prompt completes a streak, the prefill decision.
pub fn observe_prompt(
    previous: Option<&UserPattern>,
    sketch: Sketch,
    blocks: &[BlockHash],
    config: &TriggerConfig,
) -> (UserPattern, Option<PrefillDecision>) {
    let continues = previous
        .filter(|p| p.streak > 0 && sketch.jaccard(&p.sketch) >= config.similarity_threshold);
    let state = match continues {
        Some(p) => {
            let n = common_prefix_len(&p.common, blocks);
            UserPattern {
                sketch,
                streak: p.streak.saturating_add(1),
                common: p.common.get(..n).unwrap_or(&[]).to_vec(),
            }
        }
        None => UserPattern {
            sketch,
            streak: 1,
            common: blocks.to_vec(),
        },
    };
    let decision =
        (state.streak == config.similar_prompts && !state.common.is_empty()).then(|| {
            PrefillDecision {
                prefix: state.common.clone(),
            }
        });
    (state, decision)
}

/// Whether an adapter at `rate_per_minute` should be pinned.
pub fn should_pin(rate_per_minute: f64, config: &TriggerConfig) -> bool {
    rate_per_minute >= config.pin_rate_per_minute
}

/// Priority in [0, 100) for a rate in requests a minute; see the module docs.
pub fn priority(rate_per_minute: f64, config: &TriggerConfig) -> u8 {
    if rate_per_minute.is_nan() || rate_per_minute <= 0.0 {
        return 0;
    }
    if rate_per_minute.is_infinite() {
        return 99;
    }
    let half = config.priority_half_rate.max(f64::MIN_POSITIVE);
    let p = (100.0 * rate_per_minute / (rate_per_minute + half)).floor();
    if p >= 99.0 {
        99
    } else if p > 0.0 {
        p as u8
    } else {
        0
    }
}

impl UserPattern {
    /// Encoding for the filter's shared data: streak, common length, common hashes, sketch.
    pub fn to_bytes(&self) -> Vec<u8> {
        let hashes = self.sketch.hashes();
        let mut out = Vec::with_capacity(8 + 8 * (self.common.len() + hashes.len()));
        out.extend_from_slice(&self.streak.to_le_bytes());
        out.extend_from_slice(&(self.common.len() as u32).to_le_bytes());
        for h in &self.common {
            out.extend_from_slice(&h.0.to_le_bytes());
        }
        out.extend_from_slice(&self.sketch.to_bytes());
        out
    }

    /// Reads [`to_bytes`](Self::to_bytes); `None` for bytes that are not one (an empty shared
    /// data value, another version's layout).
    pub fn from_bytes(bytes: &[u8], sketch_size: usize) -> Option<Self> {
        let word = |at: usize| -> Option<u32> {
            let b = bytes.get(at..at.checked_add(4)?)?;
            Some(u32::from_le_bytes([
                b.first().copied()?,
                *b.get(1)?,
                *b.get(2)?,
                *b.get(3)?,
            ]))
        };
        let streak = word(0)?;
        let n = usize::try_from(word(4)?).ok()?;
        let end = n.checked_mul(8)?.checked_add(8)?;
        let common_bytes = bytes.get(8..end)?;
        let common = common_bytes
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                BlockHash(u64::from_le_bytes(b))
            })
            .collect();
        let sketch = Sketch::from_bytes(bytes.get(end..)?, sketch_size);
        Some(Self {
            sketch,
            streak,
            common,
        })
    }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use crate::fingerprint::{BlockChain, FingerprintConfig};
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn template(slot: &str) -> String {
        let mut s = String::from("You are a support agent for ACME. Follow the policy. ");
        for i in 0..200 {
            s.push_str(&format!("rule {i} says be precise and kind. "));
        }
        s.push_str("Customer question: ");
        s.push_str(slot);
        s
    }

    fn feed(state: Option<&UserPattern>, text: &str) -> (UserPattern, Option<PrefillDecision>) {
        let cfg = TriggerConfig::default();
        let chain = BlockChain::of("m", text.as_bytes(), &FingerprintConfig::default());
        observe_prompt(state, Sketch::of(text, 64), &chain.blocks, &cfg)
    }

    #[test]
    fn third_similar_prompt_fires_once_with_the_common_prefix() {
        let (s1, d1) = feed(None, &template("where is my order 1"));
        let (s2, d2) = feed(Some(&s1), &template("can I get a refund for order 2"));
        let (s3, d3) = feed(Some(&s2), &template("what is the status of 3"));
        let (_, d4) = feed(Some(&s3), &template("cancel 4 please"));
        assert!(d1.is_none() && d2.is_none() && d4.is_none());
        let d3 = d3.expect("third similar prompt fires");
        let full = BlockChain::of("m", template("x").as_bytes(), &FingerprintConfig::default());
        // the template's blocks before the varying slot, and not the whole prompt
        assert!(!d3.prefix.is_empty());
        assert!(d3.prefix.len() < full.blocks.len() + 1);
        assert_eq!(&full.blocks[..d3.prefix.len()], &d3.prefix[..]);
    }

    #[test]
    fn a_decision_becomes_a_signal_with_the_prefix_text() {
        let canonical = "x".repeat(1000);
        let d = PrefillDecision {
            prefix: vec![BlockHash(1), BlockHash(2)],
        };
        let origin = PromptOrigin {
            model: "m",
            tenant: Some("t"),
            endpoint: Endpoint::ChatCompletions,
            canonical: &canonical,
            request: None,
        };
        let c = TriggerConfig::default();
        let s = d.into_signal(origin, &FingerprintConfig::default(), true, 20.0, &c);
        assert_eq!(s.prefix_tokens, 128);
        assert_eq!(s.prefix_text.len(), 512);
        assert_eq!(s.state, PatternState::Known);
        assert_eq!(s.priority, 50);
        assert_eq!(s.tenant.as_deref(), Some("t"));
    }

    #[test]
    fn a_chat_decision_carries_the_shape_of_its_request_over_the_prefix_text() {
        let system = "Answer as the billing assistant. ".repeat(40);
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"q"}}],"cache_salt":"k"}}"#
        );
        let request =
            crate::parse_request(Endpoint::ChatCompletions, body.as_bytes(), 1 << 20).unwrap();
        let canonical = crate::canonical_prompt(&request);
        let d = PrefillDecision {
            prefix: vec![BlockHash(1), BlockHash(2)],
        };
        let origin = PromptOrigin {
            model: "m",
            tenant: None,
            endpoint: Endpoint::ChatCompletions,
            canonical: &canonical,
            request: Some(&request),
        };
        let c = TriggerConfig::default();
        let s = d.into_signal(origin, &FingerprintConfig::default(), false, 1.0, &c);
        let shape = s.shape.expect("a chat request's signal has a shape");
        assert_eq!(shape.messages.len(), 1);
        assert_eq!(shape.cache_salt.as_deref(), Some("k"));
        shape.check(&s.prefix_text).unwrap();
        assert!(shape_expected(&request));
    }

    #[test]
    fn a_dissimilar_prompt_resets_the_streak() {
        let (s1, _) = feed(None, &template("a"));
        let (s2, _) = feed(Some(&s1), &template("b"));
        let (s3, d3) = feed(
            Some(&s2),
            "completely different words about weather and gardens and nothing else at all",
        );
        assert!(d3.is_none());
        assert_eq!(s3.streak, 1);
    }

    #[test]
    fn pin_threshold_and_priority() {
        let c = TriggerConfig::default();
        assert!(!should_pin(4.9, &c));
        assert!(should_pin(5.0, &c));
        assert_eq!(priority(0.0, &c), 0);
        assert_eq!(priority(f64::NAN, &c), 0);
        assert_eq!(priority(20.0, &c), 50);
        assert_eq!(priority(1e12, &c), 99);
        assert_eq!(priority(f64::INFINITY, &c), 99);
    }

    #[test]
    fn validation_names_fields() {
        let bad = TriggerConfig {
            similarity_threshold: 1.5,
            similar_prompts: 1,
            pin_rate_per_minute: -1.0,
            priority_half_rate: 0.0,
            shared_prompts: Some(1),
        };
        let p = bad.validate("triggers.");
        assert_eq!(p.len(), 5);
        assert!(p[0].starts_with("triggers.similarity_threshold: 1.5:"));
        assert!(p[4].starts_with("triggers.shared_prompts: 1:"));
    }

    #[test]
    fn pattern_bytes_round_trip() {
        let (s, _) = feed(None, &template("q"));
        assert_eq!(UserPattern::from_bytes(&s.to_bytes(), 64), Some(s));
        assert_eq!(UserPattern::from_bytes(&[], 64), None);
        assert_eq!(
            UserPattern::from_bytes(&[1, 0, 0, 0, 255, 255, 255, 255], 64),
            None
        );
    }

    proptest! {
        #[test]
        fn priority_is_monotone_and_bounded(a in 0.0f64..1e6, b in 0.0f64..1e6) {
            let c = TriggerConfig::default();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(priority(lo, &c) <= priority(hi, &c));
            prop_assert!(priority(hi, &c) < 100);
        }

        #[test]
        fn pattern_decoding_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = UserPattern::from_bytes(&bytes, 64);
        }
    }
}
