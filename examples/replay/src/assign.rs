//! Adapter, tenant and tier assignment for traces that carry none.
//!
//! - **ServeGen** (`--adapters servegen:DIR`): each customer CSV (`chunk-<i>-trace.csv`, rows
//!   `window_start_s, rate_req_per_s, ...`) is one adapter and tenant named `sg-<i>`. The
//!   customers' windows are mapped linearly onto the trace's span (window `w` of `n` covers
//!   trace time `[w·span/n, (w+1)·span/n)`), and a customer's weight at a time is its rate in
//!   that window (all customers' total rates when every rate there is 0).
//! - **Zipf** (`--adapters zipf:N:S`): `N` adapters `zipf-<k>` with weight `1/k^S`.
//!
//! A request gets the adapter drawn (seeded) by the weights at the arrival of the first request
//! of its *prefix group* — the requests sharing their first block id — so requests that share a
//! prefix also share the adapter whose KV they can reuse (vLLM seeds KV block hashes by
//! adapter). A trace's own `adapter`/`tenant` fields win. Tiers go by share of assigned
//! requests: the top `gold_share` of tenants (at least one) are gold, the next `silver_share`
//! silver, the rest bronze.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use prewarm_gateway::policy::Tier;
use serde::Serialize;

use crate::render::splitmix64;
use crate::trace::TraceRequest;

/// Where adapters come from.
#[derive(Debug, Clone, PartialEq)]
pub enum AdapterSource {
    /// Base model only.
    None,
    /// ServeGen customer folder.
    ServeGen(std::path::PathBuf),
    /// `count` adapters with Zipf exponent `exponent`.
    Zipf { count: usize, exponent: f64 },
}

impl std::str::FromStr for AdapterSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "none" {
            return Ok(Self::None);
        }
        if let Some(dir) = s.strip_prefix("servegen:") {
            return Ok(Self::ServeGen(dir.into()));
        }
        if let Some(rest) = s.strip_prefix("zipf:") {
            let (n, e) = rest.split_once(':').unwrap_or((rest, "1.0"));
            let count: usize = n
                .parse()
                .map_err(|_| format!("adapters: {s:?}: zipf count must be an integer"))?;
            let exponent: f64 = e
                .parse()
                .map_err(|_| format!("adapters: {s:?}: zipf exponent must be a number"))?;
            if !(1..=10_000).contains(&count) || !(0.0..=10.0).contains(&exponent) {
                return Err(format!(
                    "adapters: {s:?}: count must be 1..10000 and exponent 0..10"
                ));
            }
            return Ok(Self::Zipf { count, exponent });
        }
        Err(format!(
            "adapters: {s:?}: expected none, servegen:DIR or zipf:N[:S]"
        ))
    }
}

/// Per-customer rates by window.
#[derive(Debug, Clone, PartialEq)]
pub struct Popularity {
    pub names: Vec<String>,
    /// `rates[c][w]`: customer `c`'s rate in window `w` (all the same length).
    pub rates: Vec<Vec<f64>>,
}

/// Reads a ServeGen folder ([`crate::servegen`]): one adapter a customer, sorted by chunk
/// number, its rate by window (a customer with fewer windows idles in the rest).
pub fn read_servegen(dir: &Path) -> Result<Popularity, String> {
    let customers = crate::servegen::read_customers(dir).map_err(|e| format!("adapters: {e}"))?;
    let names = customers
        .iter()
        .map(|c| format!("sg-{}", c.chunk))
        .collect();
    let mut rates: Vec<Vec<f64>> = customers
        .iter()
        .map(|c| c.windows.iter().map(|w| w.rate).collect())
        .collect();
    let windows = rates.iter().map(Vec::len).max().unwrap_or(0).max(1);
    for r in &mut rates {
        r.resize(windows, 0.0);
    }
    Ok(Popularity { names, rates })
}

/// Zipf popularity: one window.
pub fn zipf(count: usize, exponent: f64) -> Popularity {
    Popularity {
        names: (1..=count).map(|k| format!("zipf-{k}")).collect(),
        rates: (1..=count)
            .map(|k| vec![1.0 / (k as f64).powf(exponent)])
            .collect(),
    }
}

/// The adapter, tenant and tier of every request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assignment {
    /// Per request: adapter (`None`: base model).
    pub adapters: Vec<Option<String>>,
    pub tenants: Vec<Option<String>>,
    pub tiers: BTreeMap<String, Tier>,
}

impl Assignment {
    pub fn tier_of(&self, tenant: Option<&str>) -> Tier {
        tenant
            .and_then(|t| self.tiers.get(t))
            .copied()
            .unwrap_or_default()
    }
}

/// One adapter of an assignment, as `prewarm-replay assignment` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignedAdapter {
    pub name: String,
    /// The tenant of its first request, and that tenant's tier.
    pub tenant: Option<String>,
    pub tier: Tier,
    /// Requests that use it.
    pub requests: usize,
}

/// What a trace slice was assigned: what a stack serving it must register.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AssignmentSummary {
    pub requests: usize,
    /// Trace seconds from the first request to the last.
    pub span_s: f64,
    /// Distinct users (trace `user`s, else prefix groups).
    pub users: usize,
    /// By name.
    pub adapters: Vec<AssignedAdapter>,
}

