//! Native scenario tests: whole requests and ticks through the glue, against the host double.
//! Its helpers (request bodies, a request sent the way Envoy does, the queued signals, a table)
//! serve the other scenario modules too.

use prewarm_core::wire::{
    PatternState, PrefillSignal, RoutedPod, RoutingTable, Signal, SignalBatch,
};
use prewarm_core::{BlockChain, FingerprintConfig, PlacementCandidate};

use prewarm_filter::config::FilterConfig;
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::Metric;
use prewarm_filter::request::{RequestFlow, Verdict};
use prewarm_filter::root::RootTasks;
use prewarm_filter::worker::Worker;

/// A worker with the defaults and `model` a base model (never pinned).
pub(crate) fn with_base_model(model: &str) -> Worker {
    let mut config = FilterConfig::default();
    config.signals.base_models = vec![model.into()];
    Worker::new(config)
}

pub(crate) fn chat_body(model: &str, system: &str, question: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }))
    .unwrap()
}

pub(crate) fn template() -> String {
    (0..300)
        .map(|i| format!("rule {i} of the support handbook says be kind."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends one request through the flow the way Envoy does (headers, then the body in two
/// chunks); returns the verdicts.
pub(crate) fn send(
    host: &FakeHost,
    worker: &Worker,
    path: &str,
    extra: &[(&str, &[u8])],
    body: &[u8],
) -> Vec<Verdict> {
    send_flow(host, worker, path, extra, body).0
}

/// [`send`], also returning the flow (for its response).
pub(crate) fn send_flow(
    host: &FakeHost,
    worker: &Worker,
    path: &str,
    extra: &[(&str, &[u8])],
    body: &[u8],
) -> (Vec<Verdict>, RequestFlow) {
    let len = body.len().to_string();
    let mut headers: Vec<(&str, &[u8])> = vec![
        (":method", b"POST"),
        (":path", path.as_bytes()),
        ("content-length", len.as_bytes()),
    ];
    headers.extend_from_slice(extra);
    host.set_request(&headers, body);
    let mut flow = RequestFlow::default();
    let mut verdicts = vec![flow.on_headers(host, worker, false)];
    if verdicts.first() == Some(&Verdict::Continue) {
        host.continue_headers();
    }
    let half = body.len() / 2;
    verdicts.push(flow.on_body(host, worker, half, false));
    verdicts.push(flow.on_body(host, worker, body.len(), true));
    (verdicts, flow)
}

/// The signals pending in the shared ring (default 256 slots), without taking them.
pub(crate) fn queued(host: &FakeHost) -> Vec<Signal> {
    let counter = |name: &str| {
        host.shared_value(&format!("prewarm/signals/{name}"))
            .map_or(0, |b| u64::from_le_bytes(b[..8].try_into().unwrap()))
    };
    (counter("head")..counter("tail"))
        .filter_map(|seq| host.shared_value(&format!("prewarm/signals/{}", seq % 256)))
        .map(|v| serde_json::from_slice(&v[8..]).unwrap())
        .collect()
}

fn chat_body_with(model: &str, system: &str, question: &str, extra: serde_json::Value) -> Vec<u8> {
    let mut body: serde_json::Value =
        serde_json::from_slice(&chat_body(model, system, question)).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    serde_json::to_vec(&body).unwrap()
}

fn streak_signal(host: &FakeHost, worker: &Worker, extra: serde_json::Value) -> PrefillSignal {
    let t = template();
    for q in ["first question?", "second question?", "third question?"] {
        send(
            host,
            worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", b"alice")],
            &chat_body_with("base", &t, q, extra.clone()),
        );
    }
    match queued(host).pop() {
        Some(Signal::Prefill(p)) => p,
        other => panic!("prefill expected: {other:?}"),
    }
}

#[test]
fn a_chat_streaks_signal_carries_its_messages_tools_kwargs_and_salt_over_the_prefix() {
    let host = FakeHost::new();
    let worker = with_base_model("base");
    let extra = serde_json::json!({
        "tools": [{"type": "function", "function": {"name": "lookup_order"}}],
        "chat_template_kwargs": {"enable_thinking": false},
        "cache_salt": "tenant-secret",
    });
    let sent_tools = serde_json::to_string(&extra["tools"]).unwrap();
    let p = streak_signal(&host, &worker, extra);
    let shape = p.shape.expect("a chat signal has a shape");
    shape.check(&p.prefix_text).unwrap();
    assert_eq!(shape.messages[0].role, "system");
    assert_eq!(
        shape.tools.as_ref().map(|t| t.get()),
        Some(sent_tools.as_str())
    );
    assert_eq!(shape.cache_salt.as_deref(), Some("tenant-secret"));
    assert_eq!(host.metric(Metric::SignalsUnshaped), 0);
}

#[test]
fn a_request_past_the_shape_bounds_is_observed_unshaped_counted_and_passes_untouched() {
    let host = FakeHost::new();
    let worker = with_base_model("base");
    let huge = "d".repeat(prewarm_core::warm_shape::MAX_SHAPE_JSON_BYTES);
    let extra = serde_json::json!({"tools": [{"type": "function", "description": huge}]});
    let p = streak_signal(&host, &worker, extra);
    assert!(p.shape.is_none());
    assert!(!p.prefix.is_empty(), "still signalled");
    assert_eq!(host.metric(Metric::SignalsUnshaped), 1);
}

#[test]
fn three_similar_prompts_make_one_prefill_with_their_common_prefix() {
    let host = FakeHost::new();
    let worker = with_base_model("base");
    let t = template();
    for (i, q) in ["first question?", "second question?", "third question?"]
        .iter()
        .enumerate()
    {
        let v = send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", b"alice")],
            &chat_body("base", &t, q),
        );
        assert_eq!(v, vec![Verdict::Pause, Verdict::Pause, Verdict::Continue]);
        assert_eq!(queued(&host).len(), usize::from(i == 2), "after prompt {i}");
    }
    let signals = queued(&host);
    let Signal::Prefill(p) = &signals[0] else {
        panic!("prefill expected: {signals:?}")
    };
    let fp = FingerprintConfig::default();
    let canonical = format!("<|system|>\n{t}\n<|user|>\n");
    let whole = BlockChain::of("base", canonical.as_bytes(), &fp);
    assert_eq!(p.prefix, whole.blocks, "the shared template's full blocks");
    assert_eq!(p.prefix_tokens, p.prefix.len() * 64);
    assert_eq!(p.prefix_text.len(), p.prefix_tokens * 4);
    assert!(canonical.starts_with(&p.prefix_text));
    assert_eq!(p.state, PatternState::New);
    // more prompts of the hot template: tallied, then one adopted feedback with their count
    // on the tick; the tick also finds the template shared-hot (five requests in the window)
    // and signals it once more, as known: the streak signalled it new
    for q in ["fourth?", "fifth?"] {
        let body = chat_body("base", &t, q);
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[("x-prewarm-user", b"alice")],
            &body,
        );
    }
    assert_eq!(queued(&host).len(), 1);
    RootTasks::default().fold_tally(&host, &worker);
    let signals = queued(&host);
    assert_eq!(signals.len(), 3, "{signals:?}");
    let last = *p.prefix.last().unwrap();
    assert!(matches!(&signals[2], Signal::Feedback(f) if f.prefix == last && f.count == 2));
    let Signal::Prefill(shared) = &signals[1] else {
        panic!("the shared prompt's prefill: {signals:?}")
    };
    assert_eq!(shared.prefix, p.prefix);
    assert_eq!(shared.state, PatternState::Known);
    assert_eq!(host.metric(Metric::RequestsInspected), 5);
}

#[test]
fn body_user_is_the_fallback_and_users_are_kept_apart() {
    let host = FakeHost::new();
    let worker = with_base_model("m");
    let t = template();
    for (user, q) in [("a", "q1"), ("b", "q2"), ("a", "q3"), ("b", "q4")] {
        let body = serde_json::to_vec(
            &serde_json::json!({"model":"m","user":user,"prompt": format!("{t} {q}")}),
        )
        .unwrap();
        send(&host, &worker, "/v1/completions", &[], &body);
    }
    assert!(
        queued(&host).is_empty(),
        "two prompts each: no streak complete"
    );
    let body = serde_json::to_vec(
        &serde_json::json!({"model":"m","user":"a","prompt": format!("{t} q5")}),
    )
    .unwrap();
    send(&host, &worker, "/v1/completions", &[], &body);
    assert_eq!(queued(&host).len(), 1);
}

#[test]
fn adapter_pins_once_per_crossing() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let root = RootTasks::default();
    for i in 0..8 {
        host.set_now(1_000_000 + i * 1000);
        let body = chat_like("sql-lora", i);
        send(&host, &worker, "/v1/completions", &[], &body);
        root.fold_tally(&host, &worker);
    }
    let pins: Vec<_> = queued(&host)
        .into_iter()
        .filter(|s| matches!(s, Signal::Pin(_)))
        .collect();
    assert_eq!(pins.len(), 1, "{pins:?}");
    let Signal::Pin(p) = &pins[0] else {
        unreachable!()
    };
    assert_eq!(p.adapter, "sql-lora");
    assert!(p.rate_per_minute >= 5.0);
    // the rate falls below the threshold, then crosses again: a second pin
    host.set_now(1_000_000 + 10 * 60_000);
    for i in 0..5 {
        send(
            &host,
            &worker,
            "/v1/completions",
            &[],
            &chat_like("sql-lora", 100 + i),
        );
    }
    root.fold_tally(&host, &worker);
    let pins = queued(&host)
        .into_iter()
        .filter(|s| matches!(s, Signal::Pin(_)))
        .count();
    assert_eq!(pins, 2);
}

pub(crate) fn chat_like(model: &str, i: u64) -> Vec<u8> {
    serde_json::to_vec(
        &serde_json::json!({"model": model, "prompt": format!("unrelated prompt number {i}")}),
    )
    .unwrap()
}

pub(crate) fn table(pods: &[(&str, &str, &[&str])]) -> RoutingTable {
    let pods = pods
        .iter()
        .map(|(id, address, adapters)| RoutedPod::new(id, address, adapters))
        .collect();
    RoutingTable::of_pods(7, 64, pods)
}

#[test]
fn client_endpoint_header_is_removed_and_the_table_routes() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let body = chat_body("m", &template(), "q");
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[("x-gateway-destination-endpoint", b"10.9.9.9:1")],
        &body,
    );
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
    assert_eq!(host.metric(Metric::UnroutedNoTable), 1);

    let t = table(&[
        ("p1", "127.0.0.1:1001", &[]),
        ("p2", "127.0.0.1:1002", &[]),
        ("p3", "127.0.0.1:1003", &[]),
    ]);
    worker.table.install(7, t.clone());
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[("x-gateway-destination-endpoint", b"10.9.9.9:1")],
        &body,
    );
    let fp = FingerprintConfig::default();
    let canonical = format!("<|system|>\n{}\n<|user|>\nq\n", template());
    let chain = BlockChain::of("m", canonical.as_bytes(), &fp);
    // a prompt the index knows nothing of: rendezvous on its first shard
    let key = chain.routing_key(&fp).unwrap();
    let ids: Vec<_> = t
        .pods
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, 1.0))
        .collect();
    let order: Vec<&str> = prewarm_core::rank(key.0, &ids)
        .into_iter()
        .map(|i| t.pods[i].address.as_str())
        .collect();
    assert_eq!(
        t.pods[prewarm_core::place(key.0, &ids).unwrap()].address,
        order[0]
    );
    assert_eq!(
        host.header("x-gateway-destination-endpoint"),
        Some(order.join(",").into_bytes()),
        "the placement's choice, then the rest in rank order for retries"
    );
    assert_eq!(host.metric(Metric::Routed), 1);
    assert_eq!(host.metric(Metric::RoutedByPrefix), 0);
    // the conversation goes on: the index the first request wrote sends it to the same pod
    let next = chat_body("m", &template(), &format!("q{}", " and then?".repeat(80)));
    send(&host, &worker, "/v1/chat/completions", &[], &next);
    assert_eq!(host.metric(Metric::RoutedByPrefix), 1);
    let header = host.header("x-gateway-destination-endpoint").unwrap();
    assert!(header.starts_with(order[0].as_bytes()));
}

