//! Outcomes: each inspected completion or chat request's outcome as the client sees it at the
//! proxy — from its headers reaching the filter to the first response body byte (the time to
//! first token of a streamed answer; of a whole one, its generation too), the status (Envoy's
//! own for a local reply), whether it asked to stream, its model (an adapter's name for a LoRA
//! request), its prompt's routing key (the prefix identity the gateway counts a pod's first
//! requests by), and the `usage` the response reports —
//! enqueued when the stream is done (`on_log`, whatever ended it) for the gateway's experiment
//! attribution. The response is read as it streams, never held or changed; past
//! [`MAX_WATCHED_BYTES`] the usage is no longer looked for. A stream reset before any response
//! has no status and records nothing.

use prewarm_core::wire::OutcomeRecord;
use prewarm_core::BlockHash;

use crate::host::Host;
use crate::request::json_scan::{FieldScanner, Kind};
use crate::request::success::MAX_WATCHED_BYTES;

/// A request whose outcome is being watched.
#[derive(Debug)]
pub struct OutcomeWatch {
    arm: Option<String>,
    pod: Option<String>,
    model: String,
    prefix: Option<BlockHash>,
    started_ms: u64,
    stream: bool,
    status: Option<u16>,
    headers_ms: Option<u64>,
    first_byte_ms: Option<u64>,
    read: usize,
    prompt_tokens: FieldScanner,
    cached_tokens: FieldScanner,
}

impl OutcomeWatch {
    /// A request for `model` whose prompt's routing key is `prefix`, its headers seen at
    /// `started_ms`.
    pub fn new(started_ms: u64, model: &str, prefix: Option<BlockHash>, stream: bool) -> Self {
        Self {
            arm: None,
            pod: None,
            model: model.to_string(),
            prefix,
            started_ms,
            stream,
            status: None,
            headers_ms: None,
            first_byte_ms: None,
            read: 0,
            prompt_tokens: FieldScanner::new("prompt_tokens", Kind::Count),
            cached_tokens: FieldScanner::new("cached_tokens", Kind::Count),
        }
    }

    /// The request's experiment arm (`<experiment>/<arm>`).
    pub fn set_arm(&mut self, arm: String) {
        self.arm = Some(arm);
    }

    /// The pod the filter sent it to.
    pub fn set_pod(&mut self, pod: &str) {
        self.pod = Some(pod.to_string());
    }

    pub fn on_headers<H: Host + ?Sized>(&mut self, host: &H) {
        self.headers_ms = Some(host.now_ms());
        self.status = host
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.trim().parse().ok());
    }

    /// A chunk of `size` bytes of the response body.
    pub fn on_body<H: Host + ?Sized>(&mut self, host: &H, size: usize) {
        if size == 0 {
            return;
        }
        if self.first_byte_ms.is_none() {
            self.first_byte_ms = Some(host.now_ms());
        }
        if self.read >= MAX_WATCHED_BYTES {
            return;
        }
        self.read = self.read.saturating_add(size);
        if let Some(chunk) = host.response_body(0, size) {
            self.prompt_tokens.feed(&chunk);
            self.cached_tokens.feed(&chunk);
        }
    }

    /// The record, once the stream is done; `None` when no response came.
    pub fn finish(self) -> Option<OutcomeRecord> {
        let status = self.status?;
        let first = self.first_byte_ms.or(self.headers_ms)?;
        Some(OutcomeRecord {
            arm: self.arm,
            pod: self.pod,
            model: Some(self.model),
            at_ms: self.started_ms,
            ttfb_ms: first.saturating_sub(self.started_ms),
            status,
            stream: self.stream,
            prompt_tokens: self.prompt_tokens.count(),
            cached_tokens: self.cached_tokens.count(),
            prefix: self.prefix,
        })
    }
}
