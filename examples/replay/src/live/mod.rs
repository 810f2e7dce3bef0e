//! Live replay: the trace over HTTP against a target — Envoy with the prewarm filter, or one pod
//! — at trace timestamps divided by `--time-scale`, each request streamed ([`stream`]): with
//! `--api chat` (the default) as chat messages ([`chat`]: the system prompt, a conversation's
//! earlier turns, the rest), with `--api completions` as a completion of the rendered text; with
//! bounded concurrency, `--max-requests`, `--until-s` and `--duration`.
//!
//! Each request carries `user` (the trace's, else its prefix group, as offline; none for a
//! `no_user` request) and the tenant in `--tenant-header`; with `--api chat`, a request's
//! `tool_blocks` go as its `tools` ([`tools`]). Requests are attributed to the pod named by the
//! `--pod-header` response header (Envoy adds it from `%UPSTREAM_HOST%`), else to the target;
//! which pods are new, the adapter-load estimate and the first requests of prefixes hot at a
//! join are [`records`]'s.
//! It prints `replay: started` when the first request is due (orchestrators time fleet events
//! from it) and, every `--progress-every` seconds, a progress line (sent, done, failed, TTFT p95
//! so far, token hit ratio so far). The report has the offline keys; what a client cannot
//! observe (warm-up cost; adapter hits without `--profile`) is `null`. `--outcomes FILE` writes
//! every request's [`Record`] as JSON lines, which `prewarm-replay report` reads.

pub mod chat;
pub mod records;
pub mod stream;
pub mod tools;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use self::chat::ChatRenderer;
use self::records::{build, Measurements, Reading};
use self::stream::{send, Outgoing, Prompt};
use crate::cli::{prepare, write_outputs, OutputArgs, TraceArgs};
use crate::outcome::{percentile, series, summarize};
use crate::record::{outcomes, write_records, Record};
use crate::render::BlockTexts;
use crate::report::{table, Report};
use crate::scenario::NEW_POD_WINDOW_S;

/// Which OpenAI API the requests are sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `/v1/chat/completions`, the trace rendered as messages.
    Chat,
    /// `/v1/completions`, the rendered text as the prompt.
    Completions,
}

#[derive(Debug, Clone, Args)]
pub struct LiveArgs {
    #[command(flatten)]
    pub common: TraceArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Base URL of Envoy or of a pod, e.g. http://127.0.0.1:10000.
    #[arg(long)]
    pub target: String,
    /// Send chat requests (the trace rendered as messages) or completions.
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub api: Api,
    /// Trace seconds per real second (2 replays twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Requests in flight at most; a request due while all are busy waits.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Stop sending after this many real seconds (in-flight requests are still awaited).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Response header naming the upstream pod.
    #[arg(long, default_value = "x-prewarm-upstream")]
    pub pod_header: String,
    /// Pods (as the header names them) that count as new, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub new_pods: Vec<String>,
    /// Pods first seen at or after this trace second count as new.
    #[arg(long)]
    pub scale_at: Option<f64>,
    /// `POD@T`: POD (as the pod header names it) joined or restarted at trace second T; its
    /// requests count as new from its latest such event (repeatable).
    #[arg(long = "pod-event")]
    pub pod_events: Vec<String>,
    /// The base model name sent when a request has no adapter.
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,
    /// Request header carrying the tenant (the filter's `tenant_header`).
    #[arg(long, default_value = "x-prewarm-tenant")]
    pub tenant_header: String,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 5.0)]
    pub progress_every: f64,
    /// Longest wait for one reply, seconds.
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout: f64,
    /// `max_tokens` at most this (the trace's `output_length` otherwise).
    #[arg(long)]
    pub max_output_tokens: Option<u64>,
    /// Report times in model time: measured times × `--time-scale` (for podsim pods started with
    /// the same `--time-scale`).
    #[arg(long)]
    pub model_time: bool,
    /// Requests of a prefix group before a pod joins that make it hot at the join (the filter's
    /// `triggers.similar_prompts`).
    #[arg(long, default_value_t = prewarm_core::trigger::TriggerConfig::default().similar_prompts as usize)]
    pub hot_requests: usize,
    /// The pods' latency profile (podsim's names): estimate adapter loads from TTFTs.
    #[arg(long)]
    pub profile: Option<String>,
    /// LoRA rank of the adapters, for the adapter-load estimate.
    #[arg(long, default_value_t = 16)]
    pub adapter_rank: u32,
    /// Write every request's record as JSON lines here.
    #[arg(long)]
    pub outcomes: Option<std::path::PathBuf>,
}

