//! The configuration of the filter's direct calls (prefills and adapter touches it sends to the
//! pods itself): the mode, the static pods of standalone mode, and the rules their fields must
//! keep. A section of [`FilterConfig`], its keys flat at the configuration's top level;
//! `docs/filter-config.md` documents each field.

use std::net::SocketAddr;

use prewarm_core::wire::{RoutedPod, RoutingTable};
use serde::Deserialize;

use crate::config::{header_name, range, FilterConfig};

/// Most pods in `direct_pods`.
pub const MAX_DIRECT_PODS: usize = 1024;

/// Who sends the warming calls to the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectMode {
    /// Only the gateway.
    Off,
    /// The gateway while it answers; the filter after its calls failed for
    /// `direct_takeover_after_ms`, until one succeeds again.
    WhenGatewayDown,
    /// The filter alone: no gateway, pods from `direct_pods`.
    Always,
}

/// A pod of standalone mode.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectPod {
    pub id: String,
    /// `ip:port` (`[ipv6]:port`): the `ORIGINAL_DST` cluster connects to it as written, without
    /// DNS.
    pub address: String,
}

/// The Direct calls section (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct DirectConfig {
    /// Who sends prefills and adapter touches to the pods: `off` (only the gateway),
    /// `when_gateway_down` (the filter takes over while the gateway's calls fail; default) or
    /// `always` (standalone, no gateway; the pods are `direct_pods`).
    pub direct_calls: DirectMode,
    /// Envoy cluster of the direct calls: an `ORIGINAL_DST` cluster reading `direct_host_header`
    /// that no route references (default `prewarm-direct`).
    pub direct_cluster: String,
    /// Header naming the pod of a direct call; stripped from every client request (default
    /// `x-prewarm-direct-host`; must differ from `endpoint_header`).
    pub direct_host_header: String,
    /// The pods in `always` mode (id + `host:port`); the routing table is built from them.
    pub direct_pods: Vec<DirectPod>,
    /// Most direct calls a minute per Envoy (default 60: one a default tick).
    pub direct_calls_per_min: u64,
    /// Most prompt tokens of direct prefills a minute per Envoy (default 240,000: one pod's
    /// prefill minute at 4,000 tokens/s, so one Envoy's warming never takes more than one pod's
    /// whole prefill capacity; at least `max_prefix_tokens` + 1, the largest prefill).
    pub direct_prefill_tokens_per_min: u64,
    /// Timeout of each direct call, ms (default 10,000: a prefill of the largest fingerprinted
    /// prefix, 32,768 tokens, at 4,000 tokens/s takes 8.2 s).
    pub direct_timeout_ms: u64,
    /// How long the gateway's calls must have failed before the filter takes over, ms
    /// (default 5,000: five default ticks, so a gateway restart does not trigger it).
    pub direct_takeover_after_ms: u64,
}

impl Default for DirectConfig {
    fn default() -> Self {
        Self {
            direct_calls: DirectMode::WhenGatewayDown,
            direct_cluster: "prewarm-direct".into(),
            direct_host_header: "x-prewarm-direct-host".into(),
            direct_pods: Vec::new(),
            direct_calls_per_min: 60,
            direct_prefill_tokens_per_min: 240_000,
            direct_timeout_ms: 10_000,
            direct_takeover_after_ms: 5_000,
        }
    }
}

/// The routing table standalone mode routes with: the static pods, each of weight 1, holding no
/// adapter in particular (every adapter is placed among all of them).
pub fn static_table(config: &FilterConfig) -> RoutingTable {
    let pods = config
        .direct
        .direct_pods
        .iter()
        .map(|p| RoutedPod::new(&p.id, &p.address, &[]))
        .collect();
    RoutingTable::of_pods(0, config.requests.block_tokens, pods)
}

impl DirectConfig {
    /// This section's problems, as `field: value: rule`. The rules against other sections
    /// (`direct_host_header` against `endpoint_header`, `direct_prefill_tokens_per_min` against
    /// `max_prefix_tokens`) are [`FilterConfig::validate`]'s.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.direct_cluster.is_empty() {
            p.push("direct_cluster: \"\": must not be empty".into());
        }
        header_name(p, "direct_host_header", &self.direct_host_header);
        range(
            p,
            "direct_calls_per_min",
            self.direct_calls_per_min,
            1,
            100_000,
        );
        range(p, "direct_timeout_ms", self.direct_timeout_ms, 1, 600_000);
        range(
            p,
            "direct_takeover_after_ms",
            self.direct_takeover_after_ms,
            0,
            3_600_000,
        );
        if self.direct_pods.len() > MAX_DIRECT_PODS {
            p.push(format!(
                "direct_pods: {} pods: must be at most {MAX_DIRECT_PODS}",
                self.direct_pods.len()
            ));
        }
        if self.direct_calls == DirectMode::Always && self.direct_pods.is_empty() {
            p.push(
                "direct_pods: []: must name at least one pod when direct_calls is always".into(),
            );
        }
        for (i, pod) in self.direct_pods.iter().enumerate() {
            if pod.id.is_empty() || pod.id.len() > prewarm_core::wire::MAX_NAME_BYTES {
                p.push(format!(
                    "direct_pods[{i}].id: {:?}: must be 1 to {} bytes",
                    pod.id,
                    prewarm_core::wire::MAX_NAME_BYTES
                ));
            }
            if self.direct_pods.iter().take(i).any(|q| q.id == pod.id) {
                p.push(format!("direct_pods[{i}].id: {:?}: must be unique", pod.id));
            }
            if pod.address.parse::<SocketAddr>().is_err() {
                p.push(format!(
                    "direct_pods[{i}].address: {:?}: must be ip:port or [ipv6]:port",
                    pod.address
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::FilterConfig;

    #[test]
    fn defaults_take_over_when_the_gateway_is_down() {
        let c = FilterConfig::from_json(b"").unwrap();
        assert_eq!(c.direct.direct_calls, super::DirectMode::WhenGatewayDown);
        assert!(c.direct.direct_pods.is_empty());
    }

    #[test]
    fn bad_direct_fields_are_named() {
        let e = FilterConfig::from_json(
            br#"{"direct_calls":"always","direct_timeout_ms":0,"direct_calls_per_min":0}"#,
        )
        .unwrap_err();
        assert!(e.iter().any(|p| p.starts_with("direct_pods: []:")), "{e:?}");
        assert!(e.contains(&"direct_timeout_ms: 0: must be between 1 and 600000".to_string()));
        assert!(e.iter().any(|p| p.starts_with("direct_calls_per_min: 0:")));
        let e = FilterConfig::from_json(
            br#"{"direct_calls":"always","direct_pods":[{"id":"a","address":"pod-a:80"},{"id":"a","address":"127.0.0.1:1"}]}"#,
        )
        .unwrap_err();
        assert!(
            e.iter()
                .any(|p| p.starts_with("direct_pods[0].address: \"pod-a:80\":")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|p| p.starts_with("direct_pods[1].id: \"a\": must be unique")),
            "{e:?}"
        );
        let e = FilterConfig::from_json(br#"{"direct_calls":"sometimes"}"#).unwrap_err();
        assert!(e[0].starts_with("direct_calls: \"sometimes\":"), "{e:?}");
        let ok = FilterConfig::from_json(
            br#"{"direct_calls":"always","direct_pods":[{"id":"a","address":"127.0.0.1:8000"}]}"#,
        )
        .unwrap();
        assert_eq!(super::static_table(&ok).pods[0].address, "127.0.0.1:8000");
    }
}
