//! Success feedback: a request that used a hot prefix and got a successful, untruncated answer
//! raises that prefix's hotness by the gateway's `success_boost`. The response is watched as it
//! streams, never held or changed: a `200` whose last non-null `finish_reason` (JSON or
//! server-sent events, in any chunking) is anything but `length` — or `length` when the
//! request asked for `max_tokens`, which is then what it wanted — is a success, tallied per VM
//! and folded into one `succeeded` feedback per prefix on the tick (`observe::fold_tally`).
//! A response over [`MAX_WATCHED_BYTES`], or one without a finish reason, counts as nothing.

use prewarm_core::BlockHash;

use crate::host::{Host, Metric};
use crate::request::json_scan::{FieldScanner, Kind};
use crate::request::response::readable_ok;
use crate::worker::Worker;

/// Most response bytes read looking for the finish reason.
pub const MAX_WATCHED_BYTES: usize = 4 << 20;

/// A routed request that used a hot prefix, its response being watched.
#[derive(Debug)]
pub struct SuccessWatch {
    model: String,
    prefix: BlockHash,
    asked_max_tokens: bool,
    watching: bool,
    read: usize,
    scanner: FieldScanner,
}

impl SuccessWatch {
    pub fn new(model: &str, prefix: BlockHash, asked_max_tokens: bool) -> Self {
        Self {
            model: model.to_string(),
            prefix,
            asked_max_tokens,
            watching: true,
            read: 0,
            scanner: FieldScanner::new("finish_reason", Kind::Text),
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
        let success = match self.scanner.last() {
            None => false,
            Some("length") => self.asked_max_tokens,
            Some(_) => true,
        };
        if success && !worker.tally.succeeded(&self.model, self.prefix) {
            host.count(Metric::TallyOverflow, 1);
        }
    }
}
