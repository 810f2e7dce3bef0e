//! The pure pod model's cost for the offline evaluator: admissions per second over a trace-like
//! workload (10 pods, 4,000 requests, shared templates, 16 adapters on 4 slots each).
//! Run: `cargo bench -p podsim --bench pod_model`.

use criterion::{criterion_group, criterion_main, Criterion};
use podsim::{AdapterSpec, Pod, PodConfig, RequestSpec};

fn workload() -> Vec<(usize, RequestSpec)> {
    let templates: Vec<String> = (0..50)
        .map(|t| format!("template {t}: ").repeat(40 + t * 7))
        .collect();
    (0..4000usize)
        .map(|i| {
            let t = (i * 7919) % templates.len();
            let model = if i % 3 == 0 {
                "meta-llama/Llama-3.1-8B-Instruct".to_string()
            } else {
                format!("adapter-{}", (i * 31) % 16)
            };
            let prompt = format!("{}user {i} asks something specific", templates[t]);
            (
                i % 10,
                RequestSpec {
                    model,
                    canonical_prompt: prompt,
                    max_tokens: Some(64),
                },
            )
        })
        .collect()
}

fn pods() -> Vec<Pod> {
    (0..10)
        .map(|_| {
            let mut pod = Pod::new(PodConfig {
                enable_lora: true,
                max_loras: 4,
                max_cpu_loras: 8,
                ..PodConfig::default()
            })
            .unwrap();
            for a in 0..16 {
                let spec = AdapterSpec {
                    name: format!("adapter-{a}"),
                    path: format!("/adapters/{a}"),
                    rank: 16,
                    pinned: false,
                };
                pod.load_adapter(spec, false).unwrap();
            }
            pod
        })
        .collect()
}

fn replay(c: &mut Criterion) {
    let requests = workload();
    c.bench_function("4000 requests over 10 pods", |b| {
        b.iter_batched(
            pods,
            |mut pods| {
                let mut ttft = 0.0;
                for (i, (pod, spec)) in requests.iter().enumerate() {
                    let now = i as f64 * 0.01;
                    if let Some(p) = pods.get_mut(*pod) {
                        ttft += p.submit(now, spec).map_or(0.0, |a| a.ttft_seconds);
                    }
                }
                ttft
            },
            criterion::BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, replay);
criterion_main!(benches);
