//! Scenario and property tests of the KV model, in virtual time.

use super::*;
use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use proptest::prelude::*;

fn config() -> KvConfig {
    KvConfig {
        block_tokens: 16,
        capacity_blocks: 1_000,
        reserved_initial_blocks: 100,
        reserved_max_blocks: 300,
        near_eviction: 0.75,
        prefill_tokens_per_s: 1_000.0,
        prefill_burst_tokens: 2_000.0,
        ..KvConfig::default()
    }
}

/// A prefix of `shards` full 512-token shards (32 pod blocks each), distinct per `id`; the
/// first `shared` shards are common to every id.
fn prefix(id: u32, shards: usize, shared: usize) -> (PrefixKey, Vec<Shard>) {
    let fp = FingerprintConfig::default();
    let common =
        "shared-system-prompt-".repeat(2048 * shared / 21 + 1)[..2048 * shared].to_string();
    let own = format!("prefix-{id:06}-").repeat(2048 * shards / 14 + 1);
    let text = format!("{common}{own}");
    let text = &text[..2048 * shards];
    let chain = BlockChain::of("m", text.as_bytes(), &fp);
    let key = PrefixKey::new("m", *chain.blocks.last().unwrap());
    (key, chain.shards(&fp))
}

enum Step {
    Prefill(u32, u64),
    Churn(u64),
    Usage(f64),
    /// Expected keep-warm decisions at a time: (prefix ids, tokens each).
    KeepWarm(u64, Vec<u32>),
    Resident(u32, bool),
    Age(u32, Option<u64>),
}

#[test]
fn keep_warm_scenarios() {
    use Step::*;
    let cases: Vec<(&str, Vec<Step>)> = vec![
        (
            "a fresh prefix is not due",
            vec![Prefill(1, 0), Age(1, Some(0)), KeepWarm(0, vec![])],
        ),
        (
            "due at 75 % of capacity, then touched again",
            vec![
                Prefill(1, 0),
                Churn(749 * 16),
                Age(1, Some(749)),
                KeepWarm(10, vec![]),
                Churn(16),
                KeepWarm(20, vec![1]),
                Age(1, Some(0)),
                KeepWarm(30, vec![]),
            ],
        ),
        (
            "modelled evicted past capacity, and due first",
            vec![
                Prefill(1, 0),
                Churn(500 * 16),
                Prefill(2, 0),
                Churn(501 * 16),
                Resident(1, false),
                Age(2, Some(501)),
                Churn(300 * 16),
                KeepWarm(0, vec![1, 2]),
                Resident(1, true),
            ],
        ),
        (
            "KV usage shrinks the effective capacity",
            vec![
                Prefill(1, 0),
                Churn(400 * 16),
                KeepWarm(0, vec![]),
                Usage(0.5),
                KeepWarm(0, vec![1]),
            ],
        ),
        (
            "the token bucket paces re-prefills: 3 × 512 of 2000, then 1000/s, oldest first",
            vec![
                Prefill(1, 0),
                Churn(160),
                Prefill(2, 0),
                Churn(160),
                Prefill(3, 0),
                Churn(160),
                Prefill(4, 0),
                Churn(160),
                Prefill(5, 0),
                Churn(760 * 16),
                KeepWarm(0, vec![1, 2, 3]),
                KeepWarm(40, vec![]),
                KeepWarm(500, vec![4]),
                KeepWarm(1_000, vec![5]),
            ],
        ),
    ];
    for (name, steps) in cases {
        let mut kv = KvResidency::new(config(), 0);
        for step in steps {
            match step {
                Prefill(id, at) => {
                    let (k, s) = prefix(id, 1, 0);
                    kv.record_prefill(k, &s, at);
                }
                Churn(tokens) => kv.record_uncached_tokens(tokens),
                Usage(u) => kv.observe_usage(u),
                KeepWarm(at, want) => {
                    let got: Vec<PrefixKey> = kv.keep_warm(at).iter().map(|d| d.key).collect();
                    let mut want: Vec<PrefixKey> =
                        want.iter().map(|&id| prefix(id, 1, 0).0).collect();
                    let mut sorted = got.clone();
                    sorted.sort();
                    want.sort();
                    assert_eq!(sorted, want, "{name}");
                }
                Resident(id, want) => {
                    assert_eq!(kv.is_resident(&prefix(id, 1, 0).0), want, "{name}")
                }
                Age(id, want) => {
                    let k = prefix(id, 1, 0).0;
                    let v = kv
                        .warm_prefixes(0)
                        .into_iter()
                        .find(|v| v.key == k)
                        .unwrap();
                    assert_eq!(v.age_blocks, want, "{name}");
                }
            }
        }
    }
}

