//! Per-request records of a live run, as JSON lines (`prewarm-replay live --outcomes FILE`): one
//! object a line, for every request sent (served or failed), in trace order. They hold everything
//! `prewarm-replay report` needs, so a run's figures can be rebuilt, compared with another run's
//! and charted without re-running it.
//!
//! Reading is bounded: at most [`MAX_RECORDS`] lines of at most [`MAX_LINE_BYTES`]; a bad line is
//! an error naming its line and field.

use std::io::{BufRead, Write};
use std::path::Path;

use prewarm_gateway::policy::Tier;
use serde::{Deserialize, Serialize};

use crate::outcome::Outcome;

/// Longest accepted line.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Most records read from one file.
pub const MAX_RECORDS: usize = 1 << 22;

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// Trace index.
    pub request: usize,
    /// Arrival, trace seconds.
    pub arrival_s: f64,
    /// The `user` sent (the trace's, else the prefix group).
    pub user: String,
    /// The prefix group a warm-up would warm it for: its application when the trace names one
    /// (every request of an application shares its system prompt), else its `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Adapter requested (`None`: the base model).
    pub adapter: Option<String>,
    pub tenant: Option<String>,
    /// The tenant's tier (`None`: no tenant).
    pub tier: Option<Tier>,
    /// The pod that served it (the `--pod-header` value, else the target); `None` when failed
    /// before a reply named one.
    pub pod: Option<String>,
    /// Trace second from which its pod counts as new (joined), `None` for the initial pods.
    pub pod_new_since_s: Option<f64>,
    /// Time to first token, ms (model time when the run had `--model-time`); `None`: failed.
    pub ttft_ms: Option<f64>,
    /// Prompt tokens (the reply's usage, else the trace's `input_length`).
    pub prompt_tokens: u64,
    /// Prompt tokens served from the pod's prefix cache (the reply's usage), at most `prompt_tokens`.
    pub cached_tokens: u64,
    /// Tokens of its application's system prompt and tools, the prefix its application's
    /// requests share (the trace's `system_blocks + tool_blocks` blocks of 512 tokens): the
    /// most of it a warm-up can know. `None` when the trace frames none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_tokens: Option<u64>,
    /// Whether its adapter was already loaded: `None` for base-model requests, failures, or
    /// when the run could not tell (no `--profile`).
    pub adapter_hit: Option<bool>,
    /// The first request on a new pod of a prefix group that was hot when that pod joined: the
    /// requests a warm-up can serve warm.
    pub first_hot_at_join: bool,
    /// Why it failed (`None`: served).
    pub error: Option<String>,
}

impl Record {
    pub fn served(&self) -> bool {
        self.error.is_none() && self.ttft_ms.is_some()
    }

    /// Its prefix group: the application, else the user.
    pub fn prefix_group(&self) -> &str {
        self.group.as_deref().unwrap_or(&self.user)
    }
}

/// Writes `records`, one JSON object a line.
pub fn write_records(path: &Path, records: &[Record]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("--outcomes: {}: {e}", path.display());
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut out = std::io::BufWriter::new(file);
    for r in records {
        let line = serde_json::to_string(r).map_err(|e| err(&e))?;
        writeln!(out, "{line}").map_err(|e| err(&e))?;
    }
    out.flush().map_err(|e| err(&e))
}

/// Parses JSON lines of records; see the module docs for the limits.
pub fn parse_records(reader: impl BufRead, name: &str) -> Result<Vec<Record>, String> {
    let mut out = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| format!("{name}: {e}"))?;
        if line.len() > MAX_LINE_BYTES {
            return Err(format!(
                "{name} line {line_no}: {} bytes: longer than {MAX_LINE_BYTES}",
                line.len()
            ));
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if out.len() >= MAX_RECORDS {
            return Err(format!("{name}: more than {MAX_RECORDS} records"));
        }
        let record: Record =
            serde_json::from_slice(&line).map_err(|e| format!("{name} line {line_no}: {e}"))?;
        if record.cached_tokens > record.prompt_tokens {
            return Err(format!(
                "{name} line {line_no}: cached_tokens: {}: more than prompt_tokens {}",
                record.cached_tokens, record.prompt_tokens
            ));
        }
        if !(record.arrival_s.is_finite() && record.arrival_s >= 0.0) {
            return Err(format!(
                "{name} line {line_no}: arrival_s: {}: must be a non-negative number",
                record.arrival_s
            ));
        }
        if record.ttft_ms.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err(format!(
                "{name} line {line_no}: ttft_ms: must be a non-negative number"
            ));
        }
        out.push(record);
    }
    Ok(out)
}

/// Reads a records file.
pub fn read_records(path: &Path) -> Result<Vec<Record>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_records(std::io::BufReader::new(file), &path.display().to_string())
}

