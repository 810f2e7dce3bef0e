//! Validation of a parsed [`GatewayConfig`]: every problem as `field: value: rule`, so
//! `check-config` and `serve` can list them all and exit 64 before binding anything.

use std::collections::HashSet;
use std::net::SocketAddr;

use prewarm_core::address::{is_pod_address, ADDRESS_RULE};
use prewarm_core::wire::MAX_RESIDENT_ADAPTERS;

use super::GatewayConfig;
use crate::policy::Sampling;

/// `field: value: must be lo..hi` when `value` is outside `lo..=hi`.
pub fn out_of_range(field: &str, value: u64, lo: u64, hi: u64) -> Option<String> {
    (!(lo..=hi).contains(&value)).then(|| format!("{field}: {value}: must be {lo}..{hi}"))
}

/// Every problem with `config` (empty when it is usable).
pub fn validate(config: &GatewayConfig) -> Vec<String> {
    let mut p = Vec::new();
    let s = &config.server;
    if s.listen.parse::<SocketAddr>().is_err() {
        p.push(format!(
            "server.listen: {:?}: must be ip:port (port 0 picks a free port)",
            s.listen
        ));
    }
    if !s.filter_listen.is_empty() {
        match s.filter_listen.parse::<SocketAddr>() {
            Err(_) => p.push(format!(
                "server.filter_listen: {:?}: must be ip:port (port 0 picks a free port), or empty",
                s.filter_listen
            )),
            Ok(a) if a.port() != 0 && s.listen.parse::<SocketAddr>().ok() == Some(a) => {
                p.push(format!(
                    "server.filter_listen: {:?}: must differ from server.listen",
                    s.filter_listen
                ))
            }
            Ok(_) => {}
        }
    }
    for (field, cap) in [
        ("server.max_connections", s.max_connections),
        ("server.filter_max_connections", s.filter_max_connections),
    ] {
        p.extend(out_of_range(field, cap as u64, 0, 1_000_000));
    }
    if !(64..=64 * 1024 * 1024).contains(&s.max_body_bytes) {
        p.push(format!(
            "server.max_body_bytes: {}: must be 64..67108864",
            s.max_body_bytes
        ));
    }
    p.extend(out_of_range(
        "server.max_signal_body_bytes",
        s.max_signal_body_bytes as u64,
        1024,
        256 * 1024 * 1024,
    ));
    p.extend(out_of_range(
        "server.drain_seconds",
        s.drain_seconds,
        0,
        600,
    ));
    p.extend(out_of_range(
        "server.header_read_timeout_ms",
        s.header_read_timeout_ms,
        100,
        600_000,
    ));
    for (field, token) in [
        ("server.admin_token", &s.admin_token),
        ("server.signal_token", &s.signal_token),
        ("server.read_token", &s.read_token),
    ] {
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            p.push(format!(
                "{field}: (hidden): must not contain spaces or control characters"
            ));
        }
    }
    if config.state.dir.as_os_str().is_empty() {
        p.push("state.dir: \"\": must not be empty".into());
    }
    for problem in config.fingerprint.core().validate() {
        p.push(format!("fingerprint.{problem}"));
    }
    pods_problems(config, &mut p);
    p.extend(config.embeddings.validate());
    p.extend(config.traces.validate());
    p.extend(config.warm_embeddings.validate());
    let r = &config.registry;
    for (field, value, lo, hi) in [
        (
            "registry.max_manifest_files",
            r.max_manifest_files as u64,
            1,
            100_000,
        ),
        (
            "registry.rollout_watch_seconds",
            r.rollout_watch_seconds,
            0,
            86_400,
        ),
        (
            "registry.rollout_min_requests",
            r.rollout_min_requests,
            1,
            10_000_000,
        ),
    ] {
        p.extend(out_of_range(field, value, lo, hi));
    }
    p.extend(config.hotness.validate("hotness."));
    p.extend(config.kv.validate("kv."));
    p.extend(config.lora.validate("lora."));
    p.extend(config.warmup.validate("warmup."));
    if config.warmup.sampling == Sampling::Groups && config.embeddings.model_dir.is_none() {
        p.push(
            "warmup.sampling: \"groups\": needs embeddings.model_dir (the groups are the \
             prompt index's)"
                .into(),
        );
    }
    p.extend(config.routing.validate("routing."));
    if let Some(problem) = config.experiment.as_ref().and_then(|e| e.problem()) {
        p.push(format!("experiment.{problem}"));
    }
    p
}

