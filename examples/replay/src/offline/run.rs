//! The offline event loop: one policy over the trace in virtual time, and the evaluation of
//! every policy (the oracle last, from the others' outcomes).

use std::collections::BTreeMap;

use podsim::{LatencyProfile, RequestSpec};
use prewarm_core::FingerprintConfig;
use prewarm_gateway::policy::lora::LoraSlots;
use prewarm_gateway::policy::Tier;

use super::baselines::{FirstShardAffinity, RoundRobin};
use super::dynamo_kv::{DynamoKv, KvRouterConfig};
use super::fleet::Fleet;
use super::oracle::{envelope, OracleInput};
use super::policy::{Policy, RequestCtx};
use super::prewarm::{Prewarm, PrewarmConfig};
use super::sglang_cache_aware::{CacheAwareConfig, SglangCacheAware};
use crate::assign::Assignment;
use crate::outcome::Outcome;
use crate::render::{BlockTexts, ChainMemo};
use crate::scenario::{FleetEvent, FleetSpec};
use crate::trace::TraceRequest;

/// The policies, in report order.
pub const POLICIES: [&str; 6] = [
    "round_robin",
    "first_shard_affinity",
    "sglang_cache_aware",
    "dynamo_kv",
    "prewarm",
    "oracle",
];

/// What a run replays.
pub struct Setup<'a> {
    pub trace: &'a [TraceRequest],
    pub assignment: &'a Assignment,
    pub fleet: &'a FleetSpec,
    pub events: &'a [FleetEvent],
}

/// One policy's run.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    pub policy: String,
    pub outcomes: Vec<Outcome>,
    pub failed: usize,
    pub warmup_prefill_tokens: Option<u64>,
    /// Pod per request (`None`: failed).
    pub pods: Vec<Option<usize>>,
}

/// Work allowed between two requests before the loop gives up on a policy that never settles.
const MAX_STEPS_PER_REQUEST: usize = 1_000_000;

fn adapter_names(assignment: &Assignment) -> Vec<String> {
    let mut names: Vec<String> = assignment.adapters.iter().flatten().cloned().collect();
    names.sort();
    names.dedup();
    names
}

fn apply_event(fleet: &mut Fleet, event: FleetEvent) -> Result<(), String> {
    match event {
        FleetEvent::AddPods { count, .. } => {
            for _ in 0..count {
                fleet.add_pod().map_err(|p| p.join("; "))?;
            }
        }
        FleetEvent::RestartPod { index, .. } => {
            if index >= fleet.pods.len() {
                return Err(format!("--restart-pod: pod {index}: no such pod"));
            }
            fleet.restart(index).map_err(|p| p.join("; "))?;
        }
    }
    Ok(())
}

/// Builds a policy over a fresh fleet.
pub type PolicyFactory = dyn Fn(&Fleet) -> Box<dyn Policy>;

