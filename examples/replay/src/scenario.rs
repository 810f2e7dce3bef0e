//! The scenario a run replays: the fleet (pods, latency profile, KV blocks, LoRA slots) and its
//! events (`--add-pods 2@600s`, `--restart-pod 1@900s`), serialised into the JSON report.

use podsim::PrefillCompute;
use serde::Serialize;

/// Seconds after a pod joins (or restarts) during which its requests count as "new pod" ones,
/// and from the trace's start during which nothing counts as steady state.
pub const NEW_POD_WINDOW_S: f64 = 300.0;

/// The pods' shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetSpec {
    /// Pods at the start.
    pub pods: usize,
    /// podsim latency profile name.
    pub profile: String,
    /// KV blocks per pod (16 tokens each).
    pub kv_blocks: usize,
    pub max_loras: usize,
    pub max_cpu_loras: usize,
    /// LoRA rank of every adapter.
    pub adapter_rank: u32,
    /// Pods an adapter is placed on by the prewarm policy (the gateway's `adapter_replicas`).
    pub adapter_replicas: usize,
    /// Tier pools sized from demand under the prewarm policy (the gateway's `tier_pools`).
    pub tier_pools: bool,
    /// Share of the pods serving gold tenants' adapters (the gateway's `gold_pool_share`).
    pub gold_pool_share: f64,
    /// The prewarm policy's bounded-load factor (the gateway's `routing.load_factor`).
    pub load_factor: Option<f64>,
    /// How each pod's concurrent prefills share its compute (podsim's `PrefillCompute`).
    pub prefill_compute: PrefillCompute,
}

/// Something that happens to the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FleetEvent {
    /// `count` cold pods join at `at_s`.
    AddPods { count: usize, at_s: f64 },
    /// Pod `index` restarts cold at `at_s`.
    RestartPod { index: usize, at_s: f64 },
}

impl FleetEvent {
    pub fn at_s(&self) -> f64 {
        match self {
            Self::AddPods { at_s, .. } | Self::RestartPod { at_s, .. } => *at_s,
        }
    }
}

/// Parses `N@Ts` (or `N@T`): a count or index and a time in seconds.
pub fn parse_at(flag: &str, value: &str) -> Result<(usize, f64), String> {
    let bad = || format!("{flag}: {value:?}: expected N@SECONDS, e.g. 2@600s");
    let (n, t) = value.split_once('@').ok_or_else(bad)?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    let t: f64 = t.trim().trim_end_matches('s').parse().map_err(|_| bad())?;
    if !(t.is_finite() && t >= 0.0) || n > 1024 {
        return Err(bad());
    }
    Ok((n, t))
}

/// Everything that produced a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    pub trace: String,
    pub requests: usize,
    pub span_s: f64,
    pub adapters: String,
    pub seed: u64,
    pub gold_share: f64,
    pub silver_share: f64,
    /// Tokens of the system prompt every request starts with (0: none).
    pub system_prompt_tokens: u64,
    /// Every request was its own user's (`--one-shot-users`).
    pub one_shot_users: bool,
    pub fleet: FleetSpec,
    pub events: Vec<FleetEvent>,
    pub new_pod_window_s: f64,
}

/// When each pod (by index, in join order) came up: `(joined_s, event times)`; the event
/// times (its join by an event, its restarts) start its "new pod" windows.
pub fn pod_windows(initial: usize, events: &[FleetEvent]) -> Vec<Vec<f64>> {
    let mut pods: Vec<Vec<f64>> = vec![Vec::new(); initial];
    let mut sorted = events.to_vec();
    sorted.sort_by(|a, b| a.at_s().total_cmp(&b.at_s()));
    for e in sorted {
        match e {
            FleetEvent::AddPods { count, at_s } => {
                pods.extend(std::iter::repeat_n(vec![at_s], count));
            }
            FleetEvent::RestartPod { index, at_s } => {
                if let Some(p) = pods.get_mut(index) {
                    p.push(at_s);
                }
            }
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_values_parse_and_errors_name_the_flag() {
        assert_eq!(parse_at("--add-pods", "2@600s"), Ok((2, 600.0)));
        assert_eq!(parse_at("--restart-pod", "1@900"), Ok((1, 900.0)));
        assert!(parse_at("--add-pods", "x")
            .unwrap_err()
            .starts_with("--add-pods:"));
        let w = pod_windows(
            2,
            &[
                FleetEvent::RestartPod {
                    index: 1,
                    at_s: 900.0,
                },
                FleetEvent::AddPods {
                    count: 1,
                    at_s: 600.0,
                },
            ],
        );
        assert_eq!(w, vec![vec![], vec![900.0], vec![600.0]]);
    }
}
