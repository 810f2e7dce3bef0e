//! LoRA adapter residency on one pod: which adapters to load, unload and touch.
//!
//! What vLLM has (ENGINE-FACTS): registered names (`/v1/models`, at most what the gateway
//! loaded), a host cache of `max_cpu_loras` and `max_loras` GPU slots, both evicting silently by
//! LRU of use; no pinning. So the policy controls registration directly (`Load`/`Unload`) and GPU
//! slots only indirectly (`Touch`: a one-token request that makes an adapter most recently used).
//!
//! **Modelled**: GPU slot residency (which adapters hold the `max_loras` slots), their entry
//! time, and each adapter's last two uses. **Observed** ([`LoraResidency::reconcile`]):
//! registration (`/v1/models` adapter cards, exact) and activity (`vllm:lora_requests_info`
//! running/waiting lists: running adapters do hold a slot; idle resident ones are not listed, so
//! absence there proves nothing).
//!
//! Choosing a GPU victim for an incoming adapter of tier `U`, an adapter `V` is eligible when it
//! is not pinned, has been resident at least its tier's minimum residency (gold 120 s, silver
//! 45 s, bronze 0 s), and either `V`'s tier is not above `U`'s or `V`'s tier holds more slots
//! than its guarantee (`round(share × max_loras)`: gold 35 %, silver 18 %, bronze the rest).
//! So a gold adapter within its guarantees is never evicted for bronze pressure. Among eligible
//! adapters the victim is the lowest tier, then LRU-2: an adapter used fewer than twice goes
//! first (oldest last use first), then the largest backward 2-distance (time since the
//! second-to-last use) divided by `1 + priority / priority_weight`. Registration victims (at
//! `max_cpu_loras`) follow the same order, adapters without a slot first.
//! Protected adapters (pinned, or gold/silver holding a slot) are touched every
//! `touch_interval_ms` so the pod's own LRU keeps them.
//!
//! With `loads = "external"` ([`AdapterLoads::External`]) another controller (llm-d, AIBrix, an
//! operator's own) registers and unregisters adapters: the policy never decides a `Load` or an
//! `Unload`, and an adapter is registered only when the pod reports it (`/v1/models`, the
//! running list, served traffic). It still models GPU slots and touches the registered adapters it
//! protects, since a touch is an ordinary request that changes no registration.

use std::collections::BTreeMap;

pub use prewarm_core::residency::{ResidencyRule, KEEP_REUSE_MS};
use serde::{Deserialize, Deserializer, Serialize};

use super::rules::Problems;
pub use crate::tier::Tier;

/// Who registers and unregisters LoRA adapters on the pods (`[lora] loads`).
///
/// Named after what it switches — the engine's `load_lora_adapter`/`unload_lora_adapter` calls —
/// with the filter's `endpoint_header_owner` words: `prewarm` does it, or something `external`
/// does. Everything else (observing which adapters each pod holds, touching them, warming
/// prefixes, routing) is the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterLoads {
    /// This gateway loads and unloads adapters as its residency policy decides (default).
    #[default]
    Prewarm,
    /// Another controller (llm-d, AIBrix, an operator) does: the gateway never calls the
    /// engine's load or unload endpoints and only observes what each pod holds.
    External,
}

impl<'de> Deserialize<'de> for AdapterLoads {
    /// Refuses any other value naming the key, so `check-config` says which field is wrong.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = String::deserialize(deserializer)?;
        match value.as_str() {
            "prewarm" => Ok(Self::Prewarm),
            "external" => Ok(Self::External),
            other => Err(serde::de::Error::custom(format_args!(
                "lora.loads: {other:?}: must be \"prewarm\" (this gateway loads and unloads \
                 adapters) or \"external\" (another controller does; the gateway only observes)"
            ))),
        }
    }
}

/// Guarantees of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierPolicy {
    /// Minimum time in a GPU slot before the adapter may be evicted, in ms.
    pub min_residency_ms: u64,
    /// Share of `max_loras` slots guaranteed to the tier, in [0, 1].
    pub slot_share: f64,
}

