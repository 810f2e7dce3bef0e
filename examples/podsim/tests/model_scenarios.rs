//! Scenario tests of the pure pod model: hit accounting, eviction order, batch and LoRA-slot
//! waiting, adapter load latency, errors. Times are model seconds.

use podsim::{
    AdapterError, AdapterSpec, Engine, LatencyProfile, Pod, PodConfig, RequestError, RequestSpec,
};

const EPS: f64 = 1e-9;

fn text(tokens: usize, fill: char) -> String {
    std::iter::repeat_n(fill, tokens * 4).collect()
}

fn spec(model: &str, prompt: &str, max_tokens: u64) -> RequestSpec {
    RequestSpec {
        model: model.into(),
        canonical_prompt: prompt.into(),
        max_tokens: Some(max_tokens),
    }
}

fn adapter(name: &str, rank: u32) -> AdapterSpec {
    AdapterSpec {
        name: name.into(),
        path: format!("/adapters/{name}"),
        rank,
        pinned: false,
    }
}

fn lora_pod(max_loras: usize, max_cpu_loras: usize) -> Pod {
    Pod::new(PodConfig {
        enable_lora: true,
        max_loras,
        max_cpu_loras,
        ..PodConfig::default()
    })
    .unwrap()
}

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

#[test]
fn hits_are_full_blocks_capped_below_the_prompt_length() {
    let mut pod = Pod::new(PodConfig::default()).unwrap();
    let p64 = text(64, 'a');
    let a = pod.submit(0.0, &spec(BASE, &p64, 1)).unwrap();
    assert_eq!((a.prompt_tokens, a.cached_tokens), (64, 0));
    // Same 64 tokens again: 4 blocks cached, but the last token is recomputed → 3 blocks.
    let b = pod.submit(1.0, &spec(BASE, &p64, 1)).unwrap();
    assert_eq!(b.cached_tokens, 48);
    // One more token makes all 4 blocks reusable.
    let p65 = format!("{p64}zzzz");
    let c = pod.submit(2.0, &spec(BASE, &p65, 1)).unwrap();
    assert_eq!((c.prompt_tokens, c.cached_tokens), (65, 64));
    // A partial last block is never cached: 20 tokens leave one block.
    let p20 = text(20, 'q');
    pod.submit(3.0, &spec(BASE, &p20, 1)).unwrap();
    let d = pod
        .submit(4.0, &spec(BASE, &format!("{p20}{}", text(30, 'r')), 1))
        .unwrap();
    assert_eq!(d.cached_tokens, 16);
    let m = pod.metrics(10.0);
    assert_eq!(m.prefix_queries_tokens, 64 + 64 + 65 + 20 + 50);
    assert_eq!(m.prefix_hits_tokens, 48 + 64 + 16);
    assert_eq!(m.finished_length, 5);
}

#[test]
fn the_adapter_is_part_of_the_block_key() {
    let mut pod = lora_pod(2, 2);
    pod.load_adapter(adapter("sql", 8), false).unwrap();
    let p = text(100, 'x');
    pod.submit(0.0, &spec(BASE, &p, 1)).unwrap();
    let a = pod.submit(1.0, &spec("sql", &p, 1)).unwrap();
    assert_eq!(a.cached_tokens, 0);
    assert_eq!(pod.cached_prefix_tokens(None, &p), 96);
    assert_eq!(pod.cached_prefix_tokens(Some("sql"), &p), 96);
}

