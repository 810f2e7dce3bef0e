//! Scenario and property tests of the prompt pool, in virtual time.

use super::*;
use prewarm_core::fingerprint::BlockChain;
use prewarm_core::wire::{
    FeedbackOutcome, FeedbackSignal, PatternState, PrefillSignal, Signal, SignalBatch,
};
use proptest::prelude::*;

const MIN: u64 = 60_000;

fn fp() -> FingerprintConfig {
    FingerprintConfig::default()
}

/// Canonical text of `blocks` full 64-token blocks, distinct per `id`.
fn text(id: u32, blocks: usize) -> String {
    let unit = format!("template-{id:08}-");
    unit.repeat(blocks * 256 / unit.len() + 1)[..blocks * 256].to_string()
}

/// A prefill signal exactly as the filter builds it for `text`.
fn prefill(model: &str, text: &str, priority: u8) -> PrefillSignal {
    let chain = BlockChain::of(model, text.as_bytes(), &fp());
    PrefillSignal {
        model: model.into(),
        tenant: Some("acme".into()),
        endpoint: Endpoint::ChatCompletions,
        prefix_tokens: chain.blocks.len() * 64,
        prefix: chain.blocks,
        prefix_text: text.into(),
        state: PatternState::New,
        priority,
        keep_warm: true,
        shape: None,
    }
}

fn feedback(model: &str, text: &str, outcome: FeedbackOutcome, count: u32) -> FeedbackSignal {
    let chain = BlockChain::of(model, text.as_bytes(), &fp());
    FeedbackSignal {
        model: model.into(),
        prefix: chain.prefix_fingerprint().unwrap(),
        outcome,
        count,
    }
}

fn key_of(model: &str, text: &str) -> PrefixKey {
    PrefixKey::new(
        model,
        BlockChain::of(model, text.as_bytes(), &fp())
            .prefix_fingerprint()
            .unwrap(),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

enum Step {
    Prefill(u32, u8, u64),
    Feedback(u32, FeedbackOutcome, u32, u64),
    Tick(u64),
    Expect(u32, Option<f64>),
}

#[test]
fn hotness_scenarios() {
    use FeedbackOutcome::{Adopted, Succeeded};
    use Step::*;
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "a signal starts at signal_boost",
            vec![Prefill(1, 0, 0), Expect(1, Some(1.0))],
        ),
        (
            "priority scales the boost",
            vec![Prefill(1, 50, 0), Expect(1, Some(1.5))],
        ),
        (
            "a repeated signal adds",
            vec![Prefill(1, 0, 0), Prefill(1, 0, 10), Expect(1, Some(2.0))],
        ),
        (
            "adoption +0.3 and success +0.5 per request",
            vec![
                Prefill(1, 0, 0),
                Feedback(1, Adopted, 1, 1),
                Feedback(1, Succeeded, 2, 2),
                Expect(1, Some(1.0 + 0.3 + 1.0)),
            ],
        ),
        (
            "feedback for an unknown prefix changes nothing",
            vec![Feedback(9, Adopted, 1, 0), Expect(9, None)],
        ),
        (
            "decay ×0.95 per full period only",
            vec![
                Prefill(1, 0, 0),
                Tick(MIN - 1),
                Expect(1, Some(1.0)),
                Tick(MIN),
                Expect(1, Some(0.95)),
                Tick(3 * MIN + 5),
                Expect(1, Some(0.95f64.powi(3))),
            ],
        ),
        (
            "a boost after decay adds at full value",
            vec![
                Prefill(1, 0, 0),
                Tick(2 * MIN),
                Feedback(1, Succeeded, 1, 2 * MIN),
                Expect(1, Some(0.95 * 0.95 + 0.5)),
                Tick(3 * MIN),
                Expect(1, Some((0.95 * 0.95 + 0.5) * 0.95)),
            ],
        ),
        (
            "cold entries retire below 0.05 (1.0 × 0.95^59 < 0.05)",
            vec![
                Prefill(1, 0, 0),
                Tick(58 * MIN),
                Expect(1, Some(0.95f64.powi(58))),
                Tick(59 * MIN),
                Expect(1, None),
            ],
        ),
        (
            "time going backwards does not un-decay",
            vec![Prefill(1, 0, 0), Tick(MIN), Tick(0), Expect(1, Some(0.95))],
        ),
    ];
    for (name, steps) in cases {
        let mut pool = PromptPool::new(HotnessConfig::default(), 0);
        for step in steps {
            match step {
                Prefill(id, prio, at) => {
                    pool.apply_prefill(prefill("m", &text(id, 2), prio), at)
                        .unwrap();
                }
                Feedback(id, outcome, count, at) => {
                    pool.apply_feedback(&feedback("m", &text(id, 2), outcome, count), at);
                }
                Tick(at) => pool.tick(at),
                Expect(id, want) => {
                    let got = pool.hotness(&key_of("m", &text(id, 2)));
                    match (got, want) {
                        (Some(g), Some(w)) => assert!(close(g, w), "{name}: hotness {g}, want {w}"),
                        (g, w) => assert_eq!(g, w, "{name}"),
                    }
                }
            }
        }
    }
}

