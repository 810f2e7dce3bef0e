//! `[traces]`: where the gateway's warm-up spans go (`crate::traces` exports them).

use serde::{Deserialize, Serialize};

use super::validate::out_of_range;

/// `[traces]`: where warm-up spans go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracesConfig {
    /// The collector's OTLP/HTTP traces URL, used as written (e.g.
    /// `http://otel-collector:4318/v1/traces`); empty (the default) exports nothing.
    pub otlp_endpoint: String,
    /// `http/protobuf` (the default, OTLP's) or `http/json`.
    pub protocol: String,
    /// The resource's `service.name` (default `prewarm-gateway`).
    pub service_name: String,
    /// Share of warm-up plans (and of other root spans) kept, 0..1 (default 1); a plan's key
    /// spans follow their plan's decision.
    pub sample_ratio: f64,
    /// Pause between batches, ms (default 5,000).
    pub export_delay_ms: u64,
    /// Spans queued for export at most; more are dropped (default 2,048).
    pub max_queue: usize,
    /// A batch's post times out after this many ms (default 10,000).
    pub timeout_ms: u64,
}

impl Default for TracesConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            protocol: "http/protobuf".into(),
            service_name: "prewarm-gateway".into(),
            sample_ratio: 1.0,
            export_delay_ms: 5_000,
            max_queue: 2_048,
            timeout_ms: 10_000,
        }
    }
}

impl TracesConfig {
    /// Every problem, as `traces.field: value: rule`.
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        let e = &self.otlp_endpoint;
        if !e.is_empty()
            && (!e.starts_with("http://")
                || e.len() > 2048
                || e.parse::<axum::http::Uri>()
                    .map_or(true, |u| u.host().is_none()))
        {
            p.push(format!(
                "traces.otlp_endpoint: {e:?}: must be an http:// URL with a host, at most 2048 \
                 bytes (no TLS client is built in: the mesh's sidecar encrypts)"
            ));
        }
        if !matches!(self.protocol.as_str(), "http/protobuf" | "http/json") {
            p.push(format!(
                "traces.protocol: {:?}: must be http/protobuf or http/json",
                self.protocol
            ));
        }
        if self.service_name.is_empty() || self.service_name.len() > 256 {
            p.push(format!(
                "traces.service_name: {:?}: must be 1..256 bytes",
                self.service_name
            ));
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            p.push(format!(
                "traces.sample_ratio: {}: must be 0..1",
                self.sample_ratio
            ));
        }
        for (field, value, lo, hi) in [
            ("traces.export_delay_ms", self.export_delay_ms, 10, 600_000),
            ("traces.max_queue", self.max_queue as u64, 16, 1_000_000),
            ("traces.timeout_ms", self.timeout_ms, 100, 600_000),
        ] {
            p.extend(out_of_range(field, value, lo, hi));
        }
        p
    }

    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }
}
