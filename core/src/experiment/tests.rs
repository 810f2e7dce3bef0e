// Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
use super::*;
use proptest::prelude::*;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn experiment(weights: &[f64]) -> Experiment {
    Experiment {
        id: "warm-vs-cold".into(),
        unit: Unit::User,
        arms: weights
            .iter()
            .enumerate()
            .map(|(i, w)| Arm {
                name: format!("arm-{i}"),
                weight: *w,
                settings: ArmSettings::default(),
            })
            .collect(),
        release: None,
    }
}

fn shares(e: &Experiment, users: usize) -> Vec<f64> {
    let mut counts = vec![0usize; e.arms.len()];
    for u in 0..users {
        counts[e.arm_of(format!("user-{u}").as_bytes())] += 1;
    }
    counts.iter().map(|c| *c as f64 / users as f64).collect()
}

#[test]
fn arms_are_within_one_percent_of_their_weights_over_ten_thousand_users() {
    for weights in [
        &[0.5, 0.5][..],
        &[0.01, 0.99],
        &[0.05, 0.95],
        &[0.25, 0.75],
        &[0.2, 0.3, 0.5],
    ] {
        let got = shares(&experiment(weights), 10_000);
        for (w, s) in weights.iter().zip(&got) {
            assert!((w - s).abs() <= 0.01, "{weights:?} → {got:?}");
        }
    }
}

#[test]
fn a_zero_weight_arm_gets_no_unit() {
    let got = shares(&experiment(&[0.0, 1.0]), 2_000);
    assert_eq!(got, vec![0.0, 1.0]);
    let got = shares(&experiment(&[1.0, 0.0]), 2_000);
    assert_eq!(got, vec![1.0, 0.0]);
}

#[test]
fn ramping_the_first_arm_keeps_its_units_and_takes_only_others() {
    let steps = [0.01, 0.05, 0.25, 0.5];
    for pair in steps.windows(2) {
        let before = experiment(&[pair[0], 1.0 - pair[0]]);
        let after = experiment(&[pair[1], 1.0 - pair[1]]);
        for u in 0..5_000 {
            let unit = format!("user-{u}");
            if before.arm_of(unit.as_bytes()) == 0 {
                assert_eq!(
                    after.arm_of(unit.as_bytes()),
                    0,
                    "{unit} left the ramped arm"
                );
            }
        }
    }
}

#[test]
fn experiments_with_other_ids_split_units_independently() {
    let a = experiment(&[0.5, 0.5]);
    let mut b = a.clone();
    b.id = "another".into();
    let same = (0..10_000)
        .filter(|u| {
            let unit = format!("user-{u}");
            a.arm_of(unit.as_bytes()) == b.arm_of(unit.as_bytes())
        })
        .count();
    // independent halves agree on about half the units
    assert!((4_700..=5_300).contains(&same), "{same}");
}

#[test]
fn problems_name_the_field() {
    let ok = experiment(&[0.5, 0.5]);
    assert_eq!(ok.problem(), None);
    type Change = Box<dyn Fn(&mut Experiment)>;
    let cases: Vec<(Change, &str)> = vec![
        (Box::new(|e| e.id = String::new()), "id:"),
        (Box::new(|e| e.id = "a b".into()), "id:"),
        (Box::new(|e| e.id = "x".repeat(65)), "id:"),
        (Box::new(|e| e.arms.truncate(1)), "arms: 1 arms"),
        (
            Box::new(|e| e.arms[1].name = "arm-0".into()),
            "arms[1].name",
        ),
        (
            Box::new(|e| e.arms[1].name = "arm/1".into()),
            "arms[1].name",
        ),
        (Box::new(|e| e.arms[0].weight = f64::NAN), "arms[0].weight"),
        (Box::new(|e| e.arms[1].weight = -0.5), "arms[1].weight"),
        (
            Box::new(|e| e.arms[1].weight = 0.6),
            "arms: weights sum to 1.1",
        ),
        (
            Box::new(|e| e.arms[1].settings.residency_rule = Some(ResidencyRule::SeedKeep)),
            "arms[1].settings.residency_rule: needs \"unit\": \"tenant\"",
        ),
        (
            Box::new(|e| {
                let arm = e.arms[0].clone();
                e.arms = vec![arm; MAX_ARMS + 1];
            }),
            "arms: 9 arms",
        ),
    ];
    for (change, field) in cases {
        let mut e = ok.clone();
        change(&mut e);
        let problem = e.problem().unwrap_or_default();
        assert!(problem.starts_with(field), "{field}: {problem}");
    }
}

#[test]
fn unknown_settings_are_refused_and_missing_ones_default() {
    let json = r#"{"id":"e","arms":[{"name":"a","weight":0.5},
        {"name":"b","weight":0.5,"settings":{"warmup":false,"keep_warm":false,"routing":"off"}}]}"#;
    let e: Experiment = serde_json::from_str(json).unwrap();
    assert_eq!(e.arms[0].settings, ArmSettings::default());
    assert_eq!(
        e.arms[1].settings,
        ArmSettings {
            warmup: false,
            keep_warm: false,
            routing: ArmRouting::Off,
            residency_rule: None,
        }
    );
    assert!(e.needs_warming_pods());
    let bad = r#"{"id":"e","arms":[{"name":"a","weight":1,"settings":{"budget":1}}]}"#;
    let err = serde_json::from_str::<Experiment>(bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("budget"), "{err}");
    let bad = r#"{"id":"e","arms":[{"name":"a","weight":1,"settings":{"keep_warm":1}}]}"#;
    assert!(serde_json::from_str::<Experiment>(bad).is_err());
    let bad = r#"{"id":"e","arms":[{"name":"a","weight":1,"settings":{"routing":"random"}}]}"#;
    assert!(serde_json::from_str::<Experiment>(bad).is_err());
}