/// The `[lora]` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Gold tier (default 120,000 ms, share 0.35).
    pub gold: TierPolicy,
    /// Silver tier (default 45,000 ms, share 0.18).
    pub silver: TierPolicy,
    /// Bronze minimum residency in ms (default 0); bronze gets the remaining slots.
    pub bronze_min_residency_ms: u64,
    /// Protected adapters are touched when unused this long, in ms (default 30,000).
    pub touch_interval_ms: u64,
    /// Priority at which an adapter's LRU-2 age counts half (default 50; priorities are 0..99).
    pub priority_weight: f64,
    /// Which adapters a GPU slot keeps beyond the tier rules (default `lru2`: none).
    pub residency_rule: ResidencyRule,
    /// Who loads and unloads adapters on the pods (default `prewarm`; `external`: another
    /// controller, see [`AdapterLoads`]).
    pub loads: AdapterLoads,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            gold: TierPolicy {
                min_residency_ms: 120_000,
                slot_share: 0.35,
            },
            silver: TierPolicy {
                min_residency_ms: 45_000,
                slot_share: 0.18,
            },
            bronze_min_residency_ms: 0,
            touch_interval_ms: 30_000,
            priority_weight: 50.0,
            residency_rule: ResidencyRule::Lru2,
            loads: AdapterLoads::Prewarm,
        }
    }
}

impl LoraConfig {
    /// Every problem, as `field: value: rule`, each field name preceded by `prefix`.
    pub fn validate(&self, prefix: &str) -> Vec<String> {
        let mut p = Problems::new(prefix);
        for (name, t) in [("gold", &self.gold), ("silver", &self.silver)] {
            p.between(&format!("{name}.slot_share"), t.slot_share, 0.0, 1.0);
            p.between(
                &format!("{name}.min_residency_ms"),
                t.min_residency_ms,
                0,
                86_400_000,
            );
        }
        p.check(
            self.gold.slot_share + self.silver.slot_share <= 1.0,
            "silver.slot_share",
            self.silver.slot_share,
            "gold and silver shares must sum to at most 1",
        );
        p.between(
            "bronze_min_residency_ms",
            self.bronze_min_residency_ms,
            0,
            86_400_000,
        );
        p.between(
            "touch_interval_ms",
            self.touch_interval_ms,
            1_000,
            86_400_000,
        );
        p.positive("priority_weight", self.priority_weight);
        p.into_vec()
    }

    fn min_residency_ms(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Gold => self.gold.min_residency_ms,
            Tier::Silver => self.silver.min_residency_ms,
            Tier::Bronze => self.bronze_min_residency_ms,
        }
    }
}

/// A pod's LoRA capacity (`--max-loras`, `--max-cpu-loras`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraSlots {
    pub max_loras: usize,
    pub max_cpu_loras: usize,
}

/// What the shell should do on the pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "action", content = "adapter", rename_all = "snake_case")]
pub enum LoraDecision {
    /// Register the adapter (`POST /v1/load_lora_adapter`).
    Load(String),
    /// Unregister it (`POST /v1/unload_lora_adapter`).
    Unload(String),
    /// Send a one-token request with it so it takes (or keeps) a GPU slot.
    Touch(String),
}

impl LoraDecision {
    pub fn adapter(&self) -> &str {
        match self {
            Self::Load(a) | Self::Unload(a) | Self::Touch(a) => a,
        }
    }

    /// `load`, `unload` or `touch`: the call's name in metrics, replies and spans.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Load(_) => "load",
            Self::Unload(_) => "unload",
            Self::Touch(_) => "touch",
        }
    }
}

