//! The fleet core: one owner of every fleet decision, shared by the gateway and the evaluator.
//!
//! It owns the pods' models (health and epoch, load, KV, LoRA, warm-up progress), the prompt
//! pool, the adapter registry (whose tiers and pins placement reads) and the routing table.
//! Inputs in, actions out, `now` passed in: no I/O, no clock, no locks. The gateway's async
//! shell feeds it what it observes (health, metrics, `/v1/models`, signals, served traffic) and
//! executes its [`Action`]s against the engines, reporting each completion back; the offline
//! evaluator drives the very same calls against simulated pods in virtual time, so what it
//! measures is what ships.
//!
//! - inputs: [`Fleet::add_pod`]/[`Fleet::remove_pod`], [`Fleet::on_check`] (a health check
//!   with its scrape; a pod that restarted while up re-joins, [`restart`]),
//!   [`Fleet::on_models`], [`Fleet::on_signals`], [`Fleet::on_served`], the engine's KV-cache
//!   events ([`Fleet::on_kv_events`], [`engine_blocks`]), operator pins
//!   ([`Fleet::pin_adapter`], [`Fleet::unpin_adapter`], [`Fleet::remove_adapter`]); a pod's
//!   prefix-cache counters reconcile its KV model ([`FleetPod`]);
//! - [`Fleet::tick`], every [`TICK_MS`]: the warm-ups' next steps, keep-warm every
//!   `keep_warm_period_ms`, the routing table;
//! - completions: [`Fleet::prefill_done`] (ok, rejected — the pool backs the entry off — or
//!   failed), [`Fleet::adapters_done`];
//! - outputs: the actions, [`Fleet::table`], and [`Note`]s for metrics and logs
//!   ([`Fleet::take_notes`]).
//!
//! ## Parts
//!
//! The fleet composes parts that own their state and keep its invariants (each states them in
//! its doc): each pod's model ([`FleetPod`]: health and epoch, load, its KV model
//! (`policy::kv`), its LoRA residency (`policy::lora`), its warm-up progress ([`PodWarmup`],
//! `policy::warmup`)); the prompt pool (`policy::hotness`); the adapter registry; adapter
//! placement ([`Placement`]: demand and replica sets); the experiment ([`Experiments`]); the
//! keep-warm period ([`KeepWarmPeriod`]: when the next is due, the prefixes the last placed); the
//! routing table (`policy::routing`); and the outputs ([`Outputs`]: notes and the journal).
//! The `impl Fleet` blocks, one file per job (`docs/architecture.md` maps them), are the
//! decisions that read several parts.

mod action;
#[cfg(test)]
mod admission_tests;
mod busy;
pub mod engine_blocks;
mod experiment;
#[cfg(test)]
mod external_loads_tests;
mod keep_warm;
#[cfg(test)]
mod placed_tests;
mod placement;
mod planning;
mod pod;
mod prefix_placement;
pub mod restart;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod shape_tests;
mod signals;
mod steps;
#[cfg(test)]
mod tests;
mod wait;
#[cfg(test)]
mod warm_load_tests;

use std::collections::BTreeMap;

use prewarm_core::wire::{RoutingTable, ServedRecord};
use prewarm_core::FingerprintConfig;

pub use action::{Action, AdapterCalls, Cause, Note, Outputs, Prefill, PrefillOutcome};
pub use experiment::{ExperimentError, Experiments, RunningExperiment};
pub use keep_warm::KeepWarmPeriod;
pub use placement::{
    listed_adapters, placed_pods_among, registry_tier, Placement, DEMAND_WINDOW_MS,
};
pub use planning::Candidates;
pub use pod::{
    FleetPod, KvCounters, KvReconciliation, PodHealth, PodLoad, PodShape, PodWarmup, KV_GAP_WINDOW,
    KV_WINDOW,
};
pub use restart::{RestartEvidence, RestartWatch};

use crate::policy::lora::LoraObservation;
use crate::policy::{
    HotnessConfig, LoraConfig, PodRoute, PromptPool, RoutingConfig, RoutingTableBuilder,
    SemanticGroups, WarmupConfig,
};
use crate::registry::AdapterRegistry;

