//! One live run's figures from its records and what the orchestrator read from the stack
//! (`fleet.json`); the definitions are in [`super`]'s docs.

use serde::{Deserialize, Serialize};

use crate::outcome::{
    on_new_pod, percentile, steady, summarize, token_hit_ratio, Outcome, PolicyReport,
};
use crate::record::{outcomes, Record};

/// One pod's prefix-cache token counters (vLLM `vllm:prefix_cache_queries_total`, `_hits_total`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodCounters {
    pub pod: String,
    pub prefix_cache_queries: f64,
    pub prefix_cache_hits: f64,
}

/// Done and total of one warm-up step, as the gateway's `GET /admin/pods/{id}/warmup` has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepProgress {
    pub done: u64,
    pub total: u64,
}

/// The part of the gateway's warm-up object the report uses (the object has more fields, which
/// are the gateway's to add, so unknown fields are ignored here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmupProgress {
    #[serde(default)]
    pub phase: String,
    #[serde(default)]
    pub adapters: StepProgress,
    #[serde(default)]
    pub first_tier: StepProgress,
    #[serde(default)]
    pub second_tier: StepProgress,
}

/// What the orchestrator read from the stack after a run (`fleet.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetObservations {
    /// The new pods' warm-ups — the joining and restarted pods', summed step by step by the
    /// orchestrator (`null`: no gateway, no warm-up).
    #[serde(default)]
    pub new_pod_warmup: Option<WarmupProgress>,
    /// The gateway's `prewarm_prefills_total`.
    #[serde(default)]
    pub gateway_prefills: Option<f64>,
    /// The gateway's `prewarm_pod_restarts_total`: pods it saw restart while up.
    #[serde(default)]
    pub gateway_restarts: Option<f64>,
    #[serde(default)]
    pub pods: Vec<PodCounters>,
}

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    /// `policy` is the run's label; `warmup_prefill_tokens` the warm-up cost (module docs).
    #[serde(flatten)]
    pub figures: PolicyReport,
    pub sent: usize,
    pub new_pod_ttft_p50_ms: Option<f64>,
    pub steady_ttft_p50_ms: Option<f64>,
    /// First requests of prefixes hot at the join.
    pub first_hot_requests: usize,
    pub first_hot_ttft_p50_ms: Option<f64>,
    pub first_hot_token_hit_ratio: Option<f64>,
    /// Of those requests' shared prefixes (system prompt and tools, [`Record::shared_tokens`]),
    /// the share cached: `Σ min(cached, shared) ÷ Σ shared` over those that have one — the
    /// figure a warm-up can bring to 1 (the rest of the prompt is the user's message).
    pub first_hot_shared_hit_ratio: Option<f64>,
    /// Prefixes the new pods' warm-ups prefilled (both tiers).
    pub warmup_prefixes: Option<u64>,
    pub gateway_prefills: Option<u64>,
    pub fleet: Option<FleetObservations>,
}

fn ttft_ms<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Vec<f64> {
    outcomes.into_iter().map(|o| o.ttft_s * 1000.0).collect()
}

