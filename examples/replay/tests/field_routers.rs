//! The field's routers as baselines (`sglang_cache_aware`, `dynamo_kv`) over real podsim pod
//! models, and the shared-system-prompt scenario that makes a first-shard key degenerate.

use podsim::{Admission, RequestSpec};
use prewarm_core::{BlockChain, FingerprintConfig};
use prewarm_gateway::policy::Tier;
use prewarm_replay::assign::assign;
use prewarm_replay::offline::dynamo_kv::{DynamoKv, KvRouterConfig};
use prewarm_replay::offline::fleet::Fleet;
use prewarm_replay::offline::policy::{Policy, RequestCtx};
use prewarm_replay::offline::run::{evaluate, PolicyRun, Setup};
use prewarm_replay::offline::sglang_cache_aware::{CacheAwareConfig, SglangCacheAware};
use prewarm_replay::render::BlockTexts;
use prewarm_replay::scenario::FleetSpec;
use prewarm_replay::system_prompt::with_system_prompt;
use prewarm_replay::trace::TraceRequest;

fn spec(pods: usize) -> FleetSpec {
    FleetSpec {
        pods,
        profile: "llama-8b-h100".into(),
        kv_blocks: 16_384,
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

/// Routes `request` at `now_s` with `policy`, serves it on the chosen pod (or on `force`) and
/// tells the policy; returns the pod and the admission.
fn send(
    policy: &mut dyn Policy,
    fleet: &mut Fleet,
    texts: &mut BlockTexts,
    request: &TraceRequest,
    now_s: f64,
    force: Option<usize>,
) -> (usize, Admission) {
    let model = fleet.base_model().to_string();
    let canonical = texts.prompt(request);
    let chain = BlockChain::of(&model, canonical.as_bytes(), &FingerprintConfig::default());
    let ctx = RequestCtx {
        index: 0,
        now_s,
        model: &model,
        adapter: None,
        tenant: None,
        tier: Tier::Bronze,
        user: Some("u"),
        canonical: &canonical,
        chain: &chain,
        max_tokens: request.output_length,
    };
    let routed = policy.route(fleet, &ctx);
    let pod = force.unwrap_or(routed);
    let spec = RequestSpec {
        model: model.clone(),
        canonical_prompt: canonical.clone(),
        max_tokens: Some(request.output_length),
    };
    let admission = fleet.serve(pod, now_s, &spec).unwrap();
    policy.served(fleet, &ctx, pod, &admission);
    (routed, admission)
}

#[test]
fn dynamo_prefers_the_pod_holding_the_blocks_unless_its_load_outweighs_the_saving() {
    let mut fleet = Fleet::new(&spec(3), &[]).unwrap();
    let mut policy = DynamoKv::new(KvRouterConfig::default(), &fleet);
    let mut texts = BlockTexts::default();
    let prompt = TraceRequest::synthetic(0, &[1, 2, 3], 1536, 4);
    // pod 1 computes the prompt once (95 full blocks of 16 tokens stay cached)
    send(&mut policy, &mut fleet, &mut texts, &prompt, 0.0, Some(1));
    // a small conversation keeps pod 1 busy: 32 prompt blocks and its output so far, less than
    // the 95 blocks pod 1 saves, more than nothing (the other pods)
    let small = TraceRequest::synthetic(0, &[40], 512, 100_000);
    send(&mut policy, &mut fleet, &mut texts, &small, 9.0, Some(1));
    let (pod, admission) = send(&mut policy, &mut fleet, &mut texts, &prompt, 10.0, None);
    assert_eq!((pod, admission.cached_tokens), (1, 1520));
    // two long conversations keep 2 × 128 more blocks busy on pod 1, more than the 95 it saves
    for (i, ids) in [[50u64, 51, 52, 53], [60, 61, 62, 63]].iter().enumerate() {
        let long = TraceRequest::synthetic(0, ids, 2048, 100_000);
        send(
            &mut policy,
            &mut fleet,
            &mut texts,
            &long,
            20.0 + i as f64,
            Some(1),
        );
    }
    let (pod, _) = send(&mut policy, &mut fleet, &mut texts, &prompt, 30.0, None);
    assert_ne!(pod, 1);
}

#[test]
fn sglang_sends_a_prompt_where_its_tree_holds_it_and_new_prompts_to_the_smallest_tree() {
    let mut fleet = Fleet::new(&spec(3), &[]).unwrap();
    let mut policy = SglangCacheAware::new(CacheAwareConfig::default(), &fleet);
    let mut texts = BlockTexts::default();
    let a = TraceRequest::synthetic(0, &[1, 2, 3], 1536, 4);
    let b = TraceRequest::synthetic(0, &[4, 5], 1024, 4);
    let c = TraceRequest::synthetic(0, &[6], 512, 4);
    // empty trees: the first (smallest) tree; then the next smallest ones
    assert_eq!(
        send(&mut policy, &mut fleet, &mut texts, &a, 0.0, None).0,
        0
    );
    assert_eq!(
        send(&mut policy, &mut fleet, &mut texts, &b, 1.0, None).0,
        1
    );
    assert_eq!(
        send(&mut policy, &mut fleet, &mut texts, &c, 2.0, None).0,
        2
    );
    // a follow-up that extends `b` (2 of its 3 blocks known: 0.67 > 0.3) goes where `b` went
    let b_more = TraceRequest::synthetic(0, &[4, 5, 9], 1536, 4);
    let (pod, admission) = send(&mut policy, &mut fleet, &mut texts, &b_more, 3.0, None);
    assert_eq!((pod, admission.cached_tokens), (1, 1024));
    // one block of `a` in a five-block prompt (0.2 ≤ 0.3): the smallest tree, pod 2's
    let weak = TraceRequest::synthetic(0, &[1, 7, 8, 9, 10], 2560, 4);
    assert_eq!(
        send(&mut policy, &mut fleet, &mut texts, &weak, 4.0, None).0,
        2
    );
}

fn pods_used(run: &PolicyRun) -> usize {
    let mut pods: Vec<usize> = run.pods.iter().flatten().copied().collect();
    pods.sort_unstable();
    pods.dedup();
    pods.len()
}

#[test]
fn a_shared_system_prompt_collapses_the_first_shard_key_but_not_the_field_routers() {
    // 40 conversations of 3 turns each, each turn extending the previous one; the first turn
    // is long enough (2,460 tokens) that a 512-token system prompt alone is a match rate of
    // 0.21, under SGLang's 0.3 threshold
    let mut trace = Vec::new();
    for turn in 0..3u64 {
        for conv in 0..40u64 {
            let ids: Vec<u64> = (0..4 + 2 * turn).map(|k| conv * 10 + k).collect();
            let input = ids.len() as u64 * 512 - 100;
            trace.push(TraceRequest::synthetic(
                (turn * 40 + conv) * 500,
                &ids,
                input,
                8,
            ));
        }
    }
    let assignment = assign(&trace, None, 1, 0.1, 0.2);
    let fleet = spec(4);
    let policies: Vec<String> = ["first_shard_affinity", "sglang_cache_aware", "dynamo_kv"]
        .iter()
        .map(|p| p.to_string())
        .collect();
    let runs_with = |tokens: u64| {
        let trace = with_system_prompt(trace.clone(), tokens);
        let setup = Setup {
            trace: &trace,
            assignment: &assignment,
            fleet: &fleet,
            events: &[],
        };
        evaluate(&setup, &policies, |_, _| {}).unwrap()
    };
    for run in runs_with(0) {
        assert_eq!(pods_used(&run), 4, "{}", run.policy);
    }
    for run in runs_with(512) {
        let used = pods_used(&run);
        if run.policy == "first_shard_affinity" {
            assert_eq!(used, 1, "every key is the system prompt's");
        } else {
            // SGLang spreads new conversations to the smallest trees; Dynamo stays on the pods
            // holding the system prompt until their load outweighs its 32 blocks, and spreads
            // only as far as load pushes it
            assert!(used > 1, "{}: {:?}", run.policy, run.pods);
        }
    }
}