/// How often the shell calls [`Fleet::tick`] (the warm-ups' pace; keep-warm has its own period).
pub const TICK_MS: u64 = 100;

/// Pods the fleet holds at most.
pub const MAX_PODS: usize = 4096;

/// Most block hashes a pod's KV-event ledger holds (~40 MB of hashes at 8 bytes and the set's
/// overhead); the ledger's own bound is 4 × the pod's capacity, under this.
pub const MAX_ENGINE_BLOCKS: u64 = 4_000_000;

/// The policies' configuration sections, as the gateway's config file has them.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub fingerprint: FingerprintConfig,
    pub hotness: HotnessConfig,
    pub lora: LoraConfig,
    pub warmup: WarmupConfig,
    pub routing: RoutingConfig,
    /// Pods each adapter is placed on (`pods.adapter_replicas`).
    pub adapter_replicas: usize,
    /// Gold and the other tiers on pools sized from their demand (`pods.tier_pools`).
    pub tier_pools: bool,
    /// Share of the pods serving gold tenants' adapters (`pods.gold_pool_share`; 0: sized from
    /// demand with `tier_pools`, else one pool).
    pub gold_pool_share: f64,
    /// Failed health checks in a row before a pod is down (`pods.unhealthy_after`).
    pub unhealthy_after: u32,
    /// Keep-warm period, ms (1,000: vLLM's LRU moves on the scale of requests, not ticks).
    pub keep_warm_period_ms: u64,
    /// The base model's name (`pods.base_model`): a served request for another model used an
    /// adapter.
    pub base_model: String,
}

/// Why a pod could not be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    #[error("id: {0:?}: a pod with this id exists")]
    Exists(String),
    #[error("pod {0:?}: not in the pool")]
    Unknown(String),
    #[error("pods: {0}: the pool is full")]
    Full(usize),
}

/// One health check of a pod: whether `GET /health` answered, and what its `/metrics` said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthCheck {
    pub ok: bool,
    /// The scrape's load; `None` when `/metrics` did not answer (or was not asked).
    pub load: Option<PodLoad>,
    /// `process_start_time_seconds` of the scrape, unix seconds, when the pod exports it.
    pub process_start_s: Option<f64>,
}

/// What a health check changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// The pod (re)joined with this epoch — it came up, came back from down, or restarted while
    /// up ([`restart`]): reconcile its models, then start its warm-up.
    Joined(u64),
    /// The pod went down.
    Down,
    Unchanged,
}

/// The fleet core; see the module docs.
#[derive(Debug)]
pub struct Fleet {
    config: FleetConfig,
    pool: PromptPool,
    registry: AdapterRegistry,
    pods: BTreeMap<String, FleetPod>,
    routing: RoutingTableBuilder,
    /// Adapters' demand and replica sets (see [`placement`]).
    placement: Placement,
    /// The keep-warm period and the hot prefixes the table places as of the last one (see
    /// [`prefix_placement`]).
    keep_warm_period: KeepWarmPeriod,
    /// The notes and the journal of actions.
    outputs: Outputs,
    /// The running experiment, which the table carries to the filters, and its arms' rules.
    experiments: Experiments,
    /// The pool's semantic groups, from the prompt index ([`Fleet::set_semantic_groups`]).
    semantic_groups: SemanticGroups,
    /// The latest `now` an input brought.
    now_ms: u64,
}

