//! The gateway's policy hot paths: signal ingestion (decode a `SignalBatch` and apply it to the
//! prompt pool, one core), the routing table build for 100 pods × 500 adapters (and at 1,000
//! pods × 5,000 adapters with placed prefixes), the
//! warm-up plan of a pod joining 100 pods with 100k hot prefixes, and the adapters' replica sets
//! for 100 pods × 500 adapters and 1,000 × 5,000 (rankings kept between calls, the lazy ranking,
//! and at 100 × 500 the full one it replaced).
//! `cargo bench -p prewarm-gateway --bench policy`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use prewarm_core::fingerprint::{BlockChain, BlockHash, FingerprintConfig};
use prewarm_core::placement::PlacementCandidate;
use prewarm_core::request::Endpoint;
use prewarm_core::wire::{
    FeedbackOutcome, FeedbackSignal, PatternState, PinSignal, PlacedPrefix, PrefillSignal, Signal,
    SignalBatch,
};
use prewarm_gateway::policy::{
    plan_warmup, replica_sets,
    replicas::{replica_sets_by_full_ranking, ReplicaSetCache},
    AdapterDemand, HotPrefix, HotnessConfig, PodRoute, PrefixKey, PromptPool, RoutingConfig,
    RoutingTableBuilder, SlotCandidate, Tier, TierPools, WarmupConfig,
};

/// Signals per batch (a filter flushes its queue in batches of this order).
const BATCH: usize = 256;
/// Distinct prefixes the signals draw from.
const DISTINCT: usize = 20_000;
/// Bytes of prefix text per prefill signal (512 tokens: one shard, 8 blocks of 64 tokens).
const PREFIX_BYTES: usize = 2_048;

fn prefix_text(i: usize) -> String {
    let unit = format!("You are the assistant of tenant {i}. Answer politely and precisely. ");
    unit.repeat(PREFIX_BYTES / unit.len() + 1)[..PREFIX_BYTES].to_string()
}

/// A cheap deterministic sequence for picking prefixes.
fn mix(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(23)
}

/// Encoded batches: 50 % prefill (2 KB text), 40 % feedback, 10 % pin.
fn encoded_batches(count: usize) -> Vec<Vec<u8>> {
    let fp = FingerprintConfig::default();
    let chains: Vec<(String, Vec<BlockHash>)> = (0..DISTINCT)
        .map(|i| {
            let t = prefix_text(i);
            let chain = BlockChain::of("llama-3-8b", t.as_bytes(), &fp);
            (t, chain.blocks)
        })
        .collect();
    (0..count)
        .map(|b| {
            let signals = (0..BATCH)
                .map(|s| {
                    let n = (b * BATCH + s) as u64;
                    let (text, blocks) = &chains[(mix(n) % DISTINCT as u64) as usize];
                    match n % 10 {
                        0..=4 => Signal::Prefill(PrefillSignal {
                            model: "llama-3-8b".into(),
                            tenant: Some("acme".into()),
                            endpoint: Endpoint::ChatCompletions,
                            prefix: blocks.clone(),
                            prefix_tokens: blocks.len() * 64,
                            prefix_text: text.clone(),
                            state: PatternState::New,
                            priority: (n % 100) as u8,
                            keep_warm: true,
                            shape: None,
                        }),
                        5..=8 => Signal::Feedback(FeedbackSignal {
                            model: "llama-3-8b".into(),
                            prefix: *blocks.last().unwrap(),
                            outcome: if n.is_multiple_of(2) {
                                FeedbackOutcome::Adopted
                            } else {
                                FeedbackOutcome::Succeeded
                            },
                            count: 1,
                        }),
                        _ => Signal::Pin(PinSignal {
                            adapter: format!("adapter-{}", n % 50),
                            tenant: None,
                            rate_per_minute: 6.0,
                            priority: 30,
                        }),
                    }
                })
                .collect();
            SignalBatch::new("envoy-1", 0, signals).encode()
        })
        .collect()
}

