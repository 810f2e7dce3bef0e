//! The error watch of an adapter rollout. A rollout that leaves every holder on the new version
//! is watched for `registry.rollout_watch_seconds`: the filters' outcome records whose `model`
//! is the adapter's name (a LoRA request names its adapter as the model) are counted, and when
//! their error rate (5xx and 429) over at least `registry.rollout_min_requests` exceeds 0.5 %
//! the gateway rolls the adapter back by itself — the grey release's error rule
//! ([`crate::error_rate::errors_exceed`]), decided as soon as the errors alone pass
//! that share of the minimum. A watch that reaches its end without that passes, however few
//! requests it saw (the count says how much evidence that was).
//!
//! What it assumes: a new version's errors show within the window and within the adapter's own
//! requests; an error of the base model or another adapter is not counted against it. Records
//! older than the rollout are not counted (a filter's batch may still carry some).

use serde::{Deserialize, Serialize};

use crate::error_rate::{errors_exceed, is_error, ERROR_RATE_LIMIT};

/// How a watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchOutcome {
    Passed,
    RolledBack,
}

/// The end of a watch: when, how, and the figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEnd {
    pub at_ms: u64,
    pub outcome: WatchOutcome,
    pub detail: String,
}

/// A rollout under watch (or its last watch, once ended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutWatch {
    /// The version rolled out.
    pub version: String,
    /// The version a failed watch rolls back to.
    pub previous: String,
    pub started_ms: u64,
    pub until_ms: u64,
    pub requests: u64,
    pub errors: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<WatchEnd>,
}

/// What a check of a watch finds.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Watching,
    Passed(String),
    Failed(String),
}

impl RolloutWatch {
    pub fn new(version: &str, previous: &str, started_ms: u64, watch_ms: u64) -> Self {
        Self {
            version: version.to_string(),
            previous: previous.to_string(),
            started_ms,
            until_ms: started_ms.saturating_add(watch_ms),
            requests: 0,
            errors: 0,
            ended: None,
        }
    }

    pub fn is_open(&self) -> bool {
        self.ended.is_none()
    }

    /// Counts a request for the adapter that started at `at_ms` with `status`.
    pub fn count(&mut self, at_ms: u64, status: u16) {
        if self.is_open() && at_ms >= self.started_ms {
            self.requests += 1;
            self.errors += u64::from(is_error(status));
        }
    }

    /// The verdict at `now_ms` with `min_requests`.
    pub fn verdict(&self, now_ms: u64, min_requests: u64) -> Verdict {
        if !self.is_open() {
            return Verdict::Watching;
        }
        if errors_exceed(self.errors, self.requests, min_requests) {
            return Verdict::Failed(format!(
                "version {:?}: {} errors in {} requests: above {} % of at least {min_requests}",
                self.version,
                self.errors,
                self.requests,
                ERROR_RATE_LIMIT * 100.0
            ));
        }
        if now_ms >= self.until_ms {
            return Verdict::Passed(format!(
                "version {:?}: {} errors in {} requests over the watch",
                self.version, self.errors, self.requests
            ));
        }
        Verdict::Watching
    }

    /// Ends the watch.
    pub fn end(&mut self, at_ms: u64, outcome: WatchOutcome, detail: String) {
        self.ended = Some(WatchEnd {
            at_ms,
            outcome,
            detail,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> RolloutWatch {
        RolloutWatch::new("v2", "v1", 1_000, 60_000)
    }

    #[test]
    fn only_requests_since_the_rollout_count_and_only_while_open() {
        let mut w = watch();
        w.count(999, 500);
        w.count(1_000, 200);
        w.count(2_000, 429);
        w.count(2_000, 404);
        assert_eq!(
            (w.requests, w.errors),
            (3, 1),
            "a 4xx other than 429 is no error"
        );
        w.end(3_000, WatchOutcome::Passed, String::new());
        w.count(4_000, 500);
        assert_eq!((w.requests, w.errors), (3, 1));
        assert_eq!(w.verdict(999_999, 200), Verdict::Watching, "ended");
    }

    #[test]
    fn errors_fail_the_watch_as_soon_as_the_limit_is_certain() {
        let mut w = watch();
        // 0.5 % of 200 is one error: a second decides, whatever the requests still to come
        w.count(1_500, 503);
        assert_eq!(w.verdict(2_000, 200), Verdict::Watching);
        w.count(1_600, 503);
        match w.verdict(2_000, 200) {
            Verdict::Failed(detail) => assert_eq!(
                detail,
                "version \"v2\": 2 errors in 2 requests: above 0.5 % of at least 200"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_watch_without_excess_errors_passes_at_its_end() {
        let mut w = watch();
        for i in 0..1_000 {
            w.count(1_000 + i, if i % 250 == 0 { 500 } else { 200 });
        }
        assert_eq!(w.verdict(60_999, 200), Verdict::Watching);
        assert_eq!(
            w.verdict(61_000, 200),
            Verdict::Passed("version \"v2\": 4 errors in 1000 requests over the watch".into())
        );
    }
}
