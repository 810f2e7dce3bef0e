//! The one seam between the filter's glue and its host: the [`Host`] trait (headers, body,
//! shared data with compare-and-swap, calls out, metrics, time, logging) and the names of the
//! filter's metrics. The wasm build implements it with `proxy_wasm::hostcalls` (see
//! `wasm_host`); native scenario tests implement it with a double.

use std::time::Duration;

/// A shared-data write lost a compare-and-swap race (or the host refused it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasMismatch;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// What the filter needs from its host. Every method is infallible from the caller's side:
/// host errors become `None`, `Err` or a no-op, never a panic.
pub trait Host {
    /// A request header's raw value (any bytes; pseudo-headers like `:path` included).
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A stream property's raw bytes (`["connection", "id"]`: the connection's id, 8 bytes).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// Sets a request header.
    fn set_request_header(&self, name: &str, value: &[u8]);
    /// Removes a request header.
    fn remove_request_header(&self, name: &str);
    /// `len` bytes of the buffered request body from `start`.
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>>;
    /// A response header's raw value.
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// `len` bytes of the response body chunk being delivered, from `start`.
    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>>;
    /// Answers the request itself with `status`, `headers` and `body` (the pod is never
    /// called); false when the host refused.
    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool;
    /// A shared-data value and its cas (`None`, `None` when missing).
    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>);
    /// Writes a shared-data value; with a cas, only if nobody wrote it since.
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch>;
    /// Starts an HTTP call to `cluster`; returns its token.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Option<u32>;
    /// `:status` of the call response being delivered.
    fn call_response_status(&self) -> Option<u16>;
    /// Body of the call response being delivered.
    fn call_response_body(&self, len: usize) -> Option<Vec<u8>>;
    /// Adds to a counter.
    fn count(&self, metric: Metric, by: u64);
    /// Sets a gauge.
    fn gauge(&self, metric: Metric, value: u64);
    /// Wall clock, ms since the Unix epoch.
    fn now_ms(&self) -> u64;
    fn log(&self, level: Level, message: &str);
}

macro_rules! metrics {
    ($($variant:ident => $name:literal, $gauge:literal;)*) => {
        /// The filter's metrics. In Envoy's `/stats` they appear as `wasmcustom.<name>`, in
        /// Prometheus output with `_` for `.`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Metric { $($variant),* }

        impl Metric {
            /// Every metric, in declaration order (`metric as usize` indexes this).
            pub const ALL: &'static [Metric] = &[$(Metric::$variant),*];

            /// The metric's name.
            pub fn name(self) -> &'static str {
                match self { $(Metric::$variant => $name),* }
            }

            /// Whether it is a gauge (else a counter).
            pub fn is_gauge(self) -> bool {
                match self { $(Metric::$variant => $gauge),* }
            }
        }
    };
}

