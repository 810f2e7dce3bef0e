//! Routing tables delivered as deltas: what changed from one generation of a [`RoutingTable`] to
//! a later one ([`TableDelta`]), made by [`diff`] on the gateway and applied by [`apply`] in the
//! filter, with `apply(&diff(a, b)?, a) == b` for every pair of tables a gateway builds (their
//! pods sorted by id, each id once).
//!
//! A filter asks `GET /v1/routing?since=G` with the generation `G` it holds; the gateway answers
//! a delta whose `base` is `G` when it still has that generation, else the whole table
//! ([`TableUpdate`] tells them apart: a delta has a `base`). A delta applies onto exactly its
//! base — the generation and its build time (`base_generated_at_ms`: a gateway restarted from a
//! snapshot older than its last table numbers some generations again) — and a filter holding
//! anything else refetches the whole table.
//!
//! What a delta carries:
//! - `removed`: ids of pods that left the table;
//! - `upserted`: pods added, or changed in anything but their load and wait (whole entries);
//! - `loads`: pods whose only change is their published load or wait (`{id, load, wait_ms}`,
//!   an absent figure meaning none) — the common change, kept small;
//! - `prefixes`: the placed prefixes when they changed, each either the index of one in the
//!   base's list (a number) or a new one (an object), in the new order;
//! - `warming`: the warming pods when they changed (whole; an experiment's, rare);
//! - `settings`: block size, load factor, prefill price and experiment when any changed.
//!
//! The lists of pods are sorted by id, so applying one is a merge: no hashing of ids, and a
//! delta whose lists are out of order, name an id twice, remove a pod the base does not have or
//! patch one the result lacks is refused ([`DeltaError::Malformed`]), as is a result that is not
//! a valid table. Every list is bounded by the table's own bounds.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::experiment::Experiment;
use crate::wire::{
    decode_versioned, PlacedPrefix, RoutedPod, RoutingTable, WireError, MAX_TABLE_PODS,
    MAX_TABLE_PREFIXES,
};

/// What changed from generation `base` of a routing table to generation `generation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableDelta {
    pub version: String,
    /// The only generation this delta applies onto.
    pub base: u64,
    /// That generation's build time (its `generated_at_ms`): a gateway restarted from an older
    /// snapshot publishes some generation numbers again, with other content and another build
    /// time, so the number alone does not name the base.
    #[serde(default)]
    pub base_generated_at_ms: u64,
    /// The generation the result has.
    pub generation: u64,
    #[serde(default)]
    pub generated_at_ms: u64,
    /// The table's settings, when any of them changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<TableSettings>,
    /// Ids of the pods that left, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Pods that joined or changed in more than their load and wait, sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upserted: Vec<RoutedPod>,
    /// Pods whose only change is their load or wait, sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loads: Vec<PodLoad>,
    /// The placed prefixes in their new order, when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefixes: Option<Vec<PrefixItem>>,
    /// The warming pods, when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warming: Option<Vec<RoutedPod>>,
}

/// The table's fields besides its pods, prefixes and generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSettings {
    pub block_tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_us_per_token: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<Experiment>,
}

/// A pod's new load and wait (absent: none published).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodLoad {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// One placed prefix of the new list: the base's `n`th, or a new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PrefixItem {
    Kept(u32),
    New(PlacedPrefix),
}

/// Why a delta was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// The delta is for another generation (or another build of it) than the table it was
    /// offered.
    #[error("base: {base}: the table held is generation {held} (or another build of it)")]
    WrongBase { base: u64, held: u64 },
    /// The delta does not fit its base, or breaks a bound.
    #[error("{0}")]
    Malformed(String),
}

/// What `GET /v1/routing` answers: the whole table, or a delta from the generation asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum TableUpdate {
    Whole(RoutingTable),
    Delta(TableDelta),
}

/// Only whether a document has a `base` (a delta) or not (a whole table).
#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    base: Option<serde::de::IgnoredAny>,
}

impl TableUpdate {
    /// Decodes a `GET /v1/routing` body: a delta when it has a `base`, else a whole table
    /// (checked as [`RoutingTable::decode`] checks it).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let kind: Kind = serde_json::from_slice(bytes)
            .map_err(|e| WireError::Malformed(format!("body: {e}")))?;
        if kind.base.is_some() {
            TableDelta::decode(bytes).map(Self::Delta)
        } else {
            RoutingTable::decode(bytes).map(Self::Whole)
        }
    }
}