#[test]
fn eviction_takes_the_deepest_block_of_the_oldest_request_first() {
    // 8 usable blocks of 16 tokens; requests hold prompt + 1 output token.
    let mut pod = Pod::new(PodConfig {
        num_gpu_blocks: 9,
        ..PodConfig::default()
    })
    .unwrap();
    let a = text(47, 'a'); // 2 full blocks + partial; holds 3 blocks
    let b = text(47, 'b');
    let ra = pod.submit(0.0, &spec(BASE, &a, 1)).unwrap();
    pod.advance(ra.finish_at);
    let rb = pod.submit(ra.finish_at, &spec(BASE, &b, 1)).unwrap();
    pod.advance(rb.finish_at);
    let t = rb.finish_at;
    assert_eq!(pod.cached_prefix_tokens(None, &a), 32);
    assert_eq!(pod.cached_prefix_tokens(None, &b), 32);
    let m = pod.metrics(t);
    assert_eq!((m.free_blocks, m.kv_cache_usage), (8, 0.0));
    // The queries above had no side effects: they did not refresh `a`.
    let c = text(31, 'c'); // holds 2 blocks: the two never-used ones
    let rc = pod.submit(t, &spec(BASE, &c, 1)).unwrap();
    pod.advance(rc.finish_at);
    assert_eq!(
        pod.cached_prefix_tokens(None, &a),
        32,
        "only never-used blocks taken yet"
    );
    let d = text(31, 'd');
    let rd = pod.submit(rc.finish_at, &spec(BASE, &d, 1)).unwrap();
    // Free queue was: a.partial, a.2, a.1, b.partial, b.2, b.1, c.partial, c.1 → d takes the
    // first two: a loses its deepest full block and keeps its first.
    assert_eq!(pod.cached_prefix_tokens(None, &a), 16);
    assert_eq!(pod.cached_prefix_tokens(None, &b), 32);
    assert_eq!(pod.cached_prefix_tokens(None, &c), 16);
    let m = pod.metrics(rd.start);
    assert!(m.kv_cache_usage > 0.0);
}

#[test]
fn blocks_of_running_requests_are_never_evicted() {
    let mut pod = Pod::new(PodConfig {
        num_gpu_blocks: 5, // 4 usable
        ..PodConfig::default()
    })
    .unwrap();
    let a = text(40, 'a'); // holds 3 blocks while it runs (prompt 40 + 100 output = 9 blocks wanted, 4 available)
    let ra = pod.submit(0.0, &spec(BASE, &a, 100)).unwrap();
    let b = text(40, 'b');
    let rb = pod.submit(0.1, &spec(BASE, &b, 1)).unwrap();
    assert!(rb.start < ra.finish_at);
    assert_eq!(pod.cached_prefix_tokens(None, &a), 32);
    assert_eq!(pod.cached_prefix_tokens(None, &b), 0, "no free block for b");
    let m = pod.metrics(0.2);
    assert_eq!(m.kv_cache_usage, 1.0);
}

#[test]
fn requests_queue_behind_a_full_batch() {
    let mut pod = Pod::new(PodConfig {
        max_num_seqs: 1,
        ..PodConfig::default()
    })
    .unwrap();
    let p = text(10, 'a');
    let a = pod.submit(0.0, &spec(BASE, &p, 10)).unwrap();
    let b = pod.submit(0.01, &spec(BASE, &p, 10)).unwrap();
    assert!((b.start - a.finish_at).abs() < EPS);
    assert!((b.queue_seconds - (a.finish_at - 0.01)).abs() < EPS);
    assert!((b.ttft_seconds - (b.queue_seconds + b.prefill_seconds)).abs() < EPS);
    let m = pod.metrics(0.02);
    assert_eq!((m.running, m.waiting), (1, 1));
    let m = pod.metrics(b.finish_at);
    assert_eq!((m.running, m.waiting, m.finished_length), (0, 0, 2));
}