#[test]
fn skips_leave_the_request_untouched() {
    let host = FakeHost::new();
    let mut config = FilterConfig::default();
    config.requests.max_body_bytes = 1000;
    let worker = Worker::new(config);
    // no content-length
    host.set_request(
        &[
            (":method", b"POST"),
            (":path", b"/v1/completions"),
            ("x-gateway-destination-endpoint", b"x"),
        ],
        b"{}",
    );
    let mut flow = RequestFlow::default();
    assert_eq!(flow.on_headers(&host, &worker, false), Verdict::Continue);
    assert_eq!(flow.on_body(&host, &worker, 2, true), Verdict::Continue);
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
    assert_eq!(host.metric(Metric::SkippedNoContentLength), 1);
    // too large
    let big = vec![b' '; 2000];
    assert_eq!(
        send(&host, &worker, "/v1/completions", &[], &big)[0],
        Verdict::Continue
    );
    assert_eq!(host.metric(Metric::SkippedTooLarge), 1);
    // content-length lies low: stop at the limit
    host.set_request(
        &[
            (":method", b"POST"),
            (":path", b"/v1/completions"),
            ("content-length", b"10"),
        ],
        &big,
    );
    let mut flow = RequestFlow::default();
    assert_eq!(flow.on_headers(&host, &worker, false), Verdict::Pause);
    assert_eq!(flow.on_body(&host, &worker, 2000, false), Verdict::Continue);
    assert_eq!(host.metric(Metric::SkippedTooLarge), 2);
    // malformed JSON, non-UTF-8 headers
    send(
        &host,
        &worker,
        "/v1/completions",
        &[("x-prewarm-user", b"\xff\xfe")],
        b"{\"model\":",
    );
    assert_eq!(host.metric(Metric::SkippedMalformed), 1);
    // not an inference path, or not a POST
    send(&host, &worker, "/v1/models", &[], b"{}");
    host.set_request(&[(":method", b"GET"), (":path", b"/v1/completions")], b"");
    assert_eq!(
        RequestFlow::default().on_headers(&host, &worker, true),
        Verdict::Continue
    );
    assert_eq!(host.metric(Metric::SkippedNotInference), 2);
    assert!(host.shared_keys().is_empty(), "{:?}", host.shared_keys());
}

