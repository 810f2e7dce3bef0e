//! Host calls a routed chat request makes (headers, body, the pod's answer, its end), by kind
//! and body size: printed (run with
//! `--nocapture`) and bounded. Each host call takes Envoy's shared-data lock or crosses the
//! VM boundary, so the request path's count must not grow with the prompt.

use prewarm_filter::config::{FilterConfig, RequestsConfig};
use prewarm_filter::host::fake::{FakeHost, HostCalls};
use prewarm_filter::host::Metric;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, send_flow, with_one_pod_table};

/// A system prompt of about `bytes` bytes, distinct per `tag`.
fn system_prompt(tag: &str, bytes: usize) -> String {
    let mut out = String::new();
    let mut i = 0u64;
    while out.len() < bytes {
        out.push_str(&format!(
            "{tag} rule {i} of the handbook says answer politely. "
        ));
        i += 1;
    }
    out
}

/// The next turn of the conversation whose first question is `first question?`: the same
/// prompt, gone on.
fn next_turn() -> String {
    format!("first question?{}", " and then?".repeat(80))
}

fn routed_request(host: &FakeHost, worker: &Worker, system: &str, question: &str) -> HostCalls {
    routed_request_of(host, worker, b"alice", system, question)
}

fn routed_request_of(
    host: &FakeHost,
    worker: &Worker,
    user: &[u8],
    system: &str,
    question: &str,
) -> HostCalls {
    host.take_host_calls();
    let routed = host.metric(Metric::Routed);
    let (_, mut flow) = send_flow(
        host,
        worker,
        "/v1/chat/completions",
        &[("x-prewarm-user", user)],
        &chat_body("m", system, question),
    );
    // the pod's answer and the request's end (its outcome record)
    host.set_response_headers(&[(":status", b"200")]);
    flow.on_response_headers(host);
    let answer = br#"{"choices":[{"finish_reason":"stop","message":{"content":"ok"}}]}"#;
    host.set_response_chunk(answer);
    flow.on_response_body(host, worker, answer.len(), true);
    flow.on_log(host, worker);
    let calls = host.take_host_calls();
    assert_eq!(
        host.metric(Metric::Routed),
        routed + 1,
        "the request was routed"
    );
    calls
}

fn line(label: &str, c: &HostCalls) -> String {
    format!(
        "{label:<28} total {:>4}  shared get {:>3}  shared set {:>3}  metric {:>3}  dispatch {:>2}  other {:>3}",
        c.total(),
        c.shared_get,
        c.shared_set,
        c.metric,
        c.dispatch,
        c.other
    )
}

#[test]
fn a_routed_requests_host_calls_stay_bounded_whatever_the_prompts_length() {
    let mut report = Vec::new();
    let mut all = Vec::new();
    for kb in [2usize, 16, 64, 128] {
        let host = FakeHost::new();
        let worker = Worker::new(FilterConfig::default());
        with_one_pod_table(&host, &worker);
        let system = system_prompt(&format!("s{kb}"), kb * 1024);
        let first = routed_request(&host, &worker, &system, "first question?");
        let next = routed_request(&host, &worker, &system, &next_turn());
        // another user (so no streak completes), the same prompt
        let again = routed_request_of(&host, &worker, b"bob", &system, &next_turn());
        report.push(line(&format!("{kb} KB, first"), &first));
        report.push(line(&format!("{kb} KB, next turn"), &next));
        report.push(line(&format!("{kb} KB, again, same tick"), &again));
        // the VM read every slot of this prompt this tick already (`prefix_reads`)
        assert!(again.shared_get < next.shared_get, "{again:?} {next:?}");
        all.extend([first, next, again]);
    }
    println!(
        "host calls of a routed chat request:\n{}",
        report.join("\n")
    );
    // The prefix index's writes and the served and outcome records wait for the tick; the
    // index's lookups are core's binary searches: at most 7 + 4 reads for the longest match and
    // 7 for the common shards, whatever the length. The rest is constant: the table's
    // generation, the user's pattern (a read and a compare-and-swap write) and the metrics
    // (seen, inspected, routed, matched).
    for c in all {
        assert!(c.shared_set <= 1, "{c:?}");
        assert!(c.shared_get <= 2 + 7 + 4 + 7, "{c:?}");
        assert!(c.metric <= 4, "{c:?}");
    }
}

/// The writes a request left for the tick reach shared data there: another worker routes the
/// prefix's next turn to the same pod after the first worker's tick.
#[test]
fn a_requests_index_writes_reach_other_workers_on_the_tick() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut root = with_one_pod_table(&host, &worker);
    let system = system_prompt("t", 16 * 1024);
    routed_request(&host, &worker, &system, "first question?");
    assert!(!worker.prefix_pending.is_empty());
    let before = host
        .shared_keys()
        .iter()
        .filter(|k| k.contains("/px/"))
        .count();
    host.take_host_calls();
    root.on_tick(&host, &worker);
    assert!(worker.prefix_pending.is_empty());
    let after = host
        .shared_keys()
        .iter()
        .filter(|k| k.contains("/px/"))
        .count();
    assert!(after > before, "{before} -> {after}");
    let other_host = host.sibling();
    let other = Worker::new(FilterConfig::default());
    routed_request(&other_host, &other, &system, &next_turn());
    assert_eq!(other_host.metric(Metric::RoutedByPrefix), 1);
}

