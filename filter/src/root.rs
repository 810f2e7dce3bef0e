//! The root context's background work, on each tick: adopt a newer routing table another worker
//! published, read (or make) the proxy's key of credential identities (`request::credential`),
//! fold this VM's tallies into shared data (feedback, pin and shared-prompt prefill signals), send
//! the pending signals as one `SignalBatch` POST to `/v1/signals`, and (one worker per tick, by
//! a lease in shared data) poll `GET /v1/routing?since=<generation>` with
//! `if-none-match: "<generation>"`: 304 means unchanged and costs no parse; a 200 is the whole
//! table or a delta from the generation held (core's `table_delta`), checked with core's
//! decoder, a delta applied onto exactly its base, and the table published to every worker
//! through shared data. A delta that does not apply (another base, or a result that is not a
//! valid table) is counted and the whole table fetched at once. Every reply that fails, times
//! out or does not parse is counted and dropped; nothing here pauses a request.
//! Each gateway reply (or failure to dispatch) feeds `direct::gateway_health`; while
//! `direct::active` says so, the taken prefill and pin signals also become direct calls to the
//! pods (`direct`). With the embedding cache warmed by the gateway, the poll also asks for the
//! warm entries the proxy lacks (`embeddings::warm`). In standalone mode (`direct_calls:
//! always`) nothing is sent to the gateway.

use std::collections::HashMap;
use std::time::Duration;

use prewarm_core::table_delta::{apply, DeltaError, TableUpdate};
use prewarm_core::wire::{RoutingTable, Signal, SignalBatch};

use crate::config::DirectMode;
use crate::direct;
use crate::direct::gateway_health;
use crate::embeddings;
use crate::host::{Host, Level, Metric};
use crate::routing::prefix_index::seed_from_table;
use crate::routing::TableStamp;
use crate::shared::{read_u64, update};
use crate::signals::observe::fold_tally;
use crate::worker::Worker;

/// A call in flight and what it was for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Batch {
        signals: u64,
        served: u64,
        outcomes: u64,
        embeddings: u64,
    },
    /// `GET /v1/routing`, with the generation held when it asked for a delta.
    Table { since: Option<u64> },
    /// `GET /v1/embeddings/warm` (`embeddings::warm`).
    Warm,
    /// A direct call to a pod.
    Direct { pod: String },
}

/// Largest routing table body accepted, bytes.
const MAX_TABLE_BYTES: usize = 4 << 20;

#[derive(Debug, Default)]
pub struct RootTasks {
    calls: HashMap<u32, Call>,
}

