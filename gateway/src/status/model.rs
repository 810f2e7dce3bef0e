//! The admin API replies the status view reads (only the fields it shows; unknown fields are
//! ignored, as the API's stability rule allows) and the [`View`] derived from them. The
//! derivations are the dashboard's (`gateway/assets/dashboard/app.js`): a heatmap cell is refined
//! with the pod's detail (`loading` until the pod confirms a load, `evicted` when the LoRA model
//! remembers an adapter the pod no longer registers), a prefix is placed on the pod
//! whose plan lists it (marked as warming while that pod is outside the routing table), and an
//! adapter's hotness is the summed hotness of the prompts whose model is the adapter.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct PodListReply {
    pub pods: Vec<PodSummaryReply>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PodSummaryReply {
    pub id: String,
    pub address: String,
    pub health: String,
    pub routable: bool,
    pub warmup_phase: Option<String>,
    pub waiting: u64,
    pub running: u64,
    pub kv_usage: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct TierReply {
    pub total: usize,
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl TierReply {
    /// Items done, failed or skipped.
    pub fn finished(&self) -> usize {
        self.done + self.failed + self.skipped
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct WarmupReply {
    pub attempt: u32,
    pub adapters: TierReply,
    pub first_tier: TierReply,
    pub second_tier: TierReply,
    pub lazy: usize,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServedReply {
    #[serde(default)]
    pub adapters: Vec<(String, String)>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LoraReply {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PodDetailReply {
    #[serde(default)]
    pub versions: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub served: ServedReply,
    #[serde(default)]
    pub lora: Vec<LoraReply>,
    pub modelled_hit_ratio: Option<f64>,
    pub warmup: Option<WarmupReply>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PlanReply {
    pub first_tier: Vec<String>,
    pub second_tier: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct HeatmapReply {
    pub adapters: Vec<String>,
    pub pods: Vec<String>,
    pub cells: Vec<Vec<String>>,
}

#[derive(Debug, Deserialize)]
pub struct PromptsReply {
    pub total: usize,
    pub prompts: Vec<PromptReply>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PromptReply {
    pub key: String,
    pub model: String,
    pub tenant: Option<String>,
    pub origin: String,
    pub hotness: f64,
    pub preview: String,
}

#[derive(Debug, Deserialize)]
pub struct AdapterList {
    pub adapters: Vec<AdapterRecord>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct AdapterRecord {
    pub name: String,
    pub tenant: Option<String>,
    pub tier: String,
    pub pinned: bool,
}

/// One pod as read: its summary, and its detail and plan when they could be read.
#[derive(Debug)]
pub struct PodSnapshot {
    pub summary: PodSummaryReply,
    pub detail: Option<PodDetailReply>,
    pub plan: Option<PlanReply>,
}

/// Everything read from the API.
#[derive(Debug)]
pub struct Snapshot {
    pub pods: Vec<PodSnapshot>,
    pub heatmap: HeatmapReply,
    pub prompts: PromptsReply,
    pub adapters: Vec<AdapterRecord>,
}

/// A pod's state as the view names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Health `down`.
    Down,
    /// Warm-up phase `adapters`, `first_tier` or `second_tier`.
    Warming,
    /// Warm-up `done`.
    Warm,
    /// No warm-up yet, or interrupted.
    Idle,
}

impl PodState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Down => "down",
            Self::Warming => "warming",
            Self::Warm => "warm",
            Self::Idle => "idle",
        }
    }

    fn of(p: &PodSummaryReply) -> Self {
        match (p.health.as_str(), p.warmup_phase.as_deref()) {
            ("down", _) => Self::Down,
            (_, Some("done")) => Self::Warm,
            (_, Some("adapters" | "first_tier" | "second_tier")) => Self::Warming,
            _ => Self::Idle,
        }
    }
}

/// One heatmap cell as the view names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Modelled in a GPU slot, and the pod confirmed the load.
    Resident,
    /// Modelled on the pod, the pod has not confirmed it yet.
    Loading,
    /// Registered on the pod (host memory), not modelled in a GPU slot.
    Host,
    /// The LoRA model remembers it on the pod; no longer registered there.
    Evicted,
    Absent,
}

impl Residency {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resident => "resident",
            Self::Loading => "loading",
            Self::Host => "host",
            Self::Evicted => "evicted",
            Self::Absent => "absent",
        }
    }

    /// The API's cell (`gpu`, `registered`, `absent`) refined with the pod's detail.
    pub fn refine(cell: &str, adapter: &str, detail: Option<&PodDetailReply>) -> Self {
        let confirmed = detail.is_some_and(|d| {
            d.versions.contains_key(adapter) || d.served.adapters.iter().any(|(n, _)| n == adapter)
        });
        match cell {
            "gpu" if confirmed => Self::Resident,
            "registered" if confirmed => Self::Host,
            "gpu" | "registered" => Self::Loading,
            _ if detail.is_some_and(|d| d.lora.iter().any(|a| a.name == adapter)) => Self::Evicted,
            _ => Self::Absent,
        }
    }
}

#[derive(Debug, Clone)]
pub struct PodRow {
    pub summary: PodSummaryReply,
    pub state: PodState,
    pub warmup: Option<WarmupReply>,
    pub hit_ratio: Option<f64>,
}

impl PodRow {
    /// Finished items of every tier over their total (1 for an empty plan).
    pub fn progress(&self) -> Option<f64> {
        let w = self.warmup.as_ref()?;
        let tiers = [&w.adapters, &w.first_tier, &w.second_tier];
        let total: usize = tiers.iter().map(|t| t.total).sum();
        let done: usize = tiers.iter().map(|t| t.finished()).sum();
        Some(if total == 0 {
            1.0
        } else {
            done as f64 / total as f64
        })
    }
}

#[derive(Debug, Clone)]
pub struct AdapterRow {
    pub record: Option<AdapterRecord>,
    pub name: String,
    pub hotness: f64,
    /// One per pod of [`View::pods_in_heatmap`].
    pub cells: Vec<Residency>,
}

#[derive(Debug, Clone)]
pub struct PrefixRow {
    pub prompt: PromptReply,
    /// Sorted; a pod outside the routing table is marked `id(warming)`.
    pub placed_on: Vec<String>,
}

/// What the status command (and the dashboard) shows.
#[derive(Debug, Clone)]
pub struct View {
    pub pods: Vec<PodRow>,
    pub pods_in_heatmap: Vec<String>,
    pub adapters: Vec<AdapterRow>,
    pub prefixes: Vec<PrefixRow>,
    pub total_prefixes: usize,
}

impl View {
    /// The view of `snapshot` with its `top` hottest prefixes.
    pub fn of(snapshot: &Snapshot, top: usize) -> Self {
        let details: HashMap<&str, &PodDetailReply> = snapshot
            .pods
            .iter()
            .filter_map(|p| p.detail.as_ref().map(|d| (p.summary.id.as_str(), d)))
            .collect();
        let mut hotness: HashMap<&str, f64> = HashMap::new();
        for p in &snapshot.prompts.prompts {
            *hotness.entry(p.model.as_str()).or_default() += p.hotness;
        }
        let heatmap = &snapshot.heatmap;
        let adapters = heatmap
            .adapters
            .iter()
            .enumerate()
            .map(|(i, name)| AdapterRow {
                record: snapshot.adapters.iter().find(|a| &a.name == name).cloned(),
                name: name.clone(),
                hotness: hotness.get(name.as_str()).copied().unwrap_or(0.0),
                cells: heatmap
                    .pods
                    .iter()
                    .enumerate()
                    .map(|(j, pod)| {
                        let cell = heatmap
                            .cells
                            .get(i)
                            .and_then(|row| row.get(j))
                            .map_or("absent", String::as_str);
                        Residency::refine(cell, name, details.get(pod.as_str()).copied())
                    })
                    .collect(),
            })
            .collect();
        let placed = placements(&snapshot.pods);
        let prefixes = snapshot
            .prompts
            .prompts
            .iter()
            .take(top)
            .map(|p| PrefixRow {
                prompt: p.clone(),
                placed_on: placed.get(p.key.as_str()).cloned().unwrap_or_default(),
            })
            .collect();
        Self {
            pods: snapshot
                .pods
                .iter()
                .map(|p| PodRow {
                    state: PodState::of(&p.summary),
                    summary: p.summary.clone(),
                    warmup: p.detail.as_ref().and_then(|d| d.warmup.clone()),
                    hit_ratio: p.detail.as_ref().and_then(|d| d.modelled_hit_ratio),
                })
                .collect(),
            pods_in_heatmap: heatmap.pods.clone(),
            adapters,
            prefixes,
            total_prefixes: snapshot.prompts.total,
        }
    }
}

/// Prefix key → the pods whose plans list it (sorted), `(warming)` appended for pods outside the table.
fn placements(pods: &[PodSnapshot]) -> HashMap<&str, Vec<String>> {
    let mut placed: HashMap<&str, Vec<String>> = HashMap::new();
    for p in pods {
        let Some(plan) = &p.plan else { continue };
        let label = if p.summary.routable {
            p.summary.id.clone()
        } else {
            format!("{}(warming)", p.summary.id)
        };
        for key in plan.first_tier.iter().chain(&plan.second_tier) {
            placed.entry(key.as_str()).or_default().push(label.clone());
        }
    }
    for pods in placed.values_mut() {
        pods.sort();
    }
    placed
}

#[cfg(test)]
mod tests;
