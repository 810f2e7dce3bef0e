//! The host boundary: the one seam between the filter's glue and Envoy. Everything the filter
//! asks of its host goes through the [`Host`] trait defined here (headers, body, shared data with
//! compare-and-swap, calls out, metrics, time, logging), with the names of the filter's metrics
//! ([`Metric`]); no other module sees proxy-wasm.
//!
//! - `abi` (wasm only): the raw proxy-wasm host functions, every status returned as a value.
//! - `wasm` (wasm only): [`Host`] on Envoy, over `abi`.
//! - `entry` (wasm only): the proxy-wasm entry point, the root and HTTP contexts that hand every
//!   hook to `root` and `request`.
//! - [`memory`] (native only): [`Host`] in memory, for the offline evaluator.
//! - [`fake`] (native only): the tests' double, sharing `memory`'s shared-data store.
//!
//! The invariant it keeps: every [`Host`] method is infallible from the caller's side (host
//! errors become `None`, `Err(CasMismatch)` or a no-op), because a panic traps the VM and costs
//! the request a 503 (`docs/proxy-wasm-facts.md`). So the wasm implementation calls the host
//! functions of `abi`, never the SDK's convenience methods that unwrap internally.

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod entry;
#[cfg(not(target_arch = "wasm32"))]
pub mod fake;
#[cfg(not(target_arch = "wasm32"))]
pub mod memory;
#[cfg(target_arch = "wasm32")]
mod wasm;

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
        /// The filter's metrics, named for Prometheus: the prefix `prewarm_filter_` (apart from
        /// the gateway's `prewarm_*`), counters end in `_total`, gauges carry their unit.
        /// A reason is a label, written into the name the way Istio's own stats write theirs
        /// (`<tag>=.=<value>;.;`, right after the prefix) so that Envoy's tag extraction
        /// (`stats_config.stats_tags` with the regex `(reason=\.=(.*?);\.;)`, which is also
        /// what Istio's `extraStatTags: [reason]` generates) cuts it out of the name:
        /// `prewarm_filter_reason=.=no_table;.;unrouted_total` is in `/stats` as
        /// `wasmcustom.prewarm_filter_reason=.=no_table;.;unrouted_total` and in Prometheus output
        /// as `prewarm_filter_unrouted_total{reason="no_table"}`.
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
    RequestsSeen => "prewarm_filter_requests_seen_total", false;
    RequestsInspected => "prewarm_filter_requests_inspected_total", false;
    SkippedNotInference => "prewarm_filter_reason=.=not_inference;.;skipped_total", false;
    SkippedNoBody => "prewarm_filter_reason=.=no_body;.;skipped_total", false;
    SkippedNoContentLength => "prewarm_filter_reason=.=no_content_length;.;skipped_total", false;
    SkippedTooLarge => "prewarm_filter_reason=.=too_large;.;skipped_total", false;
    SkippedMalformed => "prewarm_filter_reason=.=malformed;.;skipped_total", false;
    NoUser => "prewarm_filter_no_user_total", false;
    UserFromCredential => "prewarm_filter_user_from_credential_total", false;
    SharedPromptSignals => "prewarm_filter_shared_prompts_signals_total", false;
    SharedPromptEvicted => "prewarm_filter_shared_prompts_evicted_total", false;
    SignalsEnqueued => "prewarm_filter_signals_enqueued_total", false;
    SignalsSent => "prewarm_filter_signals_sent_total", false;
    SignalsDropped => "prewarm_filter_signals_dropped_total", false;
    SignalsUnshaped => "prewarm_filter_signals_unshaped_total", false;
    BatchesSent => "prewarm_filter_batches_sent_total", false;
    ServedEnqueued => "prewarm_filter_served_enqueued_total", false;
    ServedSent => "prewarm_filter_served_sent_total", false;
    ServedDropped => "prewarm_filter_served_dropped_total", false;
    OutcomesEnqueued => "prewarm_filter_outcomes_enqueued_total", false;
    OutcomesSent => "prewarm_filter_outcomes_sent_total", false;
    OutcomesDropped => "prewarm_filter_outcomes_dropped_total", false;
    DispatchFailures => "prewarm_filter_dispatch_failures_total", false;
    TableFetches => "prewarm_filter_table_fetches_total", false;
    TableUpdates => "prewarm_filter_table_updates_total", false;
    TableUnchanged => "prewarm_filter_table_unchanged_total", false;
    TableAdopted => "prewarm_filter_table_adopted_total", false;
    TableFetchFailures => "prewarm_filter_table_fetch_failures_total", false;
    TableDeltas => "prewarm_filter_table_deltas_total", false;
    TableDeltaWrongBase => "prewarm_filter_reason=.=base;.;table_deltas_refused_total", false;
    TableDeltaInvalid => "prewarm_filter_reason=.=invalid;.;table_deltas_refused_total", false;
    Routed => "prewarm_filter_routed_total", false;
    RoutedByPrefix => "prewarm_filter_prefix_matched_total", false;
    PrefixWriteFailures => "prewarm_filter_prefix_write_failures_total", false;
    UnroutedDisabled => "prewarm_filter_reason=.=disabled;.;unrouted_total", false;
    UnroutedNoTable => "prewarm_filter_reason=.=no_table;.;unrouted_total", false;
    UnroutedBlockTokens => "prewarm_filter_reason=.=block_tokens_mismatch;.;unrouted_total", false;
    UnroutedNoBlock => "prewarm_filter_reason=.=no_full_block;.;unrouted_total", false;
    UnroutedNoPod => "prewarm_filter_reason=.=no_pod;.;unrouted_total", false;
    UnroutedArmOff => "prewarm_filter_reason=.=arm_off;.;unrouted_total", false;
    ExternalRecorded => "prewarm_filter_external_recorded_total", false;
    ExternalAbsent => "prewarm_filter_reason=.=absent;.;external_unrecorded_total", false;
    ExternalMalformed => "prewarm_filter_reason=.=malformed;.;external_unrecorded_total", false;
    ExternalNoTable => "prewarm_filter_reason=.=no_table;.;external_unrecorded_total", false;
    ExternalUnknownPod => "prewarm_filter_reason=.=unknown_pod;.;external_unrecorded_total", false;
    ArmAssigned => "prewarm_filter_experiment_assigned_total", false;
    ArmNoUnit => "prewarm_filter_experiment_no_unit_total", false;
    ArmSignalsWithheld => "prewarm_filter_experiment_signals_withheld_total", false;
    CasGiveUps => "prewarm_filter_shared_data_cas_give_ups_total", false;
    TallyOverflow => "prewarm_filter_tally_overflow_total", false;
    HostErrors => "prewarm_filter_host_errors_total", false;
    Unconfigured => "prewarm_filter_unconfigured_total", false;
    DirectSent => "prewarm_filter_direct_sent_total", false;
    DirectOk => "prewarm_filter_direct_ok_total", false;
    DirectFailed => "prewarm_filter_direct_failed_total", false;
    DirectSkippedBudget => "prewarm_filter_reason=.=budget;.;direct_skipped_total", false;
    DirectSkippedInFlight => "prewarm_filter_reason=.=in_flight;.;direct_skipped_total", false;
    DirectSkippedBackoff => "prewarm_filter_reason=.=backoff;.;direct_skipped_total", false;
    DirectSkippedNoPod => "prewarm_filter_reason=.=no_pod;.;direct_skipped_total", false;
    EmbeddingHits => "prewarm_filter_embeddings_hit_total", false;
    EmbeddingMisses => "prewarm_filter_embeddings_miss_total", false;
    EmbeddingSharedHits => "prewarm_filter_embeddings_shared_hit_total", false;
    EmbeddingUncacheable => "prewarm_filter_embeddings_uncacheable_total", false;
    EmbeddingStored => "prewarm_filter_embeddings_stored_total", false;
    EmbeddingNotStored => "prewarm_filter_embeddings_not_stored_total", false;
    EmbeddingEvicted => "prewarm_filter_embeddings_evicted_total", false;
    EmbeddingReplyFailures => "prewarm_filter_embeddings_reply_failures_total", false;
    EmbeddingReportsDropped => "prewarm_filter_embeddings_reports_dropped_total", false;
    EmbeddingWarmFetches => "prewarm_filter_embeddings_warm_fetches_total", false;
    EmbeddingWarmFetchFailures => "prewarm_filter_embeddings_warm_fetch_failures_total", false;
    EmbeddingWarmEntries => "prewarm_filter_embeddings_warm_entries_total", false;
    DirectActive => "prewarm_filter_direct_active", true;
    EmbeddingBytes => "prewarm_filter_embeddings_bytes", true;
    SharedPromptBytes => "prewarm_filter_shared_prompts_bytes", true;
    TableGeneration => "prewarm_filter_table_generation", true;
    TableAgeSeconds => "prewarm_filter_table_age_seconds", true;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Prometheus name and labels Envoy prints once the tags are extracted.
    fn extracted(metric: Metric) -> (String, Vec<(String, String)>) {
        let mut name = metric.name().to_string();
        let mut labels = Vec::new();
        while let Some(at) = name.find("=.=") {
            let start = name[..at].rfind('_').map_or(0, |i| i + 1);
            let end = name[at..].find(";.;").map(|i| at + i + 3).unwrap();
            labels.push((
                name[start..at].to_string(),
                name[at + 3..end - 3].to_string(),
            ));
            name.replace_range(start..end, "");
        }
        (name, labels)
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        let valid = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        for &m in Metric::ALL {
            let (name, labels) = extracted(m);
            assert!(name.starts_with("prewarm_filter_"), "{m:?}: {name}");
            assert!(valid(&name), "{m:?}: {name}");
            assert_eq!(name.ends_with("_total"), !m.is_gauge(), "{m:?}: {name}");
            assert!(
                !name.contains("_ms"),
                "{m:?}: base unit is the second: {name}"
            );
            for (key, value) in &labels {
                assert_eq!(key, "reason", "{m:?}");
                assert!(valid(value), "{m:?}: {value}");
            }
            // Envoy's tag extraction removes exactly the `reason=.=...;.;` part.
            let tagged = format!(
                "prewarm_filter_reason=.={};.;",
                labels.first().map_or("", |l| &l.1)
            );
            if !labels.is_empty() {
                assert!(
                    m.name().starts_with(&tagged),
                    "{m:?}: tag right after the prefix"
                );
            }
        }
    }

    #[test]
    fn every_series_is_distinct() {
        let mut seen = std::collections::HashSet::new();
        for &m in Metric::ALL {
            assert!(seen.insert(extracted(m)), "{m:?} duplicates another series");
        }
    }

    #[test]
    fn reasons_are_labels_of_one_counter() {
        let unrouted: Vec<_> = Metric::ALL
            .iter()
            .map(|&m| extracted(m))
            .filter(|(n, _)| n == "prewarm_filter_unrouted_total")
            .map(|(_, l)| l[0].1.clone())
            .collect();
        assert_eq!(
            unrouted,
            [
                "disabled",
                "no_table",
                "block_tokens_mismatch",
                "no_full_block",
                "no_pod",
                "arm_off"
            ]
        );
        assert_eq!(
            extracted(Metric::SkippedTooLarge),
            (
                "prewarm_filter_skipped_total".to_string(),
                vec![("reason".to_string(), "too_large".to_string())]
            )
        );
        assert_eq!(
            extracted(Metric::TableAgeSeconds).0,
            "prewarm_filter_table_age_seconds"
        );
    }
}
