//! How many connections each listener may hold open, from the process's file-descriptor limit.
//!
//! Every accepted connection takes a file descriptor, and so does every connection the gateway
//! opens to a pod (health checks, metrics scrapes, warm calls) and every snapshot file. When
//! clients hold all of them — 1,100 half-sent requests at the common limit of 1,024 — `accept`
//! fails, a filter's table poll waits behind them for a slot (measured: up to 2.9 s) and the
//! pods' health checks cannot connect. So the descriptors are split by class, and a listener at
//! its cap stops accepting (the kernel's backlog holds newcomers) instead of letting one class
//! starve the others:
//!
//! | class | share of the limit `L` | why that much |
//! |---|---|---|
//! | `server.listen` (admin, dashboard, Prometheus; filters when no `filter_listen`) | `L / 2` | anything may connect here |
//! | `server.filter_listen` (filters' polls and signals) | `L / 4` | a proxy keeps one or two connections alive: `L = 1,024` serves 128–256 proxies |
//! | outgoing calls to pods, files | the rest, `L / 4` | grows with the fleet, not with clients |
//!
//! The outgoing share assumes the fleet needs fewer than `L / 4` connections (about one
//! kept-alive connection a pod for checks, plus warm calls in flight): with 1,000 pods the limit
//! must be ≥ 4,096 (Kubernetes' containers get 1,048,576). A configured cap
//! (`server.max_connections`, `server.filter_max_connections`) wins over the share. At start
//! the soft limit is raised to the hard one, as Go's runtime does for its servers.

use crate::config::ServerConfig;

/// The open connections each listener may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// `server.listen`.
    pub main: usize,
    /// `server.filter_listen`.
    pub filter: usize,
}

/// The caps for a process allowed `fd_limit` descriptors (see the module doc).
pub fn caps(fd_limit: u64, server: &ServerConfig) -> ConnectionCaps {
    let limit = usize::try_from(fd_limit).unwrap_or(usize::MAX);
    let or_share = |configured: usize, share: usize| {
        if configured > 0 {
            configured
        } else {
            share.max(1)
        }
    };
    ConnectionCaps {
        main: or_share(server.max_connections, limit / 2),
        filter: or_share(server.filter_max_connections, limit / 4),
    }
}

/// Raises the soft descriptor limit to the hard one and returns the soft limit now in force
/// (1,024, the common default, when it cannot be read; unlimited reads as `u32::MAX`).
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = raised,
            Err(e) => tracing::warn!(error = %e, "cannot raise the file-descriptor limit"),
        }
    }
    limit.current.unwrap_or(u64::from(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listeners_leave_a_quarter_of_the_descriptors_to_pods_and_files() {
        let server = ServerConfig::default();
        for limit in [64u64, 1_024, 20_000, 1_048_576] {
            let c = caps(limit, &server);
            let held = (c.main + c.filter) as u64;
            assert!(held <= limit - limit / 4, "{limit}: {c:?}");
            assert!(c.filter >= 1 && c.main >= c.filter, "{limit}: {c:?}");
        }
        assert_eq!(
            caps(1_024, &server),
            ConnectionCaps {
                main: 512,
                filter: 256
            }
        );
    }

    #[test]
    fn a_configured_cap_wins_over_the_share() {
        let server = ServerConfig {
            max_connections: 100,
            filter_max_connections: 7,
            ..ServerConfig::default()
        };
        assert_eq!(
            caps(1_048_576, &server),
            ConnectionCaps {
                main: 100,
                filter: 7
            }
        );
    }

    #[test]
    fn a_tiny_limit_still_lets_each_listener_accept() {
        let c = caps(2, &ServerConfig::default());
        assert_eq!((c.main, c.filter), (1, 1));
    }
}