/// Why an adapter cannot be made resident now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoraRefusal {
    #[error(
        "adapter {0:?}: no GPU slot: every resident adapter is pinned or protected by its tier"
    )]
    NoGpuSlot(String),
    #[error(
        "adapter {0:?}: no registration slot: every registered adapter is pinned or protected"
    )]
    NoRegistrationSlot(String),
    #[error("adapter {0:?}: pins: {1}: every GPU slot but one is pinned already")]
    TooManyPins(String, usize),
    #[error("adapter {0:?}: the pod has no LoRA slots")]
    NoSlots(String),
}

/// What the pod reports, for [`LoraResidency::reconcile`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraObservation {
    /// Adapter names `/v1/models` lists (cards whose `parent` is set).
    pub registered: Vec<String>,
    /// `running_lora_adapters` of the newest `vllm:lora_requests_info` series.
    pub running: Vec<String>,
    /// `waiting_lora_adapters` of that series.
    pub waiting: Vec<String>,
}

/// One adapter's modelled state, for the admin API and the routing table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterResidency {
    pub name: String,
    pub tier: Tier,
    pub priority: u8,
    pub pinned: bool,
    /// Registered on the pod (loaded), or its load decided.
    pub registered: bool,
    /// Its load is in flight: registered but not served (not routed to) until the pod answers.
    pub loading: bool,
    /// Modelled to hold a GPU slot.
    pub in_gpu: bool,
    /// When it entered its GPU slot (ms), if it holds one.
    pub gpu_since_ms: Option<u64>,
    /// Its last use (ms), if any.
    pub last_use_ms: Option<u64>,
    /// The rule that decides whether it keeps its GPU slot (`[lora]`'s, or its tenant's
    /// experiment arm's).
    pub residency_rule: ResidencyRule,
}

#[derive(Debug, Clone, Default)]
struct AdapterState {
    tier: Tier,
    priority: u8,
    pinned: bool,
    registered: bool,
    /// A `Load` was decided and the pod has not answered it yet: the adapter counts against the
    /// pod's registration slots but is not served (vLLM answers 404 for it until the load ends).
    loading: bool,
    registered_since_ms: u64,
    gpu_since_ms: Option<u64>,
    /// Last use, then the use before it.
    uses: [Option<u64>; 2],
}

impl AdapterState {
    fn record_use(&mut self, now_ms: u64) {
        if self.uses[0] != Some(now_ms) {
            self.uses = [Some(now_ms), self.uses[0]];
        }
    }
}

/// The LoRA model of one pod. See the module docs.
#[derive(Debug, Clone)]
pub struct LoraResidency {
    config: LoraConfig,
    slots: LoraSlots,
    adapters: BTreeMap<String, AdapterState>,
    /// Adapters whose residency rule is not `config.residency_rule` (an experiment arm's, for
    /// its tenants' adapters), and the generation of the fleet's rules they came from.
    rules: BTreeMap<String, ResidencyRule>,
    rules_generation: u64,
}

/// Adapters remembered beyond the registered ones (for LRU-2 history), per registration slot.
const HISTORY_PER_SLOT: usize = 4;

impl LoraResidency {
    pub fn new(slots: LoraSlots, config: LoraConfig) -> Self {
        Self {
            config,
            slots,
            adapters: BTreeMap::new(),
            rules: BTreeMap::new(),
            rules_generation: 0,
        }
    }

    pub fn slots(&self) -> LoraSlots {
        self.slots
    }

    /// Who loads and unloads adapters on this pod (`[lora] loads`).
    pub fn loads(&self) -> AdapterLoads {
        self.config.loads
    }

    /// GPU slots guaranteed to `tier` on this pod (bronze: none; it gets what is left).
    pub fn guaranteed_slots(&self, tier: Tier) -> usize {
        let n = self.slots.max_loras as f64;
        let gold = (self.config.gold.slot_share * n).round() as usize;
        let gold = gold.min(self.slots.max_loras);
        match tier {
            Tier::Gold => gold,
            Tier::Silver => ((self.config.silver.slot_share * n).round() as usize)
                .min(self.slots.max_loras.saturating_sub(gold)),
            Tier::Bronze => 0,
        }
    }

