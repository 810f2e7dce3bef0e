//! Reading the pods' KV-cache events (vLLM's `--kv-events-config`, podsim's flag of the same
//! name), in either of the two ways vLLM publishes them:
//!
//! - **The pod binds, the gateway connects** (`[[pods.static]] kv_events`, `[pods.dns]
//!   kv_events_port`): vLLM binds its PUB socket when the endpoint is a wildcard
//!   (`tcp://*:5557`); one task a pod subscribes to it, every topic.
//! - **The gateway binds, the pods connect** (`[pods] kv_events_listen`): vLLM connects its PUB
//!   socket to any other endpoint (`tcp://prewarm-gateway:5557`); one task binds a SUB socket
//!   there and reads every pod's messages, each naming its pod by its topic (the pod's id or
//!   address). A topic that names no pod is counted (`pod="-"`, `outcome="unknown_topic"`).
//!
//! For the first way:
//! - The health round starts a pod's task when the pod has an endpoint and none runs
//!   ([`Gateway::ensure_kv_subscriptions`]); removing the pod drops its [`Subscription`], which
//!   ends the task. The task holds the gateway weakly and stops at shutdown.
//! - Connecting waits up to [`CONNECT_TIMEOUT`], then retries with a backoff doubling from
//!   [`RETRY_MIN`] to [`RETRY_MAX`]; a receive error (the publisher went away) drops the socket
//!   and connects again. A restarted engine is found by its sequence numbers
//!   (`policy::fleet::engine_blocks`).
//! - Each message is decoded outside the gateway's lock (core's `kv_events`: frames, sequence,
//!   payload, with its limits), then applied to the pod's ledger under it. A message that does
//!   not decode is counted (`prewarm_kv_event_batches_total{outcome="undecodable"}`) and noted
//!   in the pod's recent errors; the next one is read.
//! - Backpressure: the task reads one message at a time. ZeroMQ's PUB side drops what a slow
//!   subscriber cannot take; the ledger counts the gap from the sequence numbers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use prewarm_core::kv_events::{decode_batch, decode_sequence, KvEventBatch, KvEventError};
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, ZmqMessage};

use super::kv_replay::fetch_replay;
use super::Gateway;
use crate::policy::fleet::engine_blocks::{CacheChange, EngineBlockCounts};
use crate::telemetry::Telemetry;

