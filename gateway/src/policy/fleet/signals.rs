//! Signals and pins. A filter's [`SignalBatch`]: its served records age the pods' KV models
//! ([`Fleet::on_served`]); prefill and feedback signals go to the prompt pool; each signalled
//! hot prefix joins the warm set of the pod the filters route it to (core's placement of its
//! routing key within its model's scope among the routable pods). What is warmed depends on the
//! pattern's state (the seed's 201/202): a `new` pattern's whole prefix is prefilled there at
//! once, unless the KV model believes every shard of it resident; a `known` pattern's prefix is
//! left to keep-warm, which prefills it (within the pod's budget) only when shards of it are not
//! believed resident — incremental, as vLLM's prefix cache computes only the missing blocks
//! (neither while the pool backs the prefix off after an engine rejected its warm call). A
//! pin signal makes its adapter resident on the pods it is placed on. Operator pins do the same with
//! the registry's pin flag; a removed adapter is unloaded everywhere.

use prewarm_core::fingerprint::shards_of;
use prewarm_core::place;
use prewarm_core::wire::{PatternState, PinSignal, Signal, SignalBatch, MAX_SERVED_PER_BATCH};
use prewarm_core::Shard;

use super::action::{Action, Cause, Note};
use super::steps::NotSent;
use super::{adapter_calls, Fleet};
use crate::policy::hotness::IngestReport;
use crate::policy::lora::AdapterLoads;
use crate::policy::{candidates_for, LoraDecision, PrefixKey};
use crate::registry::RegistryError;

impl Fleet {
    /// Applies a filter's batch; returns what the pool made of it and the adapter calls its pins
    /// need.
    pub fn on_signals(&mut self, batch: SignalBatch, now_ms: u64) -> (IngestReport, Vec<Action>) {
        self.at(now_ms);
        let hot: Vec<(PrefixKey, PatternState)> = batch
            .signals
            .iter()
            .filter_map(|s| match s {
                Signal::Prefill(p) => p
                    .prefix
                    .last()
                    .map(|last| (PrefixKey::new(&p.model, *last), p.state)),
                _ => None,
            })
            .collect();
        let mut batch = batch;
        for record in std::mem::take(&mut batch.served)
            .iter()
            .take(MAX_SERVED_PER_BATCH)
        {
            self.on_served(record, now_ms);
        }
        let report = self.pool.ingest(batch, now_ms);
        let mut actions = Vec::new();
        for pin in &report.pins {
            actions.extend(self.apply_pin_signal(pin, now_ms));
        }
        let placed = self.keep_warm_where_routed(&hot, &mut actions, now_ms);
        self.outputs.decision("kv", "warm_signalled", placed);
        (report, self.emit(actions))
    }

    fn apply_pin_signal(&mut self, pin: &PinSignal, now_ms: u64) -> Vec<Action> {
        if self.registry.get(&pin.adapter).is_none() {
            // The gateway has no path to load it from.
            self.outputs.decision("lora", "unregistered", 1);
            return Vec::new();
        }
        let tier = self.tier_of(&pin.adapter);
        let mut actions = Vec::new();
        for pod_id in self.placed_pods(&pin.adapter) {
            let Some(pod) = self.pods.get_mut(&pod_id) else {
                continue;
            };
            match pod
                .lora
                .ensure_resident(&pin.adapter, tier, pin.priority, now_ms)
            {
                Ok(ds) => actions.extend(adapter_calls(pod, ds, Cause::Pin)),
                Err(refusal) => {
                    self.outputs.note(Note::PodError {
                        pod: pod_id,
                        message: refusal.to_string(),
                    });
                    self.outputs.decision("lora", "refused", 1);
                }
            }
        }
        actions
    }