impl Fleet {
    /// An empty fleet; `table_generation` is the last generation filters saw (from a snapshot),
    /// so the next table's is higher.
    pub fn new(config: FleetConfig, now_ms: u64, table_generation: u64) -> Self {
        Self {
            pool: PromptPool::new(config.hotness.clone(), now_ms),
            registry: AdapterRegistry::default(),
            pods: BTreeMap::new(),
            routing: RoutingTableBuilder::new(
                config.fingerprint.block_tokens,
                config.routing.clone(),
                table_generation,
            ),
            placement: Placement::default(),
            keep_warm_period: KeepWarmPeriod::default(),
            outputs: Outputs::default(),
            experiments: Experiments::default(),
            semantic_groups: SemanticGroups::new(),
            now_ms,
            config,
        }
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    pub fn pool(&self) -> &PromptPool {
        &self.pool
    }

    /// The pool, for operator templates and snapshots (what the pool holds decides nothing
    /// until the next plan or signal reads it).
    pub fn pool_mut(&mut self) -> &mut PromptPool {
        &mut self.pool
    }

    pub fn registry(&self) -> &AdapterRegistry {
        &self.registry
    }

    /// The registry, for registrations and rollbacks (pins go through
    /// [`pin_adapter`](Self::pin_adapter), removals through
    /// [`remove_adapter`](Self::remove_adapter)).
    pub fn registry_mut(&mut self) -> &mut AdapterRegistry {
        &mut self.registry
    }

    pub fn pods(&self) -> impl Iterator<Item = &FleetPod> {
        self.pods.values()
    }

    pub fn pod(&self, id: &str) -> Option<&FleetPod> {
        self.pods.get(id)
    }

    /// What the core decided since the last call, for metrics and logs.
    pub fn take_notes(&mut self) -> Vec<Note> {
        self.outputs.take_notes()
    }

    /// Starts keeping every action the core returns, for [`take_journal`](Self::take_journal).
    pub fn keep_journal(&mut self) {
        self.outputs.keep_journal();
    }

    /// The actions returned since the last call, each with the time of the input that
    /// returned it (none when journaling is off).
    pub fn take_journal(&mut self) -> Vec<(u64, Action)> {
        self.outputs.take_journal()
    }

    /// Notes the time an input brought.
    fn at(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// Returns `actions`, journaled when journaling is on.
    fn emit(&mut self, actions: Vec<Action>) -> Vec<Action> {
        self.outputs.emit(self.now_ms, actions)
    }

    /// Adds a pod (health unknown until its first check).
    pub fn add_pod(&mut self, shape: PodShape, now_ms: u64) -> Result<(), FleetError> {
        if self.pods.contains_key(&shape.id) {
            return Err(FleetError::Exists(shape.id));
        }
        if self.pods.len() >= MAX_PODS {
            return Err(FleetError::Full(MAX_PODS));
        }
        let pod = FleetPod::new(shape, &self.config.lora, now_ms);
        self.pods.insert(pod.shape.id.clone(), pod);
        Ok(())
    }

    /// Removes a pod; it leaves the routing table at once.
    pub fn remove_pod(&mut self, id: &str, now_ms: u64) -> Result<(), FleetError> {
        self.pods
            .remove(id)
            .ok_or_else(|| FleetError::Unknown(id.to_string()))?;
        self.rebuild_table(now_ms);
        Ok(())
    }

    /// A health check of `id`: `ok`, and the load its `/metrics` reported (no process start
    /// time: [`on_check`](Self::on_check) with one).
    pub fn on_health(
        &mut self,
        id: &str,
        ok: bool,
        load: Option<PodLoad>,
        now_ms: u64,
    ) -> HealthChange {
        let check = HealthCheck {
            ok,
            load,
            process_start_s: None,
        };
        self.on_check(id, check, now_ms)
    }

    /// A batch of `id`'s KV-cache events with sequence number `seq` ([`engine_blocks`]). A batch
    /// that shows the pod's cache lost (a new process, a clear) makes its next health check a
    /// restart. `None`: no such pod.
    pub fn on_kv_events(
        &mut self,
        id: &str,
        seq: i64,
        batch: &prewarm_core::kv_events::KvEventBatch,
        now_ms: u64,
    ) -> Option<engine_blocks::CacheChange> {
        let pod = self.pods.get_mut(id)?;
        let bound = pod
            .kv
            .config()
            .capacity_blocks
            .saturating_mul(4)
            .min(MAX_ENGINE_BLOCKS) as usize;
        let change = pod.engine_blocks.apply(seq, batch, bound, now_ms);
        if change != engine_blocks::CacheChange::Kept && pod.health == PodHealth::Up {
            pod.restart.note_cache_lost();
        }
        Some(change)
    }

    /// A health check of `id`. A pod that was up and whose scrape shows a restart
    /// ([`restart`]) re-joins as a pod back from down does: new epoch, models forgotten, out of
    /// the table until warmed.
    pub fn on_check(&mut self, id: &str, check: HealthCheck, now_ms: u64) -> HealthChange {
        let failures_allowed = self.config.unhealthy_after;
        let lora = self.config.lora.clone();
        let Some(pod) = self.pods.get_mut(id) else {
            return HealthChange::Unchanged;
        };
        let HealthCheck {
            ok,
            load,
            process_start_s,
        } = check;
        let restarted = match (&load, ok) {
            (Some(l), true) => {
                let up = pod.health == PodHealth::Up;
                pod.restart.observe(up, process_start_s, l)
            }
            _ => None,
        };
        if restarted.is_some() {
            // Before the scrape is read, so its counters start the KV model's new baseline.
            pod.rejoin(&lora);
        }
        if let Some(l) = load {
            if let (Some(q), Some(h)) = (l.prefix_cache_queries, l.prefix_cache_hits) {
                pod.reconcile_kv(q, h);
            }
            pod.kv.observe_usage(l.kv_usage);
            if let (Some(b), Some(n)) = (l.block_size, l.num_gpu_blocks) {
                pod.kv.set_geometry(b, n as u64);
            }
            // The load and wait the table publishes count the checks made while the pod takes
            // traffic: before, its requests were the gateway's own first-tier warm calls, over
            // when it enters the table, and a minute of them would push the traffic it was
            // warmed for elsewhere.
            if pod.routable(now_ms) {
                pod.busy.observe(l.requests(), now_ms);
                pod.wait.observe(l.waiting, l.request_successes, now_ms);
            }
            pod.load = l;
        }
        let change = if ok {
            pod.consecutive_failures = 0;
            pod.last_ok_ms = now_ms;
            if restarted.is_some() {
                HealthChange::Joined(pod.epoch)
            } else if pod.health == PodHealth::Up {
                HealthChange::Unchanged
            } else {
                pod.rejoin(&lora);
                HealthChange::Joined(pod.epoch)
            }
        } else {
            pod.consecutive_failures = pod.consecutive_failures.saturating_add(1);
            if pod.health != PodHealth::Down && pod.consecutive_failures >= failures_allowed {
                pod.go_down();
                HealthChange::Down
            } else {
                HealthChange::Unchanged
            }
        };
        if let (Some(evidence), HealthChange::Joined(epoch)) = (restarted, change) {
            self.outputs.note(Note::Restarted {
                pod: id.to_string(),
                epoch,
                evidence,
            });
        }
        if matches!(change, HealthChange::Joined(_)) {
            self.note_joined(id);
        }
        if change != HealthChange::Unchanged {
            self.rebuild_table(now_ms);
        }
        change
    }

    /// What the pod's `/v1/models` lists (adapter names): the LoRA model is aligned with it
    /// (and with the running/waiting adapters of its last scrape); a pinned adapter it lost is
    /// loaded again.
    pub fn on_models(&mut self, id: &str, registered: Vec<String>, now_ms: u64) -> Vec<Action> {
        self.at(now_ms);
        let Some(pod) = self.pods.get_mut(id) else {
            return Vec::new();
        };
        let observed = LoraObservation {
            registered,
            running: pod.load.running_adapters.clone(),
            waiting: pod.load.waiting_adapters.clone(),
        };
        let decisions = pod.lora.reconcile(&observed, now_ms);
        let actions = adapter_calls(pod, decisions, Cause::Reconcile);
        self.emit(actions)
    }

    /// A request a filter sent to a pod (its served record): ages the pod's KV model as the
    /// pod's own cache ages, and counts a use of the adapter. Returns whether the pod is known.
    pub fn on_served(&mut self, record: &ServedRecord, now_ms: u64) -> bool {
        let Some(p) = self.pods.get_mut(&record.pod) else {
            return false;
        };
        p.kv.record_traffic(&record.shards(), now_ms);
        // Tokens past the fingerprinted chain (a partial last block, or a prompt longer than
        // the filter hashes) still take cache space.
        p.kv.record_uncached_tokens(record.prompt_tokens.saturating_sub(record.chained_tokens));
        // Only a model known as an adapter (registered, or listed by the pod) is one: a base
        // model named otherwise than `base_model` must not become a phantom adapter.
        let adapter = record.model != self.config.base_model
            && (self.registry.get(&record.model).is_some()
                || p.lora.served().any(|a| a == record.model));
        if adapter {
            p.lora.observe_use(&record.model, now_ms);
            self.record_demand(&record.model, now_ms);
        }
        true
    }

    /// Continues the table's generations after `generation` (a restored snapshot's), so filters
    /// never see them go backwards.
    pub fn resume_generations(&mut self, generation: u64) {
        self.routing = RoutingTableBuilder::new(
            self.config.fingerprint.block_tokens,
            self.config.routing.clone(),
            generation,
        );
    }

    /// The routing table filters route with.
    pub fn table(&self) -> &RoutingTable {
        self.routing.table()
    }

    /// Rebuilds the routing table; returns whether its content (and generation) changed. The
    /// first build always counts.
    pub fn rebuild_table(&mut self, now_ms: u64) -> bool {
        let pools = self.tier_pools();
        let (pods, registry, placement) = (&self.pods, &self.registry, &self.placement);
        let routes: Vec<PodRoute<'_>> = pods
            .values()
            .map(|p| PodRoute {
                id: &p.shape.id,
                address: &p.shape.address,
                weight: p.shape.weight,
                load: Some(p.busy.share(now_ms)),
                load_samples: p.busy.checks(now_ms),
                wait_ms: p.wait.wait_ms(now_ms),
                adapters: listed_adapters(p, registry, &pools, placement),
                resident: p.lora.resident().collect(),
                routable: p.routable(now_ms),
                warming: p.health == PodHealth::Up && p.warmup.progress.is_some(),
            })
            .collect();
        let first = self.routing.table().generated_at_ms == 0;
        let experiment_changed = self
            .routing
            .set_experiment(self.experiments.running().map(|r| &r.definition), now_ms);
        let pods_changed = self.routing.build(&routes, now_ms);
        let placed_changed = self
            .routing
            .place_prefixes(self.keep_warm_period.placed(), now_ms);
        experiment_changed || pods_changed || placed_changed || first
    }

    /// The once-a-[`TICK_MS`] work: the warm-ups' next steps; keep-warm when its period is
    /// due; the routing table.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Action> {
        self.at(now_ms);
        self.apply_arm_rules();
        let mut actions = self.warmup_steps(now_ms);
        let keep_warm_due = self.keep_warm_period.due(now_ms);
        self.refresh_placement(keep_warm_due, now_ms);
        let routable = self.routable_ids(now_ms);
        if keep_warm_due {
            actions.extend(self.keep_warm(now_ms));
            let placed = self.placed_prefixes(now_ms);
            let period_ms = self.config.keep_warm_period_ms;
            self.keep_warm_period
                .ran(now_ms, period_ms, placed, routable);
        } else if !self.keep_warm_period.placed_among(&routable) {
            let placed = self.placed_prefixes(now_ms);
            self.keep_warm_period.replace(placed, routable);
        }
        self.rebuild_table(now_ms);
        self.emit(actions)
    }
}

/// `decisions` for `pod` as one action, none when there are none.
fn adapter_calls(
    pod: &FleetPod,
    decisions: Vec<crate::policy::LoraDecision>,
    cause: Cause,
) -> Vec<Action> {
    if decisions.is_empty() {
        return Vec::new();
    }
    vec![Action::Adapters(AdapterCalls {
        pod: pod.shape.id.clone(),
        epoch: pod.epoch,
        decisions,
        cause,
    })]
}
