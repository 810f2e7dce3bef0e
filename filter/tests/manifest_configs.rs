//! Every plugin configuration that a shipped manifest embeds (the Envoy configurations under
//! `envoy/`, the Istio `EnvoyFilter`s and `WasmPlugin` under `envoy/istio/`) parses and validates
//! with the filter's own parser, [`FilterConfig::from_json`] — the one `on_configure` runs — so
//! a manifest can never ship a configuration the filter would refuse at load time.
//!
//! The crate has no YAML parser, and the embeddings have two fixed shapes, found textually:
//! - `configuration: { "@type": ...StringValue, value: | <JSON block scalar> }` (Envoy, EnvoyFilter);
//! - `pluginConfig: { ... }` written as a YAML flow mapping that is literal JSON (WasmPlugin).
//!
//! tests/test_manifests.py reads the same manifests with a real YAML parser and checks that it
//! finds the same number of configurations per file, so this extraction cannot silently miss one.

// A test crate: its helpers fail loudly on purpose (the crate's lints target the request path).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};

use prewarm_filter::config::{EndpointHeaderOwner, FilterConfig, RoutingConfig};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Every `.yaml` file under `envoy/`, recursively, sorted.
fn manifests() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![repo_root().join("envoy")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The JSON block scalars that follow a `google.protobuf.StringValue` `@type` line.
fn string_value_blocks(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if !(trimmed == "value: |" || trimmed == "value: |-") || i == 0 {
            continue;
        }
        if !lines[i - 1].contains("type.googleapis.com/google.protobuf.StringValue") {
            continue;
        }
        let own = indent(line);
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > own)
            .copied()
            .collect();
        blocks.push(body.join("\n"));
    }
    blocks
}

/// The flow mappings after `pluginConfig:`, up to the brace that closes them (strings honoured).
fn plugin_config_mappings(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("pluginConfig:") {
        let after = &rest[at + "pluginConfig:".len()..];
        let Some(open) = after.find('{') else { break };
        let (mut depth, mut in_string, mut escaped, mut end) = (0usize, false, false, None);
        for (i, c) in after[open..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_string => escaped = true,
                '"' => in_string = !in_string,
                '{' if !in_string => depth += 1,
                '}' if !in_string => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(open + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end.expect("pluginConfig mapping is closed");
        found.push(after[open..end].to_string());
        rest = &after[end..];
    }
    found
}

/// (file relative to the repository, configuration text) for every embedded configuration.
fn embedded_configs() -> Vec<(String, String)> {
    let root = repo_root();
    let mut out = Vec::new();
    for path in manifests() {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for config in string_value_blocks(&text)
            .into_iter()
            .chain(plugin_config_mappings(&text))
        {
            out.push((name.clone(), config));
        }
    }
    out
}

fn parse(file: &str, json: &str) -> FilterConfig {
    FilterConfig::from_json(json.as_bytes())
        .unwrap_or_else(|problems| panic!("{file}: plugin configuration refused: {problems:?}"))
}

#[test]
fn every_embedded_configuration_parses_with_the_filter_parser() {
    let configs = embedded_configs();
    for (file, json) in &configs {
        parse(file, json);
    }
    let files: Vec<&str> = configs.iter().map(|(f, _)| f.as_str()).collect();
    for expected in [
        "envoy/envoy.yaml",
        "envoy/mesh-equivalent.yaml",
        "envoy/istio/envoyfilter.yaml",
        "envoy/istio/envoyfilter-sidecar.yaml",
        "envoy/istio/wasmplugin.yaml",
        "envoy/beside-endpoint-picker.yaml",
        "envoy/istio/envoyfilter-beside-endpoint-picker.yaml",
    ] {
        assert!(
            files.contains(&expected),
            "{expected}: no plugin configuration found in {files:?}"
        );
    }
}

#[test]
fn istio_manifests_name_istio_clusters_and_match_their_install_mode() {
    let configs = embedded_configs();
    let of = |file: &str| -> FilterConfig {
        let (f, json) = configs
            .iter()
            .find(|(f, _)| f == file)
            .unwrap_or_else(|| panic!("{file}: no configuration"));
        parse(f, json)
    };
    let full = of("envoy/istio/envoyfilter.yaml");
    let light = of("envoy/istio/wasmplugin.yaml");
    let beside = of("envoy/istio/envoyfilter-beside-endpoint-picker.yaml");
    for c in [&full, &light, &beside] {
        assert!(
            c.gateway.gateway_cluster.starts_with("outbound|9101||"),
            "Istio names clusters outbound|<port>||<fqdn>, and filters call the gateway's \
             filter listener (its Service port http-filters, 9101): {}",
            c.gateway.gateway_cluster
        );
    }
    assert!(full.routing.enabled, "the EnvoyFilter install routes");
    assert!(
        !light.routing.enabled,
        "WasmPlugin cannot route (no allow_on_headers_stop_iteration)"
    );
    assert_eq!(of("envoy/mesh-equivalent.yaml"), full);
    assert_eq!(of("envoy/istio/envoyfilter-sidecar.yaml"), full);
    // prewarm owns the endpoint header everywhere but beside another router, where it only
    // observes; otherwise the two installs are configured alike
    for c in [&full, &light] {
        assert_eq!(
            c.routing.endpoint_header_owner,
            EndpointHeaderOwner::Prewarm
        );
    }
    for c in [&beside, &of("envoy/beside-endpoint-picker.yaml")] {
        assert_eq!(
            c.routing.endpoint_header_owner,
            EndpointHeaderOwner::External
        );
        assert!(!c.routing.enabled, "the other router names the pod");
    }
    assert_eq!(
        FilterConfig {
            routing: RoutingConfig {
                enabled: true,
                endpoint_header_owner: EndpointHeaderOwner::Prewarm,
                ..beside.routing
            },
            ..beside
        },
        full
    );
}

#[test]
fn extraction_finds_both_shapes_and_a_bad_configuration_is_refused() {
    let envoy = "configuration:\n  \"@type\": type.googleapis.com/google.protobuf.StringValue\n  value: |\n    {\"tick_period_ms\": 0}\nfailure_policy: FAIL_RELOAD\n";
    let blocks = string_value_blocks(envoy);
    assert_eq!(blocks, vec!["    {\"tick_period_ms\": 0}".to_string()]);
    let problems = FilterConfig::from_json(blocks[0].as_bytes()).unwrap_err();
    assert!(
        problems[0].starts_with("tick_period_ms: 0:"),
        "{problems:?}"
    );

    let wasm =
        "  pluginConfig: {\n    \"source\": \"a}b\",\n    \"routing\": false\n  }\n  other: 1\n";
    let mappings = plugin_config_mappings(wasm);
    assert_eq!(mappings.len(), 1);
    assert!(!parse("inline", &mappings[0]).routing.enabled);
}
