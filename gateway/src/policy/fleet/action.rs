//! What the fleet core asks the shell to do, and the notes it leaves for the shell's metrics and
//! logs. An action carries the pod's epoch: its completion is ignored if the pod re-joined (or
//! left) meanwhile, so a late reply never edits the model of a newer life of the pod.

use std::sync::Arc;

use prewarm_core::request::Endpoint;
use prewarm_core::Shard;
use serde::Serialize;

use crate::policy::hotness::SharedShape;
use crate::policy::{LoraDecision, PrefixKey, WarmupAction};

/// Why the core asks for an action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A step of the pod's warm-up plan; its completion advances the plan.
    Warmup(WarmupAction),
    /// A re-touch of a warm prefix or adapter before the pod would evict it.
    KeepWarm,
    /// A filter signalled a pattern it had not seen before: its whole prefix is warmed where it
    /// is routed.
    NewPattern,
    /// A filter's pin signal.
    Pin,
    /// An operator's pin, unpin or removal.
    Operator,
    /// `/v1/models` showed a pinned adapter missing.
    Reconcile,
}

/// A `max_tokens: 1` request that fills a pod's prefix cache with a pooled prefix, in its
/// traffic's shape (core's `prefill_call`: a chat prefix through the chat endpoint with its
/// messages, tools, kwargs and salt; any other as a completion of its text).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prefill {
    pub pod: String,
    pub epoch: u64,
    pub key: PrefixKey,
    /// The model or adapter the prefix was seen with.
    pub model: String,
    /// The endpoint its traffic used.
    pub endpoint: Endpoint,
    /// Its canonical text, shared with the pool.
    #[serde(skip)]
    pub text: Arc<str>,
    /// How its traffic reached the engine, shared with the pool (`Debug` shows no salt).
    #[serde(skip)]
    pub shape: Option<SharedShape>,
    /// The prefix's shards, for the KV model once the prefill is done.
    #[serde(skip)]
    pub shards: Vec<Shard>,
    pub cause: Cause,
}

/// How a prefill ended, as [`super::Fleet::prefill_done`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillOutcome {
    /// The pod answered it: the prefix is cached.
    Ok,
    /// The pod refused the request itself (a 4xx such as a chat template's error on the
    /// shape): sending it again would be refused again, so the entry backs off.
    Rejected,
    /// Anything else (unreachable, timed out, a 5xx, overloaded, the model not on the pod):
    /// the prefix is not cached; it may be tried again.
    Failed,
}

impl From<bool> for PrefillOutcome {
    /// `true`: [`PrefillOutcome::Ok`]; `false`: [`PrefillOutcome::Failed`] (a driver that
    /// cannot tell a rejection apart).
    fn from(ok: bool) -> Self {
        if ok {
            PrefillOutcome::Ok
        } else {
            PrefillOutcome::Failed
        }
    }
}

/// LoRA calls on one pod, executed in order (an unload precedes the load it frees a slot for).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterCalls {
    pub pod: String,
    pub epoch: u64,
    pub decisions: Vec<LoraDecision>,
    pub cause: Cause,
}

/// One thing for the shell to execute.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Prefill(Prefill),
    Adapters(AdapterCalls),
}

impl Action {
    pub fn pod(&self) -> &str {
        match self {
            Action::Prefill(p) => &p.pod,
            Action::Adapters(a) => &a.pod,
        }
    }
}

/// Something the core decided that the shell counts or logs (the core has no metrics).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Note {
    /// `count` decisions of `policy` of kind `decision` (the `prewarm_decisions_total` labels).
    Decision {
        policy: &'static str,
        decision: &'static str,
        count: u64,
    },
    /// A pod's error worth keeping in its recent errors.
    PodError { pod: String, message: String },
    /// A warm-up key failed for good (its attempts are spent).
    WarmupKeyError { pod: String },
    /// A pod's first tier finished: it is routable, after `seconds` of warm-up.
    FirstTierDone { pod: String, seconds: f64 },
    /// A pod that was up restarted (see [`super::restart`]): it re-joined with `epoch`.
    Restarted {
        pod: String,
        epoch: u64,
        evidence: super::restart::RestartEvidence,
    },
    /// A warm-up was planned.
    Planned {
        pod: String,
        adapters: usize,
        first_tier: usize,
        second_tier: usize,
        lazy: usize,
    },
}

/// What the fleet returns besides its answers: the notes for metrics and logs and, when kept,
/// the journal of actions (to compare two drivers' decisions). Every action the fleet returns
/// goes through [`Outputs::emit`], so the journal holds exactly the actions returned, in order,
/// each with the time of the input that returned it.
#[derive(Debug, Default)]
pub struct Outputs {
    notes: Vec<Note>,
    journal: Option<Vec<(u64, Action)>>,
}

impl Outputs {
    pub fn note(&mut self, note: Note) {
        self.notes.push(note);
    }

    /// Notes `count` decisions of `policy` (none when 0).
    pub fn decision(&mut self, policy: &'static str, decision: &'static str, count: u64) {
        if count > 0 {
            self.notes.push(Note::Decision {
                policy,
                decision,
                count,
            });
        }
    }

    /// The notes since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Starts keeping every action emitted.
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The actions emitted since the last call (none when journaling is off).
    pub fn take_journal(&mut self) -> Vec<(u64, Action)> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Returns `actions`, journaled at `at_ms` when journaling is on.
    pub fn emit(&mut self, at_ms: u64, actions: Vec<Action>) -> Vec<Action> {
        if let Some(j) = self.journal.as_mut() {
            j.extend(actions.iter().map(|a| (at_ms, a.clone())));
        }
        actions
    }
}