#[test]
fn the_coldest_dynamic_entry_is_evicted_and_templates_never() {
    let config = HotnessConfig {
        max_entries: 3,
        ..HotnessConfig::default()
    };
    let mut pool = PromptPool::new(config, 0);
    let template = pool
        .add_template(
            Template {
                model: "m".into(),
                text: text(100, 1),
                tenant: None,
                endpoint: Endpoint::Completions,
                tags: vec!["support".into()],
                shape: None,
            },
            &fp(),
            0,
        )
        .unwrap();
    for (id, prio) in [(1, 30), (2, 10), (3, 20)] {
        pool.apply_prefill(prefill("m", &text(id, 2), prio), 0)
            .unwrap();
    }
    pool.apply_prefill(prefill("m", &text(4, 2), 0), 0).unwrap();
    assert_eq!(
        pool.hotness(&key_of("m", &text(2, 2))),
        None,
        "the coldest (priority 10) went"
    );
    assert!(pool.hotness(&key_of("m", &text(4, 2))).is_some());
    assert_eq!(pool.len(), 4);
    assert_eq!(pool.stats().evicted, 1);
    pool.apply_prefill(prefill("m", &text(5, 2), 0), 0).unwrap();
    assert_eq!(
        pool.hotness(&key_of("m", &text(4, 2))),
        None,
        "then the new cold one"
    );
    assert!(pool.get(&template).is_some(), "templates are not evicted");
}

#[test]
fn the_byte_bound_evicts_the_coldest_and_counts_what_is_held() {
    // Room for four 2-block entries (512 text bytes each), not five.
    let one = entry_bytes(512, 2);
    let config = HotnessConfig {
        max_pool_bytes: 4 * one + one / 2,
        ..HotnessConfig::default()
    };
    let mut pool = PromptPool::new(config, 0);
    for (id, prio) in [(1, 30), (2, 10), (3, 20), (4, 40)] {
        pool.apply_prefill(prefill("m", &text(id, 2), prio), 0)
            .unwrap();
    }
    assert_eq!((pool.len(), pool.bytes()), (4, 4 * one));
    pool.apply_prefill(prefill("m", &text(5, 2), 50), 0)
        .unwrap();
    assert_eq!(
        pool.hotness(&key_of("m", &text(2, 2))),
        None,
        "the coldest went"
    );
    assert_eq!(
        (pool.len(), pool.bytes(), pool.stats().evicted),
        (4, 4 * one, 1)
    );
    // A bigger entry makes room by evicting as many cold entries as it needs.
    pool.apply_prefill(prefill("m", &text(6, 4), 0), 0).unwrap();
    assert_eq!(pool.bytes(), 2 * one + entry_bytes(1024, 4));
    assert!(pool.bytes() <= pool.config().max_pool_bytes);
    // A template larger than the whole bound is refused, the pool unchanged.
    let before = pool.len();
    let huge = Template {
        model: "m".into(),
        text: text(7, 20),
        tenant: None,
        endpoint: Endpoint::Completions,
        tags: vec![],
        shape: None,
    };
    let bytes = pool.bytes();
    assert!(matches!(
        pool.add_template(huge, &fp(), 0),
        Err(PoolError::PoolFull(_))
    ));
    assert_eq!(
        (pool.len(), pool.bytes()),
        (before, bytes),
        "nothing evicted for it"
    );
    // Templates fill the pool (two of 1,248 bytes; a third would pass the bound).
    let mut i = 100;
    loop {
        let t = Template {
            model: "m".into(),
            text: text(i, 4),
            tenant: None,
            endpoint: Endpoint::Completions,
            tags: vec![],
            shape: None,
        };
        i += 1;
        if pool.add_template(t, &fp(), 0).is_err() {
            break;
        }
    }
    assert_eq!(pool.templates(), 2);
    // A dynamic entry that cannot fit beside the templates is refused; one that can gets in.
    assert!(matches!(
        pool.apply_prefill(prefill("m", &text(8, 4), 0), 0),
        Err(PoolError::PoolFull(_))
    ));
    pool.apply_prefill(prefill("m", &text(9, 2), 0), 0).unwrap();
    assert!(pool.bytes() <= pool.config().max_pool_bytes);
}

