//! What happened to one request under one policy, and the per-policy summary built from it:
//! the metrics of the report (see docs/evaluation.md for their definitions).

use serde::Serialize;

use crate::scenario::NEW_POD_WINDOW_S;

/// One served request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Trace index.
    pub request: usize,
    pub arrival_s: f64,
    /// Pod index (join order).
    pub pod: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Prompt tokens another pod had cached beyond `cached_tokens` when the request was
    /// routed (the best pod's hit minus this one's): what routing lost. `None` where the
    /// pods' caches are not visible (live runs, the oracle's bound).
    pub cached_elsewhere_tokens: Option<u64>,
    pub ttft_s: f64,
    /// Whether its adapter held a GPU slot on arrival (`None`: base model).
    pub adapter_hit: Option<bool>,
    pub gold: bool,
}

/// The per-policy figures of the report; `None` is JSON `null` (not applicable).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyReport {
    pub policy: String,
    pub requests: usize,
    pub failed: usize,
    pub token_hit_ratio: Option<f64>,
    /// Share of prompt tokens cached on another pod than the one a request was routed to,
    /// beyond what that pod had ([`Outcome::cached_elsewhere_tokens`]): the routing's part of
    /// the misses; `token_hit_ratio` + this is what routing to the best cache would have hit
    /// that moment, before the cache effects of routing differently.
    pub cached_elsewhere_ratio: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub adapter_hit_ratio: Option<f64>,
    pub gold_adapter_hit_ratio: Option<f64>,
    pub warmup_prefill_tokens: Option<u64>,
    pub new_pod_ttft_p95_ms: Option<f64>,
    pub steady_ttft_p95_ms: Option<f64>,
    /// Requests the new-pod figure is over.
    pub new_pod_requests: usize,
    /// Token hit ratio of those requests (cold misses on new pods show here).
    pub new_pod_token_hit_ratio: Option<f64>,
    /// Adapter hit ratio of those requests (the adapter was in a GPU slot).
    pub new_pod_adapter_hit_ratio: Option<f64>,
    /// The most requests one pod received in a minute over the mean of the pods up in that
    /// minute, the highest over the run's whole minutes ([`peak_minute_load`]).
    pub peak_minute_load: Option<f64>,
}

/// The highest, over the whole minutes of the run, of the most requests one pod received in
/// that minute over the mean of the pods up in it: pods with no join or restart event, pods
/// whose first event came before the minute, and pods that served a request before it.
pub fn peak_minute_load(outcomes: &[Outcome], windows: &[Vec<f64>]) -> Option<f64> {
    let end = outcomes.iter().map(|o| o.arrival_s).fold(0.0, f64::max);
    let minutes = (end / 60.0).floor() as usize;
    let mut first_served = vec![f64::INFINITY; windows.len()];
    let mut counts = vec![vec![0u32; windows.len()]; minutes];
    for o in outcomes {
        if let Some(f) = first_served.get_mut(o.pod) {
            *f = f.min(o.arrival_s);
        }
        let m = (o.arrival_s / 60.0).floor() as usize;
        if let Some(c) = counts.get_mut(m).and_then(|c| c.get_mut(o.pod)) {
            *c += 1;
        }
    }
    let mut peak: Option<f64> = None;
    for (m, per_pod) in counts.iter().enumerate() {
        let start = m as f64 * 60.0;
        let up: Vec<u32> = per_pod
            .iter()
            .enumerate()
            .filter(|(p, _)| {
                windows
                    .get(*p)
                    .is_some_and(|w| w.first().is_none_or(|e| *e <= start))
                    || first_served.get(*p).is_some_and(|f| *f < start)
            })
            .map(|(_, c)| *c)
            .collect();
        let total: u32 = up.iter().sum();
        if up.is_empty() || total == 0 {
            continue;
        }
        let mean = f64::from(total) / up.len() as f64;
        let most = up.iter().copied().max().map_or(0.0, f64::from);
        peak = Some(peak.map_or(most / mean, |p: f64| p.max(most / mean)));
    }
    peak
}

/// Nearest-rank percentile `p` (0..100) of `values` (sorted in place): the gateway's quantile,
/// which experiments' reports use.
pub fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    prewarm_gateway::attribution::stats::quantile(values, p / 100.0)
}