fn ingest(c: &mut Criterion) {
    let batches = encoded_batches(64);
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    let mut now = 0u64;
    let mut next = 0usize;
    let mut group = c.benchmark_group("signals");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("decode_and_ingest_batch_of_256", |b| {
        b.iter(|| {
            let bytes = &batches[next % batches.len()];
            next += 1;
            now += 10;
            let batch = SignalBatch::decode(bytes).unwrap();
            black_box(pool.ingest(batch, now))
        })
    });
    group.bench_function("ingest_only_batch_of_256", |b| {
        b.iter_batched(
            || {
                next += 1;
                SignalBatch::decode(&batches[next % batches.len()]).unwrap()
            },
            |batch| {
                now += 10;
                black_box(pool.ingest(batch, now))
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn routing_table(c: &mut Criterion) {
    let ids: Vec<String> = (0..100).map(|i| format!("pod-{i:03}")).collect();
    let addresses: Vec<String> = (0..100)
        .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250))
        .collect();
    // Sorted, as `LoraResidency::served` yields them; and a shuffled copy for the worst case.
    let sorted: Vec<Vec<String>> = (0..100)
        .map(|p| {
            let mut a: Vec<String> = (0..500)
                .map(|a| format!("tenant-{}-adapter-{a}", (a + p) % 40))
                .collect();
            a.sort();
            a
        })
        .collect();
    let shuffled: Vec<Vec<String>> = sorted
        .iter()
        .map(|a| {
            let mut a = a.clone();
            a.sort_by_key(|name| mix(name.len() as u64 ^ name.as_bytes()[name.len() - 1] as u64));
            a.reverse();
            a
        })
        .collect();
    let routes = |adapters: &'static [Vec<String>], flip: bool, load: f64| -> Vec<PodRoute<'_>> {
        (0..100)
            .map(|i| PodRoute {
                id: &ids[i],
                address: &addresses[i],
                weight: 1.0,
                load: Some(load),
                load_samples: 60,
                wait_ms: None,
                adapters: adapters[i].iter().map(String::as_str).collect(),
                resident: Vec::new(),
                routable: !(flip && i == 0),
                warming: false,
            })
            .collect()
    };
    let sorted: &'static [Vec<String>] = Box::leak(sorted.into_boxed_slice());
    let shuffled: &'static [Vec<String>] = Box::leak(shuffled.into_boxed_slice());
    let mut group = c.benchmark_group("routing_table_100_pods_x_500_adapters");
    for (name, adapters) in [("sorted_input", sorted), ("unsorted_input", shuffled)] {
        let mut builder = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
        let mut flip = false;
        group.bench_function(format!("{name}/one_pod_joins_or_leaves"), |b| {
            b.iter(|| {
                flip = !flip;
                assert!(builder.build(&routes(adapters, flip, 0.4), 1));
            })
        });
        let mut load = 0.0;
        group.bench_function(format!("{name}/every_load_changes"), |b| {
            b.iter(|| {
                load = if load > 0.5 { 0.0 } else { 0.9 };
                assert!(builder.build(&routes(adapters, flip, load), 1));
            })
        });
        group.bench_function(format!("{name}/unchanged"), |b| {
            builder.build(&routes(adapters, flip, load), 1);
            b.iter(|| assert!(!builder.build(&routes(adapters, flip, load), 2)))
        });
        group.bench_function(format!("{name}/first_build"), |b| {
            b.iter(|| {
                let mut fresh = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
                assert!(fresh.build(&routes(adapters, flip, load), 1));
                black_box(fresh.table().pods.len())
            })
        });
    }
    group.finish();
}

fn warmup_plan(c: &mut Criterion) {
    let hot: Vec<HotPrefix> = (0..100_000u64)
        .map(|i| HotPrefix {
            key: PrefixKey {
                model: 7,
                last: BlockHash(mix(i)),
            },
            routing_key: BlockHash(mix(i ^ 0xABCD)),
            tokens: 512,
            hotness: 100_000.0 - i as f64,
            fleet_wide: false,
            holders: 0,
        })
        .collect();
    let ids: Vec<String> = (0..101).map(|i| format!("pod-{i:03}")).collect();
    let candidates: Vec<PlacementCandidate<'_>> = ids
        .iter()
        .map(|id| PlacementCandidate::new(id, 1.0))
        .collect();
    let adapters: Vec<String> = (0..8).map(|i| format!("adapter-{i}")).collect();
    let config = WarmupConfig::default();
    let mut group = c.benchmark_group("warmup_plan");
    group.sample_size(10);
    group.throughput(Throughput::Elements(hot.len() as u64));
    group.bench_function("join_101st_pod_100k_hot_prefixes", |b| {
        b.iter(|| {
            let plan = plan_warmup("pod-100", &candidates, &adapters, &hot, &config);
            black_box(plan.first_tier.len() + plan.second_tier.len() + plan.lazy.len())
        })
    });
    group.finish();

    let fp = FingerprintConfig::default();
    let mut pool = PromptPool::new(HotnessConfig::default(), 0);
    for batch in encoded_batches(400) {
        pool.ingest(SignalBatch::decode(&batch).unwrap(), 0);
    }
    let mut group = c.benchmark_group("hot_prefixes");
    group.sample_size(20);
    group.bench_function(format!("top_{}_of_the_pool", pool.len()), |b| {
        b.iter(|| black_box(pool.hot_prefixes(100_000, &fp).len()))
    });
    group.finish();
}

/// The fleet core recomputes every adapter's replica set once a keep-warm period (1 s): adapters
/// with Zipf(1.0) demand (every tenth gold) over pods of 4 GPU slots, at 100 pods × 500 adapters
/// and 1,000 × 5,000; from scratch, with nothing changed (the previous sets kept), after a pod
/// joins, after one leaves, and after demand shifts (the hottest fifth's rates rotate by one);
/// each by the rankings kept between calls (`cached`, `ReplicaSetCache`: from the cache a fleet
/// holds after computing the sets before, which a change updates) and, side by side in the same
/// run, by the lazy ranking (`lazy`, `replica_sets`); at 100 × 500 also by the full ranking the
/// lazy one replaced (`full_ranking`). Prints the bytes the kept rankings hold.
fn adapter_replica_sets(c: &mut Criterion) {
    type Sets = std::collections::BTreeMap<String, Vec<String>>;
    type Compute = fn(&[AdapterDemand<'_>], &[SlotCandidate<'_>], &TierPools, usize, &Sets) -> Sets;
    for (pods_n, adapters_n) in [(100, 500), (1_000, 5_000)] {
        let names: Vec<String> = (0..adapters_n).map(|i| format!("tenant-{i}")).collect();
        let demands = |shift: bool| -> Vec<AdapterDemand<'_>> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let hot = adapters_n / 5;
                    let rank = if shift && i < hot { (i + 1) % hot } else { i };
                    AdapterDemand {
                        name: n,
                        tier: if i % 10 == 0 {
                            Tier::Gold
                        } else {
                            Tier::Bronze
                        },
                        rate: 1_000.0 / (rank + 1) as f64,
                    }
                })
                .collect()
        };
        let (steady, shifted) = (demands(false), demands(true));
        let ids: Vec<String> = (0..=pods_n).map(|i| format!("pod-{i:04}")).collect();
        let fleet = |range: std::ops::Range<usize>| -> Vec<SlotCandidate<'_>> {
            ids[range]
                .iter()
                .map(|id| SlotCandidate {
                    candidate: PlacementCandidate::new(id, 1.0),
                    slots: 4,
                })
                .collect()
        };
        // `joined` has one pod more than `pods`, `left` one fewer (its first is gone).
        let (pods, joined, left) = (fleet(0..pods_n), fleet(0..pods_n + 1), fleet(1..pods_n));
        let pools = TierPools::default();
        let none = Sets::new();
        let previous = replica_sets(&steady, &pods, &pools, 1, &none);
        // A fleet's cache after the period that computed `previous`, and one more with it.
        let mut primed = ReplicaSetCache::default();
        primed.replica_sets(&steady, &pods, &pools, 1, &none);
        assert_eq!(
            *primed.replica_sets(&steady, &pods, &pools, 1, &previous),
            replica_sets(&steady, &pods, &pools, 1, &previous)
        );
        let (bytes, adapters) = primed.ranking_bytes();
        println!(
            "kept rankings, {pods_n} pods x {adapters_n} adapters: {bytes} bytes ({adapters} adapters)"
        );
        let mut group = c.benchmark_group(format!(
            "replica_sets_{pods_n}_pods_x_{adapters_n}_adapters"
        ));
        group.sample_size(10);
        let cases: [(&str, &[AdapterDemand<'_>], &[SlotCandidate<'_>], &Sets); 5] = [
            ("from_scratch", &steady, &pods, &none),
            ("unchanged", &steady, &pods, &previous),
            ("one_pod_joins", &steady, &joined, &previous),
            ("one_pod_leaves", &steady, &left, &previous),
            ("demand_shifts", &shifted, &pods, &previous),
        ];
        for (case, demands, pods, previous) in cases {
            group.bench_function(format!("cached/{case}"), |b| match case {
                "from_scratch" => b.iter(|| {
                    let mut cache = ReplicaSetCache::default();
                    black_box(cache.replica_sets(demands, pods, &pools, 1, previous).len())
                }),
                "unchanged" => {
                    let mut cache = primed.clone();
                    b.iter(|| {
                        black_box(cache.replica_sets(demands, pods, &pools, 1, previous).len())
                    })
                }
                _ => b.iter_batched(
                    || primed.clone(),
                    |mut cache| {
                        black_box(cache.replica_sets(demands, pods, &pools, 1, previous).len());
                        cache
                    },
                    BatchSize::PerIteration,
                ),
            });
        }
        let mut computations: Vec<(&str, Compute)> = vec![("lazy", replica_sets)];
        if pods_n <= 100 {
            computations.push(("full_ranking", replica_sets_by_full_ranking));
        }
        for (name, compute) in computations {
            for (case, demands, pods, previous) in cases {
                group.bench_function(format!("{name}/{case}"), |b| {
                    b.iter(|| black_box(compute(demands, pods, &pools, 1, previous).len()))
                });
            }
        }
        group.finish();
    }
}

