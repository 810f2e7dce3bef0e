//! In-process HTTP tests of every endpoint: the router with a real `Gateway` (no background loops,
//! pods at unreachable addresses), driven through `tower::ServiceExt::oneshot`. Each endpoint's
//! auth (401), body limit (413) and malformed input (400 naming the field) is asserted.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use prewarm_gateway::api::router;
use prewarm_gateway::config::{GatewayConfig, PodSpec};
use prewarm_gateway::service::Gateway;
use serde_json::{json, Value};
use tower::ServiceExt;

const TOKEN: &str = "admin-secret";
const READ: &str = "read-secret";
const SIGNAL: &str = "signal-secret";

struct Fixture {
    app: Router,
    gateway: Arc<Gateway>,
    _dir: tempfile::TempDir,
}

fn fixture_with(edit: impl FnOnce(&mut GatewayConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.server.admin_token = TOKEN.into();
    config.server.read_token = READ.into();
    config.server.signal_token = SIGNAL.into();
    config.server.max_body_bytes = 4096;
    config.state.dir = dir.path().join("state");
    config.pods.static_pods = vec![PodSpec::new("pod-a", "127.0.0.1:9")];
    edit(&mut config);
    let gateway = Gateway::new(config);
    gateway.restore();
    Fixture {
        app: router(gateway.clone()),
        gateway,
        _dir: dir,
    }
}

fn fixture() -> Fixture {
    fixture_with(|_| {})
}

async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(body.map(Body::from).unwrap_or_else(Body::empty))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value, headers)
}

async fn admin(app: &Router, method: Method, uri: &str, body: Value) -> (StatusCode, Value) {
    let (s, v, _) = call(
        app,
        method,
        uri,
        Some(TOKEN),
        Some(body.to_string().into_bytes()),
    )
    .await;
    (s, v)
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    let (s, v, _) = call(app, Method::GET, uri, Some(READ), None).await;
    (s, v)
}

fn error_of(v: &Value) -> &str {
    v["error"].as_str().unwrap_or("")
}

fn template(i: usize) -> Value {
    json!({"model": "base", "text": format!("{i:04} ").repeat(100)})
}

