//! The publisher's socket and its step loop (see the parent module's docs).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use prewarm_core::kv_events::{encode_batch, encode_sequence, KvEventBatch};
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketSend, ZmqMessage};

use super::replay::{start_replay, ReplayBuffer};
use super::{events_of, KvEventsConfig, STEP};
use crate::server::AppState;

/// How long a connecting publisher waits for its subscriber within one step.
const CONNECT_WAIT: Duration = Duration::from_millis(200);

/// The publisher's socket: bound once, or connected (again after its peer went away).
struct Link {
    endpoint: String,
    socket: Option<zeromq::PubSocket>,
    events: Option<futures::channel::mpsc::Receiver<zeromq::SocketEvent>>,
}

impl Link {
    /// The socket to send on: a connected one that lost its peer is dropped, and one is
    /// connected when none is (waiting at most [`CONNECT_WAIT`]).
    async fn socket(&mut self) -> Option<&mut zeromq::PubSocket> {
        let lost = self.events.as_mut().is_some_and(|events| {
            std::iter::from_fn(|| events.try_recv().ok())
                .any(|e| matches!(e, zeromq::SocketEvent::Disconnected(_)))
        });
        if lost {
            self.socket = None;
        }
        if self.socket.is_none() {
            let mut socket = zeromq::PubSocket::new();
            let events = socket.monitor();
            let connect = socket.connect(&self.endpoint);
            if let Ok(Ok(())) = tokio::time::timeout(CONNECT_WAIT, connect).await {
                self.socket = Some(socket);
                self.events = Some(events);
            }
        }
        self.socket.as_mut()
    }
}

/// Binds the pod's publisher (or prepares its connection) and its replay socket, and starts
/// the step loop; the pod model starts logging.
pub async fn start_publisher(
    state: Arc<AppState>,
    config: &KvEventsConfig,
) -> Result<JoinHandle<()>, String> {
    let mut link = Link {
        endpoint: config.endpoint.clone(),
        socket: None,
        events: None,
    };
    if config.binds() {
        let mut socket = zeromq::PubSocket::new();
        socket
            .bind(&KvEventsConfig::bind_address(&config.endpoint))
            .await
            .map_err(|e| format!("kv events: bind {}: {e}", config.endpoint))?;
        link.socket = Some(socket);
    }
    let buffer = ReplayBuffer::new(config.buffer_steps);
    let replay = match &config.replay_endpoint {
        Some(endpoint) => Some(start_replay(endpoint, config.topic.clone(), buffer.clone()).await?),
        None => None,
    };
    state.lock_pod().log_kv_events();
    let topic = config.topic.clone();
    let block_size = state.config.pod.block_size;
    Ok(tokio::spawn(async move {
        // the replay task ends with the publisher
        let _replay = replay.map(AbortOnDrop);
        let mut seq: i64 = 0;
        let mut step = tokio::time::interval(STEP);
        step.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            step.tick().await;
            let changes = state.lock_pod().take_kv_events();
            if changes.is_empty() {
                // connected ahead of the first change, so that its batch finds the subscriber
                let _ = link.socket().await;
                continue;
            }
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let payload: Bytes = encode_batch(&KvEventBatch {
                ts,
                events: events_of(&changes, block_size),
                data_parallel_rank: None,
            })
            .into();
            buffer.keep(seq, payload.clone());
            let frames: Vec<Bytes> = vec![
                topic.clone().into_bytes().into(),
                encode_sequence(seq).to_vec().into(),
                payload,
            ];
            seq += 1;
            if let (Ok(message), Some(socket)) = (ZmqMessage::try_from(frames), link.socket().await)
            {
                // a batch no subscriber takes is lost, as from vLLM (the replay keeps it)
                let _ = socket.send(message).await;
            }
        }
    }))
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
