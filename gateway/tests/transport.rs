//! The pod transport against a real HTTP server on loopback (an axum app whose behaviour each
//! test scripts): retries of 5xx with backoff, no retry of non-idempotent calls that reached the
//! pod, the per-pod concurrency limit, timeouts, the vLLM client's reply decoding end to end, and
//! prefills in their traffic's shape (a chat prefix through the chat endpoint, a rejection
//! reported without the salt).

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

/// What a scripted pod was sent: each POST's path and JSON body.
type Sent = Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>;

/// A pod that records every POST and answers with `status` and `reply`.
async fn recording_pod(sent: Sent, status: StatusCode, reply: &'static str) -> String {
    serve(
        Router::new().fallback(move |uri: axum::http::Uri, body: axum::body::Bytes| {
            let sent = sent.clone();
            async move {
                let json = serde_json::from_slice(&body).unwrap_or_default();
                sent.lock().unwrap().push((uri.path().to_string(), json));
                (
                    status,
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    reply,
                )
            }
        }),
    )
    .await
}

const SALT: &str = "tenant-7-9f2c41d0";
const SYSTEM: &str = "You are the billing assistant of the shop. Answer in two sentences. ";
const TOOLS: &str = r#"[{"type":"function","function":{"name":"lookup_invoice","parameters":{"type":"object","properties":{"id":{"type":"string"}}}}}]"#;
/// vLLM's reply to a chat completion (0.10, `max_tokens: 1`).
const CHAT_REPLY: &str = r#"{"id":"chatcmpl-5b1e","object":"chat.completion","created":1765000000,"model":"base","choices":[{"index":0,"message":{"role":"assistant","content":"An","refusal":null,"tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":812,"total_tokens":813,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#;

/// A chat prefix as the filter signals it: the canonical text of a system prompt and a
/// question, cut inside the question, and its traffic's shape.
fn chat_prefix() -> (
    prewarm_core::InferenceRequest,
    String,
    prewarm_core::warm_shape::WarmShape,
) {
    let body = serde_json::json!({"model": "base", "messages": [
        {"role": "system", "content": SYSTEM.repeat(12)},
        {"role": "user", "content": [{"type": "text", "text": "Why was invoice 2231 charged twice?"}]}],
        "tools": serde_json::from_str::<serde_json::Value>(TOOLS).unwrap(),
        "chat_template_kwargs": {"enable_thinking": false},
        "cache_salt": SALT});
    let r = prewarm_core::parse_request(
        prewarm_core::Endpoint::ChatCompletions,
        body.to_string().as_bytes(),
        1 << 20,
    )
    .unwrap();
    let canonical = prewarm_core::canonical_prompt(&r);
    let text = canonical[..canonical.len() - 8].to_string();
    let shape = prewarm_core::warm_shape::WarmShape::of(&r, text.len())
        .unwrap()
        .unwrap();
    (r, text, shape)
}

fn chat_prefill(model: &str) -> prewarm_gateway::engine::PrefillRequest {
    let (_, text, shape) = chat_prefix();
    prewarm_gateway::engine::PrefillRequest {
        model: model.into(),
        endpoint: prewarm_core::Endpoint::ChatCompletions,
        prefix_text: text.into(),
        shape: Some(prewarm_gateway::policy::hotness::SharedShape::new(shape)),
    }
}

/// The prefill of a chat prefix is the chat request its traffic's requests start with: the
/// prefix's messages (the last, cut one left open), the same tools, kwargs and salt.
#[tokio::test]
async fn a_chat_prefix_is_prefilled_through_the_chat_endpoint_with_its_messages() {
    use prewarm_gateway::engine::sglang::SglangEngine;
    let (request, _, _) = chat_prefix();
    let prewarm_core::request::Prompt::Chat(messages) = &request.prompt else {
        panic!("chat")
    };
    let sent: Sent = Arc::default();
    let addr = recording_pod(sent.clone(), StatusCode::OK, CHAT_REPLY).await;
    let prefill = chat_prefill("base");
    assert_eq!(prefill.form().label(), "chat");
    VllmEngine::new(pod(&addr, 0, 4, 2000))
        .prefill(&prefill)
        .await
        .unwrap();
    SglangEngine::new(pod(&addr, 0, 4, 2000), "llama")
        .prefill(&chat_prefill("sql-lora"))
        .await
        .unwrap();
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    for ((path, body), model) in sent.iter().zip(["base", "llama:sql-lora"]) {
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(body["model"], model);
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["continue_final_message"], true);
        assert_eq!(body["add_generation_prompt"], false);
        assert!(body.get("prompt").is_none(), "{body}");
        let sent_messages = body["messages"].as_array().unwrap();
        assert_eq!(sent_messages.len(), 2);
        assert_eq!(sent_messages[0]["role"], "system");
        assert_eq!(sent_messages[0]["content"], messages[0].text.as_str());
        assert_eq!(sent_messages[1]["role"], "user");
        let cut = sent_messages[1]["content"][0]["text"].as_str().unwrap();
        assert!(
            messages[1].text.starts_with(cut) && cut.len() < messages[1].text.len(),
            "{cut:?}"
        );
        assert_eq!(
            body["tools"],
            serde_json::from_str::<serde_json::Value>(TOOLS).unwrap()
        );
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(body["cache_salt"], SALT);
    }
}

/// A 400 whose message echoes the request (vLLM's validation errors carry their `input`) is
/// reported without the salt, so it can be logged and shown.
#[tokio::test]
async fn a_rejection_that_echoes_the_request_is_reported_without_its_salt() {
    const ECHO: &str = r#"{"error":{"message":"[{'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, Parameter 'cache_salt' is not supported with this instance of vLLM, which uses engine V0.\", 'input': {'model': 'base', 'max_tokens': 1, 'cache_salt': 'tenant-7-9f2c41d0'}}]","type":"BadRequestError","param":null,"code":400}}"#;
    assert!(ECHO.contains(SALT));
    let sent: Sent = Arc::default();
    let addr = recording_pod(sent.clone(), StatusCode::BAD_REQUEST, ECHO).await;
    let e = VllmEngine::new(pod(&addr, 3, 4, 2000))
        .prefill(&chat_prefill("base"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, EngineError::Rejected { status: 400, kind, .. } if kind == "BadRequestError"),
        "{e}"
    );
    assert!(!e.to_string().contains(SALT), "{e}");
    assert!(
        e.to_string().contains("cache_salt"),
        "the rest is kept: {e}"
    );
    assert_eq!(sent.lock().unwrap().len(), 1, "a 4xx is not retried");
}
