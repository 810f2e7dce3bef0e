//! Request traces in the Mooncake format: JSONL, one request a line, with `timestamp` (ms from
//! the trace's start), `input_length` and `output_length` (tokens) and `hash_ids` (ids of
//! 512-token prompt blocks; equal ids are identical prefix blocks), plus the optional fields
//! `adapter`, `tenant` and `user` that this replayer understands, and those an application
//! workload (`prewarm-replay workload`, docs/workload.md) adds: `app`, `system_blocks` (how many
//! leading blocks are the application's system prompt), `tool_blocks` (how many blocks after
//! them are its tool definitions) and `no_user` (the client sends no `user`). A trace without
//! them reads as before.
//!
//! Limits: a line of at most [`MAX_LINE_BYTES`], at most [`MAX_BLOCKS`] block ids a request and
//! [`MAX_INPUT_TOKENS`] prompt tokens; a bad line is an error naming the line and the field.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Tokens of one trace block.
pub const TRACE_BLOCK_TOKENS: usize = 512;
/// Longest accepted line.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most block ids in one request.
pub const MAX_BLOCKS: usize = 4096;
/// Longest accepted prompt in tokens.
pub const MAX_INPUT_TOKENS: u64 = (MAX_BLOCKS * TRACE_BLOCK_TOKENS) as u64;

/// One request of a trace (written back with the same fields, absent ones left out).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct TraceRequest {
    /// Arrival, ms from the trace's start.
    pub timestamp: u64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: Vec<u64>,
    /// LoRA adapter (the request's `model`); when absent the assignment picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The application that sent it (a workload's; informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// Leading blocks that are the application's system prompt (chat: the `system` message);
    /// absent: the `--system-prompt-tokens` blocks, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_blocks: Option<usize>,
    /// Blocks after the system prompt that are the application's tool definitions (chat: one
    /// function tool a block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_blocks: Option<usize>,
    /// The client sends no `user` (live sends none; offline it is a user of its own).
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_user: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
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
        let framed = self
            .system_blocks
            .unwrap_or(0)
            .saturating_add(self.tool_blocks.unwrap_or(0));
        if framed > 0
            && (framed >= self.hash_ids.len()
                || framed.saturating_mul(TRACE_BLOCK_TOKENS) as u64 >= self.input_length)
        {
            return Err(format!(
                "system_blocks + tool_blocks: {framed}: must leave the prompt at least one \
                 block and one token after them"
            ));
        }
        if self.no_user && self.user.is_some() {
            return Err("no_user: true with a user: a request has a user or none".into());
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
            app: None,
            system_blocks: None,
            tool_blocks: None,
            no_user: false,
        }
    }

    /// The user the filter's similarity trigger keys on: the trace's `user`, else the prefix
    /// group (`group-<first block id>`), so a group's requests form one user's prompt stream.
    /// A `no_user` request is a user of its own (`anonymous-<last block id>`): a client that
    /// sends no `user` gives the filter no stream to follow, and its requests share a first
    /// block (the application's system prompt) with every other client of the application.
    pub fn user_key(&self) -> String {
        if self.no_user {
            return format!("anonymous-{}", self.hash_ids.last().copied().unwrap_or(0));
        }
        self.user
            .clone()
            .unwrap_or_else(|| format!("group-{}", self.hash_ids.first().copied().unwrap_or(0)))
    }

    /// The `user` a client sends: none for a `no_user` request, else [`Self::user_key`].
    pub fn sent_user(&self) -> Option<String> {
        (!self.no_user).then(|| self.user_key())
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

    #[test]
    fn workload_fields_parse_and_bad_ones_are_named() {
        let line = |extra: &str| {
            format!(
                "{{\"timestamp\": 1, \"input_length\": 1100, \"output_length\": 1, \
                 \"hash_ids\": [1, 2, 3]{extra}}}"
            )
        };
        let t = parse_trace(&line(
            r#", "app": "app-5", "system_blocks": 1, "tool_blocks": 1, "no_user": true"#,
        ))
        .unwrap();
        assert_eq!(t[0].app.as_deref(), Some("app-5"));
        assert_eq!((t[0].system_blocks, t[0].tool_blocks), (Some(1), Some(1)));
        assert!(t[0].no_user && t[0].sent_user().is_none());
        assert_eq!(t[0].user_key(), "anonymous-3");
        for (extra, field) in [
            (r#", "system_blocks": 3"#, "system_blocks + tool_blocks: 3"),
            (
                r#", "system_blocks": 2, "tool_blocks": 1"#,
                "system_blocks + tool_blocks: 3",
            ),
            (r#", "no_user": true, "user": "u""#, "no_user"),
        ] {
            let err = parse_trace(&line(extra)).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }
}
