//! Warm-up of a joining or restarted pod: the plan, and the state machine that paces it.
//!
//! [`plan_warmup`]: the pod's adapters first; then, of the hot prefixes (hottest first), those
//! whose placement — core's `placement::place` over the candidate pods *with the new pod
//! included*, keyed by the prefix's routing key — is the new pod: exactly the keys that move to
//! it; and those common to the whole fleet (`HotPrefix::fleet_wide`: every shard cached on at
//! least three pods, as an application's system prompt becomes once its conversations overflow
//! one pod). Those have no one pod: the filter keys a request past them, so conversations that
//! start with them and bring more than they share spread over every pod like a hash, the
//! joining one included (those mostly made of the shared prompt go to the pods the filters'
//! index names for it while they are under the load cap, and overflow to any pod), and each of
//! its first such conversations would otherwise prefill the whole shared prompt. And, for the same
//! reason one step earlier, those spread over [`SPREAD_HOLDERS`] (2) or more pods
//! (`HotPrefix::holders`: every shard modelled resident on at least two): the assumption is
//! that a hot prefix lands on a second pod only when the bounded-load rule could not keep its
//! traffic on one — one pod's worth overflowed — and the overflow goes to the least loaded pod,
//! which after a join or restart is the new one. Such a prefix is not yet common (that takes
//! `COMMON_HOLDERS`, three pods), so its requests are still keyed on it, but its placed pod is
//! full and its next conversation lands on the new pod cold unless the plan warms it. In the order
//! `warmup.sampling` gives them ([`sampling`]: hottest first by default, or the
//! pool's semantic groups covered by hotness). The first `first_tier` (100) of them form the
//! first tier, the next up to `second_tier` (1,000) the second, the rest are left to be warmed
//! lazily (by traffic and keep-warm).
//!
//! [`WarmupProgress`] is the progress of one plan: phases adapters → first tier → second tier
//! (released in batches of `batch_size`; the next batch starts when the previous one finished) →
//! done. [`WarmupProgress::next_actions`] returns what to start now given the in-flight work and
//! the pod's pressure: concurrency halves when the pod has `waiting_high` or more waiting
//! requests (quarters at twice that) and halves again when its KV usage reaches
//! `kv_usage_high`, never below 1. A failed action is retried up to `max_attempts` times, then
//! counted as failed. The pod may enter the routing table ([`WarmupProgress::routable`]) once
//! the first tier is finished (every adapter and first-tier prefix done or finally failed) or
//! the deadline passed. A pod that dies mid-warm-up is [`pod_lost`](WarmupProgress::pod_lost);
//! when it returns, its cache is cold, so the shell makes a new plan and
//! [`restarted`](WarmupProgress::restarted) starts it as the next attempt.

use std::collections::HashMap;

use prewarm_core::placement::{score, PlacementCandidate};
use serde::{Deserialize, Serialize};

use super::rules::Problems;
use super::{HotPrefix, PrefixKey};

pub mod sampling;

pub use sampling::{Sampling, SemanticGroups};

/// The `[warmup]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarmupConfig {
    /// Prefixes in the first tier (default 100).
    pub first_tier: usize,
    /// Prefixes in the second tier (default 1,000).
    pub second_tier: usize,
    /// Second-tier batch size (default 50).
    pub batch_size: usize,
    /// Adapter loads at once (default 2).
    pub adapter_concurrency: usize,
    /// First-tier prefills at once (default 8).
    pub first_tier_concurrency: usize,
    /// Second-tier prefills at once (default 4).
    pub second_tier_concurrency: usize,
    /// After this long (ms) the pod enters the routing table even if its first tier is not done
    /// (default 120,000).
    pub deadline_ms: u64,
    /// Attempts per action before it counts as failed (default 2).
    pub max_attempts: u32,
    /// Waiting requests on the pod at which concurrency halves (default 4).
    pub waiting_high: u64,
    /// KV usage (0..1) at which concurrency halves (default 0.85).
    pub kv_usage_high: f64,
    /// Hot prefixes considered when planning (default 100,000).
    pub max_candidates: usize,
    /// The order the moving keys are taken in: `hottest` (default) or `groups` ([`sampling`]).
    pub sampling: Sampling,
}

impl Default for WarmupConfig {
    fn default() -> Self {
        Self {
            first_tier: 100,
            second_tier: 1_000,
            batch_size: 50,
            adapter_concurrency: 2,
            first_tier_concurrency: 8,
            second_tier_concurrency: 4,
            deadline_ms: 120_000,
            max_attempts: 2,
            waiting_high: 4,
            kv_usage_high: 0.85,
            max_candidates: 100_000,
            sampling: Sampling::Hottest,
        }
    }
}

