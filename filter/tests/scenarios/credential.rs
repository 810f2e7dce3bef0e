//! Native scenario tests of requests that name no user: their credential's identity continues
//! their streak (`request::credential`), and the credential itself goes nowhere.

use prewarm_core::wire::Signal;

use prewarm_filter::config::{FilterConfig, IdentityConfig, SignalsConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::Metric;
use prewarm_filter::root::RootTasks;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, queued, send, template};

const TOKEN: &str = "sk-live-7f3a9c2e51d84b6e0c29";

fn worker() -> Worker {
    Worker::new(FilterConfig {
        signals: SignalsConfig {
            base_models: vec!["base".into()],
            ..SignalsConfig::default()
        },
        ..FilterConfig::default()
    })
}

/// Three similar prompts, each with the credential header `credential(i)` and no user; returns
/// the prefill signals queued at once (a streak's, not a tick's).
fn three_similar(
    host: &FakeHost,
    worker: &Worker,
    credential: impl Fn(usize) -> (&'static str, String),
) -> usize {
    let t = template();
    for (i, q) in ["first?", "second?", "third?"].iter().enumerate() {
        let (name, value) = credential(i);
        send(
            host,
            worker,
            "/v1/chat/completions",
            &[(name, value.as_bytes())],
            &chat_body("base", &t, q),
        );
    }
    queued(host)
        .iter()
        .filter(|s| matches!(s, Signal::Prefill(_)))
        .count()
}

#[test]
fn requests_with_one_bearer_token_and_no_user_continue_one_streak() {
    let host = FakeHost::new();
    let worker = worker();
    let n = three_similar(&host, &worker, |_| {
        ("authorization", format!("Bearer {TOKEN}"))
    });
    assert_eq!(n, 1, "the token's streak completed");
    assert_eq!(host.metric(Metric::UserFromCredential), 3);
    assert_eq!(host.metric(Metric::NoUser), 0);
}

#[test]
fn an_api_key_header_identifies_a_client_too() {
    let host = FakeHost::new();
    let worker = worker();
    let n = three_similar(&host, &worker, |_| ("x-api-key", TOKEN.to_string()));
    assert_eq!(n, 1);
}

#[test]
fn requests_with_different_tokens_do_not_continue_a_streak() {
    let host = FakeHost::new();
    let worker = worker();
    let n = three_similar(&host, &worker, |i| {
        ("authorization", format!("Bearer {TOKEN}-{i}"))
    });
    assert_eq!(n, 0);
    assert_eq!(host.metric(Metric::UserFromCredential), 3);
}

#[test]
fn a_user_in_the_body_is_the_identity_and_the_token_is_not_used() {
    let host = FakeHost::new();
    let worker = worker();
    let t = template();
    for (i, q) in ["first?", "second?", "third?"].iter().enumerate() {
        let mut body: serde_json::Value =
            serde_json::from_slice(&chat_body("base", &t, q)).unwrap();
        body["user"] = serde_json::json!(format!("user-{i}"));
        let bearer = format!("Bearer {TOKEN}");
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("authorization", bearer.as_bytes())],
            &serde_json::to_vec(&body).unwrap(),
        );
    }
    assert!(queued(&host).is_empty(), "three users, no streak");
    assert_eq!(host.metric(Metric::UserFromCredential), 0);
}

#[test]
fn without_credential_headers_configured_a_request_without_a_user_has_no_identity() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig {
        signals: SignalsConfig {
            base_models: vec!["base".into()],
            ..SignalsConfig::default()
        },
        identity: IdentityConfig {
            credential_headers: vec![],
            ..IdentityConfig::default()
        },
        ..FilterConfig::default()
    });
    let n = three_similar(&host, &worker, |_| {
        ("authorization", format!("Bearer {TOKEN}"))
    });
    assert_eq!(n, 0);
    assert_eq!(host.metric(Metric::NoUser), 3);
    assert!(host.shared_value("prewarm/identity/key").is_none());
}

#[test]
fn the_token_never_reaches_shared_data_signals_calls_or_logs() {
    let host = FakeHost::new();
    let worker = worker();
    three_similar(&host, &worker, |_| {
        ("authorization", format!("Bearer {TOKEN}"))
    });
    // and the shared-prompt fold, and a tick that sends the batch
    for i in 0..3 {
        let bearer = format!("Bearer {TOKEN}");
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("authorization", bearer.as_bytes())],
            &chat_body("base", &template(), &format!("more {i}?")),
        );
    }
    RootTasks::default().fold_tally(&host, &worker);
    let signals = serde_json::to_string(&queued(&host)).unwrap();
    assert!(signals.contains("prefill"), "signals were made: {signals}");
    let identity = worker
        .identity
        .identity(&host, &worker.keys, &worker.config)
        .unwrap();
    let secrets = [TOKEN.as_bytes(), identity.as_bytes()];
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    for key in host.shared_keys() {
        let value = host.shared_value(&key).unwrap();
        for s in secrets {
            assert!(
                !contains(key.as_bytes(), s) && !contains(&value, s),
                "{key}"
            );
        }
    }
    assert!(!contains(signals.as_bytes(), TOKEN.as_bytes()));
    RootTasks::default().on_tick(&host, &worker);
    let calls = host.calls();
    assert!(!calls.is_empty(), "the batch was sent");
    for call in &calls {
        let headers = format!("{:?}", call.headers);
        for s in secrets {
            assert!(!contains(&call.body, s) && !contains(headers.as_bytes(), s));
        }
    }
    for line in host.logs.borrow().iter() {
        for s in secrets {
            assert!(!contains(line.as_bytes(), s), "{line}");
        }
    }
}