#[test]
fn names_are_bounded() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let long = "n".repeat(MAX_NAME_BYTES + 1);
    let e = pool
        .apply_prefill(prefill(&long, &text(1, 1), 0), 0)
        .unwrap_err();
    assert!(e.to_string().starts_with("model: 257 bytes"), "{e}");
    let mut tenant = prefill("m", &text(1, 1), 0);
    tenant.tenant = Some(long.clone());
    let e = pool.apply_prefill(tenant, 0).unwrap_err();
    assert!(e.to_string().starts_with("tenant: "), "{e}");
    assert!(pool.is_empty());
}

#[test]
fn one_batch_counts_at_most_max_feedback_count_per_prefix() {
    let config = HotnessConfig {
        max_feedback_count: 10,
        ..HotnessConfig::default()
    };
    let mut pool = PromptPool::new(config, 0);
    let t = text(1, 2);
    pool.apply_prefill(prefill("m", &t, 0), 0).unwrap();
    let huge = feedback("m", &t, FeedbackOutcome::Adopted, u32::MAX);
    let batch = SignalBatch::new(
        "envoy-1",
        0,
        vec![
            Signal::Feedback(huge.clone()),
            Signal::Feedback(huge.clone()),
            Signal::Feedback(feedback("m", &t, FeedbackOutcome::Succeeded, 3)),
        ],
    );
    let r = pool.ingest(batch, 0);
    assert_eq!((r.feedback, r.feedback_capped), (1, 2));
    let v = pool.get(&key_of("m", &t)).unwrap();
    assert_eq!((v.adoptions, v.successes), (10, 0));
    assert!(close(v.hotness, 1.0 + 10.0 * 0.3), "{}", v.hotness);
    // The next batch has its own allowance.
    let r = pool.ingest(SignalBatch::new("e", 0, vec![Signal::Feedback(huge)]), 0);
    assert_eq!(r.feedback, 1);
    assert_eq!(pool.get(&key_of("m", &t)).unwrap().adoptions, 20);
}

