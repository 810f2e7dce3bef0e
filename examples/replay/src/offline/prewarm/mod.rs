//! The `prewarm` policy: the gateway's own policy modules and the filter's triggers, driven in
//! virtual time over the simulated fleet — the same code that runs in production.
//!
//! - Per request, the filter side ([`triggers`]) turns the request into signals; prefill and
//!   feedback signals go to the prompt pool (`PromptPool`), pin signals to the LoRA residency
//!   (`LoraResidency::ensure_resident`) of the `adapter_replicas` pods the adapter is placed on
//!   (core's `rank` over its name's chain seed, as the gateway places adapters). A prefix that a
//!   prefill signal makes hot joins the warm set (`KvResidency::keep_warm_prefix`) of the pod
//!   that served it, so keep-warm re-prefills it before the pod's LRU would evict it.
//! - The served request updates the pod's KV model (`record_traffic`) and LoRA model
//!   (`observe_use`).
//! - Every second (the gateway's keep-warm period): each routable pod's KV usage is observed,
//!   `KvResidency::keep_warm` and `LoraResidency::keep_warm` decisions are executed, the pool
//!   decays, and the routing table is rebuilt (`RoutingTableBuilder`, adapters = the pod's
//!   `LoraResidency::served`).
//! - The initial pods are warmed at the start (their placed adapters: nothing is hot yet),
//!   every pod a placement candidate.
//! - A pod that joins or restarts gets a warm-up plan (`plan_warmup_scoped`: its placed
//!   adapters, then the hot prefixes that move to it, an adapter's prefixes placed among the
//!   pods serving the adapter) paced by `WarmupProgress` (actions complete when
//!   the pod model says they do); it enters the table when `routable`.
//! - Routing is the filter's choice over the table: the pods serving the adapter first (all
//!   when none does), core's placement on the prompt's routing key.

mod execute;
mod triggers;

use std::collections::BTreeMap;

use podsim::Admission;
use prewarm_core::fingerprint::{chain_seed, shards_of};
use prewarm_core::trigger::TriggerConfig;
use prewarm_core::wire::{RoutingTable, Signal};
use prewarm_core::{rank, BlockChain, FingerprintConfig, PlacementCandidate};
use prewarm_gateway::policy::lora::LoraSlots;
use prewarm_gateway::policy::warmup::PodPressure;
use prewarm_gateway::policy::{
    plan_warmup_scoped, HotnessConfig, KvConfig, KvResidency, LoraConfig, LoraDecision,
    LoraResidency, PodRoute, PromptPool, RoutingConfig, RoutingTableBuilder, ScopedCandidates,
    Tier, TierPools, WarmupAction, WarmupConfig, WarmupProgress,
};

use self::execute::Executed;
use self::triggers::FilterSide;
use super::baselines::RoundRobin;
use super::fleet::Fleet;
use super::policy::{Policy, RequestCtx};
use crate::scenario::{FleetEvent, TableAdapters};

/// The gateway's configuration sections the policy runs with (the gateway's defaults, except
/// where the fleet fixes the pod geometry).
#[derive(Debug, Clone)]
pub struct PrewarmConfig {
    pub fingerprint: FingerprintConfig,
    pub triggers: TriggerConfig,
    pub hotness: HotnessConfig,
    pub kv: KvConfig,
    pub lora: LoraConfig,
    pub warmup: WarmupConfig,
    pub routing: RoutingConfig,
    pub slots: LoraSlots,
    pub adapter_replicas: usize,
    /// Share of the pods serving gold tenants' adapters (the gateway's `pods.gold_pool_share`).
    pub gold_pool_share: f64,
    /// Which adapters the table lists (the gateway lists the registered ones).
    pub table_adapters: TableAdapters,
    /// Keep-warm and table period, seconds (the gateway's loop runs every second).
    pub period_s: f64,
}

impl PrewarmConfig {
    /// The defaults for pods of `kv_blocks` 16-token blocks and these LoRA slots.
    pub fn for_fleet(kv_blocks: usize, slots: LoraSlots, adapter_replicas: usize) -> Self {
        let kv_blocks = kv_blocks as u64;
        let defaults = KvConfig::default();
        Self {
            fingerprint: FingerprintConfig::default(),
            triggers: TriggerConfig::default(),
            hotness: HotnessConfig {
                // prefixes up to the filter's fingerprinted 32,768 tokens
                max_prefix_bytes: 4 * 32_768,
                ..HotnessConfig::default()
            },
            kv: KvConfig {
                capacity_blocks: kv_blocks,
                reserved_initial_blocks: defaults.reserved_initial_blocks.min(kv_blocks),
                reserved_max_blocks: defaults.reserved_max_blocks.min(kv_blocks),
                ..defaults
            },
            lora: LoraConfig::default(),
            warmup: WarmupConfig::default(),
            routing: RoutingConfig::default(),
            slots,
            adapter_replicas: adapter_replicas.max(1),
            gold_pool_share: 0.0,
            table_adapters: TableAdapters::Registered,
            period_s: 1.0,
        }
    }
}