/// The live run's scenario, for the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct LiveScenario {
    pub mode: &'static str,
    pub trace: String,
    pub target: String,
    pub api: Api,
    pub adapters: String,
    pub seed: u64,
    /// Tokens of the system prompt every request starts with (0: none).
    pub system_prompt_tokens: u64,
    pub time_scale: f64,
    /// Whether times are model time (× `time_scale`).
    pub model_time: bool,
    pub concurrency: usize,
    pub sent: usize,
    pub pods: Vec<String>,
    pub new_pods: Vec<String>,
    pub new_pod_window_s: f64,
}

fn check(args: &LiveArgs) -> Result<(), String> {
    if !(args.time_scale > 0.0 && args.time_scale.is_finite()) {
        return Err(format!(
            "--time-scale: {}: must be a positive number",
            args.time_scale
        ));
    }
    if !(1..=4096).contains(&args.concurrency) {
        return Err(format!(
            "--concurrency: {}: must be between 1 and 4096",
            args.concurrency
        ));
    }
    if args.progress_every.is_nan() || args.progress_every <= 0.0 {
        return Err(format!(
            "--progress-every: {}: must be positive",
            args.progress_every
        ));
    }
    if args.request_timeout.is_nan() || args.request_timeout <= 0.0 {
        return Err(format!(
            "--request-timeout: {}: must be positive",
            args.request_timeout
        ));
    }
    if args.max_output_tokens == Some(0) {
        return Err("--max-output-tokens: 0: must be at least 1".into());
    }
    if args.hot_requests == 0 {
        return Err("--hot-requests: 0: must be at least 1".into());
    }
    if let Some(name) = &args.profile {
        podsim::LatencyProfile::parse(name).map_err(|e| format!("--profile: {e}"))?;
        // the estimate compares TTFTs with the profile's model-time figures
        if !args.model_time && args.time_scale != 1.0 {
            return Err(format!(
                "--profile: {name:?}: needs --model-time when --time-scale is not 1"
            ));
        }
    }
    pod_events(args)?;
    if !(args.target.starts_with("http://") || args.target.starts_with("https://")) {
        return Err(format!(
            "--target: {:?}: must be an http:// URL",
            args.target
        ));
    }
    Ok(())
}

/// `--pod-event POD@T` values: (pod, trace second).
fn pod_events(args: &LiveArgs) -> Result<Vec<(String, f64)>, String> {
    args.pod_events
        .iter()
        .map(|v| {
            let bad =
                || format!("--pod-event: {v:?}: expected POD@SECONDS, e.g. 127.0.0.1:8001@240");
            let (pod, at) = v.rsplit_once('@').ok_or_else(bad)?;
            let at: f64 = at.trim().trim_end_matches('s').parse().map_err(|_| bad())?;
            if pod.is_empty() || pod.len() > 256 || !(at.is_finite() && at >= 0.0) {
                return Err(bad());
            }
            Ok((pod.to_string(), at))
        })
        .collect()
}

fn progress_line(tally: &Measurements, sent: usize, time_factor: f64) -> String {
    let done = &tally.served;
    let mut ttft: Vec<f64> = done
        .iter()
        .map(|(_, m)| m.ttft_s * time_factor * 1000.0)
        .collect();
    let prompt: u64 = done.iter().filter_map(|(_, m)| m.prompt_tokens).sum();
    let cached: u64 = done.iter().filter_map(|(_, m)| m.cached_tokens).sum();
    format!(
        "progress: sent {sent} done {} failed {} ttft_p95_ms {} hit_ratio {}",
        done.len(),
        tally.failed.len(),
        percentile(&mut ttft, 95.0).map_or_else(|| "-".into(), |v| format!("{v:.1}")),
        if prompt > 0 {
            format!("{:.4}", cached as f64 / prompt as f64)
        } else {
            "-".into()
        },
    )
}