/// The figures of one run.
pub fn summarize_run(
    label: &str,
    records: &[Record],
    fleet: Option<FleetObservations>,
) -> RunSummary {
    let run = outcomes(records);
    let marked: std::collections::HashSet<usize> = records
        .iter()
        .filter(|r| r.first_hot_at_join)
        .map(|r| r.request)
        .collect();
    let (shared, shared_cached) = records
        .iter()
        .filter(|r| r.served() && marked.contains(&r.request))
        .filter_map(|r| r.shared_tokens.map(|s| (s, r.cached_tokens.min(s))))
        .fold((0u64, 0u64), |(s, c), (rs, rc)| (s + rs, c + rc));
    let first_hot: Vec<&Outcome> = run
        .outcomes
        .iter()
        .filter(|o| marked.contains(&o.request))
        .collect();
    let fresh = run.outcomes.iter().filter(|o| on_new_pod(o, &run.windows));
    let settled = run.outcomes.iter().filter(|o| steady(o, &run.windows));
    let warmup_cost = fleet.as_ref().filter(|f| !f.pods.is_empty()).map(|f| {
        let computed: f64 = f
            .pods
            .iter()
            .map(|p| p.prefix_cache_queries - p.prefix_cache_hits)
            .sum();
        let clients: u64 = run
            .outcomes
            .iter()
            .map(|o| o.prompt_tokens - o.cached_tokens)
            .sum();
        (computed - clients as f64).max(0.0) as u64
    });
    RunSummary {
        figures: summarize(label, &run.outcomes, run.failed, warmup_cost, &run.windows),
        sent: records.len(),
        new_pod_ttft_p50_ms: percentile(&mut ttft_ms(fresh), 50.0),
        steady_ttft_p50_ms: percentile(&mut ttft_ms(settled), 50.0),
        first_hot_requests: first_hot.len(),
        first_hot_ttft_p50_ms: percentile(&mut ttft_ms(first_hot.iter().copied()), 50.0),
        first_hot_token_hit_ratio: token_hit_ratio(first_hot.iter().copied()),
        first_hot_shared_hit_ratio: (shared > 0).then(|| shared_cached as f64 / shared as f64),
        warmup_prefixes: fleet
            .as_ref()
            .and_then(|f| f.new_pod_warmup.as_ref())
            .map(|w| w.first_tier.done + w.second_tier.done),
        gateway_prefills: fleet
            .as_ref()
            .and_then(|f| f.gateway_prefills)
            .map(|p| p.max(0.0) as u64),
        fleet,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comparison::fixtures::{fixture, fleet};

    #[test]
    fn a_run_summary_holds_the_demo_figures() {
        let s = summarize_run("prewarm", &fixture(), Some(fleet()));
        assert_eq!((s.sent, s.figures.requests, s.figures.failed), (7, 6, 1));
        assert_eq!(s.figures.new_pod_requests, 2);
        assert_eq!(s.new_pod_ttft_p50_ms, Some(1000.0));
        assert_eq!(s.figures.new_pod_ttft_p95_ms, Some(3000.0));
        assert_eq!(s.figures.new_pod_token_hit_ratio, Some(0.5));
        // steady: arrivals from 300 s not on the new pod in its window
        assert_eq!(s.steady_ttft_p50_ms, Some(300.0));
        assert_eq!(s.figures.steady_ttft_p95_ms, Some(400.0));
        assert_eq!(s.first_hot_requests, 1);
        assert_eq!(s.first_hot_ttft_p50_ms, Some(3000.0));
        assert_eq!(s.first_hot_token_hit_ratio, Some(0.5));
        // 500 cached of its 800 shared tokens
        assert_eq!(s.first_hot_shared_hit_ratio, Some(0.625));
        assert_eq!(s.figures.adapter_hit_ratio, Some(0.5));
        assert_eq!(s.warmup_prefixes, Some(10));
        assert_eq!(s.gateway_prefills, Some(12));
        // pods computed 7,000 uncached tokens; clients' requests explain 4 × 100 + 2 × 500
        assert_eq!(s.figures.warmup_prefill_tokens, Some(5600));
        let bare = summarize_run("off", &fixture(), None);
        assert_eq!(bare.figures.warmup_prefill_tokens, None);
        assert_eq!(bare.warmup_prefixes, None);
    }

    #[test]
    fn the_shared_prefix_share_counts_cached_tokens_up_to_the_shared_prefix() {
        let mut records = fixture();
        // a second first-hot request whose cache covers its 400 shared tokens and more
        records[3].first_hot_at_join = true;
        records[3].shared_tokens = Some(400);
        let s = summarize_run("prewarm", &records, None);
        // (min(500, 800) + min(500, 400)) / (800 + 400)
        assert_eq!(s.first_hot_shared_hit_ratio, Some(900.0 / 1200.0));
        // a trace that frames no shared prefix has no such figure
        for r in &mut records {
            r.shared_tokens = None;
        }
        let none = summarize_run("prewarm", &records, None);
        assert_eq!(none.first_hot_shared_hit_ratio, None);
        assert!(none.first_hot_token_hit_ratio.is_some());
    }
}
