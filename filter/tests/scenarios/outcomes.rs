//! Native scenario tests of outcome records: what the filter records of a request's response,
//! and that the records reach the gateway in the next batch.

use prewarm_core::experiment::{Arm, ArmSettings, Experiment};
use prewarm_core::wire::{OutcomeRecord, SignalBatch};
use prewarm_core::{canonical_prompt, parse_request, BlockChain, Endpoint};

use prewarm_filter::config::{FilterConfig, SignalsConfig};
use prewarm_filter::host::fake::FakeHost;
use prewarm_filter::host::{Host, Metric};
use prewarm_filter::worker::Worker;

use crate::requests::{chat_body, send_flow, table, template, with_one_pod_table};

/// Sends a chat request as `user` at `t0`; its response starts `ttfb` ms later with `status`
/// and `chunks` of body (none: a body-less reply); the stream ends. Returns the flow's record.
fn exchange(
    host: &FakeHost,
    worker: &Worker,
    stream: bool,
    status: &str,
    chunks: &[&str],
    ttfb: u64,
) -> Option<OutcomeRecord> {
    let t0 = host.now_ms();
    let mut body: serde_json::Value =
        serde_json::from_slice(&chat_body("m", &template(), "q")).unwrap();
    body["stream"] = serde_json::json!(stream);
    let body = serde_json::to_vec(&body).unwrap();
    let user: &[(&str, &[u8])] = &[("x-prewarm-user", b"alice")];
    let (_, mut flow) = send_flow(host, worker, "/v1/chat/completions", user, &body);
    host.set_now(t0 + ttfb);
    host.set_response_headers(&[(":status", status.as_bytes())]);
    flow.on_response_headers(host);
    for (i, c) in chunks.iter().enumerate() {
        host.set_now(t0 + ttfb + 10 * (i as u64 + 1));
        host.set_response_chunk(c.as_bytes());
        flow.on_response_body(host, worker, c.len(), i + 1 == chunks.len());
    }
    flow.on_log(host, worker);
    // what the root tick does: this VM's records into the ring, then the batch's take
    worker.outcomes.flush(host);
    worker.outcomes.take(host).records.pop()
}

fn experiment_worker() -> Worker {
    let worker = Worker::new(FilterConfig::default());
    let mut t = table(&[("p1", "127.0.0.1:1001", &[])]);
    t.experiment = Some(Experiment {
        id: "exp".into(),
        unit: Default::default(),
        arms: vec![
            Arm {
                name: "only".into(),
                weight: 1.0,
                settings: ArmSettings::default(),
            },
            Arm {
                name: "none".into(),
                weight: 0.0,
                settings: ArmSettings::default(),
            },
        ],
        release: None,
    });
    worker.table.install(7, t);
    worker
}

#[test]
fn an_answer_is_recorded_with_its_arm_pod_time_to_first_byte_status_and_usage() {
    let host = FakeHost::new();
    let worker = experiment_worker();
    let usage = r#"{"choices":[],"usage":{"prompt_tokens":651,"prompt_tokens_details":{"cached_tokens":640}}}"#;
    let (first, second) = usage.split_at(40);
    let record = exchange(&host, &worker, false, "200", &[first, second], 120).unwrap();
    assert_eq!(
        record,
        OutcomeRecord {
            arm: Some("exp/only".into()),
            pod: Some("p1".into()),
            model: Some("m".into()),
            at_ms: 1_000_000,
            ttfb_ms: 130,
            status: 200,
            stream: false,
            prompt_tokens: Some(651),
            cached_tokens: Some(640),
            prefix: record.prefix,
        },
        "time to the first body byte; usage across chunks"
    );
    assert_eq!(record.problem(), None);
    assert_eq!(host.metric(Metric::OutcomesEnqueued), 1);
}

/// The record's prefix is the prompt's routing key, the same in every request that shares
/// the prompt's first shard: the identity the gateway counts a pod's first requests by.
#[test]
fn a_record_carries_its_prompts_routing_key() {
    let host = FakeHost::new();
    let worker = experiment_worker();
    let record = exchange(&host, &worker, false, "200", &["{}"], 10).unwrap();
    let body = chat_body("m", &template(), "q");
    let request = parse_request(Endpoint::ChatCompletions, &body, usize::MAX).unwrap();
    let chain = BlockChain::of(
        "m",
        canonical_prompt(&request).as_bytes(),
        &worker.fingerprint,
    );
    assert!(chain.routing_key(&worker.fingerprint).is_some());
    assert_eq!(record.prefix, chain.routing_key(&worker.fingerprint));
    let again = exchange(&host, &worker, true, "200", &["{}"], 20).unwrap();
    assert_eq!(again.prefix, record.prefix, "same prompt, same prefix");
}

#[test]
fn a_reply_without_a_body_or_usage_is_recorded_with_what_it_has() {
    let host = FakeHost::new();
    let worker = experiment_worker();
    let record = exchange(&host, &worker, true, "503", &[], 40).unwrap();
    assert_eq!(
        (record.status, record.ttfb_ms, record.stream),
        (503, 40, true)
    );
    assert_eq!((record.prompt_tokens, record.cached_tokens), (None, None));
    let sse = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: [DONE]\n\n",
    ];
    let record = exchange(&host, &worker, true, "200", &sse, 25).unwrap();
    assert_eq!((record.ttfb_ms, record.prompt_tokens), (35, None));
}

#[test]
fn a_stream_reset_before_any_response_records_nothing() {
    let host = FakeHost::new();
    let worker = experiment_worker();
    let body = chat_body("m", &template(), "q");
    let (_, mut flow) = send_flow(&host, &worker, "/v1/chat/completions", &[], &body);
    flow.on_log(&host, &worker);
    assert!(worker.outcomes.take(&host).records.is_empty());
}

#[test]
fn outcomes_are_off_when_configured_so() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig {
        signals: SignalsConfig {
            outcomes: false,
            ..SignalsConfig::default()
        },
        ..FilterConfig::default()
    });
    assert_eq!(exchange(&host, &worker, false, "200", &["{}"], 5), None);
}

#[test]
fn outcomes_travel_in_the_next_batch() {
    let host = FakeHost::new();
    let worker = Worker::new(FilterConfig::default());
    let mut root = with_one_pod_table(&host, &worker);
    let record = exchange(&host, &worker, false, "200", &["{}"], 5);
    worker.outcomes.enqueue(&host, record.into_iter().collect());
    host.set_now(host.now_ms() + 2_000);
    root.on_tick(&host, &worker);
    let post = host
        .take_calls()
        .into_iter()
        .find(|c| c.headers.contains(&(":path".into(), "/v1/signals".into())))
        .expect("a batch with the outcome");
    let batch = SignalBatch::decode(&post.body).unwrap();
    assert_eq!(batch.outcomes.len(), 1);
    assert_eq!(
        (
            batch.outcomes[0].arm.as_ref(),
            batch.outcomes[0].pod.as_deref()
        ),
        (None, Some("p1")),
        "outside an experiment: no arm"
    );
}
