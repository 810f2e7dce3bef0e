//! The `prewarm-replay` command line: `offline` (virtual time, every policy), `live` (over
//! HTTP), `report` (live runs' per-request records side by side), `assignment` (the adapters,
//! tenants and tiers a trace slice gets), `embeddings` (ShareGPT prompts with Zipf repeats
//! against `/v1/embeddings`) and `workload` (writes the application workload's trace,
//! docs/workload.md). Flags are documented in docs/evaluation.md (`embeddings`: in
//! docs/embeddings.md, `workload`: in docs/workload.md) with their defaults and units.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use podsim::PrefillCompute;

use crate::assign::{assign, read_servegen, zipf, AdapterSource, Assignment};
use crate::offline::run::{evaluate, summaries, Setup, POLICIES};
use crate::outcome::series;
use crate::report::{table, Report};
use crate::scenario::{parse_at, FleetEvent, FleetSpec, Scenario, NEW_POD_WINDOW_S};
use crate::system_prompt::with_system_prompt;
use crate::trace::{load_trace, TraceRequest};

#[derive(Debug, Parser)]
#[command(
    name = "prewarm-replay",
    about = "Replays LLM request traces: offline in virtual time over podsim pod models, or live over HTTP."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every policy over the trace in virtual time (no sockets).
    Offline(OfflineArgs),
    /// The trace over HTTP against a target (Envoy or a pod), streaming.
    Live(crate::live::LiveArgs),
    /// Figures, table and charts of one or more live runs from their per-request records.
    Report(crate::comparison::ReportArgs),
    /// The adapters, tenants and tiers the trace (slice) gets, as JSON on stdout.
    Assignment(TraceArgs),
    /// ShareGPT prompts with Zipf repeats against `/v1/embeddings`; a JSON summary on stdout.
    Embeddings(crate::embeddings::EmbeddingsArgs),
    /// Writes an application workload (docs/workload.md) as a trace; a JSON summary on stdout.
    Workload(crate::workload::WorkloadArgs),
}

/// Which requests of which trace, with which adapters (every subcommand that reads a trace).
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long)]
    pub trace: PathBuf,
    /// Adapter assignment: `none`, `servegen:DIR` or `zipf:N[:S]`.
    #[arg(long, default_value = "none")]
    pub adapters: String,
    /// Seed of the adapter draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Share of tenants (by requests, largest first) that are gold.
    #[arg(long, default_value_t = 0.1)]
    pub gold_share: f64,
    /// Share of tenants after the gold ones that are silver.
    #[arg(long, default_value_t = 0.2)]
    pub silver_share: f64,
    /// Replay only the first N requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Replay only the requests arriving before this trace second.
    #[arg(long)]
    pub until_s: Option<f64>,
    /// Every request's prompt starts with the same system prompt of this many tokens (a
    /// multiple of 512; 0: none).
    #[arg(long, default_value_t = 0)]
    pub system_prompt_tokens: u64,
    /// Every request is sent by a user of its own (an application's visitors): no user repeats
    /// a prompt, so no per-user streak forms and only prefixes hot across users are warmed.
    #[arg(long)]
    pub one_shot_users: bool,
}

/// Where a run's report goes.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the table as Markdown here.
    #[arg(long)]
    pub markdown: Option<PathBuf>,
    /// Write PNG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Time bucket of the series and charts, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub bucket_s: f64,
}

#[derive(Debug, Clone, Args)]
pub struct OfflineArgs {
    #[command(flatten)]
    pub common: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Pods at the start.
    #[arg(long, default_value_t = 8)]
    pub pods: usize,
    /// podsim latency profile (`llama-8b-h100`, `llama-70b-8xh100`).
    #[arg(long, default_value = "llama-8b-h100")]
    pub profile: String,
    /// KV blocks (16 tokens each) per pod; default: what the profile's model has on its GPUs
    /// (26,624 for `llama-8b-h100`; podsim's `profile.rs` derives it).
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// How each pod's concurrent prefills share its compute: `shared` (one after another at the
    /// profile's rate, so a pod that receives more prompt tokens than it can prefill queues
    /// them) or `unshared` (each at the full rate beside any number of others).
    #[arg(long, value_enum, default_value = "unshared")]
    pub prefill_compute: PrefillCompute,
    /// GPU adapter slots per pod (vLLM `--max-loras`).
    #[arg(long, default_value_t = 4)]
    pub max_loras: usize,
    /// Host-memory adapter cache per pod (vLLM `--max-cpu-loras`).
    #[arg(long, default_value_t = 8)]
    pub max_cpu_loras: usize,
    /// LoRA rank of every adapter.
    #[arg(long, default_value_t = 16)]
    pub adapter_rank: u32,
    /// Pods each adapter is placed on at least by `prewarm` (the gateway's
    /// `pods.adapter_replicas`; its set grows with demand).
    #[arg(long, default_value_t = 1)]
    pub adapter_replicas: usize,
    /// `prewarm` with one pool of pods for every tier (the gateway's `pods.tier_pools = false`).
    #[arg(long)]
    pub no_tier_pools: bool,
    /// Share of the pods serving gold tenants' adapters under `prewarm`, the rest serving the
    /// other tiers' (the gateway's `pods.gold_pool_share`; 0: sized from demand), in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    pub gold_pool_share: f64,
    /// `prewarm`'s bounded-load factor (the gateway's `routing.load_factor`; 0: no bound).
    #[arg(long, default_value_t = 1.25)]
    pub load_factor: f64,
    /// `N@Ts`: N cold pods join at T seconds (repeatable).
    #[arg(long = "add-pods")]
    pub add_pods: Vec<String>,
    /// `I@Ts`: pod I restarts cold at T seconds (repeatable).
    #[arg(long = "restart-pod")]
    pub restart_pod: Vec<String>,
    /// Policies to run, comma-separated, from round_robin,first_shard_affinity,
    /// sglang_cache_aware,dynamo_kv,prewarm,oracle.
    #[arg(
        long,
        default_value = "round_robin,first_shard_affinity,sglang_cache_aware,dynamo_kv,prewarm,oracle",
        value_delimiter = ','
    )]
    pub policies: Vec<String>,
}

