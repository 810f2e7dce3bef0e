//! [`Host`] on Envoy: `proxy_wasm::hostcalls` only (they return `Result`; the SDK's trait
//! helpers unwrap and would trap the VM), the `*_bytes` getters (a non-UTF-8 header value
//! panics the `String` getter), and metric ids defined once per VM.

use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};

use crate::host::{CasMismatch, Host, Level, Metric};

/// The host of one VM; cheap to clone into every context.
#[derive(Debug, Clone)]
pub struct WasmHost {
    metric_ids: Rc<Vec<Option<u32>>>,
}

impl WasmHost {
    /// Defines every metric of [`Metric::ALL`] in this VM.
    pub fn new() -> Self {
        let ids = Metric::ALL
            .iter()
            .map(|m| {
                let kind = if m.is_gauge() {
                    MetricType::Gauge
                } else {
                    MetricType::Counter
                };
                hostcalls::define_metric(kind, m.name()).ok()
            })
            .collect();
        Self {
            metric_ids: Rc::new(ids),
        }
    }

    fn id(&self, metric: Metric) -> Option<u32> {
        self.metric_ids.get(metric as usize).copied().flatten()
    }
}

impl Host for WasmHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
            .ok()
            .flatten()
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        let _ = hostcalls::set_map_value_bytes(MapType::HttpRequestHeaders, name, Some(value));
    }

    fn remove_request_header(&self, name: &str) {
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name);
    }

    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpRequestBody, start, len)
            .ok()
            .flatten()
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        hostcalls::get_shared_data(key).unwrap_or((None, None))
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) | Err(_) => Err(CasMismatch),
        }
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Option<u32> {
        hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, Vec::new(), timeout).ok()
    }

    fn call_response_status(&self) -> Option<u16> {
        let status = hostcalls::get_map_value_bytes(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()?;
        std::str::from_utf8(&status).ok()?.parse().ok()
    }

    fn call_response_body(&self, len: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, len)
            .ok()
            .flatten()
    }

    fn count(&self, metric: Metric, by: u64) {
        if let Some(id) = self.id(metric) {
            let _ = hostcalls::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&self, metric: Metric, value: u64) {
        if let Some(id) = self.id(metric) {
            let _ = hostcalls::record_metric(id, value);
        }
    }

    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Debug => LogLevel::Debug,
            Level::Info => LogLevel::Info,
            Level::Warn => LogLevel::Warn,
        };
        let _ = hostcalls::log(level, message);
    }
}
