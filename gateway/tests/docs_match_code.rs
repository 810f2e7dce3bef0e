//! The reference docs and the code name the same things. Every configuration key the gateway
//! accepts is in `docs/gateway-config.md` under its section, every key documented there is one the
//! gateway accepts; every metric the gateway exports is in `docs/admin-api.md` and every
//! `prewarm_` metric named there is exported; every route the API serves is documented there (or,
//! for the dashboard's assets, in `docs/dashboard.md`) and every documented route is served.
//!
//! The configuration's keys are read from the parser itself: every section denies unknown fields,
//! so a table holding one unknown key is refused with the list of the keys it accepts, which also
//! tells a table (a list) from a value (no list). The routes are read from `src/api/mod.rs`'s
//! `.route(` calls, the metrics from `src/telemetry.rs`'s `registry.register(` calls.

use std::collections::{BTreeMap, BTreeSet};

use prewarm_gateway::config::GatewayConfig;
use serde_json::json;

const GATEWAY_CONFIG_MD: &str = include_str!("../../docs/gateway-config.md");
const ADMIN_API_MD: &str = include_str!("../../docs/admin-api.md");
const API_RS: &str = include_str!("../src/api/mod.rs");
const TELEMETRY_RS: &str = include_str!("../src/telemetry.rs");

const PROBE: &str = "\u{1}probe";

/// The keys the table at `path` accepts, or `None` when `path` is not a table.
fn keys_at(path: &[&str]) -> Option<Vec<String>> {
    let mut doc = json!({ PROBE: 0 });
    for key in path.iter().rev() {
        doc = match key.strip_suffix("[]") {
            Some(list) => json!({ list: [doc] }),
            None => json!({ *key: doc }),
        };
    }
    let err = serde_json::from_value::<GatewayConfig>(doc)
        .err()?
        .to_string();
    let expected = err
        .split_once(&format!("unknown field `{PROBE}`, expected "))?
        .1;
    let keys = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    Some(keys)
}

/// Every key path of the configuration, `pods.static[].id` style, discovered from the parser.
fn config_keys() -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        let as_ref: Vec<&str> = path.iter().map(String::as_str).collect();
        let Some(keys) = keys_at(&as_ref) else {
            // a value, or a list of tables
            let mut list = path.clone();
            if let Some(last) = list.last_mut() {
                last.push_str("[]");
                let as_ref: Vec<&str> = list.iter().map(String::as_str).collect();
                if keys_at(&as_ref).is_some() {
                    todo.push(list);
                    continue;
                }
            }
            out.insert(path.join("."), path);
            continue;
        };
        for key in keys {
            let mut next = path.clone();
            next.push(key);
            todo.push(next);
        }
    }
    out
}

/// The text of `docs/gateway-config.md` that documents section `[name]`: from the heading or
/// paragraph that opens it to the next section's.
fn section_text(name: &str) -> &'static str {
    let open = format!("`[{name}]`");
    let (start, ends): (usize, &[&str]) = match GATEWAY_CONFIG_MD.find(&format!("\n### {open}")) {
        Some(heading) => (heading + 1, &["\n### ", "\n## "]),
        None => {
            let paragraph = GATEWAY_CONFIG_MD
                .find(&format!("\n{open}"))
                .unwrap_or_else(|| panic!("docs/gateway-config.md has no section {open}"));
            (paragraph + 1, &["\n### ", "\n## ", "\n`["])
        }
    };
    let rest = &GATEWAY_CONFIG_MD[start..];
    let end = ends
        .iter()
        .filter_map(|m| rest[1..].find(m))
        .min()
        .map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

