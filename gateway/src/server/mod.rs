//! The `serve` lifecycle, linkerd-style: the configuration is already validated → restore the
//! snapshot → bind → print the listening line → spawn the background loops → wait for SIGTERM or
//! Ctrl-C → stop accepting, drain within `server.drain_seconds` → write the final snapshot.
//! Connections are served by [`listener`] (header-read and idle timeout, a connection cap);
//! with `server.filter_listen` the filters' routes get a listener of their own, and each
//! listener's cap comes from the descriptor limit ([`connections`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

pub mod connections;
mod listener;

pub use listener::{serve_http, ListenerGauges, ListenerLimits};

use crate::api::{filter_router, router};
use crate::config::GatewayConfig;
use crate::service::{tasks, Gateway};

/// Binds the listener (port 0 picks a free port).
pub async fn bind(config: &GatewayConfig) -> std::io::Result<TcpListener> {
    let addr: SocketAddr = config
        .listen_addr()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    TcpListener::bind(addr).await
}

/// Binds the filters' listener when one is configured.
async fn bind_filter(config: &GatewayConfig) -> std::io::Result<Option<TcpListener>> {
    match config
        .filter_listen_addr()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
    {
        Some(addr) => TcpListener::bind(addr).await.map(Some),
        None => Ok(None),
    }
}

/// The gauges of the listener called `name`, holding at most `cap` connections.
fn gauges(gateway: &Gateway, name: &str, cap: usize) -> ListenerGauges {
    let labels = vec![("listener".to_string(), name.to_string())];
    let t = &gateway.telemetry;
    t.listener_connection_cap
        .get_or_create(&labels)
        .set(i64::try_from(cap).unwrap_or(i64::MAX));
    ListenerGauges {
        open: t.listener_connections.get_or_create(&labels).clone(),
        at_cap: t.listener_at_cap.get_or_create(&labels).clone(),
    }
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
    let filter_listener = match bind_filter(&config).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "prewarm-gateway: server.filter_listen: {:?}: cannot bind: {e}",
                config.server.filter_listen
            );
            return 1;
        }
    };
    let bound = listener.local_addr().and_then(|main| {
        filter_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
            .map(|filter| (main, filter))
    });
    let (local, filter_local) = match bound {
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
    let fd_limit = connections::raise_fd_limit();
    let caps = connections::caps(fd_limit, &config.server);
    tracing::info!(
        fd_limit,
        main = caps.main,
        filter = caps.filter,
        "connection caps"
    );
    let gateway = Gateway::new(config);
    let restored = gateway.restore();
    tracing::info!(generation = ?restored.generation, "state restored");
    let kv_listener = match gateway.listen_kv_events().await {
        Ok(task) => task,
        Err(e) => {
            eprintln!("prewarm-gateway: {e}: cannot bind");
            return 1;
        }
    };
    if let Some(filter_local) = filter_local {
        println!("prewarm-gateway serving filters on http://{filter_local}");
    }
    println!("prewarm-gateway listening on http://{local}");
    let mut tasks = tasks::spawn_all(&gateway);
    tasks.extend(kv_listener);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let g = gateway.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: draining");
        g.begin_shutdown();
        let _ = stop.send(true);
    });
    let limits = |max_connections| ListenerLimits {
        header_read_timeout: Duration::from_millis(gateway.config.server.header_read_timeout_ms),
        drain,
        max_connections,
    };
    let until_stopped = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let main = serve_http(
        listener,
        router(gateway.clone()),
        limits(caps.main),
        gauges(&gateway, "main", caps.main),
        until_stopped(),
    );
    let filters = async {
        match filter_listener {
            Some(l) => {
                serve_http(
                    l,
                    filter_router(gateway.clone()),
                    limits(caps.filter),
                    gauges(&gateway, "filter", caps.filter),
                    until_stopped(),
                )
                .await
            }
            None => true,
        }
    };
    let (main_drained, filters_drained) = tokio::join!(main, filters);
    let drained = main_drained && filters_drained;
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
