//! The embedding cache through the request glue, against the host double: what a client gets
//! on a hit, what is stored from a pod's response, and every way a request or response is left
//! alone.

use prewarm_filter::config::{EmbeddingCacheConfig, EmbeddingsConfig, FilterConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::Metric;
use prewarm_filter::request::{RequestFlow, Verdict};
use prewarm_filter::worker::Worker;

fn worker() -> Worker {
    Worker::new(FilterConfig {
        embeddings: EmbeddingsConfig {
            cache: EmbeddingCacheConfig {
                models: vec!["minilm".into()],
                ..EmbeddingCacheConfig::default()
            },
        },
        ..FilterConfig::default()
    })
}

/// One request's body through the flow (headers, then the whole body); the flow and the
/// verdict of its end.
fn request(host: &FakeHost, worker: &Worker, body: &str) -> (RequestFlow, Verdict) {
    let len = body.len().to_string();
    host.set_request(
        &[
            (":method", b"POST"),
            (":path", b"/v1/embeddings"),
            ("content-length", len.as_bytes()),
        ],
        body.as_bytes(),
    );
    let mut flow = RequestFlow::default();
    assert_eq!(flow.on_headers(host, worker, false), Verdict::Pause);
    let end = flow.on_body(host, worker, body.len(), true);
    (flow, end)
}

/// The pod's response to `flow`, in chunks of `chunk` bytes.
fn respond(host: &FakeHost, worker: &Worker, flow: &mut RequestFlow, status: &str, body: &str) {
    host.set_response_headers(&[(":status", status.as_bytes())]);
    flow.on_response_headers(host);
    let chunks: Vec<&[u8]> = body.as_bytes().chunks(7).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        host.set_response_chunk(chunk);
        flow.on_response_body(host, worker, chunk.len(), i + 1 == chunks.len());
    }
}

