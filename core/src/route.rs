//! Choosing the pod for a request from a [`RoutingTable`]: the filter's rule, kept in core so
//! the evaluator replays exactly what the filter does. A request for a model is placed among
//! the pods the table lists as holding it (every pod when none does), keyed by its prompt's
//! routing key, with bounded load when the table gives a load factor.

use crate::placement::{place, place_bounded, PlacementCandidate};
use crate::wire::{RoutedPod, RoutingTable};

/// The pods a request for `model` is placed among: those holding it, or all when none does.
pub fn serving_pods<'t>(table: &'t RoutingTable, model: &str) -> Vec<&'t RoutedPod> {
    let holders: Vec<&RoutedPod> = table
        .pods
        .iter()
        .filter(|p| p.adapters.iter().any(|a| a == model))
        .collect();
    if holders.is_empty() {
        table.pods.iter().collect()
    } else {
        holders
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
    let candidates: Vec<PlacementCandidate<'_>> = pool
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, p.weight))
        .collect();
    let chosen = match table.load_factor {
        Some(factor) => {
            let loads: Vec<f64> = pool.iter().map(|p| p.load.unwrap_or(0.0)).collect();
            place_bounded(key, &candidates, &loads, factor)
        }
        None => place(key, &candidates),
    }?;
    let primary = pool.get(chosen).copied()?;
    Some((primary, pool))
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use crate::wire::WIRE_VERSION;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pod(id: &str, adapters: &[&str], load: Option<f64>) -> RoutedPod {
        RoutedPod {
            id: id.into(),
            address: format!("{id}:8000"),
            weight: 1.0,
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            load,
        }
    }

    fn table(pods: Vec<RoutedPod>, load_factor: Option<f64>) -> RoutingTable {
        RoutingTable {
            version: WIRE_VERSION.into(),
            generation: 1,
            generated_at_ms: 0,
            block_tokens: 64,
            load_factor,
            prefixes: Vec::new(),
            pods,
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