#[tokio::test]
async fn probes_and_metrics() {
    let f = fixture();
    assert_eq!(get(&f.app, "/healthz").await.0, StatusCode::OK);
    assert_eq!(get(&f.app, "/readyz").await.0, StatusCode::OK);
    let (s, body) = get(&f.app, "/metrics").await;
    assert_eq!(s, StatusCode::OK);
    assert!(body
        .as_str()
        .unwrap()
        .contains("prewarm_routing_table_generation 1"));
    let (s, v) = get(&f.app, "/v1/pods/pod-a/ready").await;
    assert_eq!(
        (s, v["ready"].as_bool()),
        (StatusCode::SERVICE_UNAVAILABLE, Some(false))
    );
    assert_eq!(
        get(&f.app, "/v1/pods/nope/ready").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn readyz_is_503_before_the_snapshot_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.state.dir = dir.path().to_path_buf();
    let app = router(Gateway::new(config));
    assert_eq!(
        get(&app, "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn routing_answers_304_for_the_current_generation() {
    let f = fixture();
    let (s, table, headers) = call(&f.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    assert_eq!(s, StatusCode::OK);
    let generation = table["generation"].as_u64().unwrap();
    let etag = format!("\"{generation}\"");
    assert_eq!(headers[header::ETAG].to_str().unwrap(), etag);
    assert_eq!(table["block_tokens"], 64);
    let req = Request::get("/v1/routing")
        .header(header::AUTHORIZATION, format!("Bearer {SIGNAL}"))
        .header(header::IF_NONE_MATCH, &etag)
        .body(Body::empty())
        .unwrap();
    let resp = f.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    let req = Request::get("/v1/routing")
        .header(header::AUTHORIZATION, format!("Bearer {SIGNAL}"))
        .header(header::IF_NONE_MATCH, "\"999\"")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        f.app.clone().oneshot(req).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn signals_are_ingested_and_bad_batches_refused() {
    let f = fixture();
    let text = "x".repeat(300);
    let chain = prewarm_core::BlockChain::of("base", text.as_bytes(), &Default::default());
    let batch = json!({"version": "1.0", "source": "t", "signals": [
        {"kind": "prefill", "model": "base", "endpoint": "completions",
         "prefix": chain.blocks, "prefix_tokens": 64, "prefix_text": &text[..256],
         "state": "new", "priority": 5},
        {"kind": "pin", "adapter": "unknown", "rate_per_minute": 6.0, "priority": 1}]});
    let (s, v, _) = call(
        &f.app,
        Method::POST,
        "/v1/signals",
        Some(SIGNAL),
        Some(batch.to_string().into_bytes()),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    assert_eq!(
        (v["prefills"].as_u64(), v["pins"].as_u64()),
        (Some(1), Some(1))
    );
    let (_, prompts) = get(&f.app, "/admin/prompts?k=5").await;
    assert_eq!(prompts["total"], 1);
    assert_eq!(prompts["prompts"][0]["origin"], "dynamic");
    let (s, v, _) = call(
        &f.app,
        Method::POST,
        "/v1/signals",
        Some(SIGNAL),
        Some(br#"{"version":"2.0","signals":[]}"#.to_vec()),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("version:"), "{v}");
    let (s, v, _) = call(
        &f.app,
        Method::POST,
        "/v1/signals",
        Some(SIGNAL),
        Some(b"{not json".to_vec()),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("body:"), "{v}");
    let seen = json!({"model": "m", "key": "00".repeat(32), "hits": 1});
    let many = json!({"version": "1.0", "source": "t", "signals": [],
        "embeddings": vec![seen; prewarm_core::wire::MAX_EMBEDDINGS_PER_BATCH + 1]});
    let (s, v, _) = call(
        &f.app,
        Method::POST,
        "/v1/signals",
        Some(SIGNAL),
        Some(many.to_string().into_bytes()),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("embeddings: 1025:"), "{v}");
    let metrics = get(&f.app, "/metrics").await.1;
    assert!(metrics
        .as_str()
        .unwrap()
        .contains("prewarm_signals_ingested_total{kind=\"prefill\"} 1"));
}

#[tokio::test]
async fn signal_token_and_signal_body_limit() {
    let f = fixture_with(|c| {
        c.server.signal_token = "sig".into();
        c.server.max_signal_body_bytes = 1024;
    });
    let empty = br#"{"version":"1.0","signals":[]}"#.to_vec();
    assert_eq!(
        call(
            &f.app,
            Method::POST,
            "/v1/signals",
            None,
            Some(empty.clone())
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&f.app, Method::GET, "/v1/routing", Some("bad"), None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(
            &f.app,
            Method::POST,
            "/v1/signals",
            Some("sig"),
            Some(empty)
        )
        .await
        .0,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        call(&f.app, Method::GET, "/v1/routing", Some("sig"), None)
            .await
            .0,
        StatusCode::OK
    );
    let big = vec![b' '; 2048];
    assert_eq!(
        call(&f.app, Method::POST, "/v1/signals", Some("sig"), Some(big))
            .await
            .0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[tokio::test]
async fn every_mutating_admin_endpoint_requires_the_token() {
    let f = fixture();
    let mutating = [
        (Method::POST, "/admin/pods"),
        (Method::DELETE, "/admin/pods/pod-a"),
        (Method::POST, "/admin/pods/pod-a/warmup"),
        (Method::POST, "/admin/adapters"),
        (Method::DELETE, "/admin/adapters/a"),
        (Method::POST, "/admin/adapters/a/pin"),
        (Method::POST, "/admin/adapters/a/unpin"),
        (Method::POST, "/admin/adapters/a/rollback"),
        (Method::POST, "/admin/prompts"),
        (
            Method::DELETE,
            "/admin/prompts/0000000000000000-0000000000000000",
        ),
        (Method::POST, "/admin/snapshot"),
    ];
    for (method, uri) in mutating {
        for token in [None, Some("wrong")] {
            let (s, _, h) = call(&f.app, method.clone(), uri, token, Some(b"{}".to_vec())).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {uri} {token:?}");
            assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
        }
    }
    // Nothing changed.
    assert_eq!(
        get(&f.app, "/admin/pods").await.1["pods"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Every admin read needs the read (or admin) token; the read token writes nothing; probes,
/// `/metrics` and the dashboard's assets stay open.
#[tokio::test]
async fn admin_reads_require_the_read_token() {
    let f = fixture();
    let reads = [
        "/admin/pods",
        "/admin/pods/pod-a",
        "/admin/pods/pod-a/warmup",
        "/admin/pods/pod-a/plan",
        "/admin/adapters",
        "/admin/adapters/heatmap",
        "/admin/adapters/a",
        "/admin/prompts?k=1000",
    ];
    for uri in reads {
        for token in [None, Some("wrong"), Some(SIGNAL)] {
            let (s, _, h) = call(&f.app, Method::GET, uri, token, None).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "GET {uri} {token:?}");
            assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer");
        }
        for token in [READ, TOKEN] {
            let (s, _, _) = call(&f.app, Method::GET, uri, Some(token), None).await;
            assert_ne!(s, StatusCode::UNAUTHORIZED, "GET {uri} with {token}");
        }
    }
    let (s, _, _) = call(
        &f.app,
        Method::POST,
        "/admin/prompts",
        Some(READ),
        Some(template(1).to_string().into_bytes()),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    for open in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/pods/pod-a/ready",
        "/",
        "/dashboard/app.js",
    ] {
        let (s, _, _) = call(&f.app, Method::GET, open, None, None).await;
        assert!(s != StatusCode::UNAUTHORIZED, "{open}: {s}");
    }
}

/// With no signal or read token configured, the filters' routes and admin reads are refused:
/// nothing is open by default.
#[tokio::test]
async fn unconfigured_tokens_refuse_instead_of_opening() {
    let f = fixture_with(|c| {
        c.server.signal_token.clear();
        c.server.read_token.clear();
    });
    let empty = br#"{"version":"1.0","signals":[]}"#.to_vec();
    for token in [None, Some("")] {
        let (s, _, _) = call(
            &f.app,
            Method::POST,
            "/v1/signals",
            token,
            Some(empty.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, _, _) = call(&f.app, Method::GET, "/v1/routing", token, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, _, _) = call(&f.app, Method::GET, "/admin/pods", token, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (s, _, _) = call(&f.app, Method::GET, "/admin/pods", Some(TOKEN), None).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn admin_bodies_over_the_limit_get_413() {
    let f = fixture();
    let big = json!({"model": "base", "text": "y".repeat(8000)})
        .to_string()
        .into_bytes();
    for uri in ["/admin/prompts", "/admin/pods", "/admin/adapters"] {
        let (s, _, _) = call(&f.app, Method::POST, uri, Some(TOKEN), Some(big.clone())).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{uri}");
    }
}

#[tokio::test]
async fn pods_add_list_detail_remove() {
    let f = fixture();
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/pods",
        json!({"id": "pod-b", "address": "127.0.0.1:10", "max_loras": 4}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/pods",
        json!({"id": "pod-b", "address": "127.0.0.1:10"}),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/pods",
        json!({"id": "pod-c", "address": "nope"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("address:"), "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/pods",
        json!({"id": "pod-c", "address": "h:1", "max_loras": "two"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("max_loras:"), "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/pods",
        json!({"id": "pod-c", "address": "h:1", "colour": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("colour"), "{v}");
    let (_, list) = get(&f.app, "/admin/pods").await;
    let ids: Vec<&str> = list["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["pod-a", "pod-b"]);
    assert_eq!(list["pods"][1]["health"], "unknown");
    assert_eq!(list["pods"][1]["routable"], false);
    let (s, d) = get(&f.app, "/admin/pods/pod-b").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(d["spec"]["max_loras"], 4);
    assert!(d["warmup"].is_null());
    assert_eq!(get(&f.app, "/admin/pods/zz").await.0, StatusCode::NOT_FOUND);
    let (s, w) = get(&f.app, "/admin/pods/pod-b/warmup").await;
    assert_eq!((s, w["warmup"].is_null()), (StatusCode::OK, true));
    let (s, _) = admin(&f.app, Method::POST, "/admin/pods/pod-b/warmup", json!({})).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a pod that is not up cannot be warmed"
    );
    let (s, _) = admin(&f.app, Method::DELETE, "/admin/pods/pod-b", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        admin(&f.app, Method::DELETE, "/admin/pods/pod-b", json!({}))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn plan_of_a_pod() {
    let f = fixture();
    for i in 0..5 {
        assert_eq!(
            admin(&f.app, Method::POST, "/admin/prompts", template(i))
                .await
                .0,
            StatusCode::CREATED
        );
    }
    let (s, plan) = get(&f.app, "/admin/pods/pod-a/plan").await;
    assert_eq!(s, StatusCode::OK);
    // The only candidate wins every key.
    assert_eq!(plan["first_tier"].as_array().unwrap().len(), 5);
    assert_eq!(plan["considered"], 5);
    assert_eq!(
        get(&f.app, "/admin/pods/zz/plan").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn prompts_top_add_remove() {
    let f = fixture();
    let (s, v) = admin(&f.app, Method::POST, "/admin/prompts", template(1)).await;
    assert_eq!(s, StatusCode::CREATED);
    let key = v["key"].as_str().unwrap().to_string();
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/prompts",
        json!({"model": "base", "text": "short"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("text:"), "{v}");
    let (s, v) = admin(&f.app, Method::POST, "/admin/prompts", json!({"text": "x"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("model"), "{v}");
    let (_, top) = get(&f.app, "/admin/prompts?k=1").await;
    assert_eq!(top["prompts"][0]["key"], key.as_str());
    assert_eq!(top["prompts"][0]["origin"], "static");
    assert_eq!(top["templates"], 1);
    let (s, v) = get(&f.app, "/admin/prompts?k=0").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("k:"), "{v}");
    let (s, v) = admin(
        &f.app,
        Method::DELETE,
        "/admin/prompts/not-a-key",
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("prefix key:"), "{v}");
    assert_eq!(
        admin(
            &f.app,
            Method::DELETE,
            &format!("/admin/prompts/{key}"),
            json!({})
        )
        .await
        .0,
        StatusCode::OK
    );
    assert_eq!(
        admin(
            &f.app,
            Method::DELETE,
            &format!("/admin/prompts/{key}"),
            json!({})
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
}

fn adapter_dir(root: &std::path::Path, name: &str) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        br#"{"r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}"#,
    )
    .unwrap();
    std::fs::write(dir.join("adapter_model.safetensors"), name.as_bytes()).unwrap();
    dir.to_str().unwrap().to_string()
}

#[tokio::test]
async fn adapters_register_list_pin_rollback_heatmap_remove() {
    let f = fixture();
    let root = tempfile::tempdir().unwrap();
    let path = adapter_dir(root.path(), "sql");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/adapters",
        json!({"name": "sql", "path": path, "tier": "gold", "tenant": "acme", "version": "v1"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let current = &v["adapter"]["current"];
    assert_eq!(
        (current["rank"].as_u64(), current["alpha"].as_f64()),
        (Some(16), Some(32.0))
    );
    assert_eq!(current["target_modules"], json!(["q_proj"]));
    assert_eq!(current["manifest"]["files"].as_array().unwrap().len(), 2);
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/adapters",
        json!({"name": "sql", "path": path, "version": "v2"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"]["previous_version"], "v1");
    assert_eq!(v["rollout"]["consistent"], true);
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/adapters/sql/rollback",
        json!({"version": "v1"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["registered"]["version"], "v1");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/adapters/sql/rollback",
        json!({"version": "v9"}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("version:"), "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/adapters/sql/rollback",
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("version"), "{v}");
    for (body, field) in [
        (json!({"name": "bad name", "path": "/x"}), "name:"),
        (json!({"name": "ok", "path": ""}), "path:"),
        (
            json!({"name": "ok", "path": "/x", "tier": "platinum"}),
            "tier:",
        ),
        (json!({"name": "ok", "path": "/x", "rank": -1}), "rank:"),
    ] {
        let (s, v) = admin(&f.app, Method::POST, "/admin/adapters", body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(error_of(&v).starts_with(field), "{field} {v}");
    }
    let (s, v) = admin(&f.app, Method::POST, "/admin/adapters/sql/pin", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        admin(&f.app, Method::POST, "/admin/adapters/nope/pin", json!({}))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let (_, list) = get(&f.app, "/admin/adapters").await;
    assert_eq!(list["adapters"][0]["pinned"], true);
    assert_eq!(list["adapters"][0]["tier"], "gold");
    assert_eq!(list["adapters"][0]["history"][0]["version"], "v2");
    let (s, d) = get(&f.app, "/admin/adapters/sql").await;
    assert_eq!(
        (s, d["adapter"]["name"].as_str()),
        (StatusCode::OK, Some("sql"))
    );
    assert_eq!(
        get(&f.app, "/admin/adapters/nope").await.0,
        StatusCode::NOT_FOUND
    );
    let (s, heat) = get(&f.app, "/admin/adapters/heatmap").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(heat["adapters"], json!(["sql"]));
    assert_eq!(heat["pods"], json!(["pod-a"]));
    assert_eq!(heat["cells"], json!([["absent"]]));
    let (s, v) = admin(&f.app, Method::POST, "/admin/adapters/sql/unpin", json!({})).await;
    assert_eq!((s, v["pinned"].as_bool()), (StatusCode::OK, Some(false)));
    assert_eq!(
        admin(&f.app, Method::DELETE, "/admin/adapters/sql", json!({}))
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        admin(&f.app, Method::DELETE, "/admin/adapters/sql", json!({}))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

/// A template may carry its traffic's shape: checked against its text (a bad one is refused
/// naming the field), shown as a summary, its salt never shown.
#[tokio::test]
async fn a_template_may_carry_a_shape_and_a_bad_one_is_refused_naming_the_field() {
    let f = fixture();
    let system = "Answer questions about invoices, briefly and exactly. ".repeat(6);
    let text = format!("<|system|>\n{system}");
    let template = |len: usize| {
        json!({"model": "base", "text": text, "endpoint": "chat_completions",
            "shape": {"messages": [{"role": "system", "len": len}],
                      "tools": r#"[{"type":"function","function":{"name":"lookup"}}]"#,
                      "cache_salt": "operator-salt-31"}})
    };
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/prompts",
        template(system.len() + 1),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).starts_with("shape.messages[0]:"), "{v}");
    let (s, v) = admin(
        &f.app,
        Method::POST,
        "/admin/prompts",
        template(system.len()),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v, _) = call(&f.app, Method::GET, "/admin/prompts?k=5", Some(READ), None).await;
    assert_eq!(s, StatusCode::OK);
    let prompt = &v["prompts"][0];
    assert_eq!(prompt["endpoint"], "chat_completions");
    assert_eq!(prompt["shape"]["messages"], 1);
    assert_eq!(prompt["shape"]["roles"], json!(["system"]));
    assert_eq!(prompt["shape"]["salted"], true);
    assert_eq!(prompt["rejections"], 0);
    assert_eq!(prompt["backoff_until_ms"], Value::Null);
    assert!(!v.to_string().contains("operator-salt-31"), "{v}");
}

#[tokio::test]
async fn snapshot_on_demand_round_trips_through_restore() {
    let f = fixture();
    admin(&f.app, Method::POST, "/admin/prompts", template(3)).await;
    let (s, v) = admin(&f.app, Method::POST, "/admin/snapshot", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["prompts"], 1);
    let again = Gateway::new(f.gateway.config.clone());
    let restored = again.restore();
    assert_eq!(restored.prompts, 1);
    assert!(again.state().fleet.pool().templates() == 1);
}

/// `GET /v1/routing?since=G` as a filter sends it (with the ETag it holds).
async fn routing_since(app: &Router, since: &str) -> (StatusCode, Value) {
    let req = Request::get(format!("/v1/routing?since={since}"))
        .header(header::AUTHORIZATION, format!("Bearer {SIGNAL}"))
        .header(header::IF_NONE_MATCH, format!("\"{since}\""))
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Starts (or re-weights) an experiment: each is a new generation of the table.
async fn new_generation(app: &Router, weight: f64) -> u64 {
    let definition = json!({"id": "e", "arms": [
        {"name": "a", "weight": weight}, {"name": "b", "weight": 1.0 - weight}]});
    let (s, _) = admin(app, Method::POST, "/admin/experiments", definition).await;
    assert!(s.is_success(), "{s}");
    let (_, table, _) = call(app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    table["generation"].as_u64().unwrap()
}

/// A gateway (on a manual clock at `clock`) whose `n` static pods are up and in the routing
/// table: each reports healthy, and their warm-up deadline passes.
async fn fleet_of(n: usize, clock: &Arc<std::sync::atomic::AtomicU64>) -> Fixture {
    use prewarm_gateway::policy::fleet::HealthCheck;
    use prewarm_gateway::service::Clock;
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::default();
    config.server.admin_token = TOKEN.into();
    config.server.read_token = READ.into();
    config.server.signal_token = SIGNAL.into();
    config.state.dir = dir.path().join("state");
    config.pods.static_pods = (0..n)
        .map(|i| PodSpec::new(format!("pod-{i:03}"), format!("127.0.0.1:{}", 9 + i)))
        .collect();
    let gateway = Gateway::with_clock(config, Clock::Manual(clock.clone()));
    gateway.restore();
    let healthy = HealthCheck {
        ok: true,
        load: None,
        process_start_s: None,
    };
    let now = clock.load(std::sync::atomic::Ordering::SeqCst);
    for i in 0..n {
        let id = format!("pod-{i:03}");
        let _ = gateway.record_health(&id, healthy.clone());
        gateway.fleet(|f| f.start_warmup(&id, now));
    }
    let _ = gateway.tick();
    clock.fetch_add(200_000, std::sync::atomic::Ordering::SeqCst);
    let _ = gateway.tick();
    Fixture {
        app: router(gateway.clone()),
        gateway,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_filter_that_missed_generations_gets_a_delta_from_the_one_it_holds() {
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
    let f = fleet_of(20, &clock).await;
    let (_, first, _) = call(&f.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    assert_eq!(first["pods"].as_array().map(Vec::len), Some(20), "{first}");
    let held = first["generation"].as_u64().unwrap();
    let mut generation = held;
    for w in [0.5, 0.4, 0.3] {
        let g = new_generation(&f.app, w).await;
        assert!(g > generation);
        generation = g;
    }
    // missed three generations: a delta from the one held to the current one
    let (s, delta) = routing_since(&f.app, &held.to_string()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(delta["base"].as_u64(), Some(held));
    assert_eq!(delta["generation"].as_u64(), Some(generation));
    let delta: prewarm_core::table_delta::TableDelta = serde_json::from_value(delta).unwrap();
    let first: prewarm_core::wire::RoutingTable = serde_json::from_value(first).unwrap();
    let (_, now, _) = call(&f.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    let now: prewarm_core::wire::RoutingTable = serde_json::from_value(now).unwrap();
    assert_eq!(prewarm_core::table_delta::apply(&delta, &first), Ok(now));
    // the current generation is a 304, a filter without `since` gets the whole table
    assert_eq!(
        routing_since(&f.app, &generation.to_string()).await.0,
        StatusCode::NOT_MODIFIED
    );
    let (_, whole, _) = call(&f.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    assert!(whole.get("base").is_none() && whole.get("pods").is_some());
    let (_, metrics) = get(&f.app, "/metrics").await;
    let metrics = metrics.as_str().unwrap();
    assert!(metrics.contains(r#"prewarm_routing_table_replies_total{kind="delta"} 1"#));
    assert!(metrics.contains(r#"prewarm_routing_table_replies_total{kind="unchanged"} 1"#));
}

#[tokio::test]
async fn an_unknown_generation_gets_the_whole_table() {
    let f = fixture();
    let generation = new_generation(&f.app, 0.5).await;
    // never published (0), or after the current one (a gateway that lost its snapshot)
    for since in [
        "0".to_string(),
        (generation + 1).to_string(),
        u64::MAX.to_string(),
    ] {
        let (s, table) = routing_since(&f.app, &since).await;
        assert_eq!(s, StatusCode::OK, "{since}");
        assert!(table.get("base").is_none(), "{since}: {table}");
        assert_eq!(table["generation"].as_u64(), Some(generation));
    }
}

#[tokio::test]
async fn after_a_restart_an_earlier_generation_gets_the_whole_table() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let f = fixture_with(|c| c.state.dir = state.clone());
    let before = new_generation(&f.app, 0.5).await;
    f.gateway.write_snapshot().unwrap();
    drop(f);
    let again = fixture_with(|c| c.state.dir = state.clone());
    let (_, table, _) = call(&again.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    let generation = table["generation"].as_u64().unwrap();
    assert!(generation > before, "generations never go backwards");
    let (s, table) = routing_since(&again.app, &before.to_string()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        table.get("base").is_none(),
        "the restarted gateway keeps no history: {table}"
    );
    assert_eq!(table["generation"].as_u64(), Some(generation));
}

#[tokio::test]
async fn a_bad_since_is_a_400_naming_it() {
    let f = fixture();
    for bad in ["x", "-1", "1.5", "18446744073709551616", ""] {
        let (s, v, _) = call(
            &f.app,
            Method::GET,
            &format!("/v1/routing?since={bad}"),
            Some(SIGNAL),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
        assert!(error_of(&v).starts_with("since: "), "{bad}: {v}");
    }
    let (s, v, _) = call(
        &f.app,
        Method::GET,
        "/v1/routing?sinse=1",
        Some(SIGNAL),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&v).contains("sinse"), "{v}");
}

#[tokio::test]
async fn a_busy_share_jittering_within_its_step_keeps_the_generation() {
    use prewarm_gateway::policy::fleet::{HealthCheck, PodLoad};
    use std::sync::atomic::Ordering;
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
    let f = fleet_of(4, &clock).await;
    // a health check a second; each pod busy 4 seconds in 7 (its own phase): a busy share of
    // 34 or 35 checks in 60 as the window slides, ±1 check of noise around 4/7
    let check = |second: u64, pod: u64| HealthCheck {
        ok: true,
        load: Some(PodLoad {
            running: u64::from((second + pod) % 7 < 4),
            ..PodLoad::default()
        }),
        process_start_s: None,
    };
    let mut second = 0u64;
    let mut run = |seconds: u64| {
        let mut shares = std::collections::BTreeSet::new();
        let mut generations = std::collections::BTreeSet::new();
        for _ in 0..seconds {
            second += 1;
            let now = clock.fetch_add(1_000, Ordering::SeqCst) + 1_000;
            for pod in 0..4u64 {
                let _ = f
                    .gateway
                    .record_health(&format!("pod-{pod:03}"), check(second, pod));
                let share = f
                    .gateway
                    .state()
                    .fleet
                    .pod(&format!("pod-{pod:03}"))
                    .unwrap()
                    .busy
                    .share(now);
                shares.insert((share * 100.0).round() as u64);
            }
            let _ = f.gateway.tick();
            generations.insert(f.gateway.published_table().generation);
        }
        (shares, generations)
    };
    // a minute to fill the window, then loads near 4/7 are published
    run(70);
    let (shares, generations) = run(120);
    assert!(shares.len() >= 2, "the measured shares jitter: {shares:?}");
    assert_eq!(generations.len(), 1, "no new generation: {generations:?}");
    let published = f.gateway.published_table();
    let (_, table, _) = call(&f.app, Method::GET, "/v1/routing", Some(SIGNAL), None).await;
    assert_eq!(table["generation"].as_u64(), Some(published.generation));
    for pod in table["pods"].as_array().unwrap() {
        let load = pod["load"].as_f64().unwrap();
        assert!((load - 4.0 / 7.0).abs() < 0.07, "{pod}");
    }
}
