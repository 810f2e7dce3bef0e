//! Warm-up spans through the OpenTelemetry SDK's in-memory exporter: a real `Gateway` warms a pod
//! (an axum app on loopback that answers like vLLM and records the trace headers it is sent);
//! the plan's span is the parent of every key it warmed, the attributes are the documented ones,
//! and each prefill the pod received carries the W3C context of its own span.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use opentelemetry::trace::{SpanId, Status};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor, SpanData};
use prewarm_gateway::config::{GatewayConfig, PodSpec};
use prewarm_gateway::policy::fleet::{Action, AdapterCalls, Cause, Prefill};
use prewarm_gateway::policy::hotness::Template;
use prewarm_gateway::policy::{LoraDecision, PrefixKey};
use prewarm_gateway::service::Gateway;
use prewarm_gateway::traces::{self, TracesConfig};
use serde_json::json;
use tracing_subscriber::prelude::*;

/// Warm-up spans exported to memory while it lives (this thread's subscriber).
struct Capture {
    exporter: InMemorySpanExporter,
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    _subscriber: tracing::subscriber::DefaultGuard,
}

impl Capture {
    fn start() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = traces::provider(
            SimpleSpanProcessor::new(exporter.clone()),
            &TracesConfig::default(),
        );
        let _subscriber = tracing::subscriber::set_default(
            tracing_subscriber::registry().with(traces::layer(&provider)),
        );
        Self {
            exporter,
            provider,
            _subscriber,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.provider.force_flush().unwrap();
        self.exporter.get_finished_spans().unwrap()
    }
}

/// The `traceparent` of every completion the pod received, in order.
type Seen = Arc<Mutex<Vec<String>>>;

