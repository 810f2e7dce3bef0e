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

mod figures;
#[cfg(test)]
mod fixtures;
mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

pub use self::figures::{
    summarize_run, FleetObservations, PodCounters, RunSummary, StepProgress, WarmupProgress,
};
pub use self::table::comparison_table;
use crate::outcome::{series, Outcome, SeriesPoint};
use crate::record::{outcomes, read_records, Record};
use crate::scenario::NEW_POD_WINDOW_S;

/// Most runs in one report.
pub const MAX_RUNS: usize = 12;
/// Longest accepted `fleet.json`.
const MAX_FLEET_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// `LABEL=DIR`: a run (its `outcomes.jsonl`, optional `fleet.json`); repeatable, one column
    /// per label, in order; runs with the same label are repeats (median and range).
    #[arg(long = "run", required = true)]
    pub runs: Vec<String>,
    /// Write `summary.json` and `charts/{token_hit_ratio,ttft_p95}.png` here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Time bucket of the charts, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub bucket_s: f64,
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
    use crate::comparison::fixtures::{fixture, fleet};

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
