//! One request through the filter: strip a client-sent endpoint header (unless another router
//! owns it: `endpoint_header_owner: external`, see `routing::external_route`), direct-call
//! header and arm header; inspect only inference POSTs whose `content-length` is present and
//! within `max_body_bytes` (so the filter never makes Envoy buffer past its limit, which would
//! be a 413); let Envoy buffer the body
//! and read it once, whole, at its end (nothing is allocated before a body byte arrives, and
//! nothing is sized from a client's header: a stalled request costs the VM no memory); then
//! parse, fingerprint and sketch with core, observe (a request naming no user continues the
//! streak of its credential's identity, `credential`), enqueue the signals, assign the request
//! its experiment arm when the table runs one (`experiments::arm`), route, and continue —
//! unless an embeddings request for a cached model is answered from the embedding cache
//! (`embeddings::flow`), the one case the filter ends a request itself. Responses are watched,
//! never held or changed: for the embedding cache to store, and for success feedback (`success`).
//! With `routing` off (and no embedding cache) the headers are not held (only the body is
//! buffered), so no Envoy setting beyond the defaults is needed. Anything unexpected: count it
//! and let the request through untouched.
//!
//! The parts of the request path beside this flow: [`credential`] (a request's identity when it
//! names no user), [`response`] (what the filter reads of a response), [`json_scan`] (one
//! field read out of a streaming response body), [`success`] (the success watch behind
//! success feedback) and [`stage`] (where `make bench-filter`'s stage ladder cuts the path).

pub mod credential;
pub mod json_scan;
pub mod response;
pub mod stage;
pub mod success;

use prewarm_core::experiment::ArmRouting;
use prewarm_core::prefix::{record, PromptKeys};
use prewarm_core::wire::{ServedRecord, Signal, MAX_NAME_BYTES};
use prewarm_core::{canonical_prompt, parse_request, BlockChain, Endpoint};

use crate::config::{DirectMode, EndpointHeaderOwner, Stage};
use crate::embeddings;
use crate::embeddings::flow::{Capture, Lookup};
use crate::experiments;
use crate::experiments::arm::ArmChoice;
use crate::experiments::outcome::OutcomeWatch;
use crate::host::{Host, Metric};
use crate::request::success::SuccessWatch;
use crate::routing::external_route;
use crate::routing::prefix_index::SharedPrefixStore;
use crate::routing::{choose_pod, PrefixLookup};
use crate::signals::observe::{observe, Observation};
use crate::worker::Worker;

/// What the filter tells the host to do with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// Wait for more body (headers: for the body to start).
    Pause,
}

/// The state of one request being inspected.
#[derive(Debug, Default)]
pub struct RequestFlow {
    inspecting: Option<Inspection>,
    /// The response, watched for the embedding cache.
    capture: Option<Capture>,
    /// The response, watched for a successful answer to a hot prefix.
    success: Option<SuccessWatch>,
    /// The response, watched for the request's outcome (`experiments::outcome`).
    outcome: Option<OutcomeWatch>,
}

#[derive(Debug)]
struct Inspection {
    endpoint: Endpoint,
    /// Bytes Envoy has buffered so far (the body is read once, at its end).
    buffered: usize,
    tenant: Option<String>,
    user: Option<String>,
    /// The identity of the request's credential, when the headers name no user (`credential`).
    credential: Option<String>,
    /// When the headers arrived.
    started_ms: u64,
    /// The pod address another router named (`endpoint_header_owner: external`), read with the
    /// headers: the body callbacks can no longer read them once they went on.
    external_pick: Option<Result<String, external_route::Unrecorded>>,
}

/// A name from a trusted header, when configured: empty or above core's name cap counts as
/// absent (a name never travels longer than `wire::MAX_NAME_BYTES`).
fn header_name<H: Host + ?Sized>(host: &H, name: Option<&str>) -> Option<String> {
    host.request_header(name?)
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .filter(|v| !v.is_empty() && v.len() <= MAX_NAME_BYTES)
}