    fn gpu_count(&self, tier: Option<Tier>) -> usize {
        self.adapters
            .values()
            .filter(|a| a.gpu_since_ms.is_some() && tier.is_none_or(|t| a.tier == t))
            .count()
    }

    fn registered_count(&self) -> usize {
        self.adapters.values().filter(|a| a.registered).count()
    }

    /// Eviction order key: smaller goes first.
    fn eviction_rank(&self, a: &AdapterState, now_ms: u64) -> (Tier, u8, f64) {
        match a.uses {
            [last, None] => (
                a.tier,
                0,
                -(now_ms.saturating_sub(last.unwrap_or(0)) as f64),
            ),
            [_, Some(second)] => {
                let age = now_ms.saturating_sub(second) as f64;
                let weight = 1.0 + f64::from(a.priority) / self.config.priority_weight.max(1e-9);
                (a.tier, 1, -(age / weight))
            }
        }
    }

    /// Takes the fleet's per-adapter residency rules of `generation` (a copy only when the
    /// generation is new to this pod).
    pub fn set_rules(&mut self, generation: u64, rules: &BTreeMap<String, ResidencyRule>) {
        if self.rules_generation != generation {
            self.rules = rules.clone();
            self.rules_generation = generation;
        }
    }

    /// The residency rule of adapter `name`.
    pub fn rule_of(&self, name: &str) -> ResidencyRule {
        self.rules
            .get(name)
            .copied()
            .unwrap_or(self.config.residency_rule)
    }

    /// Whether the residency rule of `name` keeps `a` (see [`ResidencyRule::SeedKeep`]).
    fn kept(&self, name: &str, a: &AdapterState) -> bool {
        if self.rule_of(name) != ResidencyRule::SeedKeep {
            return false;
        }
        let priority = f64::from(a.priority.min(99)) / 99.0;
        let reused = match a.uses {
            [Some(last), Some(second)] => last.saturating_sub(second) < KEEP_REUSE_MS,
            _ => false,
        };
        (reused && priority > 0.7) || priority > 0.95
    }

    fn gpu_eligible(&self, name: &str, v: &AdapterState, incoming: Tier, now_ms: u64) -> bool {
        let Some(since) = v.gpu_since_ms else {
            return false;
        };
        !v.pinned
            && !self.kept(name, v)
            && now_ms.saturating_sub(since) >= self.config.min_residency_ms(v.tier)
            && (v.tier <= incoming || self.gpu_count(Some(v.tier)) > self.guaranteed_slots(v.tier))
    }

