//! KV-cache events, published as vLLM publishes them (`--kv-events-config`): a ZeroMQ PUB
//! socket, one message `[topic, sequence, payload]` for each step that changed the prefix cache
//! (core's [`prewarm_core::kv_events`] writes the payload as vLLM 0.32 does).
//!
//! - Like vLLM, the socket *binds* a wildcard endpoint (`tcp://*:5557`, `tcp://[::]:5557`) and
//!   *connects* to any other (`tcp://gateway:5557`: the subscriber binds). A connected socket
//!   that loses its peer connects again at the next step (libzmq reconnects by itself).
//! - A *step* is [`STEP`] of real time: every step the publisher takes the pod model's logged
//!   changes (blocks registered at allocation, blocks evicted) and sends them as one batch,
//!   registrations that continue one chain grouped into one `BlockStored`, consecutive evictions
//!   into one `BlockRemoved`. A step with no change sends nothing (vLLM sends no empty batch).
//! - Sequence numbers start at 0 with the process (a restarted podsim starts again at 0, as a
//!   restarted vLLM does) and grow by one a batch.
//! - podsim has no tokenizer: each block's `token_ids` are `block_size` stand-in ids derived
//!   from the block's hash — the right count, not the prompt's tokens. Hashes are podsim's own
//!   chained block hashes (integers), parents as the pod model chains them.
//! - With `--pods N`, pod *i* binds the endpoint's port + *i*, as vLLM offsets it by the data
//!   parallel rank.
//! - Events published while no subscriber is connected are lost (ZeroMQ PUB drops them), as
//!   they are from vLLM; with a `replay_endpoint` the last `buffer_steps` batches (default
//!   10,000) can be asked for again ([`replay`]).
//!
//! Parts: the flag and the grouping of a step's changes here, the socket and the step loop in
//! [`publisher`], the replay buffer and its ROUTER socket in [`replay`].

pub mod publisher;
pub mod replay;

use std::time::Duration;

use prewarm_core::kv_events::{KvEvent, Medium};
use serde::Deserialize;

use crate::prefix_cache::PoolEvent;

pub use publisher::start_publisher;

/// How often logged changes are published (vLLM publishes once a scheduler step).
pub const STEP: Duration = Duration::from_millis(20);

/// vLLM's `--kv-events-config` JSON, the fields podsim reads (others are refused by name).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsFlag {
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    #[serde(default)]
    pub publisher: Option<String>,
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    #[serde(default)]
    pub topic: String,
    /// Batches the replay socket keeps (default 10,000, as vLLM).
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Accepted for compatibility (podsim queues nothing).
    #[serde(default)]
    pub hwm: Option<u64>,
    #[serde(default)]
    pub max_queue_size: Option<u64>,
}

fn default_endpoint() -> String {
    "tcp://*:5557".into()
}

fn default_buffer_steps() -> usize {
    10_000
}

/// Where and under which topic a pod publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// `tcp://HOST:PORT` (`*` is bound as every interface, as ZeroMQ reads it).
    pub endpoint: String,
    pub topic: String,
    /// `tcp://HOST:PORT` of the replay socket (always bound, as vLLM binds it).
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
}

impl KvEventsConfig {
    /// The flag's JSON read: `None` when events are not enabled, or the problem naming the field.
    pub fn from_flag(json: &str) -> Result<Option<Self>, String> {
        let flag: KvEventsFlag =
            serde_json::from_str(json).map_err(|e| format!("--kv-events-config: {e}"))?;
        let publisher = flag
            .publisher
            .as_deref()
            .unwrap_or(if flag.enable_kv_cache_events {
                "zmq"
            } else {
                "null"
            });
        match publisher {
            "null" => return Ok(None),
            "zmq" if flag.enable_kv_cache_events => {}
            "zmq" => {
                return Err(
                    "--kv-events-config: publisher: \"zmq\": needs enable_kv_cache_events: true"
                        .into(),
                )
            }
            other => {
                return Err(format!(
                    "--kv-events-config: publisher: {other:?}: must be \"zmq\" or \"null\""
                ))
            }
        }
        Self::endpoint_port(&flag.endpoint, "endpoint")?;
        if let Some(replay) = &flag.replay_endpoint {
            Self::endpoint_port(replay, "replay_endpoint")?;
        }
        if !(1..=1_000_000).contains(&flag.buffer_steps) {
            return Err(format!(
                "--kv-events-config: buffer_steps: {}: must be 1..1000000",
                flag.buffer_steps
            ));
        }
        Ok(Some(Self {
            endpoint: flag.endpoint,
            topic: flag.topic,
            replay_endpoint: flag.replay_endpoint,
            buffer_steps: flag.buffer_steps,
        }))
    }