impl WarmupConfig {
    /// Every problem, as `field: value: rule`, each field name preceded by `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Problems::new(prefix);
        p.between("first_tier", self.first_tier, 0, 100_000);
        p.between("second_tier", self.second_tier, 0, 1_000_000);
        p.between("batch_size", self.batch_size, 1, 100_000);
        p.between("adapter_concurrency", self.adapter_concurrency, 1, 1_024);
        p.between(
            "first_tier_concurrency",
            self.first_tier_concurrency,
            1,
            1_024,
        );
        p.between(
            "second_tier_concurrency",
            self.second_tier_concurrency,
            1,
            1_024,
        );
        p.between("max_candidates", self.max_candidates, 1, 10_000_000);
        p.between("deadline_ms", self.deadline_ms, 1_000, 86_400_000);
        p.between("max_attempts", self.max_attempts, 1, 100);
        p.between("waiting_high", self.waiting_high, 1, 1_000_000);
        p.fraction("kv_usage_high", self.kv_usage_high);
        p.into_vec()
    }
}

/// Pods a hot prefix must be modelled on for every joining pod's plan to include it: the one
/// its placement gave it and the one its overflow went to (module doc). Derived from the
/// bounded-load rule, not from a trace.
pub const SPREAD_HOLDERS: usize = 2;

/// What a joining pod must warm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmupPlan {
    pub pod: String,
    /// Adapters to load first.
    pub adapters: Vec<String>,
    /// Hottest prefixes that move to the pod, warmed before it takes traffic.
    pub first_tier: Vec<PrefixKey>,
    /// The next ones, warmed in batches after it.
    pub second_tier: Vec<PrefixKey>,
    /// The rest that move to it, left to traffic and keep-warm.
    pub lazy: Vec<PrefixKey>,
    /// Hot prefixes examined.
    pub considered: usize,
}

/// Plans the warm-up of `pod`; see the module docs. `candidates` are the routable pods with
/// `pod` included; `hot` is hottest first (only the first `max_candidates` are examined).
pub fn plan_warmup(
    pod: &str,
    candidates: &[PlacementCandidate<'_>],
    adapters: &[String],
    hot: &[HotPrefix],
    config: &WarmupConfig,
) -> WarmupPlan {
    let scope = PlanScope {
        scoped: &HashMap::new(),
        groups: &SemanticGroups::new(),
    };
    plan_warmup_scoped(pod, candidates, scope, adapters, hot, config)
}

/// Placement candidates of the models that not every pod serves, by chain seed
/// (`PrefixKey::model`): an adapter's prefixes are placed among the pods serving the adapter,
/// as the filter places a request among the pods the routing table lists for its model.
pub type ScopedCandidates<'a> = HashMap<u64, Vec<PlacementCandidate<'a>>>;

/// What a plan reads of the fleet besides the pods and the hot prefixes.
#[derive(Debug, Clone, Copy)]
pub struct PlanScope<'s, 'a> {
    /// The candidates of the scoped models.
    pub scoped: &'s ScopedCandidates<'a>,
    /// The pool's semantic groups (read with `sampling = "groups"`).
    pub groups: &'s SemanticGroups,
}

/// The candidates a prefix of the model with chain seed `model` is placed among: its scope when
/// it has one, else every candidate (the filter's fallback when no pod lists the model).
pub fn candidates_for<'c, 'a>(
    model: u64,
    all: &'c [PlacementCandidate<'a>],
    scoped: &'c ScopedCandidates<'a>,
) -> &'c [PlacementCandidate<'a>] {
    scoped.get(&model).map_or(all, Vec::as_slice)
}

