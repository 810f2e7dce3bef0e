//! The `prewarm` policy: a thin driver of the gateway's fleet core
//! ([`prewarm_gateway::policy::fleet`]) over the simulated fleet in virtual time — the same
//! decisions the gateway's shell executes in production, fed the same observations:
//!
//! - pods: the initial pods are added and come up in the first health round (each one's
//!   `/v1/models` reconciled, then its warm-up started, as the gateway does); a joining pod is
//!   added and comes up at the next health round, as an operator's `POST /admin/pods` does; a
//!   restarting pod restarts between two health rounds (its counters reset at the next one,
//!   which the core takes for a restart and handles as a join);
//! - every `health_interval` (the gateway's default, 1 s): every pod's load (its KV usage,
//!   queue, cache geometry and prefix-cache counters, as `/metrics` reports them), every 5th
//!   round its served adapters (`/v1/models`);
//! - per request: the filter's own observation code in one filter VM ([`filter_vm`]), and every
//!   filter tick the batch it sends: its signals and the served records of the requests the
//!   table routed (core's `ServedRecord`: the pod, the prompt's shards and tokens, the model);
//! - every [`TICK_MS`]: the core's tick (warm-up steps, keep-warm, the table).
//!
//! Each action the core returns is executed on the simulated pod ([`execute`]) and reported back
//! to the core when the pod says it completed. Routing is the filter's choice over the core's
//! table: core's longest-prefix rule (`prewarm_core::prefix`) over an in-memory prefix index that
//! every routed request writes, as the filter writes its shared-data slots, and that each new
//! table's placed prefixes seed, as the filter seeds it when it adopts a table.

pub mod execute;
pub mod filter_vm;

use std::collections::BTreeMap;

use prewarm_core::prefix::{
    eviction_horizon_ms, record, route_prefix, seed, MemoryStore, PromptKeys, DEFAULT_SLOTS,
};
use prewarm_core::wire::{PlacedPrefix, RoutingTable, SignalBatch};
use prewarm_core::{BlockChain, FingerprintConfig};
use prewarm_gateway::config::{GatewayConfig, PodSpec};
use prewarm_gateway::policy::fleet::{
    Action, Fleet as FleetCore, FleetConfig, HealthChange, PodLoad, TICK_MS,
};
use prewarm_gateway::policy::lora::LoraSlots;
use prewarm_gateway::policy::{LoraDecision, Tier};

use self::filter_vm::FilterVm;
use super::baselines::RoundRobin;
use super::fleet::Fleet;
use super::policy::{Policy, RequestCtx};
use crate::scenario::FleetEvent;

/// The gateway's configuration the policy runs with: its defaults, with the fleet's pod
/// geometry, LoRA slots and placement knobs.
#[derive(Debug, Clone)]
pub struct PrewarmConfig {
    pub gateway: GatewayConfig,
    /// KV blocks of every pod.
    pub kv_blocks: usize,
    pub slots: LoraSlots,
}

impl PrewarmConfig {
    /// The gateway's defaults for pods of `kv_blocks` 16-token blocks and these LoRA slots.
    pub fn for_fleet(kv_blocks: usize, slots: LoraSlots, adapter_replicas: usize) -> Self {
        let mut gateway = GatewayConfig::default();
        gateway.pods.adapter_replicas = adapter_replicas.max(1);
        Self {
            gateway,
            kv_blocks,
            slots,
        }
    }

    pub fn with_tier_pools(mut self, on: bool) -> Self {
        self.gateway.pods.tier_pools = on;
        self
    }

    pub fn with_gold_pool_share(mut self, share: f64) -> Self {
        self.gateway.pods.gold_pool_share = share;
        self
    }

    pub fn with_load_factor(mut self, factor: Option<f64>) -> Self {
        self.gateway.routing.load_factor = factor;
        self
    }

    fn fleet(&self) -> FleetConfig {
        self.gateway.fleet()
    }

    fn pod_spec(&self, id: &str) -> PodSpec {
        let mut spec = PodSpec::new(id, id);
        spec.max_loras = self.slots.max_loras;
        spec.max_cpu_loras = Some(self.slots.max_cpu_loras);
        spec.num_blocks = Some(self.kv_blocks);
        spec
    }
}

