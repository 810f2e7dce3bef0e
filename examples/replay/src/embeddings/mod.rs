//! `prewarm-replay embeddings`: the embeddings workload ([`workload`]) over HTTP against a
//! target (Envoy or a pod's `/v1/embeddings`), open loop at the planned arrival times, bounded
//! by `--requests` and `--duration`. It prints one JSON summary: requests, failures, latency
//! percentiles, the workload's repeat share and the replies marked `x-prewarm-cache: hit`.

pub mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::outcome::percentile;
use workload::{load_sharegpt, plan, repeat_share, PlannedRequest, WorkloadSpec};

#[derive(Debug, Clone, Args)]
pub struct EmbeddingsArgs {
    /// ShareGPT JSON (e.g. ../shared/traces/sharegpt-500/prompts.json).
    #[arg(long)]
    pub prompts: PathBuf,
    /// Base URL of Envoy or of a pod, e.g. http://127.0.0.1:10000.
    #[arg(long)]
    pub target: String,
    /// The `model` of every request.
    #[arg(long, default_value = "sentence-transformers/all-MiniLM-L6-v2")]
    pub model: String,
    /// Requests to send (1..=1000000).
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// Send the sequence from its request N on, at once (a later phase of the same workload:
    /// the same popularity and draws as a run that sent the first N).
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// Inputs per request (1..=2048).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Zipf exponent of the prompts' popularity, in [0, 4].
    #[arg(long, default_value_t = 1.0)]
    pub zipf_s: f64,
    /// Mean arrival rate, requests per second.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Seed of the popularity permutation, the draws and the arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Stop sending after this many real seconds.
    #[arg(long, default_value_t = 600.0)]
    pub duration: f64,
    /// Longest wait for one reply, seconds.
    #[arg(long, default_value_t = 60.0)]
    pub request_timeout: f64,
}

/// Every bad flag as `flag: value: rule`.
fn check(args: &EmbeddingsArgs) -> Result<(), String> {
    let mut problems = Vec::new();
    if !(1..=1_000_000).contains(&args.requests) {
        problems.push(format!(
            "--requests: {}: must be in 1..=1000000",
            args.requests
        ));
    }
    if args.start > 10_000_000 {
        problems.push(format!("--start: {}: must be in 0..=10000000", args.start));
    }
    if !(1..=2048).contains(&args.batch) {
        problems.push(format!("--batch: {}: must be in 1..=2048", args.batch));
    }
    if !(args.zipf_s.is_finite() && (0.0..=4.0).contains(&args.zipf_s)) {
        problems.push(format!("--zipf-s: {}: must be in [0, 4]", args.zipf_s));
    }
    if !(args.rate.is_finite() && args.rate > 0.0 && args.rate <= 100_000.0) {
        problems.push(format!("--rate: {}: must be in (0, 100000]", args.rate));
    }
    if !(1..=4096).contains(&args.concurrency) {
        problems.push(format!(
            "--concurrency: {}: must be in 1..=4096",
            args.concurrency
        ));
    }
    for (flag, v) in [
        ("--duration", args.duration),
        ("--request-timeout", args.request_timeout),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
            problems.push(format!("{flag}: {v}: must be in (0, 86400] seconds"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// What one request gave.
#[derive(Debug, Clone, Copy)]
struct Reply {
    seconds: f64,
    ok: bool,
    cache_hit: bool,
}

/// `prewarm-replay embeddings`.
pub fn run_embeddings(args: &EmbeddingsArgs) -> Result<(), String> {
    check(args)?;
    let prompts = load_sharegpt(&args.prompts)?;
    let spec = WorkloadSpec {
        requests: args.start + args.requests,
        batch: args.batch,
        zipf_s: args.zipf_s,
        rate_per_s: args.rate,
        seed: args.seed,
    };
    let planned = later_phase(plan(prompts.len(), &spec), args.start);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let replies = runtime.block_on(send_all(args, &prompts, &planned))?;
    let mut seconds: Vec<f64> = replies.iter().filter(|r| r.ok).map(|r| r.seconds).collect();
    let summary = json!({
        "target": args.target,
        "prompts": prompts.len(),
        "sent": replies.len(),
        "failed": replies.iter().filter(|r| !r.ok).count(),
        "cache_hits": replies.iter().filter(|r| r.cache_hit).count(),
        "repeat_share": repeat_share(planned.get(..replies.len()).unwrap_or(&planned)),
        "zipf_s": args.zipf_s,
        "seed": args.seed,
        "start": args.start,
        "latency_p50_ms": percentile(&mut seconds, 50.0).map(|s| s * 1e3),
        "latency_p99_ms": percentile(&mut seconds, 99.0).map(|s| s * 1e3),
    });
    println!("{summary}");
    Ok(())
}

/// The plan from request `start` on, its times shifted so that the first is due at once.
fn later_phase(mut planned: Vec<PlannedRequest>, start: usize) -> Vec<PlannedRequest> {
    let rest = planned.split_off(start.min(planned.len()));
    let t0 = rest.first().map_or(0.0, |r| r.at_s);
    rest.into_iter()
        .map(|r| PlannedRequest {
            at_s: r.at_s - t0,
            ..r
        })
        .collect()
}

async fn send_all(
    args: &EmbeddingsArgs,
    prompts: &[String],
    planned: &[PlannedRequest],
) -> Result<Vec<Reply>, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.request_timeout))
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let url = format!("{}/v1/embeddings", args.target.trim_end_matches('/'));
    let slots = Arc::new(Semaphore::new(args.concurrency));
    let start = Instant::now();
    let stop = start + Duration::from_secs_f64(args.duration);
    let mut tasks = Vec::with_capacity(planned.len());
    for request in planned {
        let due = start + Duration::from_secs_f64(request.at_s);
        if due >= stop {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| format!("slots: {e}"))?;
        let inputs: Vec<&str> = request
            .inputs
            .iter()
            .filter_map(|i| prompts.get(*i).map(String::as_str))
            .collect();
        let body = json!({"model": args.model, "input": inputs});
        let sent = client.post(&url).json(&body);
        tasks.push(tokio::spawn(async move {
            let began = Instant::now();
            let reply = match sent.send().await {
                Ok(r) => {
                    let cache_hit = r
                        .headers()
                        .get("x-prewarm-cache")
                        .is_some_and(|v| v.as_bytes() == b"hit");
                    let ok = r.status().is_success() && r.bytes().await.is_ok();
                    Reply {
                        seconds: began.elapsed().as_secs_f64(),
                        ok,
                        cache_hit,
                    }
                }
                Err(_) => Reply {
                    seconds: began.elapsed().as_secs_f64(),
                    ok: false,
                    cache_hit: false,
                },
            };
            drop(permit);
            reply
        }));
    }
    let mut replies = Vec::with_capacity(tasks.len());
    for task in tasks {
        replies.push(task.await.map_err(|e| format!("request task: {e}"))?);
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_phase_continues_the_same_sequence_from_now() {
        let spec = |requests| WorkloadSpec {
            requests,
            batch: 1,
            zipf_s: 1.0,
            rate_per_s: 10.0,
            seed: 3,
        };
        let whole = plan(100, &spec(30));
        let phase = later_phase(plan(100, &spec(30)), 20);
        assert_eq!(phase.len(), 10);
        assert_eq!(phase[0].at_s, 0.0);
        for (a, b) in phase.iter().zip(&whole[20..]) {
            assert_eq!(a.inputs, b.inputs);
            assert!((a.at_s - (b.at_s - whole[20].at_s)).abs() < 1e-9);
        }
        assert!(later_phase(plan(100, &spec(5)), 20).is_empty());
    }
}
