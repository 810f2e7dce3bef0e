//! The routing table builder: which pods the filters may route to, with their adapters, as
//! core's [`RoutingTable`], whose `generation` increases only when the content changes.
//!
//! A pod is in the table only when it is `routable` (its first warm-up tier is done or its
//! warm-up deadline passed: [`WarmupProgress::routable`](super::WarmupProgress::routable)).
//! Pods are listed by id, adapters sorted and deduplicated. Loads (rounded to `load_step`) and
//! waits (to 100 ms) are published with hysteresis (core's `published_load`, whose module doc
//! derives the steps): a pod keeps its published figure while the measured one stays within
//! the step of it and on the same side of every load cap the filters compute, so a table whose
//! only change is measurement noise keeps its generation. An unchanged input costs no
//! table allocation: the builder compares it with the table it holds before building anything.

use std::borrow::Cow;

use prewarm_core::experiment::Experiment;
use prewarm_core::published_load::{
    cap_crossings, load_within_step, settle_crossings, wait_within_step, WAIT_STEP_MS,
};
use prewarm_core::wire::{
    PlacedPrefix, RoutedPod, RoutingTable, MAX_PREFILL_US_PER_TOKEN, MAX_RESIDENT_ADAPTERS,
    MAX_TABLE_PREFIXES, MAX_WAIT_MS,
};
use serde::{Deserialize, Serialize};

use super::rules::Problems;

/// The default [`RoutingConfig::prefill_us_per_token`].
pub const DEFAULT_PREFILL_US_PER_TOKEN: f64 = 250.0;

/// The `[routing]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Bounded-load factor (≥ 1) published to filters; absent: plain rendezvous (default none).
    pub load_factor: Option<f64>,
    /// Published loads are multiples of this (default 0.01; in (0, 1]). What keeps a load that
    /// jitters from churning the table is the hysteresis (core's `published_load`), not this
    /// grid: a coarser grid moves a load across a cap late.
    pub load_step: f64,
    /// What prefilling one uncached prompt token costs a pod, µs, published to the filters as
    /// the price of moving a request off the pod holding its prefix (core's `route_prefix`,
    /// step 3); absent: the load cap alone decides. Default 250: an 8B model on one H100 as
    /// llm-d's simulator and podsim's `llama-8b-h100` profile model it (the figure the filter's
    /// default prefix horizon assumes too); set the engine's measured rate. In (0, 100000].
    pub prefill_us_per_token: Option<f64>,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            load_factor: Some(1.25),
            load_step: 0.01,
            prefill_us_per_token: Some(DEFAULT_PREFILL_US_PER_TOKEN),
        }
    }
}

impl RoutingConfig {
    /// Every problem, as `field: value: rule`, each field name preceded by `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Problems::new(prefix);
        if let Some(f) = self.load_factor {
            p.between("load_factor", f, 1.0, 100.0);
        }
        p.fraction("load_step", self.load_step);
        if let Some(us) = self.prefill_us_per_token {
            let ok = us.is_finite() && us > 0.0 && us <= MAX_PREFILL_US_PER_TOKEN;
            let rule = format!("must be in (0, {MAX_PREFILL_US_PER_TOKEN}]");
            p.check(ok, "prefill_us_per_token", us, rule);
        }
        p.into_vec()
    }
}

/// One pod as the builder sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodRoute<'a> {
    pub id: &'a str,
    /// `host:port` for the endpoint header.
    pub address: &'a str,
    /// Placement weight (> 0; pods with another weight are left out).
    pub weight: f64,
    /// Utilisation in [0, 1], when known.
    pub load: Option<f64>,
    /// The health checks `load` was measured over (the busy share's sample; 0 when unknown:
    /// then any change of the load is published).
    pub load_samples: u64,
    /// Predicted queue wait, ms, when known.
    pub wait_ms: Option<f64>,
    /// Adapters the pod serves (any order, duplicates allowed).
    pub adapters: Vec<&'a str>,
    /// Of `adapters`, those holding a GPU slot (any order; others are ignored).
    pub resident: Vec<&'a str>,
    /// Whether the pod may take traffic (warm-up first tier done or deadline passed, healthy).
    pub routable: bool,
    /// Whether the pod is up and in its warm-up (listed apart for an experiment's arm without
    /// warm-up).
    pub warming: bool,
}