    fn endpoint_port<'a>(endpoint: &'a str, field: &str) -> Result<(&'a str, u16), String> {
        endpoint
            .strip_prefix("tcp://")
            .and_then(|hp| hp.rsplit_once(':'))
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .filter(|(h, _)| !h.is_empty())
            .ok_or_else(|| {
                format!("--kv-events-config: {field}: {endpoint:?}: must be tcp://HOST:PORT")
            })
    }

    /// `endpoint` with its port offset by `index`.
    fn offset(endpoint: &str, index: usize, field: &str) -> Result<String, String> {
        let (host, port) = Self::endpoint_port(endpoint, field)?;
        let port = u16::try_from(index)
            .ok()
            .and_then(|i| port.checked_add(i))
            .ok_or_else(|| {
                format!("--kv-events-config: {field}: port {port} + {index} passes 65535")
            })?;
        Ok(format!("tcp://{host}:{port}"))
    }

    /// The config of the `index`-th pod of a fleet: the ports offset by `index`.
    pub fn for_pod(&self, index: usize) -> Result<Self, String> {
        Ok(Self {
            endpoint: Self::offset(&self.endpoint, index, "endpoint")?,
            topic: self.topic.clone(),
            replay_endpoint: self
                .replay_endpoint
                .as_deref()
                .map(|r| Self::offset(r, index, "replay_endpoint"))
                .transpose()?,
            buffer_steps: self.buffer_steps,
        })
    }

    /// vLLM's rule: wildcard endpoints are bound, others connected to.
    fn binds(&self) -> bool {
        self.endpoint.contains('*') || self.endpoint.contains("::")
    }

    fn bind_address(endpoint: &str) -> String {
        endpoint.replace("tcp://*:", "tcp://0.0.0.0:")
    }
}

/// Groups a step's pool changes into vLLM's events (see the module docs).
pub fn events_of(changes: &[PoolEvent], block_size: usize) -> Vec<KvEvent> {
    let mut events: Vec<KvEvent> = Vec::new();
    for change in changes {
        match (*change, events.last_mut()) {
            (
                PoolEvent::Stored { hash, parent },
                Some(KvEvent::Stored {
                    blocks, token_ids, ..
                }),
            ) if parent.is_some() && parent == blocks.last().copied() => {
                blocks.push(hash);
                token_ids.extend(stand_in_tokens(hash, block_size));
            }
            (PoolEvent::Removed { hash }, Some(KvEvent::Removed { blocks, .. })) => {
                blocks.push(hash);
            }
            (PoolEvent::Stored { hash, parent }, _) => events.push(KvEvent::Stored {
                blocks: vec![hash],
                parent,
                token_ids: stand_in_tokens(hash, block_size).collect(),
                block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
                lora_id: None,
                medium: Medium::Gpu,
            }),
            (PoolEvent::Removed { hash }, _) => events.push(KvEvent::Removed {
                blocks: vec![hash],
                medium: Medium::Gpu,
            }),
            (PoolEvent::Cleared, _) => events.push(KvEvent::Cleared),
        }
    }
    events
}

fn stand_in_tokens(hash: u64, block_size: usize) -> impl Iterator<Item = u32> {
    (0..block_size as u64).map(move |i| (hash.rotate_left(i as u32) & 0x7fff_ffff) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_changes_become_one_stored_event_a_chain_and_one_removed_event_a_run() {
        let changes = [
            PoolEvent::Stored {
                hash: 1,
                parent: None,
            },
            PoolEvent::Stored {
                hash: 2,
                parent: Some(1),
            },
            PoolEvent::Removed { hash: 9 },
            PoolEvent::Removed { hash: 8 },
            PoolEvent::Stored {
                hash: 3,
                parent: Some(2),
            },
            PoolEvent::Stored {
                hash: 5,
                parent: Some(4),
            },
        ];
        let events = events_of(&changes, 2);
        let blocks: Vec<_> = events
            .iter()
            .map(|e| match e {
                KvEvent::Stored {
                    blocks,
                    parent,
                    token_ids,
                    ..
                } => {
                    assert_eq!(token_ids.len(), blocks.len() * 2);
                    ("stored", blocks.clone(), *parent)
                }
                KvEvent::Removed { blocks, .. } => ("removed", blocks.clone(), None),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            blocks,
            vec![
                ("stored", vec![1, 2], None),
                ("removed", vec![9, 8], None),
                ("stored", vec![3], Some(2)),
                ("stored", vec![5], Some(4)),
            ]
        );
    }

    #[test]
    fn the_flag_reads_as_vllm_reads_it() {
        assert_eq!(KvEventsConfig::from_flag("{}"), Ok(None));
        assert_eq!(
            KvEventsConfig::from_flag(r#"{"enable_kv_cache_events": true}"#),
            Ok(Some(KvEventsConfig {
                endpoint: "tcp://*:5557".into(),
                topic: String::new(),
                replay_endpoint: None,
                buffer_steps: 10_000,
            }))
        );
        let c = KvEventsConfig::from_flag(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:6000", "topic": "kv"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.for_pod(2).unwrap().endpoint, "tcp://127.0.0.1:6002");
        for (json, field) in [
            (
                r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///x"}"#,
                "endpoint",
            ),
            (
                r#"{"enable_kv_cache_events": true, "replay_endpoint": "udp://x"}"#,
                "replay_endpoint",
            ),
            (
                r#"{"enable_kv_cache_events": true, "buffer_steps": 0}"#,
                "buffer_steps",
            ),
            (r#"{"publisher": "zmq"}"#, "publisher"),
            (
                r#"{"enable_kv_cache_events": true, "publisher": "kafka"}"#,
                "publisher",
            ),
            (r#"{"enable_kv_cache_events": true, "nope": 1}"#, "nope"),
        ] {
            let e = KvEventsConfig::from_flag(json).unwrap_err();
            assert!(e.contains(field), "{json}: {e}");
        }
    }
}
