//! `prewarm-replay report`: one or more live runs side by side, from their per-request
//! [`Record`]s — the table `make demo` prints, `summary.json` and the charts.
//!
//! Each `--run LABEL=DIR` names a directory holding `outcomes.jsonl` (`live --outcomes`) and,
//! optionally, `fleet.json`: what the orchestrator read from the stack after the run (the
//! gateway's warm-up progress of the new pod and prefill counter, the pods' prefix-cache token
//! counters). The figures are [`crate::outcome::summarize`]'s (the offline and live report's
//! definitions, docs/evaluation.md) plus what only per-request records can tell:
//!
//! - new-pod TTFT p50 and steady-state TTFT p50, over the same requests as their p95s;
//! - the first requests of prefixes hot at the join ([`crate::live::records`]): how many, their
//!   TTFT p50 and token hit ratio;
//! - the warm-up cost: prompt tokens the pods computed that no client request explains,
//!   `Σ pods (prefix-cache queries − hits) − Σ served (prompt − cached)` (0 at least), and the
//!   prefills the gateway sent.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::outcome::{
    on_new_pod, percentile, series, steady, summarize, token_hit_ratio, Outcome, PolicyReport,
    SeriesPoint,
};
use crate::record::{outcomes, read_records, Record};
use crate::scenario::NEW_POD_WINDOW_S;

/// Most runs in one report.
pub const MAX_RUNS: usize = 4;
/// Longest accepted `fleet.json`.
const MAX_FLEET_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// `LABEL=DIR`: a run (its `outcomes.jsonl`, optional `fleet.json`); repeatable, one column
    /// each, in order.
    #[arg(long = "run", required = true)]
    pub runs: Vec<String>,
    /// Write `summary.json` and `charts/{token_hit_ratio,ttft_p95}.png` here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Time bucket of the charts, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub bucket_s: f64,
}

/// One pod's prefix-cache token counters (vLLM `vllm:prefix_cache_queries_total`, `_hits_total`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodCounters {
    pub pod: String,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
}

/// Done and total of one warm-up step, as the gateway's `GET /admin/pods/{id}/warmup` has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepProgress {
    pub done: u64,
    pub total: u64,
}

/// The part of the gateway's warm-up object the report uses (the object has more fields, which
/// are the gateway's to add, so unknown fields are ignored here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupProgress {
    #[serde(default)]
    pub phase: String,
    #[serde(default)]
    pub adapters: StepProgress,
    #[serde(default)]
    pub first_tier: StepProgress,
    #[serde(default)]
    pub second_tier: StepProgress,
}

/// What the orchestrator read from the stack after a run (`fleet.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetObservations {
    /// The new pod's warm-up (`null`: it had none).
    #[serde(default)]
    pub new_pod_warmup: Option<WarmupProgress>,
    /// The gateway's `prewarm_prefills_total`.
    #[serde(default)]
    pub gateway_prefills: Option<f64>,
    #[serde(default)]
    pub pods: Vec<PodCounters>,
}

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// `policy` is the run's label; `warmup_prefill_tokens` the warm-up cost (module docs).
    #[serde(flatten)]
    pub figures: PolicyReport,
    pub sent: usize,
    pub new_pod_ttft_p50_ms: Option<f64>,
    pub steady_ttft_p50_ms: Option<f64>,
    /// First requests of prefixes hot at the join.
    pub first_hot_requests: usize,
    pub first_hot_ttft_p50_ms: Option<f64>,
    pub first_hot_token_hit_ratio: Option<f64>,
    /// Prefixes the new pod's warm-up prefilled (both tiers).
    pub warmup_prefixes: Option<u64>,
    pub gateway_prefills: Option<u64>,
    pub fleet: Option<FleetObservations>,
}

fn ttft_ms<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Vec<f64> {
    outcomes.into_iter().map(|o| o.ttft_s * 1000.0).collect()
}

