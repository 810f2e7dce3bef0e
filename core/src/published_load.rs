//! What a routing table publishes of a pod's load and queue wait, and when a new measurement is
//! worth a new table: loads and waits are published with hysteresis, so a table whose only
//! change is measurement noise keeps its generation (the filters' poll costs a `304`).
//!
//! ## What reads the load, and what a change within the step can flip
//!
//! The load is a pod's busy share of the last minute: the share of `n` health checks that found
//! a request on it (60 at the default one check a second). The filters read it three ways:
//!
//! 1. **The load cap** (`placement::load_cap`: `load_factor` × the pool's mean load, never below
//!    `LOAD_FLOOR`): whether a holder keeps a request without a price (`prefix::route_prefix`,
//!    step 3), bounded-load rendezvous (step 4), resident holders first (`route::resident_first`).
//!    A pod is full or not: a side of the cap. **No change within the step flips it**: a pod
//!    whose measured load is on the other side of its pool's cap than its published one is
//!    republished at once, whatever the step ([`cap_crossings`], checked against the cap of
//!    every pool the pod is in: the whole table, which is the pool of the base model and of an
//!    adapter no pod lists, and the holders of each adapter it lists, with the caps the
//!    filters compute from the published loads).
//! 2. **The price of a move onto a pod** (`prefix::move_cost`): the matched prefill ÷ (1 − ρ),
//!    ρ at most `MAX_BUSY`. A load change within the step moves that factor, so it can flip a
//!    stay-or-move decision — only for a request whose holder's wait is within that change of
//!    the price, where staying and moving cost nearly the same by the rule's own accounting.
//!    The step is one standard error of the busy share as an estimate of ρ from `n` checks
//!    (`√(ρ(1−ρ)/n)`, ρ the midpoint of the published and the measured share): a change
//!    smaller than that is what sampling `n` checks does to an unchanged ρ, so publishing it
//!    would feed the price noise, not news. (Consecutive checks are correlated — a pod busy at
//!    one check is likely busy at the next — so the true noise is larger and this step is on
//!    the side of publishing too often.) At the default 60 checks it is ±0.065 at ρ = ½,
//!    ±0.039 at 0.9, and 0 at an idle or always-busy pod, where any change is news.
//! 3. **The least loaded pod** when every pod of a pool is over its cap (`place_bounded`'s
//!    fallback): unreachable, since the cap is at least the pool's mean and some pod is at
//!    most the mean.
//!
//! The published figure is the measured one when it is republished (rounded by the gateway to
//! its `load_step`), so a pod's published load is never further than the step from the truth
//! unless the gateway stopped measuring it.
//!
//! ## The wait
//!
//! `wait_ms` enters the stay-or-move rule and step 4's shortest wait as an addend: an error of
//! `e` ms flips a decision only where the two choices differ by less than `e`, and the flip
//! costs the request at most `e`. A wait is republished when it moved by at least
//! [`WAIT_STEP_MS`] or [`WAIT_TOLERANCE`] of the published wait, whichever is more: a flip
//! within the step costs at most a tenth of the wait acted on, and short waits keep the 100 ms
//! resolution they had.

use std::collections::BTreeMap;

use crate::placement::{clean_load, load_cap};
use crate::wire::RoutedPod;

/// Published waits move in multiples of this, ms, at least (a 512-token shard's prefill at the
/// gateway's default price is 128 ms).
pub const WAIT_STEP_MS: u64 = 100;

/// The share of a published wait it may drift by before it is republished (module doc).
pub const WAIT_TOLERANCE: f64 = 0.1;

/// Rounds of republishing the pods that cross a cap, at most: a republished load moves the caps
/// a little, which may make another pod cross. Each round republishes only pods whose published
/// load differs from the measured one, so it ends when none is left; the bound keeps the cost
/// fixed when caps keep moving.
pub const MAX_CROSSING_ROUNDS: usize = 8;

