//! Request traces in the Mooncake format: JSONL, one request a line, with `timestamp` (ms from
//! the trace's start), `input_length` and `output_length` (tokens) and `hash_ids` (ids of
//! 512-token prompt blocks; equal ids are identical prefix blocks), plus the optional fields
//! `adapter`, `tenant` and `user` that this replayer understands.
//!
//! Limits: a line of at most [`MAX_LINE_BYTES`], at most [`MAX_BLOCKS`] block ids a request and
//! [`MAX_INPUT_TOKENS`] prompt tokens; a bad line is an error naming the line and the field.

use std::path::Path;

use serde::Deserialize;

/// Tokens of one trace block.
pub const TRACE_BLOCK_TOKENS: usize = 512;
/// Longest accepted line.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most block ids in one request.
pub const MAX_BLOCKS: usize = 4096;
/// Longest accepted prompt in tokens.
pub const MAX_INPUT_TOKENS: u64 = (MAX_BLOCKS * TRACE_BLOCK_TOKENS) as u64;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRequest {
    /// Arrival, ms from the trace's start.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
    /// LoRA adapter (the request's `model`); when absent the assignment picks one.
    #[serde(default)]
    pub adapter: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("trace line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("trace: no requests")]
    Empty,
}

impl TraceRequest {
    /// Checks the limits; `Err` names the field.
    fn check(&self) -> Result<(), String> {
        if self.input_length == 0 || self.input_length > MAX_INPUT_TOKENS {
            return Err(format!(
                "input_length: {}: must be between 1 and {MAX_INPUT_TOKENS}",
                self.input_length
            ));
        }
        if self.output_length == 0 || self.output_length > 1 << 20 {
            return Err(format!(
                "output_length: {}: must be between 1 and 1048576",
                self.output_length
            ));
        }
        if self.hash_ids.is_empty() || self.hash_ids.len() > MAX_BLOCKS {
            return Err(format!(
                "hash_ids: {} ids: must hold between 1 and {MAX_BLOCKS}",
                self.hash_ids.len()
            ));
        }
        Ok(())
    }

    /// A request without the optional fields (hand-made traces, tests).
    pub fn synthetic(
        timestamp: u64,
        hash_ids: &[u64],
        input_length: u64,
        output_length: u64,
    ) -> Self {
        Self {
            timestamp,
            input_length,
            output_length,
            hash_ids: hash_ids.to_vec(),
            adapter: None,
            tenant: None,
            user: None,
        }
    }

    /// The user the filter's similarity trigger keys on: the trace's `user`, else the prefix
    /// group (`group-<first block id>`), so a group's requests form one user's prompt stream.
    pub fn user_key(&self) -> String {
        self.user
            .clone()
            .unwrap_or_else(|| format!("group-{}", self.hash_ids.first().copied().unwrap_or(0)))
    }

    /// Arrival in seconds.
    pub fn arrival_s(&self) -> f64 {
        self.timestamp as f64 / 1000.0
    }
}

/// Parses a JSONL trace; requests are returned sorted by timestamp (stable).
pub fn parse_trace(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.len() > MAX_LINE_BYTES {
            return Err(TraceError::Line {
                line: line_no,
                message: format!("{} bytes: longer than {MAX_LINE_BYTES}", line.len()),
            });
        }
        let req: TraceRequest = serde_json::from_str(line).map_err(|e| TraceError::Line {
            line: line_no,
            message: e.to_string(),
        })?;
        req.check().map_err(|message| TraceError::Line {
            line: line_no,
            message,
        })?;
        out.push(req);
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

/// Reads and parses a trace file.
pub fn load_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse_trace(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_sorts_and_names_bad_fields() {
        let t = parse_trace(
            "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [1, 2]}\n\
             {\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [3], \"adapter\": \"a\"}\n",
        )
        .unwrap();
        assert_eq!(t[0].timestamp, 1);
        assert_eq!(t[0].adapter.as_deref(), Some("a"));
        let err = parse_trace(
            "{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": [3]}",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 1") && err.contains("input_length"),
            "{err}"
        );
        assert!(parse_trace("not json").is_err());
        assert!(matches!(parse_trace("\n"), Err(TraceError::Empty)));
    }
}
