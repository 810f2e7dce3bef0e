//! The cost of a pod's KV-cache events in the gateway: decoding one engine step's batch and
//! applying it to the pod's ledger (`policy::fleet::engine_blocks`), at the size of a steady
//! 8B-on-H100 pod (26,624 blocks of 16 tokens held) — one step that prefilled 2,048 new tokens
//! (128 blocks stored, their token ids and integer hashes) and evicted as many.
//! `cargo bench -p prewarm-gateway --bench kv_events`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use prewarm_core::kv_events::{decode_batch, encode_batch, KvEvent, KvEventBatch, Medium};
use prewarm_gateway::policy::fleet::engine_blocks::EngineBlocks;

const HELD: u64 = 26_624;
const BLOCK: u32 = 16;
const STEP_BLOCKS: u64 = 128;

fn step(seq: u64) -> KvEventBatch {
    let first = HELD + seq * STEP_BLOCKS;
    let stored: Vec<u64> = (first..first + STEP_BLOCKS)
        .map(|b| b.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let removed: Vec<u64> = (first - HELD..first - HELD + STEP_BLOCKS)
        .map(|b| b.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    KvEventBatch {
        ts: 1.0,
        events: vec![
            KvEvent::Stored {
                blocks: stored,
                parent: None,
                token_ids: (0..STEP_BLOCKS as u32 * BLOCK)
                    .map(|t| t.wrapping_mul(2_654_435_761) % 128_256)
                    .collect(),
                block_size: BLOCK,
                lora_id: None,
                medium: Medium::Gpu,
            },
            KvEvent::Removed {
                blocks: removed,
                medium: Medium::Gpu,
            },
        ],
        data_parallel_rank: None,
    }
}

fn kv_events(c: &mut Criterion) {
    let payload = encode_batch(&step(1));
    println!("one step's payload: {} bytes", payload.len());
    let mut group = c.benchmark_group("kv_events_step_2048_tokens");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode", |b| {
        b.iter(|| black_box(decode_batch(black_box(&payload)).unwrap()))
    });
    let mut ledger = EngineBlocks::default();
    ledger.apply(
        0,
        &KvEventBatch {
            ts: 0.0,
            events: vec![KvEvent::Stored {
                blocks: (0..HELD)
                    .map(|b| b.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .collect(),
                parent: None,
                token_ids: vec![],
                block_size: BLOCK,
                lora_id: None,
                medium: Medium::Gpu,
            }],
            data_parallel_rank: None,
        },
        4 * HELD as usize,
        0,
    );
    let mut seq = 0u64;
    group.bench_function("apply_to_a_full_ledger", |b| {
        b.iter_batched(
            || {
                seq += 1;
                (seq, step(seq))
            },
            |(s, batch)| black_box(ledger.apply(s as i64, &batch, 4 * HELD as usize, 0)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, kv_events);
criterion_main!(benches);