#[test]
fn tick_sends_one_batch_and_counts_the_reply() {
    let host = FakeHost::new();
    let mut config = FilterConfig::default();
    config.gateway.gateway_token = Some("s3cret".into());
    let worker = Worker::new(config);
    for i in 0..6 {
        send(
            &host,
            &worker,
            "/v1/completions",
            &[],
            &chat_like("lora-a", i),
        );
    }
    let mut root = RootTasks::default();
    root.on_tick(&host, &worker);
    let calls = host.take_calls();
    let post = calls
        .iter()
        .find(|c| c.headers.contains(&(":path".into(), "/v1/signals".into())))
        .unwrap();
    assert_eq!(post.cluster, "prewarm-gateway");
    assert!(post
        .headers
        .contains(&("authorization".into(), "Bearer s3cret".into())));
    assert!(post.timeout.as_millis() == 500);
    let batch = SignalBatch::decode(&post.body).unwrap();
    assert_eq!(batch.signals.len(), 1);
    host.set_reply(Some(200), b"{}");
    root.on_call_response(&host, &worker, post.token, 2);
    assert_eq!(host.metric(Metric::SignalsSent), 1);
    // a failed batch is counted and dropped; unknown tokens are ignored
    host.set_now(1_000_000 + 61_000 * 10);
    for i in 0..6 {
        send(
            &host,
            &worker,
            "/v1/completions",
            &[],
            &chat_like("lora-a", i),
        );
    }
    root.on_tick(&host, &worker);
    let post = host
        .take_calls()
        .into_iter()
        .find(|c| c.headers.contains(&(":path".into(), "/v1/signals".into())))
        .unwrap();
    host.set_reply(Some(504), b"");
    root.on_call_response(&host, &worker, post.token, 0);
    root.on_call_response(&host, &worker, 999_999, 0);
    assert_eq!(host.metric(Metric::DispatchFailures), 1);
    assert_eq!(host.metric(Metric::SignalsDropped), 1);
}