/// Σ cached / Σ prompt tokens of `outcomes` (`None` without prompt tokens).
pub fn token_hit_ratio<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Option<f64> {
    let (prompt, cached) = outcomes.into_iter().fold((0u64, 0u64), |(p, c), o| {
        (p + o.prompt_tokens, c + o.cached_tokens)
    });
    (prompt > 0).then(|| cached as f64 / prompt as f64)
}

/// Tokens cached on another pod over prompt tokens; `None` unless every outcome says what
/// the other pods held.
pub fn cached_elsewhere_ratio(outcomes: &[Outcome]) -> Option<f64> {
    let (mut prompt, mut elsewhere) = (0u64, 0u64);
    for o in outcomes {
        prompt += o.prompt_tokens;
        elsewhere += o.cached_elsewhere_tokens?;
    }
    (prompt > 0).then(|| elsewhere as f64 / prompt as f64)
}

/// Whether `o` falls in its pod's first window after a join or restart event.
pub fn on_new_pod(o: &Outcome, windows: &[Vec<f64>]) -> bool {
    windows.get(o.pod).is_some_and(|w| {
        w.iter()
            .any(|&e| o.arrival_s >= e && o.arrival_s < e + NEW_POD_WINDOW_S)
    })
}

/// Whether `o` is steady-state traffic: arriving after the first [`NEW_POD_WINDOW_S`], and not
/// in a new-pod window.
pub fn steady(o: &Outcome, windows: &[Vec<f64>]) -> bool {
    o.arrival_s >= NEW_POD_WINDOW_S && !on_new_pod(o, windows)
}

/// Summarises one policy's outcomes. `windows` is [`crate::scenario::pod_windows`].
pub fn summarize(
    policy: &str,
    outcomes: &[Outcome],
    failed: usize,
    warmup_prefill_tokens: Option<u64>,
    windows: &[Vec<f64>],
) -> PolicyReport {
    let mut ttft: Vec<f64> = outcomes.iter().map(|o| o.ttft_s * 1000.0).collect();
    let ratio = |hits: usize, n: usize| (n > 0).then(|| hits as f64 / n as f64);
    let adapter: Vec<bool> = outcomes.iter().filter_map(|o| o.adapter_hit).collect();
    let gold: Vec<bool> = outcomes
        .iter()
        .filter(|o| o.gold)
        .filter_map(|o| o.adapter_hit)
        .collect();
    let has_events = windows.iter().any(|w| !w.is_empty());
    let fresh: Vec<&Outcome> = outcomes.iter().filter(|o| on_new_pod(o, windows)).collect();
    let mut new_pod: Vec<f64> = fresh.iter().map(|o| o.ttft_s * 1000.0).collect();
    let mut steady: Vec<f64> = outcomes
        .iter()
        .filter(|o| steady(o, windows))
        .map(|o| o.ttft_s * 1000.0)
        .collect();
    PolicyReport {
        policy: policy.to_string(),
        requests: outcomes.len(),
        failed,
        token_hit_ratio: token_hit_ratio(outcomes),
        cached_elsewhere_ratio: cached_elsewhere_ratio(outcomes),
        ttft_p50_ms: percentile(&mut ttft, 50.0),
        ttft_p95_ms: percentile(&mut ttft, 95.0),
        ttft_p99_ms: percentile(&mut ttft, 99.0),
        adapter_hit_ratio: ratio(adapter.iter().filter(|h| **h).count(), adapter.len()),
        gold_adapter_hit_ratio: ratio(gold.iter().filter(|h| **h).count(), gold.len()),
        warmup_prefill_tokens,
        new_pod_requests: new_pod.len(),
        new_pod_token_hit_ratio: token_hit_ratio(fresh.iter().copied()),
        new_pod_adapter_hit_ratio: {
            let hits: Vec<bool> = fresh.iter().filter_map(|o| o.adapter_hit).collect();
            ratio(hits.iter().filter(|h| **h).count(), hits.len())
        },
        new_pod_ttft_p95_ms: if has_events {
            percentile(&mut new_pod, 95.0)
        } else {
            None
        },
        steady_ttft_p95_ms: percentile(&mut steady, 95.0),
        peak_minute_load: peak_minute_load(outcomes, windows),
    }
}

/// One point of a time series: a bucket's token hit ratio and TTFT p95.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Bucket start, seconds.
    pub t_s: f64,
    pub token_hit_ratio: f64,
    pub ttft_p95_ms: f64,
}