#[test]
fn evicted_prefixes_come_before_old_ones() {
    let mut kv = KvResidency::new(config(), 0);
    let (a, sa) = prefix(1, 1, 0);
    let (b, sb) = prefix(2, 1, 0);
    kv.record_prefill(a, &sa, 0);
    kv.record_uncached_tokens(600 * 16);
    kv.record_prefill(b, &sb, 0);
    kv.record_uncached_tokens(500 * 16); // a: 1100 (evicted), b: 500
    kv.observe_usage(0.2); // capacity 800: b due at 600
    kv.record_uncached_tokens(150 * 16);
    let d = kv.keep_warm(0);
    assert_eq!(
        d.iter().map(|d| (d.key, d.age_blocks)).collect::<Vec<_>>(),
        vec![(a, None), (b, Some(650))]
    );
    assert_eq!(d[0].tokens, 512);
}

#[test]
fn the_warm_budget_follows_demand_between_its_bounds_and_shrinks_under_pressure() {
    let mut kv = KvResidency::new(config(), 0);
    assert_eq!(kv.reserved_blocks(), 100);
    for id in 0..5 {
        let (k, s) = prefix(id, 1, 0);
        kv.record_prefill(k, &s, 0);
    }
    assert_eq!(kv.reserved_blocks(), 160);
    for id in 5..12 {
        let (k, s) = prefix(id, 1, 0);
        kv.record_prefill(k, &s, 0);
    }
    assert_eq!(kv.reserved_blocks(), 300);
    let within = |kv: &KvResidency| {
        kv.warm_prefixes(0)
            .iter()
            .filter(|v| v.within_budget)
            .map(|v| v.key)
            .collect::<Vec<_>>()
    };
    let kept = within(&kv);
    assert_eq!(kept.len(), 9);
    assert_eq!(
        kept[0],
        prefix(11, 1, 0).0,
        "the most recently requested first"
    );
    assert!(!kept.contains(&prefix(0, 1, 0).0));
    kv.observe_usage(0.95);
    assert_eq!(kv.reserved_blocks(), 100);
    assert_eq!(within(&kv).len(), 3);
    kv.record_uncached_tokens(100_000);
    assert_eq!(kv.keep_warm(0).len(), 3, "only the budget is re-warmed");
}

#[test]
fn shared_shards_are_modelled_once_and_hits_are_leading_shards() {
    let mut kv = KvResidency::new(config(), 0);
    let (a, sa) = prefix(1, 2, 1);
    let (_, sb) = prefix(2, 2, 1);
    assert_eq!(sa[0].last_block, sb[0].last_block);
    kv.record_prefill(a, &sa, 0);
    assert_eq!(kv.resident_shards(), 2);
    assert_eq!(
        kv.record_traffic(&sb, 0),
        512,
        "the shared first shard hits"
    );
    assert_eq!(kv.resident_shards(), 3);
    assert_eq!(kv.record_traffic(&sa, 0), 1024);
    let (_, sc) = prefix(3, 1, 0);
    assert_eq!(kv.record_traffic(&sc, 0), 0);
    assert_eq!(
        kv.hit_ratio(),
        Some((512.0 + 1024.0) / (1024.0 * 2.0 + 512.0))
    );
    assert_eq!(KvResidency::new(config(), 0).hit_ratio(), None);
}

#[test]
fn reset_failure_and_forget() {
    let mut kv = KvResidency::new(config(), 0);
    let (a, sa) = prefix(1, 2, 0);
    kv.record_prefill(a, &sa, 0);
    kv.prefill_failed(&a);
    assert!(!kv.is_resident(&a));
    assert_eq!(kv.keep_warm(0).len(), 1);
    assert!(kv.is_resident(&a));
    kv.reset();
    assert!(!kv.is_resident(&a));
    assert_eq!(kv.resident_shards(), 0);
    assert_eq!(kv.keep_warm(5_000).len(), 1, "a restarted pod is re-warmed");
    assert!(kv.forget(&a));
    assert!(!kv.forget(&a));
    kv.reset();
    assert!(kv.keep_warm(10_000).is_empty());
}

