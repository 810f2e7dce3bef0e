//! Running warm-ups: each tick asks every pod's progress for the steps it allows now (given the
//! pod's waiting requests and KV usage) and turns them into actions; the shell reports each
//! action's end, which the models and the progress record. A step that cannot be attempted (an
//! adapter the registry no longer has or the LoRA policy refuses, a prefix the pool dropped, an
//! adapter's prefix on a pod that did not get the adapter — the filter would not route it
//! there, an entry the pool does not warm now: its salt dropped by a snapshot, or backing off
//! after an engine rejected its warm call) is skipped at once.

use prewarm_core::fingerprint::shards_of;

use super::action::{Action, AdapterCalls, Cause, Note, Prefill, PrefillOutcome};
use super::{adapter_calls, Fleet};
use crate::policy::hotness::Unwarmed;
use crate::policy::warmup::{PodPressure, WarmupPhase};
use crate::policy::{LoraDecision, PrefixKey, WarmupAction};

/// Why a prefill of a pooled prefix is not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotSent {
    /// The pool no longer has it, or the pod is gone.
    Gone,
    /// A registered adapter's prefix on a pod that does not serve the adapter.
    Unserved,
    /// The pool does not warm it now (counted: `prewarm_policy_decisions_total{policy="pool"}`).
    Unwarmed(Unwarmed),
}

impl Fleet {
    /// The next steps of every warm-up in progress.
    pub(super) fn warmup_steps(&mut self, now_ms: u64) -> Vec<Action> {
        let mut wanted: Vec<(String, WarmupAction)> = Vec::new();
        for pod in self.pods.values_mut() {
            let pressure = PodPressure {
                waiting: pod.load.waiting,
                kv_usage: pod.load.kv_usage,
            };
            let Some(progress) = pod.warmup.progress.as_mut() else {
                continue;
            };
            if matches!(
                progress.phase(),
                WarmupPhase::Done | WarmupPhase::Interrupted
            ) {
                continue;
            }
            for a in progress.next_actions(pressure, now_ms) {
                wanted.push((pod.shape.id.clone(), a));
            }
        }
        let mut actions = Vec::new();
        for (pod, step) in wanted {
            match self.warmup_action(&pod, &step, now_ms) {
                Some(Some(action)) => actions.push(action),
                Some(None) => self.end_step(&pod, None, &step, Some(true), now_ms),
                None => self.end_step(&pod, None, &step, None, now_ms),
            }
        }
        actions
    }

    /// The action of one warm-up step: `Some(Some(_))` to execute, `Some(None)` done already
    /// (nothing to call), `None` skipped.
    fn warmup_action(
        &mut self,
        pod_id: &str,
        step: &WarmupAction,
        now_ms: u64,
    ) -> Option<Option<Action>> {
        match step {
            WarmupAction::LoadAdapter(name) => {
                let record = self.registry.get(name)?;
                let (tier, pinned) = (record.tier, record.pinned);
                let pod = self.pods.get_mut(pod_id)?;
                let decided = if pinned {
                    pod.lora.pin(name, tier, now_ms)
                } else {
                    pod.lora.ensure_resident(name, tier, 50, now_ms)
                };
                match decided {
                    Ok(decisions) => {
                        let cause = Cause::Warmup(step.clone());
                        Some(adapter_calls(pod, decisions, cause).into_iter().next())
                    }
                    Err(refusal) => {
                        let message = refusal.to_string();
                        self.outputs.note(Note::PodError {
                            pod: pod_id.to_string(),
                            message,
                        });
                        None
                    }
                }
            }
            WarmupAction::Prefill(key) => {
                match self.prefill_action(pod_id, *key, Cause::Warmup(step.clone()), now_ms) {
                    Ok(action) => Some(Some(action)),
                    Err(not_sent) => {
                        self.count_not_sent(not_sent);
                        None
                    }
                }
            }
        }
    }

    /// Counts a prefill the pool does not warm now.
    pub(super) fn count_not_sent(&mut self, not_sent: NotSent) {
        if let NotSent::Unwarmed(why) = not_sent {
            self.outputs.decision("pool", why.label(), 1);
        }
    }

