//! Experiments: arms of policy settings, and the arm each request belongs to. The gateway
//! defines an experiment and sends it in the routing table; every filter worker assigns
//! requests to its arms with [`Experiment::arm_of`] and routes each with its arm's settings, so
//! an operator can compare policies on their own traffic (`docs/experiments.md`).
//!
//! ## Assignment
//!
//! A request's *unit* is, by the experiment's `unit`: `user` (the default) — its user (the
//! filter's trusted user header, else the body's `user` when configured), else its tenant, else
//! its connection; `tenant` — its tenant only (a request without one gets no arm). Its arm is
//! the one whose interval of the arms' cumulative weights holds `u = h(unit) ∈ (0, 1)`, with
//! `h` the top 53 bits of xxh3 seeded by a hash of the experiment's id. So:
//! - a unit keeps its arm for as long as the weights stand (every VM, every proxy, any
//!   restart: nothing is stored);
//! - units are split independently of any other experiment (the id salts the hash);
//! - over `n` units an arm of weight `w` gets `n·w ± 2.6·√(n·w(1−w))` of them at p = 0.01
//!   (over 10 000 users, within 1.3 % of the weights; property-tested);
//! - a weight change moves only the units whose `u` crosses a boundary: ramping the *first*
//!   arm from 1 % to 5 % keeps the first 1 % in it and moves 4 % of the others in, which is
//!   why a grey release ramps the first arm.
//!
//! A client can not choose its arm: the arm comes from the unit, and the filter removes any
//! arm header the client sent before it sets its own.
//!
//! ## Settings
//!
//! An arm's settings are the policies it changes, each defaulting to what prewarm does without
//! an experiment: `warmup` (a joining pod is warmed before the arm's requests reach it; `false`
//! routes them to a pod as soon as it is up, cold, and withholds the arm's prefill signals),
//! `keep_warm` (the hot prefixes the arm's requests signal join the warm set of the pod they
//! route to, which keep-warm re-prefills as they near eviction; `false`: its signals still
//! prefill a new pattern once, but nothing re-prefills them — a prefix another arm also
//! signals is kept warm for that arm) and `routing` (`prefix`: the filter's prefix rule;
//! `off`: the filter leaves the request to Envoy's load balancer, the baseline every router is
//! measured against). Unknown settings are refused, never ignored.
//!
//! Settings of per-pod state that all of a pod's users share can only be compared between
//! units that partition that state. `residency_rule` (which adapters keep their GPU slot,
//! [`ResidencyRule`]) is one: the gateway applies an arm's rule to the adapters of the tenants
//! in the arm, so it needs `unit: "tenant"` (refused otherwise) — every adapter then belongs
//! to one arm, through its registered tenant (an adapter without a tenant keeps the gateway's
//! rule).

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::placement::unit_interval;
pub use crate::residency::ResidencyRule;

/// Most arms an experiment has.
pub const MAX_ARMS: usize = 8;
/// Longest experiment id or arm name, in bytes.
pub const MAX_EXPERIMENT_NAME: usize = 64;
/// How far the weights' sum may be from 1.
pub const WEIGHT_SUM_TOLERANCE: f64 = 1e-6;

/// How the filter routes an arm's requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmRouting {
    /// The prefix rule (`prefix::route_prefix`), as without an experiment.
    #[default]
    Prefix,
    /// No endpoint header: Envoy's own load balancing chooses the pod.
    Off,
}

/// The policies an arm changes; each defaults to prewarm's behaviour without an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArmSettings {
    /// Whether a joining pod is warmed before the arm's requests reach it.
    #[serde(default = "yes")]
    pub warmup: bool,
    /// Whether keep-warm keeps the prefixes the arm's requests signal warm on their pods.
    #[serde(default = "yes")]
    pub keep_warm: bool,
    /// How the filter routes the arm's requests.
    #[serde(default)]
    pub routing: ArmRouting,
    /// Which of the arm's tenants' adapters keep their GPU slot (the gateway's `[lora]
    /// residency_rule` when absent); only with `unit: "tenant"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residency_rule: Option<ResidencyRule>,
}

