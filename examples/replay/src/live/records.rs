//! From what a live run measured to its [`Record`]s: which pod served each request and whether
//! that pod is new, times in model time, the adapter-load estimate, and the first requests on a
//! new pod of prefixes that were hot when it joined.
//!
//! - A pod is new when `--new-pods` lists it or it was first seen at or after `--scale-at`; its
//!   window starts at `--scale-at` (else when it was first seen). With `--pod-event POD@T` (a
//!   join or a restart of POD at trace second T, repeatable) a request's pod is new from the
//!   latest of its pod's events at or before the request's arrival.
//! - HTTP does not say whether a request's adapter had to be loaded. With `--profile` (the pods
//!   are podsim with that latency profile, or an engine measured to match it) a request is
//!   counted as having paid a disk load when its TTFT exceeds what its uncached tokens explain
//!   (`profile.prefill(prompt − cached)`) by at least half the profile's disk load for
//!   `--adapter-rank`; queueing can also cause such an excess, so this is an estimate.
//! - *First hot at join*: a new pod's first request of a prefix group (the application when the
//!   trace names one, else the `user`) within its
//!   window, when at least `--hot-requests` requests of that group arrived before the pod
//!   joined — the filter's streak, so the gateway had been told the prefix was hot. These are
//!   the requests a warm-up can serve warm; a group first sent after the join no warm-up knows.

use std::collections::{HashMap, HashSet};

use podsim::profile::LatencyProfile;

use super::stream::Measured;
use crate::assign::Assignment;
use crate::record::Record;
use crate::scenario::NEW_POD_WINDOW_S;
use crate::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// What a run sent and got back.
#[derive(Debug, Default)]
pub struct Measurements {
    /// (trace index, measured) of served requests.
    pub served: Vec<(usize, Measured)>,
    /// (trace index, error) of failed ones.
    pub failed: Vec<(usize, String)>,
}

/// How measured times and pods are read.
#[derive(Debug, Clone)]
pub struct Reading {
    /// Requests without a pod header are attributed to this (the target).
    pub target: String,
    /// Measured seconds are multiplied by this into the records' milliseconds (1, or the time
    /// scale for model time).
    pub time_factor: f64,
    pub new_pods: Vec<String>,
    pub scale_at: Option<f64>,
    /// Joins and restarts: (pod, trace second).
    pub events: Vec<(String, f64)>,
    pub hot_requests: usize,
    /// Profile and adapter rank of the adapter-load estimate.
    pub adapter_estimate: Option<(LatencyProfile, u32)>,
}

/// Whether a request that was served in `ttft_s` (model time) with `uncached` prompt tokens
/// found its adapter loaded; see the module docs.
pub fn adapter_loaded(profile: &LatencyProfile, rank: u32, ttft_s: f64, uncached: u64) -> bool {
    let excess = ttft_s - profile.prefill(uncached as usize);
    excess < profile.adapter_load(rank) / 2.0
}

/// Tokens of `request`'s system prompt and tools ([`Record::shared_tokens`]).
fn shared_tokens(request: &TraceRequest) -> Option<u64> {
    let blocks = request
        .system_blocks
        .unwrap_or(0)
        .saturating_add(request.tool_blocks.unwrap_or(0));
    (blocks > 0).then(|| blocks.saturating_mul(TRACE_BLOCK_TOKENS) as u64)
}

