//! Scenario tests of `endpoint_header_owner`: with `external`, another router's endpoint header
//! passes untouched and the pod it names is recorded as served (prefix index, served record,
//! outcome) exactly as a pod the filter routes to; with `prewarm` (the default), a client's
//! header is stripped whether or not the filter routes.

use prewarm_core::wire::{RoutedPod, ServedRecord, Signal, SignalBatch};
use prewarm_core::{BlockChain, FingerprintConfig, PlacementCandidate};

use prewarm_filter::config::{EndpointHeaderOwner, FilterConfig, RoutingConfig, SignalsConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::{Host, Metric};
use prewarm_filter::request::{RequestFlow, Verdict};
use prewarm_filter::root::RootTasks;
use prewarm_filter::routing::external_route::MAX_EXTERNAL_ENDPOINT_BYTES;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, queued, send, send_flow, table, template};

const HEADER: &str = "x-gateway-destination-endpoint";

fn external() -> FilterConfig {
    FilterConfig {
        routing: RoutingConfig {
            enabled: false,
            endpoint_header_owner: EndpointHeaderOwner::External,
            ..RoutingConfig::default()
        },
        signals: SignalsConfig {
            base_models: vec!["m".into()],
            ..SignalsConfig::default()
        },
        ..FilterConfig::default()
    }
}

fn three_pods() -> prewarm_core::wire::RoutingTable {
    table(&[
        ("p1", "127.0.0.1:1001", &[]),
        ("p2", "127.0.0.1:1002", &[]),
        ("p3", "127.0.0.1:1003", &[]),
    ])
}

fn question(tag: &str) -> String {
    (0..40).map(|i| format!("{tag} {i} ")).collect()
}

/// The pods of `t` in the order the filter's own routing would rank them for this prompt
/// (rendezvous on its routing key: the index knows nothing yet).
fn rendezvous_order(t: &prewarm_core::wire::RoutingTable, body_question: &str) -> Vec<RoutedPod> {
    let fp = FingerprintConfig::default();
    let canonical = format!("<|system|>\n{}\n<|user|>\n{body_question}\n", template());
    let key = BlockChain::of("m", canonical.as_bytes(), &fp)
        .routing_key(&fp)
        .unwrap();
    let ids: Vec<_> = t
        .pods
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, 1.0))
        .collect();
    prewarm_core::rank(key.0, &ids)
        .into_iter()
        .map(|i| t.pods[i].clone())
        .collect()
}

/// The served records of the next batch the root sends.
fn served_in_next_batch(host: &FakeHost, worker: &Worker) -> Vec<ServedRecord> {
    host.set_now(host.now_ms() + 2_000);
    RootTasks::default().on_tick(host, worker);
    host.take_calls()
        .into_iter()
        .filter(|c| c.headers.contains(&(":path".into(), "/v1/signals".into())))
        .flat_map(|c| SignalBatch::decode(&c.body).unwrap().served)
        .collect()
}

#[test]
fn external_mode_leaves_the_routers_header_as_set_and_records_its_pod_as_served() {
    let host = FakeHost::new();
    let worker = Worker::new(external());
    let t = three_pods();
    worker.table.install(7, t.clone());
    // The other router picked a pod the filter's own routing would not (its rendezvous last),
    // with a fallback, as the endpoint picker protocol allows.
    let q = question("first");
    let order = rendezvous_order(&t, &q);
    let picked = &order[2];
    let value = format!("{},{}", picked.address, order[0].address);
    let body = chat_body("m", &template(), &q);
    let v = send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[(HEADER, value.as_bytes()), ("x-prewarm-user", b"alice")],
        &body,
    );
    assert_eq!(
        v,
        vec![Verdict::Continue, Verdict::Pause, Verdict::Continue],
        "the headers are not held: nothing is written to them"
    );
    assert_eq!(host.header(HEADER), Some(value.clone().into_bytes()));
    assert_eq!(host.metric(Metric::ExternalRecorded), 1);
    assert_eq!(host.metric(Metric::UnroutedDisabled), 1);
    assert_eq!(host.metric(Metric::Routed), 0);
    // the served record is the one routing to that pod would make
    let fp = FingerprintConfig::default();
    let canonical = format!("<|system|>\n{}\n<|user|>\n{q}\n", template());
    let chain = BlockChain::of("m", canonical.as_bytes(), &fp);
    let want = ServedRecord::of(&picked.id, "m", &chain, chain.prompt_tokens as u64, &fp);
    assert_eq!(served_in_next_batch(&host, &worker), vec![want]);

    // The prefix index learned where the prompt went: a proxy routing with prewarm (sharing
    // this proxy's shared data) sends the conversation's next turn to the picked pod, not to
    // its own rendezvous choice.
    let routing_host = host.sibling();
    let routing = Worker::new(FilterConfig::default());
    routing.table.install(7, t);
    let next = chat_body("m", &template(), &format!("{q}{}", " and then?".repeat(80)));
    send(&routing_host, &routing, "/v1/chat/completions", &[], &next);
    assert_eq!(routing_host.metric(Metric::RoutedByPrefix), 1);
    let header = String::from_utf8(routing_host.header(HEADER).unwrap()).unwrap();
    assert!(header.starts_with(&picked.address), "{header}");
}

#[test]
fn external_mode_still_observes_and_signals_hot_prefixes() {
    let host = FakeHost::new();
    let worker = Worker::new(external());
    worker.table.install(7, three_pods());
    for q in ["first question?", "second question?", "third question?"] {
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[(HEADER, b"127.0.0.1:1001"), ("x-prewarm-user", b"alice")],
            &chat_body("m", &template(), q),
        );
    }
    let signals = queued(&host);
    assert_eq!(signals.len(), 1, "{signals:?}");
    assert!(matches!(&signals[0], Signal::Prefill(p) if !p.prefix.is_empty()));
    assert_eq!(host.metric(Metric::ExternalRecorded), 3);
}

