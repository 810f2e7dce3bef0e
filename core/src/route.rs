//! Choosing the pod for a request from a [`RoutingTable`]: the filter's rule, kept in core so
//! the evaluator replays exactly what the filter does. A request for a model is placed among
//! the pods the table lists as holding it (every pod when none does), keyed by its prompt's
//! routing key, with bounded load when the table gives a load factor.
//!
//! ## Resident holders first, where no cache is at stake
//!
//! The table marks, of each pod's adapters, those the gateway models as holding a GPU slot
//! (`RoutedPod::resident`, at most one table poll old). [`resident_first`] narrows an adapter's
//! holders to those, as llm-d's LoRA-affinity scorer ranks a pod with the adapter active above
//! one that would have to load it: a holder without it resident makes the request wait for a
//! load (from host memory tens of milliseconds, from disk hundreds) and evicts another
//! adapter (vLLM's LRU over `--max-loras` slots), whose next request pays the same. Only while
//! a resident holder is under the load cap (core's [`load_cap`] over all the holders): when
//! every resident holder is over it, the request is placed among all holders, which also makes
//! the others load the adapter when its demand outgrows the resident ones.
//!
//! The prefix rule applies it only to prompts shorter than a block (`prefix::route_prefix`,
//! step 0), which have no cached prefix to lose. Applied to every prompt placed by rendezvous
//! (measured offline on the shared synthetic trace, 8 pods + 2), it raised adapter hit by
//! 0.003–0.005 and gold adapter hit from 0.9936 to 0.9966 (ServeGen) and 0.9836 to 0.9904
//! (Zipf), but cost 0.004 and 0.017 of token hit and 6–9 ms of TTFT p50: a narrowed pool
//! moves a prompt away from the pod the gateway warmed its prefix on, and again whenever the
//! residency changes, and a lost prefix costs more prefill than a load.

use crate::placement::{clean_load, load_cap, place, place_bounded, PlacementCandidate};
use crate::wire::{RoutedPod, RoutingTable};

/// The pods the table lists as holding `model` (none for the base model or an adapter no pod
/// lists).
pub fn holders<'t>(table: &'t RoutingTable, model: &str) -> Vec<&'t RoutedPod> {
    table
        .pods
        .iter()
        .filter(|p| p.adapters.iter().any(|a| a == model))
        .collect()
}

/// The pods a request for `model` is placed among: those holding it, or all when none does.
pub fn serving_pods<'t>(table: &'t RoutingTable, model: &str) -> Vec<&'t RoutedPod> {
    let holders = holders(table, model);
    if holders.is_empty() {
        table.pods.iter().collect()
    } else {
        holders
    }
}

/// The pods of `pool` (a request for `model`'s [`serving_pods`]) it goes to first: those
/// holding `model` in a GPU slot and under the load cap over the whole pool, when any;
/// otherwise the whole pool (module doc).
pub fn resident_first<'t>(
    pool: Vec<&'t RoutedPod>,
    model: &str,
    load_factor: Option<f64>,
) -> Vec<&'t RoutedPod> {
    let cap = load_factor.map(|f| load_cap(pool.iter().map(|p| clean_load(p.load)), f));
    let first: Vec<&RoutedPod> = pool
        .iter()
        .filter(|p| p.resident.iter().any(|a| a == model))
        .filter(|p| cap.is_none_or(|cap| clean_load(p.load) <= cap))
        .copied()
        .collect();
    if first.is_empty() {
        pool
    } else {
        first
    }
}

/// The pod a request for `model` with routing key `key` goes to, and the pods it was chosen
/// among; `None` for a table without pods.
pub fn route_request<'t>(
    table: &'t RoutingTable,
    model: &str,
    key: u64,
) -> Option<(&'t RoutedPod, Vec<&'t RoutedPod>)> {
    let pool = serving_pods(table, model);
    let primary = pool
        .get(place_among(&pool, key, table.load_factor)?)
        .copied()?;
    Some((primary, pool))
}