#[test]
fn templates_match_filter_fingerprints_and_keep_their_floor() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let t = text(7, 3);
    let key = pool
        .add_template(
            Template {
                model: "sql-lora".into(),
                text: t.clone(),
                tenant: Some("acme".into()),
                endpoint: Endpoint::ChatCompletions,
                tags: vec!["sql".into()],
                shape: None,
            },
            &fp(),
            0,
        )
        .unwrap();
    assert_eq!(key, key_of("sql-lora", &t));
    // the filter's signal for the same text lands on the template
    pool.apply_prefill(prefill("sql-lora", &t, 0), 0).unwrap();
    assert_eq!(pool.len(), 1);
    assert!(close(pool.hotness(&key).unwrap(), 2.0));
    pool.tick(200 * MIN);
    assert_eq!(
        pool.hotness(&key),
        Some(1.0),
        "never below template_hotness, never retired"
    );
    let v = pool.get(&key).unwrap();
    assert_eq!(
        (v.model, v.tenant, v.origin),
        ("sql-lora", Some("acme"), Origin::Static)
    );
    assert_eq!(v.tags, ["sql".to_string()]);
    assert_eq!(v.blocks.len(), 3);
    assert_eq!(pool.templates(), 1);
    assert!(pool.remove_template(&key));
    assert!(!pool.remove_template(&key));
    assert!(pool.is_empty());
}

#[test]
fn a_dynamic_entry_registered_as_template_becomes_static() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let t = text(8, 2);
    let key = pool.apply_prefill(prefill("m", &t, 0), 0).unwrap();
    pool.apply_feedback(&feedback("m", &t, FeedbackOutcome::Succeeded, 4), 0);
    let tpl = Template {
        model: "m".into(),
        text: t,
        tenant: None,
        endpoint: Endpoint::ChatCompletions,
        tags: vec![],
        shape: None,
    };
    assert_eq!(pool.add_template(tpl, &fp(), 0), Ok(key));
    let v = pool.get(&key).unwrap();
    assert_eq!(v.origin, Origin::Static);
    assert!(close(v.hotness, 3.0), "keeps its hotness");
    assert_eq!(pool.top(5).len(), 1);
}

#[test]
fn bad_input_is_refused_with_the_field_named() {
    let config = HotnessConfig {
        max_prefix_bytes: 1024,
        max_templates: 1,
        ..HotnessConfig::default()
    };
    let mut pool = PromptPool::new(config, 0);
    let mut empty = prefill("m", &text(1, 2), 0);
    empty.prefix.clear();
    assert_eq!(pool.apply_prefill(empty, 0), Err(PoolError::EmptyPrefix));
    let long = prefill("m", &text(1, 5), 0);
    let e = pool.apply_prefill(long, 0).unwrap_err();
    assert_eq!(e.to_string(), "text: 1280 bytes: must be at most 1024");
    let mut lying = prefill("m", &text(1, 2), 0);
    lying.prefix_text.truncate(300);
    assert_eq!(
        pool.apply_prefill(lying, 0).unwrap_err().to_string(),
        "prefix_tokens: 128: must be the blocks' tokens, covered by the text (300 bytes)"
    );
    let mut cut = prefill("m", &text(1, 2), 0);
    cut.prefix_text.truncate(509);
    assert!(
        pool.apply_prefill(cut, 0).is_ok(),
        "a cut-back last character is fine"
    );
    let mut odd = prefill("m", &text(3, 2), 0);
    odd.prefix_tokens = 127;
    assert!(matches!(
        pool.apply_prefill(odd, 0),
        Err(PoolError::InconsistentLength { .. })
    ));
    let mut overlong = prefill("m", &text(3, 1), 0);
    overlong.prefix = vec![BlockHash(1); 100];
    assert!(matches!(
        pool.apply_prefill(overlong, 0),
        Err(PoolError::TooManyBlocks { blocks: 100 })
    ));
    let mut nameless = prefill("", &text(1, 2), 0);
    nameless.model.clear();
    assert_eq!(pool.apply_prefill(nameless, 0), Err(PoolError::EmptyModel));
    let tpl = |id, tags: Vec<String>| Template {
        model: "m".into(),
        text: text(id, 1),
        tenant: None,
        endpoint: Endpoint::Completions,
        tags,
        shape: None,
    };
    let short = Template {
        text: "short".into(),
        ..tpl(1, vec![])
    };
    assert_eq!(
        pool.add_template(short, &fp(), 0).unwrap_err().to_string(),
        "text: 5 bytes: shorter than one block"
    );
    assert!(matches!(
        pool.add_template(tpl(1, vec!["x".repeat(65)]), &fp(), 0),
        Err(PoolError::BadTags(1, 16))
    ));
    pool.add_template(tpl(1, vec![]), &fp(), 0).unwrap();
    assert_eq!(
        pool.add_template(tpl(2, vec![]), &fp(), 0),
        Err(PoolError::TooManyTemplates(1))
    );
    assert_eq!(
        pool.len(),
        2,
        "nothing stored from refused input (the template and `cut`)"
    );
}