    /// A prefill of pooled prefix `key` on `pod_id`, carrying the entry's endpoint, text and
    /// shape (shared with the pool, not copied); not sent when the pool no longer has it, it is
    /// a registered adapter's prefix and the pod does not serve the adapter, or the pool does
    /// not warm it at `now_ms` ([`Unwarmed`]).
    pub(super) fn prefill_action(
        &self,
        pod_id: &str,
        key: PrefixKey,
        cause: Cause,
        now_ms: u64,
    ) -> Result<Action, NotSent> {
        let view = self.pool.get(&key).ok_or(NotSent::Gone)?;
        let pod = self.pods.get(pod_id).ok_or(NotSent::Gone)?;
        let unserved =
            self.registry.get(view.model).is_some() && !pod.lora.served().any(|a| a == view.model);
        if unserved {
            return Err(NotSent::Unserved);
        }
        if let Some(why) = view.unwarmed(now_ms) {
            return Err(NotSent::Unwarmed(why));
        }
        let text = self.pool.shared_text(&key).ok_or(NotSent::Gone)?;
        Ok(Action::Prefill(Prefill {
            pod: pod_id.to_string(),
            epoch: pod.epoch,
            key,
            model: view.model.to_string(),
            endpoint: view.endpoint,
            text,
            shape: view.shape.cloned(),
            shards: shards_of(view.blocks, &self.config.fingerprint),
            cause,
        }))
    }

    /// A prefill ended. A rejection backs the entry off in the pool (whatever the pod's epoch:
    /// the request is what was refused); an accepted call ends a series of rejections.
    pub fn prefill_done(&mut self, prefill: &Prefill, outcome: PrefillOutcome, now_ms: u64) {
        match outcome {
            PrefillOutcome::Ok => self.pool.prefill_accepted(&prefill.key),
            PrefillOutcome::Rejected => {
                if self.pool.prefill_rejected(&prefill.key, now_ms).is_some() {
                    self.outputs.decision("pool", "back_off", 1);
                }
            }
            PrefillOutcome::Failed => {}
        }
        let ok = outcome == PrefillOutcome::Ok;
        let Some(pod) = self.pods.get_mut(&prefill.pod) else {
            return;
        };
        if pod.epoch != prefill.epoch {
            return;
        }
        if ok {
            pod.kv.record_prefill(prefill.key, &prefill.shards, now_ms);
        } else {
            pod.kv.prefill_failed(&prefill.key);
        }
        if let Cause::Warmup(step) = &prefill.cause {
            let (pod, epoch) = (prefill.pod.clone(), prefill.epoch);
            self.end_step(&pod, Some(epoch), step, Some(ok), now_ms);
        }
    }

    /// Adapter calls ended; `failed` are the decisions the pod refused or that errored.
    pub fn adapters_done(&mut self, calls: &AdapterCalls, failed: &[LoraDecision], now_ms: u64) {
        let Some(pod) = self.pods.get_mut(&calls.pod) else {
            return;
        };
        if pod.epoch != calls.epoch {
            return;
        }
        for d in failed {
            pod.lora.record_failure(d);
        }
        for d in &calls.decisions {
            if let (LoraDecision::Load(name), false) = (d, failed.contains(d)) {
                pod.lora.loaded(name);
            }
        }
        if let Cause::Warmup(step) = &calls.cause {
            let (pod, epoch) = (calls.pod.clone(), calls.epoch);
            self.end_step(&pod, Some(epoch), step, Some(failed.is_empty()), now_ms);
        }
    }

    /// Records the end of a warm-up step (`None`: skipped) in the pod's progress.
    fn end_step(
        &mut self,
        pod_id: &str,
        epoch: Option<u64>,
        step: &WarmupAction,
        outcome: Option<bool>,
        now_ms: u64,
    ) {
        let Some(pod) = self.pods.get_mut(pod_id) else {
            return;
        };
        if epoch.is_some_and(|e| e != pod.epoch) {
            return;
        }
        let Some(progress) = pod.warmup.progress.as_mut() else {
            return;
        };
        let before = progress.status(now_ms).first_tier_done_ms;
        let mut spent = false;
        match outcome {
            Some(true) => progress.completed(step, now_ms),
            Some(false) => spent = progress.failed(step, now_ms),
            None => progress.skipped(step, now_ms),
        }
        let status = progress.status(now_ms);
        if spent {
            self.outputs.note(Note::WarmupKeyError {
                pod: pod_id.to_string(),
            });
        }
        if let (None, Some(done)) = (before, status.first_tier_done_ms) {
            self.outputs.note(Note::FirstTierDone {
                pod: pod_id.to_string(),
                seconds: done.saturating_sub(status.started_ms) as f64 / 1000.0,
            });
            self.rebuild_table(now_ms);
        }
    }
}