impl Assignment {
    /// The adapters of `trace` (the trace this was assigned over).
    pub fn summary(&self, trace: &[TraceRequest]) -> AssignmentSummary {
        let mut adapters: BTreeMap<&str, AssignedAdapter> = BTreeMap::new();
        for (adapter, tenant) in self.adapters.iter().zip(&self.tenants) {
            let Some(name) = adapter else { continue };
            adapters
                .entry(name)
                .or_insert_with(|| AssignedAdapter {
                    name: name.clone(),
                    tenant: tenant.clone(),
                    tier: self.tier_of(tenant.as_deref()),
                    requests: 0,
                })
                .requests += 1;
        }
        let users: std::collections::HashSet<String> =
            trace.iter().map(TraceRequest::user_key).collect();
        AssignmentSummary {
            requests: trace.len(),
            span_s: trace.last().map_or(0.0, TraceRequest::arrival_s)
                - trace.first().map_or(0.0, TraceRequest::arrival_s),
            users: users.len(),
            adapters: adapters.into_values().collect(),
        }
    }
}

/// Assigns adapters; see the module docs.
pub fn assign(
    trace: &[TraceRequest],
    popularity: Option<&Popularity>,
    seed: u64,
    gold_share: f64,
    silver_share: f64,
) -> Assignment {
    let span = trace.last().map_or(1, |r| r.timestamp).max(1) as f64;
    let mut state = seed ^ 0x6164_6170_7465_7273;
    let mut by_group: HashMap<u64, usize> = HashMap::new();
    let mut out = Assignment::default();
    for r in trace {
        let drawn = popularity.and_then(|p| {
            let group = r.hash_ids.first().copied().unwrap_or(0);
            let c = *by_group.entry(group).or_insert_with(|| {
                let windows = p.rates.first().map_or(1, Vec::len).max(1);
                let w = ((r.timestamp as f64 / span) * windows as f64) as usize;
                let w = w.min(windows - 1);
                let mut weights: Vec<f64> = p
                    .rates
                    .iter()
                    .map(|c| c.get(w).copied().unwrap_or(0.0))
                    .collect();
                if weights.iter().sum::<f64>() <= 0.0 {
                    weights = p.rates.iter().map(|c| c.iter().sum()).collect();
                }
                draw(&weights, &mut state)
            });
            p.names.get(c).cloned()
        });
        let adapter = r.adapter.clone().or(drawn);
        let tenant = r.tenant.clone().or_else(|| adapter.clone());
        out.adapters.push(adapter);
        out.tenants.push(tenant);
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in out.tenants.iter().flatten() {
        *counts.entry(t).or_default() += 1;
    }
    let mut ranked: Vec<(&str, usize)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let n = ranked.len() as f64;
    let gold =
        ((gold_share * n).ceil() as usize).max(usize::from(gold_share > 0.0 && !ranked.is_empty()));
    let silver = (silver_share * n).ceil() as usize;
    for (i, (t, _)) in ranked.iter().enumerate() {
        let tier = if i < gold {
            Tier::Gold
        } else if i < gold + silver {
            Tier::Silver
        } else {
            Tier::Bronze
        };
        out.tiers.insert((*t).to_string(), tier);
    }
    out
}

/// An index drawn with probability proportional to `weights`.
fn draw(weights: &[f64], state: &mut u64) -> usize {
    let total: f64 = weights.iter().filter(|w| w.is_finite() && **w > 0.0).sum();
    if total <= 0.0 {
        return 0;
    }
    let u = (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        if w.is_finite() && *w > 0.0 {
            acc += w;
            if u < acc {
                return i;
            }
        }
    }
    weights.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ts: u64, ids: &[u64]) -> TraceRequest {
        TraceRequest::synthetic(ts, ids, 600, 1)
    }

    #[test]
    fn groups_share_an_adapter_and_tiers_follow_share() {
        let trace: Vec<TraceRequest> = (0..400).map(|i| req(i, &[i % 40, 1000 + i])).collect();
        let pop = zipf(5, 1.2);
        let a = assign(&trace, Some(&pop), 7, 0.2, 0.2);
        for i in 0..400 {
            assert_eq!(a.adapters[i], a.adapters[i % 40]);
        }
        let gold: Vec<&String> = a
            .tiers
            .iter()
            .filter(|(_, t)| **t == Tier::Gold)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(gold.len(), 1);
        // the gold tenant is the one with most requests
        let count = |n: &str| a.tenants.iter().filter(|t| t.as_deref() == Some(n)).count();
        assert!(a.tiers.keys().all(|n| count(n) <= count(gold[0])));
        assert_eq!(assign(&trace, Some(&pop), 7, 0.2, 0.2), a);
        let summary = a.summary(&trace);
        assert_eq!((summary.requests, summary.users), (400, 40));
        assert_eq!(
            summary.adapters.iter().map(|x| x.requests).sum::<usize>(),
            400
        );
        for x in &summary.adapters {
            assert_eq!(x.tenant.as_deref(), Some(x.name.as_str()));
            assert_eq!(x.tier, a.tiers[&x.name]);
            assert_eq!(x.requests, count(&x.name));
        }
    }

    #[test]
    fn sources_parse_and_name_the_flag() {
        assert_eq!(
            "zipf:8:1.1".parse(),
            Ok(AdapterSource::Zipf {
                count: 8,
                exponent: 1.1
            })
        );
        assert!("zipf:x"
            .parse::<AdapterSource>()
            .unwrap_err()
            .starts_with("adapters:"));
        assert_eq!("none".parse(), Ok(AdapterSource::None));
    }
}
