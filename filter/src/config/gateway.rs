//! The Gateway section of the filter's configuration: where and how the filter calls the prewarm
//! gateway, and how often its root context ticks.

use serde::Deserialize;

use super::range;

/// Calls to the gateway (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// Envoy cluster of the prewarm gateway (default `prewarm-gateway`).
    pub gateway_cluster: String,
    /// `:authority` of calls to the gateway (default `prewarm-gateway`).
    pub gateway_authority: String,
    /// Bearer token sent to the gateway as `authorization: Bearer …` (default none).
    pub gateway_token: Option<String>,
    /// Timeout of each call to the gateway, ms (default 500).
    pub gateway_timeout_ms: u64,
    /// Root-context tick: batch flush and table poll period, ms (default 1000).
    pub tick_period_ms: u64,
    /// Names this filter in the batches it sends (default `prewarm-filter`).
    pub source: String,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            gateway_cluster: "prewarm-gateway".into(),
            gateway_authority: "prewarm-gateway".into(),
            gateway_token: None,
            gateway_timeout_ms: 500,
            tick_period_ms: 1000,
            source: "prewarm-filter".into(),
        }
    }
}

impl GatewayConfig {
    /// This section's problems, as `field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.gateway_cluster.is_empty() {
            p.push("gateway_cluster: \"\": must not be empty".into());
        }
        if self.gateway_authority.is_empty() {
            p.push("gateway_authority: \"\": must not be empty".into());
        }
        if let Some(token) = &self.gateway_token {
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                p.push("gateway_token: (hidden): must be non-empty visible ASCII".into());
            }
        }
        range(p, "gateway_timeout_ms", self.gateway_timeout_ms, 1, 60_000);
        range(p, "tick_period_ms", self.tick_period_ms, 10, 60_000);
        if self.source.len() > prewarm_core::wire::MAX_NAME_BYTES {
            p.push(format!(
                "source: {} bytes: must be at most {}",
                self.source.len(),
                prewarm_core::wire::MAX_NAME_BYTES
            ));
        }
    }
}
