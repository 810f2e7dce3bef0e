//! ServeGen's per-customer traces (`servegen-m-small/chunk-<i>-trace.csv`): rows
//! `window_start_s, rate_req_per_s, cv, pattern, param1, param2`, one per 600 s window. Read
//! once here for both of their uses: the adapters' popularity by window (`assign`) and the
//! application workload's mean rates and burstiness (`workload`).
//!
//! Limits: at most 10,000 customers and 1,000,000 windows each; a rate that is not a
//! non-negative number is an error naming the file and line. A `cv` that is missing, not a
//! positive number, or in a window without traffic is `None`.

use std::path::{Path, PathBuf};

/// One window of a customer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Requests per second.
    pub rate: f64,
    /// Inter-arrival coefficient of variation, when the window had traffic and ServeGen gave one.
    pub cv: Option<f64>,
}

/// One customer: its chunk number and windows, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomerTrace {
    pub chunk: u32,
    pub windows: Vec<Window>,
}

/// The customers of `dir`, sorted by chunk number; errors name the folder or file.
pub fn read_customers(dir: &Path) -> Result<Vec<CustomerTrace>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut chunks: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let n = name
                .strip_prefix("chunk-")?
                .strip_suffix("-trace.csv")?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    chunks.sort();
    if chunks.is_empty() {
        return Err(format!("{}: no chunk-<i>-trace.csv files", dir.display()));
    }
    chunks
        .into_iter()
        .take(10_000)
        .map(|(chunk, path)| {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let windows = parse_windows(&text).map_err(|e| format!("{} {e}", path.display()))?;
            Ok(CustomerTrace { chunk, windows })
        })
        .collect()
}

/// The windows of one customer's CSV.
pub fn parse_windows(text: &str) -> Result<Vec<Window>, String> {
    let mut windows = Vec::new();
    for (i, line) in text.lines().enumerate().take(1_000_000) {
        let mut cols = line.split(',').map(str::trim);
        let rate = cols.nth(1).and_then(|r| r.parse::<f64>().ok());
        let Some(rate) = rate.filter(|r| r.is_finite() && *r >= 0.0) else {
            return Err(format!(
                "line {}: rate_req_per_s: not a non-negative number",
                i + 1
            ));
        };
        let cv = cols
            .next()
            .and_then(|c| c.parse::<f64>().ok())
            .filter(|c| rate > 0.0 && c.is_finite() && *c > 0.0);
        windows.push(Window { rate, cv });
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_keeps_its_rate_and_a_cv_only_with_traffic() {
        let w = parse_windows("0,0,0.7,,0,0\n600,3,2.5,Gamma,1,1\n1200,1,x,Weibull,1,1\n").unwrap();
        let got: Vec<(f64, Option<f64>)> = w.iter().map(|w| (w.rate, w.cv)).collect();
        assert_eq!(got, [(0.0, None), (3.0, Some(2.5)), (1.0, None)]);
        let err = parse_windows("0,1,1\n0,-1,1\n").unwrap_err();
        assert!(err.starts_with("line 2: rate_req_per_s"), "{err}");
    }
}