/// The records of the first `sent` requests of `trace`, in trace order.
pub fn build(
    trace: &[TraceRequest],
    assignment: &Assignment,
    sent: usize,
    measured: Measurements,
    reading: &Reading,
) -> Vec<Record> {
    let mut served: HashMap<usize, Measured> = measured.served.into_iter().collect();
    let mut failed: HashMap<usize, String> = measured.failed.into_iter().collect();
    // when each pod was first seen, in trace order
    let mut first_seen: HashMap<String, f64> = HashMap::new();
    for (i, r) in trace.iter().enumerate().take(sent) {
        if let Some(m) = served.get(&i) {
            let pod = m.pod.clone().unwrap_or_else(|| reading.target.clone());
            first_seen.entry(pod).or_insert(r.arrival_s());
        }
    }
    let new_since = |pod: &str, arrival_s: f64| -> Option<f64> {
        let event = reading
            .events
            .iter()
            .filter(|(p, at)| p == pod && *at <= arrival_s)
            .map(|(_, at)| *at)
            .max_by(f64::total_cmp);
        if event.is_some() {
            return event;
        }
        let seen = *first_seen.get(pod)?;
        let listed = reading.new_pods.iter().any(|n| n == pod);
        let late = reading.scale_at.is_some_and(|at| seen >= at);
        (listed || late).then(|| reading.scale_at.unwrap_or(seen).min(seen))
    };
    let mut records = Vec::with_capacity(sent);
    for (i, r) in trace.iter().enumerate().take(sent) {
        let adapter = assignment.adapters.get(i).cloned().flatten();
        let tenant = assignment.tenants.get(i).cloned().flatten();
        let tier = tenant.as_deref().map(|t| assignment.tier_of(Some(t)));
        let mut record = Record {
            request: i,
            arrival_s: r.arrival_s(),
            user: r.user_key(),
            group: r.app.clone(),
            adapter,
            tenant,
            tier,
            pod: None,
            pod_new_since_s: None,
            ttft_ms: None,
            prompt_tokens: r.input_length,
            cached_tokens: 0,
            shared_tokens: shared_tokens(r),
            adapter_hit: None,
            first_hot_at_join: false,
            error: None,
        };
        if let Some(m) = served.remove(&i) {
            let pod = m.pod.unwrap_or_else(|| reading.target.clone());
            let prompt = m.prompt_tokens.unwrap_or(r.input_length);
            let cached = m.cached_tokens.unwrap_or(0).min(prompt);
            let ttft_s = m.ttft_s * reading.time_factor;
            record.pod_new_since_s = new_since(&pod, r.arrival_s());
            record.pod = Some(pod);
            record.ttft_ms = Some(ttft_s * 1000.0);
            record.prompt_tokens = prompt;
            record.cached_tokens = cached;
            record.adapter_hit = match (&record.adapter, reading.adapter_estimate) {
                (Some(_), Some((profile, rank))) => {
                    Some(adapter_loaded(&profile, rank, ttft_s, prompt - cached))
                }
                _ => None,
            };
        } else {
            record.error = Some(
                failed
                    .remove(&i)
                    .unwrap_or_else(|| "no reply recorded".to_string()),
            );
        }
        records.push(record);
    }
    mark_first_hot_at_join(&mut records, reading.hot_requests);
    records
}