#[test]
fn too_many_names_are_refused() {
    let config = HotnessConfig {
        max_names: 2,
        ..HotnessConfig::default()
    };
    let mut pool = PromptPool::new(config, 0);
    pool.apply_prefill(prefill("a", &text(1, 1), 0), 0).unwrap(); // names a, acme
    let e = pool
        .apply_prefill(prefill("b", &text(2, 1), 0), 0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "model: \"b\": too many distinct model and tenant names"
    );
    assert_eq!(pool.len(), 1);
    // a known name costs nothing
    pool.apply_prefill(prefill("a", &text(3, 1), 0), 0).unwrap();
    assert_eq!(pool.len(), 2);
}

#[test]
fn ingest_applies_a_decoded_batch_and_hands_pins_back() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let t = text(1, 2);
    let mut bad = prefill("m", &t, 0);
    bad.prefix.clear();
    let batch = SignalBatch::new(
        "envoy-1",
        0,
        vec![
            Signal::Prefill(prefill("m", &t, 0)),
            Signal::Feedback(feedback("m", &t, FeedbackOutcome::Adopted, 1)),
            Signal::Feedback(feedback("m", &text(2, 2), FeedbackOutcome::Adopted, 1)),
            Signal::Pin(PinSignal {
                adapter: "sql-lora".into(),
                tenant: None,
                rate_per_minute: 6.0,
                priority: 23,
            }),
            Signal::Prefill(bad),
        ],
    );
    let decoded = SignalBatch::decode(&batch.encode()).unwrap();
    let r = pool.ingest(decoded, 5);
    assert_eq!(
        (r.prefills, r.feedback, r.feedback_unknown, r.rejected),
        (1, 1, 1, 1)
    );
    assert_eq!(r.reasons, vec![PoolError::EmptyPrefix]);
    assert_eq!(r.pins.len(), 1);
    assert_eq!(r.pins[0].adapter, "sql-lora");
    let v = pool.get(&key_of("m", &t)).unwrap();
    assert!(close(v.hotness, 1.3));
    assert_eq!((v.adoptions, v.last_signal_ms, v.text.len()), (1, 5, 512));
}

#[test]
fn top_k_merges_templates_and_dynamic_entries_hottest_first() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    for (id, prio) in [(1, 0), (2, 90), (3, 40)] {
        pool.apply_prefill(prefill("m", &text(id, 2), prio), 0)
            .unwrap();
    }
    let tpl = Template {
        model: "m".into(),
        text: text(4, 2),
        tenant: None,
        endpoint: Endpoint::Completions,
        tags: vec![],
        shape: None,
    };
    let config = HotnessConfig {
        template_hotness: 1.6,
        ..HotnessConfig::default()
    };
    let mut with_template = PromptPool::new(config, 0);
    for (id, prio) in [(1, 0), (2, 90), (3, 40)] {
        with_template
            .apply_prefill(prefill("m", &text(id, 2), prio), 0)
            .unwrap();
    }
    with_template.add_template(tpl, &fp(), 0).unwrap();
    let order = |p: &PromptPool, k| p.top(k).iter().map(|v| v.hotness).collect::<Vec<_>>();
    assert_eq!(order(&pool, 2), vec![1.9, 1.4]);
    assert_eq!(order(&with_template, 3), vec![1.9, 1.6, 1.4]);
    let hot = with_template.hot_prefixes(10, &fp());
    assert_eq!(hot.len(), 4);
    assert_eq!(hot[1].key, key_of("m", &text(4, 2)));
    assert_eq!(hot[1].tokens, 128);
    let chain = BlockChain::of("m", text(4, 2).as_bytes(), &fp());
    assert_eq!(Some(hot[1].routing_key), chain.routing_key(&fp()));
}

