//! The routing table delivered as deltas: the root polls `GET /v1/routing?since=<generation>`,
//! applies a delta onto exactly the generation it holds, publishes the result to every worker,
//! and refetches the whole table (counted) when a delta does not apply.

use prewarm_core::table_delta::{diff, TableDelta};
use prewarm_core::wire::{RoutedPod, RoutingTable};

use prewarm_filter::config::FilterConfig;
use prewarm_filter::host::fake::{FakeHost, RecordedCall};
use prewarm_filter::host::Metric;
use prewarm_filter::root::RootTasks;
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, send, template};

fn pods(loads: &[f64]) -> Vec<RoutedPod> {
    loads
        .iter()
        .enumerate()
        .map(|(i, l)| RoutedPod {
            load: Some(*l),
            ..RoutedPod::new(&format!("p{i}"), &format!("127.0.0.{}:1", i + 1), &[])
        })
        .collect()
}

fn table(generation: u64, loads: &[f64]) -> RoutingTable {
    RoutingTable {
        load_factor: Some(1.25),
        ..RoutingTable::of_pods(generation, 64, pods(loads))
    }
}

fn path(call: &RecordedCall) -> String {
    call.headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// The next tick's table poll (2 s on, past the poll lease).
fn poll(host: &FakeHost, worker: &Worker, root: &mut RootTasks) -> RecordedCall {
    use prewarm_filter::host::Host;
    host.set_now(host.now_ms() + 2_000);
    root.on_tick(host, worker);
    host.take_calls()
        .into_iter()
        .find(|c| path(c).starts_with("/v1/routing"))
        .expect("a table poll")
}

fn reply(host: &FakeHost, worker: &Worker, root: &mut RootTasks, call: &RecordedCall, body: &[u8]) {
    host.set_reply(Some(200), body);
    root.on_call_response(host, worker, call.token, body.len());
}

/// A root that adopted `first` whole.
fn holding(host: &FakeHost, worker: &Worker, first: &RoutingTable) -> RootTasks {
    let mut root = RootTasks::default();
    let get = poll(host, worker, &mut root);
    assert_eq!(path(&get), "/v1/routing", "no table held: the whole table");
    reply(host, worker, &mut root, &get, &first.encode());
    assert_eq!(worker.table.generation(), Some(first.generation));
    root
}

#[test]
fn a_delta_onto_the_held_generation_is_applied_and_published() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let first = table(7, &[0.1, 0.2, 0.3]);
    let mut root = holding(&host, &worker, &first);
    let get = poll(&host, &worker, &mut root);
    assert_eq!(path(&get), "/v1/routing?since=7");
    assert!(get
        .headers
        .contains(&("if-none-match".into(), "\"7\"".into())));
    // one pod's load moves, one pod joins
    let mut next = table(9, &[0.1, 0.9, 0.3]);
    next.pods
        .push(RoutedPod::new("p9", "127.0.0.9:1", &["lora"]));
    let delta = diff(&first, &next).unwrap();
    assert!(delta.encode().len() < next.encode().len());
    reply(&host, &worker, &mut root, &get, &delta.encode());
    assert_eq!(host.metric(Metric::TableDeltas), 1);
    assert_eq!(host.metric(Metric::TableFetchFailures), 0);
    assert_eq!(worker.table.generation(), Some(9));
    assert_eq!(worker.table.table().as_deref(), Some(&next));
    // the other workers adopt the whole result from shared data
    let other_host = host.sibling();
    let other = Worker::new(FilterConfig::default());
    RootTasks::default().on_tick(&other_host, &other);
    assert_eq!(other.table.table().as_deref(), Some(&next));
    // and route with it: an adapter only the new pod lists goes there
    send(
        &other_host,
        &other,
        "/v1/chat/completions",
        &[],
        &chat_body("lora", &template(), "q"),
    );
    let endpoint = other_host.header("x-gateway-destination-endpoint").unwrap();
    assert!(
        endpoint.starts_with(b"127.0.0.9:1,"),
        "{}",
        String::from_utf8_lossy(&endpoint)
    );
    // the next poll asks from the new generation
    assert_eq!(
        path(&poll(&host, &worker, &mut root)),
        "/v1/routing?since=9"
    );
}

#[test]
fn a_delta_on_another_base_is_refused_counted_and_the_whole_table_fetched() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let first = table(7, &[0.1, 0.2]);
    let mut root = holding(&host, &worker, &first);
    let get = poll(&host, &worker, &mut root);
    // a delta from generation 6, which this proxy does not hold
    let six = table(6, &[0.5, 0.5]);
    let next = table(8, &[0.1, 0.7]);
    let wrong: TableDelta = diff(&six, &next).unwrap();
    reply(&host, &worker, &mut root, &get, &wrong.encode());
    assert_eq!(host.metric(Metric::TableDeltaWrongBase), 1);
    assert_eq!(host.metric(Metric::TableDeltas), 0);
    assert_eq!(
        worker.table.table().as_deref(),
        Some(&first),
        "kept as it was"
    );
    // at once, without waiting for the next tick: the whole table, unconditionally
    let refetch = host.take_calls().pop().expect("a whole refetch");
    assert_eq!(path(&refetch), "/v1/routing");
    assert!(!refetch.headers.iter().any(|(k, _)| k == "if-none-match"));
    assert_eq!(host.metric(Metric::TableFetches), 3);
    reply(&host, &worker, &mut root, &refetch, &next.encode());
    assert_eq!(worker.table.table().as_deref(), Some(&next));
    // a delta answering a whole fetch is not retried again (no loop)
    let again = diff(&six, &next).unwrap();
    let mut root2 = RootTasks::default();
    let fresh_host = FakeHost::new();
    let fresh = Worker::new(FilterConfig::default());
    let get = poll(&fresh_host, &fresh, &mut root2);
    assert_eq!(path(&get), "/v1/routing");
    reply(&fresh_host, &fresh, &mut root2, &get, &again.encode());
    assert_eq!(fresh_host.metric(Metric::TableDeltaWrongBase), 1);
    assert!(fresh_host.take_calls().is_empty());
    assert_eq!(fresh.table.generation(), None);
}

#[test]
fn a_delta_that_does_not_fit_its_base_is_refused_and_the_whole_table_fetched() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let first = table(7, &[0.1, 0.2]);
    let mut root = holding(&host, &worker, &first);
    let get = poll(&host, &worker, &mut root);
    // a patch for a pod the table does not have, and a removal of another
    let body = br#"{"version":"1.0","base":7,"generation":8,"removed":["zz"],"loads":[{"id":"p5","load":0.5}]}"#;
    reply(&host, &worker, &mut root, &get, body);
    assert_eq!(host.metric(Metric::TableDeltaInvalid), 1);
    assert_eq!(worker.table.table().as_deref(), Some(&first));
    let refetch = host.take_calls().pop().expect("a whole refetch");
    assert_eq!(path(&refetch), "/v1/routing");
    reply(&host, &worker, &mut root, &refetch, &first.encode());
    // a delta that is not JSON at all is a failed fetch, as garbage always was
    let get = poll(&host, &worker, &mut root);
    reply(
        &host,
        &worker,
        &mut root,
        &get,
        br#"{"base":7,"generation":"#,
    );
    assert_eq!(host.metric(Metric::TableFetchFailures), 1);
    assert_eq!(worker.table.table().as_deref(), Some(&first));
}
