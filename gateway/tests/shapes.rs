//! Warm calls in their traffic's shape, through the whole gateway: a filter's signal of a salted
//! chat prefix (over `POST /v1/signals`) makes the gateway prefill it on a pod (an axum app on
//! loopback answering like vLLM) through the chat endpoint with its messages and salt; the pod
//! rejects it (a 400 that echoes the request, as vLLM's validation errors do), so the entry
//! backs off — not sent again on the next keep-warm periods — and the admin view says so; a
//! snapshot keeps the shape without the salt, and after a restart the entry is not warmed until
//! the traffic's signal brings the salt again. Throughout, the salt appears in no snapshot
//! file, admin JSON, `/metrics` nor log line.
//!
//! Time is the gateway's manual clock; every wait polls a condition with a deadline.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use prewarm_core::warm_shape::WarmShape;
use prewarm_core::wire::{PatternState, PrefillSignal, Signal, SignalBatch};
use prewarm_core::{BlockChain, Endpoint, FingerprintConfig};
use prewarm_gateway::api::router;
use prewarm_gateway::config::{GatewayConfig, PodSpec};
use prewarm_gateway::service::{Clock, Gateway};
use serde_json::{json, Value};
use tower::ServiceExt;

const SALT: &str = "tenant-7-9f2c41d0";
const ADMIN: &str = "admin-secret";
const READ: &str = "read-secret";
const SIGNAL: &str = "signal-secret";
const START_MS: u64 = 1_000_000;
const DECAY_PERIOD_MS: u64 = 60_000;

/// Every log line the gateway writes while the test runs (its thread's subscriber, every level).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The chat requests the pod received (their bodies), and whether it rejects them.
#[derive(Clone, Default)]
struct Pod {
    chat: Arc<Mutex<Vec<Value>>>,
    rejects: Arc<AtomicBool>,
}

/// vLLM's 400 for a request its validation refuses: the message carries the request (`input`).
const ECHOING_400: &str = r#"{"error":{"message":"[{'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, Parameter 'cache_salt' is not supported with this instance of vLLM, which uses engine V0.\", 'input': {'model': 'base', 'max_tokens': 1, 'cache_salt': 'tenant-7-9f2c41d0'}}]","type":"BadRequestError","param":null,"code":400}}"#;

/// vLLM's reply to a chat completion of one token.
const CHAT_REPLY: &str = r#"{"id":"chatcmpl-5b1e","object":"chat.completion","created":1765000000,"model":"base","choices":[{"index":0,"message":{"role":"assistant","content":"An","refusal":null,"tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":812,"total_tokens":813,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#;