#[derive(Debug)]
struct BrainPod {
    kv: KvResidency,
    lora: LoraResidency,
    warmup: Option<WarmupProgress>,
    /// Warm-up actions in flight with their completion time.
    in_flight: Vec<(f64, WarmupAction, bool)>,
}

/// The prewarm policy; see the module docs.
#[derive(Debug)]
pub struct Prewarm {
    config: PrewarmConfig,
    filter: FilterSide,
    pool: PromptPool,
    table: RoutingTableBuilder,
    pods: Vec<BrainPod>,
    tiers: BTreeMap<String, Tier>,
    adapters: Vec<String>,
    warm_tokens: u64,
    next_tick_s: f64,
    /// The initial pods' warm-up (their placed adapters) has been started.
    started: bool,
    fallback: RoundRobin,
}

fn ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).round() as u64
    } else {
        0
    }
}

impl Prewarm {
    /// The policy over `fleet`'s initial pods (cold, no warm-up: nothing is hot yet).
    pub fn new(
        config: PrewarmConfig,
        fleet: &Fleet,
        adapters: Vec<String>,
        tiers: BTreeMap<String, Tier>,
    ) -> Self {
        let mut me = Self {
            filter: FilterSide::new(config.triggers, config.fingerprint),
            pool: PromptPool::new(config.hotness.clone(), 0),
            table: RoutingTableBuilder::new(
                config.fingerprint.block_tokens,
                config.routing.clone(),
                0,
            ),
            pods: Vec::new(),
            tiers,
            adapters,
            warm_tokens: 0,
            next_tick_s: 0.0,
            started: false,
            fallback: RoundRobin::default(),
            config,
        };
        for _ in &fleet.pods {
            me.pods.push(me.cold_brain());
        }
        me.rebuild_table(fleet, 0.0);
        me
    }

    fn cold_brain(&self) -> BrainPod {
        BrainPod {
            kv: KvResidency::new(self.config.kv.clone(), 0),
            lora: LoraResidency::new(self.config.slots, self.config.lora.clone()),
            warmup: None,
            in_flight: Vec::new(),
        }
    }

    fn tier(&self, adapter: &str) -> Tier {
        self.tiers.get(adapter).copied().unwrap_or_default()
    }

    fn routable(&self, pod: usize, now_s: f64) -> bool {
        self.pods
            .get(pod)
            .is_some_and(|p| p.warmup.as_ref().is_none_or(|w| w.routable(ms(now_s))))
    }

    /// The routing table the filter routes with now.
    pub fn table(&self) -> &RoutingTable {
        self.table.table()
    }

    /// The tier pools over every pod of the fleet (as the gateway's, over every pod in its pool).
    fn pools(&self, fleet: &Fleet) -> TierPools {
        let all: Vec<usize> = (0..fleet.pods.len()).collect();
        TierPools::new(self.config.gold_pool_share, &fleet.candidates(&all))
    }

    fn rebuild_table(&mut self, fleet: &Fleet, now_s: f64) {
        let routable: Vec<bool> = (0..self.pods.len())
            .map(|i| self.routable(i, now_s))
            .collect();
        let pools = self.pools(fleet);
        let resident: Vec<Vec<String>> = self
            .pods
            .iter()
            .map(|b| match self.config.table_adapters {
                TableAdapters::Registered => Vec::new(),
                TableAdapters::Resident => b
                    .lora
                    .adapters()
                    .into_iter()
                    .filter(|a| a.in_gpu)
                    .map(|a| a.name)
                    .collect(),
            })
            .collect();
        let routes: Vec<PodRoute<'_>> = fleet
            .pods
            .iter()
            .zip(&self.pods)
            .zip(resident.iter())
            .zip(routable)
            .map(|(((p, b), resident), routable)| PodRoute {
                id: &p.id,
                address: &p.id,
                weight: 1.0,
                load: None,
                adapters: match self.config.table_adapters {
                    TableAdapters::Registered => b.lora.served().collect::<Vec<_>>(),
                    TableAdapters::Resident => resident.iter().map(String::as_str).collect(),
                }
                .into_iter()
                .filter(|a| pools.admits(self.tier(a), &p.id))
                .collect(),
                routable,
            })
            .collect();
        self.table.build(&routes, ms(now_s));
    }