/// `prewarm-replay live`.
pub fn run_live(args: &LiveArgs) -> Result<(), String> {
    check(args)?;
    let (trace, assignment) = prepare(&args.common)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let tally = Arc::new(Mutex::new(Measurements::default()));
    let sent = runtime.block_on(dispatch(args, &trace, &assignment, tally.clone()))?;
    let tally = std::mem::take(&mut *tally.lock().map_err(|_| "tally: poisoned")?);
    if let Some((_, e)) = tally.failed.iter().min_by_key(|(i, _)| *i) {
        eprintln!("prewarm-replay live: first failure: {e}");
    }
    let reading = Reading {
        target: args.target.clone(),
        time_factor: time_factor(args),
        new_pods: args.new_pods.clone(),
        scale_at: args.scale_at,
        events: pod_events(args)?,
        hot_requests: args.hot_requests,
        adapter_estimate: args
            .profile
            .as_deref()
            .and_then(podsim::LatencyProfile::named)
            .map(|p| (p, args.adapter_rank)),
    };
    let records = build(&trace, &assignment, sent, tally, &reading);
    if let Some(path) = &args.outcomes {
        write_records(path, &records)?;
    }
    write_report(args, &records, sent)
}

/// Measured seconds × this = the records' seconds.
fn time_factor(args: &LiveArgs) -> f64 {
    if args.model_time {
        args.time_scale
    } else {
        1.0
    }
}

/// The table on stdout and the `--json`/`--plot` outputs, from the run's records.
fn write_report(args: &LiveArgs, records: &[Record], sent: usize) -> Result<(), String> {
    let run = outcomes(records);
    let warmup_prefill_tokens = None;
    let report_row = summarize(
        "live",
        &run.outcomes,
        run.failed,
        warmup_prefill_tokens,
        &run.windows,
    );
    print!("{}", table(std::slice::from_ref(&report_row)));
    let new_pods: Vec<String> = run
        .pods
        .iter()
        .zip(&run.windows)
        .filter(|(_, w)| !w.is_empty())
        .map(|(p, _)| p.clone())
        .collect();
    let scenario = LiveScenario {
        mode: "live",
        trace: args.common.trace.display().to_string(),
        target: args.target.clone(),
        api: args.api,
        adapters: args.common.adapters.clone(),
        seed: args.common.seed,
        system_prompt_tokens: args.common.system_prompt_tokens,
        time_scale: args.time_scale,
        model_time: args.model_time,
        concurrency: args.concurrency,
        sent,
        pods: run.pods.clone(),
        new_pods,
        new_pod_window_s: NEW_POD_WINDOW_S,
    };
    let mut all_series = BTreeMap::new();
    all_series.insert(
        "live".to_string(),
        series(&run.outcomes, args.output.bucket_s),
    );
    let report = Report {
        scenario,
        policies: vec![report_row],
        series: all_series,
    };
    let marks: Vec<f64> = args.scale_at.into_iter().collect();
    write_outputs(&args.output, &report, &marks)
}

