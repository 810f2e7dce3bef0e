//! The pool's side of traffic shapes: checked against the text, replaced by the traffic's
//! current one, counted in the pool's bytes, written to snapshots without the salt, and the
//! back-off of an entry whose warm call an engine rejects.

use super::*;
use prewarm_core::fingerprint::BlockChain;
use prewarm_core::warm_shape::MessageSpan;
use prewarm_core::warm_shape::WarmShape;
use prewarm_core::wire::{PatternState, PrefillSignal};
use prewarm_core::{canonical_prompt, parse_request};

const MIN: u64 = 60_000;
pub(crate) const SALT: &str = "tenant-7-9f2c41d0";

fn fp() -> FingerprintConfig {
    FingerprintConfig::default()
}

/// The canonical prefix of a chat request (a long system prompt and a question, cut inside the
/// question, as a filter cuts a prefix at a block boundary) and its traffic's shape.
pub(crate) fn chat_prefix(salt: Option<&str>, tools: &str) -> (String, WarmShape) {
    let system = "You answer questions about the billing API of the shop, briefly. ".repeat(12);
    let mut body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": "What is an invoice, exactly?"}]}]});
    body["tools"] = serde_json::from_str(tools).unwrap();
    if let Some(s) = salt {
        body["cache_salt"] = s.into();
    }
    let r = parse_request(
        Endpoint::ChatCompletions,
        body.to_string().as_bytes(),
        1 << 20,
    )
    .unwrap();
    let canonical = canonical_prompt(&r);
    let text = canonical[..canonical.len() - 6].to_string();
    let shape = WarmShape::of(&r, text.len()).unwrap().unwrap();
    shape.check(&text).unwrap();
    (text, shape)
}

pub(crate) const TOOLS: &str = r#"[{"type":"function","function":{"name":"lookup_invoice"}}]"#;
const MORE_TOOLS: &str = r#"[{"type":"function","function":{"name":"lookup_invoice"}},
    {"type":"function","function":{"name":"refund","parameters":{"type":"object"}}}]"#;

/// A chat prefill signal exactly as the filter builds it.
pub(crate) fn signal(text: &str, shape: Option<WarmShape>) -> PrefillSignal {
    let chain = BlockChain::of("m", text.as_bytes(), &fp());
    PrefillSignal {
        model: "m".into(),
        tenant: None,
        endpoint: Endpoint::ChatCompletions,
        prefix_tokens: chain.blocks.len() * 64,
        prefix: chain.blocks,
        prefix_text: text.into(),
        state: PatternState::New,
        priority: 10,
        keep_warm: true,
        shape,
    }
}

#[test]
fn a_shape_that_does_not_lie_on_the_text_is_refused_naming_the_field() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let (text, shape) = chat_prefix(None, TOOLS);
    let mut wrong_role = shape.clone();
    wrong_role.messages[0].role = "developer".into();
    let e = pool
        .apply_prefill(signal(&text, Some(wrong_role.clone())), 0)
        .unwrap_err();
    assert_eq!(e, PoolError::Shape(ShapeError::OffText(0)));
    assert!(e.to_string().starts_with("shape.messages[0]:"), "{e}");
    assert!(pool.is_empty(), "nothing stored");
    // A known entry keeps the shape it had when a later signal's does not lie on the text.
    let key = pool
        .apply_prefill(signal(&text, Some(shape.clone())), 0)
        .unwrap();
    let mut too_long = shape.clone();
    too_long.messages[1].len += 100;
    let e = pool
        .apply_prefill(signal(&text, Some(too_long)), 0)
        .unwrap_err();
    assert!(e.to_string().starts_with("shape.messages[1]:"), "{e}");
    assert_eq!(pool.get(&key).unwrap().shape.map(|s| s.get()), Some(&shape));
    // An operator's template with such a shape is refused too.
    let template = Template {
        model: "m".into(),
        text: text.clone(),
        tenant: None,
        endpoint: Endpoint::ChatCompletions,
        tags: vec![],
        shape: Some(WarmShape {
            messages: vec![MessageSpan {
                role: "user".into(),
                len: 4,
                parts: false,
            }],
            ..WarmShape::default()
        }),
    };
    let e = pool.add_template(template, &fp(), 0).unwrap_err();
    assert!(e.to_string().starts_with("shape.messages[0]:"), "{e}");
    assert_eq!(pool.templates(), 0);
}