#[test]
fn table_is_polled_conditionally_and_published_to_other_workers() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut root = RootTasks::default();
    root.on_tick(&host, &worker);
    let get = host.take_calls().pop().unwrap();
    assert!(get
        .headers
        .contains(&(":path".into(), "/v1/routing".into())));
    assert!(!get.headers.iter().any(|(k, _)| k == "if-none-match"));
    let t = table(&[("p1", "127.0.0.1:1", &[])]);
    let body = t.encode();
    host.set_reply(Some(200), &body);
    root.on_call_response(&host, &worker, get.token, body.len());
    assert_eq!(worker.table.generation(), Some(7));
    // another worker adopts it on its tick, without polling (the lease is taken)
    let other_host = host.sibling();
    let other = Worker::new(FilterConfig::default());
    RootTasks::default().on_tick(&other_host, &other);
    assert_eq!(other.table.generation(), Some(7));
    assert!(other_host.calls().is_empty());
    // the next poll is conditional; 304 keeps the table
    host.set_now(1_002_000);
    root.on_tick(&host, &worker);
    let get = host.take_calls().pop().unwrap();
    assert!(get
        .headers
        .contains(&("if-none-match".into(), "\"7\"".into())));
    host.set_reply(Some(304), b"");
    root.on_call_response(&host, &worker, get.token, 0);
    assert_eq!(host.metric(Metric::TableUnchanged), 1);
    // garbage and another major version are refused and counted; the table stays
    for (status, body) in [
        (200, b"garbage".to_vec()),
        (200, br#"{"version":"2.0"}"#.to_vec()),
        (500, vec![]),
    ] {
        host.set_now(host_now(&host) + 2_000);
        root.on_tick(&host, &worker);
        let get = host.take_calls().pop().unwrap();
        host.set_reply(Some(status), &body);
        root.on_call_response(&host, &worker, get.token, body.len());
    }
    assert_eq!(host.metric(Metric::TableFetchFailures), 3);
    assert_eq!(worker.table.generation(), Some(7));
}