/// A wait as the table publishes it: a multiple of [`WAIT_STEP_MS`], at most core's
/// `MAX_WAIT_MS`; `None` for an unknown or non-finite one.
fn rounded_wait(wait_ms: Option<f64>) -> Option<u64> {
    let step = WAIT_STEP_MS as f64;
    wait_ms.filter(|w| w.is_finite()).map(|w| {
        let steps = (w.max(0.0) / step).round();
        ((steps * step) as u64).min(MAX_WAIT_MS)
    })
}

/// Whether a published load stays as it is against a `measured` one from `samples` checks
/// (within the step; a load appearing or vanishing is always news).
fn load_kept(published: Option<f64>, measured: Option<f64>, samples: u64) -> bool {
    match (published, measured) {
        (Some(p), Some(m)) => load_within_step(p, m, samples),
        (p, m) => p == m,
    }
}

/// Whether a published wait stays as it is against a `measured` one.
fn wait_kept(published: Option<u64>, measured: Option<u64>) -> bool {
    match (published, measured) {
        (Some(p), Some(m)) => wait_within_step(p, m),
        (p, m) => p == m,
    }
}

/// The load and wait to publish for a pod measured as `load`/`wait` (already rounded), given
/// what was published for it before (`None`: a pod new to the list).
fn published_figures(
    before: Option<&RoutedPod>,
    (load, samples): (Option<f64>, u64),
    wait: Option<u64>,
) -> (Option<f64>, Option<u64>) {
    match before {
        Some(b) => (
            if load_kept(b.load, load, samples) {
                b.load
            } else {
                load
            },
            if wait_kept(b.wait_ms, wait) {
                b.wait_ms
            } else {
                wait
            },
        ),
        None => (load, wait),
    }
}

/// Builds [`RoutingTable`]s, keeping the last one and its generation.
#[derive(Debug, Clone)]
pub struct RoutingTableBuilder {
    config: RoutingConfig,
    table: RoutingTable,
    built: bool,
}

impl RoutingTableBuilder {
    /// A builder whose first table will have generation `last_generation + 1` (pass the
    /// generation of a restored snapshot so filters never see it go backwards).
    pub fn new(block_tokens: usize, config: RoutingConfig, last_generation: u64) -> Self {
        Self {
            table: RoutingTable {
                load_factor: config.load_factor,
                prefill_us_per_token: config.prefill_us_per_token,
                ..RoutingTable::of_pods(last_generation, block_tokens, Vec::new())
            },
            config,
            built: false,
        }
    }

    /// The current table (generation 0 before the first build with a fresh builder).
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    fn rounded_load(&self, load: Option<f64>) -> Option<f64> {
        let step = if self.config.load_step > 0.0 {
            self.config.load_step
        } else {
            0.01
        };
        // A step that divides 1 (0.01, 0.05) divides by its reciprocal, so 57 hundredths are
        // 0.57 on the wire, not 57 × 0.01 = 0.5700000000000001.
        let per = (1.0 / step).round();
        let divides = (per * step - 1.0).abs() < 1e-9;
        load.filter(|l| l.is_finite()).map(|l| {
            let l = l.clamp(0.0, 1.0);
            let rounded = if divides {
                (l * per).round() / per
            } else {
                (l / step).round() * step
            };
            rounded.clamp(0.0, 1.0)
        })
    }