fn pod_response(vectors: &[&str]) -> String {
    let data: Vec<String> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| format!(r#"{{"object":"embedding","index":{i},"embedding":{v}}}"#))
        .collect();
    format!(
        r#"{{"id":"e1","object":"list","model":"minilm","data":[{}],"usage":{{"prompt_tokens":4,"total_tokens":4}}}}"#,
        data.join(",")
    )
}

const ONE: &str = r#"{"model":"minilm","input":"the same chunk"}"#;

#[test]
fn a_repeated_input_is_answered_with_the_pods_bytes_and_never_reaches_the_pod() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, end) = request(&host, &w, ONE);
    assert_eq!(end, Verdict::Continue, "a miss goes to the pod");
    respond(
        &host,
        &w,
        &mut flow,
        "200",
        &pod_response(&["[0.25,-1e-7,3.0]"]),
    );
    assert_eq!(host.metric(Metric::EmbeddingStored), 1);

    let (_, end) = request(&host, &w, ONE);
    assert_eq!(end, Verdict::Pause, "answered by the filter");
    let replies = host.local_replies.borrow();
    let reply = replies.first().expect("a local reply");
    assert_eq!(reply.status, 200);
    assert!(reply
        .headers
        .iter()
        .any(|(k, v)| k == "x-prewarm-cache" && v == b"hit"));
    let body = String::from_utf8(reply.body.clone()).unwrap_or_default();
    assert!(body.contains(r#""embedding":[0.25,-1e-7,3.0]}"#), "{body}");
    assert_eq!(host.metric(Metric::EmbeddingHits), 1);
    assert_eq!(host.metric(Metric::EmbeddingMisses), 1);
}

#[test]
fn a_batch_hits_only_when_every_input_was_seen() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, _) = request(&host, &w, r#"{"model":"minilm","input":["a","b"]}"#);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]", "[2]"]));
    let (_, end) = request(&host, &w, r#"{"model":"minilm","input":["b","c"]}"#);
    assert_eq!(end, Verdict::Continue, "c was never seen");
    let (_, end) = request(&host, &w, r#"{"model":"minilm","input":["b","a"]}"#);
    assert_eq!(end, Verdict::Pause);
    let replies = host.local_replies.borrow();
    let body = String::from_utf8(replies[0].body.clone()).unwrap_or_default();
    let b = body.find(r#""index":0,"object":"embedding","embedding":[2]"#);
    let a = body.find(r#""index":1,"object":"embedding","embedding":[1]"#);
    assert!(b.is_some() && a.is_some(), "in the request's order: {body}");
}

#[test]
fn a_model_not_opted_in_or_a_changed_parameter_is_never_answered() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]"]));
    for other in [
        r#"{"model":"other","input":"the same chunk"}"#,
        r#"{"model":"minilm","input":"the same chunk","dimensions":64}"#,
        r#"{"model":"minilm","input":"the same chunk","encoding_format":"base64"}"#,
    ] {
        let len = other.len().to_string();
        host.set_request(
            &[
                (":method", b"POST"),
                (":path", b"/v1/embeddings"),
                ("content-length", len.as_bytes()),
            ],
            other.as_bytes(),
        );
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &w, false);
        assert_eq!(
            flow.on_body(&host, &w, other.len(), true),
            Verdict::Continue,
            "{other}"
        );
    }
    assert!(host.local_replies.borrow().is_empty());
}

#[test]
fn failed_encoded_or_unparsable_responses_are_not_stored() {
    let host = FakeHost::new();
    let w = worker();
    for (status, body) in [
        ("500", pod_response(&["[1]"])),
        ("200", r#"{"error":"overloaded"}"#.to_string()),
        ("200", "not json".to_string()),
        ("200", pod_response(&["[1]", "[2]"])),
    ] {
        let (mut flow, _) = request(&host, &w, ONE);
        respond(&host, &w, &mut flow, status, &body);
    }
    let (mut flow, _) = request(&host, &w, ONE);
    host.set_response_headers(&[(":status", b"200"), ("content-encoding", b"gzip")]);
    flow.on_response_headers(&host);
    host.set_response_chunk(pod_response(&["[1]"]).as_bytes());
    flow.on_response_body(&host, &w, pod_response(&["[1]"]).len(), true);
    assert_eq!(host.metric(Metric::EmbeddingStored), 0);
    assert_eq!(host.metric(Metric::EmbeddingNotStored), 5);
    assert_eq!(request(&host, &w, ONE).1, Verdict::Continue);
}

#[test]
fn a_response_over_the_bound_is_passed_and_not_stored() {
    let host = FakeHost::new();
    let w = Worker::new(FilterConfig {
        embeddings: EmbeddingsConfig {
            cache: EmbeddingCacheConfig {
                models: vec!["minilm".into()],
                max_response_bytes: 256,
                ..EmbeddingCacheConfig::default()
            },
        },
        ..FilterConfig::default()
    });
    let big = format!("[{}]", vec!["0.125"; 100].join(","));
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&[&big]));
    assert_eq!(host.metric(Metric::EmbeddingStored), 0);
    assert_eq!(host.metric(Metric::EmbeddingNotStored), 1);
}

#[test]
fn malformed_or_unkeyable_bodies_go_to_the_pod_untouched() {
    let host = FakeHost::new();
    let w = worker();
    for body in [
        "{not json",
        r#"{"model":"minilm"}"#,
        r#"{"model":"minilm","input":[]}"#,
        r#"{"model":"minilm","input":{"x":1}}"#,
    ] {
        let (_, end) = request(&host, &w, body);
        assert_eq!(end, Verdict::Continue, "{body}");
    }
    assert!(host.local_replies.borrow().is_empty());
    assert!(host.header("x-gateway-destination-endpoint").is_none());
}

#[test]
fn a_refused_local_reply_forwards_the_request() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]"]));
    host.refuse_local_replies(true);
    assert_eq!(request(&host, &w, ONE).1, Verdict::Continue);
    assert_eq!(host.metric(Metric::EmbeddingReplyFailures), 1);
}

#[test]
fn an_entry_expires_after_its_ttl() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]"]));
    host.set_now(host.now_ms_for_tests() + 600_000);
    assert_eq!(request(&host, &w, ONE).1, Verdict::Continue);
}

/// Another Envoy worker: the same shared data, its own VM (and so its own cache).
fn sibling(host: &FakeHost, config: EmbeddingCacheConfig) -> (FakeHost, Worker) {
    let worker = Worker::new(FilterConfig {
        embeddings: EmbeddingsConfig { cache: config },
        ..FilterConfig::default()
    });
    (host.sibling(), worker)
}

