//! Live replay: the trace over HTTP against a target — Envoy with the prewarm filter, or one pod
//! — at trace timestamps divided by `--time-scale`, each request a streamed completion
//! ([`stream`]), with bounded concurrency, `--max-requests` and `--duration`.
//!
//! Each request carries `user` (the trace's, else its prefix group, as offline) and the tenant
//! in `--tenant-header`. Requests are attributed to the pod named by the `--pod-header` response header (Envoy adds
//! it from `%UPSTREAM_HOST%`), else to the target. Pods in `--new-pods`, or first seen after
//! `--scale-at` trace seconds, are "new": their first 300 trace seconds are the new-pod window.
//! While running, a progress line is printed every `--progress-every` seconds (sent, done,
//! failed, TTFT p95 so far, token hit ratio so far). The report has the offline keys; what a
//! client cannot observe (adapter slot hits, warm-up cost) is `null`.

pub mod stream;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use self::stream::{send, Outgoing};
use crate::cli::{prepare, write_outputs, TraceArgs};
use crate::outcome::{percentile, series, summarize, Outcome};
use crate::render::BlockTexts;
use crate::report::{table, Report};
use crate::scenario::NEW_POD_WINDOW_S;

#[derive(Debug, Clone, Args)]
pub struct LiveArgs {
    #[command(flatten)]
    pub common: TraceArgs,
    /// Base URL of Envoy or of a pod, e.g. http://127.0.0.1:10000.
    #[arg(long)]
    pub target: String,
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
}

/// The live run's scenario, for the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct LiveScenario {
    pub mode: &'static str,
    pub trace: String,
    pub target: String,
    pub adapters: String,
    pub seed: u64,
    pub time_scale: f64,
    pub concurrency: usize,
    pub sent: usize,
    pub pods: Vec<String>,
    pub new_pods: Vec<String>,
    pub new_pod_window_s: f64,
}

#[derive(Debug, Default)]
struct Tally {
    /// (trace index, arrival trace-s, measured) of completed requests.
    done: Vec<(usize, f64, stream::Measured)>,
    failed: usize,
    first_error: Option<String>,
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
    if !(args.target.starts_with("http://") || args.target.starts_with("https://")) {
        return Err(format!(
            "--target: {:?}: must be an http:// URL",
            args.target
        ));
    }
    Ok(())
}

fn progress_line(tally: &Tally, sent: usize) -> String {
    let mut ttft: Vec<f64> = tally
        .done
        .iter()
        .map(|(_, _, m)| m.ttft_s * 1000.0)
        .collect();
    let prompt: u64 = tally
        .done
        .iter()
        .filter_map(|(_, _, m)| m.prompt_tokens)
        .sum();
    let cached: u64 = tally
        .done
        .iter()
        .filter_map(|(_, _, m)| m.cached_tokens)
        .sum();
    format!(
        "progress: sent {sent} done {} failed {} ttft_p95_ms {} hit_ratio {}",
        tally.done.len(),
        tally.failed,
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
    let tally = Arc::new(Mutex::new(Tally::default()));
    let sent = runtime.block_on(dispatch(args, &trace, &assignment, tally.clone()))?;
    let tally = std::mem::take(&mut *tally.lock().map_err(|_| "tally: poisoned")?);
    if let Some(e) = &tally.first_error {
        eprintln!("prewarm-replay live: first failure: {e}");
    }
    // pods in order of first completion; new ones by list or first sight after --scale-at
    let mut done = tally.done;
    done.sort_by_key(|(i, _, _)| *i);
    let mut pods: Vec<String> = Vec::new();
    let mut first_seen: Vec<f64> = Vec::new();
    let mut outcomes = Vec::new();
    for (i, arrival, m) in &done {
        let name = m.pod.clone().unwrap_or_else(|| args.target.clone());
        let pod = match pods.iter().position(|p| *p == name) {
            Some(p) => p,
            None => {
                pods.push(name);
                first_seen.push(*arrival);
                pods.len() - 1
            }
        };
        let prompt = m
            .prompt_tokens
            .unwrap_or_else(|| trace.get(*i).map_or(0, |r| r.input_length));
        outcomes.push(Outcome {
            request: *i,
            arrival_s: *arrival,
            pod,
            prompt_tokens: prompt,
            cached_tokens: m.cached_tokens.unwrap_or(0).min(prompt),
            ttft_s: m.ttft_s,
            adapter_hit: None,
            gold: false,
        });
    }
    let windows: Vec<Vec<f64>> = pods
        .iter()
        .zip(&first_seen)
        .map(|(p, &seen)| {
            let listed = args.new_pods.iter().any(|n| n == p);
            let late = args.scale_at.is_some_and(|at| seen >= at);
            if listed || late {
                vec![args.scale_at.unwrap_or(seen).min(seen)]
            } else {
                Vec::new()
            }
        })
        .collect();
    let report_row = summarize("live", &outcomes, tally.failed, None, &windows);
    print!("{}", table(std::slice::from_ref(&report_row)));
    let new_pods: Vec<String> = pods
        .iter()
        .zip(&windows)
        .filter(|(_, w)| !w.is_empty())
        .map(|(p, _)| p.clone())
        .collect();
    let scenario = LiveScenario {
        mode: "live",
        trace: args.common.trace.display().to_string(),
        target: args.target.clone(),
        adapters: args.common.adapters.clone(),
        seed: args.common.seed,
        time_scale: args.time_scale,
        concurrency: args.concurrency,
        sent,
        pods,
        new_pods,
        new_pod_window_s: NEW_POD_WINDOW_S,
    };
    let mut all_series = BTreeMap::new();
    all_series.insert("live".to_string(), series(&outcomes, args.common.bucket_s));
    let report = Report {
        scenario,
        policies: vec![report_row],
        series: all_series,
    };
    let marks: Vec<f64> = args.scale_at.into_iter().collect();
    write_outputs(&args.common, &report, &marks)
}

/// Sends the trace; returns how many requests were sent.
async fn dispatch(
    args: &LiveArgs,
    trace: &[crate::trace::TraceRequest],
    assignment: &crate::assign::Assignment,
    tally: Arc<Mutex<Tally>>,
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
    let mut tasks = Vec::new();
    let mut sent = 0usize;
    let report = |tally: &Arc<Mutex<Tally>>, sent: usize| {
        if let Ok(t) = tally.lock() {
            println!("{}", progress_line(&t, sent));
        }
    };
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
            prompt: texts.prompt(r),
            max_tokens: r.output_length,
            user: r.user_key(),
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
        let arrival = r.arrival_s();
        tasks.push(tokio::spawn(async move {
            let result = send(&client, &target, &header, outgoing, timeout).await;
            drop(permit);
            if let Ok(mut t) = tally.lock() {
                match result {
                    Ok(m) => t.done.push((i, arrival, m)),
                    Err(e) => {
                        t.failed += 1;
                        t.first_error.get_or_insert(e);
                    }
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
