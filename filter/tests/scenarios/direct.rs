//! Native scenario tests of the direct calls: modes, pod choice, the in-flight flag and the
//! budget, through whole requests and ticks against the host double.

use prewarm_core::wire::{PinSignal, Signal};

use prewarm_filter::config::{DirectConfig, DirectMode, DirectPod, FilterConfig, SignalsConfig};
use prewarm_filter::host::fake::{FakeHost, RecordedCall};
use prewarm_filter::host::Metric;
use prewarm_filter::request::RequestFlow;
use prewarm_filter::root::RootTasks;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, chat_like, send, template};

fn pods(n: usize) -> Vec<DirectPod> {
    (0..n)
        .map(|i| DirectPod {
            id: format!("pod{i}"),
            address: format!("127.0.0.1:{}", 8000 + i),
        })
        .collect()
}

fn standalone(n: usize, change: impl FnOnce(&mut FilterConfig)) -> Worker {
    let mut config = FilterConfig {
        direct: DirectConfig {
            direct_calls: DirectMode::Always,
            direct_pods: pods(n),
            ..DirectConfig::default()
        },
        signals: SignalsConfig {
            base_models: vec!["base".into()],
            ..SignalsConfig::default()
        },
        ..FilterConfig::default()
    };
    change(&mut config);
    assert_eq!(config.validate(), Vec::<String>::new());
    Worker::new(config)
}

fn header<'c>(call: &'c RecordedCall, name: &str) -> Option<&'c str> {
    call.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn direct(calls: &[RecordedCall]) -> Vec<&RecordedCall> {
    calls
        .iter()
        .filter(|c| c.cluster == "prewarm-direct")
        .collect()
}

fn pin(adapter: &str) -> Signal {
    Signal::Pin(PinSignal {
        adapter: adapter.into(),
        tenant: None,
        rate_per_minute: 6.0,
        priority: 20,
    })
}

#[test]
fn standalone_prefills_once_where_the_next_request_is_routed_and_never_calls_a_gateway() {
    let host = FakeHost::new();
    let worker = standalone(4, |_| {});
    let mut root = RootTasks::default();
    let t = template();
    for q in ["first question?", "second question?", "third question?"] {
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", b"alice")],
            &chat_body("base", &t, q),
        );
    }
    host.take_calls();
    root.on_tick(&host, &worker);
    root.on_tick(&host, &worker);
    let calls = host.take_calls();
    assert!(
        calls.iter().all(|c| c.cluster == "prewarm-direct"),
        "no gateway: {calls:?}"
    );
    let direct = direct(&calls);
    assert_eq!(direct.len(), 1, "{direct:?}");
    let call = direct[0];
    let body: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(body["max_tokens"], 1);
    assert_eq!(body["model"], "base");
    // chat traffic is warmed as chat: its messages, the last left open for the template
    assert_eq!(header(call, ":path"), Some("/v1/chat/completions"));
    assert_eq!(body["continue_final_message"], true);
    assert_eq!(body["add_generation_prompt"], false);
    assert!(body.get("prompt").is_none());
    assert_eq!(body["messages"][0]["role"], "system");
    let sent = body["messages"][0]["content"].as_str().unwrap();
    assert!(!sent.is_empty() && t.starts_with(sent), "{sent:?}");
    assert_eq!(call.timeout.as_millis(), 10_000);
    let target = header(call, "x-prewarm-direct-host").unwrap().to_string();
    assert_eq!(header(call, ":authority"), Some(target.as_str()));
    // the next request of the template goes to that pod
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[("x-prewarm-user", b"bob")],
        &chat_body("base", &t, "a fourth, other question?"),
    );
    let routed = String::from_utf8(host.header("x-gateway-destination-endpoint").unwrap()).unwrap();
    assert_eq!(routed.split(',').next(), Some(target.as_str()));
    host.set_reply(Some(200), b"{}");
    root.on_call_response(&host, &worker, call.token, 2);
    assert_eq!(host.metric(Metric::DirectSent), 1);
    assert_eq!(host.metric(Metric::DirectOk), 1);
    assert!(
        !host
            .shared_keys()
            .iter()
            .any(|k| k.starts_with("prewarm/served")),
        "no gateway, no served records"
    );
}