/// Sends the trace; returns how many requests were sent.
async fn dispatch(
    args: &LiveArgs,
    trace: &[crate::trace::TraceRequest],
    assignment: &crate::assign::Assignment,
    tally: Arc<Mutex<Measurements>>,
) -> Result<usize, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let permits = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let start = Instant::now();
    let deadline = args
        .duration
        .map(|d| start + Duration::from_secs_f64(d.max(0.0)));
    let progress_every = Duration::from_secs_f64(args.progress_every);
    let mut next_progress = start + progress_every;
    let timeout = Duration::from_secs_f64(args.request_timeout);
    let limit = args.common.max_requests.unwrap_or(usize::MAX);
    let mut texts = BlockTexts::default();
    let mut chat = ChatRenderer::default();
    let mut tasks = Vec::new();
    let mut sent = 0usize;
    let factor = time_factor(args);
    let report = |tally: &Arc<Mutex<Measurements>>, sent: usize| {
        if let Ok(t) = tally.lock() {
            println!("{}", progress_line(&t, sent, factor));
        }
    };
    let span_s = trace
        .get(..trace.len().min(limit))
        .and_then(<[_]>::last)
        .map_or(0.0, |r| r.arrival_s());
    println!(
        "replay: started: {} requests over {span_s:.0} trace seconds at x{}",
        trace.len().min(limit),
        args.time_scale
    );
    for (i, r) in trace.iter().enumerate().take(limit) {
        let due = start + Duration::from_secs_f64(r.arrival_s() / args.time_scale);
        if deadline.is_some_and(|d| due > d) {
            break;
        }
        while Instant::now() < due {
            let wake = due.min(next_progress);
            tokio::time::sleep_until(wake.into()).await;
            if Instant::now() >= next_progress {
                report(&tally, sent);
                next_progress += progress_every;
            }
        }
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("concurrency: {e}"))?;
        let adapter = assignment.adapters.get(i).cloned().flatten();
        let outgoing = Outgoing {
            model: adapter.unwrap_or_else(|| args.model.clone()),
            prompt: match args.api {
                Api::Chat => {
                    let chat = chat.prompt(r, &mut texts);
                    Prompt::Chat(chat.messages, chat.tools)
                }
                Api::Completions => Prompt::Text(texts.prompt(r)),
            },
            max_tokens: args
                .max_output_tokens
                .map_or(r.output_length, |cap| r.output_length.min(cap)),
            user: r.sent_user(),
            tenant: assignment
                .tenants
                .get(i)
                .cloned()
                .flatten()
                .map(|t| (args.tenant_header.clone(), t)),
        };
        let client = client.clone();
        let target = args.target.clone();
        let header = args.pod_header.clone();
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            let result = send(&client, &target, &header, outgoing, timeout).await;
            drop(permit);
            if let Ok(mut t) = tally.lock() {
                match result {
                    Ok(m) => t.served.push((i, m)),
                    Err(e) => t.failed.push((i, e)),
                }
            }
        }));
        sent += 1;
    }
    let mut pending = futures::future::join_all(tasks);
    loop {
        let tick = tokio::time::sleep_until(next_progress.into());
        tokio::select! {
            _ = &mut pending => break,
            _ = tick => {
                report(&tally, sent);
                next_progress += progress_every;
            }
        }
    }
    report(&tally, sent);
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn live(extra: &[&str]) -> Result<LiveArgs, clap::Error> {
        let mut argv = vec!["prewarm-replay", "live", "--trace", "t.jsonl"];
        argv.extend_from_slice(&["--target", "http://127.0.0.1:1"]);
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Live(a) => Ok(a),
            _ => unreachable!("live was asked for"),
        }
    }

    #[test]
    fn pod_events_name_a_pod_and_a_trace_second() {
        let a = live(&["--pod-event", "127.0.0.1:8001@240s", "--pod-event", "p@0"]).unwrap();
        assert_eq!(
            pod_events(&a).unwrap(),
            [
                ("127.0.0.1:8001".to_string(), 240.0),
                ("p".to_string(), 0.0)
            ]
        );
        for bad in ["127.0.0.1:8001", "@5", "p@-1", "p@x"] {
            let a = live(&["--pod-event", bad]).unwrap();
            assert!(check(&a).unwrap_err().starts_with("--pod-event:"), "{bad}");
        }
    }

    #[test]
    fn chat_is_the_default_api_and_completions_can_be_chosen() {
        assert_eq!(live(&[]).unwrap().api, Api::Chat);
        assert_eq!(
            live(&["--api", "completions"]).unwrap().api,
            Api::Completions
        );
        assert!(live(&["--api", "responses"]).is_err());
    }
}