impl TableDelta {
    /// Decodes and checks the version (the bounds are checked by [`apply`]).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        decode_versioned(bytes, "delta", |d: &Self| &d.version)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Whether it changes nothing but the generation and build time.
    pub fn is_empty(&self) -> bool {
        self.settings.is_none()
            && self.removed.is_empty()
            && self.upserted.is_empty()
            && self.loads.is_empty()
            && self.prefixes.is_none()
            && self.warming.is_none()
    }
}

/// Whether `pods` are sorted by id with every id once (the gateway's tables are).
fn sorted_by_id<T>(items: &[T], id: impl Fn(&T) -> &str) -> bool {
    items
        .windows(2)
        .all(|w| matches!(w, [a, b] if id(a) < id(b)))
}

fn settings_of(t: &RoutingTable) -> TableSettings {
    TableSettings {
        block_tokens: t.block_tokens,
        load_factor: t.load_factor,
        prefill_us_per_token: t.prefill_us_per_token,
        experiment: t.experiment.clone(),
    }
}

/// Whether `a` and `b` differ in nothing but their load and wait.
fn same_but_load(a: &RoutedPod, b: &RoutedPod) -> bool {
    a.id == b.id
        && a.address == b.address
        && a.weight == b.weight
        && a.adapters == b.adapters
        && a.resident == b.resident
}

/// The delta from `from` to `to`; `None` when either table's pods are not sorted by id with
/// every id once (serve the whole table then).
pub fn diff(from: &RoutingTable, to: &RoutingTable) -> Option<TableDelta> {
    if !sorted_by_id(&from.pods, |p| &p.id) || !sorted_by_id(&to.pods, |p| &p.id) {
        return None;
    }
    let mut delta = TableDelta {
        version: to.version.clone(),
        base: from.generation,
        base_generated_at_ms: from.generated_at_ms,
        generation: to.generation,
        generated_at_ms: to.generated_at_ms,
        settings: None,
        removed: Vec::new(),
        upserted: Vec::new(),
        loads: Vec::new(),
        prefixes: None,
        warming: None,
    };
    let settings = settings_of(to);
    if settings_of(from) != settings {
        delta.settings = Some(settings);
    }
    let mut old = from.pods.iter().peekable();
    for new in &to.pods {
        while let Some(gone) = old.next_if(|o| o.id < new.id) {
            delta.removed.push(gone.id.clone());
        }
        match old.next_if(|o| o.id == new.id) {
            Some(o) if o == new => {}
            Some(o) if same_but_load(o, new) => delta.loads.push(PodLoad {
                id: new.id.clone(),
                load: new.load,
                wait_ms: new.wait_ms,
            }),
            _ => delta.upserted.push(new.clone()),
        }
    }
    delta.removed.extend(old.map(|o| o.id.clone()));
    if from.prefixes != to.prefixes {
        let mut at: HashMap<&PlacedPrefix, u32> = HashMap::with_capacity(from.prefixes.len());
        for (i, p) in from.prefixes.iter().enumerate() {
            if let Ok(i) = u32::try_from(i) {
                at.entry(p).or_insert(i);
            }
        }
        let items = to.prefixes.iter().map(|p| match at.get(p) {
            Some(&i) => PrefixItem::Kept(i),
            None => PrefixItem::New(p.clone()),
        });
        delta.prefixes = Some(items.collect());
    }
    if from.warming != to.warming {
        delta.warming = Some(to.warming.clone());
    }
    Some(delta)
}

fn malformed(what: impl Into<String>) -> DeltaError {
    DeltaError::Malformed(what.into())
}

/// Checks the delta's own bounds and order.
fn check(delta: &TableDelta) -> Result<(), DeltaError> {
    let bounded = |field: &str, n: usize, max: usize| {
        if n > max {
            Err(malformed(format!("{field}: {n} entries: at most {max}")))
        } else {
            Ok(())
        }
    };
    bounded("removed", delta.removed.len(), MAX_TABLE_PODS)?;
    bounded("upserted", delta.upserted.len(), MAX_TABLE_PODS)?;
    bounded("loads", delta.loads.len(), MAX_TABLE_PODS)?;
    let prefixes = delta.prefixes.as_ref().map_or(0, Vec::len);
    bounded("prefixes", prefixes, MAX_TABLE_PREFIXES)?;
    let warming = delta.warming.as_ref().map_or(0, Vec::len);
    bounded("warming", warming, MAX_TABLE_PODS)?;
    if delta.generation <= delta.base {
        return Err(malformed(format!(
            "generation: {}: must be after the base {}",
            delta.generation, delta.base
        )));
    }
    if !sorted_by_id(&delta.removed, |id| id) {
        return Err(malformed("removed: must be sorted, each id once"));
    }
    if !sorted_by_id(&delta.upserted, |p| &p.id) {
        return Err(malformed("upserted: must be sorted by id, each id once"));
    }
    if !sorted_by_id(&delta.loads, |p| &p.id) {
        return Err(malformed("loads: must be sorted by id, each id once"));
    }
    Ok(())
}

