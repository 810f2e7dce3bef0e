// Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
use super::*;
use crate::fingerprint::BlockHash;
use crate::wire::WIRE_VERSION;
use proptest::prelude::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn pod(i: usize) -> RoutedPod {
    RoutedPod::new(&format!("pod-{i:03}"), &format!("10.0.0.{i}:8000"), &[])
}

fn table(generation: u64, pods: Vec<RoutedPod>) -> RoutingTable {
    RoutingTable {
        load_factor: Some(1.25),
        prefill_us_per_token: Some(250.0),
        ..RoutingTable::of_pods(generation, 64, pods)
    }
}

fn placed(k: u64, pod: usize) -> PlacedPrefix {
    PlacedPrefix {
        keys: vec![BlockHash(k), BlockHash(k + 1)],
        pod: format!("pod-{pod:03}"),
    }
}

#[test]
fn a_load_change_is_a_load_patch_and_a_new_pod_an_upsert() {
    let a = table(1, (0..4).map(pod).collect());
    let mut b = a.clone();
    b.generation = 2;
    b.pods[1].load = Some(0.7);
    b.pods.remove(2);
    b.pods
        .push(RoutedPod::new("pod-009", "10.0.0.9:8000", &["x"]));
    b.pods[0].adapters = vec!["y".into()];
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.base, 1);
    assert_eq!(d.generation, 2);
    assert_eq!(d.removed, vec!["pod-002".to_string()]);
    let upserted: Vec<&str> = d.upserted.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(upserted, vec!["pod-000", "pod-009"]);
    assert_eq!(
        d.loads,
        vec![PodLoad {
            id: "pod-001".into(),
            load: Some(0.7),
            wait_ms: None
        }]
    );
    assert!(d.settings.is_none() && d.prefixes.is_none() && d.warming.is_none());
    assert_eq!(apply(&d, &a), Ok(b));
}

