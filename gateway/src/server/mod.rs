//! The `serve` lifecycle, linkerd-style: the configuration is already validated → restore the
//! snapshot → bind → print the listening line → spawn the background loops → wait for SIGTERM or
//! Ctrl-C → stop accepting, drain within `server.drain_seconds` → write the final snapshot.
//! Connections are served by [`listener`] (header-read and idle timeout).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

mod listener;

pub use listener::{serve_http, ListenerLimits};

use crate::api::router;
use crate::config::GatewayConfig;
use crate::service::{tasks, Gateway};

/// Binds the listener (port 0 picks a free port).
pub async fn bind(config: &GatewayConfig) -> std::io::Result<TcpListener> {
    let addr: SocketAddr = config
        .listen_addr()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    TcpListener::bind(addr).await
}

/// Resolves when SIGTERM or Ctrl-C arrives.
pub async fn shutdown_requested() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Runs the gateway until `shutdown` resolves. Returns the process exit code.
pub async fn serve(
    config: GatewayConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> i32 {
    let listener = match bind(&config).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "prewarm-gateway: server.listen: {:?}: cannot bind: {e}",
                config.server.listen
            );
            return 1;
        }
    };
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("prewarm-gateway: cannot read the bound address: {e}");
            return 1;
        }
    };
    for (field, token, refused) in [
        (
            "server.signal_token",
            &config.server.signal_token,
            "filters' signals and table polls",
        ),
        (
            "server.read_token",
            &config.server.read_token,
            "admin reads without the admin token",
        ),
        (
            "server.admin_token",
            &config.server.admin_token,
            "admin calls",
        ),
    ] {
        if token.is_empty() {
            tracing::warn!("{field} is empty: {refused} are refused with 401");
        }
    }
    let drain = Duration::from_secs(config.server.drain_seconds);
    let gateway = Gateway::new(config);
    let restored = gateway.restore();
    tracing::info!(generation = ?restored.generation, "state restored");
    println!("prewarm-gateway listening on http://{local}");
    let tasks = tasks::spawn_all(&gateway);
    let app = router(gateway.clone());
    let g = gateway.clone();
    let limits = ListenerLimits {
        header_read_timeout: Duration::from_millis(gateway.config.server.header_read_timeout_ms),
        drain,
    };
    let drained = serve_http(listener, app, limits, async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        g.begin_shutdown();
    })
    .await;
    if !drained {
        tracing::warn!("drain period over: closing remaining connections");
    }
    gateway.begin_shutdown();
    for t in tasks {
        let _ = tokio::time::timeout(drain, t).await;
    }
    final_snapshot(&gateway).await;
    0
}

async fn final_snapshot(gateway: &Arc<Gateway>) {
    if gateway.restore_refused().is_some() {
        tracing::warn!("no final snapshot: the gateway refused its snapshot files (state.on_unusable_snapshot)");
        return;
    }
    let g = gateway.clone();
    match tokio::task::spawn_blocking(move || g.write_snapshot()).await {
        Ok(Ok(w)) => tracing::info!(bytes = w.bytes, "final snapshot written"),
        _ => tracing::error!("final snapshot failed"),
    }
}
