//! A small run's records and fleet observations for the tests.

use prewarm_gateway::policy::Tier;

use super::figures::FleetObservations;
use crate::record::Record;

/// A request at `arrival_s` served by `pod` (`None`: failed).
pub fn record(request: usize, arrival_s: f64, pod: Option<&str>, ttft_ms: f64) -> Record {
    Record {
        request,
        arrival_s,
        user: format!("group-{}", request % 4),
        group: None,
        adapter: Some("sg-1".into()),
        tenant: Some("sg-1".into()),
        tier: Some(Tier::Gold),
        pod: pod.map(str::to_string),
        pod_new_since_s: (pod == Some("new")).then_some(600.0),
        ttft_ms: pod.map(|_| ttft_ms),
        prompt_tokens: 1000,
        cached_tokens: if pod == Some("new") { 500 } else { 900 },
        shared_tokens: None,
        adapter_hit: pod.map(|_| request.is_multiple_of(2)),
        first_hot_at_join: false,
        error: pod.is_none().then(|| "HTTP 503".into()),
    }
}

/// Seven requests: four on the old pod, two on the new one (the second first hot at the join,
/// with 800 tokens of system prompt and tools), one failed.
pub fn fixture() -> Vec<Record> {
    let mut records = vec![
        record(0, 100.0, Some("old"), 100.0),
        record(1, 400.0, Some("old"), 200.0),
        record(2, 500.0, Some("old"), 300.0),
        record(3, 610.0, Some("new"), 1000.0),
        record(4, 620.0, Some("new"), 3000.0),
        record(5, 700.0, Some("old"), 400.0),
        record(6, 800.0, None, 0.0),
    ];
    records[4].first_hot_at_join = true;
    records[4].shared_tokens = Some(800);
    records
}

/// The new pod warmed 10 prefixes; the pods computed 7,000 uncached tokens.
pub fn fleet() -> FleetObservations {
    serde_json::from_str(
        r#"{"new_pod_warmup": {"phase": "done", "routable": true,
              "adapters": {"done": 1, "total": 2, "in_flight": 0},
              "first_tier": {"done": 7, "total": 7}, "second_tier": {"done": 3, "total": 5}},
            "gateway_prefills": 12,
            "pods": [{"pod": "old", "prefix_cache_queries": 9000, "prefix_cache_hits": 4000},
                     {"pod": "new", "prefix_cache_queries": 3000, "prefix_cache_hits": 1000}]}"#,
    )
    .unwrap()
}
