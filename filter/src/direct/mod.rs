//! The filter's direct calls: the prefills and adapter touches it sends to the pods itself when
//! `direct_calls` says so (`always`, or `when_gateway_down` while `gateway_health` says the
//! gateway is down). From the root tick only, never from a request's callbacks, so no client
//! request waits on them or is altered by them.
//!
//! - Which calls: a prefill for a prefill signal of a pattern not signalled before (core's
//!   `PatternState::New`: the "signalled before" flag in shared data dedups it across workers),
//!   a touch for a pin signal (one per crossing of the pin rate).
//! - Which pod: core's rules, as for the requests that follow: a prefix goes where a request
//!   repeating it is routed (`routing::choose_pod` over the prefix's own chain), an adapter to
//!   `warm_call::adapter_pod`. The table is the gateway's last one, or in standalone mode the
//!   one built from `direct_pods`.
//! - How: through `direct_cluster`, an `ORIGINAL_DST` cluster that connects to the address in
//!   `direct_host_header` and that no route references (clients cannot reach it; the request
//!   path also strips that header), with `direct_timeout_ms` on every call.
//! - Bounds (`budget`): one call in flight per pod, a back-off after a failed call (the
//!   filter's only view of a pod's health), and a minute budget of calls and prefill tokens per
//!   Envoy; every skip and failure is counted (`prewarm_filter_direct_*`).
//!
//! The parts: [`config`] (the mode and the static pods of standalone mode, part of the
//! configuration), [`budget`] (the bounds, in shared data), [`gateway_health`] (whether the
//! gateway answers, for `when_gateway_down`: one shared-data word every worker's replies feed,
//! so the whole Envoy takes over, and hands back, together).

pub mod budget;
pub mod config;
pub mod gateway_health;

use prewarm_core::prefix::PromptKeys;
use prewarm_core::warm_call::{adapter_pod, prefill_call, touch_body, WARM_CALL_PATH};
use prewarm_core::wire::{PatternState, Signal};
use prewarm_core::BlockChain;
use std::time::Duration;

use crate::config::DirectMode;
use crate::direct::budget::{back_off_pod, claim_pod, release_pod, spend, Limits, Refused};
use crate::host::{Host, Level, Metric};
use crate::routing::prefix_index::SharedPrefixStore;
use crate::routing::{choose_pod, PrefixLookup};
use crate::worker::Worker;

/// One call to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectCall {
    /// Pod id (the in-flight flag's owner).
    pub pod: String,
    pub address: String,
    /// The engine path: a chat prefix is warmed through the chat endpoint (`warm_call`).
    pub path: &'static str,
    pub body: Vec<u8>,
    /// Prompt tokens it costs the pod (the budget's unit).
    pub tokens: u64,
}

/// Whether the filter sends the warming calls at `now`.
pub fn active<H: Host + ?Sized>(host: &H, worker: &Worker, now: u64) -> bool {
    let config = &worker.config;
    match config.direct.direct_calls {
        DirectMode::Off => false,
        DirectMode::Always => true,
        DirectMode::WhenGatewayDown => gateway_health::is_down(
            host,
            &worker.keys,
            config.direct.direct_takeover_after_ms,
            now,
        ),
    }
}

/// The calls `signals` ask for, each with the pod core's rules give (none when the table has no
/// pod for it: counted in `prewarm_filter_direct_skipped_total{reason="no_pod"}`).
pub fn plan<H: Host + ?Sized>(host: &H, worker: &Worker, signals: &[Signal]) -> Vec<DirectCall> {
    let table = worker.table.table();
    let config = &worker.config;
    let store = SharedPrefixStore::new(host, &worker.keys, config.shared_data.prefix_slots);
    let now = host.now_ms();
    let mut calls = Vec::new();
    for signal in signals {
        let call = match signal {
            Signal::Prefill(p) if p.state == PatternState::New => {
                let chain = BlockChain {
                    blocks: p.prefix.clone(),
                    prompt_tokens: p.prefix_tokens,
                };
                let keys = PromptKeys::of(&chain, &worker.fingerprint);
                let lookup = PrefixLookup {
                    store: &store,
                    keys: &keys,
                    now_ms: now,
                    horizon_ms: config.shared_data.prefix_horizon_ms,
                };
                choose_pod(table.as_deref(), &p.model, &worker.fingerprint, &lookup, 0)
                    .ok()
                    .map(|route| {
                        let call =
                            prefill_call(p.endpoint, &p.model, &p.prefix_text, p.shape.as_ref());
                        DirectCall {
                            pod: route.primary.id.clone(),
                            address: route.primary.address.clone(),
                            path: call.path,
                            body: call.body.to_string().into_bytes(),
                            tokens: (p.prefix_tokens as u64).saturating_add(1),
                        }
                    })
            }
            Signal::Pin(pin) => table
                .as_deref()
                .and_then(|t| adapter_pod(t, &pin.adapter))
                .map(|pod| DirectCall {
                    pod: pod.id.clone(),
                    address: pod.address.clone(),
                    path: WARM_CALL_PATH,
                    body: touch_body(&pin.adapter),
                    tokens: 1,
                }),
            _ => continue,
        };
        match call {
            Some(c) => calls.push(c),
            None => host.count(Metric::DirectSkippedNoPod, 1),
        }
    }
    calls
}

