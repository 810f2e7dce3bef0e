//! Success feedback: a request that used a hot prefix and got a successful, untruncated answer
//! raises that prefix's hotness by the gateway's `success_boost`. The response is watched as it
//! streams, never held or changed: a `200` whose last non-null `finish_reason` (JSON or
//! server-sent events, in any chunking) is anything but `length` — or `length` when the
//! request asked for `max_tokens`, which is then what it wanted — is a success, tallied per VM
//! and folded into one `succeeded` feedback per prefix on the tick (`observe::fold_tally`).
//! A response over [`MAX_WATCHED_BYTES`], or one without a finish reason, counts as nothing.

use prewarm_core::BlockHash;

use crate::host::{Host, Metric};
use crate::response::readable_ok;
use crate::worker::Worker;

/// Most response bytes read looking for the finish reason.
pub const MAX_WATCHED_BYTES: usize = 4 << 20;

const FIELD: &[u8] = b"\"finish_reason\"";
/// Bytes kept between chunks: the field, its colon and spaces, and the longest reason read.
const CARRY: usize = 96;

/// The last non-null `finish_reason` in a body read in chunks.
#[derive(Debug, Default)]
pub struct FinishScanner {
    carry: Vec<u8>,
    last: Option<String>,
}

impl FinishScanner {
    /// Feeds the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut text = std::mem::take(&mut self.carry);
        text.extend_from_slice(chunk);
        let mut from = 0;
        let mut incomplete_at = None;
        while let Some(at) = find(text.get(from..).unwrap_or_default(), FIELD) {
            let start = from + at;
            match value_after(text.get(start + FIELD.len()..).unwrap_or_default()) {
                Value::Reason(r) => self.last = Some(r),
                Value::Null => {}
                Value::Incomplete => {
                    incomplete_at = Some(start);
                    break;
                }
            }
            from = start + FIELD.len();
        }
        let keep_from = incomplete_at.unwrap_or_else(|| text.len().saturating_sub(FIELD.len()));
        self.carry = text.get(keep_from..).unwrap_or_default().to_vec();
        if self.carry.len() > CARRY {
            let cut = self.carry.len() - CARRY;
            self.carry.drain(..cut);
        }
    }

    /// The last non-null reason seen.
    pub fn reason(&self) -> Option<&str> {
        self.last.as_deref()
    }
}

enum Value {
    Reason(String),
    Null,
    Incomplete,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The value after `"finish_reason"`: `: "reason"` or `: null`, with any spaces.
fn value_after(rest: &[u8]) -> Value {
    let mut i = 0;
    let skip = |i: &mut usize| {
        while rest.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
            *i += 1;
        }
    };
    skip(&mut i);
    match rest.get(i) {
        None => return Value::Incomplete,
        Some(b':') => i += 1,
        Some(_) => return Value::Null,
    }
    skip(&mut i);
    match rest.get(i) {
        None => Value::Incomplete,
        Some(b'"') => {
            let body = rest.get(i + 1..).unwrap_or_default();
            match body.iter().take(64).position(|&b| b == b'"') {
                Some(end) => Value::Reason(
                    String::from_utf8_lossy(body.get(..end).unwrap_or_default()).into_owned(),
                ),
                None if body.len() < 64 => Value::Incomplete,
                None => Value::Null,
            }
        }
        Some(_) => Value::Null,
    }
}

/// A routed request that used a hot prefix, its response being watched.
#[derive(Debug)]
pub struct SuccessWatch {
    model: String,
    prefix: BlockHash,
    asked_max_tokens: bool,
    watching: bool,
    read: usize,
    scanner: FinishScanner,
}

impl SuccessWatch {
    pub fn new(model: &str, prefix: BlockHash, asked_max_tokens: bool) -> Self {
        Self {
            model: model.to_string(),
            prefix,
            asked_max_tokens,
            watching: true,
            read: 0,
            scanner: FinishScanner::default(),
        }
    }

    pub fn on_headers<H: Host + ?Sized>(&mut self, host: &H) {
        self.watching = readable_ok(host);
    }

    /// A chunk of `size` bytes; at the end, a success is tallied.
    pub fn on_body<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        size: usize,
        end_of_stream: bool,
    ) {
        if !self.watching {
            return;
        }
        self.read = self.read.saturating_add(size);
        if self.read > MAX_WATCHED_BYTES {
            self.watching = false;
            return;
        }
        if size > 0 {
            match host.response_body(0, size) {
                Some(chunk) => self.scanner.feed(&chunk),
                None => {
                    self.watching = false;
                    return;
                }
            }
        }
        if !end_of_stream {
            return;
        }
        self.watching = false;
        let success = match self.scanner.reason() {
            None => false,
            Some("length") => self.asked_max_tokens,
            Some(_) => true,
        };
        if success && !worker.tally.succeeded(&self.model, self.prefix) {
            host.count(Metric::TallyOverflow, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason_of(chunks: &[&str]) -> Option<String> {
        let mut s = FinishScanner::default();
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.reason().map(str::to_string)
    }

    #[test]
    fn the_last_non_null_reason_is_found_in_any_chunking() {
        let json = r#"{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{}}"#;
        let sse =
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
                   data: {\"choices\":[{\"delta\":{},\"finish_reason\" : \"length\"}]}\n\n\
                   data: [DONE]\n\n";
        for body in [json, sse] {
            let want = reason_of(&[body]);
            for size in 1..body.len() {
                let chunks: Vec<&str> = body
                    .as_bytes()
                    .chunks(size)
                    .map(|c| std::str::from_utf8(c).unwrap_or_default())
                    .collect();
                assert_eq!(reason_of(&chunks), want, "chunks of {size}");
            }
        }
        assert_eq!(reason_of(&[json]).as_deref(), Some("stop"));
        assert_eq!(reason_of(&[sse]).as_deref(), Some("length"));
    }

    #[test]
    fn no_reason_or_only_nulls_is_none() {
        assert_eq!(reason_of(&[r#"{"error":"x"}"#]), None);
        assert_eq!(reason_of(&[r#"{"finish_reason":null}"#]), None);
        assert_eq!(reason_of(&[r#"{"finish_reason":42}"#]), None);
        let huge = format!(r#"{{"finish_reason":"{}"}}"#, "x".repeat(500));
        assert_eq!(reason_of(&[&huge]), None, "not a reason an engine sends");
    }
}