    /// The placement candidates now: the routable pods, plus `extra`; every pod when `all`.
    fn members(&self, fleet: &Fleet, extra: Option<usize>, all: bool, now_s: f64) -> Vec<usize> {
        (0..fleet.pods.len())
            .filter(|&i| all || Some(i) == extra || self.routable(i, now_s))
            .collect()
    }

    /// The pods `adapter` is placed on among `members` of its tier's pool (the gateway's
    /// adapter placement).
    fn placed_pods(&self, fleet: &Fleet, adapter: &str, members: &[usize]) -> Vec<usize> {
        let pools = self.pools(fleet);
        let tier = self.tier(adapter);
        let members: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| fleet.pods.get(i).is_some_and(|p| pools.admits(tier, &p.id)))
            .collect();
        let candidates = fleet.candidates(&members);
        rank(chain_seed(adapter), &candidates)
            .into_iter()
            .take(self.config.adapter_replicas)
            .filter_map(|i| members.get(i).copied())
            .collect()
    }

    fn run_lora(
        &mut self,
        fleet: &mut Fleet,
        pod: usize,
        decisions: &[LoraDecision],
        now_s: f64,
    ) -> f64 {
        let mut done = now_s;
        for d in decisions {
            let e = execute::lora_decision(fleet, pod, d, now_s);
            self.warm_tokens += e.prefill_tokens;
            if !e.ok {
                if let Some(b) = self.pods.get_mut(pod) {
                    b.lora.record_failure(d);
                }
            }
            done = done.max(e.done_s);
        }
        done
    }

    /// Prefills the pool entry `key` on `pod`; `None` when the pool no longer has it.
    fn prefill_key(
        &mut self,
        fleet: &mut Fleet,
        pod: usize,
        key: prewarm_gateway::policy::PrefixKey,
        now_s: f64,
    ) -> Option<Executed> {
        let (model, text, blocks) = {
            let view = self.pool.get(&key)?;
            (
                view.model.to_string(),
                view.text.to_string(),
                view.blocks.to_vec(),
            )
        };
        let e = execute::prefill(fleet, pod, &model, &text, now_s);
        self.warm_tokens += e.prefill_tokens;
        if let Some(b) = self.pods.get_mut(pod) {
            if e.ok {
                b.kv.record_prefill(
                    key,
                    &shards_of(&blocks, &self.config.fingerprint),
                    ms(now_s),
                );
            } else {
                b.kv.prefill_failed(&key);
            }
        }
        Some(e)
    }

    /// The placement scope of every adapter some member serves (as the gateway's
    /// `service/placement.rs` builds it): the pods whose table entry lists it, the planned pod
    /// counting as serving the adapters its warm-up is about to load.
    fn adapter_scopes<'a>(
        &self,
        pools: &TierPools,
        members: &[usize],
        candidates: &[PlacementCandidate<'a>],
        planned_pod: usize,
        planned: &[String],
    ) -> ScopedCandidates<'a> {
        let mut scopes = ScopedCandidates::new();
        for (&i, c) in members.iter().zip(candidates) {
            let served = self
                .pods
                .get(i)
                .into_iter()
                .flat_map(|b| b.lora.served())
                .filter(|a| pools.admits(self.tier(a), c.id));
            let planned_here = planned
                .iter()
                .map(String::as_str)
                .filter(|_| i == planned_pod);
            let mut names: Vec<&str> = served.chain(planned_here).collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                scopes.entry(chain_seed(name)).or_default().push(*c);
            }
        }
        scopes
    }

    /// Plans and starts `pod`'s warm-up; `all`: every pod is a placement candidate (the
    /// initial pods, which start together).
    fn start_warmup(&mut self, fleet: &Fleet, pod: usize, all: bool, now_s: f64) {
        let Some(id) = fleet.pods.get(pod).map(|p| p.id.clone()) else {
            return;
        };
        let members = self.members(fleet, Some(pod), all, now_s);
        let candidates = fleet.candidates(&members);
        let mut adapters: Vec<(Tier, String)> = self
            .adapters
            .iter()
            .filter(|a| self.placed_pods(fleet, a, &members).contains(&pod))
            .map(|a| (self.tier(a), a.clone()))
            .collect();
        adapters.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let adapters: Vec<String> = adapters.into_iter().map(|(_, a)| a).collect();
        let hot = self
            .pool
            .hot_prefixes(self.config.warmup.max_candidates, &self.config.fingerprint);
        let pools = self.pools(fleet);
        let scopes = self.adapter_scopes(&pools, &members, &candidates, pod, &adapters);
        let plan = plan_warmup_scoped(
            &id,
            &candidates,
            &scopes,
            &adapters,
            &hot,
            &self.config.warmup,
        );
        let cold = self.cold_brain();
        if let Some(b) = self.pods.get_mut(pod) {
            let previous = b.warmup.take();
            *b = cold;
            b.warmup = Some(match previous {
                Some(p) => p.restarted(plan, ms(now_s)),
                None => WarmupProgress::start(plan, self.config.warmup.clone(), ms(now_s)),
            });
        }
    }

    /// Completes due warm-up actions of `pod` and starts the next ones.
    fn step_warmup(&mut self, fleet: &mut Fleet, pod: usize, now_s: f64) {
        let now = ms(now_s);
        let Some(b) = self.pods.get_mut(pod) else {
            return;
        };
        let Some(progress) = b.warmup.as_mut() else {
            return;
        };
        let (due, later): (Vec<_>, Vec<_>) =
            b.in_flight.drain(..).partition(|(t, _, _)| *t <= now_s);
        b.in_flight = later;
        for (_, action, ok) in due {
            if ok {
                progress.completed(&action, now);
            } else {
                progress.failed(&action, now);
            }
        }
        let pressure = fleet
            .pods
            .get_mut(pod)
            .map(|p| {
                let m = p.pod.metrics(now_s);
                PodPressure {
                    waiting: m.waiting as u64,
                    kv_usage: m.kv_cache_usage,
                }
            })
            .unwrap_or_default();
        let actions = progress.next_actions(pressure, now);
        for action in actions {
            let result = match &action {
                WarmupAction::LoadAdapter(a) => {
                    let tier = self.tier(a);
                    let decided = self
                        .pods
                        .get_mut(pod)
                        .map(|b| b.lora.ensure_resident(a, tier, 0, now));
                    match decided {
                        Some(Ok(ds)) => Some((self.run_lora(fleet, pod, &ds, now_s), true)),
                        _ => Some((now_s, false)),
                    }
                }
                WarmupAction::Prefill(key) => self
                    .prefill_key(fleet, pod, *key, now_s)
                    .map(|e| (e.done_s, e.ok)),
            };
            let Some(b) = self.pods.get_mut(pod) else {
                return;
            };
            match result {
                Some((done, ok)) => b.in_flight.push((done, action, ok)),
                None => {
                    if let Some(p) = b.warmup.as_mut() {
                        p.skipped(&action, now);
                    }
                }
            }
        }
    }

    /// The once-a-period work: KV usage, keep-warm (KV and LoRA), pool decay, the table.
    fn tick(&mut self, fleet: &mut Fleet, now_s: f64) {
        let now = ms(now_s);
        for pod in 0..self.pods.len() {
            let usage = fleet
                .pods
                .get_mut(pod)
                .map_or(0.0, |p| p.pod.metrics(now_s).kv_cache_usage);
            if let Some(b) = self.pods.get_mut(pod) {
                b.kv.observe_usage(usage);
            }
            if !self.routable(pod, now_s) {
                continue;
            }
            let Some(b) = self.pods.get_mut(pod) else {
                continue;
            };
            let kv_due = b.kv.keep_warm(now);
            let lora_due = b.lora.keep_warm(now);
            for k in kv_due {
                if self.prefill_key(fleet, pod, k.key, now_s).is_none() {
                    if let Some(b) = self.pods.get_mut(pod) {
                        b.kv.forget(&k.key);
                    }
                }
            }
            self.run_lora(fleet, pod, &lora_due, now_s);
        }
        self.pool.tick(now);
        self.rebuild_table(fleet, now_s);
    }

    fn apply_signals(&mut self, fleet: &mut Fleet, pod: usize, signals: Vec<Signal>, now_s: f64) {
        let now = ms(now_s);
        for signal in signals {
            match signal {
                Signal::Prefill(p) => {
                    let shards = shards_of(&p.prefix, &self.config.fingerprint);
                    if let Ok(key) = self.pool.apply_prefill(p, now) {
                        if let Some(b) = self.pods.get_mut(pod) {
                            b.kv.keep_warm_prefix(key, &shards);
                        }
                    }
                }
                Signal::Feedback(f) => {
                    self.pool.apply_feedback(&f, now);
                }
                Signal::Pin(pin) => {
                    let tier = self.tier(&pin.adapter);
                    let members = self.members(fleet, None, false, now_s);
                    for target in self.placed_pods(fleet, &pin.adapter, &members) {
                        let decided = self.pods.get_mut(target).map(|b| {
                            b.lora
                                .ensure_resident(&pin.adapter, tier, pin.priority, now)
                        });
                        if let Some(Ok(ds)) = decided {
                            self.run_lora(fleet, target, &ds, now_s);
                        }
                    }
                }
            }
        }
    }
}