/// The table at the scale: 1,000 pods, 5,000 adapters on their replica sets (5 a pod)
/// and the 100 placed prefixes of 8 keys each; its build when every load changes, its encoding,
/// and (printed) the bytes a proxy fetches when it changed.
fn routing_table_at_scale(c: &mut Criterion) {
    let ids: Vec<String> = (0..1000).map(|i| format!("pod-{i:04}")).collect();
    let addresses: Vec<String> = (0..1000)
        .map(|i| format!("10.{}.{}.{}:8000", i / 65536, (i / 256) % 256, i % 256))
        .collect();
    let adapters: Vec<Vec<String>> = (0..1000)
        .map(|p| {
            let mut a: Vec<String> = (0..5)
                .map(|k| format!("adapter-{:04}", p * 5 + k))
                .collect();
            a.sort();
            a
        })
        .collect();
    let placed: Vec<PlacedPrefix> = (0..100u64)
        .map(|i| PlacedPrefix {
            keys: (0..8).map(|k| BlockHash(mix(i * 8 + k))).collect(),
            pod: ids[(mix(i) % 1000) as usize].clone(),
        })
        .collect();
    let routes = |load: f64| -> Vec<PodRoute<'_>> {
        (0..1000)
            .map(|i| PodRoute {
                wait_ms: None,
                id: &ids[i],
                address: &addresses[i],
                weight: 1.0,
                load: Some((load + i as f64 / 1000.0) % 1.0),
                load_samples: 60,
                adapters: adapters[i].iter().map(String::as_str).collect(),
                resident: Vec::new(),
                routable: true,
                warming: false,
            })
            .collect()
    };
    let mut builder = RoutingTableBuilder::new(64, RoutingConfig::default(), 0);
    builder.build(&routes(0.0), 1);
    builder.place_prefixes(&placed, 1);
    println!(
        "routing table, 1,000 pods x 5,000 adapters + 100 placed prefixes: {} bytes encoded",
        builder.table().encode().len()
    );
    let mut group = c.benchmark_group("routing_table_1000_pods_x_5000_adapters");
    let mut load = 0.0;
    group.bench_function("every_load_changes_and_encode", |b| {
        b.iter(|| {
            load = if load > 0.5 { 0.0 } else { 0.55 };
            assert!(builder.build(&routes(load), 1));
            builder.place_prefixes(&placed, 1);
            black_box(builder.table().encode().len())
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    ingest,
    routing_table,
    routing_table_at_scale,
    warmup_plan,
    adapter_replica_sets
);
criterion_main!(benches);