/// Whether a busy share measured as `measured` from `samples` checks is within the step of the
/// `published` one (module doc: one standard error at the midpoint). Non-finite figures, or no
/// samples, are within the step only when equal.
pub fn load_within_step(published: f64, measured: f64, samples: u64) -> bool {
    if published == measured {
        return true;
    }
    if samples == 0 || !published.is_finite() || !measured.is_finite() {
        return false;
    }
    let mid = ((published + measured) / 2.0).clamp(0.0, 1.0);
    let standard_error = (mid * (1.0 - mid) / samples as f64).sqrt();
    (measured - published).abs() <= standard_error
}

/// Whether a wait measured as `measured` ms is within the step of the `published` one: it moved
/// by less than [`WAIT_STEP_MS`] and less than [`WAIT_TOLERANCE`] of `published`.
pub fn wait_within_step(published: u64, measured: u64) -> bool {
    let moved = published.abs_diff(measured);
    let relative = (published as f64 * WAIT_TOLERANCE) as u64;
    moved < WAIT_STEP_MS.max(relative)
}

/// The pools whose caps the filters compute: every pod, then each adapter's holders (indices
/// into `pods`).
fn pools(pods: &[RoutedPod]) -> Vec<Vec<usize>> {
    let mut by_adapter: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, p) in pods.iter().enumerate() {
        for a in &p.adapters {
            let holders = by_adapter.entry(a.as_str()).or_default();
            // a pod listing an adapter twice is one holder
            if holders.last() != Some(&i) {
                holders.push(i);
            }
        }
    }
    let mut out = Vec::with_capacity(by_adapter.len().saturating_add(1));
    out.push((0..pods.len()).collect());
    out.extend(by_adapter.into_values());
    out
}

/// The pods (indices, ascending) whose published load is on one side of a cap of a pool they are
/// in and whose `measured` load (`measured[i]` for `pods[i]`; missing ones count as 0, as the
/// filters count them) is on the other. Without a `load_factor` there is no cap and none.
pub fn cap_crossings(
    pods: &[RoutedPod],
    measured: &[Option<f64>],
    load_factor: Option<f64>,
) -> Vec<usize> {
    let Some(factor) = load_factor else {
        return Vec::new();
    };
    let differs = |i: usize| {
        pods.get(i)
            .is_some_and(|p| clean_load(p.load) != clean_load(measured.get(i).copied().flatten()))
    };
    if !(0..pods.len()).any(differs) {
        return Vec::new();
    }
    let mut crossing = vec![false; pods.len()];
    for pool in pools(pods) {
        let loads = pool
            .iter()
            .filter_map(|&i| pods.get(i))
            .map(|p| clean_load(p.load));
        let cap = load_cap(loads, factor);
        for &i in &pool {
            let (Some(p), Some(flag)) = (pods.get(i), crossing.get_mut(i)) else {
                continue;
            };
            let published_full = clean_load(p.load) > cap;
            let measured_full = clean_load(measured.get(i).copied().flatten()) > cap;
            *flag |= published_full != measured_full;
        }
    }
    crossing
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.then_some(i))
        .collect()
}

/// Republishes (sets to `measured[i]`) every pod that crosses a cap ([`cap_crossings`]), round
/// after round while the caps move, at most [`MAX_CROSSING_ROUNDS`]; returns how many loads it
/// set.
pub fn settle_crossings(
    pods: &mut [RoutedPod],
    measured: &[Option<f64>],
    load_factor: Option<f64>,
) -> usize {
    let mut set = 0usize;
    for _ in 0..MAX_CROSSING_ROUNDS {
        let crossing = cap_crossings(pods, measured, load_factor);
        if crossing.is_empty() {
            break;
        }
        for i in crossing {
            if let (Some(p), Some(m)) = (pods.get_mut(i), measured.get(i)) {
                p.load = *m;
                set = set.saturating_add(1);
            }
        }
    }
    set
}

#[cfg(test)]
mod tests;
