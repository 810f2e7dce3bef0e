//! The public data the workload is drawn from, all in `--traces-dir` (`../shared/traces`):
//!
//! - `servegen-m-small/chunk-<i>-trace.csv` (ServeGen, Alibaba): per customer, rows
//!   `window_start_s, rate_req_per_s, cv, pattern, param1, param2` over 14 days of 600 s
//!   windows. A customer's **mean rate** is the mean of `rate_req_per_s` over all its windows
//!   (idle ones count as 0: the long-run popularity, no diurnal shape); its **CV** is the mean of
//!   `cv` (the inter-arrival coefficient of variation ServeGen measured in a window) over the
//!   windows with traffic, 1 (Poisson) when none has one.
//! - `sharegpt-500/prompts.json`: real users' first prompts; their token lengths (bytes / 4,
//!   `prewarm_core::tokens`) are the first turns' user messages.
//! - `mt-bench/question.jsonl`: MT-Bench's second turns (follow-ups written against a first
//!   turn); their token lengths are later turns' user messages.
//! - `mooncake-synthetic/synthetic_trace.jsonl`: its `output_length` column is the replies'
//!   lengths.

use std::path::Path;

use prewarm_core::tokens::token_count;

use crate::servegen::Window;
use serde::Deserialize;

/// One ServeGen customer, summarised.
#[derive(Debug, Clone, PartialEq)]
pub struct Customer {
    /// Its chunk number (`chunk-<i>-trace.csv`).
    pub chunk: u32,
    /// Mean requests per second over all windows.
    pub mean_rate: f64,
    /// Mean inter-arrival CV over the windows with traffic.
    pub mean_cv: f64,
}

/// Everything the generator draws from.
#[derive(Debug, Clone, PartialEq)]
pub struct Sources {
    /// By chunk number.
    pub customers: Vec<Customer>,
    /// Tokens of ShareGPT's first prompts.
    pub first_turn_tokens: Vec<u64>,
    /// Tokens of MT-Bench's second turns.
    pub follow_up_tokens: Vec<u64>,
    /// Mooncake's output lengths.
    pub output_tokens: Vec<u64>,
}

/// Reads every source under `dir`; errors name the file.
pub fn load(dir: &Path) -> Result<Sources, String> {
    let sharegpt = dir.join("sharegpt-500/prompts.json");
    let first_turn_tokens = crate::embeddings::workload::load_sharegpt(&sharegpt)?
        .iter()
        .map(|p| token_count(p.len()) as u64)
        .collect();
    let mooncake = dir.join("mooncake-synthetic/synthetic_trace.jsonl");
    let output_tokens = crate::trace::load_trace(&mooncake)
        .map_err(|e| e.to_string())?
        .iter()
        .map(|r| r.output_length)
        .collect();
    Ok(Sources {
        customers: read_customers(&dir.join("servegen-m-small"))?,
        first_turn_tokens,
        follow_up_tokens: read_follow_ups(&dir.join("mt-bench/question.jsonl"))?,
        output_tokens,
    })
}

/// The ServeGen customers of `dir`, by chunk number, summarised.
pub fn read_customers(dir: &Path) -> Result<Vec<Customer>, String> {
    let customers = crate::servegen::read_customers(dir)?;
    customers
        .iter()
        .map(|c| {
            let (mean_rate, mean_cv) = summarise(&c.windows)
                .map_err(|e| format!("{}/chunk-{}-trace.csv: {e}", dir.display(), c.chunk))?;
            Ok(Customer {
                chunk: c.chunk,
                mean_rate,
                mean_cv,
            })
        })
        .collect()
}

/// (mean rate over all windows, mean CV over the windows with one) of a customer.
fn summarise(windows: &[Window]) -> Result<(f64, f64), String> {
    if windows.is_empty() {
        return Err("no windows".into());
    }
    let rate = windows.iter().map(|w| w.rate).sum::<f64>() / windows.len() as f64;
    let cvs: Vec<f64> = windows.iter().filter_map(|w| w.cv).collect();
    let cv = if cvs.is_empty() {
        1.0
    } else {
        cvs.iter().sum::<f64>() / cvs.len() as f64
    };
    Ok((rate, cv))
}

#[derive(Deserialize)]
struct Question {
    turns: Vec<String>,
}

/// Token lengths of MT-Bench's second turns.
fn read_follow_ups(path: &Path) -> Result<Vec<u64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let q: Question = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
        if let Some(turn) = q.turns.get(1).filter(|t| !t.trim().is_empty()) {
            out.push(token_count(turn.len()) as u64);
        }
    }
    if out.is_empty() {
        return Err(format!("{}: no second turns", path.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::servegen::parse_windows;

    #[test]
    fn a_customers_rate_averages_every_window_and_its_cv_the_busy_ones() {
        let csv = "0,0,0,,0,0\n600,3,2.5,Gamma,1,1\n1200,1,1.5,Weibull,1,1\n1800,0,0,,0,0\n";
        let summary = |text: &str| parse_windows(text).and_then(|w| summarise(&w));
        assert_eq!(summary(csv), Ok((1.0, 2.0)));
        assert_eq!(summary("0,0,0,,0,0\n"), Ok((0.0, 1.0)));
        assert!(summary("0,x,0\n").unwrap_err().contains("rate_req_per_s"));
    }

    #[test]
    fn the_shared_traces_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces");
        let s = load(&dir).unwrap();
        assert_eq!(s.customers.len(), 43);
        assert_eq!(s.customers[5].chunk, 5);
        // customer 5 is ServeGen's busiest (≈ 351 req/s on average)
        assert!((s.customers[5].mean_rate - 350.87).abs() < 0.01);
        assert_eq!(s.follow_up_tokens.len(), 80);
        assert!(s.first_turn_tokens.len() > 450);
        assert_eq!(s.output_tokens.len(), 3993);
    }
}
