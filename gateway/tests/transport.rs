//! The pod transport against a real HTTP server on loopback (an axum app whose behaviour each
//! test scripts): retries of 5xx with backoff, no retry of non-idempotent calls that reached the
//! pod, the per-pod concurrency limit, timeouts, and the vLLM client's reply decoding end to end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use prewarm_gateway::engine::vllm::VllmEngine;
use prewarm_gateway::engine::{
    AdapterLoad, AdapterOutcome, Engine, EngineError, HttpPod, RetryPolicy,
};

#[derive(Default)]
struct Counters {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr.to_string()
}

fn pod(addr: &str, retries: u32, max_in_flight: usize, timeout_ms: u64) -> HttpPod {
    HttpPod::new(
        "pod-t",
        addr,
        HttpPod::client(
            Duration::from_millis(500),
            Duration::from_millis(timeout_ms),
        ),
        max_in_flight,
        RetryPolicy {
            retries,
            backoff: Duration::from_millis(5),
        },
    )
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let app = Router::new().route(
        "/health",
        get(move || {
            let c = c.clone();
            async move {
                if c.calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let addr = serve(app).await;
    let reply = pod(&addr, 2, 4, 2000).get("/health").await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(counters.calls.load(Ordering::SeqCst), 3);
    let reply = pod(&addr, 0, 4, 2000).get("/health").await.unwrap();
    assert_eq!(reply.status, 200, "the fourth call succeeds at once");
}

#[tokio::test]
async fn loads_that_reached_the_pod_are_not_retried() {
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let app = Router::new().route(
        "/v1/load_lora_adapter",
        post(move || {
            let c = c.clone();
            async move {
                c.calls.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    r#"{"object":"error","message":"rank 64 above max_lora_rank 16","type":"InternalServerError","code":500}"#,
                )
            }
        }),
    );
    let addr = serve(app).await;
    let engine = VllmEngine::new(pod(&addr, 3, 4, 2000));
    let load = AdapterLoad {
        name: "big".into(),
        path: "/x".into(),
    };
    match engine.load_adapter(&load).await {
        Err(EngineError::Rejected {
            status,
            kind,
            message,
            ..
        }) => {
            assert_eq!((status, kind.as_str()), (500, "InternalServerError"));
            assert!(message.contains("max_lora_rank"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(counters.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn plain_text_success_and_already_loaded_are_successes() {
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let app = Router::new().route(
        "/v1/load_lora_adapter",
        post(move || {
            let c = c.clone();
            async move {
                if c.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    (StatusCode::OK, "Success: LoRA adapter 'a' added successfully.")
                } else {
                    (
                        StatusCode::BAD_REQUEST,
                        r#"{"error":{"message":"The lora adapter 'a' has already been loaded.","type":"InvalidUserInput","param":null,"code":400}}"#,
                    )
                }
            }
        }),
    );
    let addr = serve(app).await;
    let engine = VllmEngine::new(pod(&addr, 0, 4, 2000));
    let load = AdapterLoad {
        name: "a".into(),
        path: "/a".into(),
    };
    assert_eq!(engine.load_adapter(&load).await, Ok(AdapterOutcome::Done));
    assert_eq!(
        engine.load_adapter(&load).await,
        Ok(AdapterOutcome::AlreadyThere)
    );
}

#[tokio::test]
async fn in_flight_requests_per_pod_are_bounded() {
    let counters = Arc::new(Counters::default());
    let c = counters.clone();
    let app = Router::new().route(
        "/health",
        get(move || {
            let c = c.clone();
            async move {
                let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                c.max_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                c.in_flight.fetch_sub(1, Ordering::SeqCst);
                StatusCode::OK
            }
        }),
    );
    let addr = serve(app).await;
    let p = pod(&addr, 0, 2, 2000);
    let calls = (0..8).map(|_| p.get("/health"));
    let replies = futures::future::join_all(calls).await;
    assert!(replies
        .iter()
        .all(|r| r.as_ref().map(|r| r.status) == Ok(200)));
    assert_eq!(counters.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn slow_pods_time_out_and_dead_ones_are_unreachable() {
    let app = Router::new().route(
        "/metrics",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            "vllm:num_requests_waiting 1\n"
        }),
    );
    let addr = serve(app).await;
    let engine = VllmEngine::new(pod(&addr, 0, 1, 100));
    assert!(matches!(
        engine.load().await,
        Err(EngineError::Timeout { .. })
    ));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    let engine = VllmEngine::new(pod(&dead, 1, 1, 100));
    let e = engine.health().await.unwrap_err();
    assert!(matches!(e, EngineError::Unreachable { .. }), "{e}");
    assert!(e.retryable());
}

/// A pod answering 302 to a canary: the reply is the 302, the canary is never called.
#[tokio::test]
async fn redirects_from_a_pod_are_not_followed() {
    let canary_hits = Arc::new(AtomicUsize::new(0));
    let hits = canary_hits.clone();
    let canary = serve(Router::new().fallback(move || {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::SeqCst);
            "stolen"
        }
    }))
    .await;
    let target = format!("http://{canary}/stolen");
    let app = Router::new().fallback(move || {
        let target = target.clone();
        async move {
            (
                StatusCode::FOUND,
                [(axum::http::header::LOCATION, target)],
                "",
            )
        }
    });
    let addr = serve(app).await;
    let reply = pod(&addr, 0, 4, 2000).get("/metrics").await.unwrap();
    assert_eq!(reply.status, 302);
    assert_eq!(canary_hits.load(Ordering::SeqCst), 0);
    let engine = VllmEngine::new(pod(&addr, 0, 4, 2000));
    assert!(
        engine.health().await.is_err(),
        "a redirect is not a healthy pod"
    );
    assert_eq!(canary_hits.load(Ordering::SeqCst), 0);
}

/// A pod streaming an endless /metrics (no length announced) or announcing a huge one: the read
/// stops at the limit with a bad-reply error naming it.
#[tokio::test]
async fn pod_replies_are_read_up_to_the_limit() {
    use prewarm_gateway::engine::http::MAX_REPLY_BYTES;
    let sent = Arc::new(AtomicUsize::new(0));
    let s = sent.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let s = s.clone();
                async move {
                    let chunk = axum::body::Bytes::from(vec![b'#'; 64 * 1024]);
                    let stream = futures::stream::iter(0..16 * 1024).map(move |_| {
                        s.fetch_add(chunk.len(), Ordering::SeqCst);
                        Ok::<_, std::io::Error>(chunk.clone())
                    });
                    axum::body::Body::from_stream(stream)
                }
            }),
        )
        .route(
            "/v1/models",
            get(|| async { vec![b' '; MAX_REPLY_BYTES + 1] }),
        );
    let addr = serve(app).await;
    let p = pod(&addr, 0, 4, 20_000);
    let e = p.get("/metrics").await.unwrap_err();
    assert!(
        matches!(&e, EngineError::BadReply { message, .. } if message.contains("larger than")),
        "{e}"
    );
    assert!(
        sent.load(Ordering::SeqCst) < 1024 * 1024 * 1024,
        "stopped before the end"
    );
    let e = p.get("/v1/models").await.unwrap_err();
    assert!(matches!(e, EngineError::BadReply { .. }), "{e}");
}