/// Reads the trace, keeps the slice asked for (the assignment is drawn over the slice), assigns
/// adapters and puts the system prompt in front of every request.
pub fn prepare(args: &TraceArgs) -> Result<(Vec<TraceRequest>, Assignment), String> {
    crate::system_prompt::check(args.system_prompt_tokens)?;
    if let Some(until) = args.until_s {
        if !(until.is_finite() && until > 0.0) {
            return Err(format!("--until-s: {until}: must be a positive number"));
        }
    }
    let mut trace = load_trace(&args.trace).map_err(|e| e.to_string())?;
    if let Some(until) = args.until_s {
        trace.retain(|r| r.arrival_s() < until);
        if trace.is_empty() {
            return Err(format!("--until-s: {until}: no request arrives before it"));
        }
    }
    if let Some(n) = args.max_requests {
        trace.truncate(n.max(1));
    }
    for (name, v) in [
        ("--gold-share", args.gold_share),
        ("--silver-share", args.silver_share),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{name}: {v}: must be in [0, 1]"));
        }
    }
    let source: AdapterSource = args.adapters.parse()?;
    let popularity = match &source {
        AdapterSource::None => None,
        AdapterSource::ServeGen(dir) => Some(read_servegen(dir)?),
        AdapterSource::Zipf { count, exponent } => Some(zipf(*count, *exponent)),
    };
    let assignment = assign(
        &trace,
        popularity.as_ref(),
        args.seed,
        args.gold_share,
        args.silver_share,
    );
    let mut trace = with_system_prompt(trace, args.system_prompt_tokens);
    if args.one_shot_users {
        for (i, r) in trace.iter_mut().enumerate() {
            r.user = Some(format!("visitor-{i}"));
            r.no_user = false;
        }
    }
    Ok((trace, assignment))
}

/// `prewarm-replay assignment`: the slice's adapters, tenants and tiers as JSON on stdout.
pub fn run_assignment(args: &TraceArgs) -> Result<(), String> {
    let (trace, assignment) = prepare(args)?;
    let text = serde_json::to_string_pretty(&assignment.summary(&trace))
        .map_err(|e| format!("assignment: {e}"))?;
    println!("{text}");
    Ok(())
}

