//! Scenario tests of the offline evaluator on small hand-made traces whose right answers are
//! known: a repeated prefix hits after its first request, the oracle never loses to any policy,
//! and a scale-up without warm-up shows cold misses that prewarm avoids.

use prewarm_replay::assign::{assign, zipf, Assignment};
use prewarm_replay::offline::run::{evaluate, summaries, PolicyRun, Setup, POLICIES};
use prewarm_replay::render::splitmix64;
use prewarm_replay::scenario::{FleetEvent, FleetSpec};
use prewarm_replay::trace::TraceRequest;

fn fleet(pods: usize, kv_blocks: usize) -> FleetSpec {
    FleetSpec {
        pods,
        profile: "llama-8b-h100".into(),
        kv_blocks,
        max_loras: 2,
        max_cpu_loras: 8,
        adapter_rank: 16,
        adapter_replicas: 2,
        tier_pools: true,
        gold_pool_share: 0.0,
        load_factor: Some(1.25),
        prefill_compute: podsim::PrefillCompute::Unshared,
    }
}

fn request(ms: u64, ids: &[u64], input: u64) -> TraceRequest {
    TraceRequest::synthetic(ms, ids, input, 4)
}

fn all_policies() -> Vec<String> {
    POLICIES.iter().map(|p| p.to_string()).collect()
}

fn run(
    trace: &[TraceRequest],
    assignment: &Assignment,
    spec: &FleetSpec,
    events: &[FleetEvent],
) -> Vec<PolicyRun> {
    run_policies(trace, assignment, spec, events, &all_policies())
}

fn run_policies(
    trace: &[TraceRequest],
    assignment: &Assignment,
    spec: &FleetSpec,
    events: &[FleetEvent],
    policies: &[String],
) -> Vec<PolicyRun> {
    let setup = Setup {
        trace,
        assignment,
        fleet: spec,
        events,
    };
    evaluate(&setup, policies, |_, _| {}).unwrap()
}

#[test]
fn a_repeated_prefix_hits_after_the_first_request() {
    let trace: Vec<TraceRequest> = (0..12)
        .map(|i| request(i * 1000, &[1, 2, 3], 1536))
        .collect();
    let assignment = assign(&trace, None, 1, 0.1, 0.2);
    for pods in [1, 4] {
        let runs = run(&trace, &assignment, &fleet(pods, 4096), &[]);
        for r in &runs {
            if (r.policy == "round_robin" || r.policy == "prewarm") && pods > 1 {
                // each pod misses once, then hits; prewarm's bounded load (no pod takes more
                // than 1.25 × the mean of a minute's requests) spreads a prompt that is the
                // fleet's whole traffic
                let misses = r.outcomes.iter().filter(|o| o.cached_tokens == 0).count();
                assert!(misses <= pods, "{}: {misses}", r.policy);
                for o in r.outcomes.iter().filter(|o| o.cached_tokens > 0) {
                    assert_eq!(o.cached_tokens, 1520, "{} request {}", r.policy, o.request);
                }
                continue;
            }
            let first = &r.outcomes[0];
            assert_eq!(
                (first.prompt_tokens, first.cached_tokens),
                (1536, 0),
                "{}",
                r.policy
            );
            for o in &r.outcomes[1..] {
                // every full 16-token block but the one holding the last token
                assert_eq!(o.cached_tokens, 1520, "{} request {}", r.policy, o.request);
            }
        }
    }
}

/// A trace with shared prefixes, many adapters and more prefix than the KV holds.
fn pressured_trace(n: u64, seed: u64) -> Vec<TraceRequest> {
    let mut state = seed;
    (0..n)
        .map(|i| {
            let r = splitmix64(&mut state);
            let group = (r % 40) * (r % 3 + 1) % 60;
            let depth = 1 + (r >> 8) % 6;
            let mut ids: Vec<u64> = (0..depth).map(|d| group * 100 + d).collect();
            ids.push(1_000_000 + i);
            let input = ids.len() as u64 * 512 - (r >> 16) % 400;
            request(i * 250, &ids, input)
        })
        .collect()
}