/// A root that polled the table `{p1 at 127.0.0.1:1}` and published it.
pub(crate) fn with_one_pod_table(host: &FakeHost, worker: &Worker) -> RootTasks {
    let mut root = RootTasks::default();
    root.on_tick(host, worker);
    let get = host.take_calls().pop().unwrap();
    let body = table(&[("p1", "127.0.0.1:1", &[])]).encode();
    host.set_reply(Some(200), &body);
    root.on_call_response(host, worker, get.token, body.len());
    root
}

#[test]
fn a_request_routes_with_the_table_another_worker_just_published() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    with_one_pod_table(&host, &worker);
    // a sibling worker whose tick has not come yet routes its next request with that table
    let other_host = host.sibling();
    let other = Worker::new(FilterConfig::default());
    send(
        &other_host,
        &other,
        "/v1/chat/completions",
        &[],
        &chat_body("m", &template(), "q"),
    );
    assert_eq!(other.table.generation(), Some(7));
    assert_eq!(
        other_host.header("x-gateway-destination-endpoint"),
        Some(b"127.0.0.1:1".to_vec())
    );
    assert_eq!(other_host.metric(Metric::Routed), 1);
}

/// Each routed request reaches the gateway as a served record in the next batch (the pod it
/// went to, its shards and tokens: what the gateway's KV model ages by); unrouted ones do not.
#[test]
fn routed_requests_travel_as_served_records_in_the_next_batch() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut root = with_one_pod_table(&host, &worker);
    let prompt = chat_body("m", &template(), "q");
    send(&host, &worker, "/v1/chat/completions", &[], &prompt);
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[],
        &chat_body("m", "hi", "q"),
    );
    host.set_now(host_now(&host) + 2_000);
    root.on_tick(&host, &worker);
    let post = host
        .take_calls()
        .into_iter()
        .find(|c| c.headers.contains(&(":path".into(), "/v1/signals".into())))
        .expect("a batch with the served records");
    let batch = SignalBatch::decode(&post.body).unwrap();
    assert_eq!(
        batch.served.len(),
        1,
        "the short prompt has no block to route by"
    );
    let record = &batch.served[0];
    assert_eq!((record.pod.as_str(), record.model.as_str()), ("p1", "m"));
    assert!(!record.shards.is_empty() && record.prompt_tokens >= record.chained_tokens);
    assert_eq!(host.metric(Metric::ServedEnqueued), 1);
}

