//! Placement: a deterministic, weighted rendezvous (highest random weight) choice of pods for a
//! key, and a bounded-load variant.
//!
//! Each candidate's score for a key is `−weight / ln(u)`, where `u ∈ (0, 1)` is drawn from
//! XXH3 of the pod id seeded by the key. The highest score wins. With equal weights this is
//! plain rendezvous hashing; with weights, a pod wins a share of keys proportional to its weight.
//! When a pod joins, only the keys it now wins move, and they move to it: those are exactly the
//! prefixes its warm-up must prefill.
//!
//! The logarithm is computed here with basic IEEE-754 operations only (which every platform
//! rounds identically), not with the platform's `ln`, so scores and therefore choices are the
//! same in the wasm filter and the native gateway. Ties are broken by pod id.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A pod that can receive a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlacementCandidate<'a> {
    pub id: &'a str,
    /// Relative capacity (> 0; others never win).
    pub weight: f64,
}

impl<'a> PlacementCandidate<'a> {
    pub fn new(id: &'a str, weight: f64) -> Self {
        Self { id, weight }
    }
}

const LN_2: f64 = std::f64::consts::LN_2;

/// Natural logarithm of `x` in (0, 1], from basic operations only: `x = m·2^e` with `m` in
/// [1, 2), `ln m = 2·atanh((m−1)/(m+1))` by its series (|z| ≤ 1/3, 24 terms: below 1e-17).
fn portable_ln(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return f64::NEG_INFINITY;
    }
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64;
    if exp == 0 {
        // subnormal: never produced by unit_interval
        return f64::NEG_INFINITY;
    }
    let e = exp - 1023;
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let mut term = z;
    let mut sum = 0.0;
    let mut k = 1.0;
    for _ in 0..24 {
        sum += term / k;
        term *= z2;
        k += 2.0;
    }
    (e as f64) * LN_2 + 2.0 * sum
}