/// A small deterministic uniform source for tests.
fn lcg(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn roulette_sampling_follows_hotness() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let hot = pool.apply_prefill(prefill("m", &text(1, 1), 0), 0).unwrap();
    let cold = pool.apply_prefill(prefill("m", &text(2, 1), 0), 0).unwrap();
    pool.apply_feedback(
        &feedback("m", &text(1, 1), FeedbackOutcome::Succeeded, 6),
        0,
    ); // 4.0 vs 1.0
    let mut rng = lcg(7);
    let mut hot_wins = 0;
    for _ in 0..10_000 {
        let s = pool.sample(1, &mut rng);
        assert_eq!(s.len(), 1);
        if s[0] == hot {
            hot_wins += 1;
        } else {
            assert_eq!(s[0], cold);
        }
    }
    let share = hot_wins as f64 / 10_000.0;
    assert!((share - 0.8).abs() < 0.02, "share {share}");
    let both = pool.sample(5, &mut rng);
    assert_eq!(both.len(), 2, "distinct keys, no more than the pool holds");
    assert!(PromptPool::new(HotnessConfig::default(), 0)
        .sample(3, &mut rng)
        .is_empty());
    assert_eq!(
        pool.sample(1, &mut || f64::NAN).len(),
        1,
        "bad draws are clamped"
    );
}

