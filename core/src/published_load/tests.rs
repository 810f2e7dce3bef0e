// Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
use super::*;
use proptest::prelude::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn pod(id: &str, adapters: &[&str], load: f64) -> RoutedPod {
    RoutedPod {
        load: Some(load),
        ..RoutedPod::new(id, &format!("{id}:80"), adapters)
    }
}

#[test]
fn the_load_step_is_one_standard_error_of_the_share() {
    // at ρ ≈ ½ over 60 checks the standard error is ≈ 0.065
    assert!(load_within_step(0.5, 0.55, 60));
    assert!(load_within_step(0.55, 0.5, 60));
    assert!(!load_within_step(0.5, 0.6, 60));
    // fewer checks, more noise
    assert!(load_within_step(0.5, 0.6, 20));
    // near the ends it narrows: 0.9 → 0.95 is news, an idle pod's first busy check too
    assert!(!load_within_step(0.9, 0.95, 60));
    assert!(!load_within_step(0.0, 1.0 / 60.0, 60));
    assert!(!load_within_step(1.0, 59.0 / 60.0, 60));
    assert!(load_within_step(0.3, 0.3, 0));
    assert!(!load_within_step(0.3, 0.31, 0));
    assert!(!load_within_step(0.3, f64::NAN, 60));
}

#[test]
fn the_wait_step_is_100_ms_or_a_tenth() {
    assert!(!wait_within_step(0, 100));
    assert!(wait_within_step(1_000, 1_000));
    assert!(!wait_within_step(1_000, 1_100));
    assert!(wait_within_step(5_000, 5_400));
    assert!(wait_within_step(5_400, 5_000));
    assert!(!wait_within_step(5_000, 5_500));
    assert!(!wait_within_step(u64::MAX, 0));
}

#[test]
fn a_pod_crossing_the_whole_tables_cap_is_republished() {
    // mean 0.225: the cap is the floor, 0.5; pod a is full
    let pods = vec![
        pod("a", &[], 0.6),
        pod("b", &[], 0.1),
        pod("c", &[], 0.1),
        pod("d", &[], 0.1),
    ];
    let same = [Some(0.55), Some(0.12), Some(0.08), Some(0.1)];
    assert_eq!(cap_crossings(&pods, &same, Some(1.25)), Vec::<usize>::new());
    let under = [Some(0.45), Some(0.1), Some(0.1), Some(0.1)];
    assert_eq!(cap_crossings(&pods, &under, Some(1.25)), vec![0]);
    assert_eq!(cap_crossings(&pods, &under, None), Vec::<usize>::new());
    // a missing measurement counts as 0, as the filters count a missing load
    let missing = [None, Some(0.1), Some(0.1), Some(0.1)];
    assert_eq!(cap_crossings(&pods, &missing, Some(1.25)), vec![0]);
}

#[test]
fn an_adapters_holders_have_their_own_cap() {
    // whole table: mean 0.35, cap 0.5: a and b are full there either way; among x's holders
    // the mean is 0.7 and the cap 0.875: a at 0.9 becomes full for x's requests only
    let pods = vec![
        pod("a", &["x"], 0.7),
        pod("b", &["x"], 0.7),
        pod("c", &[], 0.0),
        pod("d", &[], 0.0),
    ];
    let measured = [Some(0.9), Some(0.7), Some(0.0), Some(0.0)];
    assert_eq!(cap_crossings(&pods, &measured, Some(1.25)), vec![0]);
    let mut settled = pods.clone();
    assert_eq!(settle_crossings(&mut settled, &measured, Some(1.25)), 1);
    assert_eq!(settled[0].load, Some(0.9));
    assert_eq!(settled[1..], pods[1..]);
}

fn tables() -> impl Strategy<Value = (Vec<RoutedPod>, Vec<Option<f64>>, f64)> {
    let one = (
        proptest::collection::vec(0usize..3, 0..3),
        0.0f64..=1.0,
        proptest::option::of(0.0f64..=1.0),
    );
    (
        proptest::collection::vec(one, 1..=MAX_CROSSING_ROUNDS),
        1.0f64..2.0,
    )
        .prop_map(|(rows, factor)| {
            let names = ["x", "y", "z"];
            let mut pods = Vec::new();
            let mut measured = Vec::new();
            for (i, (adapters, published, m)) in rows.into_iter().enumerate() {
                let a: Vec<&str> = adapters
                    .iter()
                    .filter_map(|k| names.get(*k).copied())
                    .collect();
                pods.push(pod(&format!("p{i}"), &a, published));
                measured.push(m);
            }
            (pods, measured, factor)
        })
}

proptest! {
    /// After settling, every pod is on the side of every cap of its pools that its measured
    /// load is on (the caps as the filters compute them from the published loads), and only
    /// crossing pods were touched, to their measured load.
    #[test]
    fn settled_loads_keep_every_pods_side_of_its_caps((pods, measured, factor) in tables()) {
        let mut settled = pods.clone();
        settle_crossings(&mut settled, &measured, Some(factor));
        prop_assert!(cap_crossings(&settled, &measured, Some(factor)).is_empty());
        for (i, (before, after)) in pods.iter().zip(&settled).enumerate() {
            prop_assert!(after.load == before.load || after.load == measured[i]);
        }
        // and the whole table's cap is checked the way core's placement computes it
        let cap = load_cap(settled.iter().map(|p| clean_load(p.load)), factor);
        for (p, m) in settled.iter().zip(&measured) {
            prop_assert_eq!(clean_load(p.load) > cap, clean_load(*m) > cap);
        }
    }
}
