//! The side-by-side table `prewarm-replay report` prints: one row per figure, one column per run.

use std::fmt::Write as _;

use super::figures::RunSummary;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comparison::figures::summarize_run;
    use crate::comparison::fixtures::{fixture, fleet};

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
}
