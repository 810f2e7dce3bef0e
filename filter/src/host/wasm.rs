//! [`Host`] on Envoy: the raw host functions of `host::abi` (every status returned as a value, so
//! nothing the host says can trap the VM; a failure is counted in `prewarm_filter_host_errors_total` and the
//! request goes on untouched), byte values throughout (a non-UTF-8 header is just bytes), and
//! metric ids defined once per VM. Calls out go through the SDK's `dispatch_http_call`, which
//! registers them for their reply.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;

use crate::host::abi;
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
            .map(|m| abi::define_metric(u32::from(m.is_gauge()), m.name()).ok())
            .collect();
        Self {
            metric_ids: Rc::new(ids),
        }
    }

    fn id(&self, metric: Metric) -> Option<u32> {
        self.metric_ids.get(metric as usize).copied().flatten()
    }

    fn failed<T>(&self, result: Result<T, abi::HostStatus>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(_) => {
                self.count(Metric::HostErrors, 1);
                None
            }
        }
    }

    /// The plugin configuration: `Ok(None)` when there is none, `Err` when the host could not
    /// give it (the VM must then not run with defaults, see `config::Configured`).
    pub fn plugin_configuration(&self, size: usize) -> Result<Option<Vec<u8>>, ()> {
        match abi::buffer(abi::PLUGIN_CONFIGURATION, 0, size) {
            Ok(bytes) => Ok(bytes),
            Err(_) => Err(()),
        }
    }

    /// Sets the root context's tick; false when the host refused.
    pub fn set_tick_period(&self, period: Duration) -> bool {
        let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
        abi::set_tick_period_ms(ms).is_ok()
    }
}

impl Host for WasmHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.failed(abi::header(abi::REQUEST_HEADERS, name))
            .flatten()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.failed(abi::property(path)).flatten()
    }

    fn set_request_header(&self, name: &str, value: &[u8]) {
        self.failed(abi::replace_header(abi::REQUEST_HEADERS, name, value));
    }

    fn remove_request_header(&self, name: &str) {
        self.failed(abi::remove_header(abi::REQUEST_HEADERS, name));
    }

    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.failed(abi::buffer(abi::REQUEST_BODY, start, len))
            .flatten()
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.failed(abi::header(abi::RESPONSE_HEADERS, name))
            .flatten()
    }

    fn response_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.failed(abi::buffer(abi::RESPONSE_BODY, start, len))
            .flatten()
    }

    fn send_response(&self, status: u32, headers: &[(&str, &[u8])], body: &[u8]) -> bool {
        self.failed(abi::send_local_response(status, headers, body))
            .is_some()
    }

    fn shared_get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        self.failed(abi::shared_get(key)).unwrap_or((None, None))
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasMismatch> {
        match abi::shared_set(key, value, cas) {
            Ok(()) => Ok(()),
            // a lost race is expected; anything else is the host's failure
            Err(abi::HostStatus(8)) => Err(CasMismatch),
            Err(e) => {
                self.failed::<()>(Err(e));
                Err(CasMismatch)
            }
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
        let status = self
            .failed(abi::header(abi::CALL_RESPONSE_HEADERS, ":status"))
            .flatten()?;
        std::str::from_utf8(&status).ok()?.parse().ok()
    }

    fn call_response_body(&self, len: usize) -> Option<Vec<u8>> {
        self.failed(abi::buffer(abi::CALL_RESPONSE_BODY, 0, len))
            .flatten()
    }

    fn count(&self, metric: Metric, by: u64) {
        if let Some(id) = self.id(metric) {
            let _ = abi::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&self, metric: Metric, value: u64) {
        if let Some(id) = self.id(metric) {
            let _ = abi::record_metric(id, value);
        }
    }

    fn now_ms(&self) -> u64 {
        abi::now_ns().map_or(0, |ns| ns / 1_000_000)
    }

    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Debug => 1,
            Level::Info => 2,
            Level::Warn => 3,
        };
        let _ = abi::log(level, message);
    }
}
