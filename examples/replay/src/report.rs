//! The report: a fixed-width table on stdout and the `--json` document
//! (`{"scenario": ..., "policies": [...], "series": {...}}`), the same for offline and live runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::outcome::{PolicyReport, SeriesPoint};

/// The JSON document.
#[derive(Debug, Clone, Serialize)]
pub struct Report<S: Serialize> {
    pub scenario: S,
    pub policies: Vec<PolicyReport>,
    /// Per policy, token hit ratio and TTFT p95 per time bucket (what `--plot` draws).
    pub series: BTreeMap<String, Vec<SeriesPoint>>,
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

/// The table: one row per policy.
pub fn table(policies: &[PolicyReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>12} {:>11} {:>10}",
        "policy",
        "tok_hit",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "requests",
        "lora_hit",
        "gold_hit",
        "warm_tokens",
        "new_p95_ms",
        "steady_p95"
    );
    for p in policies {
        let _ = writeln!(
            out,
            "{:<12} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>12} {:>11} {:>10}",
            p.policy,
            f(p.token_hit_ratio, 4),
            f(p.ttft_p50_ms, 1),
            f(p.ttft_p95_ms, 1),
            f(p.ttft_p99_ms, 1),
            p.requests.to_string(),
            f(p.adapter_hit_ratio, 4),
            f(p.gold_adapter_hit_ratio, 4),
            p.warmup_prefill_tokens
                .map_or_else(|| "-".to_string(), |t| t.to_string()),
            f(p.new_pod_ttft_p95_ms, 1),
            f(p.steady_ttft_p95_ms, 1),
        );
    }
    out
}

/// The same table as Markdown (for docs/evaluation.md).
pub fn markdown(policies: &[PolicyReport]) -> String {
    let mut out = String::from(
        "| policy | token hit | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | adapter hit | gold adapter hit | warm-up prefill tokens | new pods' first-5-min TTFT p95 ms | steady TTFT p95 ms |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in policies {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.policy,
            f(p.token_hit_ratio, 4),
            f(p.ttft_p50_ms, 1),
            f(p.ttft_p95_ms, 1),
            f(p.ttft_p99_ms, 1),
            f(p.adapter_hit_ratio, 4),
            f(p.gold_adapter_hit_ratio, 4),
            p.warmup_prefill_tokens
                .map_or_else(|| "-".to_string(), |t| t.to_string()),
            f(p.new_pod_ttft_p95_ms, 1),
            f(p.steady_ttft_p95_ms, 1),
        );
    }
    out
}