#[test]
fn a_request_waits_for_a_lora_slot() {
    let mut pod = lora_pod(1, 4);
    pod.load_adapter(adapter("a", 8), false).unwrap();
    pod.load_adapter(adapter("b", 8), false).unwrap();
    let p = text(10, 'x');
    let ra = pod.submit(0.0, &spec("a", &p, 50)).unwrap();
    // Same adapter joins the batch at once; another adapter waits for the slot.
    let ra2 = pod.submit(0.001, &spec("a", &p, 1)).unwrap();
    assert!((ra2.start - 0.001).abs() < EPS);
    let rb = pod.submit(0.002, &spec("b", &p, 1)).unwrap();
    assert!((rb.start - ra.finish_at).abs() < EPS);
    assert!(rb.adapter_activation_seconds > 0.0);
    assert_eq!(rb.adapter_load_seconds, 0.0, "b is in the host cache");
    let m = pod.metrics(0.1);
    assert_eq!(m.waiting, 1);
    assert_eq!(m.running_adapters, vec!["a".to_string()]);
    assert_eq!(m.waiting_adapters, vec!["b".to_string()]);
    // Requests that fit run past the waiting one: the base model, and adapter a (still in the
    // batch) when it ends before b's start; a longer a-request would delay b, so it waits.
    let base = pod.submit(0.1, &spec(BASE, &p, 1)).unwrap();
    assert!((base.start - 0.1).abs() < EPS);
    let short_a = pod.submit(0.1, &spec("a", &p, 2)).unwrap();
    assert!((short_a.start - 0.1).abs() < EPS);
    let long_a = pod.submit(0.1, &spec("a", &p, 100)).unwrap();
    assert!((long_a.start - rb.finish_at).abs() < EPS, "{long_a:?}");
    assert!(
        long_a.adapter_activation_seconds == 0.0,
        "a held its slot when admitted"
    );
    let m = pod.metrics(rb.start + 1e-6);
    assert_eq!(m.running_adapters, vec!["b".to_string()]);
    assert_eq!(m.waiting_adapters, vec!["a".to_string()]);
}

#[test]
fn cold_adapters_pay_disk_load_and_activation_in_their_ttft() {
    let mut pod = lora_pod(1, 1);
    pod.load_adapter(adapter("a", 16), false).unwrap();
    pod.load_adapter(adapter("b", 16), false).unwrap(); // evicts a from the host cache
    assert_eq!(pod.host_adapters(), vec!["b"]);
    assert!(pod.gpu_adapters().is_empty());
    let p = text(100, 'x');
    let profile = LatencyProfile::LLAMA_8B_H100;
    let r = pod.submit(0.0, &spec("a", &p, 1)).unwrap();
    assert!((r.adapter_load_seconds - profile.adapter_load(16)).abs() < EPS);
    assert!((r.adapter_activation_seconds - profile.adapter_activation(16)).abs() < EPS);
    let expected = profile.prefill(100) + profile.adapter_load(16) + profile.adapter_activation(16);
    assert!((r.ttft_seconds - expected).abs() < EPS, "{r:?}");
    assert!((r.adapter_load_seconds - 0.120).abs() < EPS);
    // Warm now: only the prefill of the uncached tail.
    let r2 = pod.submit(r.finish_at, &spec("a", &p, 1)).unwrap();
    assert_eq!(
        (r2.adapter_load_seconds, r2.adapter_activation_seconds),
        (0.0, 0.0)
    );
    assert!((r2.ttft_seconds - profile.prefill(100 - 96)).abs() < EPS);
    assert_eq!(pod.gpu_adapters(), vec!["a"]);
    assert_eq!(pod.host_adapters(), vec!["a"]);
}

#[test]
fn abort_releases_blocks_and_counts() {
    let mut pod = Pod::new(PodConfig::default()).unwrap();
    let p = text(100, 'x');
    let r = pod.submit(0.0, &spec(BASE, &p, 1000)).unwrap();
    assert!(pod.metrics(0.5).kv_cache_usage > 0.0);
    assert!(pod.abort(0.5, r.id));
    assert!(!pod.abort(0.6, r.id));
    let m = pod.metrics(0.6);
    assert_eq!((m.running, m.finished_abort, m.kv_cache_usage), (0, 1, 0.0));
    assert_eq!(pod.cached_prefix_tokens(None, &p), 96);
}