/// The backticked words of a text (`a`, `b = 1` gives `a`, `b`, `1`).
fn backticked_words(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| {
            span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The keys a section's text presents as keys: a table row's first cell, or a backticked name
/// followed by its default in prose (`` `decay_factor` 0.95 ``, `` `sampling` `"hottest"` ``).
fn documented_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        if let Some(cell) = line.strip_prefix("| `") {
            if let Some((key, _)) = cell.split_once('`') {
                keys.insert(key.to_string());
            }
        }
    }
    let spans: Vec<&str> = text.split('`').collect();
    for i in (1..spans.len()).step_by(2) {
        let name = spans[i];
        let after = spans.get(i + 1).copied().unwrap_or("");
        let is_name = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
        let default_follows = after.starts_with(' ')
            && after[1..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
            || after == " " && spans.get(i + 2).is_some_and(|v| v.starts_with('"'));
        if is_name && default_follows {
            keys.insert(name.to_string());
        }
    }
    keys
}

#[test]
fn every_configuration_key_is_documented_in_its_section() {
    let keys = config_keys();
    assert!(keys.len() > 100, "the probe found only {} keys", keys.len());
    let mut missing = Vec::new();
    for path in keys.values() {
        let section = path[0].as_str();
        let leaf = path[path.len() - 1].trim_end_matches("[]");
        if !backticked_words(section_text(section)).contains(leaf) {
            missing.push(path.join("."));
        }
    }
    assert!(
        missing.is_empty(),
        "configuration keys the gateway accepts but docs/gateway-config.md does not document \
         in their section: {missing:?}"
    );
}

#[test]
fn every_documented_configuration_key_exists() {
    let keys = config_keys();
    let sections: BTreeSet<&str> = keys.values().map(|p| p[0].as_str()).collect();
    let mut unknown = Vec::new();
    for section in sections {
        let accepted: BTreeSet<&str> = keys
            .values()
            .filter(|p| p[0] == section)
            .flat_map(|p| p.iter().map(|k| k.trim_end_matches("[]")))
            .collect();
        for key in documented_keys(section_text(section)) {
            if !accepted.contains(key.as_str()) {
                unknown.push(format!("[{section}] {key}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/gateway-config.md documents keys the gateway refuses: {unknown:?}"
    );
}

/// The metric families the gateway registers: the name of every `registry.register(` call in
/// `src/telemetry.rs` (a family with no series yet renders nothing, so the rendering cannot
/// list them).
fn exported_metrics() -> BTreeSet<String> {
    TELEMETRY_RS
        .split("registry.register(")
        .skip(1)
        .filter_map(|call| call.split('"').nth(1))
        .map(str::to_string)
        .collect()
}

/// The section of `docs/admin-api.md` that lists the metrics.
fn metrics_doc() -> &'static str {
    let start = ADMIN_API_MD
        .find("## Probes and metrics")
        .expect("docs/admin-api.md has its metrics section");
    let rest = &ADMIN_API_MD[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

#[test]
fn every_exported_metric_is_documented_and_every_documented_one_exported() {
    let exported = exported_metrics();
    assert!(exported.len() > 20, "the registry rendered {exported:?}");
    let doc = metrics_doc();
    let documented: BTreeSet<String> = doc
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("prewarm_") && !w.ends_with('_'))
        .map(str::to_string)
        .collect();
    // a counter renders as `x_total`, a histogram as `x_bucket`/`x_sum`/`x_count`
    let family = |name: &str| -> Option<String> {
        [name, &format!("{name}_total")]
            .into_iter()
            .chain(
                ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .filter_map(|s| name.strip_suffix(s)),
            )
            .find(|n| exported.contains(*n))
            .map(str::to_string)
    };
    let unexported: Vec<&String> = documented.iter().filter(|m| family(m).is_none()).collect();
    let named: BTreeSet<String> = documented.iter().filter_map(|m| family(m)).collect();
    let undocumented: Vec<&String> = exported.iter().filter(|m| !named.contains(*m)).collect();
    assert!(
        unexported.is_empty() && undocumented.is_empty(),
        "docs/admin-api.md names metrics the gateway does not export: {unexported:?}; \
         the gateway exports metrics it does not document: {undocumented:?}"
    );
}

/// `(METHOD, path)` of every `.route(` call in `src/api/mod.rs`.
fn served_routes() -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for call in API_RS.split(".route(").skip(1) {
        let Some(path) = call.split('"').nth(1) else {
            continue;
        };
        // the handlers up to the call's closing parenthesis
        let mut depth = 1;
        let mut end = call.len();
        for (i, c) in call.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let handlers = &call[..end];
        for method in ["get", "post", "delete", "put", "patch"] {
            let called = handlers.match_indices(&format!("{method}(")).any(|(i, _)| {
                handlers[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
            });
            if called {
                routes.insert((method.to_uppercase(), path.to_string()));
            }
        }
    }
    routes
}

/// `(METHOD, path)` of every backticked `METHOD /path` in `docs/admin-api.md`, query removed.
fn documented_routes() -> BTreeSet<(String, String)> {
    ADMIN_API_MD
        .split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|span| {
            let (method, path) = span.split_once(' ')?;
            let known = ["GET", "POST", "DELETE", "PUT", "PATCH"].contains(&method);
            let path = path.split('?').next()?;
            (known && path.starts_with('/') && !path.contains(' ') && !path.ends_with("..."))
                .then(|| (method.to_string(), path.to_string()))
        })
        .collect()
}

#[test]
fn every_served_route_is_documented_and_every_documented_one_served() {
    let served = served_routes();
    assert!(served.len() > 25, "found only {served:?}");
    let documented = documented_routes();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "routes served but not in docs/admin-api.md: {undocumented:?}; documented but not \
         served: {unserved:?}"
    );
}

#[test]
fn the_probe_reads_keys_values_and_lists_apart() {
    let keys = config_keys();
    for path in ["server.listen", "pods.static[].id", "lora.gold.slot_share"] {
        assert!(keys.contains_key(path), "{path} not in {keys:?}");
    }
    assert!(!keys.contains_key("server"), "a table read as a value");
    let doc =
        documented_keys("| `a_b` | 1 |\n`decay_factor` 0.95; `sampling` `\"x\"`; `no_default`");
    let expect: BTreeSet<String> = ["a_b", "decay_factor", "sampling"].map(String::from).into();
    assert_eq!(doc, expect);
}