/// The `/metrics` a simulated pod would serve at `now_s`, as the gateway reads them.
pub fn pod_load(fleet: &mut Fleet, pod: usize, now_s: f64, slots: LoraSlots) -> PodLoad {
    let block_size = fleet.config().block_size;
    let num_blocks = fleet.config().num_gpu_blocks;
    let Some(p) = fleet.pods.get_mut(pod) else {
        return PodLoad::default();
    };
    let m = p.pod.metrics(now_s);
    PodLoad {
        waiting: m.waiting as u64,
        running: m.running as u64,
        kv_usage: m.kv_cache_usage,
        block_size: Some(block_size),
        num_gpu_blocks: Some(num_blocks),
        max_lora: Some(slots.max_loras),
        running_adapters: Vec::new(),
        waiting_adapters: Vec::new(),
        prefix_cache_queries: Some(m.prefix_queries_tokens),
        prefix_cache_hits: Some(m.prefix_hits_tokens),
        request_successes: Some(
            m.finished_stop
                .saturating_add(m.finished_length)
                .saturating_add(m.finished_abort),
        ),
    }
}

/// The adapters a simulated pod's `/v1/models` lists.
pub fn served_adapters(fleet: &Fleet, pod: usize) -> Vec<String> {
    fleet.pods.get(pod).map_or_else(Vec::new, |p| {
        p.pod
            .registered_adapters()
            .map(|a| a.name.clone())
            .collect()
    })
}

/// An action in flight on a simulated pod: when it completes, and how.
#[derive(Debug)]
struct InFlight {
    done_s: f64,
    action: Action,
    /// Prefill: whether it succeeded. Adapter calls: the decisions that failed.
    ok: bool,
    failed: Vec<LoraDecision>,
    /// Adapter calls: the next decision to start when this one completes (the shell runs them
    /// one after another).
    next: usize,
}

/// The prewarm policy; see the module docs.
#[derive(Debug)]
pub struct Prewarm {
    config: PrewarmConfig,
    core: FleetCore,
    filter: FilterVm,
    fingerprint: FingerprintConfig,
    in_flight: Vec<InFlight>,
    warm_tokens: u64,
    /// The next tick and health round, whole ms (a sum of float periods drifts off the
    /// gateway's schedule).
    next_tick_ms: u64,
    next_health_ms: u64,
    health_rounds: u64,
    fallback: RoundRobin,
    /// Where prompts' shards were sent (the filter's shared-data slots, in memory).
    index: PrefixIndex,
}

/// The prefix index the filter keeps, in memory: its slots and its horizon.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    pub store: MemoryStore,
    pub horizon_ms: u64,
}

impl PrefixIndex {
    /// Writes a table's placed prefixes into the index at `now_ms`, as the filter does when it
    /// adopts the table (core's `prefix::seed`).
    pub fn seed(&mut self, prefixes: &[PlacedPrefix], now_ms: u64) {
        seed(&mut self.store, prefixes, now_ms, self.horizon_ms);
    }

    /// The filter's default slots, with the horizon of `fleet`'s pods: their KV capacity over
    /// their prefill rate (core's `eviction_horizon_ms`).
    pub fn for_fleet(fleet: &Fleet) -> Self {
        let c = fleet.config();
        let kv_tokens = (c.num_gpu_blocks as u64).saturating_mul(c.block_size as u64);
        let per_token = c.latency.per_uncached_token;
        let rate = if per_token > 0.0 {
            1.0 / per_token
        } else {
            0.0
        };
        Self {
            store: MemoryStore::new(DEFAULT_SLOTS),
            horizon_ms: eviction_horizon_ms(kv_tokens, rate),
        }
    }
}

fn ms(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1000.0).round() as u64
    } else {
        0
    }
}

impl Prewarm {
    /// The policy over `fleet`'s initial pods, with `adapters` registered at their tiers (the
    /// operator's registrations); the pods come up at the first [`Policy::advance`].
    pub fn new(
        config: PrewarmConfig,
        fleet: &Fleet,
        adapters: Vec<String>,
        tiers: BTreeMap<String, Tier>,
    ) -> Self {
        let mut config = config;
        config.gateway.pods.base_model = fleet.base_model().to_string();
        // The price of moving a request, as an operator sets it: the profile's prefill rate.
        let per_token_us = fleet.config().latency.per_uncached_token * 1e6;
        config.gateway.routing.prefill_us_per_token =
            (per_token_us.is_finite() && per_token_us > 0.0).then_some(per_token_us);
        let fleet_config = config.fleet();
        let fingerprint = fleet_config.fingerprint;
        let mut core = FleetCore::new(fleet_config, 0, 0);
        for name in adapters {
            let tier = tiers.get(&name).copied().unwrap_or_default();
            let path = format!("/adapters/{name}");
            let _ = core
                .registry_mut()
                .register_unverified(&name, &path, tier, false);
        }
        let mut me = Self {
            filter: FilterVm::new(fleet.base_model()),
            fingerprint,
            core,
            in_flight: Vec::new(),
            warm_tokens: 0,
            next_tick_ms: 0,
            next_health_ms: 0,
            health_rounds: 0,
            fallback: RoundRobin::default(),
            index: PrefixIndex::for_fleet(fleet),
            config,
        };
        for p in &fleet.pods {
            me.add(&p.id);
        }
        me
    }