impl RequestFlow {
    pub fn on_headers<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        end_of_stream: bool,
    ) -> Verdict {
        let config = &worker.config;
        // Only the header's owner names a pod. Another router (endpoint_header_owner: external)
        // set it before this filter and overwrote any client value: it is left as it is.
        if config.routing.endpoint_header_owner == EndpointHeaderOwner::Prewarm {
            host.remove_request_header(&config.routing.endpoint_header);
        }
        // only the filter's direct calls may name a pod for the direct cluster
        host.remove_request_header(&config.direct.direct_host_header);
        // only the filter assigns experiment arms
        host.remove_request_header(&config.routing.arm_header);
        host.count(Metric::RequestsSeen, 1);
        let is_post = host.request_header(":method").as_deref() == Some(b"POST");
        let endpoint = host
            .request_header(":path")
            .and_then(|p| String::from_utf8(p).ok())
            .and_then(|p| config.requests.endpoint_of(&p));
        let Some(endpoint) = endpoint.filter(|_| is_post) else {
            host.count(Metric::SkippedNotInference, 1);
            return Verdict::Continue;
        };
        if end_of_stream {
            host.count(Metric::SkippedNoBody, 1);
            return Verdict::Continue;
        }
        let length = host
            .request_header("content-length")
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<usize>().ok());
        let Some(length) = length else {
            host.count(Metric::SkippedNoContentLength, 1);
            return Verdict::Continue;
        };
        if length > config.requests.max_body_bytes {
            host.count(Metric::SkippedTooLarge, 1);
            return Verdict::Continue;
        }
        let user = header_name(host, config.identity.user_header.as_deref());
        // hashed now, while the headers are at hand; used only if the body names no user
        let credential = match user {
            None => worker.identity.identity(host, &worker.keys, config),
            Some(_) => None,
        };
        self.inspecting = Some(Inspection {
            endpoint,
            buffered: 0,
            tenant: header_name(host, config.identity.tenant_header.as_deref()),
            user,
            credential,
            started_ms: host.now_ms(),
            external_pick: (config.routing.endpoint_header_owner == EndpointHeaderOwner::External)
                .then(|| external_route::read_pick(host, config)),
        });
        // Routing must set a header, and the embedding cache may answer the request itself, so
        // the headers wait for the body (which needs Envoy's allow_on_headers_stop_iteration).
        // Otherwise nothing is written to the headers: let them go, and observe from the
        // buffered body alone — which also works where that setting is unavailable (Istio's
        // WasmPlugin).
        let may_answer = endpoint == Endpoint::Embeddings && config.embeddings.cache.enabled();
        if config.routing.enabled || may_answer {
            Verdict::Pause
        } else {
            Verdict::Continue
        }
    }

    /// `buffered` is the size of everything buffered so far.
    pub fn on_body<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        buffered: usize,
        end_of_stream: bool,
    ) -> Verdict {
        let Some(inspection) = self.inspecting.as_mut() else {
            return Verdict::Continue;
        };
        inspection.buffered = buffered;
        if buffered > worker.config.requests.max_body_bytes {
            // content-length lied; stop before Envoy's own limit is reached
            self.inspecting = None;
            host.count(Metric::SkippedTooLarge, 1);
            return Verdict::Continue;
        }
        if !end_of_stream {
            return Verdict::Pause;
        }
        self.finish(host, worker)
    }

    /// Trailers end the body too.
    pub fn on_trailers<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker) -> Verdict {
        self.finish(host, worker)
    }

    /// The response's headers (watched for the embedding cache and success feedback).
    pub fn on_response_headers<H: Host + ?Sized>(&mut self, host: &H) {
        if let Some(capture) = self.capture.as_mut() {
            capture.on_headers(host);
        }
        if let Some(watch) = self.success.as_mut() {
            watch.on_headers(host);
        }
        if let Some(watch) = self.outcome.as_mut() {
            watch.on_headers(host);
        }
    }

    /// A chunk of the response body, `size` bytes (watched for the embedding cache and success
    /// feedback).
    pub fn on_response_body<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        size: usize,
        end_of_stream: bool,
    ) {
        if let Some(capture) = self.capture.as_mut() {
            capture.on_body(host, worker, size, end_of_stream);
        }
        if let Some(watch) = self.success.as_mut() {
            watch.on_body(host, worker, size, end_of_stream);
        }
        if let Some(watch) = self.outcome.as_mut() {
            watch.on_body(host, size);
        }
        if end_of_stream {
            self.capture = None;
            self.success = None;
        }
    }

    /// The stream is done, however it ended: its outcome is enqueued.
    pub fn on_log<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker) {
        if let Some(record) = self.outcome.take().and_then(OutcomeWatch::finish) {
            worker.outcomes.defer(host, record);
        }
    }

    /// The whole body is here: answer it from the embedding cache, or observe and route it.
    /// `Pause` only when the filter answered the request itself.
    fn finish<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker) -> Verdict {
        let Some(inspection) = self.inspecting.take() else {
            return Verdict::Continue;
        };
        let config = &worker.config;
        let stop = config.requests.bench_stop_after;
        if stop == Some(Stage::Headers) {
            return Verdict::Continue;
        }
        let Some(body) = host.request_body(0, inspection.buffered) else {
            host.count(Metric::SkippedMalformed, 1);
            return Verdict::Continue;
        };
        if stop == Some(Stage::Body) {
            return Verdict::Continue;
        }
        let request =
            match parse_request(inspection.endpoint, &body, config.requests.max_body_bytes) {
                Ok(r) => r,
                Err(_) => {
                    host.count(Metric::SkippedMalformed, 1);
                    return Verdict::Continue;
                }
            };
        if stop == Some(Stage::Parse) {
            return Verdict::Continue;
        }
        host.count(Metric::RequestsInspected, 1);
        if request.endpoint == Endpoint::Embeddings {
            match embeddings::flow::on_request(host, worker, &request.model, &body) {
                Lookup::Answered => return Verdict::Pause,
                Lookup::Forward(capture) => self.capture = Some(capture),
                Lookup::Pass => {}
            }
        }
        self.route(host, worker, inspection, request);
        Verdict::Continue
    }

    /// The request's experiment arm, with the arm header set, when the filter routes and the
    /// table (refreshed first: a table another worker published since this worker's last tick
    /// routes this request) runs an experiment.
    fn assign_arm<H: Host + ?Sized>(
        &self,
        host: &H,
        worker: &Worker,
        user: Option<&str>,
        tenant: Option<&str>,
    ) -> Option<ArmChoice> {
        if !worker.config.routing.enabled {
            return None;
        }
        worker.table.refresh(host, &worker.keys);
        let table = worker.table.table()?;
        let arm = experiments::arm::assign(host, table.experiment.as_ref()?, user, tenant)?;
        host.set_request_header(&worker.config.routing.arm_header, arm.header.as_bytes());
        Some(arm)
    }

    fn route<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        inspection: Inspection,
        request: prewarm_core::InferenceRequest,
    ) {
        let config = &worker.config;
        let canonical = canonical_prompt(&request);
        let chain = BlockChain::of(&request.model, canonical.as_bytes(), &worker.fingerprint);
        if config.requests.bench_stop_after == Some(Stage::Fingerprint) {
            // the index's keys too: the routing below computes them from the chain
            std::hint::black_box(PromptKeys::of(&chain, &worker.fingerprint));
            return;
        }
        let body_user = request
            .user
            .as_deref()
            .filter(|u| config.identity.user_from_body && u.len() <= MAX_NAME_BYTES);
        let user = inspection.user.as_deref().or(body_user);
        // a streak's identity: the user, else the credential's (never an arm's unit: see
        // `credential`)
        let identity = user.or(inspection.credential.as_deref());
        if user.is_none() {
            let counted = match identity {
                Some(_) => Metric::UserFromCredential,
                None => Metric::NoUser,
            };
            host.count(counted, 1);
        }
        // the arm first: an arm without warm-up keeps its prompts from the gateway's warm-ups
        let arm = self.assign_arm(host, worker, user, inspection.tenant.as_deref());
        let settings = arm.as_ref().map(|a| a.settings).unwrap_or_default();
        let sketched =
            prewarm_core::tokens::truncate_to_tokens(&canonical, config.requests.max_prefix_tokens);
        let observed = observe(
            host,
            config,
            &worker.keys,
            (&worker.tally, &worker.prompts),
            Observation {
                endpoint: request.endpoint,
                model: &request.model,
                tenant: inspection.tenant.as_deref(),
                user: identity,
                canonical: &canonical,
                chain: &chain,
                request: &request,
                sketched,
                arm: settings,
            },
        );
        if config.requests.bench_stop_after == Some(Stage::Observe) {
            return;
        }
        if settings.warmup {
            let mut prefill = observed.prefill;
            if let Some(Signal::Prefill(p)) = prefill.as_mut() {
                p.keep_warm = settings.keep_warm;
            }
            worker.queue.enqueue(host, prefill.into_iter().collect());
        } else if observed.prefill.is_some() {
            host.count(Metric::ArmSignalsWithheld, 1);
        }
        // a request that used a hot prefix: its answer may be feedback (only chat and
        // completions generate; an embedding has no finish reason)
        if let Some(prefix) = observed.adopted {
            if request.endpoint != Endpoint::Embeddings {
                let asked = request.max_tokens.is_some();
                self.success = Some(SuccessWatch::new(&request.model, prefix, asked));
            }
        }
        if config.signals.outcomes && request.endpoint != Endpoint::Embeddings {
            let prefix = chain.routing_key(&worker.fingerprint);
            let mut watch = OutcomeWatch::new(
                inspection.started_ms,
                &request.model,
                prefix,
                request.stream,
            );
            if let Some(arm) = &arm {
                watch.set_arm(arm.header.clone());
            }
            self.outcome = Some(watch);
        }
        if !config.routing.enabled {
            host.count(Metric::UnroutedDisabled, 1);
            if let Some(pick) = inspection.external_pick {
                self.record_external(host, worker, pick, &request.model, &chain);
            }
            return;
        }
        if settings.routing == ArmRouting::Off {
            host.count(Metric::UnroutedArmOff, 1);
            return;
        }
        let table = worker.table.view(settings.warmup);
        let keys = PromptKeys::of(&chain, &worker.fingerprint);
        let mut store = SharedPrefixStore::new(host, &worker.keys, config.shared_data.prefix_slots)
            .with_pending(&worker.prefix_pending, config.shared_data.prefix_horizon_ms)
            .with_reads(&worker.prefix_reads);
        let now = host.now_ms();
        let route = choose_pod(
            table.as_deref(),
            &request.model,
            &worker.fingerprint,
            &PrefixLookup {
                store: &store,
                keys: &keys,
                now_ms: now,
                horizon_ms: config.shared_data.prefix_horizon_ms,
            },
            config.routing.endpoint_alternatives,
        );
        match route {
            Ok(route) => {
                let value = route.header_value();
                host.set_request_header(&config.routing.endpoint_header, value.as_bytes());
                host.count(Metric::Routed, 1);
                if route.matched_blocks > 0 {
                    host.count(Metric::RoutedByPrefix, 1);
                }
                self.record_served(
                    host,
                    worker,
                    &mut store,
                    Served {
                        pod: &route.primary.id,
                        model: &request.model,
                        chain: &chain,
                        keys: &keys,
                        now_ms: now,
                    },
                );
            }
            Err(why) => host.count(why.metric(), 1),
        }
    }

    /// The pod another router named in the endpoint header, recorded as served like a pod the
    /// filter chose (`external_route`); a pick that names no pod of the table is counted.
    fn record_external<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        pick: Result<String, external_route::Unrecorded>,
        model: &str,
        chain: &BlockChain,
    ) {
        let pod = match pick.and_then(|address| external_route::pod_of(host, worker, &address)) {
            Ok(pod) => pod,
            Err(why) => {
                host.count(why.metric(), 1);
                return;
            }
        };
        let keys = PromptKeys::of(chain, &worker.fingerprint);
        let config = &worker.config;
        let mut store = SharedPrefixStore::new(host, &worker.keys, config.shared_data.prefix_slots)
            .with_pending(&worker.prefix_pending, config.shared_data.prefix_horizon_ms)
            .with_reads(&worker.prefix_reads);
        self.record_served(
            host,
            worker,
            &mut store,
            Served {
                pod: &pod,
                model,
                chain,
                keys: &keys,
                now_ms: host.now_ms(),
            },
        );
        host.count(Metric::ExternalRecorded, 1);
    }

    /// What prewarm learns from a request served by `served.pod`, whoever chose the pod: the
    /// outcome's pod, the prefix index (the next request of this prefix finds the pod holding
    /// it) and a served record (the gateway's KV model of the pod).
    fn record_served<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        store: &mut SharedPrefixStore<'_, H>,
        served: Served<'_>,
    ) {
        if let Some(watch) = self.outcome.as_mut() {
            watch.set_pod(served.pod);
        }
        let config = &worker.config;
        // the index's writes wait for the root tick (`prefix_pending`); when the VM's list is
        // full, the request writes them itself
        let queued = worker.prefix_pending.push(
            served.keys,
            served.pod,
            served.now_ms,
            config.shared_data.prefix_slots.max(1),
            config.shared_data.prefix_horizon_ms,
        );
        if !queued {
            let refused = record(
                store,
                served.keys,
                served.pod,
                served.now_ms,
                config.shared_data.prefix_horizon_ms,
            );
            if refused > 0 {
                host.count(Metric::PrefixWriteFailures, refused);
            }
        }
        if let Some(record) = served_record(worker, served.pod, served.model, served.chain) {
            worker.served.defer(host, record);
        }
    }
}

/// A request and the pod that serves it.
struct Served<'a> {
    pod: &'a str,
    model: &'a str,
    chain: &'a BlockChain,
    keys: &'a PromptKeys,
    now_ms: u64,
}

/// The served record of a request the table routed to `pod`, or that another router sent to a
/// pod of the table (`external_route`) — a request nobody named a pod for has none: the pod
/// Envoy's load balancer chose is not known here — for the gateway's KV model of the pod. None
/// standalone: no gateway ages a KV model with it.
pub fn served_record(
    worker: &Worker,
    pod: &str,
    model: &str,
    chain: &BlockChain,
) -> Option<ServedRecord> {
    (worker.config.direct.direct_calls != DirectMode::Always).then(|| {
        ServedRecord::of(
            pod,
            model,
            chain,
            chain.prompt_tokens as u64,
            &worker.fingerprint,
        )
    })
}