impl Default for ArmSettings {
    fn default() -> Self {
        Self {
            warmup: true,
            keep_warm: true,
            routing: ArmRouting::Prefix,
            residency_rule: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// One arm: a share of the units and the settings their requests get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    pub name: String,
    /// Share of the units, in [0, 1]; an experiment's weights sum to 1.
    pub weight: f64,
    #[serde(default)]
    pub settings: ArmSettings,
}

/// What an experiment assigns to arms (module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// The request's user, else its tenant, else its connection.
    #[default]
    User,
    /// The request's tenant; a request without one gets no arm.
    Tenant,
}

impl Unit {
    fn is_user(&self) -> bool {
        *self == Unit::User
    }
}

/// An experiment: its id and arms, and how the first arm is released when it is a grey release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub id: String,
    /// What is assigned to arms (default `user`).
    #[serde(default, skip_serializing_if = "Unit::is_user")]
    pub unit: Unit,
    pub arms: Vec<Arm>,
    /// A grey release of the first arm: the gateway drives the arms' weights (filters only read
    /// them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Release>,
}

/// A grey release: the first arm's weight goes through `steps`, each held at least
/// `step_seconds` and until the arm has `min_requests` outcomes in it, while it is not
/// significantly worse than the others; the gateway rolls it back to 0 when it is
/// (docs/experiments.md#grey-release).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    #[serde(default = "default_steps")]
    pub steps: Vec<f64>,
    #[serde(default = "default_step_seconds")]
    pub step_seconds: u64,
    #[serde(default = "default_min_requests")]
    pub min_requests: u64,
    /// The warm-up's p95 per key (prefill or adapter load), ms, above which a first arm that
    /// alone brings warm-up is rolled back.
    #[serde(default = "default_warmup_p95_ms")]
    pub warmup_p95_ms: u64,
}

fn default_steps() -> Vec<f64> {
    vec![0.01, 0.05, 0.25, 0.5]
}

fn default_step_seconds() -> u64 {
    600
}

fn default_min_requests() -> u64 {
    200
}

fn default_warmup_p95_ms() -> u64 {
    300
}

impl Default for Release {
    fn default() -> Self {
        Self {
            steps: default_steps(),
            step_seconds: default_step_seconds(),
            min_requests: default_min_requests(),
            warmup_p95_ms: default_warmup_p95_ms(),
        }
    }
}

impl Release {
    fn problem(&self) -> Option<String> {
        if !(1..=16).contains(&self.steps.len()) {
            return Some(format!(
                "release.steps: {} steps: must be 1 to 16",
                self.steps.len()
            ));
        }
        let increasing = self.steps.windows(2).all(|w| matches!(w, [a, b] if a < b));
        let in_range = self
            .steps
            .iter()
            .all(|s| s.is_finite() && *s > 0.0 && *s <= 1.0);
        if !(increasing && in_range) {
            return Some(format!(
                "release.steps: {:?}: must increase within (0, 1]",
                self.steps
            ));
        }
        if !(1..=86_400).contains(&self.step_seconds) {
            return Some(format!(
                "release.step_seconds: {}: must be 1 to 86400",
                self.step_seconds
            ));
        }
        if !(1..=10_000_000).contains(&self.min_requests) {
            return Some(format!(
                "release.min_requests: {}: must be 1 to 10000000",
                self.min_requests
            ));
        }
        if !(1..=600_000).contains(&self.warmup_p95_ms) {
            return Some(format!(
                "release.warmup_p95_ms: {}: must be 1 to 600000",
                self.warmup_p95_ms
            ));
        }
        None
    }
}

/// Whether `name` is a valid experiment id or arm name: 1 to [`MAX_EXPERIMENT_NAME`] bytes of
/// ASCII letters, digits, `.`, `_` and `-` (it travels in a request header and in metric
/// labels).
pub fn is_experiment_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_EXPERIMENT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