#[test]
fn the_traffics_current_shape_replaces_the_kept_one_and_counts_in_the_bytes() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let (text, small) = chat_prefix(None, TOOLS);
    let (same_text, large) = chat_prefix(Some(SALT), MORE_TOOLS);
    assert_eq!(text, same_text);
    let base = entry_bytes(text.len(), text.len() / 256);
    let key = pool
        .apply_prefill(signal(&text, Some(small.clone())), 0)
        .unwrap();
    assert_eq!(pool.bytes(), base + small.bytes());
    pool.apply_prefill(signal(&text, Some(large.clone())), MIN)
        .unwrap();
    let v = pool.get(&key).unwrap();
    assert_eq!(v.shape.map(|s| s.get()), Some(&large));
    assert!(large.bytes() > small.bytes());
    assert_eq!(pool.bytes(), base + large.bytes());
    // A signal without a shape (a filter older than shapes): the entry is unshaped.
    pool.apply_prefill(signal(&text, None), 2 * MIN).unwrap();
    assert!(pool.get(&key).unwrap().shape.is_none());
    assert_eq!(pool.bytes(), base);
    // A template keeps the traffic's shape unless it brings one.
    pool.apply_prefill(signal(&text, Some(small.clone())), 3 * MIN)
        .unwrap();
    let template = Template {
        model: "m".into(),
        text: text.clone(),
        tenant: None,
        endpoint: Endpoint::ChatCompletions,
        tags: vec![],
        shape: None,
    };
    assert_eq!(pool.add_template(template.clone(), &fp(), 3 * MIN), Ok(key));
    assert_eq!(pool.get(&key).unwrap().shape.map(|s| s.get()), Some(&small));
    let with_shape = Template {
        shape: Some(large.clone()),
        ..template
    };
    assert_eq!(pool.add_template(with_shape, &fp(), 3 * MIN), Ok(key));
    assert_eq!(pool.get(&key).unwrap().shape.map(|s| s.get()), Some(&large));
    assert_eq!(pool.bytes(), base + large.bytes());
    pool.remove_template(&key);
    assert_eq!(pool.bytes(), 0, "every byte counted in is counted out");
}

#[test]
fn a_snapshot_keeps_the_shape_without_its_salt_and_the_entry_waits_for_a_signal() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let (text, salted) = chat_prefix(Some(SALT), TOOLS);
    let key = pool
        .apply_prefill(signal(&text, Some(salted.clone())), 0)
        .unwrap();
    assert_eq!(pool.get(&key).unwrap().unwarmed(0), None);
    let shared = serde_json::to_string(&pool.export_shared()).unwrap();
    let json = serde_json::to_string(&pool.export()).unwrap();
    assert_eq!(shared, json, "the shared records write the same JSON");
    assert!(!json.contains(SALT), "{json}");
    assert!(json.contains(r#""salt_dropped":true"#), "{json}");
    let records: Vec<PromptRecord> = serde_json::from_str(&json).unwrap();
    assert_eq!(records[0].shape.as_ref(), Some(&salted.without_salt()));
    let mut restored = PromptPool::new(HotnessConfig::default(), MIN);
    assert!(restored.restore(records, MIN).is_empty());
    let v = restored.get(&key).unwrap();
    assert_eq!(v.shape.map(|s| s.get()), Some(&salted.without_salt()));
    assert!(v.salt_dropped);
    assert_eq!(v.unwarmed(MIN), Some(Unwarmed::SaltDropped));
    assert_eq!(
        restored.bytes(),
        entry_bytes(text.len(), text.len() / 256) + salted.without_salt().bytes()
    );
    // Written again before a signal came: still no salt, still dropped.
    let again = serde_json::to_string(&restored.export_shared()).unwrap();
    assert!(again.contains(r#""salt_dropped":true"#), "{again}");
    // The traffic's signal brings the salt back: warmed again.
    restored
        .apply_prefill(signal(&text, Some(salted.clone())), 2 * MIN)
        .unwrap();
    let v = restored.get(&key).unwrap();
    assert_eq!(v.unwarmed(2 * MIN), None);
    assert_eq!(v.shape.and_then(|s| s.cache_salt.as_deref()), Some(SALT));
    // A record from before shapes loads unshaped and warmable.
    let mut old = serde_json::to_value(&restored.export()[0]).unwrap();
    let fields = old.as_object_mut().unwrap();
    fields.remove("shape");
    fields.remove("salt_dropped");
    let old: PromptRecord = serde_json::from_value(old).unwrap();
    assert!(old.shape.is_none() && !old.salt_dropped);
    let mut older = PromptPool::new(HotnessConfig::default(), 0);
    assert!(older.restore(vec![old], 0).is_empty());
    assert_eq!(older.get(&key).unwrap().unwarmed(0), None);
    assert!(older.get(&key).unwrap().shape.is_none());
}

#[test]
fn a_rejected_entry_backs_off_doubling_from_one_decay_period_up_to_the_cap() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let (text, shape) = chat_prefix(None, TOOLS);
    let key = pool.apply_prefill(signal(&text, Some(shape)), 0).unwrap();
    let t = 1_000;
    assert_eq!(pool.prefill_rejected(&key, t), Some(t + MIN));
    let v = pool.get(&key).unwrap();
    assert_eq!((v.rejections, v.backoff_until_ms), (1, t + MIN));
    assert_eq!(v.unwarmed(t + MIN - 1), Some(Unwarmed::BackedOff));
    assert_eq!(v.unwarmed(t + MIN), None);
    // Another pod's call that was in flight when the back-off started does not extend it.
    assert_eq!(pool.prefill_rejected(&key, t + 10), None);
    assert_eq!(pool.get(&key).unwrap().rejections, 1);
    let mut now = t + MIN;
    let mut lengths = Vec::new();
    for _ in 0..8 {
        let until = pool.prefill_rejected(&key, now).unwrap();
        lengths.push((until - now) / MIN);
        now = until;
    }
    assert_eq!(lengths, [2, 4, 8, 16, 32, 64, 64, 64]);
    // An accepted call ends the series: the next rejection backs off one period again.
    pool.prefill_accepted(&key);
    assert_eq!(pool.get(&key).unwrap().rejections, 0);
    assert_eq!(pool.prefill_rejected(&key, now), Some(now + MIN));
}