impl RootTasks {
    pub fn on_tick<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker) {
        let now = host.now_ms();
        // before a new table's seeds: the gateway's placement is newer than this VM's traffic
        worker.prefix_pending.flush(
            host,
            &worker.keys,
            worker.config.shared_data.prefix_horizon_ms,
        );
        // other workers' writes of their last ticks are read again from now on
        worker.prefix_reads.clear();
        if let Some(stamp) = worker.table.refresh(host, &worker.keys) {
            host.gauge(Metric::TableGeneration, stamp.generation);
            // Whole seconds: the gauge is an integer and Prometheus' base unit is the second.
            let age_ms = now.saturating_sub(stamp.fetched_at_ms);
            host.gauge(Metric::TableAgeSeconds, age_ms / 1000);
        }
        worker.identity.refresh(host, &worker.keys, &worker.config);
        self.fold_tally(host, worker);
        // this VM's requests' records, into the rings the batch is taken from
        worker.served.flush(host);
        worker.outcomes.flush(host);
        self.flush_signals(host, worker, now);
        if worker.config.direct.direct_calls != DirectMode::Always {
            self.poll_table(host, worker, now);
        }
    }

    /// Folds the VM's tally into shared data and queues the signals it makes.
    pub fn fold_tally<H: Host + ?Sized>(&self, host: &H, worker: &Worker) {
        let config = &worker.config;
        let signals = fold_tally(
            host,
            config,
            &worker.keys,
            worker.tally.take(),
            &worker.prompts,
        );
        worker.queue.enqueue(host, signals);
    }

    fn in_flight(&self, pred: impl Fn(&Call) -> bool) -> bool {
        self.calls.values().any(pred)
    }

    fn gateway_headers<'a>(
        worker: &'a Worker,
        method: &'a str,
        path: &'a str,
    ) -> Vec<(&'a str, &'a str)> {
        vec![
            (":method", method),
            (":path", path),
            (
                ":authority",
                worker.config.gateway.gateway_authority.as_str(),
            ),
        ]
    }

    fn call<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        call: Call,
    ) -> bool {
        let bearer = worker
            .config
            .gateway
            .gateway_token
            .as_ref()
            .map(|t| format!("Bearer {t}"));
        let mut all = headers.to_vec();
        if let Some(b) = bearer.as_deref() {
            all.push(("authorization", b));
        }
        let timeout = Duration::from_millis(worker.config.gateway.gateway_timeout_ms);
        match host.dispatch(&worker.config.gateway.gateway_cluster, &all, body, timeout) {
            Some(token) => {
                self.calls.insert(token, call);
                true
            }
            None => {
                host.count(Metric::DispatchFailures, 1);
                gateway_health::record(
                    host,
                    &worker.keys,
                    worker.config.shared_data.cas_retries,
                    false,
                    host.now_ms(),
                );
                false
            }
        }
    }

    /// Sends the direct calls the taken signals ask for, when the filter does them now.
    fn send_direct<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        signals: &[Signal],
        now: u64,
    ) {
        let on = direct::active(host, worker, now);
        host.gauge(Metric::DirectActive, u64::from(on));
        if !on {
            return;
        }
        for call in direct::plan(host, worker, signals) {
            if let Some(token) = direct::send(host, worker, &call) {
                self.calls.insert(token, Call::Direct { pod: call.pod });
            }
        }
    }

    fn flush_signals<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker, now: u64) {
        if self.in_flight(|c| matches!(c, Call::Batch { .. })) {
            return;
        }
        let config = &worker.config;
        let pending = worker.queue.take(host);
        let served = worker.served.take(host);
        let outcomes = worker.outcomes.take(host);
        let embeddings = worker.embed_reports.take();
        self.send_direct(host, worker, &pending.records, now);
        if config.direct.direct_calls == DirectMode::Always
            || (pending.records.is_empty()
                && served.records.is_empty()
                && outcomes.records.is_empty()
                && embeddings.is_empty())
        {
            return;
        }
        let n = pending.records.len() as u64;
        let m = served.records.len() as u64;
        let o = outcomes.records.len() as u64;
        let e = embeddings.len() as u64;
        let mut batch = SignalBatch::new(config.gateway.source.clone(), now, pending.records);
        batch.dropped = pending.dropped;
        batch.served = served.records;
        batch.served_dropped = served.dropped;
        batch.outcomes = outcomes.records;
        batch.outcomes_dropped = outcomes.dropped;
        batch.embeddings = embeddings;
        let body = batch.encode();
        let mut headers = Self::gateway_headers(worker, "POST", "/v1/signals");
        headers.push(("content-type", "application/json"));
        if !self.call(
            host,
            worker,
            &headers,
            Some(&body),
            Call::Batch {
                signals: n,
                served: m,
                outcomes: o,
                embeddings: e,
            },
        ) {
            host.count(Metric::SignalsDropped, n);
            host.count(Metric::ServedDropped, m);
            host.count(Metric::OutcomesDropped, o);
            host.count(Metric::EmbeddingReportsDropped, e);
        }
    }

    /// Claims this tick's poll for this worker: at most about one poll per tick in all.
    fn claim_poll<H: Host + ?Sized>(host: &H, worker: &Worker, now: u64) -> bool {
        let half_tick = worker.config.gateway.tick_period_ms / 2;
        update(
            host,
            &worker.keys.poll(),
            worker.config.shared_data.cas_retries,
            |bytes| {
                let last = read_u64(bytes, 0).unwrap_or(0);
                if now.saturating_sub(last) >= half_tick || last > now {
                    (Some(now.to_le_bytes().to_vec()), true)
                } else {
                    (None, false)
                }
            },
        )
        .unwrap_or(false)
    }

    fn poll_table<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker, now: u64) {
        let table_in_flight = self.in_flight(|c| matches!(c, Call::Table { .. }));
        if table_in_flight || !Self::claim_poll(host, worker, now) {
            return;
        }
        let held = TableStamp::read(host, &worker.keys).map(|s| s.generation);
        self.fetch_table(host, worker, held);
        self.poll_warm(host, worker);
    }

    /// `GET /v1/routing`: conditional on, and a delta from, the generation `held` when given;
    /// the whole table without.
    fn fetch_table<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker, held: Option<u64>) {
        let path = match held {
            Some(g) => format!("/v1/routing?since={g}"),
            None => "/v1/routing".to_string(),
        };
        let etag = held.map(|g| format!("\"{g}\""));
        let mut headers = Self::gateway_headers(worker, "GET", &path);
        if let Some(etag) = etag.as_deref() {
            headers.push(("if-none-match", etag));
        }
        if self.call(host, worker, &headers, None, Call::Table { since: held }) {
            host.count(Metric::TableFetches, 1);
        }
    }

    /// Asks the gateway for the warm embedding entries this proxy lacks (`embeddings::warm`).
    fn poll_warm<H: Host + ?Sized>(&mut self, host: &H, worker: &Worker) {
        let warmed = worker.config.embeddings.cache.warmed_by_gateway();
        if !warmed || self.in_flight(|c| *c == Call::Warm) {
            return;
        }
        let path = embeddings::warm::path(host, worker);
        let headers = Self::gateway_headers(worker, "GET", &path);
        self.call(host, worker, &headers, None, Call::Warm);
    }

    /// A reply to one of this root's calls (or a synthesized 503/504 when it failed).
    pub fn on_call_response<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        token: u32,
        body_size: usize,
    ) {
        let Some(call) = self.calls.remove(&token) else {
            return;
        };
        let status = host.call_response_status();
        let ok = status.is_some_and(|s| (200..300).contains(&s));
        if let Call::Direct { pod } = &call {
            direct::on_reply(host, worker, pod, status);
            return;
        }
        // the warm entries are extra: their poll's failure (an older gateway's 404) says
        // nothing of whether the gateway answers the table and the signals
        if call == Call::Warm {
            if embeddings::warm::on_reply(host, worker, status, body_size) {
                self.poll_warm(host, worker);
            }
            return;
        }
        let answered = ok || (matches!(call, Call::Table { .. }) && status == Some(304));
        gateway_health::record(
            host,
            &worker.keys,
            worker.config.shared_data.cas_retries,
            answered,
            host.now_ms(),
        );
        match call {
            Call::Batch {
                signals,
                served,
                outcomes,
                embeddings,
            } => {
                if ok {
                    host.count(Metric::BatchesSent, 1);
                    host.count(Metric::SignalsSent, signals);
                    host.count(Metric::ServedSent, served);
                    host.count(Metric::OutcomesSent, outcomes);
                } else {
                    host.count(Metric::DispatchFailures, 1);
                    host.count(Metric::SignalsDropped, signals);
                    host.count(Metric::ServedDropped, served);
                    host.count(Metric::OutcomesDropped, outcomes);
                    host.count(Metric::EmbeddingReportsDropped, embeddings);
                    host.log(
                        Level::Debug,
                        &format!("prewarm: signal batch refused: {status:?}"),
                    );
                }
            }
            Call::Table { since } => self.on_table(host, worker, status, body_size, since),
            Call::Warm | Call::Direct { .. } => {}
        }
    }

    fn on_table<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        status: Option<u16>,
        size: usize,
        since: Option<u64>,
    ) {
        let now = host.now_ms();
        let keys = &worker.keys;
        match status {
            Some(304) => {
                host.count(Metric::TableUnchanged, 1);
                if let Some(mut stamp) = TableStamp::read(host, keys) {
                    stamp.fetched_at_ms = now;
                    let _ = host.shared_set(&keys.generation(), &stamp.to_bytes(), None);
                }
            }
            Some(200) if size <= MAX_TABLE_BYTES => {
                let body = host.call_response_body(size).unwrap_or_default();
                match TableUpdate::decode(&body) {
                    Ok(TableUpdate::Whole(table)) => adopt(host, worker, table, &body, now),
                    Ok(TableUpdate::Delta(delta)) => {
                        let base = worker.table.table();
                        let applied = match base.as_deref() {
                            Some(base) => apply(&delta, base),
                            None => Err(DeltaError::WrongBase {
                                base: delta.base,
                                held: 0,
                            }),
                        };
                        match applied {
                            Ok(table) => {
                                host.count(Metric::TableDeltas, 1);
                                let body = table.encode();
                                adopt(host, worker, table, &body, now);
                            }
                            Err(e) => {
                                let metric = match e {
                                    DeltaError::WrongBase { .. } => Metric::TableDeltaWrongBase,
                                    DeltaError::Malformed(_) => Metric::TableDeltaInvalid,
                                };
                                host.count(metric, 1);
                                host.log(
                                    Level::Warn,
                                    &format!("prewarm: routing table delta refused: {e}"),
                                );
                                // only a delta the filter asked for is retried, whole, once
                                if since.is_some() {
                                    self.fetch_table(host, worker, None);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        host.count(Metric::TableFetchFailures, 1);
                        host.log(Level::Warn, &format!("prewarm: routing table refused: {e}"));
                    }
                }
            }
            _ => {
                host.count(Metric::TableFetchFailures, 1);
                host.log(
                    Level::Debug,
                    &format!("prewarm: routing table fetch: {status:?}"),
                );
            }
        }
    }
}

/// Publishes `table` (encoded as `body`) to every worker through shared data, seeds the prefix
/// index with its placed prefixes and installs it in this VM.
fn adopt<H: Host + ?Sized>(host: &H, worker: &Worker, table: RoutingTable, body: &[u8], now: u64) {
    let keys = &worker.keys;
    let stamp = TableStamp {
        generation: table.generation,
        fetched_at_ms: now,
    };
    // the table first: a worker seeing the new generation finds its table
    let _ = host.shared_set(&keys.table(), body, None);
    let _ = host.shared_set(&keys.generation(), &stamp.to_bytes(), None);
    host.count(Metric::TableUpdates, 1);
    host.gauge(Metric::TableGeneration, table.generation);
    seed_from_table(host, worker, &table);
    worker.table.install(table.generation, table);
    host.count(Metric::TableAdopted, 1);
}