/// The figures of one run.
pub fn summarize_run(
    label: &str,
    records: &[Record],
    fleet: Option<FleetObservations>,
) -> RunSummary {
    let run = outcomes(records);
    let marked: std::collections::HashSet<usize> = records
        .iter()
        .filter(|r| r.first_hot_at_join)
        .map(|r| r.request)
        .collect();
    let first_hot: Vec<&Outcome> = run
        .outcomes
        .iter()
        .filter(|o| marked.contains(&o.request))
        .collect();
    let fresh = run.outcomes.iter().filter(|o| on_new_pod(o, &run.windows));
    let settled = run.outcomes.iter().filter(|o| steady(o, &run.windows));
    let warmup_cost = fleet.as_ref().filter(|f| !f.pods.is_empty()).map(|f| {
        let computed: f64 = f
            .pods
            .iter()
            .map(|p| p.prefix_cache_queries - p.prefix_cache_hits)
            .sum();
        let clients: u64 = run
            .outcomes
            .iter()
            .map(|o| o.prompt_tokens - o.cached_tokens)
            .sum();
        (computed - clients as f64).max(0.0) as u64
    });
    RunSummary {
        figures: summarize(label, &run.outcomes, run.failed, warmup_cost, &run.windows),
        sent: records.len(),
        new_pod_ttft_p50_ms: percentile(&mut ttft_ms(fresh), 50.0),
        steady_ttft_p50_ms: percentile(&mut ttft_ms(settled), 50.0),
        first_hot_requests: first_hot.len(),
        first_hot_ttft_p50_ms: percentile(&mut ttft_ms(first_hot.iter().copied()), 50.0),
        first_hot_token_hit_ratio: token_hit_ratio(first_hot.iter().copied()),
        warmup_prefixes: fleet
            .as_ref()
            .and_then(|f| f.new_pod_warmup.as_ref())
            .map(|w| w.first_tier.done + w.second_tier.done),
        gateway_prefills: fleet
            .as_ref()
            .and_then(|f| f.gateway_prefills)
            .map(|p| p.max(0.0) as u64),
        fleet,
    }
}

/// A table cell.
enum Cell {
    Ms(Option<f64>),
    Ratio(Option<f64>),
    Count(Option<u64>),
    Text(String),
}

/// `1234567` → `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Self::Ms(Some(v)) => format!("{} ms", thousands(v.round().max(0.0) as u64)),
            Self::Ratio(Some(v)) => format!("{:.1} %", 100.0 * v),
            Self::Count(Some(v)) => thousands(*v),
            Self::Text(t) => t.clone(),
            Self::Ms(None) | Self::Ratio(None) | Self::Count(None) => "n/a".into(),
        }
    }
}