async fn vllm_like_pod(seen: Seen) -> String {
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
            "/v1/completions",
            post(move |headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let parent = headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    seen.lock().unwrap().push(parent);
                    Json(
                        json!({"id": "c", "object": "text_completion", "model": "base",
                        "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
                    )
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

fn add_template(gateway: &Gateway, text: &str) -> PrefixKey {
    let template: Template =
        serde_json::from_value(json!({"model": "base", "text": text})).unwrap();
    let fingerprint = gateway.config.fingerprint.core();
    let now = gateway.now();
    gateway
        .state()
        .fleet
        .pool_mut()
        .add_template(template, &fingerprint, now)
        .expect("a template of many blocks is accepted")
}

fn attr(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

fn text(span: &SpanData, key: &str) -> String {
    attr(span, key)
        .map(|v| v.as_str().into_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_plans_span_parents_its_keys_and_each_prefill_carries_its_context() {
    let capture = Capture::start();
    let seen: Seen = Arc::default();
    let address = vllm_like_pod(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.state.dir = dir.path().join("state");
    config.pods.base_model = "base".into();
    config.pods.static_pods = vec![PodSpec::new("pod-a", &address)];
    let gateway = Gateway::new(config);
    gateway.restore();
    let keys: Vec<String> = (0..3)
        .map(|i| {
            add_template(
                &gateway,
                &format!("{i:04} template of a system prompt ").repeat(40),
            )
            .to_string()
        })
        .collect();
    gateway.set_ready();
    gateway.health_round(true).await;
    for _ in 0..100 {
        let actions = gateway.tick();
        gateway.execute_all(actions).await;
        gateway.close_finished_plan_spans();
        if gateway.warmup_traces.open_plans().is_empty() {
            break;
        }
    }
    assert!(
        gateway.warmup_traces.open_plans().is_empty(),
        "the warm-up finished and its span closed"
    );
    let spans = capture.spans();
    let plans: Vec<&SpanData> = spans.iter().filter(|s| s.name == "warmup.plan").collect();
    assert_eq!(plans.len(), 1, "{spans:#?}");
    let plan = plans[0];
    assert_eq!(plan.parent_span_id, SpanId::INVALID, "a plan is a root");
    assert_eq!(text(plan, "prewarm.pod"), "pod-a");
    assert_eq!(text(plan, "prewarm.outcome"), "done");
    assert!(attr(plan, "prewarm.first_tier_seconds").is_some());
    let prefills: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "warmup.prefill" && text(s, "prewarm.source") == "plan")
        .collect();
    let warmed: Vec<String> = prefills.iter().map(|s| text(s, "prewarm.key")).collect();
    for key in &keys {
        assert!(warmed.contains(key), "{key} warmed by the plan: {warmed:?}");
    }
    let by_context: HashMap<String, &SpanData> = prefills
        .iter()
        .map(|s| {
            let c = &s.span_context;
            (format!("00-{}-{}-01", c.trace_id(), c.span_id()), *s)
        })
        .collect();
    for span in &prefills {
        assert_eq!(span.parent_span_id, plan.span_context.span_id());
        assert_eq!(span.span_context.trace_id(), plan.span_context.trace_id());
        assert_eq!(text(span, "prewarm.pod"), "pod-a");
        assert_eq!(text(span, "prewarm.model"), "base");
        assert_eq!(text(span, "prewarm.outcome"), "ok");
        assert_eq!(text(span, "prewarm.arms"), "");
        assert!(
            matches!(attr(span, "prewarm.tokens"), Some(Value::I64(t)) if t >= 64),
            "{:?}",
            attr(span, "prewarm.tokens")
        );
        assert!(matches!(attr(span, "prewarm.latency_ms"), Some(Value::F64(ms)) if ms >= 0.0));
        assert_eq!(span.status, Status::Unset);
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), prefills.len(), "one call per prefill span");
    for parent in &seen {
        assert!(
            by_context.contains_key(parent),
            "the pod's traceparent {parent:?} is a prefill span's own context"
        );
    }
}

#[tokio::test]
async fn a_failed_key_is_an_error_span_and_no_context_is_sent_without_a_span() {
    let capture = Capture::start();
    assert!(
        traces::trace_headers().is_empty(),
        "outside a span no trace context is sent"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.state.dir = dir.path().join("state");
    config.pods.retries = 0;
    // Port 9 (discard) on loopback: nothing listens.
    config.pods.static_pods = vec![PodSpec::new("pod-dead", "127.0.0.1:9")];
    let gateway = Gateway::new(config);
    gateway.restore();
    let text = "0001 a prompt kept warm on a pod that died ".repeat(40);
    let key = add_template(&gateway, &text);
    let prefill = Prefill {
        pod: "pod-dead".into(),
        epoch: 0,
        key,
        model: "base".into(),
        endpoint: prewarm_core::Endpoint::Completions,
        text: text.into(),
        shape: None,
        shards: Vec::new(),
        cause: Cause::KeepWarm,
    };
    let touch = AdapterCalls {
        pod: "pod-dead".into(),
        epoch: 0,
        decisions: vec![LoraDecision::Touch("tenant-a".into())],
        cause: Cause::Pin,
    };
    gateway
        .execute_all(vec![Action::Prefill(prefill), Action::Adapters(touch)])
        .await;
    let spans = capture.spans();
    let span = spans
        .iter()
        .find(|s| s.name == "warmup.prefill")
        .expect("the prefill has a span");
    assert_eq!(
        span.parent_span_id,
        SpanId::INVALID,
        "not a plan's key: a root"
    );
    assert_eq!(text_of(span, "prewarm.source"), "keep_warm");
    assert_eq!(text_of(span, "prewarm.outcome"), "unreachable");
    assert!(matches!(span.status, Status::Error { .. }));
    let adapter = spans
        .iter()
        .find(|s| s.name == "warmup.adapter")
        .expect("the adapter call has a span");
    assert_eq!(adapter.parent_span_id, SpanId::INVALID);
    assert_eq!(text_of(adapter, "prewarm.source"), "pin");
    assert_eq!(text_of(adapter, "prewarm.adapter"), "tenant-a");
    assert_eq!(text_of(adapter, "prewarm.call"), "touch");
    assert_ne!(text_of(adapter, "prewarm.outcome"), "ok");
    assert!(matches!(adapter.status, Status::Error { .. }));
}

fn text_of(span: &SpanData, key: &str) -> String {
    text(span, key)
}