/// [`plan_warmup`] where the prefixes of scoped models move only among their scope's pods, and
/// `sampling = "groups"` reads the scope's semantic groups.
pub fn plan_warmup_scoped(
    pod: &str,
    candidates: &[PlacementCandidate<'_>],
    scope: PlanScope<'_, '_>,
    adapters: &[String],
    hot: &[HotPrefix],
    config: &WarmupConfig,
) -> WarmupPlan {
    let mut plan = WarmupPlan {
        pod: pod.to_string(),
        adapters: adapters.to_vec(),
        first_tier: Vec::new(),
        second_tier: Vec::new(),
        lazy: Vec::new(),
        considered: 0,
    };
    if !candidates.iter().any(|c| c.id == pod) {
        return plan;
    }
    let mut moved = Vec::new();
    for h in hot.iter().take(config.max_candidates) {
        plan.considered += 1;
        let among = candidates_for(h.key.model, candidates, scope.scoped);
        let Some(me) = among.iter().position(|c| c.id == pod) else {
            continue;
        };
        if h.fleet_wide || h.holders >= SPREAD_HOLDERS || wins(h.routing_key.0, me, among) {
            moved.push(h);
        }
    }
    let seed = xxhash_rust::xxh3::xxh3_64(pod.as_bytes());
    let mut keys = sampling::order(moved, config.sampling, scope.groups, seed).into_iter();
    plan.first_tier = keys.by_ref().take(config.first_tier).collect();
    plan.second_tier = keys.by_ref().take(config.second_tier).collect();
    plan.lazy = keys.collect();
    plan
}

/// Whether `place(key, candidates) == Some(me)`: `me` scores above every other candidate (a
/// tie goes to the smaller id, then the earlier candidate, as in `place`). It stops at the first
/// candidate that beats `me`, so a key that stays where it was — nearly all of them — costs a
/// few scores instead of one per pod.
pub(crate) fn wins(key: u64, me: usize, candidates: &[PlacementCandidate<'_>]) -> bool {
    let Some(mine) = candidates.get(me) else {
        return false;
    };
    let s = score(key, mine);
    if s == f64::NEG_INFINITY {
        return false;
    }
    candidates.iter().enumerate().all(|(i, c)| {
        if i == me {
            return true;
        }
        let other = score(key, c);
        s > other || (s == other && (mine.id < c.id || (mine.id == c.id && me < i)))
    })
}

/// One step of a warm-up for the shell to execute.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "action", content = "target", rename_all = "snake_case")]
pub enum WarmupAction {
    LoadAdapter(String),
    Prefill(PrefixKey),
}

/// Where a warm-up is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmupPhase {
    Adapters,
    FirstTier,
    SecondTier,
    Done,
    /// The pod died mid-warm-up; a new plan is needed when it returns.
    Interrupted,
}

/// The pod's load as its metrics report it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodPressure {
    /// `vllm:num_requests_waiting`.
    pub waiting: u64,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f64,
}

/// Counts of one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierStatus {
    pub total: usize,
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
    pub in_flight: usize,
}

/// Progress of a warm-up, for the admin API and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmupStatus {
    pub pod: String,
    pub phase: WarmupPhase,
    pub routable: bool,
    /// 1 for the first plan, +1 for each re-plan after the pod returned.
    pub attempt: u32,
    pub started_ms: u64,
    pub deadline_ms: u64,
    /// When the first tier finished (the warm-up duration the histogram records).
    pub first_tier_done_ms: Option<u64>,
    pub adapters: TierStatus,
    pub first_tier: TierStatus,
    pub second_tier: TierStatus,
    pub lazy: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ItemState {
    Pending,
    InFlight,
    Done,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    state: ItemState,
    attempts: u32,
}

impl Item {
    fn finished(&self) -> bool {
        matches!(
            self.state,
            ItemState::Done | ItemState::Failed | ItemState::Skipped
        )
    }
}

const ADAPTERS: usize = 0;
const FIRST: usize = 1;
const SECOND: usize = 2;

/// The progress state machine of one plan. See the module docs.
#[derive(Debug, Clone)]
pub struct WarmupProgress {
    config: WarmupConfig,
    plan: WarmupPlan,
    /// Items of the adapters, first tier and second tier, in plan order.
    items: [Vec<Item>; 3],
    index: HashMap<WarmupAction, (usize, usize)>,
    /// End (exclusive) of the second-tier batch released so far.
    batch_end: usize,
    started_ms: u64,
    attempt: u32,
    interrupted: bool,
    first_tier_done_ms: Option<u64>,
}