/// Takes the pod's in-flight flag and the budget for `call`, then dispatches it; the token of
/// the call in flight, or `None` when it was skipped or refused (counted).
pub fn send<H: Host + ?Sized>(host: &H, worker: &Worker, call: &DirectCall) -> Option<u32> {
    let config = &worker.config;
    let now = host.now_ms();
    let retries = config.shared_data.cas_retries;
    // the flag outlives the call by a tick, so it is cleared by the reply, not by expiry
    let until = now
        .saturating_add(config.direct.direct_timeout_ms)
        .saturating_add(config.gateway.tick_period_ms);
    let skipped = |why: Refused| {
        host.count(
            match why {
                Refused::Budget => Metric::DirectSkippedBudget,
                Refused::InFlight => Metric::DirectSkippedInFlight,
                Refused::Backoff => Metric::DirectSkippedBackoff,
                Refused::Contended => Metric::DirectFailed,
            },
            1,
        );
    };
    if let Err(why) = claim_pod(host, &worker.keys, retries, &call.pod, now, until) {
        skipped(why);
        return None;
    }
    let limits = Limits {
        calls_per_min: config.direct.direct_calls_per_min,
        tokens_per_min: config.direct.direct_prefill_tokens_per_min,
        cas_retries: retries,
    };
    if let Err(why) = spend(host, &worker.keys, limits, call.tokens, now) {
        release_pod(host, &worker.keys, retries, &call.pod);
        skipped(why);
        return None;
    }
    let headers = [
        (":method", "POST"),
        (":path", call.path),
        (":authority", call.address.as_str()),
        ("content-type", "application/json"),
        (
            config.direct.direct_host_header.as_str(),
            call.address.as_str(),
        ),
    ];
    let timeout = Duration::from_millis(config.direct.direct_timeout_ms);
    match host.dispatch(
        &config.direct.direct_cluster,
        &headers,
        Some(&call.body),
        timeout,
    ) {
        Some(token) => {
            host.count(Metric::DirectSent, 1);
            Some(token)
        }
        None => {
            release_pod(host, &worker.keys, retries, &call.pod);
            host.count(Metric::DirectFailed, 1);
            None
        }
    }
}

/// The reply to a direct call to `pod` (or Envoy's synthesized 503/504). After a failure the pod
/// backs off for `direct_timeout_ms`, as long as a call to it may take: a pod that is down (Envoy
/// answers 503 at once) gets one failed call per back-off, not one per signal.
pub fn on_reply<H: Host + ?Sized>(host: &H, worker: &Worker, pod: &str, status: Option<u16>) {
    let config = &worker.config;
    if status.is_some_and(|s| (200..300).contains(&s)) {
        release_pod(host, &worker.keys, config.shared_data.cas_retries, pod);
        host.count(Metric::DirectOk, 1);
    } else {
        let until = host
            .now_ms()
            .saturating_add(config.direct.direct_timeout_ms);
        back_off_pod(
            host,
            &worker.keys,
            config.shared_data.cas_retries,
            pod,
            until,
        );
        host.count(Metric::DirectFailed, 1);
        host.log(
            Level::Debug,
            &format!("prewarm: direct call to {pod} failed: {status:?}"),
        );
    }
}
