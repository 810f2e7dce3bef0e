//! The side-by-side table `prewarm-replay report` prints: one row per figure, one column per
//! label. Runs given the same label are repeats of one configuration: their column shows each
//! figure's median and, in brackets, the lowest and highest of the repeats (a machine shared
//! with other work moves figures between runs; the spread says how far).

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
    /// The number a numeric cell holds.
    fn number(&self) -> Option<f64> {
        match self {
            Self::Ms(v) | Self::Ratio(v) => *v,
            Self::Count(v) => v.map(|n| n as f64),
            Self::Text(_) => None,
        }
    }

    /// The same kind of cell holding `v`.
    fn with(&self, v: f64) -> Self {
        match self {
            Self::Ms(_) => Self::Ms(Some(v)),
            Self::Ratio(_) => Self::Ratio(Some(v)),
            Self::Count(_) => Self::Count(Some(v.round().max(0.0) as u64)),
            Self::Text(_) => Self::Text(String::new()),
        }
    }

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
const ROWS: [Row; 19] = [
    ("new-pod TTFT p50 (first 5 min)", |s| {
        Cell::Ms(s.new_pod_ttft_p50_ms)
    }),
    ("new-pod TTFT p95 (first 5 min)", |s| {
        Cell::Ms(s.figures.new_pod_ttft_p95_ms)
    }),
    ("new-pod token hit ratio", |s| {
        Cell::Ratio(s.figures.new_pod_token_hit_ratio)
    }),
    ("new-pod adapter hit ratio", |s| {
        Cell::Ratio(s.figures.new_pod_adapter_hit_ratio)
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
    ("  of their system prompt + tools", |s| {
        Cell::Ratio(s.first_hot_shared_hit_ratio)
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
    ("new pods' warm-ups: prefixes prefilled", |s| {
        Cell::Count(s.warmup_prefixes)
    }),
    ("restarts the gateway saw (no failed check)", |s| {
        Cell::Count(
            s.fleet
                .as_ref()
                .and_then(|f| f.gateway_restarts)
                .map(|n| n.max(0.0) as u64),
        )
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

/// One label's cell of a figure over its repeats: the cell itself for one run; else the
/// median (the lower middle of an even count: a count stays a count) and `[lowest–highest]`
/// of the repeats that have the figure, `n/a` when none has it; texts are joined with ` · `.
fn spread(cells: &[Cell]) -> String {
    let [one] = cells else {
        let mut numbers: Vec<f64> = cells.iter().filter_map(Cell::number).collect();
        let Some(kind) = cells.first() else {
            return String::new();
        };
        if let Cell::Text(_) = kind {
            let texts: Vec<String> = cells.iter().map(Cell::text).collect();
            return texts.join(" · ");
        }
        numbers.sort_by(f64::total_cmp);
        let middle = numbers.len().saturating_sub(1) / 2;
        let (Some(lo), Some(hi), Some(median)) = (
            numbers.first(),
            numbers.last(),
            numbers.get(middle).copied(),
        ) else {
            return "n/a".into();
        };
        return format!(
            "{} [{}–{}]",
            kind.with(median).text(),
            kind.with(*lo).text(),
            kind.with(*hi).text()
        );
    };
    one.text()
}

/// The side-by-side table: one row per figure, one column per label (its runs in input order,
/// repeats of a label together, [`spread`]).
pub fn comparison_table(runs: &[RunSummary]) -> String {
    let mut labels: Vec<&str> = Vec::new();
    for r in runs {
        if !labels.contains(&r.figures.policy.as_str()) {
            labels.push(&r.figures.policy);
        }
    }
    let repeats = |label: &str| -> Vec<&RunSummary> {
        runs.iter().filter(|r| r.figures.policy == label).collect()
    };
    let mut rows: Vec<Vec<String>> = vec![std::iter::once(String::new())
        .chain(labels.iter().map(|l| match repeats(l).len() {
            1 => l.to_string(),
            n => format!("{l} ({n} runs)"),
        }))
        .collect()];
    for (label, cell) in ROWS {
        rows.push(
            std::iter::once(label.to_string())
                .chain(labels.iter().map(|l| {
                    let cells: Vec<Cell> = repeats(l).into_iter().map(cell).collect();
                    spread(&cells)
                }))
                .collect(),
        );
    }
    let columns = labels.len() + 1;
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

    fn a_copy() -> RunSummary {
        summarize_run("prewarm", &fixture(), Some(fleet()))
    }

    fn b_copy() -> RunSummary {
        summarize_run("warm-up disabled", &fixture()[..3], None)
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
            row("  of their system prompt"),
            ["of their system prompt + tools", "62.5 %", "n/a"]
        );
        assert_eq!(
            row("requests sent"),
            ["requests sent / failed", "7 / 1", "3 / 0"]
        );
        assert_eq!(thousands(1_042_295), "1,042,295");
        // repeats of a label: one column, the median and the range
        let again = summarize_run("prewarm", &fixture()[..3], None);
        let text = comparison_table(&[a_copy(), b_copy(), again]);
        assert!(
            text.lines().next().unwrap().contains("prewarm (2 runs)"),
            "{text}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("token hit ratio (all"))
            .unwrap();
        assert!(line.contains("76.7 % [76.7 %–90.0 %]"), "{line}");
        assert_eq!(thousands(203), "203");
    }
}
