//! Several pods from one process (`--pods N`): the one-pod server of [`super::run`] started on
//! N listeners, each with a [`Pod`](crate::Pod) and [`AppState`](super::AppState) of its own
//! (prefix cache, LoRA slots, model clock, metrics, reply ids), so N pods here answer exactly as
//! N podsim processes started with the same flags would. They share only the process: its
//! tokio runtime (two worker threads, whatever N is) and `process_start_time_seconds`.
//!
//! A load test of the gateway needs hundreds of pods on one machine; hundreds of processes
//! would cost a runtime each and, on two cores, measure the scheduler more than the gateway.

use std::time::Duration;

use futures::future::join_all;

use super::run::{start, RunningServer, StartError};
use super::ServerConfig;
use crate::cli::LoraModule;

/// Most pods one process serves.
pub const MAX_PODS: usize = 4096;

/// The addresses of `pods` pods on `host`: ports `port..port + pods` in order, or, for port 0,
/// a free port each. `None` when the range passes 65535.
pub fn pod_addrs(host: &str, port: u16, pods: usize) -> Option<Vec<String>> {
    (0..pods)
        .map(|i| {
            if port == 0 {
                return Some(format!("{host}:0"));
            }
            let p = u16::try_from(i).ok().and_then(|i| port.checked_add(i))?;
            Some(format!("{host}:{p}"))
        })
        .collect()
}

/// Starts one pod on each of `addrs`, in order, each built from `config` and `modules`. When
/// one fails to start (a port taken), the ones already started are stopped and its error is
/// returned: a fleet starts whole or not at all.
pub async fn start_fleet(
    config: &ServerConfig,
    modules: &[LoraModule],
    addrs: &[String],
) -> Result<Vec<RunningServer>, StartError> {
    let mut started = Vec::with_capacity(addrs.len());
    for (i, addr) in addrs.iter().enumerate() {
        let mut config = config.clone();
        if let Some(events) = &config.kv_events {
            match events.for_pod(i) {
                Ok(e) => config.kv_events = Some(e),
                Err(e) => {
                    stop_fleet(started, Duration::ZERO).await;
                    return Err(StartError::Config(e));
                }
            }
        }
        match start(config, modules, addr).await {
            Ok(server) => started.push(server),
            Err(e) => {
                stop_fleet(started, Duration::ZERO).await;
                return Err(e);
            }
        }
    }
    Ok(started)
}

/// Stops every pod at once: each stops accepting and drains for at most `grace`.
pub async fn stop_fleet(servers: Vec<RunningServer>, grace: Duration) {
    join_all(servers.into_iter().map(|s| s.stop(grace))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_port_gives_consecutive_ports_and_zero_gives_free_ones() {
        assert_eq!(
            pod_addrs("127.0.0.1", 9000, 3).unwrap(),
            ["127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002"]
        );
        assert_eq!(pod_addrs("h", 0, 2).unwrap(), ["h:0", "h:0"]);
        assert_eq!(pod_addrs("h", 65534, 2).unwrap(), ["h:65534", "h:65535"]);
        assert_eq!(pod_addrs("h", 65535, 2), None);
        assert_eq!(pod_addrs("h", 1, MAX_PODS).unwrap().len(), MAX_PODS);
    }
}