    /// Adds each hot prefix to the warm set of the pod requests for it are routed to, and
    /// prefills a new pattern's there at once (see the module doc); returns how many joined a
    /// warm set.
    fn keep_warm_where_routed(
        &mut self,
        hot: &[(PrefixKey, PatternState)],
        actions: &mut Vec<Action>,
        now_ms: u64,
    ) -> u64 {
        let fingerprint = self.config.fingerprint;
        let mut targets: Vec<(String, PrefixKey, PatternState, Vec<Shard>)> = Vec::new();
        {
            let candidates = self.routable_candidates(now_ms);
            let scopes = self.adapter_scopes(&candidates, now_ms);
            for (key, state) in hot {
                let Some(view) = self.pool.get(key) else {
                    continue;
                };
                let Some(rk) = self.placement_key(view.blocks) else {
                    continue;
                };
                let among = candidates_for(key.model, &candidates, &scopes);
                let Some(c) = place(rk.0, among).and_then(|i| among.get(i)) else {
                    continue;
                };
                let shards = shards_of(view.blocks, &fingerprint);
                targets.push((c.id.to_string(), *key, *state, shards));
            }
        }
        let mut added = 0;
        for (pod_id, key, state, shards) in targets {
            let Some(pod) = self.pods.get_mut(&pod_id) else {
                continue;
            };
            if pod.kv.is_resident(&key) {
                continue;
            }
            pod.kv.keep_warm_prefix(key, &shards);
            added += 1;
            if state == PatternState::New && !pod.kv.shards_resident(&shards) {
                let action = self.prefill_action(&pod_id, key, Cause::NewPattern, now_ms);
                if let Err(not_sent @ NotSent::Unwarmed(_)) = action {
                    // Backing off: keep-warm sends it once the back-off is over.
                    self.count_not_sent(not_sent);
                    continue;
                }
                // Modelled done from now, as keep-warm's own prefills are: keep-warm does not
                // send it again; a failure marks it evicted.
                if let Some(pod) = self.pods.get_mut(&pod_id) {
                    pod.kv.record_prefill(key, &shards, now_ms);
                }
                actions.extend(action.ok());
            }
        }
        added
    }

    /// An operator pins `name`: pinned in the registry and made resident on the pods it is
    /// placed on.
    pub fn pin_adapter(&mut self, name: &str, now_ms: u64) -> Result<Vec<Action>, RegistryError> {
        self.at(now_ms);
        self.registry.set_pinned(name, true)?;
        let tier = self.tier_of(name);
        let mut actions = Vec::new();
        for pod_id in self.placed_pods(name) {
            let Some(pod) = self.pods.get_mut(&pod_id) else {
                continue;
            };
            match pod.lora.pin(name, tier, now_ms) {
                Ok(ds) => actions.extend(adapter_calls(pod, ds, Cause::Operator)),
                Err(refusal) => self.outputs.note(Note::PodError {
                    pod: pod_id,
                    message: refusal.to_string(),
                }),
            }
        }
        Ok(self.emit(actions))
    }

    /// An operator unpins `name` everywhere.
    pub fn unpin_adapter(&mut self, name: &str) -> Result<(), RegistryError> {
        self.registry.set_pinned(name, false)?;
        for pod in self.pods.values_mut() {
            pod.lora.unpin(name);
        }
        Ok(())
    }

    /// An operator removes `name`: out of the registry and unloaded from every pod. `None` when
    /// it was not registered.
    pub fn remove_adapter(&mut self, name: &str) -> Option<Vec<Action>> {
        self.registry.remove(name)?;
        let mut actions = Vec::new();
        for pod in self.pods.values_mut() {
            let removals = pod.lora.remove(name);
            actions.extend(adapter_calls(pod, removals, Cause::Operator));
        }
        Some(self.emit(actions))
    }

    /// An operator's rollout or rollback of `name`: its new current version is loaded again on
    /// `pods` (those holding it), each an unload then a load. Nothing with `[lora] loads =
    /// "external"`: versions on the pods are the other controller's.
    pub fn reload_adapter(&mut self, name: &str, pods: &[String]) -> Vec<Action> {
        if self.config.lora.loads == AdapterLoads::External {
            return Vec::new();
        }
        let actions = pods
            .iter()
            .filter_map(|id| self.pods.get(id))
            .flat_map(|pod| {
                let reload = vec![
                    LoraDecision::Unload(name.to_string()),
                    LoraDecision::Load(name.to_string()),
                ];
                adapter_calls(pod, reload, Cause::Operator)
            })
            .collect();
        self.emit(actions)
    }
}
