//! `docs/filter-config.md` and the filter name the same things: every configuration key the
//! filter accepts has a row in the reference's tables, every row names a key it accepts; every
//! metric the filter defines is in the Metrics section, and every `prewarm_filter_` metric the
//! page names is one it defines.
//!
//! The keys are read from the parser itself: the configuration and its tables deny unknown
//! fields, so an object holding one unknown key is refused with the list of the keys it accepts
//! (which also tells a table from a value). The metrics are [`Metric::ALL`], a reason family
//! (`prewarm_filter_reason=.=no_table;.;unrouted_total`) by the name Prometheus shows
//! (`prewarm_filter_unrouted_total`).

// A test crate: its helpers fail loudly on purpose (the crate's lints target the request path).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;

use prewarm_filter::config::FilterConfig;
use prewarm_filter::host::Metric;
use serde_json::json;

const DOC: &str = include_str!("../../docs/filter-config.md");
const PROBE: &str = "\u{1}probe";

/// The keys the object at `path` accepts, or `None` when `path` is not an object.
fn keys_at(path: &[String]) -> Option<Vec<String>> {
    let mut doc = json!({ PROBE: 0 });
    for key in path.iter().rev() {
        doc = json!({ key.as_str(): doc });
    }
    let err = serde_json::from_value::<FilterConfig>(doc)
        .err()?
        .to_string();
    let expected = err
        .split_once(&format!("unknown field `{PROBE}`, expected "))?
        .1;
    Some(
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// Every key path of the configuration (`triggers.similar_prompts`), from the parser.
fn config_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![vec![]];
    while let Some(path) = todo.pop() {
        match keys_at(&path) {
            Some(keys) => todo.extend(keys.into_iter().map(|k| {
                let mut next = path.clone();
                next.push(k);
                next
            })),
            None => {
                out.insert(path.join("."));
            }
        }
    }
    out
}

/// The first cells of the page's table rows (`| \`key\` | ...`).
fn table_keys() -> BTreeSet<String> {
    DOC.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|cell| cell.split_once('`').map(|(k, _)| k.to_string()))
        .filter(|k| !k.starts_with("prewarm_filter_"))
        .collect()
}

/// A path is documented by a row naming it whole or by its last key (a table's own section).
fn documented(path: &str, rows: &BTreeSet<String>) -> bool {
    let leaf = path.rsplit('.').next().unwrap_or(path);
    rows.contains(path) || rows.contains(leaf)
}

#[test]
fn every_configuration_key_has_a_row_and_every_row_is_a_key() {
    let keys = config_keys();
    assert!(keys.len() > 50, "the probe found only {keys:?}");
    let rows = table_keys();
    let missing: Vec<&String> = keys.iter().filter(|k| !documented(k, &rows)).collect();
    let leaves: BTreeSet<&str> = keys
        .iter()
        .map(|k| k.rsplit('.').next().unwrap_or(k))
        .collect();
    let unknown: Vec<&String> = rows
        .iter()
        .filter(|r| !keys.contains(*r) && !leaves.contains(r.as_str()))
        .collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "keys the filter accepts without a row in docs/filter-config.md: {missing:?}; rows \
         naming no key it accepts: {unknown:?}"
    );
}

/// The name Prometheus shows for a metric: a reason family's name without its tag.
fn prometheus_name(metric: Metric) -> String {
    let name = metric.name();
    match name.split_once("reason=.=") {
        Some((prefix, rest)) => {
            let after = rest.split_once(";.;").map_or(rest, |(_, a)| a);
            format!("{prefix}{after}")
        }
        None => name.to_string(),
    }
}

#[test]
fn every_metric_is_documented_and_every_documented_one_defined() {
    let defined: BTreeSet<String> = Metric::ALL.iter().map(|m| prometheus_name(*m)).collect();
    assert!(defined.len() > 40, "{defined:?}");
    let start = DOC
        .find("\n## Metrics")
        .expect("the page has a Metrics section");
    let section = &DOC[start..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
    let in_section = metric_names(section);
    let on_page = metric_names(DOC);
    let undocumented: Vec<&String> = defined.difference(&in_section).collect();
    let undefined: Vec<&String> = on_page
        .difference(&defined)
        .filter(|n| !is_example(n))
        .collect();
    assert!(
        undocumented.is_empty() && undefined.is_empty(),
        "metrics the filter defines but the Metrics section does not name: {undocumented:?}; \
         names on the page the filter does not define: {undefined:?}"
    );
}

/// The metric names a text gives: every `prewarm_filter_` word, and a table cell's shorthand
/// (`` `prewarm_filter_signals_enqueued_total`, `_sent_total` `` names
/// `prewarm_filter_signals_sent_total`: the first name's group, then the suffix).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut group = None;
        for span in line.split('`').skip(1).step_by(2) {
            if let Some(rest) = span.strip_prefix("prewarm_filter_") {
                group = rest
                    .split('_')
                    .next()
                    .map(|g| format!("prewarm_filter_{g}"));
            } else if let (Some(suffix), Some(group)) = (span.strip_prefix('_'), &group) {
                if suffix.ends_with("_total")
                    && suffix.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                {
                    names.insert(format!("{group}_{suffix}"));
                }
            }
        }
        names.extend(
            line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("prewarm_filter_") && !w.ends_with('_'))
                .map(str::to_string),
        );
    }
    names
}

/// The page's explanation of the naming rule uses placeholders (`prewarm_filter_a_b_total`) and
/// the raw tagged form (`prewarm_filter_reason`).
fn is_example(name: &str) -> bool {
    ["prewarm_filter_a_b_total", "prewarm_filter_reason"].contains(&name)
}

#[test]
fn the_probe_reads_tables_and_values_apart() {
    let keys = config_keys();
    for key in [
        "gateway_cluster",
        "triggers.similar_prompts",
        "embedding_cache.ttl_ms",
    ] {
        assert!(keys.contains(key), "{key} not in {keys:?}");
    }
    assert!(!keys.contains("triggers"), "a table read as a value");
    let reason = Metric::ALL
        .iter()
        .find(|m| m.name().contains("reason=.=no_table;.;unrouted"))
        .expect("the unrouted family");
    assert_eq!(prometheus_name(*reason), "prewarm_filter_unrouted_total");
}
