//! The running gateway: one [`Gateway`] shared by the HTTP API and the background tasks. It owns
//! the policies' state behind one lock (policies are pure and fast; no I/O happens under the
//! lock), the published routing table, the metrics and the shutdown signal.
//!
//! - [`pods`]: the pool (add, remove, health transitions) and per-pod state;
//! - [`table`]: rebuilding and publishing the routing table;
//! - [`persist`]: snapshot load at start and writes (periodic, on demand, at shutdown);
//! - [`signals`]: ingesting filter signals;
//! - [`tasks`]: the background loops (health, DNS, snapshots, lazy warm-up).

pub mod adapters;
pub mod hit_ratio;
pub mod persist;
pub mod placement;
pub mod planning;
pub mod pods;
pub mod signals;
pub mod table;
pub mod tasks;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::config::GatewayConfig;
use crate::engine::{HttpPod, RetryPolicy};
use crate::policy::{PromptPool, RoutingTableBuilder};
use crate::registry::AdapterRegistry;
use crate::telemetry::Telemetry;
pub use pods::{PodEntry, PodHealth, PodSource};
pub use table::PublishedTable;

/// Milliseconds since the Unix epoch: the `now` every policy is given.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Everything the policies hold, behind the gateway's one lock.
pub struct State {
    pub pool: PromptPool,
    pub registry: AdapterRegistry,
    pub pods: BTreeMap<String, PodEntry>,
    pub routing: RoutingTableBuilder,
}

/// The running service.
pub struct Gateway {
    pub config: GatewayConfig,
    pub telemetry: Telemetry,
    state: Mutex<State>,
    table: RwLock<Arc<PublishedTable>>,
    ready: AtomicBool,
    client: reqwest::Client,
    shutdown: watch::Sender<bool>,
    me: Weak<Gateway>,
}

impl Gateway {
    /// A gateway with empty state (call [`persist::restore`] to load the snapshot).
    pub fn new(config: GatewayConfig) -> Arc<Self> {
        let now = now_ms();
        let pool = PromptPool::new(config.hotness.clone(), now);
        let routing =
            RoutingTableBuilder::new(config.fingerprint.block_tokens, config.routing.clone(), 0);
        let client = HttpPod::client(
            Duration::from_millis(config.pods.connect_timeout_ms),
            Duration::from_millis(config.pods.request_timeout_ms),
        );
        let (shutdown, _) = watch::channel(false);
        let gateway = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            telemetry: Telemetry::new(),
            state: Mutex::new(State {
                pool,
                registry: AdapterRegistry::default(),
                pods: BTreeMap::new(),
                routing,
            }),
            table: RwLock::new(Arc::new(PublishedTable::empty())),
            ready: AtomicBool::new(false),
            client,
            shutdown,
            config,
        });
        for spec in gateway.config.pods.static_pods.clone() {
            let _ = gateway.add_pod(spec, PodSource::Static);
        }
        gateway
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

    /// Ready once the snapshot has been loaded (or found absent).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
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