#[test]
fn one_call_in_flight_per_pod_a_success_frees_it_a_failure_backs_off() {
    let host = FakeHost::new();
    let worker = standalone(1, |_| {});
    let mut root = RootTasks::default();
    worker.queue.enqueue(&host, vec![pin("a"), pin("b")]);
    root.on_tick(&host, &worker);
    let first = host.take_calls();
    assert_eq!(direct(&first).len(), 1);
    assert_eq!(host.metric(Metric::DirectSkippedInFlight), 1);
    worker.queue.enqueue(&host, vec![pin("c")]);
    root.on_tick(&host, &worker);
    assert!(direct(&host.take_calls()).is_empty(), "still in flight");
    host.set_reply(Some(200), b"{}");
    root.on_call_response(&host, &worker, first[0].token, 2);
    worker.queue.enqueue(&host, vec![pin("d")]);
    root.on_tick(&host, &worker);
    let calls = host.take_calls();
    assert_eq!(direct(&calls).len(), 1, "freed by the reply");
    let body: serde_json::Value = serde_json::from_slice(&calls[0].body).unwrap();
    assert_eq!(body["model"], "d");
    // a failed call (Envoy's 503: the pod is down) backs the pod off for the call timeout
    host.set_reply(Some(503), b"");
    root.on_call_response(&host, &worker, calls[0].token, 0);
    assert_eq!(host.metric(Metric::DirectFailed), 1);
    host.set_now(1_000_000 + 9_999);
    worker.queue.enqueue(&host, vec![pin("e")]);
    root.on_tick(&host, &worker);
    assert!(direct(&host.take_calls()).is_empty(), "backing off");
    assert_eq!(host.metric(Metric::DirectSkippedBackoff), 1);
    host.set_now(1_000_000 + 10_000);
    worker.queue.enqueue(&host, vec![pin("f")]);
    root.on_tick(&host, &worker);
    assert_eq!(direct(&host.take_calls()).len(), 1, "the back-off is over");
}