/// Sets `first_hot_at_join` (see the module docs); `records` in trace order.
pub fn mark_first_hot_at_join(records: &mut [Record], hot_requests: usize) {
    let joins: HashSet<u64> = records
        .iter()
        .filter_map(|r| r.pod_new_since_s.map(f64::to_bits))
        .collect();
    // per join time, requests of each user that arrived before it
    let before: HashMap<(u64, &str), usize> = joins
        .iter()
        .flat_map(|&join| {
            records
                .iter()
                .filter(move |r| r.arrival_s < f64::from_bits(join))
                .map(move |r| (join, r.prefix_group()))
        })
        .fold(HashMap::new(), |mut counts, key| {
            *counts.entry(key).or_default() += 1;
            counts
        });
    let mut seen: HashSet<(String, u64, String)> = HashSet::new();
    let mut marks = Vec::new();
    for (k, r) in records.iter().enumerate() {
        let (Some(pod), Some(join), true) = (&r.pod, r.pod_new_since_s, r.served()) else {
            continue;
        };
        if !(r.arrival_s >= join && r.arrival_s < join + NEW_POD_WINDOW_S) {
            continue;
        }
        if !seen.insert((pod.clone(), join.to_bits(), r.prefix_group().to_string())) {
            continue;
        }
        let hot = before
            .get(&(join.to_bits(), r.prefix_group()))
            .is_some_and(|&n| n >= hot_requests);
        if hot {
            marks.push(k);
        }
    }
    for k in marks {
        if let Some(r) = records.get_mut(k) {
            r.first_hot_at_join = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign::assign;

    fn measured(pod: &str, ttft_s: f64, cached: u64) -> Measured {
        Measured {
            pod: Some(pod.to_string()),
            ttft_s,
            prompt_tokens: Some(1000),
            cached_tokens: Some(cached),
        }
    }

    fn reading() -> Reading {
        Reading {
            target: "http://envoy".into(),
            time_factor: 10.0,
            new_pods: Vec::new(),
            scale_at: Some(600.0),
            events: Vec::new(),
            hot_requests: 2,
            adapter_estimate: Some((LatencyProfile::LLAMA_8B_H100, 16)),
        }
    }

    #[test]
    fn a_restarted_pod_is_new_again_from_its_restart_and_hot_groups_count_per_event() {
        // pod "a" serves from the start and restarts at 300 s; group 1 is sent before it
        let at = |s: u64, group: u64| TraceRequest::synthetic(s * 1000, &[group, 99], 1000, 4);
        let trace = vec![at(100, 1), at(200, 1), at(310, 1), at(320, 1), at(700, 1)];
        let mut m = Measurements::default();
        for i in 0..trace.len() {
            m.served.push((i, measured("a", 0.01, 0)));
        }
        let reading = Reading {
            events: vec![("a".into(), 300.0)],
            ..reading()
        };
        let a = assign(&trace, None, 1, 0.1, 0.2);
        let records = build(&trace, &a, trace.len(), m, &reading);
        let since: Vec<Option<f64>> = records.iter().map(|r| r.pod_new_since_s).collect();
        assert_eq!(since, [None, None, Some(300.0), Some(300.0), Some(300.0)]);
        let firsts: Vec<usize> = records
            .iter()
            .filter(|r| r.first_hot_at_join)
            .map(|r| r.request)
            .collect();
        assert_eq!(firsts, [2], "the first request after the restart, once");
        let run = crate::record::outcomes(&records);
        assert_eq!(run.windows, vec![vec![300.0]]);
    }

    #[test]
    fn records_mark_new_pods_model_time_and_first_hot_requests() {
        // groups 1 and 2 sent twice before the join at 600 s, group 3 once
        let at = |s: u64, group: u64| TraceRequest::synthetic(s * 1000, &[group, 99], 1000, 4);
        let trace = vec![
            at(100, 1),
            at(200, 1),
            at(300, 2),
            at(400, 2),
            at(500, 3),
            at(610, 1), // new pod, group 1: first hot at join
            at(620, 1), // new pod, group 1 again: not first
            at(630, 2), // old pod
            at(640, 3), // new pod, group 3: not hot (1 request before)
            at(650, 2), // new pod, group 2: first hot at join
            at(960, 1), // failed
        ];
        let mut m = Measurements::default();
        for i in 0..5 {
            m.served.push((i, measured("old", 0.01, 0)));
        }
        m.served.push((5, measured("new", 0.0031, 900)));
        m.served.push((6, measured("new", 0.05, 900)));
        m.served.push((7, measured("old", 0.01, 0)));
        m.served.push((8, measured("new", 0.01, 0)));
        m.served.push((9, measured("new", 0.02, 0)));
        m.failed.push((10, "HTTP 503".into()));
        let a = assign(&trace, None, 1, 0.1, 0.2);
        let records = build(&trace, &a, trace.len(), m, &reading());
        assert_eq!(records.len(), 11);
        let firsts: Vec<usize> = records
            .iter()
            .filter(|r| r.first_hot_at_join)
            .map(|r| r.request)
            .collect();
        assert_eq!(firsts, [5, 9]);
        assert_eq!(records[5].pod_new_since_s, Some(600.0));
        assert_eq!(records[7].pod_new_since_s, None);
        // 3.1 ms real at ×10 is 31 ms of model time
        assert!((records[5].ttft_ms.unwrap() - 31.0).abs() < 1e-9);
        assert_eq!(
            (records[5].prompt_tokens, records[5].cached_tokens),
            (1000, 900)
        );
        assert_eq!(records[10].error.as_deref(), Some("HTTP 503"));
        // synthetic requests frame no system prompt or tools
        assert!(records.iter().all(|r| r.shared_tokens.is_none()));
        assert_eq!(records[10].pod, None);
        // base-model requests: no adapter estimate
        assert!(records.iter().all(|r| r.adapter_hit.is_none()));
    }

    #[test]
    fn a_record_carries_its_system_prompt_and_tools_tokens_from_the_trace() {
        let mut framed = TraceRequest::synthetic(100_000, &[1, 2, 3, 4, 5], 2_400, 4);
        framed.system_blocks = Some(2);
        framed.tool_blocks = Some(1);
        let mut bare_tools = framed.clone();
        bare_tools.system_blocks = None;
        let trace = vec![
            framed,
            bare_tools,
            TraceRequest::synthetic(200_000, &[9], 100, 4),
        ];
        let mut m = Measurements::default();
        for i in 0..trace.len() {
            m.served.push((i, measured("old", 0.01, 0)));
        }
        let a = assign(&trace, None, 1, 0.1, 0.2);
        let records = build(&trace, &a, trace.len(), m, &reading());
        let shared: Vec<Option<u64>> = records.iter().map(|r| r.shared_tokens).collect();
        assert_eq!(shared, [Some(3 * 512), Some(512), None]);
    }

    #[test]
    fn adapter_load_is_estimated_from_the_profile() {
        let p = LatencyProfile::LLAMA_8B_H100;
        // 100 uncached tokens: 55 ms of prefill; a rank-16 disk load is 120 ms
        assert!(adapter_loaded(&p, 16, 0.055, 100));
        assert!(adapter_loaded(&p, 16, 0.110, 100));
        assert!(!adapter_loaded(&p, 16, 0.055 + 0.120, 100));
    }
}