    fn pick<'a>(
        &'a self,
        candidates: impl Iterator<Item = (&'a String, &'a AdapterState)>,
        now_ms: u64,
    ) -> Option<String> {
        candidates
            .min_by(|(an, a), (bn, b)| {
                let (ta, ua, sa) = self.eviction_rank(a, now_ms);
                let (tb, ub, sb) = self.eviction_rank(b, now_ms);
                ta.cmp(&tb)
                    .then(ua.cmp(&ub))
                    .then(sa.total_cmp(&sb))
                    .then_with(|| an.cmp(bn))
            })
            .map(|(n, _)| n.clone())
    }

    fn gpu_victim(&self, exclude: &str, incoming: Tier, now_ms: u64) -> Option<String> {
        self.pick(
            self.adapters.iter().filter(|(n, a)| {
                n.as_str() != exclude && self.gpu_eligible(n, a, incoming, now_ms)
            }),
            now_ms,
        )
    }

    fn registration_victim(&self, exclude: &str, incoming: Tier, now_ms: u64) -> Option<String> {
        let unslotted = self.pick(
            self.adapters.iter().filter(|(n, a)| {
                n.as_str() != exclude
                    && a.registered
                    && a.gpu_since_ms.is_none()
                    && !a.pinned
                    && now_ms.saturating_sub(a.registered_since_ms)
                        >= self.config.min_residency_ms(a.tier)
                    && a.tier <= incoming.max(Tier::Silver)
            }),
            now_ms,
        );
        unslotted.or_else(|| self.gpu_victim(exclude, incoming, now_ms))
    }

    fn state(&mut self, adapter: &str) -> &mut AdapterState {
        self.adapters.entry(adapter.to_string()).or_default()
    }

    /// Makes `adapter` resident in a GPU slot: `[Unload(victim)], Load(adapter)` when it is not
    /// registered, then `Touch(adapter)` when it holds no slot. Counts as a use. Refused (and
    /// nothing changes) when no victim is eligible. With external loads, an adapter the pod does
    /// not hold gets nothing (another controller decides whether it loads it), and one it holds
    /// only its `Touch`.
    pub fn ensure_resident(
        &mut self,
        adapter: &str,
        tier: Tier,
        priority: u8,
        now_ms: u64,
    ) -> Result<Vec<LoraDecision>, LoraRefusal> {
        if self.slots.max_loras == 0 || self.slots.max_cpu_loras == 0 {
            return Err(LoraRefusal::NoSlots(adapter.to_string()));
        }
        let current = self.adapters.get(adapter);
        let registered = current.is_some_and(|a| a.registered);
        let in_gpu = current.is_some_and(|a| a.gpu_since_ms.is_some());
        if !registered && self.config.loads == AdapterLoads::External {
            return Ok(Vec::new());
        }
        let mut decisions = Vec::new();
        let reg_victim = if !registered && self.registered_count() >= self.slots.max_cpu_loras {
            Some(
                self.registration_victim(adapter, tier, now_ms)
                    .ok_or_else(|| LoraRefusal::NoRegistrationSlot(adapter.to_string()))?,
            )
        } else {
            None
        };
        let gpu_full =
            self.gpu_count(None)
                .saturating_sub(usize::from(reg_victim.as_ref().is_some_and(|v| {
                    self.adapters
                        .get(v)
                        .is_some_and(|a| a.gpu_since_ms.is_some())
                })))
                >= self.slots.max_loras;
        let gpu_victim = if !in_gpu && gpu_full {
            let exclude_also = reg_victim.clone().unwrap_or_default();
            Some(
                self.pick(
                    self.adapters.iter().filter(|(n, a)| {
                        n.as_str() != adapter
                            && **n != exclude_also
                            && self.gpu_eligible(n, a, tier, now_ms)
                    }),
                    now_ms,
                )
                .ok_or_else(|| LoraRefusal::NoGpuSlot(adapter.to_string()))?,
            )
        } else {
            None
        };
        if let Some(v) = reg_victim {
            if let Some(a) = self.adapters.get_mut(&v) {
                a.registered = false;
                a.gpu_since_ms = None;
            }
            decisions.push(LoraDecision::Unload(v));
        }
        if let Some(v) = gpu_victim {
            if let Some(a) = self.adapters.get_mut(&v) {
                a.gpu_since_ms = None;
            }
        }
        let state = self.state(adapter);
        state.tier = tier;
        state.priority = priority.min(99);
        state.record_use(now_ms);
        if !state.registered {
            state.registered = true;
            state.loading = true;
            state.registered_since_ms = now_ms;
            decisions.push(LoraDecision::Load(adapter.to_string()));
        }
        if state.gpu_since_ms.is_none() {
            state.gpu_since_ms = Some(now_ms);
            decisions.push(LoraDecision::Touch(adapter.to_string()));
        }
        self.forget_old_history();
        Ok(decisions)
    }

    /// Pins `adapter` (at most `max_loras − 1` pins, so one slot always rotates) and makes it
    /// resident.
    pub fn pin(
        &mut self,
        adapter: &str,
        tier: Tier,
        now_ms: u64,
    ) -> Result<Vec<LoraDecision>, LoraRefusal> {
        let pins = self
            .adapters
            .iter()
            .filter(|(n, a)| a.pinned && n.as_str() != adapter)
            .count();
        if pins.saturating_add(1) > self.slots.max_loras.saturating_sub(1) {
            return Err(LoraRefusal::TooManyPins(adapter.to_string(), pins));
        }
        let priority = self.adapters.get(adapter).map_or(0, |a| a.priority);
        let decisions = self.ensure_resident(adapter, tier, priority, now_ms)?;
        self.state(adapter).pinned = true;
        Ok(decisions)
    }

    /// Unpins `adapter`; returns whether it was pinned.
    pub fn unpin(&mut self, adapter: &str) -> bool {
        self.adapters
            .get_mut(adapter)
            .map(|a| std::mem::replace(&mut a.pinned, false))
            .unwrap_or(false)
    }

    /// Forgets `adapter` (removed from the registry): `Unload` when it is registered (and this
    /// gateway loads adapters).
    pub fn remove(&mut self, adapter: &str) -> Vec<LoraDecision> {
        let ours = self.config.loads == AdapterLoads::Prewarm;
        match self.adapters.remove(adapter) {
            Some(a) if a.registered && ours => vec![LoraDecision::Unload(adapter.to_string())],
            _ => Vec::new(),
        }
    }

    /// Traffic used `adapter` (observed, e.g. in a running list): it is registered and holds a
    /// slot; when that overflows the slots, the pod evicted its least recently used adapter, which
    /// the model follows (tiers do not bind the pod's own LRU: that is what touches are for).
    pub fn observe_use(&mut self, adapter: &str, now_ms: u64) {
        let state = self.state(adapter);
        state.record_use(now_ms);
        state.loading = false;
        if !state.registered {
            state.registered = true;
            state.registered_since_ms = now_ms;
        }
        if state.gpu_since_ms.is_some() {
            return;
        }
        state.gpu_since_ms = Some(now_ms);
        if self.gpu_count(None) > self.slots.max_loras {
            let lru = self
                .adapters
                .iter()
                .filter(|(n, a)| a.gpu_since_ms.is_some() && n.as_str() != adapter)
                .min_by_key(|(n, a)| (a.uses[0], n.as_str()))
                .map(|(n, _)| n.clone());
            if let Some(a) = lru.and_then(|n| self.adapters.get_mut(&n)) {
                a.gpu_since_ms = None;
            }
        }
    }

    /// Touches for protected adapters (pinned, kept, or gold/silver in a slot) unused for
    /// `touch_interval_ms`, and re-loads of pinned adapters that are not resident.
    pub fn keep_warm(&mut self, now_ms: u64) -> Vec<LoraDecision> {
        let interval = self.config.touch_interval_ms;
        let mut out = Vec::new();
        let names: Vec<(String, Tier, u8, bool, bool, bool)> = self
            .adapters
            .iter()
            .map(|(n, a)| {
                (
                    n.clone(),
                    a.tier,
                    a.priority,
                    a.pinned,
                    a.gpu_since_ms.is_some(),
                    self.kept(n, a),
                )
            })
            .collect();
        for (name, tier, priority, pinned, in_gpu, kept) in names {
            if pinned && !in_gpu {
                if let Ok(d) = self.ensure_resident(&name, tier, priority, now_ms) {
                    out.extend(d);
                }
                continue;
            }
            if !(in_gpu && (pinned || kept || tier > Tier::Bronze)) {
                continue;
            }
            if let Some(a) = self.adapters.get_mut(&name) {
                let stale = a.uses[0].is_none_or(|u| now_ms.saturating_sub(u) >= interval);
                if stale {
                    a.record_use(now_ms);
                    out.push(LoraDecision::Touch(name));
                }
            }
        }
        out
    }

    /// Aligns the model with what the pod reports; returns the decisions that restore pins
    /// (a pinned adapter the pod lost is loaded again).
    pub fn reconcile(&mut self, observed: &LoraObservation, now_ms: u64) -> Vec<LoraDecision> {
        for (name, a) in self.adapters.iter_mut() {
            // A load in flight is not listed yet; its answer decides (`loaded`, `record_failure`).
            if a.registered && !a.loading && !observed.registered.iter().any(|r| r == name) {
                a.registered = false;
                a.gpu_since_ms = None;
            }
        }
        for name in &observed.registered {
            let a = self.state(name);
            a.loading = false;
            if !a.registered {
                a.registered = true;
                a.registered_since_ms = now_ms;
            }
        }
        for name in &observed.running {
            self.observe_use(name, now_ms);
        }
        for name in &observed.waiting {
            self.state(name).record_use(now_ms);
        }
        let lost: Vec<(String, Tier, u8)> = self
            .adapters
            .iter()
            .filter(|(_, a)| a.pinned && !a.registered)
            .map(|(n, a)| (n.clone(), a.tier, a.priority))
            .collect();
        let mut out = Vec::new();
        for (name, tier, priority) in lost {
            if let Ok(d) = self.ensure_resident(&name, tier, priority, now_ms) {
                out.extend(d);
            }
        }
        out
    }

    /// The pod answered a `Load` of `adapter`: from now on it is served (routed to).
    pub fn loaded(&mut self, adapter: &str) {
        if let Some(a) = self.adapters.get_mut(adapter) {
            a.loading = false;
        }
    }

    /// A decision failed on the pod: the model reverts what it assumed.
    pub fn record_failure(&mut self, decision: &LoraDecision) {
        let Some(a) = self.adapters.get_mut(decision.adapter()) else {
            return;
        };
        match decision {
            LoraDecision::Load(_) => {
                a.registered = false;
                a.loading = false;
                a.gpu_since_ms = None;
            }
            LoraDecision::Touch(_) => a.gpu_since_ms = None,
            LoraDecision::Unload(_) => a.registered = true,
        }
    }

    /// Drops history of unregistered, unpinned adapters beyond `HISTORY_PER_SLOT` per slot.
    fn forget_old_history(&mut self) {
        let limit = self
            .slots
            .max_cpu_loras
            .saturating_mul(HISTORY_PER_SLOT)
            .max(64);
        if self.adapters.len() <= limit {
            return;
        }
        let mut idle: Vec<(Option<u64>, String)> = self
            .adapters
            .iter()
            .filter(|(_, a)| !a.registered && !a.pinned)
            .map(|(n, a)| (a.uses[0], n.clone()))
            .collect();
        idle.sort();
        let excess = self.adapters.len() - limit;
        for (_, name) in idle.into_iter().take(excess) {
            self.adapters.remove(&name);
        }
    }

    /// Every adapter the model knows, by name.
    pub fn adapters(&self) -> Vec<AdapterResidency> {
        self.adapters
            .iter()
            .map(|(n, a)| AdapterResidency {
                name: n.clone(),
                tier: a.tier,
                priority: a.priority,
                pinned: a.pinned,
                registered: a.registered,
                loading: a.loading,
                in_gpu: a.gpu_since_ms.is_some(),
                gpu_since_ms: a.gpu_since_ms,
                last_use_ms: a.uses[0],
                residency_rule: self.rule_of(n),
            })
            .collect()
    }

    /// Registered adapters (what the pod serves without a disk load), by name; an adapter whose
    /// load is in flight is not served yet.
    pub fn served(&self) -> impl Iterator<Item = &str> {
        self.adapters
            .iter()
            .filter(|(_, a)| a.registered && !a.loading)
            .map(|(n, _)| n.as_str())
    }

    /// Registered adapters modelled to hold a GPU slot, by name.
    pub fn resident(&self) -> impl Iterator<Item = &str> {
        self.adapters
            .iter()
            .filter(|(_, a)| a.registered && !a.loading && a.gpu_since_ms.is_some())
            .map(|(n, _)| n.as_str())
    }
}

#[cfg(test)]
mod tests;
