//! The per-request work of the filter, natively: parse + canonicalise + fingerprint + sketch of
//! a 2 KB and a 16 KB chat body. `cargo bench -p prewarm-core`.

#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prewarm_core::canonical_prompt;
use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use prewarm_core::request::{parse_request, Endpoint};
use prewarm_core::similarity::{Sketch, DEFAULT_SKETCH_SIZE};

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
    let mut group = c.benchmark_group("parse_canonicalise_fingerprint_sketch");
    for size in [2 * 1024, 16 * 1024] {
        let body = chat_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &body, |b, body| {
            b.iter(|| {
                let req = parse_request(Endpoint::ChatCompletions, body, 1 << 20).unwrap();
                let canonical = canonical_prompt(&req);
                let chain = BlockChain::of(&req.model, canonical.as_bytes(), &cfg);
                let sketch = Sketch::of(&canonical, DEFAULT_SKETCH_SIZE);
                (chain.blocks.len(), sketch.hashes().len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, request_path);
criterion_main!(benches);