metrics! {
    RequestsSeen => "prewarm.requests_seen", false;
    RequestsInspected => "prewarm.requests_inspected", false;
    SkippedNotInference => "prewarm.skipped.not_inference", false;
    SkippedNoBody => "prewarm.skipped.no_body", false;
    SkippedNoContentLength => "prewarm.skipped.no_content_length", false;
    SkippedTooLarge => "prewarm.skipped.too_large", false;
    SkippedMalformed => "prewarm.skipped.malformed", false;
    NoUser => "prewarm.no_user", false;
    UserFromCredential => "prewarm.user_from_credential", false;
    SharedPromptSignals => "prewarm.shared_prompts.signals", false;
    SharedPromptEvicted => "prewarm.shared_prompts.evicted", false;
    SignalsEnqueued => "prewarm.signals.enqueued", false;
    SignalsSent => "prewarm.signals.sent", false;
    SignalsDropped => "prewarm.signals.dropped", false;
    SignalsUnshaped => "prewarm.signals.unshaped", false;
    BatchesSent => "prewarm.batches.sent", false;
    ServedEnqueued => "prewarm.served.enqueued", false;
    ServedSent => "prewarm.served.sent", false;
    ServedDropped => "prewarm.served.dropped", false;
    OutcomesEnqueued => "prewarm.outcomes.enqueued", false;
    OutcomesSent => "prewarm.outcomes.sent", false;
    OutcomesDropped => "prewarm.outcomes.dropped", false;
    DispatchFailures => "prewarm.dispatch_failures", false;
    TableFetches => "prewarm.table.fetches", false;
    TableUpdates => "prewarm.table.updates", false;
    TableUnchanged => "prewarm.table.unchanged", false;
    TableAdopted => "prewarm.table.adopted", false;
    TableFetchFailures => "prewarm.table.fetch_failures", false;
    Routed => "prewarm.routed", false;
    RoutedByPrefix => "prewarm.prefix.matched", false;
    PrefixWriteFailures => "prewarm.prefix.write_failures", false;
    UnroutedDisabled => "prewarm.unrouted.disabled", false;
    UnroutedNoTable => "prewarm.unrouted.no_table", false;
    UnroutedBlockTokens => "prewarm.unrouted.block_tokens_mismatch", false;
    UnroutedNoBlock => "prewarm.unrouted.no_full_block", false;
    UnroutedNoPod => "prewarm.unrouted.no_pod", false;
    UnroutedArmOff => "prewarm.unrouted.arm_off", false;
    ExternalRecorded => "prewarm.external.recorded", false;
    ExternalAbsent => "prewarm.external.absent", false;
    ExternalMalformed => "prewarm.external.malformed", false;
    ExternalNoTable => "prewarm.external.no_table", false;
    ExternalUnknownPod => "prewarm.external.unknown_pod", false;
    ArmAssigned => "prewarm.experiment.assigned", false;
    ArmNoUnit => "prewarm.experiment.no_unit", false;
    ArmSignalsWithheld => "prewarm.experiment.signals_withheld", false;
    CasGiveUps => "prewarm.shared_data.cas_give_ups", false;
    TallyOverflow => "prewarm.tally.overflow", false;
    HostErrors => "prewarm.host_errors", false;
    Unconfigured => "prewarm.unconfigured", false;
    DirectSent => "prewarm.direct.sent", false;
    DirectOk => "prewarm.direct.ok", false;
    DirectFailed => "prewarm.direct.failed", false;
    DirectSkippedBudget => "prewarm.direct.skipped_budget", false;
    DirectSkippedInFlight => "prewarm.direct.skipped_in_flight", false;
    DirectSkippedBackoff => "prewarm.direct.skipped_backoff", false;
    DirectSkippedNoPod => "prewarm.direct.skipped_no_pod", false;
    EmbeddingHits => "prewarm.embeddings.hit", false;
    EmbeddingMisses => "prewarm.embeddings.miss", false;
    EmbeddingSharedHits => "prewarm.embeddings.shared_hit", false;
    EmbeddingUncacheable => "prewarm.embeddings.uncacheable", false;
    EmbeddingStored => "prewarm.embeddings.stored", false;
    EmbeddingNotStored => "prewarm.embeddings.not_stored", false;
    EmbeddingEvicted => "prewarm.embeddings.evicted", false;
    EmbeddingReplyFailures => "prewarm.embeddings.reply_failures", false;
    EmbeddingReportsDropped => "prewarm.embeddings.reports_dropped", false;
    EmbeddingWarmFetches => "prewarm.embeddings.warm_fetches", false;
    EmbeddingWarmFetchFailures => "prewarm.embeddings.warm_fetch_failures", false;
    EmbeddingWarmEntries => "prewarm.embeddings.warm_entries", false;
    DirectActive => "prewarm.direct.active", true;
    EmbeddingBytes => "prewarm.embeddings.bytes", true;
    SharedPromptBytes => "prewarm.shared_prompts.bytes", true;
    TableGeneration => "prewarm.table.generation", true;
    TableAgeMs => "prewarm.table.age_ms", true;
}
