//! Asking a pod's replay socket for the KV-event batches the gateway missed (vLLM's
//! `--kv-events-config` `replay_endpoint`, podsim's the same; `[[pods.static]]
//! kv_events_replay`). vLLM keeps the last `buffer_steps` batches (10,000 by default) behind a
//! ROUTER socket; the gateway connects a DEALER, sends `["", start]` (8 bytes big-endian) and
//! reads `["", topic, sequence, payload]` until the sequence is −1.
//!
//! Bounded: [`REPLAY_TIMEOUT`] for the whole exchange, at most [`MAX_REPLAY_BATCHES`] batches
//! and [`MAX_REPLAY_BYTES`] of payload; past any bound the batches read so far are returned
//! (what is missing stays a gap the ledger counts).

use std::time::Duration;

use axum::body::Bytes;
use prewarm_core::kv_events::{decode_batch, decode_sequence, encode_sequence, KvEventBatch};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// The longest a replay may take, connection included.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Most batches read from one replay (vLLM's default buffer).
pub const MAX_REPLAY_BATCHES: usize = 10_000;
/// Most payload bytes read from one replay.
pub const MAX_REPLAY_BYTES: usize = 64 << 20;

/// The batches numbered `from..until` the replay socket at `address` (`host:port`) still keeps,
/// in order; an error when it could not be asked (connection, timeout before any answer).
pub async fn fetch_replay(
    address: &str,
    from: i64,
    until: i64,
) -> Result<Vec<(i64, KvEventBatch)>, String> {
    let mut batches = Vec::new();
    let exchange = async {
        let mut socket = zeromq::DealerSocket::new();
        socket
            .connect(&format!("tcp://{address}"))
            .await
            .map_err(|e| e.to_string())?;
        let request: Vec<Bytes> = vec![Bytes::new(), encode_sequence(from).to_vec().into()];
        let request = ZmqMessage::try_from(request).map_err(|e| e.to_string())?;
        socket.send(request).await.map_err(|e| e.to_string())?;
        let mut bytes = 0usize;
        while batches.len() < MAX_REPLAY_BATCHES && bytes < MAX_REPLAY_BYTES {
            let reply = socket.recv().await.map_err(|e| e.to_string())?.into_vec();
            let [_, _topic, seq, payload] = reply.as_slice() else {
                return Err(format!("a reply of {} frames, expected 4", reply.len()));
            };
            let seq = decode_sequence(seq).map_err(|e| e.to_string())?;
            if seq < 0 {
                break;
            }
            bytes += payload.len();
            if (from..until).contains(&seq) {
                batches.push((seq, decode_batch(payload).map_err(|e| e.to_string())?));
            }
        }
        Ok::<(), String>(())
    };
    match tokio::time::timeout(REPLAY_TIMEOUT, exchange).await {
        Ok(Err(e)) if batches.is_empty() => return Err(e),
        Err(_) if batches.is_empty() => return Err(format!("no answer within {REPLAY_TIMEOUT:?}")),
        _ => {}
    }
    batches.sort_by_key(|(seq, _)| *seq);
    Ok(batches)
}