async fn vllm_like_pod(pod: Pod) -> String {
    let app = Router::new()
        .route("/health", get(|| async { "" }))
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({"object": "list", "data": [
                    {"id": "base", "object": "model", "root": "base", "parent": null}]}))
            }),
        )
        .route("/metrics", get(|| async { "" }))
        .route(
            "/v1/chat/completions",
            post(move |body: Bytes| {
                let pod = pod.clone();
                async move {
                    let json = serde_json::from_slice(&body).unwrap_or_default();
                    pod.chat.lock().unwrap().push(json);
                    let (status, reply) = if pod.rejects.load(Ordering::SeqCst) {
                        (StatusCode::BAD_REQUEST, ECHOING_400)
                    } else {
                        (StatusCode::OK, CHAT_REPLY)
                    };
                    (status, [(header::CONTENT_TYPE, "application/json")], reply)
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr.to_string()
}

/// A filter's batch signalling a salted chat prefix (a system prompt with tools, cut inside
/// the question) as new.
fn signal_batch() -> (Vec<u8>, usize) {
    let body = json!({"model": "base", "messages": [
        {"role": "system", "content": "You are the billing assistant of the shop. Answer in two sentences. ".repeat(10)},
        {"role": "user", "content": "Why was invoice 2231 charged twice? I paid it on the first of the month by card and got two receipts."}],
        "tools": [{"type": "function", "function": {"name": "lookup_invoice"}}],
        "cache_salt": SALT});
    let r = prewarm_core::parse_request(
        Endpoint::ChatCompletions,
        body.to_string().as_bytes(),
        1 << 20,
    )
    .unwrap();
    let canonical = prewarm_core::canonical_prompt(&r);
    let fp = FingerprintConfig::default();
    let blocks = canonical.len() / fp.block_bytes();
    let text = canonical[..blocks * fp.block_bytes()].to_string();
    let shape = WarmShape::of(&r, text.len()).unwrap();
    assert_eq!(
        shape.as_ref().map(|s| s.messages.len()),
        Some(2),
        "the prefix ends inside the question"
    );
    let chain = BlockChain::of("base", text.as_bytes(), &fp);
    let signal = PrefillSignal {
        model: "base".into(),
        tenant: None,
        endpoint: Endpoint::ChatCompletions,
        prefix_tokens: chain.blocks.len() * fp.block_tokens,
        prefix: chain.blocks,
        prefix_text: text,
        state: PatternState::New,
        priority: 20,
        keep_warm: true,
        shape,
    };
    let batch = SignalBatch::new("filter-1", 0, vec![Signal::Prefill(signal)]);
    (
        serde_json::to_vec(&batch).unwrap(),
        r.extras.tools.unwrap().len(),
    )
}

struct Stack {
    gateway: Arc<Gateway>,
    app: Router,
    clock: Arc<AtomicU64>,
}

impl Stack {
    async fn start(config: &GatewayConfig, clock: &Arc<AtomicU64>) -> Self {
        let gateway = Gateway::with_clock(config.clone(), Clock::Manual(clock.clone()));
        gateway.restore();
        gateway.health_round(true).await;
        let actions = gateway.tick();
        gateway.execute_all(actions).await;
        Stack {
            app: router(gateway.clone()),
            gateway,
            clock: clock.clone(),
        }
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: &str,
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn read(&self, uri: &str) -> String {
        let (status, body) = self.call(Method::GET, uri, READ, Vec::new()).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        body
    }

    async fn prompt(&self) -> Value {
        let v: Value = serde_json::from_str(&self.read("/admin/prompts?k=5").await).unwrap();
        assert_eq!(v["total"], 1, "{v}");
        v["prompts"][0].clone()
    }

    /// Keep-warm periods: the clock moves a second, the core ticks, its actions run.
    async fn seconds(&self, n: u64) {
        for _ in 0..n {
            self.clock.fetch_add(1_000, Ordering::SeqCst);
            let actions = self.gateway.tick();
            self.gateway.execute_all(actions).await;
        }
    }
}

/// Polls `done` until it holds (the signal's prefill runs in the background).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_rejected_chat_prefill_backs_off_and_no_salt_leaves_the_gateway() {
    let logs = Logs::default();
    let writer = logs.clone();
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let pod = Pod::default();
    pod.rejects.store(true, Ordering::SeqCst);
    let address = vllm_like_pod(pod.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.server.admin_token = ADMIN.into();
    config.server.read_token = READ.into();
    config.server.signal_token = SIGNAL.into();
    config.state.dir = dir.path().join("state");
    config.pods.base_model = "base".into();
    config.pods.retries = 0;
    config.pods.static_pods = vec![PodSpec::new("pod-a", &address)];
    let clock = Arc::new(AtomicU64::new(START_MS));
    let stack = Stack::start(&config, &clock).await;
    let (batch, tools_bytes) = signal_batch();

    // The filter's signal: the prefix is prefilled at once, through the chat endpoint.
    let (status, accepted) = stack
        .call(Method::POST, "/v1/signals", SIGNAL, batch.clone())
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    until(
        "the pod rejected the prefill and the pool backed off",
        || {
            let state = stack.gateway.state();
            let pool = state.fleet.pool();
            pool.top(1).first().is_some_and(|v| v.rejections == 1)
        },
    )
    .await;
    {
        let chat = pod.chat.lock().unwrap();
        assert_eq!(chat.len(), 1);
        assert_eq!(
            chat[0]["cache_salt"], SALT,
            "the warm call carries the salt"
        );
        assert_eq!(chat[0]["continue_final_message"], true);
        assert_eq!(chat[0]["messages"][0]["role"], "system");
    }

    // Backing off: the next keep-warm periods do not send it again.
    stack.seconds(5).await;
    assert_eq!(
        pod.chat.lock().unwrap().len(),
        1,
        "not retried while backing off"
    );
    let prompt = stack.prompt().await;
    assert_eq!(prompt["endpoint"], "chat_completions");
    assert_eq!(prompt["rejections"], 1);
    assert_eq!(
        prompt["backoff_until_ms"].as_u64(),
        Some(START_MS + DECAY_PERIOD_MS),
        "{prompt}"
    );
    assert_eq!(prompt["salt_dropped"], false);
    let shape = &prompt["shape"];
    assert_eq!(shape["messages"], 2, "{prompt}");
    assert_eq!(shape["roles"], json!(["system", "user"]));
    assert_eq!(shape["tools_bytes"], tools_bytes);
    assert_eq!(shape["salted"], true);
    let metrics = stack.read("/metrics").await;
    for series in [
        "prewarm_prefill_shapes_total{shape=\"chat\"} 1",
        "prewarm_prefills_total{pod=\"pod-a\",outcome=\"rejected\"} 1",
        "prewarm_policy_decisions_total{policy=\"pool\",decision=\"back_off\"} 1",
        "prewarm_policy_decisions_total{policy=\"pool\",decision=\"backed_off\"}",
    ] {
        assert!(metrics.contains(series), "{series} not in\n{metrics}");
    }
    let pod_detail = stack.read("/admin/pods/pod-a").await;
    assert!(pod_detail.contains("BadRequestError"), "{pod_detail}");

    // Once the back-off is over it is sent again; rejected again, it backs off twice as long.
    stack.seconds(DECAY_PERIOD_MS / 1_000).await;
    assert_eq!(
        pod.chat.lock().unwrap().len(),
        2,
        "sent again after the back-off"
    );
    let prompt = stack.prompt().await;
    assert_eq!(prompt["rejections"], 2);

    // A snapshot keeps the shape, not the salt.
    let (status, written) = stack
        .call(Method::POST, "/admin/snapshot", ADMIN, b"{}".to_vec())
        .await;
    assert_eq!(status, StatusCode::OK, "{written}");
    let snapshot = std::fs::read_to_string(config.state.dir.join("snapshot.json")).unwrap();
    assert!(snapshot.contains(r#""salt_dropped":true"#), "{snapshot}");
    assert!(snapshot.contains("lookup_invoice"), "the tools are kept");
    let admin_json = [
        stack.read("/admin/prompts?k=5").await,
        stack.read("/admin/pods/pod-a").await,
    ];
    let metrics = stack.read("/metrics").await;

    // A restart: the entry is restored without its salt and the pod's warm-up skips it.
    pod.rejects.store(false, Ordering::SeqCst);
    let restarted = Stack::start(&config, &clock).await;
    let prompt = restarted.prompt().await;
    assert_eq!(prompt["salt_dropped"], true);
    assert_eq!(prompt["shape"]["salted"], false);
    restarted.seconds(5).await;
    assert_eq!(pod.chat.lock().unwrap().len(), 2, "warmed without its salt");
    let restarted_metrics = restarted.read("/metrics").await;
    assert!(
        restarted_metrics
            .contains("prewarm_policy_decisions_total{policy=\"pool\",decision=\"salt_dropped\"}"),
        "{restarted_metrics}"
    );

    // The traffic's signal brings the salt back: warmed with it.
    let (status, _) = restarted
        .call(Method::POST, "/v1/signals", SIGNAL, batch)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    until("the salted prefill reached the pod", || {
        pod.chat.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(pod.chat.lock().unwrap()[2]["cache_salt"], SALT);
    let prompt = restarted.prompt().await;
    assert_eq!(prompt["salt_dropped"], false);
    assert_eq!(prompt["shape"]["salted"], true);

    let logs = logs.text();
    assert!(
        logs.contains("prefill failed"),
        "the rejection was logged:\n{logs}"
    );
    let restarted_json = restarted.read("/admin/prompts?k=5").await;
    for (what, text) in [
        ("the snapshot file", snapshot.as_str()),
        ("GET /admin/prompts", admin_json[0].as_str()),
        ("GET /admin/pods/pod-a", admin_json[1].as_str()),
        (
            "GET /admin/prompts after the restart",
            restarted_json.as_str(),
        ),
        ("/metrics", metrics.as_str()),
        ("/metrics after the restart", restarted_metrics.as_str()),
        ("the logs", logs.as_str()),
    ] {
        assert!(!text.contains(SALT), "the salt is in {what}:\n{text}");
    }
}
