//! The configuration of the filter's direct calls (prefills and adapter touches it sends to the
//! pods itself): the mode, the static pods of standalone mode, and the rules their fields must
//! keep. Part of [`FilterConfig`]; `docs/filter-config.md` documents each field.

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

/// The routing table standalone mode routes with: the static pods, each of weight 1, holding no
/// adapter in particular (every adapter is placed among all of them).
pub fn static_table(config: &FilterConfig) -> RoutingTable {
    let pods = config
        .direct_pods
        .iter()
        .map(|p| RoutedPod::new(&p.id, &p.address, &[]))
        .collect();
    RoutingTable::of_pods(0, config.block_tokens, pods)
}

/// Problems of the direct-call fields, as `field: value: rule`.
pub fn validate(c: &FilterConfig) -> Vec<String> {
    let mut p = Vec::new();
    if c.direct_cluster.is_empty() {
        p.push("direct_cluster: \"\": must not be empty".into());
    }
    header_name(&mut p, "direct_host_header", &c.direct_host_header);
    if c.direct_host_header == c.endpoint_header {
        p.push(format!(
            "direct_host_header: {:?}: must differ from endpoint_header",
            c.direct_host_header
        ));
    }
    range(
        &mut p,
        "direct_calls_per_min",
        c.direct_calls_per_min,
        1,
        100_000,
    );
    // the largest prefill (the whole fingerprinted prefix and one token) must fit a minute
    let largest = (c.max_prefix_tokens as u64).saturating_add(1);
    range(
        &mut p,
        "direct_prefill_tokens_per_min",
        c.direct_prefill_tokens_per_min,
        largest,
        1 << 40,
    );
    range(&mut p, "direct_timeout_ms", c.direct_timeout_ms, 1, 600_000);
    range(
        &mut p,
        "direct_takeover_after_ms",
        c.direct_takeover_after_ms,
        0,
        3_600_000,
    );
    if c.direct_pods.len() > MAX_DIRECT_PODS {
        p.push(format!(
            "direct_pods: {} pods: must be at most {MAX_DIRECT_PODS}",
            c.direct_pods.len()
        ));
    }
    if c.direct_calls == DirectMode::Always && c.direct_pods.is_empty() {
        p.push("direct_pods: []: must name at least one pod when direct_calls is always".into());
    }
    for (i, pod) in c.direct_pods.iter().enumerate() {
        if pod.id.is_empty() || pod.id.len() > prewarm_core::wire::MAX_NAME_BYTES {
            p.push(format!(
                "direct_pods[{i}].id: {:?}: must be 1 to {} bytes",
                pod.id,
                prewarm_core::wire::MAX_NAME_BYTES
            ));
        }
        if c.direct_pods.iter().take(i).any(|q| q.id == pod.id) {
            p.push(format!("direct_pods[{i}].id: {:?}: must be unique", pod.id));
        }
        if pod.address.parse::<SocketAddr>().is_err() {
            p.push(format!(
                "direct_pods[{i}].address: {:?}: must be ip:port or [ipv6]:port",
                pod.address
            ));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use crate::config::FilterConfig;

    #[test]
    fn defaults_take_over_when_the_gateway_is_down() {
        let c = FilterConfig::from_json(b"").unwrap();
        assert_eq!(c.direct_calls, super::DirectMode::WhenGatewayDown);
        assert!(c.direct_pods.is_empty());
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
