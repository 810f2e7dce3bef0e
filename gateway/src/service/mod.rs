//! The running gateway: the async shell around the fleet core ([`crate::policy::fleet`]). One
//! [`Gateway`] is shared by the HTTP API and the background tasks. It holds the core and each
//! pod's I/O side (client, source, served models, loaded versions, errors) behind one lock — the
//! core is pure and fast; no I/O happens under the lock — plus the published encoding of the
//! core's routing table, the metrics and the shutdown signal. The shell makes no decision of its
//! own: it feeds the core what it observes and executes the core's actions.
//!
//! - [`pods`]: the pool (add, remove, health checks) and each pod's I/O side;
//! - [`actions`]: executing the core's actions and reporting their ends;
//! - [`adapters`]: the LoRA calls of an action (verified load, unload, touch);
//! - [`rollouts`]: adapter rollouts and the gateway's own rollbacks of them;
//! - [`table`]: publishing the core's routing table;
//! - [`persist`]: snapshot load at start and writes (periodic, on demand, at shutdown);
//! - [`signals`]: ingesting filter signals;
//! - [`planning`]: the plan view the API and the `plan` command print;
//! - [`refresh_embeddings`]: the loop that keeps the prompt index in step with the pool;
//! - [`warm_embeddings`]: computing the filters' hot embedding inputs ahead of their expiry;
//! - [`tasks`]: the background loops (health, the core's tick, DNS, snapshots).

pub mod actions;
pub mod adapters;
pub mod experiments;
pub mod kv_events;
pub mod kv_replay;
pub mod persist;
pub mod planning;
pub mod pods;
pub mod refresh_embeddings;
pub mod rollouts;
pub mod signals;
pub mod table;
pub mod tasks;
pub mod warm_embeddings;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::attribution::ledger::OutcomeLedger;
use crate::attribution::warmup::WarmupLatencies;
use crate::config::GatewayConfig;
use crate::embeddings::search::PromptSearch;
use crate::engine::{HttpPod, RetryPolicy};
use crate::policy::fleet::Fleet;
pub use crate::policy::fleet::PodHealth;
use crate::telemetry::Telemetry;
use crate::traces::warmup::WarmupTraces;
use crate::warm_embeddings::store::WarmStore;
pub use pods::{PodEntry, PodSource};
pub use table::PublishedTable;

/// Milliseconds since the Unix epoch: the `now` every policy is given.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where the gateway's `now` comes from: the system clock, or a value a test sets (to drive the
/// shell step by step in virtual time, as the evaluator drives the core).
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    Manual(Arc<AtomicU64>),
}

impl Clock {
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System => now_ms(),
            Clock::Manual(t) => t.load(Ordering::Acquire),
        }
    }
}

/// Everything behind the gateway's one lock: the fleet core, and each pod's I/O side by id (the
/// same ids as the core's pods).
pub struct State {
    pub fleet: Fleet,
    pub pods: BTreeMap<String, PodEntry>,
}

/// The running service.
pub struct Gateway {
    pub config: GatewayConfig,
    clock: Clock,
    pub telemetry: Telemetry,
    state: Mutex<State>,
    table: RwLock<Arc<PublishedTable>>,
    ready: AtomicBool,
    /// Why the restore refused to start (no usable snapshot and `state.on_unusable_snapshot =
    /// "refuse"`): the gateway then stays unready and writes no snapshot.
    restore_refused: std::sync::OnceLock<String>,
    client: reqwest::Client,
    shutdown: watch::Sender<bool>,
    me: Weak<Gateway>,
    /// The pool's prompt embeddings and index (`embeddings.model_dir` set), else `None`.
    pub embeddings: Option<Arc<PromptSearch>>,
    /// The filters' outcome records, for experiments (its own lock: off the fleet's).
    pub outcomes: Mutex<OutcomeLedger>,
    /// The open warm-up plan spans (exported when `[traces]` is on).
    pub warmup_traces: WarmupTraces,
    /// The last warm-up keys' latencies, for the grey release (its own lock).
    pub warmup_latencies: Mutex<WarmupLatencies>,
    /// The embedding inputs kept warm for the filters' caches (its own lock).
    warm_embeddings: Mutex<WarmStore>,
}

impl Gateway {
    /// A gateway with empty state (call [`persist::restore`] to load the snapshot).
    pub fn new(config: GatewayConfig) -> Arc<Self> {
        Self::with_clock(config, Clock::System)
    }

    /// [`Gateway::new`] with its `now` from `clock`.
    pub fn with_clock(config: GatewayConfig, clock: Clock) -> Arc<Self> {
        let fleet = Fleet::new(config.fleet(), clock.now_ms(), 0);
        let client = HttpPod::client(
            Duration::from_millis(config.pods.connect_timeout_ms),
            Duration::from_millis(config.pods.request_timeout_ms),
        );
        let (shutdown, _) = watch::channel(false);
        let gateway = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            clock,
            telemetry: Telemetry::new(),
            state: Mutex::new(State {
                fleet,
                pods: BTreeMap::new(),
            }),
            table: RwLock::new(Arc::new(PublishedTable::empty())),
            outcomes: Mutex::new(OutcomeLedger::default()),
            warmup_traces: WarmupTraces::default(),
            warmup_latencies: Mutex::new(WarmupLatencies::default()),
            warm_embeddings: Mutex::new(WarmStore::default()),
            ready: AtomicBool::new(false),
            restore_refused: std::sync::OnceLock::new(),
            client,
            shutdown,
            embeddings: config
                .embeddings
                .model_dir
                .is_some()
                .then(|| Arc::new(PromptSearch::new(config.embeddings.clone()))),
            config,
        });
        for spec in gateway.config.pods.static_pods.clone() {
            let _ = gateway.add_pod(spec, PodSource::Static);
        }
        gateway
    }

    /// Milliseconds now, the `now` every input to the fleet core is given.
    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The state lock. A poisoned lock (a panic while holding it) is taken over: policies leave
    /// their state consistent between calls.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            retries: self.config.pods.retries,
            backoff: Duration::from_millis(self.config.pods.retry_backoff_ms),
        }
    }

    /// The gateway's own `Arc`, for spawning work from `&self`.
    pub fn me(&self) -> Option<Arc<Self>> {
        self.me.upgrade()
    }

    pub fn http_client(&self) -> reqwest::Client {
        self.client.clone()
    }

    /// Ready once the snapshot has been loaded (or found absent) and, with embeddings on, the
    /// first prompt index is built from it.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && self.embeddings.as_ref().is_none_or(|e| e.is_built())
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Why the gateway refused to start from its snapshot files, if it did (see
    /// [`Gateway::restore`]).
    pub fn restore_refused(&self) -> Option<&str> {
        self.restore_refused.get().map(String::as_str)
    }

    /// A receiver that turns `true` at shutdown.
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn begin_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