/// The pods of `base` with `delta`'s removals and upserts merged in (both sorted by id).
fn merged_pods(base: &[RoutedPod], delta: &TableDelta) -> Result<Vec<RoutedPod>, DeltaError> {
    let mut removed = delta.removed.iter().peekable();
    let mut upserted = delta.upserted.iter().peekable();
    let mut pods = Vec::with_capacity(
        base.len()
            .saturating_add(delta.upserted.len())
            .min(MAX_TABLE_PODS),
    );
    for old in base {
        while let Some(new) = upserted.next_if(|u| u.id < old.id) {
            pods.push(new.clone());
        }
        if removed.next_if(|r| **r == old.id).is_some() {
            if upserted.peek().is_some_and(|u| u.id == old.id) {
                return Err(malformed(format!("upserted: {:?}: also removed", old.id)));
            }
            continue;
        }
        if let Some(r) = removed.peek().filter(|r| r.as_str() < old.id.as_str()) {
            return Err(malformed(format!("removed: {r:?}: not a pod of the base")));
        }
        match upserted.next_if(|u| u.id == old.id) {
            Some(new) => pods.push(new.clone()),
            None => pods.push(old.clone()),
        }
    }
    if let Some(r) = removed.next() {
        return Err(malformed(format!("removed: {r:?}: not a pod of the base")));
    }
    pods.extend(upserted.cloned());
    if pods.len() > MAX_TABLE_PODS {
        return Err(malformed(format!(
            "pods: {} pods: at most {MAX_TABLE_PODS}",
            pods.len()
        )));
    }
    Ok(pods)
}

/// `base` with `delta` applied: the table of generation `delta.generation`. Refused when the
/// base is another generation ([`DeltaError::WrongBase`]) or the delta does not fit it or
/// breaks a bound, or its result is not a valid table ([`DeltaError::Malformed`]); `base` is
/// left as it was either way.
pub fn apply(delta: &TableDelta, base: &RoutingTable) -> Result<RoutingTable, DeltaError> {
    if base.generation != delta.base || base.generated_at_ms != delta.base_generated_at_ms {
        return Err(DeltaError::WrongBase {
            base: delta.base,
            held: base.generation,
        });
    }
    check(delta)?;
    if !sorted_by_id(&base.pods, |p| &p.id) {
        return Err(malformed("base: pods not sorted by id"));
    }
    let mut pods = merged_pods(&base.pods, delta)?;
    // both sorted by id: one pass
    let mut at = 0usize;
    for patch in &delta.loads {
        let offset = pods
            .get(at..)
            .and_then(|rest| rest.iter().position(|p| p.id >= patch.id))
            .map(|i| at.saturating_add(i));
        match offset.and_then(|i| pods.get_mut(i).map(|p| (i, p))) {
            Some((i, pod)) if pod.id == patch.id => {
                pod.load = patch.load;
                pod.wait_ms = patch.wait_ms;
                at = i;
            }
            _ => {
                return Err(malformed(format!(
                    "loads: {:?}: not a pod of the table",
                    patch.id
                )))
            }
        }
    }
    let prefixes = match &delta.prefixes {
        None => base.prefixes.clone(),
        Some(items) => items
            .iter()
            .map(|item| match item {
                PrefixItem::New(p) => Ok(p.clone()),
                PrefixItem::Kept(i) => usize::try_from(*i)
                    .ok()
                    .and_then(|i| base.prefixes.get(i))
                    .cloned()
                    .ok_or_else(|| malformed(format!("prefixes: {i}: not a prefix of the base"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let settings = delta.settings.clone().unwrap_or_else(|| settings_of(base));
    let table = RoutingTable {
        version: delta.version.clone(),
        generation: delta.generation,
        generated_at_ms: delta.generated_at_ms,
        block_tokens: settings.block_tokens,
        load_factor: settings.load_factor,
        prefill_us_per_token: settings.prefill_us_per_token,
        pods,
        prefixes,
        warming: delta
            .warming
            .clone()
            .unwrap_or_else(|| base.warming.clone()),
        experiment: settings.experiment,
    };
    match table.problem() {
        Some(p) => Err(malformed(p)),
        None => Ok(table),
    }
}

#[cfg(test)]
mod tests;
