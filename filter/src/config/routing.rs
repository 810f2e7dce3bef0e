//! The routing section of the filter's configuration: the headers the filter owns on a request
//! it routes — the pod it names and its alternatives, who else may name it, the experiment arm.

use serde::Deserialize;

use super::{header_name, range};

/// The headers the filter writes (JSON keys at the top level of the configuration).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RoutingConfig {
    /// `routing`: whether to set the endpoint header from the routing table (default true).
    #[serde(rename = "routing")]
    pub enabled: bool,
    /// Header naming the chosen pod (default `x-gateway-destination-endpoint`).
    pub endpoint_header: String,
    /// Who sets `endpoint_header`: `prewarm` (default: a client's value is removed from every
    /// request, only this filter names a pod) or `external` (another router, the Inference
    /// Extension's endpoint picker or llm-d's, sets it before this filter: it is never removed
    /// or set here, `routing` must be false, and the pod it names is recorded as served).
    pub endpoint_header_owner: EndpointHeaderOwner,
    /// Retry alternatives after the chosen pod in the endpoint header, in rank order
    /// (default 2, matching the shipped route's `num_retries`).
    pub endpoint_alternatives: usize,
    /// Header naming a request's experiment arm, `<experiment>/<arm>` (default `x-prewarm-arm`):
    /// removed from every request, set on those the filter assigns to an arm.
    pub arm_header: String,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            endpoint_header: "x-gateway-destination-endpoint".into(),
            endpoint_header_owner: EndpointHeaderOwner::Prewarm,
            endpoint_alternatives: 2,
            arm_header: "x-prewarm-arm".into(),
        }
    }
}

/// Who owns the endpoint header (`endpoint_header_owner`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointHeaderOwner {
    /// This filter: a client's value is removed from every request; with `routing` the filter
    /// sets it from the routing table.
    #[default]
    Prewarm,
    /// Another router that runs before this filter and overwrites a client's value (the
    /// Inference Extension's endpoint picker, llm-d): the filter never removes or sets the
    /// header, does not route, and records the pod it names as served (`external_route`).
    External,
}

impl RoutingConfig {
    /// This section's problems, as `field: value: rule`.
    pub fn validate(&self, p: &mut Vec<String>) {
        range(
            p,
            "endpoint_alternatives",
            self.endpoint_alternatives,
            0,
            16,
        );
        header_name(p, "endpoint_header", &self.endpoint_header);
        if self.endpoint_header_owner == EndpointHeaderOwner::External && self.enabled {
            p.push(
                "endpoint_header_owner: \"external\": needs \"routing\": false (the other router \
                 names the pod; the filter only records it)"
                    .into(),
            );
        }
        header_name(p, "arm_header", &self.arm_header);
    }
}