    /// Builds the table for `pods` at `now_ms`. Returns whether its content changed (and the
    /// generation with it). The very first build always counts as a change. Adapter lists that
    /// are already sorted and free of duplicates (as `LoraResidency::served` yields them) are
    /// used as they are; a pod whose adapters did not change keeps its strings.
    pub fn build(&mut self, pods: &[PodRoute<'_>], now_ms: u64) -> bool {
        let warming_changed = self.build_warming(pods);
        let pods_changed = self.build_pods(pods);
        if !(warming_changed || pods_changed) {
            return false;
        }
        self.table.generation = self.table.generation.saturating_add(1);
        self.table.generated_at_ms = now_ms;
        self.built = true;
        true
    }

    /// Sets the table's routable pods; returns whether they changed (always on the first build).
    fn build_pods(&mut self, pods: &[PodRoute<'_>]) -> bool {
        let mut included: Vec<&PodRoute<'_>> = pods
            .iter()
            .filter(|p| p.routable && p.weight > 0.0 && p.weight.is_finite())
            .collect();
        included.sort_by(|a, b| a.id.cmp(b.id));
        included.dedup_by(|a, b| a.id == b.id);
        let measured: Vec<Option<f64>> =
            included.iter().map(|p| self.rounded_load(p.load)).collect();
        // A table's adapter lists are sorted and deduplicated, so an input equal to them needs
        // no normalising: the usual unchanged case is one comparison pass (and, when a load
        // moved within its step, one pass over the caps).
        let unchanged = self.built
            && self.table.pods.len() == included.len()
            && self
                .table
                .pods
                .iter()
                .zip(&included)
                .zip(&measured)
                .all(|((t, p), m)| {
                    t.id == p.id
                        && t.address == p.address
                        && t.weight == p.weight
                        && load_kept(t.load, *m, p.load_samples)
                        && wait_kept(t.wait_ms, rounded_wait(p.wait_ms))
                        && (same_adapters(&t.adapters, &p.adapters)
                            || same_adapters(&t.adapters, &normalised(&p.adapters)))
                        && same_adapters(&t.resident, &resident_of(p))
                })
            && cap_crossings(&self.table.pods, &measured, self.config.load_factor).is_empty();
        if unchanged {
            return false;
        }
        // The previous pods by id (the table is sorted by id): a pod whose adapter list did not
        // change keeps its strings, and an input equal to it needs no normalising.
        let mut previous = std::mem::take(&mut self.table.pods).into_iter().peekable();
        let mut pods = Vec::with_capacity(included.len());
        for (p, m) in included.iter().zip(&measured) {
            while previous.next_if(|old| old.id.as_str() < p.id).is_some() {}
            let old = previous.next_if(|old| old.id == p.id);
            let (load, wait_ms) =
                published_figures(old.as_ref(), (*m, p.load_samples), rounded_wait(p.wait_ms));
            let old = old.map(|old| old.adapters);
            let adapters = match old {
                Some(old) if same_adapters(&old, &p.adapters) => old,
                old => {
                    let a = normalised(&p.adapters);
                    match old {
                        Some(old) if same_adapters(&old, &a) => old,
                        _ => a.iter().map(|name| (*name).to_string()).collect(),
                    }
                }
            };
            let resident = resident_of(p).iter().map(|a| a.to_string()).collect();
            pods.push(RoutedPod {
                id: p.id.to_string(),
                address: p.address.to_string(),
                weight: p.weight,
                adapters,
                resident,
                load,
                wait_ms,
            });
        }
        // a kept load on the other side of a cap than the measured one is republished
        settle_crossings(&mut pods, &measured, self.config.load_factor);
        self.table.pods = pods;
        true
    }

    /// Sets the table's warming pods — up, not yet routable — while the experiment has an arm
    /// that routes to them (none otherwise); returns whether they changed.
    fn build_warming(&mut self, pods: &[PodRoute<'_>]) -> bool {
        let wanted = self
            .table
            .experiment
            .as_ref()
            .is_some_and(Experiment::needs_warming_pods);
        let mut warming: Vec<&PodRoute<'_>> = pods
            .iter()
            .filter(|p| wanted && p.warming && !p.routable && p.weight > 0.0)
            .filter(|p| p.weight.is_finite())
            .collect();
        warming.sort_by(|a, b| a.id.cmp(b.id));
        warming.dedup_by(|a, b| a.id == b.id);
        // Warming pods keep their figures within the step too; their cap crossings are not
        // checked (only an experiment's cold arm routes to them).
        let warming: Vec<RoutedPod> = warming
            .into_iter()
            .map(|p| {
                let before = self.table.warming.iter().find(|w| w.id == p.id);
                let measured = (self.rounded_load(p.load), p.load_samples);
                let (load, wait_ms) = published_figures(before, measured, rounded_wait(p.wait_ms));
                RoutedPod {
                    id: p.id.to_string(),
                    address: p.address.to_string(),
                    weight: p.weight,
                    adapters: normalised(&p.adapters)
                        .iter()
                        .map(|a| a.to_string())
                        .collect(),
                    resident: resident_of(p).iter().map(|a| a.to_string()).collect(),
                    load,
                    wait_ms,
                }
            })
            .collect();
        if warming == self.table.warming {
            return false;
        }
        self.table.warming = warming;
        true
    }

    /// Sets the experiment the table carries; returns whether it changed (and the generation
    /// with it). Its warming pods follow at the next [`Self::build`].
    pub fn set_experiment(&mut self, experiment: Option<&Experiment>, now_ms: u64) -> bool {
        if self.table.experiment.as_ref() == experiment {
            return false;
        }
        self.table.experiment = experiment.cloned();
        self.table.generation = self.table.generation.saturating_add(1);
        self.table.generated_at_ms = now_ms;
        true
    }
}

impl RoutingTableBuilder {
    /// Sets the table's placed prefixes (those naming a pod the table does not list are left
    /// out); returns whether they changed (and the generation with them). The list comes
    /// hottest first, and hotness reorders it every period without changing what is placed
    /// where: the same prefixes on the same pods in another order are no change (the table
    /// keeps the order it has), so a reorder costs no generation, no poll and no re-decode in
    /// every Envoy worker. The order matters to a filter only where two placed prefixes share
    /// a key (the later one's pod is written last); until the set changes, the published order
    /// decides.
    pub fn place_prefixes(&mut self, prefixes: &[PlacedPrefix], now_ms: u64) -> bool {
        let ids: std::collections::BTreeSet<&str> =
            self.table.pods.iter().map(|p| p.id.as_str()).collect();
        let listed = |p: &&PlacedPrefix| ids.contains(p.pod.as_str());
        let kept = prefixes.iter().filter(listed).take(MAX_TABLE_PREFIXES);
        if same_placements(kept.clone(), &self.table.prefixes) {
            return false;
        }
        self.table.prefixes = kept.cloned().collect();
        self.table.generation = self.table.generation.saturating_add(1);
        self.table.generated_at_ms = now_ms;
        true
    }
}

/// Whether `new` places the same prefixes on the same pods as `held`, in any order.
fn same_placements<'a>(new: impl Iterator<Item = &'a PlacedPrefix>, held: &[PlacedPrefix]) -> bool {
    let by_content = |a: &&PlacedPrefix, b: &&PlacedPrefix| {
        (a.keys.as_slice(), a.pod.as_str()).cmp(&(b.keys.as_slice(), b.pod.as_str()))
    };
    let mut new: Vec<&PlacedPrefix> = new.collect();
    if new.len() != held.len() {
        return false;
    }
    let mut held: Vec<&PlacedPrefix> = held.iter().collect();
    new.sort_by(by_content);
    held.sort_by(by_content);
    new == held
}

/// `adapters` sorted and deduplicated, borrowed when it already is.
fn normalised<'a, 'b>(adapters: &'b [&'a str]) -> Cow<'b, [&'a str]> {
    if adapters.windows(2).all(|w| matches!(w, [a, b] if a < b)) {
        Cow::Borrowed(adapters)
    } else {
        let mut owned = adapters.to_vec();
        owned.sort_unstable();
        owned.dedup();
        Cow::Owned(owned)
    }
}

/// The pod's resident adapters that it also lists, sorted and deduplicated, at most
/// [`MAX_RESIDENT_ADAPTERS`] (the wire's rule).
fn resident_of<'a>(p: &PodRoute<'a>) -> Vec<&'a str> {
    let mut r: Vec<&str> = p
        .resident
        .iter()
        .copied()
        .filter(|a| p.adapters.contains(a))
        .collect();
    r.sort_unstable();
    r.dedup();
    r.truncate(MAX_RESIDENT_ADAPTERS);
    r
}

fn same_adapters(table: &[String], input: &[&str]) -> bool {
    table.len() == input.len() && table.iter().zip(input).all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests;
