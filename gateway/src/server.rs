//! The `serve` lifecycle, linkerd-style: the configuration is already validated → restore the
//! snapshot → bind → print the listening line → spawn the background loops → wait for SIGTERM or
//! Ctrl-C → stop accepting, drain within `server.drain_seconds` → write the final snapshot.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

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
    let drain = Duration::from_secs(config.server.drain_seconds);
    let gateway = Gateway::new(config);
    let restored = gateway.restore();
    tracing::info!(generation = ?restored.generation, "state restored");
    println!("prewarm-gateway listening on http://{local}");
    let tasks = tasks::spawn_all(&gateway);
    let app = router(gateway.clone());
    let g = gateway.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        g.begin_shutdown();
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    let result = tokio::select! {
        r = &mut server => r,
        _ = async {
            // Bound the drain: once shutdown began, in-flight requests get `drain` to finish.
            let mut s = gateway.shutdown_signal();
            while !*s.borrow() {
                if s.changed().await.is_err() {
                    break;
                }
            }
            tokio::time::sleep(drain).await;
        } => {
            tracing::warn!("drain period over: closing remaining connections");
            Ok(())
        }
    };
    gateway.begin_shutdown();
    for t in tasks {
        let _ = tokio::time::timeout(drain, t).await;
    }
    final_snapshot(&gateway).await;
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            1
        }
    }
}

async fn final_snapshot(gateway: &Arc<Gateway>) {
    let g = gateway.clone();
    match tokio::task::spawn_blocking(move || g.write_snapshot()).await {
        Ok(Ok(w)) => tracing::info!(bytes = w.bytes, "final snapshot written"),
        _ => tracing::error!("final snapshot failed"),
    }
}