    fn add(&mut self, id: &str) {
        let shape = self.config.gateway.pod_shape(&self.config.pod_spec(id));
        let _ = self.core.add_pod(shape, 0);
    }

    /// The routing table the filter routes with now.
    pub fn table(&self) -> &RoutingTable {
        self.core.table()
    }

    /// The fleet core it drives (to journal its actions, say).
    pub fn core_mut(&mut self) -> &mut FleetCore {
        &mut self.core
    }

    /// One health check of `pod` as the gateway's health loop makes it (`reconcile`: its
    /// `/v1/models` too).
    fn check(&mut self, fleet: &mut Fleet, pod: usize, ok: bool, reconcile: bool, now_s: f64) {
        let Some(id) = fleet.pods.get(pod).map(|p| p.id.clone()) else {
            return;
        };
        let now = ms(now_s);
        let load = ok.then(|| pod_load(fleet, pod, now_s, self.config.slots));
        let change = self.core.on_health(&id, ok, load, now);
        if let HealthChange::Joined(_) = change {
            let actions = self.core.on_models(&id, served_adapters(fleet, pod), now);
            self.execute_all(fleet, actions, now_s);
            self.core.start_warmup(&id, now);
        } else if ok && reconcile {
            let actions = self.core.on_models(&id, served_adapters(fleet, pod), now);
            self.execute_all(fleet, actions, now_s);
        }
    }

    /// A batch the filter sent, as the gateway ingests it.
    fn ingest(&mut self, fleet: &mut Fleet, batch: SignalBatch, now_s: f64) {
        let (_, actions) = self.core.on_signals(batch, ms(now_s));
        self.execute_all(fleet, actions, now_s);
    }

    fn health_round(&mut self, fleet: &mut Fleet, now_s: f64) {
        let reconcile = self.health_rounds.is_multiple_of(5);
        for pod in 0..fleet.pods.len() {
            self.check(fleet, pod, true, reconcile, now_s);
        }
        if self.health_rounds == 0 {
            // as the gateway's health loop: the pods of the first round were there before
            self.core.settle();
        }
        self.health_rounds = self.health_rounds.wrapping_add(1);
    }

    fn execute_all(&mut self, fleet: &mut Fleet, actions: Vec<Action>, now_s: f64) {
        for action in actions {
            self.start(fleet, action, now_s);
        }
    }

    /// Starts `action` on its simulated pod.
    fn start(&mut self, fleet: &mut Fleet, action: Action, now_s: f64) {
        let mut flight = InFlight {
            done_s: now_s,
            ok: true,
            failed: Vec::new(),
            next: 0,
            action,
        };
        if let Action::Prefill(p) = &flight.action {
            match fleet.pods.iter().position(|x| x.id == p.pod) {
                Some(pod) => {
                    let e = execute::prefill(fleet, pod, &p.model, &p.text, now_s);
                    self.warm_tokens += e.prefill_tokens;
                    flight.done_s = e.done_s;
                    flight.ok = e.ok;
                }
                None => flight.ok = false,
            }
        } else {
            self.next_decision(fleet, &mut flight, now_s);
        }
        self.in_flight.push(flight);
    }

    /// Starts the next decision of an adapter-calls action at `now_s`; returns whether there
    /// was one.
    fn next_decision(&mut self, fleet: &mut Fleet, flight: &mut InFlight, now_s: f64) -> bool {
        let Action::Adapters(calls) = &flight.action else {
            return false;
        };
        let Some(d) = calls.decisions.get(flight.next) else {
            return false;
        };
        flight.next += 1;
        let pod = fleet.pods.iter().position(|p| p.id == calls.pod);
        let e = match pod {
            Some(pod) => execute::lora_decision(fleet, pod, d, now_s),
            None => execute::Executed::default(),
        };
        self.warm_tokens += e.prefill_tokens;
        flight.done_s = e.done_s.max(now_s);
        if !e.ok {
            flight.failed.push(d.clone());
        }
        true
    }