const NAME_RULE: &str = "must be 1 to 64 of A-Z a-z 0-9 . _ -";

impl Experiment {
    /// The first thing wrong with the experiment, as `field: value: rule`: an id or arm name
    /// that is not [`is_experiment_name`], fewer than 2 or more than [`MAX_ARMS`] arms, two arms
    /// with one name, a weight outside [0, 1], a `residency_rule` without `unit: "tenant"`,
    /// weights that do not sum to 1.
    pub fn problem(&self) -> Option<String> {
        if !is_experiment_name(&self.id) {
            return Some(format!("id: {:?}: {NAME_RULE}", self.id));
        }
        if !(2..=MAX_ARMS).contains(&self.arms.len()) {
            return Some(format!(
                "arms: {} arms: must be 2 to {MAX_ARMS}",
                self.arms.len()
            ));
        }
        for (i, arm) in self.arms.iter().enumerate() {
            if !is_experiment_name(&arm.name) {
                return Some(format!("arms[{i}].name: {:?}: {NAME_RULE}", arm.name));
            }
            if self
                .arms
                .get(..i)
                .is_some_and(|before| before.iter().any(|a| a.name == arm.name))
            {
                return Some(format!("arms[{i}].name: {:?}: names must differ", arm.name));
            }
            if !(arm.weight.is_finite() && (0.0..=1.0).contains(&arm.weight)) {
                return Some(format!(
                    "arms[{i}].weight: {}: must be a number in [0, 1]",
                    arm.weight
                ));
            }
            if arm.settings.residency_rule.is_some() && self.unit != Unit::Tenant {
                return Some(format!(
                    "arms[{i}].settings.residency_rule: needs \"unit\": \"tenant\" (a pod's GPU \
                     slots are shared by all its users; only tenants partition its adapters)"
                ));
            }
        }
        let sum: f64 = self.arms.iter().map(|a| a.weight).sum();
        if (sum - 1.0).abs() > WEIGHT_SUM_TOLERANCE {
            return Some(format!("arms: weights sum to {sum}: must sum to 1"));
        }
        self.release.as_ref().and_then(Release::problem)
    }

    /// The weights with the first arm at `first` and the others sharing the rest in proportion
    /// to their weights (equally when they have none).
    pub fn with_first_weight(&self, first: f64) -> Experiment {
        let first = first.clamp(0.0, 1.0);
        let others: f64 = self.arms.iter().skip(1).map(|a| a.weight).sum();
        let n = self.arms.len().saturating_sub(1).max(1) as f64;
        let mut out = self.clone();
        for (i, arm) in out.arms.iter_mut().enumerate() {
            arm.weight = if i == 0 {
                first
            } else if others > 0.0 {
                (1.0 - first) * arm.weight / others
            } else {
                (1.0 - first) / n
            };
        }
        out
    }

    /// The index of `unit`'s arm (module doc). Weights are assumed valid ([`Self::problem`]);
    /// rounding past the last boundary falls in the last arm of positive weight.
    pub fn arm_of(&self, unit: &[u8]) -> usize {
        let u = unit_interval(xxh3_64_with_seed(unit, xxh3_64(self.id.as_bytes())));
        let mut end = 0.0;
        let mut last = 0;
        for (i, arm) in self.arms.iter().enumerate() {
            if arm.weight <= 0.0 {
                continue;
            }
            end += arm.weight;
            last = i;
            if u < end {
                return i;
            }
        }
        last
    }

    /// Whether an arm routes to pods still warming (the table then lists them apart).
    pub fn needs_warming_pods(&self) -> bool {
        self.arms.iter().any(|a| !a.settings.warmup)
    }

    /// The arm header's value for arm `i`: `<experiment id>/<arm name>`.
    pub fn header_value(&self, i: usize) -> Option<String> {
        self.arms.get(i).map(|a| format!("{}/{}", self.id, a.name))
    }
}

#[cfg(test)]
mod tests;
