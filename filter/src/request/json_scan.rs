//! Reading one field's value out of a JSON (or server-sent events) response body as it streams
//! by in chunks of any size, without parsing or holding the body: the last non-null value of a
//! `"field"` with a short string or an unsigned integer value. A value longer than the longest
//! an engine sends ([`MAX_VALUE`]) counts as no value.

/// Longest value read, bytes.
const MAX_VALUE: usize = 64;

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string: `"field": "value"`.
    Text,
    /// An unsigned integer: `"field": 123`.
    Count,
}

/// The last value of one field in a body read in chunks.
#[derive(Debug)]
pub struct FieldScanner {
    /// The field's name with its quotes.
    needle: Vec<u8>,
    kind: Kind,
    carry: Vec<u8>,
    last: Option<String>,
}

enum Value {
    Found(String),
    Null,
    Incomplete,
}

impl FieldScanner {
    /// A scanner of `"<field>"`.
    pub fn new(field: &str, kind: Kind) -> Self {
        Self {
            needle: format!("\"{field}\"").into_bytes(),
            kind,
            carry: Vec::new(),
            last: None,
        }
    }

    /// Feeds the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut text = std::mem::take(&mut self.carry);
        text.extend_from_slice(chunk);
        let mut from = 0;
        let mut incomplete_at = None;
        while let Some(at) = find(text.get(from..).unwrap_or_default(), &self.needle) {
            let start = from + at;
            let rest = text.get(start + self.needle.len()..).unwrap_or_default();
            match value_after(rest, self.kind) {
                Value::Found(v) => self.last = Some(v),
                Value::Null => {}
                Value::Incomplete => {
                    incomplete_at = Some(start);
                    break;
                }
            }
            from = start + self.needle.len();
        }
        let keep_from =
            incomplete_at.unwrap_or_else(|| text.len().saturating_sub(self.needle.len()));
        self.carry = text.get(keep_from..).unwrap_or_default().to_vec();
        // the field, its colon and spaces, and the longest value read
        let bound = self.needle.len() + 32 + MAX_VALUE;
        if self.carry.len() > bound {
            let cut = self.carry.len() - bound;
            self.carry.drain(..cut);
        }
    }

    /// The last non-null value seen.
    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// The last value as a count.
    pub fn count(&self) -> Option<u64> {
        self.last()?.parse().ok()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The value after the field's name: `: "text"`, `: 123` or anything else (null), with any
/// spaces.
fn value_after(rest: &[u8], kind: Kind) -> Value {
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
    let body = rest.get(i..).unwrap_or_default();
    match (kind, body.first()) {
        (_, None) => Value::Incomplete,
        (Kind::Text, Some(b'"')) => {
            let text = body.get(1..).unwrap_or_default();
            match text.iter().take(MAX_VALUE).position(|&b| b == b'"') {
                Some(end) => Value::Found(
                    String::from_utf8_lossy(text.get(..end).unwrap_or_default()).into_owned(),
                ),
                None if text.len() < MAX_VALUE => Value::Incomplete,
                None => Value::Null,
            }
        }
        (Kind::Count, Some(b)) if b.is_ascii_digit() => {
            let digits = body.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == body.len() {
                Value::Incomplete
            } else if digits > 20 {
                Value::Null
            } else {
                Value::Found(String::from_utf8_lossy(body.get(..digits).unwrap_or_default()).into())
            }
        }
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_of(field: &str, kind: Kind, chunks: &[&str]) -> Option<String> {
        let mut s = FieldScanner::new(field, kind);
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.last().map(str::to_string)
    }

    fn every_chunking(field: &str, kind: Kind, body: &str) -> Option<String> {
        let want = last_of(field, kind, &[body]);
        for size in 1..body.len() {
            let chunks: Vec<&str> = body
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap_or_default())
                .collect();
            assert_eq!(last_of(field, kind, &chunks), want, "chunks of {size}");
        }
        want
    }

    #[test]
    fn the_last_non_null_reason_is_found_in_any_chunking() {
        let json = r#"{"choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{}}"#;
        let sse =
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
                   data: {\"choices\":[{\"delta\":{},\"finish_reason\" : \"length\"}]}\n\n\
                   data: [DONE]\n\n";
        assert_eq!(
            every_chunking("finish_reason", Kind::Text, json).as_deref(),
            Some("stop")
        );
        assert_eq!(
            every_chunking("finish_reason", Kind::Text, sse).as_deref(),
            Some("length")
        );
    }

    #[test]
    fn no_reason_or_only_nulls_is_none() {
        let none = |body: &str| last_of("finish_reason", Kind::Text, &[body]);
        assert_eq!(none(r#"{"error":"x"}"#), None);
        assert_eq!(none(r#"{"finish_reason":null}"#), None);
        assert_eq!(none(r#"{"finish_reason":42}"#), None);
        let huge = format!(r#"{{"finish_reason":"{}"}}"#, "x".repeat(500));
        assert_eq!(none(&huge), None, "not a reason an engine sends");
    }

    #[test]
    fn usage_counts_are_found_in_any_chunking_and_a_longer_name_is_not_the_field() {
        let body = r#"{"usage":{"prompt_tokens":651,"total_tokens":652,
            "prompt_tokens_details":{"cached_tokens":640}}}"#;
        assert_eq!(
            every_chunking("prompt_tokens", Kind::Count, body).as_deref(),
            Some("651")
        );
        assert_eq!(
            every_chunking("cached_tokens", Kind::Count, body).as_deref(),
            Some("640")
        );
        let sse = "data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\": 12}}\n\n";
        assert_eq!(
            every_chunking("prompt_tokens", Kind::Count, sse).as_deref(),
            Some("12")
        );
        let absent = r#"{"usage":{"prompt_tokens_details":null}}"#;
        assert_eq!(last_of("prompt_tokens", Kind::Count, &[absent]), None);
        let negative = r#"{"prompt_tokens":-3}"#;
        assert_eq!(last_of("prompt_tokens", Kind::Count, &[negative]), None);
    }
}