#[test]
fn kept_prefixes_travel_as_their_index() {
    let mut a = table(1, (0..3).map(pod).collect());
    a.prefixes = vec![placed(10, 0), placed(20, 1), placed(30, 2)];
    let mut b = a.clone();
    b.generation = 5;
    b.prefixes = vec![placed(30, 2), placed(40, 0), placed(10, 0)];
    let d = diff(&a, &b).unwrap();
    assert_eq!(
        d.prefixes,
        Some(vec![
            PrefixItem::Kept(2),
            PrefixItem::New(placed(40, 0)),
            PrefixItem::Kept(0)
        ])
    );
    let json = String::from_utf8(d.encode()).unwrap();
    assert!(json.contains(r#""prefixes":[2,{"keys""#), "{json}");
    assert_eq!(apply(&d, &a), Ok(b));
}

#[test]
fn a_delta_applies_only_onto_its_base() {
    let a = table(3, (0..2).map(pod).collect());
    let mut b = a.clone();
    b.generation = 4;
    b.pods[0].load = Some(0.5);
    let d = diff(&a, &b).unwrap();
    let mut other = a.clone();
    other.generation = 2;
    assert_eq!(
        apply(&d, &other),
        Err(DeltaError::WrongBase { base: 3, held: 2 })
    );
    // the same generation number built at another time (a restarted gateway's) is another base
    let mut rebuilt = a.clone();
    rebuilt.generated_at_ms += 1;
    assert_eq!(
        apply(&d, &rebuilt),
        Err(DeltaError::WrongBase { base: 3, held: 3 })
    );
    assert!(apply(&d, &a).is_ok());
}

#[test]
fn a_delta_that_does_not_fit_its_base_is_refused() {
    let a = table(1, (0..3).map(pod).collect());
    let mut b = a.clone();
    b.generation = 2;
    b.pods[1].load = Some(0.4);
    let good = diff(&a, &b).unwrap();
    let refused = |change: &dyn Fn(&mut TableDelta)| {
        let mut d = good.clone();
        change(&mut d);
        match apply(&d, &a) {
            Err(DeltaError::Malformed(m)) => m,
            other => panic!("{other:?}"),
        }
    };
    assert!(refused(&|d| d.removed = vec!["pod-077".into()]).starts_with("removed: \"pod-077\""));
    assert!(refused(&|d| d.loads[0].id = "pod-077".into()).starts_with("loads: \"pod-077\""));
    assert!(refused(&|d| d.loads.push(d.loads[0].clone())).starts_with("loads: must be sorted"));
    assert!(refused(&|d| d.generation = 1).starts_with("generation: 1"));
    assert!(refused(&|d| {
        d.removed = vec!["pod-001".into()];
        d.upserted = vec![pod(1)];
    })
    .contains("also removed"));
    assert!(refused(&|d| d.prefixes = Some(vec![PrefixItem::Kept(0)])).starts_with("prefixes: 0"));
    assert!(
        refused(&|d| d.upserted = vec![RoutedPod::new("pod-005", "nope", &[])]).contains("address")
    );
    assert!(
        refused(&|d| d.upserted = (0..=MAX_TABLE_PODS).map(pod).collect())
            .starts_with("upserted: 4097 entries")
    );
    // the base is left as it was and the good delta still applies
    assert_eq!(apply(&good, &a), Ok(b));
}

#[test]
fn unsorted_tables_have_no_delta() {
    let a = table(1, vec![pod(2), pod(1)]);
    let b = table(2, vec![pod(1), pod(2)]);
    assert!(diff(&a, &b).is_none());
    assert!(diff(&b, &a).is_none());
}

#[test]
fn an_update_is_told_by_its_base() {
    let a = table(1, vec![pod(1)]);
    let mut b = a.clone();
    b.generation = 2;
    b.pods[0].wait_ms = Some(300);
    let d = diff(&a, &b).unwrap();
    assert_eq!(TableUpdate::decode(&d.encode()), Ok(TableUpdate::Delta(d)));
    assert_eq!(
        TableUpdate::decode(&b.encode()),
        Ok(TableUpdate::Whole(b.clone()))
    );
    assert!(matches!(
        TableUpdate::decode(br#"{"version":"2.0","base":1,"generation":2}"#),
        Err(WireError::IncompatibleVersion { .. })
    ));
    assert!(matches!(
        TableUpdate::decode(b"[1,2"),
        Err(WireError::Malformed(_))
    ));
    assert_eq!(WIRE_VERSION, b.version);
}

/// Random tables over a small universe of pods, adapters, prefixes and settings, as the gateway
/// builds them (pods sorted by id, loads on its 0.01 grid, prefixes naming pods of the table).
fn tables() -> impl Strategy<Value = RoutingTable> {
    let pod = (
        0usize..24,
        0u8..3,
        proptest::collection::vec(0usize..4, 0..3),
        proptest::option::of(0u32..=100),
        proptest::option::of(0u64..50),
        any::<bool>(),
    );
    (
        1u64..1_000,
        proptest::collection::vec(pod, 0..16),
        proptest::collection::vec((0u64..6, any::<prop::sample::Index>()), 0..6),
        proptest::option::of(1u32..4),
        any::<bool>(),
        proptest::collection::vec(0usize..24, 0..3),
    )
        .prop_map(|(generation, rows, prefixes, factor, price, warming)| {
            let names = ["a", "b", "c", "d"];
            let mut pods: Vec<RoutedPod> = rows
                .into_iter()
                .map(|(i, address, adapters, load, wait, resident)| {
                    let mut a: Vec<&str> = adapters
                        .iter()
                        .filter_map(|k| names.get(*k).copied())
                        .collect();
                    a.sort_unstable();
                    a.dedup();
                    let mut p = RoutedPod::new(
                        &format!("pod-{i:03}"),
                        &format!("10.0.{address}.{i}:8000"),
                        &a,
                    );
                    p.load = load.map(|l| f64::from(l) / 100.0);
                    p.wait_ms = wait.map(|w| w * 100);
                    if resident {
                        p.resident = p.adapters.iter().take(1).cloned().collect();
                    }
                    p
                })
                .collect();
            pods.sort_by(|a, b| a.id.cmp(&b.id));
            pods.dedup_by(|a, b| a.id == b.id);
            let prefixes = if pods.is_empty() {
                Vec::new()
            } else {
                prefixes
                    .into_iter()
                    .map(|(k, at)| PlacedPrefix {
                        keys: vec![BlockHash(k)],
                        pod: pods[at.index(pods.len())].id.clone(),
                    })
                    .collect()
            };
            RoutingTable {
                load_factor: factor.map(|f| 1.0 + f64::from(f) / 4.0),
                prefill_us_per_token: price.then_some(250.0),
                prefixes,
                warming: warming
                    .into_iter()
                    .map(|i| RoutedPod::new(&format!("w-{i}"), "10.1.0.1:8000", &[]))
                    .collect(),
                generated_at_ms: generation * 1_000,
                ..RoutingTable::of_pods(generation, 64, pods)
            }
        })
}

proptest! {
    /// apply(diff(a, b), a) == b for any two tables, through the wire as the filter gets it.
    #[test]
    fn a_delta_rebuilds_the_later_table(a in tables(), b in tables()) {
        let mut b = b;
        b.generation += a.generation + 1;
        let d = diff(&a, &b).unwrap();
        prop_assert_eq!(apply(&d, &a), Ok(b.clone()));
        let decoded = match TableUpdate::decode(&d.encode()) {
            Ok(TableUpdate::Delta(d)) => d,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(&decoded, &d);
        prop_assert_eq!(apply(&decoded, &a), Ok(b.clone()));
        // a table that did not change but its generation: an empty delta
        let mut same = a.clone();
        same.generation += 1;
        prop_assert!(diff(&a, &same).unwrap().is_empty());
    }
}
