//! The application workload (`prewarm-replay workload`): the traffic warm-up exists for, drawn
//! deterministically from public data and written as a Mooncake-format trace that `offline`
//! reads as it is and `live --api chat` renders as chat requests (docs/workload.md).
//!
//! The model, and where each number comes from:
//!
//! - **Applications** ([`apps`]): one per ServeGen customer (`--apps`, default all 43). Its
//!   popularity is the customer's mean request rate over ServeGen's 14 days, all applications
//!   together scaled to `--rps` (default 4, the Mooncake trace's rate, so the evaluator's fleet
//!   sizes apply). Each has a system prompt of log-uniform length in [500, 8,000] tokens in
//!   whole 512-token blocks (Mooncake's granularity); a share (`--tool-share` 0.3) has 1 to 4
//!   blocks of tool definitions; a share (`--adapter-share` 0.3) serves through a LoRA adapter
//!   of its own with the application as tenant, tiered by the evaluator's `--gold-share` /
//!   `--silver-share` over its requests ([`crate::assign`]).
//! - **Arrivals** ([`arrivals`]): each application's conversations start as a gamma renewal
//!   process at its rate divided by the mean turns, with ServeGen's mean inter-arrival CV of the
//!   customer clamped to [0.5, `--max-cv` 4]: bursty, no diurnal shape.
//! - **Conversations** ([`conversations`]): 1 to 3 turns (another turn with probability 0.4);
//!   user messages as long as ShareGPT first prompts (turn 1) and MT-Bench second turns (later);
//!   replies as long as Mooncake's outputs; 30 s mean think time; 20 % of conversations send no
//!   `user`, the rest one of the application's users (2 conversations per user on average).
//! - **Sources** ([`sources`]): all under `--traces-dir` (`../shared/traces`).
//!
//! Every draw comes from a seeded stream ([`draws`]): the same seed and flags write the same
//! bytes.

pub mod apps;
pub mod arrivals;
pub mod conversations;
pub mod draws;
pub mod sources;
pub mod spec;

use std::collections::BTreeSet;

use serde::Serialize;

use self::apps::{plan_applications, Application};
use self::conversations::{conversation, BlockIds, Padding};
use self::draws::{Draws, Purpose};
use self::sources::Sources;
pub use self::spec::WorkloadArgs;
use crate::trace::TraceRequest;

/// A generated workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub applications: Vec<Application>,
    /// In arrival order (a conversation's turns in turn order).
    pub requests: Vec<TraceRequest>,
    pub summary: WorkloadSummary,
}

/// What `prewarm-replay workload` prints (JSON on stdout).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSummary {
    pub requests: usize,
    pub span_s: f64,
    pub conversations: usize,
    pub applications: usize,
    /// Applications with at least one request in the span.
    pub applications_with_requests: usize,
    pub applications_with_tools: usize,
    pub applications_on_adapters: usize,
    /// Share of requests sent through an adapter.
    pub adapter_request_share: f64,
    /// Share of requests without `user`.
    pub no_user_request_share: f64,
    /// Share of requests that continue a conversation (turn 2 or later).
    pub later_turn_share: f64,
    /// Distinct users.
    pub users: usize,
    pub mean_input_tokens: f64,
    /// Mean tokens a turn with a successor had added to its user message (block padding).
    pub mean_padding_tokens: f64,
}

/// The workload of `args` over `sources`; `Err` names the flag.
pub fn generate(args: &WorkloadArgs, sources: &Sources) -> Result<Workload, String> {
    args.check()?;
    if args.apps > sources.customers.len() {
        return Err(format!(
            "--apps: {}: ServeGen has {} customers",
            args.apps,
            sources.customers.len()
        ));
    }
    let applications = plan_applications(args, &sources.customers);
    let mut ids = BlockIds::default();
    let mut padding = Padding::default();
    let mut requests = Vec::new();
    let mut conversations = 0usize;
    for (a, app) in applications.iter().enumerate() {
        let start_rate = app.rate_per_s / args.mean_turns();
        let mut arrivals = Draws::new(args.seed, Purpose::Arrivals, a as u64);
        let starts =
            arrivals::conversation_starts(start_rate, app.cv, args.duration_s, &mut arrivals);
        let mut draws = Draws::new(args.seed, Purpose::Conversations, a as u64);
        for start in starts {
            conversations += 1;
            requests.extend(conversation(
                app,
                start,
                args,
                sources,
                &mut draws,
                &mut ids,
                &mut padding,
            ));
        }
    }
    // stable: a conversation's turns keep their order at equal milliseconds
    requests.sort_by_key(|r| r.timestamp);
    let summary = summarise(&applications, &requests, conversations, padding);
    Ok(Workload {
        applications,
        requests,
        summary,
    })
}

fn summarise(
    apps: &[Application],
    requests: &[TraceRequest],
    conversations: usize,
    padding: Padding,
) -> WorkloadSummary {
    let n = requests.len().max(1) as f64;
    let share =
        |f: &dyn Fn(&TraceRequest) -> bool| requests.iter().filter(|r| f(r)).count() as f64 / n;
    let with_requests: BTreeSet<&str> = requests.iter().filter_map(|r| r.app.as_deref()).collect();
    let users: BTreeSet<&str> = requests.iter().filter_map(|r| r.user.as_deref()).collect();
    WorkloadSummary {
        requests: requests.len(),
        span_s: requests.last().map_or(0.0, TraceRequest::arrival_s),
        conversations,
        applications: apps.len(),
        applications_with_requests: with_requests.len(),
        applications_with_tools: apps.iter().filter(|a| !a.tool_ids.is_empty()).count(),
        applications_on_adapters: apps.iter().filter(|a| a.adapter.is_some()).count(),
        adapter_request_share: share(&|r| r.adapter.is_some()),
        no_user_request_share: share(&|r| r.no_user),
        // every conversation's first turn is in the span (it starts there)
        later_turn_share: 1.0 - conversations.min(requests.len()) as f64 / n,
        users: users.len(),
        mean_input_tokens: requests.iter().map(|r| r.input_length as f64).sum::<f64>() / n,
        mean_padding_tokens: padding.tokens as f64 / padding.turns.max(1) as f64,
    }
}

/// The workload as JSONL, one request a line.
pub fn to_jsonl(requests: &[TraceRequest]) -> Result<String, String> {
    let mut out = String::new();
    for r in requests {
        out.push_str(&serde_json::to_string(r).map_err(|e| format!("workload: {e}"))?);
        out.push('\n');
    }
    Ok(out)
}

/// `prewarm-replay workload`: writes the trace to `--out` and prints the summary as JSON.
pub fn run_workload(args: &WorkloadArgs) -> Result<(), String> {
    args.check()?;
    let sources = sources::load(&args.traces_dir).map_err(|e| format!("--traces-dir: {e}"))?;
    let workload = generate(args, &sources)?;
    let text = to_jsonl(&workload.requests)?;
    std::fs::write(&args.out, text).map_err(|e| format!("--out: {}: {e}", args.out.display()))?;
    let summary =
        serde_json::to_string_pretty(&workload.summary).map_err(|e| format!("workload: {e}"))?;
    println!("{summary}");
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::WorkloadArgs;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// The workload flags of `prewarm-replay workload --out /dev/null EXTRA...`.
    pub fn args(extra: &[&str]) -> WorkloadArgs {
        let mut argv = vec!["prewarm-replay", "workload", "--out", "/dev/null"];
        argv.extend_from_slice(extra);
        match Cli::parse_from(argv).command {
            Command::Workload(a) => a,
            _ => unreachable!("workload was asked for"),
        }
    }
}