fn cached(shared_slots: u32) -> EmbeddingCacheConfig {
    EmbeddingCacheConfig {
        models: vec!["minilm".into()],
        shared_slots,
        ..EmbeddingCacheConfig::default()
    }
}

#[test]
fn what_one_worker_stored_answers_the_other_workers_through_the_shared_level() {
    let host = FakeHost::new();
    let w = worker();
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[0.5,2]"]));
    let (other, ow) = sibling(&host, cached(1024));
    assert_eq!(
        request(&other, &ow, ONE).1,
        Verdict::Pause,
        "a hit on the other worker"
    );
    let body = String::from_utf8(other.local_replies.borrow()[0].body.clone()).unwrap_or_default();
    assert!(body.contains(r#""embedding":[0.5,2]}"#), "{body}");
    assert_eq!(other.metric(Metric::EmbeddingSharedHits), 1);
    // now in that worker's own cache: the next hit does not go to the shared level
    assert_eq!(request(&other, &ow, ONE).1, Verdict::Pause);
    assert_eq!(other.metric(Metric::EmbeddingSharedHits), 1);
    // the shared entry keeps the expiry the pod's answer gave it
    other.set_now(other.now_ms_for_tests() + 600_000);
    assert_eq!(request(&other, &ow, ONE).1, Verdict::Continue);
}

#[test]
fn without_shared_slots_each_worker_keeps_its_own() {
    let host = FakeHost::new();
    let w = Worker::new(FilterConfig {
        embeddings: EmbeddingsConfig { cache: cached(0) },
        ..FilterConfig::default()
    });
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]"]));
    assert!(host.shared_keys().iter().all(|k| !k.contains("emb/")));
    let (other, ow) = sibling(&host, cached(0));
    assert_eq!(request(&other, &ow, ONE).1, Verdict::Continue);
}

#[test]
fn another_input_in_the_same_slot_is_a_miss_not_a_wrong_answer() {
    let host = FakeHost::new();
    let w = Worker::new(FilterConfig {
        embeddings: EmbeddingsConfig { cache: cached(1) },
        ..FilterConfig::default()
    });
    let (mut flow, _) = request(&host, &w, ONE);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]"]));
    let two = r#"{"model":"minilm","input":"another chunk"}"#;
    let (mut flow, _) = request(&host, &w, two);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[2]"]));
    // one slot: the second entry replaced the first there
    let (other, ow) = sibling(&host, cached(1));
    assert_eq!(
        request(&other, &ow, ONE).1,
        Verdict::Continue,
        "slot holds another key"
    );
    assert_eq!(request(&other, &ow, two).1, Verdict::Pause);
}

/// The first call taken from `host` whose path starts with `prefix`.
fn take_call(host: &FakeHost, prefix: &str) -> prewarm_filter::host::fake::RecordedCall {
    host.take_calls()
        .into_iter()
        .find(|c| path_of(c).starts_with(prefix))
        .unwrap_or_else(|| panic!("a call to {prefix}"))
}