fn pods_problems(config: &GatewayConfig, p: &mut Vec<String>) {
    let pods = &config.pods;
    if pods.base_model.is_empty() {
        p.push("pods.base_model: \"\": must not be empty".into());
    }
    let mut seen = HashSet::new();
    for (i, pod) in pods.static_pods.iter().enumerate() {
        let at = format!("pods.static[{i}]");
        p.extend(pod.problems(&at));
        if !seen.insert(pod.id.as_str()) {
            p.push(format!("{at}.id: {:?}: duplicate pod id", pod.id));
        }
    }
    if let Some(listen) = &pods.kv_events_listen {
        if !is_pod_address(listen) {
            p.push(format!("pods.kv_events_listen: {listen:?}: {ADDRESS_RULE}"));
        }
    }
    if let Some(dns) = &pods.dns {
        if dns.name.is_empty() || dns.name.contains(char::is_whitespace) {
            p.push(format!(
                "pods.dns.name: {:?}: must be a host name",
                dns.name
            ));
        }
        if dns.port == 0 {
            p.push("pods.dns.port: 0: must be > 0".into());
        }
        if dns.interval_seconds == 0 {
            p.push("pods.dns.interval_seconds: 0: must be > 0".into());
        }
        if dns.max_loras == 0 || dns.max_loras > MAX_RESIDENT_ADAPTERS {
            p.push(format!(
                "pods.dns.max_loras: {}: must be 1..{MAX_RESIDENT_ADAPTERS}",
                dns.max_loras
            ));
        }
    }
    if !(50..=600_000).contains(&pods.health_interval_ms) {
        p.push(format!(
            "pods.health_interval_ms: {}: must be 50..600000",
            pods.health_interval_ms
        ));
    }
    if pods.unhealthy_after == 0 {
        p.push("pods.unhealthy_after: 0: must be > 0".into());
    }
    if !(10..=600_000).contains(&pods.request_timeout_ms) {
        p.push(format!(
            "pods.request_timeout_ms: {}: must be 10..600000",
            pods.request_timeout_ms
        ));
    }
    if !(10..=60_000).contains(&pods.connect_timeout_ms) {
        p.push(format!(
            "pods.connect_timeout_ms: {}: must be 10..60000",
            pods.connect_timeout_ms
        ));
    }
    if pods.retries > 10 {
        p.push(format!(
            "pods.retries: {}: must be at most 10",
            pods.retries
        ));
    }
    if pods.retry_backoff_ms > 60_000 {
        p.push(format!(
            "pods.retry_backoff_ms: {}: must be at most 60000",
            pods.retry_backoff_ms
        ));
    }
    if pods.adapter_replicas == 0 || pods.adapter_replicas > 64 {
        p.push(format!(
            "pods.adapter_replicas: {}: must be 1..64",
            pods.adapter_replicas
        ));
    }
    if !(0.0..1.0).contains(&pods.gold_pool_share) {
        p.push(format!(
            "pods.gold_pool_share: {}: must be in [0, 1)",
            pods.gold_pool_share
        ));
    }
    if pods.max_in_flight_per_pod == 0 || pods.max_in_flight_per_pod > 1024 {
        p.push(format!(
            "pods.max_in_flight_per_pod: {}: must be 1..1024",
            pods.max_in_flight_per_pod
        ));
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{GatewayConfig, PodSpec};

    #[test]
    fn every_problem_is_listed_with_its_field() {
        let mut c = GatewayConfig::default();
        c.server.listen = "nowhere".into();
        c.registry.max_manifest_files = 0;
        c.registry.rollout_min_requests = 0;
        c.hotness.decay_factor = 1.5;
        c.warmup.sampling = crate::policy::Sampling::Groups;
        c.pods.static_pods = vec![PodSpec::new("a", "h:1"), PodSpec::new("a", "h:2")];
        c.pods.gold_pool_share = 1.0;
        c.experiment =
            Some(serde_json::from_str(r#"{"id":"e","arms":[{"name":"a","weight":1}]}"#).unwrap());
        let problems = super::validate(&c);
        let fields: Vec<&str> = problems
            .iter()
            .map(|p| p.split(':').next().unwrap())
            .collect();
        assert_eq!(
            fields,
            [
                "server.listen",
                "pods.static[1].id",
                "pods.gold_pool_share",
                "registry.max_manifest_files",
                "registry.rollout_min_requests",
                "hotness.decay_factor",
                "warmup.sampling",
                "experiment.arms"
            ],
            "{problems:?}"
        );
    }

    #[test]
    fn the_filters_listener_must_be_an_address_of_its_own() {
        let mut c = GatewayConfig::default();
        c.server.filter_listen = "nowhere".into();
        c.server.max_connections = 2_000_000;
        let problems = super::validate(&c);
        assert!(
            problems[0].starts_with("server.filter_listen: \"nowhere\""),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("server.max_connections: 2000000"),
            "{problems:?}"
        );
        c.server.max_connections = 0;
        c.server.filter_listen = c.server.listen.clone();
        assert!(super::validate(&c)[0].contains("must differ from server.listen"));
        c.server.filter_listen = "127.0.0.1:0".into();
        assert!(super::validate(&c).is_empty());
    }
}