/// Replays the trace through `policy` (built on the fleet by `make`).
pub fn run_policy(setup: &Setup<'_>, make: &PolicyFactory) -> Result<PolicyRun, String> {
    let mut fleet =
        Fleet::new(setup.fleet, &adapter_names(setup.assignment)).map_err(|p| p.join("; "))?;
    let mut policy = make(&fleet);
    let mut events = setup.events.to_vec();
    events.sort_by(|a, b| a.at_s().total_cmp(&b.at_s()));
    let mut next_event = 0usize;
    let mut texts = BlockTexts::default();
    let mut memo = ChainMemo::new(FingerprintConfig::default());
    let base = fleet.base_model().to_string();
    let mut run = PolicyRun {
        policy: policy.name().to_string(),
        outcomes: Vec::with_capacity(setup.trace.len()),
        failed: 0,
        warmup_prefill_tokens: None,
        pods: Vec::with_capacity(setup.trace.len()),
    };
    for (i, r) in setup.trace.iter().enumerate() {
        let now = r.arrival_s();
        let mut steps = 0usize;
        loop {
            steps += 1;
            if steps > MAX_STEPS_PER_REQUEST {
                return Err(format!(
                    "{}: background work does not settle before request {i}",
                    run.policy
                ));
            }
            let ev = events
                .get(next_event)
                .map(FleetEvent::at_s)
                .filter(|t| *t <= now);
            let wake = policy.next_wakeup().filter(|t| *t <= now);
            match (ev, wake) {
                (Some(e), w) if w.is_none_or(|w| e <= w) => {
                    let event = events.get(next_event).copied().ok_or("event")?;
                    next_event += 1;
                    apply_event(&mut fleet, event)?;
                    policy.on_event(&mut fleet, event, e);
                }
                (_, Some(w)) => policy.advance(&mut fleet, w),
                _ => break,
            }
        }
        let adapter = setup.assignment.adapters.get(i).cloned().flatten();
        let tenant = setup.assignment.tenants.get(i).cloned().flatten();
        let tier = setup.assignment.tier_of(tenant.as_deref());
        let model = adapter.clone().unwrap_or_else(|| base.clone());
        let canonical = texts.prompt(r);
        let chain = memo.chain(&model, r, &mut texts);
        // the filter sees the user the client sends: none for a `no_user` request
        let user = r.sent_user();
        let ctx = RequestCtx {
            index: i,
            now_s: now,
            model: &model,
            adapter: adapter.as_deref(),
            tenant: tenant.as_deref(),
            tier,
            user: user.as_deref(),
            canonical: &canonical,
            chain: &chain,
            max_tokens: r.output_length,
        };
        let pod = policy.route(&fleet, &ctx);
        let adapter_hit = adapter.as_deref().map(|a| fleet.adapter_in_slot(pod, a));
        let spec = RequestSpec {
            model: model.clone(),
            canonical_prompt: canonical.clone(),
            max_tokens: Some(r.output_length),
        };
        let best_hit = fleet.best_hit_tokens(adapter.as_deref(), &canonical) as u64;
        match fleet.serve(pod, now, &spec) {
            Ok(admission) => {
                run.outcomes.push(Outcome {
                    request: i,
                    arrival_s: now,
                    pod,
                    prompt_tokens: admission.prompt_tokens as u64,
                    cached_tokens: admission.cached_tokens as u64,
                    cached_elsewhere_tokens: Some(
                        best_hit.saturating_sub(admission.cached_tokens as u64),
                    ),
                    ttft_s: admission.ttft_seconds,
                    adapter_hit,
                    gold: tier == Tier::Gold,
                });
                run.pods.push(Some(pod));
                policy.served(&mut fleet, &ctx, pod, &admission);
            }
            Err(_) => {
                run.failed += 1;
                run.pods.push(None);
            }
        }
    }
    run.warmup_prefill_tokens = policy.warmup_prefill_tokens();
    Ok(run)
}

/// The report row of every run, new-pod windows from `spec` and `events`.
pub fn summaries(
    runs: &[PolicyRun],
    spec: &FleetSpec,
    events: &[FleetEvent],
) -> Vec<crate::outcome::PolicyReport> {
    let windows = crate::scenario::pod_windows(spec.pods, events);
    runs.iter()
        .map(|r| {
            crate::outcome::summarize(
                &r.policy,
                &r.outcomes,
                r.failed,
                r.warmup_prefill_tokens,
                &windows,
            )
        })
        .collect()
}

/// The row the oracle brings beside it: `prewarm`'s routing with Belady eviction on every pod
/// and no queueing (the oracle's bound before its envelope), so that the gap between `prewarm`
/// and the oracle splits into eviction (`prewarm` → this row) and routing and prefetching (this
/// row → the oracle).
pub const PREWARM_BELADY: &str = "prewarm_belady";

