//! Starting and stopping one pod server: register the `--lora-modules` adapters (reading their
//! directories), bind, serve until told to stop, then drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::adapter_dir::read_adapter_rank;
use super::{router, AppState, ServerConfig};
use crate::adapters::AdapterSpec;
use crate::cli::LoraModule;
use crate::pod::Pod;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("--lora-modules: {name}: {reason}")]
    Adapter { name: String, reason: String },
    #[error("bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// A server running on a tokio task.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    /// The KV-event publisher's step loop, when `--kv-events-config` enabled it.
    kv_events: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// Stops accepting, lets in-flight replies finish for at most `grace`, then returns with
    /// the listener closed (the port is free again).
    pub async fn stop(mut self, grace: Duration) {
        if let Some(publisher) = self.kv_events.take() {
            publisher.abort();
            let _ = publisher.await;
        }
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if tokio::time::timeout(grace, &mut self.task).await.is_err() {
            self.task.abort();
            // an aborted task drops its listener when it is cancelled, not at `abort`
            let _ = (&mut self.task).await;
        }
    }
}

/// Builds the pod, registers `modules`, binds `addr` and starts serving.
pub async fn start(
    config: ServerConfig,
    modules: &[LoraModule],
    addr: &str,
) -> Result<RunningServer, StartError> {
    let mut pod = Pod::new(config.pod.clone()).map_err(|p| StartError::Config(p.join("; ")))?;
    for m in modules {
        let rank = read_adapter_rank(&m.path)
            .await
            .map_err(|e| StartError::Adapter {
                name: m.name.clone(),
                reason: e.to_string(),
            })?;
        let spec = AdapterSpec {
            name: m.name.clone(),
            path: m.path.clone(),
            rank,
            pinned: false,
        };
        pod.load_adapter(spec, false)
            .map_err(|e| StartError::Adapter {
                name: m.name.clone(),
                reason: e.to_string(),
            })?;
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| StartError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    let kv_events = config.kv_events.clone();
    let state = AppState::new(config, pod);
    let kv_events = match kv_events {
        Some(c) => Some(
            super::kv_events::start_publisher(state.clone(), &c)
                .await
                .map_err(StartError::Config)?,
        ),
        None => None,
    };
    let app = router(state.clone());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Ok(RunningServer {
        addr: local,
        state,
        shutdown: Some(tx),
        task,
        kv_events,
    })
}