fn host_now(h: &FakeHost) -> u64 {
    use prewarm_filter::host::Host;
    h.now_ms()
}

#[test]
fn refused_dispatch_is_counted() {
    let host = FakeHost::new();
    host.refuse_calls(true);
    let worker = Worker::new(FilterConfig::default());
    RootTasks::default().on_tick(&host, &worker);
    assert_eq!(host.metric(Metric::DispatchFailures), 1);
}

#[test]
fn shared_key_space_is_bounded_by_the_slots() {
    let host = FakeHost::new();
    let mut config = FilterConfig::default();
    config.shared_data.user_slots = 4;
    config.shared_data.adapter_slots = 2;
    config.shared_data.pattern_slots = 2;
    let worker = Worker::new(config);
    for i in 0..50 {
        let user = format!("user-{i}");
        send(
            &host,
            &worker,
            "/v1/completions",
            &[("x-prewarm-user", user.as_bytes())],
            &chat_like(&format!("lora-{i}"), i),
        );
    }
    RootTasks::default().fold_tally(&host, &worker);
    assert!(host
        .shared_keys()
        .iter()
        .any(|k| k.starts_with("prewarm/adapter/")));
    let keys = host.shared_keys();
    assert!(keys.len() <= 4 + 2 + 2 + 1, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("prewarm/")));
}

#[test]
fn without_routing_the_headers_are_not_held_and_the_body_is_still_observed() {
    let host = FakeHost::new();
    let mut config = FilterConfig::default();
    config.routing.enabled = false;
    let worker = Worker::new(config);
    worker
        .table
        .install(7, table(&[("p1", "127.0.0.1:1001", &[])]));
    let body = chat_body("m", &template(), "q");
    let v = send(&host, &worker, "/v1/chat/completions", &[], &body);
    assert_eq!(
        v,
        vec![Verdict::Continue, Verdict::Pause, Verdict::Continue]
    );
    assert_eq!(host.metric(Metric::RequestsInspected), 1);
    assert_eq!(host.metric(Metric::UnroutedDisabled), 1);
    assert_eq!(host.header("x-gateway-destination-endpoint"), None);
}

#[test]
fn the_body_is_read_once_at_its_end_however_it_arrives() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let body = chat_body("m", &template(), "q");
    let len = body.len().to_string();
    host.set_request(
        &[
            (":method", b"POST"),
            (":path", b"/v1/chat/completions"),
            ("content-length", len.as_bytes()),
        ],
        &body,
    );
    let mut flow = RequestFlow::default();
    assert_eq!(flow.on_headers(&host, &worker, false), Verdict::Pause);
    for cut in [1, 100, body.len() / 2, body.len() - 1] {
        assert_eq!(flow.on_body(&host, &worker, cut, false), Verdict::Pause);
    }
    assert_eq!(host.body_reads(), 0, "nothing is read before the end");
    assert_eq!(
        flow.on_body(&host, &worker, body.len(), true),
        Verdict::Continue
    );
    assert_eq!(host.body_reads(), 1);
    assert_eq!(host.metric(Metric::RequestsInspected), 1);
    // trailers end a body too: still one read
    let mut flow = RequestFlow::default();
    flow.on_headers(&host, &worker, false);
    flow.on_body(&host, &worker, body.len(), false);
    assert_eq!(flow.on_trailers(&host, &worker), Verdict::Continue);
    assert_eq!(host.body_reads(), 2);
    assert_eq!(host.metric(Metric::RequestsInspected), 2);
}