#[test]
fn the_oracle_never_loses_to_any_policy() {
    for (seed, gold_pool_share) in [(1u64, 0.0), (2, 0.0), (3, 0.0), (4, 0.5)] {
        let trace = pressured_trace(400, seed);
        let assignment = assign(&trace, Some(&zipf(12, 1.1)), seed, 0.1, 0.2);
        let spec = FleetSpec {
            gold_pool_share,
            ..fleet(3, 900)
        };
        let events = [
            FleetEvent::AddPods {
                count: 1,
                at_s: 40.0,
            },
            FleetEvent::RestartPod {
                index: 0,
                at_s: 70.0,
            },
        ];
        let runs = run(&trace, &assignment, &spec, &events);
        let reports = summaries(&runs, &spec, &events);
        let oracle = reports.iter().find(|r| r.policy == "oracle").unwrap();
        assert_eq!(oracle.requests, 400);
        for p in reports.iter().filter(|r| r.policy != "oracle") {
            assert_eq!(p.requests, 400, "{}", p.policy);
            assert!(
                oracle.token_hit_ratio >= p.token_hit_ratio,
                "seed {seed} {}: {:?} < {:?}",
                p.policy,
                oracle.token_hit_ratio,
                p.token_hit_ratio
            );
            assert!(
                oracle.adapter_hit_ratio >= p.adapter_hit_ratio,
                "seed {seed} {}",
                p.policy
            );
            assert!(
                oracle.gold_adapter_hit_ratio >= p.gold_adapter_hit_ratio,
                "seed {seed} {}",
                p.policy
            );
            for (o, q) in [
                (oracle.ttft_p50_ms, p.ttft_p50_ms),
                (oracle.ttft_p95_ms, p.ttft_p95_ms),
                (oracle.ttft_p99_ms, p.ttft_p99_ms),
            ] {
                assert!(
                    o.unwrap() <= q.unwrap(),
                    "seed {seed} {}: ttft {o:?} > {q:?}",
                    p.policy
                );
            }
        }
        // the bound is not vacuous: the trace has pressure, so no policy hits everything
        assert!(reports.iter().all(|r| r.token_hit_ratio.unwrap() < 0.95));
    }
}

#[test]
fn a_scale_up_without_warm_up_misses_cold_where_prewarm_does_not() {
    // 24 templates (2 blocks each), each sent again and again by its own user; 2 pods, then 2
    // more join at 60 s. Under first_shard_affinity the templates that move to the new pods miss once
    // there; prewarm warms them before the new pods take traffic.
    let mut trace = Vec::new();
    for round in 0..12u64 {
        for g in 0..24u64 {
            let mut r = request(round * 10_000 + g * 100, &[g * 10, g * 10 + 1], 1024);
            r.user = Some(format!("user-{g}"));
            trace.push(r);
        }
    }
    let assignment = assign(&trace, None, 1, 0.1, 0.2);
    let spec = fleet(2, 8192);
    let events = [FleetEvent::AddPods {
        count: 2,
        at_s: 60.0,
    }];
    let runs = run(&trace, &assignment, &spec, &events);
    let cold_after_scale_up = |policy: &str| {
        let r = runs.iter().find(|r| r.policy == policy).unwrap();
        r.outcomes
            .iter()
            .filter(|o| o.arrival_s >= 60.0 && o.cached_tokens == 0)
            .count()
    };
    let on_new_pods = |policy: &str| {
        let r = runs.iter().find(|r| r.policy == policy).unwrap();
        r.outcomes.iter().filter(|o| o.pod >= 2).count()
    };
    assert!(
        cold_after_scale_up("first_shard_affinity") >= 4,
        "first_shard_affinity: {}",
        cold_after_scale_up("first_shard_affinity")
    );
    assert!(on_new_pods("first_shard_affinity") > 0 && on_new_pods("prewarm") > 0);
    // prewarm's bounded load may send a template over its pod's share elsewhere cold once
    assert!(
        cold_after_scale_up("prewarm") <= 1,
        "prewarm: {}",
        cold_after_scale_up("prewarm")
    );
    let warm = runs
        .iter()
        .find(|r| r.policy == "prewarm")
        .unwrap()
        .warmup_prefill_tokens
        .unwrap();
    assert!(warm > 0);
}

