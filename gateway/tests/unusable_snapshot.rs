//! Snapshot files none of which is usable: starting without them is the operator's choice
//! (`state.on_unusable_snapshot`), and no unusable generation is ever overwritten. A real
//! `Gateway` and its router, driven through `oneshot`; the files are real files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use prewarm_gateway::api::router;
use prewarm_gateway::config::{GatewayConfig, OnUnusableSnapshot};
use prewarm_gateway::service::Gateway;
use tower::ServiceExt;

const TOKEN: &str = "admin-secret";

fn config(dir: &Path, choice: OnUnusableSnapshot) -> GatewayConfig {
    let mut config = GatewayConfig::default();
    config.server.admin_token = TOKEN.into();
    config.state.dir = dir.to_path_buf();
    config.state.on_unusable_snapshot = choice;
    config
}

/// A state directory holding two generations, both made unusable: the current one with a flipped
/// byte (checksum), the previous one not a snapshot at all.
fn two_unusable_generations(dir: &Path) {
    let gateway = Gateway::new(config(dir, OnUnusableSnapshot::Refuse));
    gateway.restore();
    gateway.write_snapshot().unwrap();
    gateway.write_snapshot().unwrap();
    let current = dir.join("snapshot.json");
    let mut bytes = std::fs::read(&current).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 1;
    std::fs::write(&current, bytes).unwrap();
    std::fs::write(dir.join("snapshot.prev.json"), b"not a snapshot").unwrap();
}

/// Every file in `dir` by name, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

async fn call(gateway: &Arc<Gateway>, method: Method, uri: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let response = router(gateway.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn metric(gateway: &Gateway, series: &str) -> f64 {
    let text = gateway.telemetry.render();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn with_no_usable_generation_the_gateway_refuses_and_touches_no_file() {
    let dir = tempfile::tempdir().unwrap();
    two_unusable_generations(dir.path());
    let before = files(dir.path());
    let gateway = Gateway::new(config(dir.path(), OnUnusableSnapshot::Refuse));
    gateway.restore();
    assert!(!gateway.is_ready());
    let (status, body) = call(&gateway, Method::GET, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    for named in [
        "state.on_unusable_snapshot",
        "snapshot.json",
        "snapshot.prev.json",
    ] {
        assert!(body.contains(named), "{named} not in {body}");
    }
    assert_eq!(
        call(&gateway, Method::GET, "/healthz").await.0,
        StatusCode::OK
    );
    let (status, body) = call(&gateway, Method::POST, "/admin/snapshot").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    for _ in 0..3 {
        assert!(gateway.write_snapshot().is_err(), "a periodic write");
    }
    assert_eq!(
        files(dir.path()),
        before,
        "no file written, renamed or removed"
    );
    assert_eq!(
        metric(
            &gateway,
            "prewarm_snapshot_fallbacks_total{reason=\"refused\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn starting_empty_by_choice_sets_every_unusable_generation_aside_for_good() {
    let dir = tempfile::tempdir().unwrap();
    two_unusable_generations(dir.path());
    let unusable: Vec<Vec<u8>> = files(dir.path()).into_values().collect();
    let gateway = Gateway::new(config(dir.path(), OnUnusableSnapshot::StartEmpty));
    let restored = gateway.restore();
    assert!(gateway.is_ready(), "{:?}", restored.problems);
    assert_eq!(
        call(&gateway, Method::GET, "/readyz").await.0,
        StatusCode::OK
    );
    assert_eq!(
        metric(
            &gateway,
            "prewarm_snapshot_fallbacks_total{reason=\"none_usable\"}"
        ),
        1.0
    );
    // Many snapshot periods later, the unusable generations are still there, byte for byte.
    for _ in 0..5 {
        gateway.write_snapshot().unwrap();
    }
    let after = files(dir.path());
    let aside: Vec<&Vec<u8>> = after
        .iter()
        .filter(|(name, _)| name.contains(".unusable-"))
        .map(|(_, bytes)| bytes)
        .collect();
    assert_eq!(aside.len(), 2, "{:?}", after.keys());
    for bytes in &unusable {
        assert!(aside.contains(&bytes), "an unusable generation was lost");
    }
    assert!(after.contains_key("snapshot.json") && after.contains_key("snapshot.prev.json"));
}

#[tokio::test]
async fn a_first_start_and_a_fallback_to_the_previous_generation_need_no_choice() {
    let empty = tempfile::tempdir().unwrap();
    let gateway = Gateway::new(config(empty.path(), OnUnusableSnapshot::Refuse));
    gateway.restore();
    assert!(gateway.is_ready(), "no file at all is a first start");

    let dir = tempfile::tempdir().unwrap();
    two_unusable_generations(dir.path());
    let writer = Gateway::new(config(dir.path(), OnUnusableSnapshot::StartEmpty));
    writer.restore();
    writer.write_snapshot().unwrap();
    writer.write_snapshot().unwrap();
    std::fs::write(dir.path().join("snapshot.json"), b"truncated").unwrap();
    let gateway = Gateway::new(config(dir.path(), OnUnusableSnapshot::Refuse));
    gateway.restore();
    assert!(gateway.is_ready(), "the previous generation is usable");
    assert_eq!(
        metric(
            &gateway,
            "prewarm_snapshot_fallbacks_total{reason=\"previous_generation\"}"
        ),
        1.0
    );
    let aside = files(dir.path())
        .into_iter()
        .filter(|(name, bytes)| {
            name.starts_with("snapshot.json.unusable-") && bytes == b"truncated"
        })
        .count();
    assert_eq!(aside, 1, "the unusable current is set aside at the restore");
}