#[test]
fn the_minute_budget_holds_across_workers() {
    let host = FakeHost::new();
    let other = host.sibling();
    let worker = standalone(64, |c| c.direct.direct_calls_per_min = 3);
    let second = standalone(64, |c| c.direct.direct_calls_per_min = 3);
    let (mut r1, mut r2) = (RootTasks::default(), RootTasks::default());
    worker
        .queue
        .enqueue(&host, (0..5).map(|i| pin(&format!("a{i}"))).collect());
    r1.on_tick(&host, &worker);
    second
        .queue
        .enqueue(&other, (5..10).map(|i| pin(&format!("a{i}"))).collect());
    r2.on_tick(&other, &second);
    let sent = direct(&host.take_calls()).len() + direct(&other.take_calls()).len();
    assert_eq!(sent, 3);
    assert_eq!(
        host.metric(Metric::DirectSkippedBudget) + host.metric(Metric::DirectSkippedInFlight),
        7
    );
    // the prefill tokens are budgeted too: two prefixes of 512 tokens do not fit 600 a minute
    let host = FakeHost::new();
    let worker = standalone(2, |c| {
        c.requests.max_prefix_tokens = 512;
        c.direct.direct_prefill_tokens_per_min = 600;
    });
    let t = template();
    let mut root = RootTasks::default();
    let mut sent = Vec::new();
    for (user, system) in [("u", t.clone()), ("v", t.replace("rule", "law"))] {
        for q in ["one?", "two?", "three?"] {
            send(
                &host,
                &worker,
                "/v1/chat/completions",
                &[("x-prewarm-user", user.as_bytes())],
                &chat_body("base", &system, q),
            );
        }
        root.on_tick(&host, &worker);
        let calls = host.take_calls();
        host.set_reply(Some(200), b"{}");
        for c in direct(&calls) {
            root.on_call_response(&host, &worker, c.token, 2);
            sent.push(c.token);
        }
    }
    assert_eq!(
        sent.len(),
        1,
        "the second prefix is over the minute's tokens"
    );
    assert_eq!(host.metric(Metric::DirectSkippedBudget), 1);
    let e = FilterConfig::from_json(br#"{"direct_prefill_tokens_per_min":32768}"#).unwrap_err();
    assert!(
        e[0].starts_with("direct_prefill_tokens_per_min: 32768: must be between 32769"),
        "{e:?}"
    );
}

/// A gateway worker: signals go to the gateway; the gateway's replies are `status`.
fn tick_with_gateway(host: &FakeHost, root: &mut RootTasks, worker: &Worker, status: u16) -> usize {
    root.on_tick(host, worker);
    let calls = host.take_calls();
    host.set_reply(Some(status), b"");
    for c in calls.iter().filter(|c| c.cluster == "prewarm-gateway") {
        root.on_call_response(host, worker, c.token, 0);
    }
    host.set_reply(Some(200), b"{}");
    for c in direct(&calls) {
        root.on_call_response(host, worker, c.token, 2);
    }
    direct(&calls).len()
}

#[test]
fn when_gateway_down_the_filter_takes_over_after_the_streak_and_hands_back() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    worker.table.install(
        1,
        prewarm_filter::direct::config::static_table(&FilterConfig {
            direct: DirectConfig {
                direct_pods: pods(2),
                ..DirectConfig::default()
            },
            ..FilterConfig::default()
        }),
    );
    let mut root = RootTasks::default();
    let mut now = 1_000_000;
    let mut step = |host: &FakeHost, root: &mut RootTasks, status: u16, adapter: &str| {
        now += 1_000;
        host.set_now(now);
        worker.queue.enqueue(host, vec![pin(adapter)]);
        tick_with_gateway(host, root, &worker, status)
    };
    assert_eq!(step(&host, &mut root, 200, "a"), 0, "the gateway answers");
    // failing, but not yet for the takeover time (5 s from the first failure)
    let early: usize = (0..5)
        .map(|i| step(&host, &mut root, 503, &format!("b{i}")))
        .sum();
    assert_eq!(early, 0);
    assert_eq!(step(&host, &mut root, 503, "c"), 1, "taken over");
    assert_eq!(
        step(&host, &mut root, 200, "d"),
        1,
        "decided before the reply"
    );
    assert_eq!(step(&host, &mut root, 200, "e"), 0, "handed back");
    // off: never, however long the gateway is down
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig {
        direct: DirectConfig {
            direct_calls: DirectMode::Off,
            ..DirectConfig::default()
        },
        ..FilterConfig::default()
    });
    let mut root = RootTasks::default();
    for i in 0..20 {
        host.set_now(2_000_000 + i * 1_000);
        worker.queue.enqueue(&host, vec![pin("x")]);
        assert_eq!(tick_with_gateway(&host, &mut root, &worker, 503), 0);
    }
}

#[test]
fn a_client_cannot_send_the_direct_header() {
    let host = FakeHost::new();
    let worker = standalone(2, |_| {});
    send(
        &host,
        &worker,
        "/v1/completions",
        &[("x-prewarm-direct-host", b"10.0.0.9:80")],
        &chat_like("base", 1),
    );
    assert_eq!(host.header("x-prewarm-direct-host"), None);
    let mut flow = RequestFlow::default();
    host.set_request(
        &[
            (":method", b"GET"),
            (":path", b"/health"),
            ("x-prewarm-direct-host", b"x"),
        ],
        b"",
    );
    flow.on_headers(&host, &worker, true);
    assert_eq!(
        host.header("x-prewarm-direct-host"),
        None,
        "on every request"
    );
}