    /// Reports the actions completed by `now_s`, in completion order; an adapter-calls action
    /// starts its next decision when the previous one completes.
    fn complete_due(&mut self, fleet: &mut Fleet, now_s: f64) {
        loop {
            let earliest = self
                .in_flight
                .iter()
                .enumerate()
                .filter(|(_, f)| f.done_s <= now_s)
                .min_by(|a, b| a.1.done_s.total_cmp(&b.1.done_s))
                .map(|(i, _)| i);
            let Some(i) = earliest else {
                return;
            };
            let mut f = self.in_flight.swap_remove(i);
            let done_s = f.done_s;
            if self.next_decision(fleet, &mut f, done_s) {
                self.in_flight.push(f);
                continue;
            }
            let at = ms(done_s);
            match &f.action {
                Action::Prefill(p) => self.core.prefill_done(p, f.ok.into(), at),
                Action::Adapters(calls) => self.core.adapters_done(calls, &f.failed, at),
            }
        }
    }

    fn tick(&mut self, fleet: &mut Fleet, now_s: f64) {
        let generation = self.core.table().generation;
        let actions = self.core.tick(ms(now_s));
        self.execute_all(fleet, actions, now_s);
        // a new table: its placed prefixes go into the index, as the filter writes them when
        // it adopts the table (a second later there; at once here)
        if self.core.table().generation != generation {
            self.index.seed(&self.core.table().prefixes, ms(now_s));
        }
    }
}

/// The filter's pod choice over a routing table at `now_ms` (core's `route_prefix` over the
/// prefix index), written into the index as the filter writes it.
pub fn choose_from_table(
    table: &RoutingTable,
    model: &str,
    chain: &BlockChain,
    fingerprint: &FingerprintConfig,
    index: &mut PrefixIndex,
    now_ms: u64,
) -> Option<String> {
    let keys = PromptKeys::of(chain, fingerprint);
    let route = route_prefix(table, model, &keys, &index.store, now_ms, index.horizon_ms)?;
    let id = route.primary.id.clone();
    record(&mut index.store, &keys, &id, now_ms, index.horizon_ms);
    Some(id)
}

impl Policy for Prewarm {
    fn name(&self) -> &'static str {
        "prewarm"
    }

    fn on_event(&mut self, fleet: &mut Fleet, event: FleetEvent, _now_s: f64) {
        match event {
            FleetEvent::AddPods { .. } => {
                let known = self.core.pods().count();
                let new: Vec<(usize, String)> = fleet
                    .pods
                    .iter()
                    .enumerate()
                    .skip(known)
                    .map(|(i, p)| (i, p.id.clone()))
                    .collect();
                // Up at the next health round.
                for (_, id) in new {
                    self.add(&id);
                }
            }
            // A quick restart, as Kubernetes restarts a container: no health check fails; the
            // next round's scrape shows the pod's prefix-cache counters reset, which the core
            // takes for a restart (`fleet::restart`) and handles as a join.
            FleetEvent::RestartPod { .. } => {}
        }
    }

    fn next_wakeup(&self) -> Option<f64> {
        let flights = self.in_flight.iter().map(|f| f.done_s);
        let due = self
            .next_tick_ms
            .min(self.next_health_ms)
            .min(self.filter.next_tick_ms()) as f64
            / 1000.0;
        Some(flights.fold(due, f64::min))
    }

    fn advance(&mut self, fleet: &mut Fleet, now_s: f64) {
        self.complete_due(fleet, now_s);
        let now = ms(now_s);
        if now >= self.next_health_ms {
            self.health_round(fleet, now_s);
            let interval = self.config.gateway.pods.health_interval_ms.max(1);
            while self.next_health_ms <= now {
                self.next_health_ms += interval;
            }
        }
        for batch in self.filter.tick(now) {
            self.ingest(fleet, batch, now_s);
        }
        if now >= self.next_tick_ms {
            self.tick(fleet, now_s);
            while self.next_tick_ms <= now {
                self.next_tick_ms += TICK_MS;
            }
        }
    }

    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize {
        let now = ms(request.now_s);
        self.filter.observe(request, now);
        let routed = choose_from_table(
            self.core.table(),
            request.model,
            request.chain,
            &self.fingerprint,
            &mut self.index,
            now,
        )
        .and_then(|id| fleet.pods.iter().position(|p| p.id == id));
        let pod = routed.unwrap_or_else(|| self.fallback.route(fleet, request));
        if let Some(p) = fleet.pods.get(pod) {
            self.filter.routed(request, &p.id, routed.is_some());
        }
        pod
    }

    fn warmup_prefill_tokens(&self) -> Option<u64> {
        Some(self.warm_tokens)
    }
}