impl WarmupProgress {
    /// Starts `plan` at `now_ms` (attempt 1).
    pub fn start(plan: WarmupPlan, config: WarmupConfig, now_ms: u64) -> Self {
        let fresh = |n: usize| {
            vec![
                Item {
                    state: ItemState::Pending,
                    attempts: 0,
                };
                n
            ]
        };
        let mut index = HashMap::new();
        for (i, a) in plan.adapters.iter().enumerate() {
            index
                .entry(WarmupAction::LoadAdapter(a.clone()))
                .or_insert((ADAPTERS, i));
        }
        for (tier, keys) in [(FIRST, &plan.first_tier), (SECOND, &plan.second_tier)] {
            for (i, k) in keys.iter().enumerate() {
                index.entry(WarmupAction::Prefill(*k)).or_insert((tier, i));
            }
        }
        let items = [
            fresh(plan.adapters.len()),
            fresh(plan.first_tier.len()),
            fresh(plan.second_tier.len()),
        ];
        let mut progress = Self {
            batch_end: config.batch_size.max(1).min(plan.second_tier.len()),
            config,
            plan,
            items,
            index,
            started_ms: now_ms,
            attempt: 1,
            interrupted: false,
            first_tier_done_ms: None,
        };
        progress.note_first_tier(now_ms);
        progress
    }

    /// The next attempt after the pod returned: `plan` (made anew, the pod's cache is cold)
    /// started at `now_ms`.
    pub fn restarted(&self, plan: WarmupPlan, now_ms: u64) -> Self {
        let mut next = Self::start(plan, self.config.clone(), now_ms);
        next.attempt = self.attempt.saturating_add(1);
        next
    }

    pub fn plan(&self) -> &WarmupPlan {
        &self.plan
    }

    fn tier_finished(&self, tier: usize) -> bool {
        self.items
            .get(tier)
            .is_none_or(|v| v.iter().all(Item::finished))
    }

    pub fn phase(&self) -> WarmupPhase {
        if self.interrupted {
            WarmupPhase::Interrupted
        } else if !self.tier_finished(ADAPTERS) {
            WarmupPhase::Adapters
        } else if !self.tier_finished(FIRST) {
            WarmupPhase::FirstTier
        } else if !self.tier_finished(SECOND) {
            WarmupPhase::SecondTier
        } else {
            WarmupPhase::Done
        }
    }

    /// The deadline, ms.
    pub fn deadline_ms(&self) -> u64 {
        self.started_ms.saturating_add(self.config.deadline_ms)
    }

    /// Whether the pod may be in the routing table: first tier finished or deadline passed, and
    /// not interrupted.
    pub fn routable(&self, now_ms: u64) -> bool {
        !self.interrupted && (self.first_tier_done_ms.is_some() || now_ms >= self.deadline_ms())
    }

    /// Actions in flight.
    pub fn in_flight(&self) -> usize {
        self.items
            .iter()
            .flatten()
            .filter(|i| i.state == ItemState::InFlight)
            .count()
    }

    fn concurrency(&self, base: usize, pressure: PodPressure) -> usize {
        let high = self.config.waiting_high.max(1);
        let mut c = base;
        if pressure.waiting >= high.saturating_mul(2) {
            c /= 4;
        } else if pressure.waiting >= high {
            c /= 2;
        }
        if pressure.kv_usage >= self.config.kv_usage_high {
            c /= 2;
        }
        c.max(1)
    }

    /// What to start now; the returned actions are in flight until reported.
    pub fn next_actions(&mut self, pressure: PodPressure, now_ms: u64) -> Vec<WarmupAction> {
        let (tier, base, window) = match self.phase() {
            WarmupPhase::Adapters => (ADAPTERS, self.config.adapter_concurrency, usize::MAX),
            WarmupPhase::FirstTier => (FIRST, self.config.first_tier_concurrency, usize::MAX),
            WarmupPhase::SecondTier => {
                self.advance_batch();
                (SECOND, self.config.second_tier_concurrency, self.batch_end)
            }
            WarmupPhase::Done | WarmupPhase::Interrupted => return Vec::new(),
        };
        let _ = now_ms;
        let limit = self.concurrency(base, pressure);
        let running = self.items.get(tier).map_or(0, |v| {
            v.iter().filter(|i| i.state == ItemState::InFlight).count()
        });
        let mut room = limit.saturating_sub(running);
        let mut out = Vec::new();
        let Some(items) = self.items.get_mut(tier) else {
            return out;
        };
        for (i, item) in items.iter_mut().enumerate().take(window) {
            if room == 0 {
                break;
            }
            if item.state != ItemState::Pending {
                continue;
            }
            let action = match tier {
                ADAPTERS => self
                    .plan
                    .adapters
                    .get(i)
                    .cloned()
                    .map(WarmupAction::LoadAdapter),
                FIRST => self
                    .plan
                    .first_tier
                    .get(i)
                    .copied()
                    .map(WarmupAction::Prefill),
                _ => self
                    .plan
                    .second_tier
                    .get(i)
                    .copied()
                    .map(WarmupAction::Prefill),
            };
            if let Some(action) = action {
                item.state = ItemState::InFlight;
                item.attempts = item.attempts.saturating_add(1);
                room -= 1;
                out.push(action);
            }
        }
        out
    }

