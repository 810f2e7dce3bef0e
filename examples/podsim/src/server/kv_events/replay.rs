//! The replay socket, as vLLM serves it: a ROUTER bound at `replay_endpoint` that keeps the
//! last `buffer_steps` batches. A request `[identity, "", start]` (`start`: 8 bytes big-endian;
//! a REQ or DEALER client sends the empty delimiter) is answered with one message
//! `[identity, "", topic, sequence, payload]` for every kept batch numbered `start` or later,
//! oldest first, then `[identity, "", "", -1, ""]`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use prewarm_core::kv_events::{decode_sequence, encode_sequence};
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::KvEventsConfig;

/// The batches kept for replay, oldest first, at most `capacity`.
#[derive(Clone)]
pub struct ReplayBuffer {
    kept: Arc<Mutex<VecDeque<(i64, Bytes)>>>,
    capacity: usize,
}

impl ReplayBuffer {
    pub fn new(capacity: usize) -> Self {
        Self {
            kept: Arc::default(),
            capacity: capacity.max(1),
        }
    }

    pub fn keep(&self, seq: i64, payload: Bytes) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() == self.capacity {
            kept.pop_front();
        }
        kept.push_back((seq, payload));
    }

    /// The kept batches numbered `start` or later, oldest first.
    pub fn since(&self, start: i64) -> Vec<(i64, Bytes)> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter().filter(|(s, _)| *s >= start).cloned().collect()
    }
}

/// Binds the replay socket and starts answering.
pub async fn start_replay(
    endpoint: &str,
    topic: String,
    buffer: ReplayBuffer,
) -> Result<JoinHandle<()>, String> {
    let mut socket = zeromq::RouterSocket::new();
    socket
        .bind(&KvEventsConfig::bind_address(endpoint))
        .await
        .map_err(|e| format!("kv events: bind replay {endpoint}: {e}"))?;
    Ok(tokio::spawn(async move {
        while let Ok(request) = socket.recv().await {
            let frames = request.into_vec();
            // [identity, "", start]; anything else is ignored, as vLLM ignores it
            let [identity, _, start] = frames.as_slice() else {
                continue;
            };
            let Ok(start) = decode_sequence(start) else {
                continue;
            };
            let reply = |parts: [Bytes; 3]| {
                let frames: Vec<Bytes> = [identity.clone(), Bytes::new()]
                    .into_iter()
                    .chain(parts)
                    .collect();
                ZmqMessage::try_from(frames)
            };
            for (seq, payload) in buffer.since(start) {
                let frames = [
                    Bytes::from(topic.clone().into_bytes()),
                    Bytes::from(encode_sequence(seq).to_vec()),
                    payload,
                ];
                if let Ok(m) = reply(frames) {
                    let _ = socket.send(m).await;
                }
            }
            let end = [
                Bytes::new(),
                Bytes::from(encode_sequence(-1).to_vec()),
                Bytes::new(),
            ];
            if let Ok(m) = reply(end) {
                let _ = socket.send(m).await;
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_keeps_the_last_batches_and_answers_from_a_number_on() {
        let b = ReplayBuffer::new(3);
        for seq in 0..5 {
            b.keep(seq, Bytes::from(vec![seq as u8]));
        }
        let seqs = |v: Vec<(i64, Bytes)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(b.since(0)), vec![2, 3, 4]);
        assert_eq!(seqs(b.since(3)), vec![3, 4]);
        assert!(b.since(9).is_empty());
    }
}