/// The served requests as [`Outcome`]s (pods indexed in order of first appearance), the failed
/// count, the pods' names and their new-pod windows (what [`crate::outcome::summarize`] takes).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcomes {
    pub outcomes: Vec<Outcome>,
    pub failed: usize,
    pub pods: Vec<String>,
    pub windows: Vec<Vec<f64>>,
}

/// Splits records into outcomes, failures, pods and windows.
pub fn outcomes(records: &[Record]) -> Outcomes {
    let mut out = Outcomes {
        outcomes: Vec::new(),
        failed: 0,
        pods: Vec::new(),
        windows: Vec::new(),
    };
    for r in records {
        let (Some(ttft_ms), Some(pod), true) = (r.ttft_ms, &r.pod, r.served()) else {
            out.failed += 1;
            continue;
        };
        let index = match out.pods.iter().position(|p| p == pod) {
            Some(i) => i,
            None => {
                out.pods.push(pod.clone());
                out.windows.push(Vec::new());
                out.pods.len() - 1
            }
        };
        // a pod's windows: every event its records name (a join, each restart)
        if let (Some(since), Some(w)) = (r.pod_new_since_s, out.windows.get_mut(index)) {
            if !w.contains(&since) {
                w.push(since);
            }
        }
        out.outcomes.push(Outcome {
            request: r.request,
            arrival_s: r.arrival_s,
            pod: index,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens.min(r.prompt_tokens),
            cached_elsewhere_tokens: None,
            ttft_s: ttft_ms / 1000.0,
            adapter_hit: r.adapter_hit,
            gold: r.tier == Some(Tier::Gold),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(request: usize, pod: Option<&str>, ttft_ms: Option<f64>) -> Record {
        Record {
            request,
            arrival_s: request as f64,
            user: format!("group-{}", request % 3),
            group: None,
            adapter: Some("sg-1".into()),
            tenant: Some("sg-1".into()),
            tier: Some(Tier::Gold),
            pod: pod.map(str::to_string),
            pod_new_since_s: (pod == Some("new")).then_some(1.0),
            ttft_ms,
            prompt_tokens: 100,
            cached_tokens: 40,
            shared_tokens: Some(60),
            adapter_hit: Some(request.is_multiple_of(2)),
            first_hot_at_join: false,
            error: ttft_ms.is_none().then(|| "HTTP 503".to_string()),
        }
    }

    #[test]
    fn records_round_trip_through_json_lines() {
        let dir = std::env::temp_dir().join(format!("prewarm-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("outcomes.jsonl");
        let records = vec![
            record(0, Some("a"), Some(12.5)),
            record(1, None, None),
            record(2, Some("new"), Some(80.0)),
        ];
        write_records(&path, &records).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.lines().all(|l| l.starts_with("{\"request\":")));
        assert_eq!(read_records(&path).unwrap(), records);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outcomes_index_pods_and_windows_and_count_failures() {
        let o = outcomes(&[
            record(0, Some("a"), Some(10.0)),
            record(1, None, None),
            record(2, Some("new"), Some(80.0)),
            record(3, Some("a"), Some(20.0)),
        ]);
        assert_eq!(o.failed, 1);
        assert_eq!(o.pods, ["a", "new"]);
        assert_eq!(o.windows, vec![vec![], vec![1.0]]);
        let pods: Vec<usize> = o.outcomes.iter().map(|x| x.pod).collect();
        assert_eq!(pods, [0, 1, 0]);
        assert!((o.outcomes[1].ttft_s - 0.08).abs() < 1e-12);
        assert!(o.outcomes.iter().all(|x| x.gold));
    }

    #[test]
    fn bad_lines_are_refused_naming_line_and_field() {
        let good = serde_json::to_string(&record(0, Some("a"), Some(1.0))).unwrap();
        let parse = |text: &str| parse_records(text.as_bytes(), "f");
        assert_eq!(parse(&format!("{good}\n\n{good}\n")).unwrap().len(), 2);
        let err = parse(&format!("{good}\n{{\"request\": 1}}\n")).unwrap_err();
        assert!(err.starts_with("f line 2:"), "{err}");
        let more = good.replace("\"cached_tokens\":40", "\"cached_tokens\":400");
        let err = parse(&more).unwrap_err();
        assert!(err.contains("line 1: cached_tokens: 400"), "{err}");
        let err = parse(&good.replace("\"request\":0", "\"request\":0,\"x\":1")).unwrap_err();
        assert!(err.contains("unknown field `x`"), "{err}");
        let long = format!("{good}{}", " ".repeat(MAX_LINE_BYTES));
        assert!(parse(&long).unwrap_err().contains("longer than"));
    }
}