#[test]
fn model_names_above_the_cap_are_skipped_and_not_tallied() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let long = "a".repeat(prewarm_core::wire::MAX_NAME_BYTES + 1);
    let v = send(&host, &worker, "/v1/completions", &[], &chat_like(&long, 1));
    assert_eq!(v.last(), Some(&Verdict::Continue));
    assert_eq!(host.metric(Metric::SkippedMalformed), 1);
    assert_eq!(host.metric(Metric::RequestsInspected), 0);
    assert!(worker.tally.take().adapters.is_empty());
    // a tenant header above the cap travels as no tenant
    let long_tenant = long.as_bytes();
    send(
        &host,
        &worker,
        "/v1/completions",
        &[("x-prewarm-tenant", long_tenant)],
        &chat_like("lora", 1),
    );
    let tallied = worker.tally.take();
    assert_eq!(tallied.adapters["lora"].tenant, None);
}

#[test]
fn the_user_comes_only_from_the_configured_trusted_source() {
    let t = template();
    let body = |q: &str| {
        serde_json::to_vec(
            &serde_json::json!({"model":"m","user":"u","prompt": format!("{t} {q}")}),
        )
        .unwrap()
    };
    // header only: a body `user` is ignored, so no streak and no prefill
    let host = FakeHost::new();
    let worker = Worker::new(
        FilterConfig::from_json(br#"{"base_models":["m"],"user_from_body":false}"#).unwrap(),
    );
    for q in ["q1", "q2", "q3"] {
        send(&host, &worker, "/v1/completions", &[], &body(q));
    }
    assert!(queued(&host).is_empty());
    assert_eq!(host.metric(Metric::NoUser), 3);
    // a header set by the mesh's authentication (e.g. jwt_authn's claim_to_headers)
    let host = FakeHost::new();
    let worker = Worker::new(
        FilterConfig::from_json(
            br#"{"base_models":["m"],"user_from_body":false,"user_header":"x-jwt-sub","tenant_header":null}"#,
        )
        .unwrap(),
    );
    for q in ["q1", "q2", "q3"] {
        send(
            &host,
            &worker,
            "/v1/completions",
            &[("x-jwt-sub", b"alice"), ("x-prewarm-user", b"mallory")],
            &body(q),
        );
    }
    let signals = queued(&host);
    assert_eq!(signals.len(), 1);
    assert!(matches!(&signals[0], Signal::Prefill(p) if p.tenant.is_none()));
}

/// A question long enough to fill blocks of its own.
fn question(tag: &str) -> String {
    (0..40).map(|i| format!("{tag} {i} ")).collect()
}

/// The pod a routed request's endpoint header names first.
fn routed_to(host: &FakeHost) -> String {
    let value = host.header("x-gateway-destination-endpoint").unwrap();
    let value = String::from_utf8(value).unwrap();
    value.split(',').next().unwrap().to_string()
}

#[test]
fn an_adopted_table_seeds_the_index_with_its_placed_prefixes() {
    use prewarm_core::prefix::PromptKeys;
    use prewarm_core::wire::PlacedPrefix;
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut t = table(&[
        ("p1", "127.0.0.1:1001", &[]),
        ("p2", "127.0.0.1:1002", &[]),
        ("p3", "127.0.0.1:1003", &[]),
    ]);
    worker.table.install(7, t.clone());
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[],
        &chat_body("m", &template(), &question("first")),
    );
    let first = routed_to(&host);
    // the next question on the same template sticks to where the first one went
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[],
        &chat_body("m", &template(), &question("second")),
    );
    assert_eq!(routed_to(&host), first);
    // the gateway warmed the template elsewhere and places it there in the next table
    let fp = FingerprintConfig::default();
    let canonical = |q: &str| format!("<|system|>\n{}\n<|user|>\n{q}\n", template());
    let a = BlockChain::of("m", canonical(&question("first")).as_bytes(), &fp);
    let b = BlockChain::of("m", canonical(&question("third")).as_bytes(), &fp);
    let shared = prewarm_core::fingerprint::common_prefix_len(&a.blocks, &b.blocks);
    let keys = PromptKeys::of_blocks(&a.blocks[..shared], &fp).placed();
    let warmed = t.pods.iter().find(|p| p.address != first).unwrap().clone();
    t.generation = 8;
    t.prefixes = vec![PlacedPrefix {
        keys: keys.into_iter().map(prewarm_core::BlockHash).collect(),
        pod: warmed.id.clone(),
    }];
    let mut root = RootTasks::default();
    root.on_tick(&host, &worker);
    let get = host.take_calls().pop().unwrap();
    let body = t.encode();
    host.set_reply(Some(200), &body);
    root.on_call_response(&host, &worker, get.token, body.len());
    assert_eq!(worker.table.generation(), Some(8));
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[],
        &chat_body("m", &template(), &question("third")),
    );
    assert_eq!(routed_to(&host), warmed.address);
}

