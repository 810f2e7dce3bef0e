//! The per-request work of the filter, natively, stage by stage and whole, for chat bodies of
//! 2, 16, 64 and 128 KB: `cargo bench -p prewarm-core --bench request_path`.
//!
//! Stages, in the order the filter runs them on a request it routes: `parse` (the body's JSON
//! into a request), `canonicalise` (the canonical prompt), `fingerprint` (the block chain),
//! `keys` (the prefix index's keys of the chain), `sketch` (the MinHash sketch of the prompt),
//! `index` (the longest match in the prefix index, then the request's record into it, in an
//! in-memory store already holding the prompt: a repeat, the common case), and `whole` (all of
//! them). A regression shows here, per stage, before it shows in Envoy (`make bench-filter`).

#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prewarm_core::canonical_prompt;
use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use prewarm_core::prefix::{longest_match, record, MemoryStore, PromptKeys};
use prewarm_core::request::{parse_request, Endpoint};
use prewarm_core::similarity::{Sketch, DEFAULT_SKETCH_SIZE};

/// Body sizes, bytes: a short chat turn, a long system prompt, and agent contexts.
const SIZES: [usize; 4] = [2 * 1024, 16 * 1024, 64 * 1024, 128 * 1024];

/// The largest body the parser takes here (above every size).
const MAX_BODY: usize = 1 << 20;

/// Slots of the prefix index (the filter's default order of magnitude).
const SLOTS: u32 = 1 << 16;

/// How long an index entry is fresh, ms (long enough that nothing ages during the bench).
const HORIZON_MS: u64 = 3_600_000;

fn chat_body(bytes: usize) -> Vec<u8> {
    let mut user = String::new();
    let mut i = 0;
    while user.len() < bytes.saturating_sub(200) {
        user.push_str(&format!("sentence {i} of the question with some words. "));
        i += 1;
    }
    serde_json::to_vec(&serde_json::json!({
        "model": "sql-lora",
        "stream": true,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": user}
        ]
    }))
    .unwrap()
}

fn request_path(c: &mut Criterion) {
    let cfg = FingerprintConfig::default();
    let mut group = c.benchmark_group("request_path");
    for size in SIZES {
        let body = chat_body(size);
        let req = parse_request(Endpoint::ChatCompletions, &body, MAX_BODY).unwrap();
        let canonical = canonical_prompt(&req);
        let chain = BlockChain::of(&req.model, canonical.as_bytes(), &cfg);
        let keys = PromptKeys::of(&chain, &cfg);
        let mut store = MemoryStore::new(SLOTS);
        record(&mut store, &keys, "pod-0", 1, HORIZON_MS);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("parse", size), &body, |b, body| {
            b.iter(|| parse_request(Endpoint::ChatCompletions, body, MAX_BODY).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("canonicalise", size), &req, |b, req| {
            b.iter(|| canonical_prompt(req))
        });
        group.bench_with_input(
            BenchmarkId::new("fingerprint", size),
            &canonical,
            |b, text| b.iter(|| BlockChain::of(&req.model, text.as_bytes(), &cfg)),
        );
        group.bench_with_input(BenchmarkId::new("keys", size), &chain, |b, chain| {
            b.iter(|| PromptKeys::of(chain, &cfg))
        });
        group.bench_with_input(BenchmarkId::new("sketch", size), &canonical, |b, text| {
            b.iter(|| Sketch::of(text, DEFAULT_SKETCH_SIZE))
        });
        group.bench_with_input(BenchmarkId::new("index", size), &keys, |b, keys| {
            b.iter(|| {
                let (found, reads) = longest_match(&store, keys);
                let refused = record(&mut store, keys, "pod-0", 2, HORIZON_MS);
                (found.is_some(), reads, refused)
            })
        });
        group.bench_with_input(BenchmarkId::new("whole", size), &body, |b, body| {
            b.iter(|| {
                let req = parse_request(Endpoint::ChatCompletions, body, MAX_BODY).unwrap();
                let canonical = canonical_prompt(&req);
                let chain = BlockChain::of(&req.model, canonical.as_bytes(), &cfg);
                let keys = PromptKeys::of(&chain, &cfg);
                let sketch = Sketch::of(&canonical, DEFAULT_SKETCH_SIZE);
                let (found, _) = longest_match(&store, &keys);
                record(&mut store, &keys, "pod-0", 2, HORIZON_MS);
                (found.is_some(), sketch.hashes().len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, request_path);
criterion_main!(benches);
