//! The HTTP listener's accept loop: HTTP/1.1 connections served by hyper with a header-read
//! timeout, so a client that trickles its request headers (slowloris) or leaves a kept-alive
//! connection idle is disconnected after `server.header_read_timeout_ms` instead of holding a
//! connection forever (`axum::serve` sets no timer, hence no timeout). It holds at most
//! `max_connections` open: at the cap it stops accepting until one closes (newcomers wait in
//! the kernel's backlog), so one listener's clients never take the descriptors another class
//! needs ([`super::connections`]). On shutdown it stops accepting, asks every connection to
//! finish its request in flight and close, and waits for them at most the drain period.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tower::ServiceExt;

/// How the listener treats connections.
#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    /// A request's headers must arrive within this; it also closes a kept-alive connection idle
    /// for this long (hyper arms it whenever it waits for a request head).
    pub header_read_timeout: Duration,
    /// After shutdown, connections get this long to finish.
    pub drain: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// What a listener reports (`prewarm_listener_connections{listener}`,
/// `prewarm_listener_at_cap_total{listener}`).
#[derive(Debug, Clone, Default)]
pub struct ListenerGauges {
    /// Connections open now.
    pub open: Gauge,
    /// Times the listener reached its cap and stopped accepting.
    pub at_cap: Counter,
}

/// Serves `app` until `shutdown` resolves, then drains (see the module docs). Returns whether
/// every connection finished within the drain period.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: ListenerLimits,
    gauges: ListenerGauges,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        while connections.try_join_next().is_some() {}
        if slots.available_permits() == 0 {
            gauges.at_cap.inc();
        }
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            s = slots.clone().acquire_owned() => s,
        };
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: do not spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let app = app.clone();
        let mut stopped = stopped.clone();
        let open = gauges.open.clone();
        open.inc();
        connections.spawn(async move {
            let _slot = slot;
            let _open = OpenConnection(open);
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                app.clone().oneshot(request.map(Body::new))
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .keep_alive(true);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stopped.wait_for(|s| *s) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = stop.send(true);
    tokio::time::timeout(limits.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_ok()
}

/// Counts a connection open until it is dropped (whichever way its task ends).
struct OpenConnection(Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}