/// The index in `pool` of the pod `key` is placed on: bounded-load rendezvous with the
/// table's `load_factor`, plain rendezvous without one; `None` for an empty pool.
pub fn place_among(pool: &[&RoutedPod], key: u64, load_factor: Option<f64>) -> Option<usize> {
    let candidates: Vec<PlacementCandidate<'_>> = pool
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, p.weight))
        .collect();
    match load_factor {
        Some(f) => {
            let loads: Vec<f64> = pool.iter().map(|p| clean_load(p.load)).collect();
            place_bounded(key, &candidates, &loads, f)
        }
        None => place(key, &candidates),
    }
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pod(id: &str, adapters: &[&str], load: Option<f64>) -> RoutedPod {
        RoutedPod {
            load,
            ..RoutedPod::new(id, &format!("{id}:8000"), adapters)
        }
    }

    fn table(pods: Vec<RoutedPod>, load_factor: Option<f64>) -> RoutingTable {
        RoutingTable {
            load_factor,
            ..RoutingTable::of_pods(1, 64, pods)
        }
    }

    #[test]
    fn an_adapter_goes_to_its_holders_and_the_base_model_anywhere() {
        let t = table(
            vec![
                pod("a", &[], None),
                pod("b", &["sql-lora"], None),
                pod("c", &["sql-lora"], None),
                pod("d", &[], None),
            ],
            None,
        );
        let mut seen_base = std::collections::BTreeSet::new();
        for key in 0..200u64 {
            let (p, pool) = route_request(&t, "sql-lora", key).unwrap();
            assert!(p.id == "b" || p.id == "c");
            assert_eq!(pool.len(), 2);
            seen_base.insert(route_request(&t, "base", key).unwrap().0.id.clone());
        }
        assert_eq!(seen_base.len(), 4);
        assert!(route_request(&table(vec![], None), "m", 1).is_none());
    }

    fn resident(mut p: RoutedPod, adapters: &[&str]) -> RoutedPod {
        p.resident = adapters.iter().map(|a| a.to_string()).collect();
        p
    }

    #[test]
    fn a_resident_holder_under_the_cap_comes_before_the_others() {
        let holders = vec![
            pod("a", &["x"], Some(0.2)),
            resident(pod("b", &["x"], Some(0.3)), &["x"]),
            pod("c", &["x"], Some(0.1)),
        ];
        let t = table(holders, Some(1.25));
        let first = resident_first(serving_pods(&t, "x"), "x", t.load_factor);
        assert_eq!(
            first.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        // The base model and an adapter resident nowhere keep the whole pool.
        assert_eq!(
            resident_first(serving_pods(&t, "m"), "m", t.load_factor).len(),
            3
        );
        let none = table(vec![pod("a", &["x"], None), pod("b", &["x"], None)], None);
        assert_eq!(resident_first(serving_pods(&none, "x"), "x", None).len(), 2);
    }

    #[test]
    fn resident_holders_all_over_the_cap_give_way_to_every_holder() {
        let t = table(
            vec![
                resident(pod("a", &["x"], Some(0.95)), &["x"]),
                pod("b", &["x"], Some(0.1)),
                pod("c", &["x"], Some(0.1)),
            ],
            Some(1.25),
        );
        // Mean 0.383, cap max(0.479, 0.5) = 0.5: the resident holder is over it.
        assert_eq!(
            resident_first(serving_pods(&t, "x"), "x", t.load_factor).len(),
            3
        );
        // Without a load factor nothing is over a cap.
        assert_eq!(resident_first(serving_pods(&t, "x"), "x", None).len(), 1);
    }

    #[test]
    fn bounded_load_avoids_a_hot_pod() {
        let free = table(
            vec![pod("a", &[], Some(0.1)), pod("b", &[], Some(0.1))],
            Some(1.25),
        );
        for key in 0..100u64 {
            let best = route_request(&free, "m", key).unwrap().0.id.clone();
            let mut pods = vec![pod("a", &[], Some(0.1)), pod("b", &[], Some(0.1))];
            for p in &mut pods {
                if p.id == best {
                    p.load = Some(0.9);
                }
            }
            let busy = table(pods, Some(1.25));
            assert_ne!(route_request(&busy, "m", key).unwrap().0.id, best);
        }
    }
}
