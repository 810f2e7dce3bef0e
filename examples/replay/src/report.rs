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

/// Column headers of the text table, and the cells of one row, in the same order.
const HEADERS: [&str; 14] = [
    "policy",
    "tok_hit",
    "elsewhere",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "requests",
    "lora_hit",
    "gold_hit",
    "warm_tokens",
    "new_p95_ms",
    "steady_p95",
    "new_hit",
    "peak_min",
];

/// Markdown headers, same order as [`HEADERS`].
const MD_HEADERS: [&str; 14] = [
    "policy",
    "token hit",
    "cached on another pod",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "TTFT p99 ms",
    "requests",
    "adapter hit",
    "gold adapter hit",
    "warm-up prefill tokens",
    "new pods' first-5-min TTFT p95 ms",
    "steady TTFT p95 ms",
    "new pods' token hit",
    "peak minute load",
];

fn cells(p: &PolicyReport) -> [String; 14] {
    [
        p.policy.clone(),
        f(p.token_hit_ratio, 4),
        f(p.cached_elsewhere_ratio, 4),
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
        f(p.new_pod_token_hit_ratio, 4),
        f(p.peak_minute_load, 2),
    ]
}

fn text_row(out: &mut String, cells: &[String]) {
    for (i, c) in cells.iter().enumerate() {
        let _ = match i {
            0 => write!(out, "{c:<20}"),
            _ => write!(out, " {c:>11}"),
        };
    }
    out.push('\n');
}

/// The table: one row per policy.
pub fn table(policies: &[PolicyReport]) -> String {
    let mut out = String::new();
    text_row(&mut out, &HEADERS.map(str::to_string));
    for p in policies {
        text_row(&mut out, &cells(p));
    }
    out
}

/// The same table as Markdown (`--markdown`, for docs/evaluation.md).
pub fn markdown(policies: &[PolicyReport]) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        MD_HEADERS.join(" | "),
        "---|".repeat(MD_HEADERS.len())
    );
    for p in policies {
        let _ = writeln!(out, "| {} |", cells(p).join(" | "));
    }
    out
}