/// A uniform value in (0, 1) from a hash: the top 53 bits, centred in their interval.
pub(crate) fn unit_interval(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// An item's draw in a weighted roulette without replacement: `−w / ln u` with `u` the
/// uniform value of the hash `h`. Ordering items by it, highest first, draws each next item
/// with probability its weight over the remaining items' total (Efraimidis & Spirakis 2006),
/// which is why the highest draw over pods is a weighted rendezvous placement. Non-positive or
/// non-finite weights draw −∞.
pub fn weighted_draw(h: u64, weight: f64) -> f64 {
    if !(weight > 0.0 && weight.is_finite()) {
        return f64::NEG_INFINITY;
    }
    -weight / portable_ln(unit_interval(h))
}

/// The rendezvous score of `candidate` for `key`; higher wins. Non-positive or non-finite
/// weights score −∞.
pub fn score(key: u64, candidate: &PlacementCandidate<'_>) -> f64 {
    weighted_draw(
        xxh3_64_with_seed(candidate.id.as_bytes(), key),
        candidate.weight,
    )
}

/// Candidates' indices from best to worst for `key` (candidates that can never win excluded).
pub fn rank(key: u64, candidates: &[PlacementCandidate<'_>]) -> Vec<usize> {
    let mut scored: Vec<(f64, &str, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (score(key, c), c.id, i))
        .filter(|(s, _, _)| *s > f64::NEG_INFINITY)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().map(|(_, _, i)| i).collect()
}

/// The best candidate for `key`.
pub fn place(key: u64, candidates: &[PlacementCandidate<'_>]) -> Option<usize> {
    let mut best: Option<(f64, &str, usize)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let s = score(key, c);
        if s == f64::NEG_INFINITY {
            continue;
        }
        let better = match best {
            None => true,
            Some((bs, bid, _)) => s > bs || (s == bs && c.id < bid),
        };
        if better {
            best = Some((s, c.id, i));
        }
    }
    best.map(|(_, _, i)| i)
}

/// A load as bounded-load placement counts it: missing, negative or non-finite loads are 0.
pub fn clean_load(load: Option<f64>) -> f64 {
    load.filter(|l| l.is_finite() && *l >= 0.0).unwrap_or(0.0)
}

/// The candidates in the order an adapter is placed on them: rendezvous over its name's chain
/// seed (`fingerprint::chain_seed`), the key the gateway places adapters by and the filter pins
/// them by.
pub fn adapter_order(adapter: &str, candidates: &[PlacementCandidate<'_>]) -> Vec<usize> {
    rank(crate::fingerprint::chain_seed(adapter), candidates)
}

/// The bounded-load cap: `factor` (at least 1) times the mean of `loads` (0 when empty), and
/// never below [`LOAD_FLOOR`].
pub fn load_cap(loads: impl Iterator<Item = f64>, factor: f64) -> f64 {
    let (sum, n) = loads.fold((0.0, 0u32), |(s, n), l| (s + l, n.saturating_add(1)));
    let mean = if n == 0 { 0.0 } else { sum / f64::from(n) };
    (mean * factor.max(1.0)).max(LOAD_FLOOR)
}

/// The load (utilisation, in [0, 1]) under which a pod is never full: at half its capacity a
/// request waits on average as long as its own service takes (an M/M/1 queue's wait is
/// ρ ÷ (1 − ρ) service times), so below it keeping a request where its cache is beats
/// spreading it.
pub const LOAD_FLOOR: f64 = 0.5;

/// Bounded-load placement: the best-ranked candidate whose load is at most `factor` times the
/// mean load of the candidates (`loads[i]` is candidate `i`'s load; missing loads count as 0).
/// Falls back to the least-loaded candidate when every one is over the bound.
pub fn place_bounded(
    key: u64,
    candidates: &[PlacementCandidate<'_>],
    loads: &[f64],
    factor: f64,
) -> Option<usize> {
    let load = |i: usize| clean_load(loads.get(i).copied());
    let order = rank(key, candidates);
    if order.is_empty() {
        return None;
    }
    let bound = load_cap(order.iter().map(|&i| load(i)), factor);
    order
        .iter()
        .copied()
        .find(|&i| load(i) <= bound)
        .or_else(|| {
            order
                .iter()
                .copied()
                .min_by(|&a, &b| load(a).total_cmp(&load(b)))
        })
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pods(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pod-{i}")).collect()
    }

    fn cands(ids: &[String]) -> Vec<PlacementCandidate<'_>> {
        ids.iter()
            .map(|id| PlacementCandidate::new(id, 1.0))
            .collect()
    }

    #[test]
    fn portable_ln_matches_the_platform_closely() {
        for x in [1e-15, 1e-6, 0.001, 0.1, 0.3, 0.5, 0.75, 0.999_999, 1.0] {
            assert!((portable_ln(x) - x.ln()).abs() < 1e-12, "{x}");
        }
    }

    #[test]
    fn place_agrees_with_rank_and_skips_bad_weights() {
        let ids = pods(7);
        let mut c = cands(&ids);
        c[3].weight = 0.0;
        c[4].weight = f64::NAN;
        for key in 0..500u64 {
            let r = rank(key, &c);
            assert_eq!(place(key, &c), r.first().copied());
            assert!(!r.contains(&3) && !r.contains(&4));
        }
        assert_eq!(place(1, &[]), None);
    }

    #[test]
    fn weights_shift_shares() {
        let ids = pods(2);
        let c = vec![
            PlacementCandidate::new(&ids[0], 3.0),
            PlacementCandidate::new(&ids[1], 1.0),
        ];
        let wins = (0..20_000u64).filter(|k| place(*k, &c) == Some(0)).count();
        let share = wins as f64 / 20_000.0;
        assert!((share - 0.75).abs() < 0.02, "share {share}");
    }

    #[test]
    fn bounded_load_skips_overloaded_pods() {
        let ids = pods(4);
        let c = cands(&ids);
        for key in 0..200u64 {
            let best = place(key, &c).unwrap();
            let mut loads = vec![0.1; 4];
            loads[best] = 0.9; // mean 0.3, bound 1.25·0.3 = 0.375
            let chosen = place_bounded(key, &c, &loads, 1.25).unwrap();
            assert_ne!(chosen, best);
            assert_eq!(chosen, rank(key, &c)[1]);
            assert_eq!(place_bounded(key, &c, &[0.2; 4], 1.25), Some(best));
        }
    }

    #[test]
    fn a_pod_under_the_floor_is_never_full() {
        let ids = pods(4);
        let c = cands(&ids);
        for key in 0..200u64 {
            let best = place(key, &c).unwrap();
            // far above 1.25 × the mean (0.1), but at most half busy: it keeps its keys
            let mut loads = vec![0.0; 4];
            loads[best] = LOAD_FLOOR;
            assert_eq!(place_bounded(key, &c, &loads, 1.25), Some(best));
            loads[best] = LOAD_FLOOR + 0.05;
            assert_ne!(place_bounded(key, &c, &loads, 1.25), Some(best));
        }
    }

    proptest! {
        /// A joining pod takes only the keys it now wins, about 1/(n+1) of them.
        #[test]
        fn a_joining_pod_moves_only_its_keys(n in 2usize..12, base in any::<u64>()) {
            let before_ids = pods(n);
            let after_ids = pods(n + 1);
            let before = cands(&before_ids);
            let after = cands(&after_ids);
            let keys = 4000u64;
            let mut moved = 0u64;
            for k in 0..keys {
                let key = base.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let b = place(key, &before).unwrap();
                let a = place(key, &after).unwrap();
                if a != b {
                    prop_assert_eq!(a, n, "a key moved to an old pod");
                    moved += 1;
                }
            }
            let share = moved as f64 / keys as f64;
            let want = 1.0 / (n as f64 + 1.0);
            prop_assert!((share - want).abs() < 0.05, "moved {share} want {want}");
        }
    }
}