/// Runs the chosen policies (report order); the oracle, when chosen, is built from the others'
/// outcomes with the `prewarm` run's routing (`prewarm` runs as its reference even when not
/// chosen).
pub fn evaluate(
    setup: &Setup<'_>,
    policies: &[String],
    mut progress: impl FnMut(&str, f64),
) -> Result<Vec<PolicyRun>, String> {
    let mut runs: Vec<PolicyRun> = Vec::new();
    let spec = setup.fleet;
    let adapters = adapter_names(setup.assignment);
    let tiers: BTreeMap<String, Tier> = setup.assignment.tiers.clone();
    let want = |p: &str| policies.iter().any(|x| x == p);
    let oracle_needs_reference = want("oracle");
    for name in POLICIES.iter().copied().filter(|p| *p != "oracle") {
        let reference_needed = oracle_needs_reference && name == "prewarm";
        if !want(name) && !reference_needed {
            continue;
        }
        let started = std::time::Instant::now();
        let make: Box<PolicyFactory> = match name {
            "round_robin" => Box::new(|_| Box::new(RoundRobin::default())),
            "first_shard_affinity" => {
                Box::new(|_| Box::new(FirstShardAffinity::new(FingerprintConfig::default())))
            }
            "sglang_cache_aware" => Box::new(|fleet| {
                Box::new(SglangCacheAware::new(CacheAwareConfig::default(), fleet))
            }),
            "dynamo_kv" => {
                Box::new(|fleet| Box::new(DynamoKv::new(KvRouterConfig::default(), fleet)))
            }
            _ => {
                let config = PrewarmConfig::for_fleet(
                    spec.kv_blocks,
                    LoraSlots {
                        max_loras: spec.max_loras,
                        max_cpu_loras: spec.max_cpu_loras,
                    },
                    spec.adapter_replicas,
                )
                .with_tier_pools(spec.tier_pools)
                .with_gold_pool_share(spec.gold_pool_share)
                .with_load_factor(spec.load_factor);
                let adapters = adapters.clone();
                let tiers = tiers.clone();
                Box::new(move |fleet| {
                    Box::new(Prewarm::new(
                        config.clone(),
                        fleet,
                        adapters.clone(),
                        tiers.clone(),
                    ))
                })
            }
        };
        let run = run_policy(setup, make.as_ref())?;
        progress(name, started.elapsed().as_secs_f64());
        runs.push(run);
    }
    if want("oracle") {
        let started = std::time::Instant::now();
        let reference = runs
            .iter()
            .find(|r| r.policy == "prewarm")
            .ok_or("oracle: no reference run")?;
        let models: Vec<String> = setup
            .assignment
            .adapters
            .iter()
            .map(|a| {
                a.clone()
                    .unwrap_or_else(|| podsim::PodConfig::default().served_model_name)
            })
            .collect();
        let gold: Vec<bool> = setup
            .assignment
            .tenants
            .iter()
            .map(|t| setup.assignment.tier_of(t.as_deref()) == Tier::Gold)
            .collect();
        let windows = crate::scenario::pod_windows(spec.pods, setup.events);
        let restarts: Vec<Vec<f64>> = windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if i < spec.pods {
                    w.clone()
                } else {
                    w.iter().skip(1).copied().collect()
                }
            })
            .collect();
        let input = OracleInput {
            trace: setup.trace,
            models: &models,
            adapters: &setup.assignment.adapters,
            gold: &gold,
            pods: &reference.pods,
            restarts: &restarts,
            kv_blocks: spec.kv_blocks,
            block_size: podsim::PodConfig::default().block_size,
            max_loras: spec.max_loras,
            latency: LatencyProfile::named(&spec.profile).unwrap_or_default(),
            adapter_rank: spec.adapter_rank,
        };
        let others: Vec<&[Outcome]> = runs.iter().map(|r| r.outcomes.as_slice()).collect();
        let outcomes = envelope(&input, &others);
        // prewarm's routing under Belady eviction alone: the envelope of no other policy
        let belady = envelope(&input, &[]);
        let pods = reference.pods.clone();
        let failed = reference.failed;
        runs.push(PolicyRun {
            policy: PREWARM_BELADY.into(),
            outcomes: belady,
            failed,
            warmup_prefill_tokens: None,
            pods: pods.clone(),
        });
        runs.push(PolicyRun {
            policy: "oracle".into(),
            outcomes,
            failed,
            warmup_prefill_tokens: None,
            pods,
        });
        progress("oracle", started.elapsed().as_secs_f64());
    }
    runs.retain(|r| want(&r.policy) || (r.policy == PREWARM_BELADY && want("oracle")));
    Ok(runs)
}