/// `make bench-filter`'s stage ladder: each `bench_stop_after` stage does the path up to it and
/// no more — the body unread at `headers`, unparsed at `body`, no user pattern before
/// `observe`, and nothing routed before the whole path.
#[test]
fn a_stage_ladder_proxy_stops_each_request_after_its_stage() {
    use prewarm_filter::config::Stage;
    let body = chat_body("m", &system_prompt("ladder", 2048), "first question?");
    let user: &[(&str, &[u8])] = &[("x-prewarm-user", b"alice")];
    for stop in [
        Some(Stage::Headers),
        Some(Stage::Body),
        Some(Stage::Parse),
        Some(Stage::Fingerprint),
        Some(Stage::Observe),
        None,
    ] {
        let host = FakeHost::new();
        let worker = Worker::new(FilterConfig {
            requests: RequestsConfig {
                bench_stop_after: stop,
                ..RequestsConfig::default()
            },
            ..FilterConfig::default()
        });
        with_one_pod_table(&host, &worker);
        let reads = host.body_reads();
        send_flow(&host, &worker, "/v1/chat/completions", user, &body);
        let past = |stage: Stage| stop.is_none_or(|s| s > stage);
        let read = host.body_reads() > reads;
        let inspected = host.metric(Metric::RequestsInspected) > 0;
        let observed = host.shared_keys().iter().any(|k| k.contains("/user/"));
        let routed = host.metric(Metric::Routed) > 0;
        assert_eq!(read, past(Stage::Headers), "{stop:?}: body read");
        assert_eq!(inspected, past(Stage::Parse), "{stop:?}: parsed");
        assert_eq!(observed, past(Stage::Fingerprint), "{stop:?}: observed");
        assert_eq!(routed, stop.is_none(), "{stop:?}: routed");
    }
}

/// A worker reads an index slot from shared data once a tick: within the tick a prompt's slots
/// come from what the worker read already; after its tick they are read again, so another
/// worker's writes of its last tick are seen.
#[test]
fn a_workers_index_reads_are_kept_until_its_next_tick() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut root = with_one_pod_table(&host, &worker);
    let system = system_prompt("r", 4 * 1024);
    let question = "first question?";
    let first = routed_request_of(&host, &worker, b"u1", &system, question);
    let same_tick = routed_request_of(&host, &worker, b"u2", &system, question);
    root.on_tick(&host, &worker);
    let next_tick = routed_request_of(&host, &worker, b"u3", &system, question);
    // the table's generation and the user's pattern, and no index slot
    assert_eq!(same_tick.shared_get, 2, "{same_tick:?}");
    assert!(first.shared_get > 2, "{first:?}");
    assert!(next_tick.shared_get > 2, "{next_tick:?}");
}

/// What a new prompt costs in all, its share of the tick included: `n` requests, each a new
/// question behind one system prompt (an application's traffic), then the tick that writes
/// their index keys and records. Printed (with `--nocapture`) beside the request path's count.
#[test]
fn a_new_prompts_host_calls_with_its_share_of_the_tick() {
    let n = 100u64;
    let mut report = Vec::new();
    for kb in [2usize, 16, 64, 128] {
        let host = FakeHost::new();
        let worker = Worker::new(FilterConfig::default());
        let mut root = with_one_pod_table(&host, &worker);
        let system = system_prompt(&format!("n{kb}"), kb * 512);
        let tail = "q".repeat(kb * 512);
        host.take_host_calls();
        let mut path = HostCalls::default();
        for i in 0..n {
            let c = routed_request(&host, &worker, &system, &format!("{i:010} {tail}"));
            path.shared_get += c.shared_get;
            path.shared_set += c.shared_set;
            path.metric += c.metric;
        }
        host.take_host_calls();
        root.on_tick(&host, &worker);
        let tick = host.take_host_calls();
        let per = |x: u64| x as f64 / n as f64;
        report.push(format!(
            "{kb:>3} KB: request path {:.1} shared get + set + metric, tick's share {:.1} (get {:.1}, set {:.1})",
            per(path.shared_get + path.shared_set + path.metric),
            per(tick.shared_get + tick.shared_set + tick.metric),
            per(tick.shared_get),
            per(tick.shared_set),
        ));
        // the tick writes each new prompt's index keys (a read and a write a touched slot) and
        // its records: bounded by the keys a prompt has, not by how many requests came
        assert!(tick.shared_set >= n, "{tick:?}");
    }
    println!(
        "host calls of a new prompt, {n} a tick:\n{}",
        report.join("\n")
    );
}