#[test]
fn a_gold_pool_keeps_gold_adapters_resident_that_the_long_tail_evicts() {
    // 12 adapters (Zipf), 2 GPU slots a pod, 6 pods: with one pool every pod serves the long
    // tail and swaps its gold adapters out; with a gold pool, sized from demand (the default)
    // or by hand, they stay in their slots.
    for seed in [1u64, 2] {
        let trace = pressured_trace(600, seed);
        let assignment = assign(&trace, Some(&zipf(12, 1.1)), seed, 0.1, 0.2);
        let gold_hit = |tier_pools: bool, gold_pool_share: f64| {
            let spec = FleetSpec {
                tier_pools,
                gold_pool_share,
                ..fleet(6, 4096)
            };
            let runs = run_policies(&trace, &assignment, &spec, &[], &["prewarm".to_string()]);
            let report = summaries(&runs, &spec, &[]).remove(0);
            assert_eq!(report.requests, 600);
            report.gold_adapter_hit_ratio.unwrap()
        };
        let one_pool = gold_hit(false, 0.0);
        for (sized, share) in [("from demand", 0.0), ("by hand", 0.5)] {
            let gold_pool = gold_hit(true, share);
            assert!(
                gold_pool > one_pool,
                "seed {seed}: gold adapter hit {gold_pool} with a gold pool {sized}, {one_pool} without"
            );
        }
    }
}

/// With shared prefill compute a pod sent prompts faster than it prefills them queues them:
/// `first_shard_affinity` piles one prefix's requests onto one pod, whose TTFTs then grow
/// request after request, while with unshared compute each costs its own prefill only. The
/// requests' cache hits do not depend on the model of compute.
#[test]
fn shared_prefill_compute_queues_a_piled_pod() {
    // 20 prompts on one first block, 1,024 new tokens each (256 ms at 250 µs a token),
    // 100 ms apart: the pod's queue grows 156 ms a request.
    let trace: Vec<TraceRequest> = (0..20)
        .map(|i| request(i * 100, &[1, 1_000 + i, 2_000 + i], 8_192))
        .collect();
    let assignment = assign(&trace, None, 1, 0.1, 0.2);
    let outcomes = |compute| {
        let mut spec = fleet(4, 26_624);
        spec.prefill_compute = compute;
        let affinity = ["first_shard_affinity".to_string()];
        let runs = run_policies(&trace, &assignment, &spec, &[], &affinity);
        runs.into_iter().next().unwrap().outcomes
    };
    let (unshared, shared) = (
        outcomes(podsim::PrefillCompute::Unshared),
        outcomes(podsim::PrefillCompute::Shared),
    );
    let cached =
        |o: &[prewarm_replay::outcome::Outcome]| o.iter().map(|r| r.cached_tokens).sum::<u64>();
    assert_eq!(cached(&unshared), cached(&shared));
    let ttft =
        |o: &[prewarm_replay::outcome::Outcome]| o.iter().map(|r| r.ttft_s).collect::<Vec<_>>();
    let (first, last) = (ttft(&unshared)[0], ttft(&unshared)[19]);
    assert!(
        (last - first).abs() < 0.5,
        "unshared: each costs its own prefill: {first} {last}"
    );
    assert!(ttft(&shared)[19] > 5.0 * last, "{:?}", ttft(&shared));
    assert!(
        ttft(&shared).windows(2).all(|w| w[1] >= w[0]),
        "{:?}",
        ttft(&shared)
    );
}

#[test]
fn a_request_sent_away_from_its_cache_counts_what_another_pod_held() {
    // one prompt, again and again, on 4 pods: round robin sends its 2nd to 4th requests to
    // pods that never saw it while pod 0 holds it (1,520 tokens: every full block but the one
    // with the last token); affinity always sends it to the pod holding it
    let trace: Vec<TraceRequest> = (0..8)
        .map(|i| request(i * 1000, &[1, 2, 3], 1536))
        .collect();
    let assignment = assign(&trace, None, 1, 0.1, 0.2);
    let policies = [
        "round_robin".to_string(),
        "first_shard_affinity".to_string(),
    ];
    let runs = run_policies(&trace, &assignment, &fleet(4, 4096), &[], &policies);
    let elsewhere = |policy: &str| -> Vec<u64> {
        let run = runs.iter().find(|r| r.policy == policy).unwrap();
        run.outcomes
            .iter()
            .map(|o| o.cached_elsewhere_tokens.unwrap())
            .collect()
    };
    assert_eq!(elsewhere("round_robin"), [0, 1520, 1520, 1520, 0, 0, 0, 0]);
    assert_eq!(elsewhere("first_shard_affinity"), [0; 8]);
    let reports = summaries(&runs, &fleet(4, 4096), &[]);
    let rr = reports.iter().find(|r| r.policy == "round_robin").unwrap();
    assert_eq!(
        rr.cached_elsewhere_ratio,
        Some(3.0 * 1520.0 / (8.0 * 1536.0))
    );
}