#[test]
fn the_header_names_experiment_and_arm() {
    let e = experiment(&[0.5, 0.5]);
    assert_eq!(e.header_value(1).as_deref(), Some("warm-vs-cold/arm-1"));
    assert_eq!(e.header_value(2), None);
}

proptest! {
    #[test]
    fn a_unit_always_gets_the_same_arm_of_positive_weight(
        unit in proptest::collection::vec(any::<u8>(), 0..64),
        first in 0.0f64..=1.0,
    ) {
        let e = experiment(&[first, 1.0 - first]);
        let arm = e.arm_of(&unit);
        prop_assert_eq!(arm, e.arm_of(&unit));
        prop_assert!(e.arms[arm].weight > 0.0);
    }

    #[test]
    fn shares_stay_within_sampling_error_of_any_weights(first in 0.0f64..=1.0) {
        // 4.5 standard deviations: a correct split fails one case in ~150 000
        let n = 4_000.0;
        let got = shares(&experiment(&[first, 1.0 - first]), n as usize);
        let sd = (n * first * (1.0 - first)).sqrt() / n;
        prop_assert!((got[0] - first).abs() <= 4.5 * sd + 1e-9, "{} vs {}", got[0], first);
    }
}

#[test]
fn a_release_is_checked_and_its_defaults_are_the_documented_ramp() {
    let json = r#"{"id":"e","arms":[{"name":"new","weight":0.01},{"name":"old","weight":0.99}],
        "release":{}}"#;
    let e: Experiment = serde_json::from_str(json).unwrap();
    assert_eq!(
        e.release.as_ref().unwrap().steps,
        vec![0.01, 0.05, 0.25, 0.5]
    );
    assert_eq!(e.problem(), None);
    for (release, field) in [
        (r#"{"steps":[]}"#, "release.steps: 0 steps"),
        (r#"{"steps":[0.5,0.25]}"#, "release.steps: [0.5, 0.25]"),
        (r#"{"steps":[0.0,0.5]}"#, "release.steps"),
        (r#"{"steps":[0.5,1.5]}"#, "release.steps"),
        (r#"{"step_seconds":0}"#, "release.step_seconds"),
        (r#"{"min_requests":0}"#, "release.min_requests"),
        (r#"{"warmup_p95_ms":0}"#, "release.warmup_p95_ms"),
    ] {
        let json = format!(
            r#"{{"id":"e","arms":[{{"name":"a","weight":0.5}},{{"name":"b","weight":0.5}}],"release":{release}}}"#
        );
        let e: Experiment = serde_json::from_str(&json).unwrap();
        let problem = e.problem().unwrap_or_default();
        assert!(problem.starts_with(field), "{field}: {problem}");
    }
    let unknown = r#"{"id":"e","arms":[],"release":{"speed":2}}"#;
    assert!(serde_json::from_str::<Experiment>(unknown).is_err());
}

#[test]
fn the_first_arms_weight_moves_and_the_others_keep_their_proportions() {
    let e = experiment(&[0.2, 0.2, 0.6]);
    let w: Vec<f64> = e
        .with_first_weight(0.6)
        .arms
        .iter()
        .map(|a| a.weight)
        .collect();
    assert!((w[0] - 0.6).abs() < 1e-12 && (w[1] - 0.1).abs() < 1e-12 && (w[2] - 0.3).abs() < 1e-12);
    assert_eq!(e.with_first_weight(0.6).problem(), None);
    let rolled_back = experiment(&[1.0, 0.0]).with_first_weight(0.0);
    assert_eq!(
        rolled_back.arms[1].weight, 1.0,
        "the others share it equally"
    );
    assert_eq!(rolled_back.problem(), None);
}

#[test]
fn a_tenant_experiment_may_set_the_residency_rule_and_a_user_one_is_written_as_before() {
    let json = r#"{"id":"e","unit":"tenant","arms":[{"name":"a","weight":0.5},
        {"name":"b","weight":0.5,"settings":{"residency_rule":"seed_keep"}}]}"#;
    let e: Experiment = serde_json::from_str(json).unwrap();
    assert_eq!(e.unit, Unit::Tenant);
    assert_eq!(e.arms[0].settings.residency_rule, None);
    assert_eq!(
        e.arms[1].settings.residency_rule,
        Some(ResidencyRule::SeedKeep)
    );
    assert_eq!(e.problem(), None);
    let written = serde_json::to_string(&e).unwrap();
    assert!(written.contains(r#""unit":"tenant""#), "{written}");
    // The default unit and an absent rule are not written: older filters read the table.
    let plain = serde_json::to_string(&experiment(&[0.5, 0.5])).unwrap();
    assert!(
        !plain.contains("unit") && !plain.contains("residency_rule"),
        "{plain}"
    );
    for bad in [
        r#"{"id":"e","unit":"connection","arms":[{"name":"a","weight":1}]}"#,
        r#"{"id":"e","unit":"tenant","arms":[{"name":"a","weight":1,"settings":{"residency_rule":"lru"}}]}"#,
    ] {
        assert!(serde_json::from_str::<Experiment>(bad).is_err(), "{bad}");
    }
}