/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// First pause after a failed connection or a lost one.
pub const RETRY_MIN: Duration = Duration::from_millis(250);
/// Longest pause between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// A pod's running subscription; dropping it ends the task.
#[derive(Debug)]
pub struct Subscription {
    /// The spec's `host:port` it reads.
    pub address: String,
    /// Whether the task is connected to the publisher now.
    connected: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Subscription {
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    /// Starts the subscription of every pod that has an endpoint and none running (the
    /// endpoint changed: the old one is dropped). Called by the health round.
    pub fn ensure_kv_subscriptions(self: &Arc<Self>) {
        let mut state = self.state();
        for (id, pod) in state.pods.iter_mut() {
            let wanted = pod.spec.kv_events.as_deref();
            let running = pod.kv_events.as_ref().map(|s| s.address.as_str());
            if wanted == running {
                continue;
            }
            pod.kv_events = wanted.map(|address| {
                let endpoint = format!("tcp://{address}");
                tracing::info!(pod = %id, %endpoint, "subscribing to kv-cache events");
                let connected = Arc::new(AtomicBool::new(false));
                Subscription {
                    task: tokio::spawn(read_events(
                        Arc::downgrade(self),
                        id.clone(),
                        endpoint.clone(),
                        connected.clone(),
                    )),
                    connected,
                    address: address.to_string(),
                }
            });
        }
    }

    /// Starts the listener of `[pods] kv_events_listen` (bound before it returns).
    pub async fn listen_kv_events(self: &Arc<Self>) -> Result<Option<JoinHandle<()>>, String> {
        let Some(address) = self.config.pods.kv_events_listen.clone() else {
            return Ok(None);
        };
        let mut socket = zeromq::SubSocket::new();
        socket
            .bind(&format!("tcp://{address}"))
            .await
            .map_err(|e| format!("pods.kv_events_listen: {address:?}: {e}"))?;
        socket
            .subscribe("")
            .await
            .map_err(|e| format!("pods.kv_events_listen: {address:?}: {e}"))?;
        tracing::info!(%address, "listening for kv-cache events");
        let gateway = Arc::downgrade(self);
        let mut shutdown = self.shutdown_signal();
        Ok(Some(tokio::spawn(async move {
            while let Some((g, received)) = next_message(&mut socket, &mut shutdown, &gateway).await
            {
                match received {
                    Ok(message) => {
                        let topic = message
                            .get(0)
                            .map(|t| String::from_utf8_lossy(t).into_owned());
                        match topic.and_then(|t| g.pod_of_topic(&t)) {
                            Some(id) => {
                                let _ = g.on_kv_message(&id, message).await;
                            }
                            None => Telemetry::count(
                                &g.telemetry.kv_event_batches,
                                &[("pod", "-"), ("outcome", "unknown_topic")],
                            ),
                        }
                    }
                    // a peer went away; the socket keeps listening for the others
                    Err(e) => tracing::debug!(error = %e, "kv events listener"),
                }
            }
        })))
    }

    /// The pod a listener message's topic names: its id, else its address.
    fn pod_of_topic(&self, topic: &str) -> Option<String> {
        let state = self.state();
        if state.pods.contains_key(topic) {
            return Some(topic.to_string());
        }
        state
            .pods
            .values()
            .find(|p| p.spec.address == topic)
            .map(|p| p.spec.id.clone())
    }

    /// Applies one message of pod `id`'s publisher, after the batches before it that the
    /// gateway missed when the pod has a replay socket (`kv_events_replay`): a gap in the
    /// sequence numbers, or a first batch that is not its process's first. A decoding error is
    /// returned (and counted).
    pub async fn on_kv_message(&self, id: &str, message: ZmqMessage) -> Result<(), KvEventError> {
        let decoded = decode_message(message);
        let (seq, batch) = match decoded {
            Ok(d) => d,
            Err(e) => {
                Telemetry::count(
                    &self.telemetry.kv_event_batches,
                    &[("pod", id), ("outcome", "undecodable")],
                );
                if let Some(pod) = self.state().pods.get_mut(id) {
                    pod.note_error(format!("kv events: {e}"));
                }
                return Err(e);
            }
        };
        self.catch_up(id, seq).await;
        self.apply_kv_batch(id, seq, &batch);
        Ok(())
    }

    /// Replays what pod `id` published before batch `seq` that the ledger has not read.
    async fn catch_up(&self, id: &str, seq: i64) {
        let (missing_from, replay) = {
            let state = self.state();
            let next = state.fleet.pod(id).map(|p| p.engine_blocks.next_seq());
            let replay = state
                .pods
                .get(id)
                .and_then(|p| p.spec.kv_events_replay.clone());
            (next, replay)
        };
        let from = match missing_from {
            Some(Some(next)) if seq > next => next,
            Some(None) if seq > 0 => 0,
            _ => return,
        };
        let Some(address) = replay else {
            return;
        };
        match fetch_replay(&address, from, seq).await {
            Ok(batches) => {
                Telemetry::add(
                    &self.telemetry.kv_event_batches,
                    &[("pod", id), ("outcome", "replayed")],
                    batches.len() as u64,
                );
                for (s, b) in batches {
                    self.apply_kv_batch(id, s, &b);
                }
            }
            Err(e) => {
                if let Some(pod) = self.state().pods.get_mut(id) {
                    pod.note_error(format!("kv events: replay from {from}: {e}"));
                }
            }
        }
    }

    /// Applies batch `seq` to pod `id`'s ledger, counting what it held.
    fn apply_kv_batch(&self, id: &str, seq: i64, batch: &KvEventBatch) {
        let now = self.now();
        let (before, change, after) = {
            let mut state = self.state();
            let before = state
                .fleet
                .pod(id)
                .map(|p| p.engine_blocks.counts())
                .unwrap_or_default();
            let change = state.fleet.on_kv_events(id, seq, batch, now);
            let after = state
                .fleet
                .pod(id)
                .map(|p| p.engine_blocks.counts())
                .unwrap_or_default();
            (before, change, after)
        };
        self.count_kv_events(id, &before, &after);
        match change {
            Some(CacheChange::Restarted) => {
                tracing::warn!(pod = %id, seq, "kv events: a new engine process; its cache is gone")
            }
            Some(CacheChange::Cleared) => {
                tracing::warn!(pod = %id, seq, "kv events: the engine cleared its cache")
            }
            _ => {}
        }
    }

    fn count_kv_events(&self, id: &str, before: &EngineBlockCounts, after: &EngineBlockCounts) {
        let t = &self.telemetry;
        let batches = [
            ("applied", after.batches - before.batches),
            ("missed", after.missed_batches - before.missed_batches),
        ];
        let blocks = [
            ("stored", after.stored - before.stored),
            ("removed", after.removed - before.removed),
            ("offloaded", after.offloaded - before.offloaded),
            ("dropped", after.dropped - before.dropped),
        ];
        let rows = (batches.iter().map(|r| (&t.kv_event_batches, "outcome", r)))
            .chain(blocks.iter().map(|r| (&t.kv_event_blocks, "kind", r)));
        for (family, label, &(value, n)) in rows {
            if n > 0 {
                Telemetry::add(family, &[("pod", id), (label, value)], n);
            }
        }
    }
}

fn decode_message(message: ZmqMessage) -> Result<(i64, KvEventBatch), KvEventError> {
    let frames = message.into_vec();
    let [_topic, seq, payload] = frames.as_slice() else {
        return Err(KvEventError::Frames(frames.len()));
    };
    Ok((decode_sequence(seq)?, decode_batch(payload)?))
}

/// The next message on `socket` and the gateway to apply it to; `None` at shutdown or once the
/// gateway is gone.
async fn next_message(
    socket: &mut zeromq::SubSocket,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    gateway: &Weak<Gateway>,
) -> Option<(Arc<Gateway>, zeromq::ZmqResult<ZmqMessage>)> {
    let received = tokio::select! {
        _ = shutdown.changed() => return None,
        r = socket.recv() => r,
    };
    Some((gateway.upgrade()?, received))
}

/// Connects, reads, reconnects; see the module docs.
async fn read_events(
    gateway: Weak<Gateway>,
    id: String,
    endpoint: String,
    connected_now: Arc<AtomicBool>,
) {
    let Some(mut shutdown) = gateway.upgrade().map(|g| g.shutdown_signal()) else {
        return;
    };
    let mut pause = RETRY_MIN;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let mut socket = zeromq::SubSocket::new();
        let connected = match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(&endpoint)).await
        {
            Ok(Ok(())) => socket.subscribe("").await.map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {CONNECT_TIMEOUT:?}")),
        };
        match connected {
            Ok(()) => {
                pause = RETRY_MIN;
                connected_now.store(true, Ordering::Relaxed);
                loop {
                    let Some((g, received)) =
                        next_message(&mut socket, &mut shutdown, &gateway).await
                    else {
                        return;
                    };
                    match received {
                        Ok(message) => {
                            let _ = g.on_kv_message(&id, message).await;
                        }
                        Err(e) => {
                            tracing::info!(pod = %id, %endpoint, error = %e, "kv events: connection lost");
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::debug!(pod = %id, %endpoint, error = %e, "kv events: cannot connect");
            }
        }
        connected_now.store(false, Ordering::Relaxed);
        drop(socket);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}
