//! The proxy-wasm entry point: registers the root context, which validates the configuration at
//! `on_configure` (refusing it with a log line naming each bad field), sets the tick, and creates
//! one HTTP context per request. Every hook delegates to the host-independent modules. A VM whose
//! configuration the host could not give runs unconfigured: it logs that once and passes every
//! request untouched, counted in `prewarm_filter_unconfigured_total` (never the defaults, which would drop a
//! configured `gateway_token` silently).

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use crate::config::{FilterConfig, Refusal};
use crate::host::wasm::WasmHost;
use crate::host::{Host, Level, Metric};
use crate::request::{RequestFlow, Verdict};
use crate::root::RootTasks;
use crate::worker::Worker;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(PrewarmRoot::default()) });
}}

fn action(v: Verdict) -> Action {
    match v {
        Verdict::Continue => Action::Continue,
        Verdict::Pause => Action::Pause,
    }
}

#[derive(Default)]
struct PrewarmRoot {
    host: Option<WasmHost>,
    worker: Option<Rc<Worker>>,
    tasks: RootTasks,
}

impl Context for PrewarmRoot {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let (Some(host), Some(worker)) = (&self.host, &self.worker) {
            self.tasks.on_call_response(host, worker, token, body_size);
        }
    }
}

impl RootContext for PrewarmRoot {
    fn on_configure(&mut self, size: usize) -> bool {
        let host = self.host.get_or_insert_with(WasmHost::new).clone();
        match FilterConfig::from_plugin(host.plugin_configuration(size)) {
            Ok(config) => {
                let tick = Duration::from_millis(config.gateway.tick_period_ms);
                if !host.set_tick_period(tick) {
                    host.log(Level::Warn, "prewarm: could not set the tick period");
                }
                // the old configuration's pending index writes, before its worker goes
                if let Some(old) = &self.worker {
                    old.prefix_pending.flush(
                        &host,
                        &old.keys,
                        old.config.shared_data.prefix_horizon_ms,
                    );
                }
                self.worker = Some(Rc::new(Worker::new(config)));
                true
            }
            Err(Refusal::Unreadable(why)) => {
                self.worker = None;
                host.log(Level::Warn, &format!("prewarm: {why}"));
                true
            }
            Err(Refusal::Invalid(problems)) => {
                for p in &problems {
                    host.log(Level::Warn, &format!("prewarm: invalid configuration: {p}"));
                }
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let (Some(host), Some(worker)) = (&self.host, &self.worker) {
            self.tasks.on_tick(host, worker);
        }
    }

    /// Never `None`: the SDK panics on it. Unconfigured, requests pass untouched.
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let bound = self.host.clone().zip(self.worker.clone());
        if bound.is_none() {
            if let Some(host) = &self.host {
                host.count(Metric::Unconfigured, 1);
            }
        }
        Some(Box::new(PrewarmRequest {
            bound,
            flow: RequestFlow::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct PrewarmRequest {
    bound: Option<(WasmHost, Rc<Worker>)>,
    flow: RequestFlow,
}

impl Context for PrewarmRequest {}

impl HttpContext for PrewarmRequest {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        match &self.bound {
            Some((host, worker)) => action(self.flow.on_headers(host, worker, end_of_stream)),
            None => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match &self.bound {
            Some((host, worker)) => {
                action(self.flow.on_body(host, worker, body_size, end_of_stream))
            }
            None => Action::Continue,
        }
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        match &self.bound {
            Some((host, worker)) => action(self.flow.on_trailers(host, worker)),
            None => Action::Continue,
        }
    }

    /// The response is only watched, never held.
    fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if let Some((host, _)) = &self.bound {
            self.flow.on_response_headers(host);
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some((host, worker)) = &self.bound {
            self.flow
                .on_response_body(host, worker, body_size, end_of_stream);
        }
        Action::Continue
    }

    /// The stream is done (completed or reset): its outcome is recorded.
    fn on_log(&mut self) {
        if let Some((host, worker)) = &self.bound {
            self.flow.on_log(host, worker);
        }
    }
}