fn path_of(call: &prewarm_filter::host::fake::RecordedCall) -> String {
    call.headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

#[test]
fn a_stored_input_and_its_hits_are_reported_to_the_gateway_with_the_request_that_recomputes_it() {
    use prewarm_core::embed_cache::{key_hex, request_keys};
    use prewarm_core::wire::SignalBatch;

    let host = FakeHost::new();
    let w = worker();
    let two = r#"{"model":"minilm","input":["a","b"],"dimensions":8,"user":"u1"}"#;
    let (mut flow, _) = request(&host, &w, two);
    respond(&host, &w, &mut flow, "200", &pod_response(&["[1]", "[2]"]));
    request(&host, &w, two);
    request(
        &host,
        &w,
        r#"{"model":"minilm","input":"a","dimensions":8}"#,
    );
    let mut root = prewarm_filter::root::RootTasks::default();
    root.on_tick(&host, &w);
    let post = take_call(&host, "/v1/signals");
    let batch = SignalBatch::decode(&post.body).unwrap();
    let keys = request_keys(two.as_bytes()).unwrap().keys;
    let stored: Vec<_> = batch
        .embeddings
        .iter()
        .filter(|e| e.request.is_some())
        .collect();
    assert_eq!(stored.len(), 2);
    for (seen, key) in stored.iter().zip(&keys) {
        assert_eq!(seen.key, key_hex(key));
        assert_eq!(
            seen.problem(),
            None,
            "the request recomputes exactly this input"
        );
        assert!(
            !seen.request.as_deref().unwrap_or("").contains("u1"),
            "no user label"
        );
    }
    let hits: Vec<(String, u32)> = batch
        .embeddings
        .iter()
        .filter(|e| e.request.is_none())
        .map(|e| (e.key.clone(), e.hits))
        .collect();
    let mut expected = vec![(key_hex(&keys[0]), 2), (key_hex(&keys[1]), 1)];
    expected.sort();
    let mut hits = hits;
    hits.sort();
    assert_eq!(hits, expected);
}

#[test]
fn the_gateways_warm_entries_answer_a_proxy_that_never_saw_the_input() {
    use prewarm_core::embed_cache::{key_hex, request_keys};
    use prewarm_core::wire::{WarmEmbedding, WarmEmbeddings};

    let host = FakeHost::new();
    let w = worker();
    let mut root = prewarm_filter::root::RootTasks::default();
    root.on_tick(&host, &w);
    let poll = take_call(&host, "/v1/embeddings/warm");
    assert_eq!(path_of(&poll), "/v1/embeddings/warm?after=0");
    let key = request_keys(ONE.as_bytes()).unwrap().keys[0];
    let now = host.now_ms_for_tests();
    let entry = |key: String, embedding: &str| WarmEmbedding {
        key,
        expires_ms: now + 60_000,
        prompt_tokens: 3,
        embedding: embedding.into(),
    };
    let doc = WarmEmbeddings {
        version: "1.0".into(),
        generation: 7,
        more: true,
        entries: vec![
            entry(key_hex(&key), "[0.5,0.25]"),
            entry(key_hex(&[9; 32]), "[not json"),
            entry("zz".into(), "[1]"),
        ],
    };
    let body = doc.encode();
    host.set_reply(Some(200), &body);
    root.on_call_response(&host, &w, poll.token, body.len());
    assert_eq!(
        host.metric(Metric::EmbeddingWarmEntries),
        1,
        "only the valid entry"
    );
    // more waiting: the next poll at once, from the reply's generation
    let next = host.take_calls().pop().expect("the next poll");
    assert_eq!(path_of(&next), "/v1/embeddings/warm?after=7");
    // another worker (its own VM cache, empty) answers from the shared level
    let other = host.sibling();
    let w2 = worker();
    let (_, end) = request(&other, &w2, ONE);
    assert_eq!(end, Verdict::Pause, "answered by the filter");
    assert_eq!(other.metric(Metric::EmbeddingSharedHits), 1);
    let body = String::from_utf8(other.local_replies.borrow()[0].body.clone()).unwrap_or_default();
    assert!(body.contains(r#""embedding":[0.5,0.25]"#), "{body}");
    // a failed poll is counted and leaves the generation
    host.set_reply(Some(503), b"");
    root.on_call_response(&host, &w, next.token, 0);
    assert_eq!(host.metric(Metric::EmbeddingWarmFetchFailures), 1);
    host.set_now(now + 2_000);
    root.on_tick(&host, &w);
    assert!(host
        .take_calls()
        .iter()
        .any(|c| path_of(c) == "/v1/embeddings/warm?after=7"));
}

#[test]
fn a_failing_warm_poll_does_not_mark_the_gateway_down() {
    // an older gateway answers the warm poll 404; the table poll is still in flight
    let host = FakeHost::new();
    let w = worker();
    let mut root = prewarm_filter::root::RootTasks::default();
    root.on_tick(&host, &w);
    let warm = take_call(&host, "/v1/embeddings/warm");
    host.set_reply(Some(404), b"");
    root.on_call_response(&host, &w, warm.token, 0);
    assert_eq!(host.metric(Metric::EmbeddingWarmFetchFailures), 1);
    let later = host.now_ms_for_tests() + 60_000;
    assert!(
        !prewarm_filter::direct::gateway_health::is_down(&host, &w.keys, 5_000, later),
        "only the table and the signals say whether the gateway answers"
    );
}