#[test]
fn a_pick_of_a_warming_pod_is_recorded_too_and_its_outcome_names_it() {
    // the other router does not know prewarm's warm-up: the request went there all the same
    let host = FakeHost::new();
    let worker = Worker::new(external());
    let mut t = three_pods();
    t.warming = table(&[("p4", "127.0.0.1:1004", &[])]).pods;
    worker.table.install(7, t);
    let (_, mut flow) = send_flow(
        &host,
        &worker,
        "/v1/chat/completions",
        &[(HEADER, b"127.0.0.1:1004")],
        &chat_body("m", &template(), "q"),
    );
    host.set_response_headers(&[(":status", b"200")]);
    flow.on_response_headers(&host);
    host.set_response_chunk(b"{}");
    flow.on_response_body(&host, &worker, 2, true);
    flow.on_log(&host, &worker);
    worker.outcomes.flush(&host);
    let outcome = worker.outcomes.take(&host).records.pop().unwrap();
    assert_eq!(outcome.pod.as_deref(), Some("p4"));
    assert_eq!(host.metric(Metric::ExternalRecorded), 1);
    let served = served_in_next_batch(&host, &worker);
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].pod, "p4");
}

#[test]
fn a_pick_that_names_no_pod_of_the_table_is_ignored_counted_and_left_as_set() {
    let huge = vec![b'9'; MAX_EXTERNAL_ENDPOINT_BYTES + 1];
    let cases: [(Option<&[u8]>, Metric); 6] = [
        (Some(b"10.9.9.9:1"), Metric::ExternalUnknownPod),
        (Some(b"127.0.0.1:1001x"), Metric::ExternalUnknownPod),
        (Some(b"\xff\xfe127.0.0.1:1001"), Metric::ExternalMalformed),
        (Some(b" ,127.0.0.1:1001"), Metric::ExternalMalformed),
        (Some(&huge), Metric::ExternalMalformed),
        (None, Metric::ExternalAbsent),
    ];
    for (value, counted) in cases {
        let host = FakeHost::new();
        let worker = Worker::new(external());
        worker.table.install(7, three_pods());
        let extra: Vec<(&str, &[u8])> = value.map(|v| (HEADER, v)).into_iter().collect();
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &extra,
            &chat_body("m", &template(), &question("q")),
        );
        assert_eq!(host.metric(counted), 1, "{counted:?}");
        assert_eq!(host.metric(Metric::ExternalRecorded), 0);
        assert_eq!(
            host.header(HEADER).as_deref(),
            value,
            "never removed or set"
        );
        assert!(
            !host
                .shared_keys()
                .iter()
                .any(|k| k.starts_with("prewarm/px/")),
            "no prefix-index write"
        );
        assert_eq!(host.metric(Metric::ServedEnqueued), 0);
        assert_eq!(host.metric(Metric::RequestsInspected), 1, "still observed");
    }
    // no table yet (the gateway not reached): nothing to match the address against
    let host = FakeHost::new();
    let worker = Worker::new(external());
    send(
        &host,
        &worker,
        "/v1/chat/completions",
        &[(HEADER, b"127.0.0.1:1001")],
        &chat_body("m", &template(), "q"),
    );
    assert_eq!(host.metric(Metric::ExternalNoTable), 1);
    assert_eq!(host.header(HEADER), Some(b"127.0.0.1:1001".to_vec()));
}

#[test]
fn external_mode_leaves_requests_it_does_not_inspect_alone_but_still_strips_its_own_headers() {
    let host = FakeHost::new();
    let worker = Worker::new(external());
    worker.table.install(7, three_pods());
    host.set_request(
        &[
            (":method", b"GET"),
            (":path", b"/v1/models"),
            (HEADER, b"127.0.0.1:1002"),
            ("x-prewarm-direct-host", b"127.0.0.1:1003"),
            ("x-prewarm-arm", b"exp/warm"),
        ],
        b"",
    );
    assert_eq!(
        RequestFlow::default().on_headers(&host, &worker, true),
        Verdict::Continue
    );
    assert_eq!(host.header(HEADER), Some(b"127.0.0.1:1002".to_vec()));
    // only the filter's direct calls name a direct pod, only the filter assigns arms
    assert_eq!(host.header("x-prewarm-direct-host"), None);
    assert_eq!(host.header("x-prewarm-arm"), None);
    assert_eq!(host.metric(Metric::ExternalRecorded), 0);
    assert_eq!(host.metric(Metric::ExternalAbsent), 0);
}

#[test]
fn prewarm_mode_strips_a_client_header_with_routing_on_or_off() {
    for routing in [true, false] {
        let host = FakeHost::new();
        let worker = Worker::new(FilterConfig {
            routing: RoutingConfig {
                enabled: routing,
                ..RoutingConfig::default()
            },
            ..FilterConfig::default()
        });
        // no table: the filter routes nothing, so whatever reaches the pod is the client's
        send(
            &host,
            &worker,
            "/v1/chat/completions",
            &[(HEADER, b"127.0.0.1:1002")],
            &chat_body("m", &template(), &question("q")),
        );
        assert_eq!(host.header(HEADER), None, "routing {routing}");
        host.set_request(
            &[
                (":method", b"GET"),
                (":path", b"/v1/models"),
                (HEADER, b"127.0.0.1:1002"),
            ],
            b"",
        );
        RequestFlow::default().on_headers(&host, &worker, true);
        assert_eq!(host.header(HEADER), None, "routing {routing}");
        assert_eq!(host.metric(Metric::ExternalRecorded), 0);
        assert_eq!(host.metric(Metric::ExternalAbsent), 0);
    }
}