/// The filter's pod choice over a routing table (core's `route_request`, as the filter makes it).
pub fn choose_from_table(
    table: &RoutingTable,
    model: &str,
    chain: &BlockChain,
    fingerprint: &FingerprintConfig,
) -> Option<String> {
    let key = chain.routing_key(fingerprint)?;
    prewarm_core::route::route_request(table, model, key.0).map(|(p, _)| p.id.clone())
}

impl Policy for Prewarm {
    fn name(&self) -> &'static str {
        "prewarm"
    }

    fn on_event(&mut self, fleet: &mut Fleet, event: FleetEvent, now_s: f64) {
        match event {
            FleetEvent::AddPods { .. } => {
                while self.pods.len() < fleet.pods.len() {
                    let pod = self.pods.len();
                    self.pods.push(self.cold_brain());
                    self.start_warmup(fleet, pod, false, now_s);
                    self.step_warmup(fleet, pod, now_s);
                }
            }
            FleetEvent::RestartPod { index, .. } => {
                self.start_warmup(fleet, index, false, now_s);
                self.step_warmup(fleet, index, now_s);
            }
        }
        self.rebuild_table(fleet, now_s);
    }

    fn next_wakeup(&self) -> Option<f64> {
        let flights = self
            .pods
            .iter()
            .flat_map(|p| p.in_flight.iter().map(|(t, _, _)| *t));
        Some(flights.fold(self.next_tick_s, f64::min))
    }

    fn advance(&mut self, fleet: &mut Fleet, now_s: f64) {
        if !self.started {
            self.started = true;
            for pod in 0..self.pods.len() {
                self.start_warmup(fleet, pod, true, now_s);
            }
            for pod in 0..self.pods.len() {
                self.step_warmup(fleet, pod, now_s);
            }
            self.rebuild_table(fleet, now_s);
        }
        let warming: Vec<usize> = (0..self.pods.len())
            .filter(|&i| {
                self.pods
                    .get(i)
                    .is_some_and(|p| p.in_flight.iter().any(|(t, _, _)| *t <= now_s))
            })
            .collect();
        for pod in warming {
            self.step_warmup(fleet, pod, now_s);
        }
        if now_s >= self.next_tick_s {
            for pod in 0..self.pods.len() {
                if self
                    .pods
                    .get(pod)
                    .is_some_and(|p| p.warmup.is_some() && p.in_flight.is_empty())
                {
                    self.step_warmup(fleet, pod, now_s);
                }
            }
            self.tick(fleet, now_s);
            while self.next_tick_s <= now_s {
                self.next_tick_s += self.config.period_s;
            }
        }
    }

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        choose_from_table(
            self.table.table(),
            request.model,
            request.chain,
            &self.config.fingerprint,
        )
        .and_then(|id| fleet.pods.iter().position(|p| p.id == id))
        .unwrap_or_else(|| self.fallback.route(fleet, request))
    }

    fn served(
        &mut self,
        fleet: &mut Fleet,
        request: &RequestCtx<'_>,
        pod: usize,
        _admission: &Admission,
    ) {
        let now = ms(request.now_s);
        if let Some(b) = self.pods.get_mut(pod) {
            b.kv.record_traffic(&request.chain.shards(&self.config.fingerprint), now);
            if let Some(a) = request.adapter {
                b.lora.observe_use(a, now);
            }
        }
        let signals = self.filter.observe(request, now);
        self.apply_signals(fleet, pod, signals, request.now_s);
    }

    fn warmup_prefill_tokens(&self) -> Option<u64> {
        Some(self.warm_tokens)
    }
}
