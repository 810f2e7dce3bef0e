//! KV-cache events the gateway reads by connecting to a pod's publisher (`[[pods.static]]
//! kv_events`: the engine binds a wildcard endpoint, here a ZeroMQ PUB bound on loopback): the
//! batches fill the pod's ledger, a sequence that goes back is a new process, a message that
//! does not decode is counted and the next one read, and removing the pod ends its
//! subscription. A real `Gateway`; every wait polls a condition with a deadline.

use std::time::Duration;

use axum::body::Bytes;
use prewarm_core::kv_events::{encode_batch, encode_sequence, KvEvent, KvEventBatch, Medium};
use prewarm_gateway::config::{GatewayConfig, PodSpec};
use prewarm_gateway::policy::fleet::engine_blocks::EngineBlocksView;
use prewarm_gateway::service::Gateway;
use zeromq::{Socket, SocketSend, ZmqMessage};

fn batch(blocks: &[u64]) -> Vec<u8> {
    encode_batch(&KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored {
            blocks: blocks.to_vec(),
            parent: None,
            token_ids: vec![0; blocks.len() * 16],
            block_size: 16,
            lora_id: None,
            medium: Medium::Gpu,
        }],
        data_parallel_rank: None,
    })
}

fn message(seq: i64, payload: Vec<u8>) -> ZmqMessage {
    let frames: Vec<Bytes> = vec![
        Bytes::new(),
        encode_sequence(seq).to_vec().into(),
        payload.into(),
    ];
    ZmqMessage::try_from(frames).unwrap()
}

fn ledger(gateway: &Gateway) -> Option<EngineBlocksView> {
    gateway.state().fleet.pod("p")?.engine_blocks.view()
}

/// Sends `make()` every 20 ms until `done` holds (at most 10 s): the subscription races the
/// first sends, and a PUB drops what no subscriber took.
async fn send_until(
    publisher: &mut zeromq::PubSocket,
    gateway: &Gateway,
    mut make: impl FnMut() -> ZmqMessage,
    done: impl Fn(&Gateway) -> bool,
) {
    for _ in 0..500 {
        publisher.send(make()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        if done(gateway) {
            return;
        }
    }
    panic!("not done after 10 s: {:?}", ledger(gateway));
}

#[tokio::test]
async fn a_publisher_the_gateway_connects_to_fills_the_pods_ledger() {
    let mut publisher = zeromq::PubSocket::new();
    let bound = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let zeromq::Endpoint::Tcp(_, port) = bound else {
        panic!("{bound:?}")
    };
    let mut config = GatewayConfig::default();
    let mut spec = PodSpec::new("p", "127.0.0.1:9");
    spec.kv_events = Some(format!("127.0.0.1:{port}"));
    config.pods.static_pods = vec![spec];
    let gateway = Gateway::new(config);
    gateway.ensure_kv_subscriptions();

    let mut seq = 0;
    send_until(
        &mut publisher,
        &gateway,
        || {
            seq += 1;
            message(seq, batch(&[seq as u64]))
        },
        |g| ledger(g).is_some(),
    )
    .await;
    let first = ledger(&gateway).unwrap();
    assert!(
        first.cached_blocks >= 1 && first.counts.restarts == 0,
        "{first:?}"
    );
    assert!(
        !first.complete,
        "the first batch read was not the process's first"
    );

    // garbage is counted, the next batch read; then a new process (sequence 0)
    publisher
        .send(message(seq + 1, vec![0xc1, 0xff]))
        .await
        .unwrap();
    send_until(
        &mut publisher,
        &gateway,
        || message(0, batch(&[1_000])),
        |g| ledger(g).is_some_and(|l| l.counts.restarts == 1),
    )
    .await;
    let after = ledger(&gateway).unwrap();
    assert!(after.complete, "a new process's first batch: {after:?}");
    assert_eq!(after.cached_blocks, 1, "{after:?}");
    let errors = gateway.state().pods["p"].errors.clone();
    assert!(
        errors.iter().any(|e| e.contains("kv event")),
        "the undecodable message noted: {errors:?}"
    );

    // removing the pod ends the subscription: the publisher's peer goes away
    let mut events = publisher.monitor();
    gateway.remove_pod("p").unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(zeromq::SocketEvent::Disconnected(_)) =
                futures::StreamExt::next(&mut events).await
            {
                return;
            }
        }
    })
    .await;
    assert!(gone.is_ok(), "the gateway's subscriber disconnected");
}