#[test]
fn refusals_carry_vllm_messages() {
    let mut pod = lora_pod(1, 1);
    let p = text(10, 'x');
    let e = pod.submit(0.0, &spec("nope", &p, 1)).unwrap_err();
    assert_eq!(e.to_string(), "The model `nope` does not exist.");
    let e = pod.submit(0.0, &spec(BASE, &p, 0)).unwrap_err();
    assert_eq!(e, RequestError::InvalidMaxTokens { max_tokens: 0 });
    // Output is clamped to the room the context leaves, as vLLM does; only a prompt longer
    // than the context is refused.
    let a = pod.submit(0.0, &spec(BASE, &p, 8190)).unwrap();
    assert_eq!((a.prompt_tokens, a.output_tokens), (10, 8182));
    let e = pod
        .submit(0.0, &spec(BASE, &text(8193, 'y'), 1))
        .unwrap_err();
    assert!(
        matches!(
            e,
            RequestError::PromptTooLong {
                prompt_tokens: 8193,
                max_model_len: 8192
            }
        ),
        "{e:?}"
    );
    let e = pod.submit(0.0, &spec(BASE, &p, 8193)).unwrap_err();
    assert!(
        matches!(e, RequestError::MaxTokensOverModelLen { .. }),
        "{e:?}"
    );
    let e = pod.load_adapter(adapter("big", 64), false).unwrap_err();
    assert_eq!(
        e.to_string(),
        "LoRA rank 64 is greater than max_lora_rank 16."
    );
    pod.load_adapter(adapter("a", 8), false).unwrap();
    assert!(matches!(
        pod.load_adapter(adapter("a", 8), false),
        Err(AdapterError::AlreadyLoaded { .. })
    ));
    pod.load_adapter(adapter("a", 4), true).unwrap();
    assert_eq!(pod.registered_adapters().next().map(|a| a.rank), Some(4));
    assert_eq!(
        pod.unload_adapter("zzz").unwrap_err().to_string(),
        "The lora adapter 'zzz' cannot be found."
    );
    pod.unload_adapter("a").unwrap();
    assert_eq!(pod.registered_adapters().count(), 0);
    let mut plain = Pod::new(PodConfig::default()).unwrap();
    assert_eq!(
        plain.load_adapter(adapter("a", 8), false),
        Err(AdapterError::LoraDisabled)
    );
}

#[test]
fn sglang_names_adapters_as_base_colon_adapter_and_caps_loaded_adapters() {
    let mut pod = Pod::new(PodConfig {
        engine: Engine::Sglang,
        enable_lora: true,
        max_loaded_loras: Some(1),
        ..PodConfig::default()
    })
    .unwrap();
    pod.load_adapter(adapter("sql", 8), false).unwrap();
    assert!(matches!(
        pod.load_adapter(adapter("two", 8), false),
        Err(AdapterError::TooManyLoaded { .. })
    ));
    let p = text(10, 'x');
    let r = pod
        .submit(0.0, &spec(&format!("{BASE}:sql"), &p, 1))
        .unwrap();
    assert_eq!(r.adapter.as_deref(), Some("sql"));
    assert!(pod.submit(0.0, &spec("sql", &p, 1)).is_err());
}

#[test]
fn noise_is_seeded_and_bounded() {
    let run = |seed| {
        let mut pod = Pod::new(PodConfig {
            noise: 0.2,
            seed,
            ..PodConfig::default()
        })
        .unwrap();
        (0..20)
            .map(|i| {
                pod.submit(i as f64, &spec(BASE, &text(100, 'a'), 1))
                    .unwrap()
                    .prefill_seconds
            })
            .collect::<Vec<_>>()
    };
    let a = run(7);
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
    let base = LatencyProfile::LLAMA_8B_H100;
    for (i, p) in a.iter().enumerate() {
        let uncached = if i == 0 { 100 } else { 4 };
        let nominal = base.prefill(uncached);
        assert!(*p >= nominal * 0.8 - EPS && *p <= nominal * 1.2 + EPS);
    }
}

#[test]
fn time_never_runs_backwards() {
    let mut pod = Pod::new(PodConfig::default()).unwrap();
    let p = text(10, 'x');
    let a = pod.submit(5.0, &spec(BASE, &p, 1)).unwrap();
    let b = pod.submit(1.0, &spec(BASE, &p, 1)).unwrap();
    assert_eq!(b.arrival, 5.0);
    let c = pod.submit(f64::NAN, &spec(BASE, &p, 1)).unwrap();
    assert_eq!(c.arrival, 5.0);
    assert!(a.ttft_seconds.is_finite() && c.finish_at.is_finite());
    assert_eq!(pod.metrics(f64::INFINITY).now, 5.0);
}