#[test]
fn export_and_restore_round_trip() {
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    pool.apply_prefill(prefill("m", &text(1, 2), 20), 0)
        .unwrap();
    // an experiment arm without keep-warm signalled this one
    let not_kept = PrefillSignal {
        keep_warm: false,
        ..prefill("m", &text(3, 2), 10)
    };
    let not_kept_key = pool.apply_prefill(not_kept, 0).unwrap();
    pool.add_template(
        Template {
            model: "n".into(),
            text: text(2, 1),
            tenant: None,
            endpoint: Endpoint::Completions,
            tags: vec!["t".into()],
            shape: None,
        },
        &fp(),
        0,
    )
    .unwrap();
    pool.tick(3 * MIN);
    let records = pool.export();
    let json = serde_json::to_string(&records).unwrap();
    // What a snapshot writes (sharing texts with the pool) is the same JSON.
    assert_eq!(serde_json::to_string(&pool.export_shared()).unwrap(), json);
    let back: Vec<PromptRecord> = serde_json::from_str(&json).unwrap();
    let mut restored = PromptPool::new(HotnessConfig::default(), 10 * MIN);
    assert!(restored.restore(back, 10 * MIN).is_empty());
    let again = restored.export();
    assert_eq!(again.len(), records.len());
    for (a, b) in again.iter().zip(&records) {
        assert!(close(a.hotness, b.hotness));
        assert_eq!(
            PromptRecord {
                hotness: b.hotness,
                ..a.clone()
            },
            *b
        );
    }
    assert_eq!(restored.templates(), 1);
    assert!(!restored.get(&not_kept_key).unwrap().keep_warm);
    assert_eq!(json.matches(r#""keep_warm":false"#).count(), 1, "{json}");
    // the same record from before the field: kept warm
    let mut value = serde_json::to_value(records.iter().find(|r| !r.keep_warm).unwrap()).unwrap();
    value.as_object_mut().unwrap().remove("keep_warm");
    let old: PromptRecord = serde_json::from_value(value).unwrap();
    assert!(old.keep_warm);
    let mut broken = records[0].clone();
    broken.blocks.clear();
    assert_eq!(
        restored.restore(vec![broken], 10 * MIN),
        vec![PoolError::EmptyPrefix]
    );
}

#[test]
fn config_validation_names_every_field() {
    assert!(HotnessConfig::default().validate("hotness.").is_empty());
    let bad = HotnessConfig {
        decay_factor: 1.5,
        decay_period_ms: 10,
        adoption_boost: -1.0,
        retire_below: 5.0,
        max_entries: 0,
        ..HotnessConfig::default()
    };
    let p = bad.validate("hotness.");
    assert_eq!(p.len(), 5, "{p:?}");
    assert_eq!(p[0], "hotness.decay_factor: 1.5: must be in (0, 1]");
    assert!(p[1].starts_with("hotness.decay_period_ms: 10:"));
    assert!(p[2].starts_with("hotness.adoption_boost: -1:"));
    assert!(p[3].starts_with("hotness.retire_below: 5:"));
    assert!(p[4].starts_with("hotness.max_entries: 0:"));
    let unknown = serde_json::from_str::<HotnessConfig>(r#"{"decay_factr": 0.9}"#);
    assert!(unknown.unwrap_err().to_string().contains("decay_factr"));
    let partial: HotnessConfig = serde_json::from_str(r#"{"decay_factor": 0.9}"#).unwrap();
    assert_eq!(partial.max_entries, 100_000);
}

proptest! {
    /// Lazy decay equals eager decay: every boost decays by 0.95 per full period since it was
    /// applied, across rebases (periods beyond 512).
    #[test]
    fn decay_matches_the_eager_sum(
        events in proptest::collection::vec((0u64..800, 0u8..99, any::<bool>()), 1..40),
    ) {
        let config = HotnessConfig { retire_below: 0.0, ..HotnessConfig::default() };
        let mut pool = PromptPool::new(config, 0);
        let t = text(1, 1);
        let mut sorted = events.clone();
        sorted.sort_by_key(|e| e.0);
        let mut boosts: Vec<(u64, f64)> = Vec::new();
        for (period, prio, is_feedback) in &sorted {
            let at = period * MIN + 17;
            if *is_feedback && !boosts.is_empty() {
                pool.apply_feedback(&feedback("m", &t, FeedbackOutcome::Adopted, 1), at);
                boosts.push((*period, 0.3));
            } else {
                pool.apply_prefill(prefill("m", &t, *prio), at).unwrap();
                boosts.push((*period, 1.0 + f64::from(*prio) / 100.0));
            }
        }
        let end = sorted.last().unwrap().0 + 3;
        pool.tick(end * MIN);
        let want: f64 = boosts.iter().map(|(p, b)| b * 0.95f64.powi((end - p) as i32)).sum();
        let got = pool.hotness(&key_of("m", &t)).unwrap();
        prop_assert!((got - want).abs() <= 1e-9 * want.max(1e-12), "got {got} want {want}");
    }

    /// Whatever the order of arrival, the pool keeps the hottest `max_entries` entries once the
    /// hotness is settled (each entry signalled once with its priority).
    #[test]
    fn eviction_keeps_the_hottest(prios in proptest::collection::vec(0u8..99, 1..60), max in 1usize..20) {
        let config = HotnessConfig { max_entries: max, ..HotnessConfig::default() };
        let mut pool = PromptPool::new(config, 0);
        for (i, p) in prios.iter().enumerate() {
            pool.apply_prefill(prefill("m", &text(i as u32, 1), *p), 0).unwrap();
        }
        prop_assert_eq!(pool.len(), prios.len().min(max));
        // every survivor is at least as hot as every evicted entry that arrived before it
        let kept: Vec<f64> = pool.top(usize::MAX).iter().map(|v| v.hotness).collect();
        let coldest_kept = kept.iter().cloned().fold(f64::INFINITY, f64::min);
        for (i, p) in prios.iter().enumerate() {
            let k = key_of("m", &text(i as u32, 1));
            if pool.hotness(&k).is_none() {
                let h = 1.0 + f64::from(*p) / 100.0;
                let later_colder = prios[i + 1..].iter().any(|q| 1.0 + f64::from(*q) / 100.0 < h);
                prop_assert!(h <= coldest_kept + 1e-12 || later_colder, "evicted {h} but kept {coldest_kept}");
            }
        }
    }
}