#[test]
fn geometry_from_the_pod_and_bounded_tracking() {
    let mut kv = KvResidency::new(
        KvConfig {
            max_tracked_prefixes: 2,
            max_tracked_shards: 3,
            ..config()
        },
        0,
    );
    for id in 0..4 {
        let (k, s) = prefix(id, 1, 0);
        kv.record_prefill(k, &s, 0);
    }
    assert_eq!(kv.warm_prefixes(0).len(), 2);
    assert_eq!(kv.resident_shards(), 3);
    kv.set_geometry(32, 50);
    assert_eq!(kv.effective_capacity(), 50);
    let (k, s) = prefix(9, 1, 0);
    kv.record_prefill(k, &s, 0);
    kv.record_uncached_tokens(32 * 50);
    assert!(
        kv.is_resident(&k),
        "50 blocks inserted since: still in 50 blocks"
    );
    kv.record_uncached_tokens(32);
    assert!(!kv.is_resident(&k), "51 blocks inserted since");
}

#[test]
fn config_validation_names_every_field() {
    assert!(KvConfig::default().validate("kv.").is_empty());
    let bad = KvConfig {
        block_tokens: 0,
        reserved_initial_blocks: 10,
        reserved_max_blocks: 5,
        near_eviction: 0.0,
        prefill_tokens_per_s: f64::NAN,
        ..KvConfig::default()
    };
    let p = bad.validate("kv.");
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(p[0].starts_with("kv.block_tokens: 0:"));
    assert_eq!(
        p[1],
        "kv.reserved_initial_blocks: 10: must be at most reserved_max_blocks (5)"
    );
    assert!(p[2].starts_with("kv.near_eviction: 0:"));
    assert!(p[3].starts_with("kv.prefill_tokens_per_s: NaN:"));
    assert!(serde_json::from_str::<KvConfig>(r#"{"capacity": 1}"#).is_err());
}

proptest! {
    /// Modelled eviction follows recency: whenever a prefix is resident, every prefix touched
    /// after it is resident too.
    #[test]
    fn eviction_is_in_lru_order(
        touches in proptest::collection::vec((0u32..12, 0u64..200), 1..80),
        usage in 0.0f64..0.8,
    ) {
        let mut kv = KvResidency::new(config(), 0);
        let prefixes: Vec<(PrefixKey, Vec<Shard>)> = (0..12).map(|id| prefix(id, 1, 0)).collect();
        let mut last_touch = [None; 12];
        for (i, (id, churn)) in touches.iter().enumerate() {
            let (k, s) = &prefixes[*id as usize];
            kv.record_prefill(*k, s, i as u64);
            kv.record_uncached_tokens(churn * 16);
            last_touch[*id as usize] = Some(i);
        }
        kv.observe_usage(usage);
        for a in 0..12 {
            for b in 0..12 {
                if let (Some(ta), Some(tb)) = (last_touch[a], last_touch[b]) {
                    if tb > ta && kv.is_resident(&prefixes[a].0) {
                        prop_assert!(kv.is_resident(&prefixes[b].0), "{a} resident but later {b} not");
                    }
                }
            }
        }
    }

    /// The prefill budget never goes negative and never exceeds its burst, whatever the timing.
    #[test]
    fn the_prefill_budget_is_a_token_bucket(steps in proptest::collection::vec((0u64..3_000, 0u64..2_000), 1..40)) {
        let mut kv = KvResidency::new(config(), 0);
        let prefixes: Vec<(PrefixKey, Vec<Shard>)> = (0..6).map(|id| prefix(id, 1, 0)).collect();
        for (k, s) in &prefixes {
            kv.record_prefill(*k, s, 0);
        }
        let mut now = 0;
        let mut spent = 0.0;
        for (dt, churn) in steps {
            now += dt;
            kv.record_uncached_tokens(churn * 16);
            spent += kv.keep_warm(now).iter().map(|d| d.tokens as f64).sum::<f64>();
            let b = kv.prefill_budget(now);
            prop_assert!((0.0..=2_000.0).contains(&b));
        }
        prop_assert!(spent <= 2_000.0 + now as f64, "spent {spent} in {now} ms");
    }
}