/// Token hit ratio and TTFT p95 per `bucket_s` of arrival time (empty buckets skipped).
pub fn series(outcomes: &[Outcome], bucket_s: f64) -> Vec<SeriesPoint> {
    let bucket_s = bucket_s.max(1e-3);
    let mut buckets: std::collections::BTreeMap<u64, Vec<&Outcome>> = Default::default();
    for o in outcomes {
        buckets
            .entry((o.arrival_s / bucket_s) as u64)
            .or_default()
            .push(o);
    }
    buckets
        .into_iter()
        .filter_map(|(b, os)| {
            let mut ttft: Vec<f64> = os.iter().map(|o| o.ttft_s * 1000.0).collect();
            Some(SeriesPoint {
                t_s: b as f64 * bucket_s,
                token_hit_ratio: token_hit_ratio(os.iter().copied()).unwrap_or(0.0),
                ttft_p95_ms: percentile(&mut ttft, 95.0)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(pod: usize, arrival_s: f64) -> Outcome {
        Outcome {
            request: 0,
            arrival_s,
            pod,
            prompt_tokens: 1,
            cached_tokens: 0,
            cached_elsewhere_tokens: None,
            ttft_s: 0.1,
            adapter_hit: None,
            gold: false,
        }
    }

    #[test]
    fn the_peak_minute_load_counts_idle_pods_that_are_up() {
        // minute 0: pod 0 takes 3, pod 1 takes 1, pod 2 (joins at 60 s) is not up: 3 / 2
        // minute 1: pod 0 takes 2, pods 1 and 2 nothing: 2 / (2/3) = 3
        let mut o = vec![
            served(0, 1.0),
            served(0, 2.0),
            served(0, 3.0),
            served(1, 4.0),
        ];
        o.extend([served(0, 61.0), served(0, 62.0), served(1, 125.0)]);
        let windows = vec![vec![], vec![], vec![60.0]];
        assert_eq!(peak_minute_load(&o, &windows), Some(3.0));
        assert_eq!(peak_minute_load(&o[..4], &windows), None, "no whole minute");
    }

    fn o(arrival_s: f64, pod: usize, ttft_s: f64) -> Outcome {
        Outcome {
            request: 0,
            arrival_s,
            pod,
            prompt_tokens: 100,
            cached_tokens: 50,
            cached_elsewhere_tokens: Some(if pod == 0 { 0 } else { 30 }),
            ttft_s,
            adapter_hit: Some(pod == 0),
            gold: pod == 0,
        }
    }

    #[test]
    fn percentiles_and_windows() {
        assert_eq!(percentile(&mut [3.0, 1.0, 2.0, 4.0], 50.0), Some(2.0));
        assert_eq!(percentile(&mut [3.0, 1.0, 2.0, 4.0], 99.0), Some(4.0));
        assert_eq!(percentile(&mut [], 50.0), None);
        let windows = vec![vec![], vec![600.0]];
        let outs = vec![
            o(100.0, 0, 0.1),
            o(700.0, 1, 0.9),
            o(950.0, 1, 0.2),
            o(400.0, 0, 0.3),
        ];
        let r = summarize("p", &outs, 0, None, &windows);
        assert_eq!(r.token_hit_ratio, Some(0.5));
        // pod 1's two requests each missed 30 tokens another pod held: 60 of 400
        assert_eq!(r.cached_elsewhere_ratio, Some(0.15));
        assert_eq!(r.new_pod_requests, 1);
        assert_eq!(r.new_pod_ttft_p95_ms, Some(900.0));
        assert_eq!(r.steady_ttft_p95_ms, Some(300.0));
        assert_eq!(r.adapter_hit_ratio, Some(0.5));
        assert_eq!(r.gold_adapter_hit_ratio, Some(1.0));
        let no_events = summarize("p", &outs, 0, None, &[vec![], vec![]]);
        assert_eq!(no_events.new_pod_ttft_p95_ms, None);
    }

    #[test]
    fn cached_elsewhere_is_unknown_unless_every_request_says_it() {
        let mut outs = vec![o(100.0, 0, 0.1), o(200.0, 1, 0.1)];
        assert_eq!(cached_elsewhere_ratio(&outs), Some(0.15));
        outs[0].cached_elsewhere_tokens = None;
        assert_eq!(cached_elsewhere_ratio(&outs), None);
        assert_eq!(cached_elsewhere_ratio(&[]), None);
    }
}
