//! Shared prefill compute: a pod prefills so many tokens a second whatever its batch, so
//! prompts that arrive together are computed one after another; unshared, each prefills at the
//! full rate beside the others. Times are model seconds.

use podsim::{LatencyProfile, Pod, PodConfig, PrefillCompute, RequestSpec};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";
const EPS: f64 = 1e-9;

fn pod(compute: PrefillCompute) -> Pod {
    Pod::new(PodConfig {
        max_model_len: 32_768,
        prefill_compute: compute,
        ..PodConfig::default()
    })
    .unwrap()
}

/// A prompt of `tokens` tokens (4 bytes each), distinct for each `fill`.
fn prompt(tokens: usize, fill: char) -> RequestSpec {
    RequestSpec {
        model: BASE.into(),
        canonical_prompt: std::iter::repeat_n(fill, tokens * 4).collect(),
        max_tokens: Some(1),
    }
}

#[test]
fn prompts_arriving_together_are_computed_one_after_another() {
    let profile = LatencyProfile::default();
    let mut shared = pod(PrefillCompute::Shared);
    let ttfts: Vec<f64> = ['a', 'b', 'c']
        .into_iter()
        .map(|c| shared.submit(0.0, &prompt(8_000, c)).unwrap().ttft_seconds)
        .collect();
    let compute = profile.per_uncached_token * 8_000.0;
    for (k, ttft) in ttfts.iter().enumerate() {
        let expected = k as f64 * compute + profile.prefill(8_000);
        assert!(
            (ttft - expected).abs() < 1e-6,
            "request {k}: {ttft} vs {expected}"
        );
    }
    let mut unshared = pod(PrefillCompute::Unshared);
    for c in ['a', 'b', 'c'] {
        let a = unshared.submit(0.0, &prompt(8_000, c)).unwrap();
        assert!((a.ttft_seconds - profile.prefill(8_000)).abs() < EPS);
    }
}

#[test]
fn a_cached_prompt_computes_only_its_uncached_tokens_and_an_idle_pod_does_not_queue() {
    let profile = LatencyProfile::default();
    let mut shared = pod(PrefillCompute::Shared);
    shared.submit(0.0, &prompt(8_000, 'a')).unwrap();
    // Long after: nothing computing, no queue.
    let later = shared.submit(100.0, &prompt(4_000, 'b')).unwrap();
    assert!((later.queue_seconds).abs() < EPS);
    // The same prompt again, behind a new long one: waits for that one's tokens only, and
    // computes nothing of its own cached blocks.
    shared.submit(200.0, &prompt(16_000, 'c')).unwrap();
    let repeat = shared.submit(200.0, &prompt(8_000, 'a')).unwrap();
    assert!(repeat.cached_tokens > 7_900, "{}", repeat.cached_tokens);
    let uncached = (repeat.prompt_tokens - repeat.cached_tokens) as f64;
    let expected = profile.per_uncached_token * 16_000.0 + profile.prefill(uncached as usize);
    assert!(
        (repeat.ttft_seconds - expected).abs() < 1e-6,
        "{} vs {expected}",
        repeat.ttft_seconds
    );
}

#[test]
fn a_request_waiting_for_compute_counts_as_waiting() {
    let mut shared = pod(PrefillCompute::Shared);
    for c in ['a', 'b', 'c', 'd'] {
        shared.submit(0.0, &prompt(8_000, c)).unwrap();
    }
    let m = shared.metrics(0.0);
    assert_eq!((m.running, m.waiting), (1, 3), "{m:?}");
}