type Row = (&'static str, fn(&RunSummary) -> Cell);

/// The table's rows: label and cell.
const ROWS: [Row; 16] = [
    ("new-pod TTFT p50 (first 5 min)", |s| {
        Cell::Ms(s.new_pod_ttft_p50_ms)
    }),
    ("new-pod TTFT p95 (first 5 min)", |s| {
        Cell::Ms(s.figures.new_pod_ttft_p95_ms)
    }),
    ("new-pod token hit ratio", |s| {
        Cell::Ratio(s.figures.new_pod_token_hit_ratio)
    }),
    ("new-pod requests", |s| {
        Cell::Count(Some(s.figures.new_pod_requests as u64))
    }),
    ("  of which first of a prefix hot at the join", |s| {
        Cell::Count(Some(s.first_hot_requests as u64))
    }),
    ("  their TTFT p50", |s| Cell::Ms(s.first_hot_ttft_p50_ms)),
    ("  their token hit ratio", |s| {
        Cell::Ratio(s.first_hot_token_hit_ratio)
    }),
    ("fleet steady-state TTFT p50", |s| {
        Cell::Ms(s.steady_ttft_p50_ms)
    }),
    ("fleet steady-state TTFT p95", |s| {
        Cell::Ms(s.figures.steady_ttft_p95_ms)
    }),
    ("token hit ratio (all requests)", |s| {
        Cell::Ratio(s.figures.token_hit_ratio)
    }),
    ("adapter hit ratio (no disk load)", |s| {
        Cell::Ratio(s.figures.adapter_hit_ratio)
    }),
    ("  gold tenants'", |s| {
        Cell::Ratio(s.figures.gold_adapter_hit_ratio)
    }),
    ("new-pod warm-up: prefixes prefilled", |s| {
        Cell::Count(s.warmup_prefixes)
    }),
    ("gateway prefills sent (all pods)", |s| {
        Cell::Count(s.gateway_prefills)
    }),
    ("warm-up prefill cost (tokens computed)", |s| {
        Cell::Count(s.figures.warmup_prefill_tokens)
    }),
    ("requests sent / failed", |s| {
        Cell::Text(format!("{} / {}", s.sent, s.figures.failed))
    }),
];

/// The side-by-side table: one row per figure, one column per run.
pub fn comparison_table(runs: &[RunSummary]) -> String {
    let mut rows: Vec<Vec<String>> = vec![std::iter::once(String::new())
        .chain(runs.iter().map(|r| r.figures.policy.clone()))
        .collect()];
    for (label, cell) in ROWS {
        rows.push(
            std::iter::once(label.to_string())
                .chain(runs.iter().map(|r| cell(r).text()))
                .collect(),
        );
    }
    let columns = runs.len() + 1;
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (text, &w))| {
                if c == 0 {
                    format!("{text:<w$}")
                } else {
                    format!("{text:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
            let _ = writeln!(out, "{}", rule.join("  "));
        }
    }
    out
}

/// Per run, its fleet's and its new pods' series (what the charts draw).
pub fn comparison_series(
    runs: &[(String, Vec<Record>)],
    bucket_s: f64,
) -> BTreeMap<String, Vec<SeriesPoint>> {
    let mut all = BTreeMap::new();
    for (label, records) in runs {
        let run = outcomes(records);
        let on_new: Vec<Outcome> = run
            .outcomes
            .iter()
            .filter(|o| run.windows.get(o.pod).is_some_and(|w| !w.is_empty()))
            .cloned()
            .collect();
        all.insert(label.clone(), series(&run.outcomes, bucket_s));
        if !on_new.is_empty() {
            all.insert(format!("{label} new pod"), series(&on_new, bucket_s));
        }
    }
    all
}

/// `LABEL=DIR`.
fn parse_run(value: &str) -> Result<(String, PathBuf), String> {
    let bad = |why: &str| format!("--run: {value:?}: {why}");
    let (label, dir) = value
        .split_once('=')
        .ok_or_else(|| bad("expected LABEL=DIR"))?;
    let label = label.trim();
    if label.is_empty() || label.chars().count() > 40 {
        return Err(bad("the label must have 1 to 40 characters"));
    }
    Ok((label.to_string(), PathBuf::from(dir)))
}

fn read_fleet(dir: &Path) -> Result<Option<FleetObservations>, String> {
    let path = dir.join("fleet.json");
    if !path.exists() {
        return Ok(None);
    }
    let size = std::fs::metadata(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if size > MAX_FLEET_BYTES {
        return Err(format!(
            "{}: {size} bytes: longer than {MAX_FLEET_BYTES}",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The `summary.json` document.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    new_pod_window_s: f64,
    runs: &'a [RunSummary],
}

/// `prewarm-replay report`.
pub fn run_report(args: &ReportArgs) -> Result<(), String> {
    if args.runs.len() > MAX_RUNS {
        return Err(format!(
            "--run: {} runs: at most {MAX_RUNS}",
            args.runs.len()
        ));
    }
    if !(args.bucket_s.is_finite() && args.bucket_s > 0.0) {
        return Err(format!(
            "--bucket-s: {}: must be a positive number",
            args.bucket_s
        ));
    }
    let mut runs = Vec::new();
    let mut summaries = Vec::new();
    for value in &args.runs {
        let (label, dir) = parse_run(value)?;
        let records = read_records(&dir.join("outcomes.jsonl"))
            .map_err(|e| format!("--run: {label}: {e}"))?;
        let fleet = read_fleet(&dir).map_err(|e| format!("--run: {label}: {e}"))?;
        summaries.push(summarize_run(&label, &records, fleet));
        runs.push((label, records));
    }
    print!("{}", comparison_table(&summaries));
    let Some(out) = &args.out else {
        return Ok(());
    };
    std::fs::create_dir_all(out).map_err(|e| format!("--out: {}: {e}", out.display()))?;
    let summary = Summary {
        new_pod_window_s: NEW_POD_WINDOW_S,
        runs: &summaries,
    };
    let text = serde_json::to_string_pretty(&summary).map_err(|e| format!("--out: {e}"))?;
    let path = out.join("summary.json");
    std::fs::write(&path, text).map_err(|e| format!("--out: {}: {e}", path.display()))?;
    let mut joins: Vec<f64> = runs
        .iter()
        .flat_map(|(_, records)| records.iter().filter_map(|r| r.pod_new_since_s))
        .collect();
    joins.sort_by(f64::total_cmp);
    joins.dedup();
    crate::plot::write_charts(
        &out.join("charts"),
        &comparison_series(&runs, args.bucket_s),
        &joins,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_gateway::policy::Tier;

    /// A request at `arrival_s` served by `pod` (`None`: failed).
    fn record(request: usize, arrival_s: f64, pod: Option<&str>, ttft_ms: f64) -> Record {
        Record {
            request,
            arrival_s,
            user: format!("group-{}", request % 4),
            adapter: Some("sg-1".into()),
            tenant: Some("sg-1".into()),
            tier: Some(Tier::Gold),
            pod: pod.map(str::to_string),
            pod_new_since_s: (pod == Some("new")).then_some(600.0),
            ttft_ms: pod.map(|_| ttft_ms),
            prompt_tokens: 1000,
            cached_tokens: if pod == Some("new") { 500 } else { 900 },
            adapter_hit: pod.map(|_| request.is_multiple_of(2)),
            first_hot_at_join: false,
            error: pod.is_none().then(|| "HTTP 503".into()),
        }
    }

    fn fixture() -> Vec<Record> {
        let mut records = vec![
            record(0, 100.0, Some("old"), 100.0),
            record(1, 400.0, Some("old"), 200.0),
            record(2, 500.0, Some("old"), 300.0),
            record(3, 610.0, Some("new"), 1000.0),
            record(4, 620.0, Some("new"), 3000.0),
            record(5, 700.0, Some("old"), 400.0),
            record(6, 800.0, None, 0.0),
        ];
        records[4].first_hot_at_join = true;
        records
    }

    fn fleet() -> FleetObservations {
        serde_json::from_str(
            r#"{"new_pod_warmup": {"phase": "done", "routable": true,
                  "adapters": {"done": 1, "total": 2, "in_flight": 0},
                  "first_tier": {"done": 7, "total": 7}, "second_tier": {"done": 3, "total": 5}},
                "gateway_prefills": 12,
                "pods": [{"pod": "old", "prefix_cache_queries": 9000, "prefix_cache_hits": 4000},
                         {"pod": "new", "prefix_cache_queries": 3000, "prefix_cache_hits": 1000}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_run_summary_holds_the_demo_figures() {
        let s = summarize_run("prewarm", &fixture(), Some(fleet()));
        assert_eq!((s.sent, s.figures.requests, s.figures.failed), (7, 6, 1));
        assert_eq!(s.figures.new_pod_requests, 2);
        assert_eq!(s.new_pod_ttft_p50_ms, Some(1000.0));
        assert_eq!(s.figures.new_pod_ttft_p95_ms, Some(3000.0));
        assert_eq!(s.figures.new_pod_token_hit_ratio, Some(0.5));
        // steady: arrivals from 300 s not on the new pod in its window
        assert_eq!(s.steady_ttft_p50_ms, Some(300.0));
        assert_eq!(s.figures.steady_ttft_p95_ms, Some(400.0));
        assert_eq!(s.first_hot_requests, 1);
        assert_eq!(s.first_hot_ttft_p50_ms, Some(3000.0));
        assert_eq!(s.first_hot_token_hit_ratio, Some(0.5));
        assert_eq!(s.figures.adapter_hit_ratio, Some(0.5));
        assert_eq!(s.warmup_prefixes, Some(10));
        assert_eq!(s.gateway_prefills, Some(12));
        // pods computed 7,000 uncached tokens; clients' requests explain 4 × 100 + 2 × 500
        assert_eq!(s.figures.warmup_prefill_tokens, Some(5600));
        let bare = summarize_run("off", &fixture(), None);
        assert_eq!(bare.figures.warmup_prefill_tokens, None);
        assert_eq!(bare.warmup_prefixes, None);
    }

    #[test]
    fn the_table_puts_runs_side_by_side() {
        let a = summarize_run("prewarm", &fixture(), Some(fleet()));
        let b = summarize_run("warm-up disabled", &fixture()[..3], None);
        let text = comparison_table(&[a, b]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), ROWS.len() + 2);
        assert!(lines[0].ends_with("prewarm  warm-up disabled"), "{text}");
        let row = |label: &str| {
            lines
                .iter()
                .find(|l| l.starts_with(label))
                .map(|l| {
                    l.split("  ")
                        .filter(|c| !c.is_empty())
                        .map(str::trim)
                        .collect::<Vec<_>>()
                })
                .unwrap()
        };
        assert_eq!(
            row("new-pod TTFT p95"),
            ["new-pod TTFT p95 (first 5 min)", "3,000 ms", "n/a"]
        );
        assert_eq!(
            row("token hit ratio (all"),
            ["token hit ratio (all requests)", "76.7 %", "90.0 %"]
        );
        assert_eq!(
            row("warm-up prefill cost"),
            ["warm-up prefill cost (tokens computed)", "5,600", "n/a"]
        );
        assert_eq!(
            row("requests sent"),
            ["requests sent / failed", "7 / 1", "3 / 0"]
        );
        assert_eq!(thousands(1_042_295), "1,042,295");
        assert_eq!(thousands(203), "203");
    }

    #[test]
    fn report_writes_summary_and_charts_from_run_directories() {
        let dir = std::env::temp_dir().join(format!("prewarm-report-{}", std::process::id()));
        let run = dir.join("prewarm");
        std::fs::create_dir_all(&run).unwrap();
        crate::record::write_records(&run.join("outcomes.jsonl"), &fixture()).unwrap();
        std::fs::write(
            run.join("fleet.json"),
            serde_json::to_string(&fleet()).unwrap(),
        )
        .unwrap();
        let out = dir.join("out");
        let args = ReportArgs {
            runs: vec![format!("prewarm={}", run.display())],
            out: Some(out.clone()),
            bucket_s: 60.0,
        };
        run_report(&args).unwrap();
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        let first = &summary["runs"][0];
        assert_eq!(first["policy"], "prewarm");
        assert_eq!(first["first_hot_requests"], 1);
        assert_eq!(first["warmup_prefill_tokens"], 5600);
        assert_eq!(first["fleet"]["gateway_prefills"], 12.0);
        for chart in ["token_hit_ratio.png", "ttft_p95.png"] {
            let bytes = std::fs::read(out.join("charts").join(chart)).unwrap();
            assert_eq!(bytes.get(..4), Some(&b"\x89PNG"[..]));
        }
        let series = comparison_series(&[("prewarm".into(), fixture())], 60.0);
        assert_eq!(
            series.keys().collect::<Vec<_>>(),
            ["prewarm", "prewarm new pod"]
        );
        let bad = |runs: Vec<String>| {
            run_report(&ReportArgs {
                runs,
                out: None,
                bucket_s: 30.0,
            })
            .unwrap_err()
        };
        assert!(bad(vec!["nolabel".into()]).starts_with("--run: \"nolabel\""));
        let missing = bad(vec![format!("x={}", dir.join("none").display())]);
        assert!(missing.starts_with("--run: x:") && missing.contains("outcomes.jsonl"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