/// Writes the JSON report and the charts a run asked for.
pub fn write_outputs<S: serde::Serialize>(
    args: &OutputArgs,
    report: &Report<S>,
    events: &[f64],
) -> Result<(), String> {
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(report).map_err(|e| format!("--json: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("--json: {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, crate::report::markdown(&report.policies))
            .map_err(|e| format!("--markdown: {}: {e}", path.display()))?;
    }
    if let Some(dir) = &args.plot {
        crate::plot::write_charts(dir, &report.series, events)?;
    }
    Ok(())
}

/// `prewarm-replay offline`.
pub fn run_offline(args: &OfflineArgs) -> Result<(), String> {
    for p in &args.policies {
        if !POLICIES.contains(&p.as_str()) {
            return Err(format!("--policies: {p:?}: must be one of {POLICIES:?}"));
        }
    }
    if !(1..=1024).contains(&args.pods) {
        return Err(format!("--pods: {}: must be between 1 and 1024", args.pods));
    }
    if args.adapter_replicas == 0 {
        return Err("--adapter-replicas: 0: must be at least 1".into());
    }
    if !(0.0..1.0).contains(&args.gold_pool_share) {
        return Err(format!(
            "--gold-pool-share: {}: must be in [0, 1)",
            args.gold_pool_share
        ));
    }
    if !(args.load_factor == 0.0 || (1.0..=100.0).contains(&args.load_factor)) {
        return Err(format!(
            "--load-factor: {}: must be 0 (no bound) or in [1, 100]",
            args.load_factor
        ));
    }
    let mut events = Vec::new();
    for v in &args.add_pods {
        let (count, at_s) = parse_at("--add-pods", v)?;
        events.push(FleetEvent::AddPods { count, at_s });
    }
    for v in &args.restart_pod {
        let (index, at_s) = parse_at("--restart-pod", v)?;
        if index >= args.pods {
            return Err(format!(
                "--restart-pod: {v}: pod {index} is not one of the {} initial pods",
                args.pods
            ));
        }
        events.push(FleetEvent::RestartPod { index, at_s });
    }
    let profile =
        podsim::LatencyProfile::parse(&args.profile).map_err(|e| format!("--profile: {e}"))?;
    let kv_blocks = args.kv_blocks.unwrap_or(profile.kv_blocks);
    if !(2..=1 << 24).contains(&kv_blocks) {
        return Err(format!(
            "--kv-blocks: {kv_blocks}: must be between 2 and 16777216"
        ));
    }
    let (trace, assignment) = prepare(&args.common)?;
    let fleet = FleetSpec {
        pods: args.pods,
        profile: args.profile.clone(),
        kv_blocks,
        max_loras: args.max_loras,
        max_cpu_loras: args.max_cpu_loras,
        adapter_rank: args.adapter_rank,
        adapter_replicas: args.adapter_replicas,
        tier_pools: !args.no_tier_pools,
        gold_pool_share: args.gold_pool_share,
        load_factor: (args.load_factor > 0.0).then_some(args.load_factor),
        prefill_compute: args.prefill_compute,
    };
    let setup = Setup {
        trace: &trace,
        assignment: &assignment,
        fleet: &fleet,
        events: &events,
    };
    let runs = evaluate(&setup, &args.policies, |name, secs| {
        eprintln!("prewarm-replay: {name} replayed in {secs:.1} s");
    })?;
    let policies = summaries(&runs, &fleet, &events);
    let series: BTreeMap<String, _> = runs
        .iter()
        .map(|r| (r.policy.clone(), series(&r.outcomes, args.output.bucket_s)))
        .collect();
    print!("{}", table(&policies));
    let scenario = Scenario {
        trace: args.common.trace.display().to_string(),
        requests: trace.len(),
        span_s: trace.last().map_or(0.0, TraceRequest::arrival_s),
        adapters: args.common.adapters.clone(),
        seed: args.common.seed,
        gold_share: args.common.gold_share,
        silver_share: args.common.silver_share,
        system_prompt_tokens: args.common.system_prompt_tokens,
        one_shot_users: args.common.one_shot_users,
        fleet,
        events: events.clone(),
        new_pod_window_s: NEW_POD_WINDOW_S,
    };
    let report = Report {
        scenario,
        policies,
        series,
    };
    let marks: Vec<f64> = events.iter().map(FleetEvent::at_s).collect();
    write_outputs(&args.output, &report, &marks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offline(extra: &[&str]) -> OfflineArgs {
        let mut argv = vec!["prewarm-replay", "offline", "--trace", "/nonexistent.jsonl"];
        argv.extend_from_slice(extra);
        match Cli::parse_from(argv).command {
            Command::Offline(a) => a,
            _ => unreachable!("offline was asked for"),
        }
    }

    #[test]
    fn bad_flags_are_refused_naming_the_flag() {
        let err = |extra: &[&str]| run_offline(&offline(extra)).unwrap_err();
        assert!(err(&["--policies", "lru"]).starts_with("--policies: \"lru\""));
        assert!(err(&["--pods", "0"]).starts_with("--pods: 0"));
        assert!(err(&["--add-pods", "two@600s"]).starts_with("--add-pods:"));
        assert!(err(&["--restart-pod", "9@10s"]).starts_with("--restart-pod: 9@10s"));
        assert!(err(&["--system-prompt-tokens", "100"]).starts_with("--system-prompt-tokens: 100"));
        assert!(err(&[]).contains("/nonexistent.jsonl"));
    }

    #[test]
    fn one_shot_users_give_every_request_a_user_of_its_own() {
        let dir = std::env::temp_dir().join(format!("replay-one-shot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = dir.join("t.jsonl");
        let line =
            r#"{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}"#;
        std::fs::write(&trace, format!("{line}\n{line}\n")).unwrap();
        let args = |extra: &[&str]| {
            let mut argv = vec![
                "prewarm-replay",
                "offline",
                "--trace",
                trace.to_str().unwrap(),
            ];
            argv.extend_from_slice(extra);
            match Cli::parse_from(argv).command {
                Command::Offline(a) => a.common,
                _ => unreachable!("offline was asked for"),
            }
        };
        let (same, _) = prepare(&args(&[])).unwrap();
        assert_eq!(
            same[0].user_key(),
            same[1].user_key(),
            "one prefix group, one user"
        );
        let (own, _) = prepare(&args(&["--one-shot-users"])).unwrap();
        assert_ne!(own[0].user_key(), own[1].user_key());
        std::fs::remove_dir_all(&dir).ok();
    }
}