    fn advance_batch(&mut self) {
        let batch = self.config.batch_size.max(1);
        let Some(second) = self.items.get(SECOND) else {
            return;
        };
        while self.batch_end < second.len()
            && second.iter().take(self.batch_end).all(Item::finished)
        {
            self.batch_end = self.batch_end.saturating_add(batch).min(second.len());
        }
    }

    fn item_mut(&mut self, action: &WarmupAction) -> Option<&mut Item> {
        let &(tier, i) = self.index.get(action)?;
        self.items.get_mut(tier)?.get_mut(i)
    }

    fn note_first_tier(&mut self, now_ms: u64) {
        if self.first_tier_done_ms.is_none()
            && !self.interrupted
            && self.tier_finished(ADAPTERS)
            && self.tier_finished(FIRST)
        {
            self.first_tier_done_ms = Some(now_ms);
        }
    }

    fn finish(&mut self, action: &WarmupAction, state: ItemState, now_ms: u64) {
        if self.interrupted {
            return;
        }
        if let Some(item) = self.item_mut(action) {
            if item.state == ItemState::InFlight {
                item.state = state;
            }
        }
        self.note_first_tier(now_ms);
    }

    /// `action` succeeded.
    pub fn completed(&mut self, action: &WarmupAction, now_ms: u64) {
        self.finish(action, ItemState::Done, now_ms);
    }

    /// `action` failed: pending again until `max_attempts`, then failed. Returns whether it
    /// failed for good (a warm-up key error).
    pub fn failed(&mut self, action: &WarmupAction, now_ms: u64) -> bool {
        let max = self.config.max_attempts.max(1);
        let state = match self.item_mut(action) {
            Some(item) if item.state == ItemState::InFlight => {
                if item.attempts >= max {
                    ItemState::Failed
                } else {
                    ItemState::Pending
                }
            }
            _ => return false,
        };
        if state == ItemState::Pending {
            if let Some(item) = self.item_mut(action) {
                item.state = ItemState::Pending;
            }
            return false;
        }
        self.finish(action, ItemState::Failed, now_ms);
        true
    }

    /// `action` could not be attempted (e.g. the prefix left the pool): it is dropped without
    /// counting as an error.
    pub fn skipped(&mut self, action: &WarmupAction, now_ms: u64) {
        self.finish(action, ItemState::Skipped, now_ms);
    }

    /// The pod died: nothing more is started, in-flight results are ignored, it is not routable.
    pub fn pod_lost(&mut self) {
        self.interrupted = true;
        for item in self.items.iter_mut().flatten() {
            if item.state == ItemState::InFlight {
                item.state = ItemState::Pending;
            }
        }
    }

    /// The first tier's prefixes this attempt prefilled, in plan order.
    pub fn first_tier_warmed(&self) -> Vec<PrefixKey> {
        let items = self.items.get(FIRST).map(|v| &v[..]).unwrap_or(&[]);
        self.plan
            .first_tier
            .iter()
            .zip(items)
            .filter(|(_, item)| item.state == ItemState::Done)
            .map(|(key, _)| *key)
            .collect()
    }

    /// Counts and phase at `now_ms`.
    pub fn status(&self, now_ms: u64) -> WarmupStatus {
        let count = |tier: usize| {
            let mut s = TierStatus::default();
            for i in self.items.get(tier).map(|v| &v[..]).unwrap_or(&[]) {
                s.total += 1;
                match i.state {
                    ItemState::Done => s.done += 1,
                    ItemState::Failed => s.failed += 1,
                    ItemState::Skipped => s.skipped += 1,
                    ItemState::InFlight => s.in_flight += 1,
                    ItemState::Pending => {}
                }
            }
            s
        };
        WarmupStatus {
            pod: self.plan.pod.clone(),
            phase: self.phase(),
            routable: self.routable(now_ms),
            attempt: self.attempt,
            started_ms: self.started_ms,
            deadline_ms: self.deadline_ms(),
            first_tier_done_ms: self.first_tier_done_ms,
            adapters: count(ADAPTERS),
            first_tier: count(FIRST),
            second_tier: count(SECOND),
            lazy: self.plan.lazy.len(),
        }
    }
}

#[cfg(test)]
mod tests;