/// Sends a request like [`send`] and answers it with `status` and `body` (in 5-byte chunks);
/// returns nothing: what matters is what the tick folds.
fn send_and_answer(host: &FakeHost, worker: &Worker, body: &[u8], status: &str, answer: &str) {
    let len = body.len().to_string();
    host.set_request(
        &[
            (":method", b"POST"),
            (":path", b"/v1/chat/completions"),
            ("content-length", len.as_bytes()),
            ("x-prewarm-user", b"alice"),
        ],
        body,
    );
    let mut flow = RequestFlow::default();
    flow.on_headers(host, worker, false);
    flow.on_body(host, worker, body.len(), true);
    host.set_response_headers(&[(":status", status.as_bytes())]);
    flow.on_response_headers(host);
    let chunks: Vec<&[u8]> = answer.as_bytes().chunks(5).collect();
    for (i, c) in chunks.iter().enumerate() {
        host.set_response_chunk(c);
        flow.on_response_body(host, worker, c.len(), i + 1 == chunks.len());
    }
}

fn succeeded(signals: &[Signal]) -> u32 {
    signals
        .iter()
        .filter_map(|s| match s {
            Signal::Feedback(f) if f.outcome == prewarm_core::wire::FeedbackOutcome::Succeeded => {
                Some(f.count)
            }
            _ => None,
        })
        .sum()
}

#[test]
fn a_successful_answer_to_a_hot_prefix_is_success_feedback_and_a_truncated_one_is_not() {
    let host = FakeHost::new();
    let worker = with_base_model("base");
    let t = template();
    let stop = r#"{"choices":[{"index":0,"message":{"content":"ok"},"finish_reason":"stop"}]}"#;
    let length = r#"{"choices":[{"index":0,"message":{"content":"o"},"finish_reason":"length"}]}"#;
    // three prompts make the template hot; their answers are not feedback (not yet hot)
    for q in ["one?", "two?", "three?"] {
        send_and_answer(&host, &worker, &chat_body("base", &t, q), "200", stop);
    }
    RootTasks::default().fold_tally(&host, &worker);
    assert_eq!(succeeded(&queued(&host)), 0);
    // hot now: a stop is a success, a truncation without max_tokens, a 500 and no reason are not
    send_and_answer(&host, &worker, &chat_body("base", &t, "four?"), "200", stop);
    send_and_answer(
        &host,
        &worker,
        &chat_body("base", &t, "five?"),
        "200",
        length,
    );
    send_and_answer(&host, &worker, &chat_body("base", &t, "six?"), "500", stop);
    send_and_answer(
        &host,
        &worker,
        &chat_body("base", &t, "seven?"),
        "200",
        "{}",
    );
    // a truncation the request asked for is what it wanted
    let mut asked: serde_json::Value =
        serde_json::from_slice(&chat_body("base", &t, "eight?")).unwrap();
    asked["max_tokens"] = 1.into();
    send_and_answer(
        &host,
        &worker,
        &serde_json::to_vec(&asked).unwrap(),
        "200",
        length,
    );
    RootTasks::default().fold_tally(&host, &worker);
    assert_eq!(succeeded(&queued(&host)), 2);
}
