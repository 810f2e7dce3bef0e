//! The view's derivations on hand-written API replies.

use serde_json::json;

use super::*;

fn detail(versions: &[&str], served: &[&str], lora: &[&str]) -> PodDetailReply {
    serde_json::from_value(json!({
        "versions": versions.iter().map(|v| (v.to_string(), json!({"version": "1"}))).collect::<BTreeMap<_, _>>(),
        "served": {"base": "m", "adapters": served.iter().map(|s| [s, "/p"]).collect::<Vec<_>>()},
        "lora": lora.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
        "modelled_hit_ratio": null, "warmup": null, "unknown_field": 1
    }))
    .expect("detail")
}

#[test]
fn cells_are_refined_with_what_the_pod_confirmed() {
    let loaded = detail(&["x"], &[], &["x"]);
    let served = detail(&[], &["x"], &["x"]);
    let pending = detail(&[], &[], &["x"]);
    assert_eq!(
        Residency::refine("gpu", "x", Some(&loaded)),
        Residency::Resident
    );
    assert_eq!(
        Residency::refine("gpu", "x", Some(&served)),
        Residency::Resident
    );
    assert_eq!(
        Residency::refine("gpu", "x", Some(&pending)),
        Residency::Loading
    );
    assert_eq!(
        Residency::refine("registered", "x", Some(&served)),
        Residency::Host
    );
    assert_eq!(
        Residency::refine("registered", "x", None),
        Residency::Loading
    );
    assert_eq!(
        Residency::refine("absent", "x", Some(&pending)),
        Residency::Evicted
    );
    assert_eq!(
        Residency::refine("absent", "y", Some(&pending)),
        Residency::Absent
    );
    assert_eq!(Residency::refine("absent", "x", None), Residency::Absent);
}

fn pod(id: &str, health: &str, routable: bool, phase: Option<&str>) -> PodSummaryReply {
    PodSummaryReply {
        id: id.into(),
        address: "127.0.0.1:1".into(),
        health: health.into(),
        routable,
        warmup_phase: phase.map(str::to_string),
        waiting: 0,
        running: 0,
        kv_usage: 0.0,
    }
}

#[test]
fn pod_states_follow_health_then_phase() {
    let state = |h, p| PodState::of(&pod("a", h, false, p));
    assert_eq!(state("down", Some("done")), PodState::Down);
    assert_eq!(state("up", Some("done")), PodState::Warm);
    assert_eq!(state("up", Some("first_tier")), PodState::Warming);
    assert_eq!(state("up", Some("interrupted")), PodState::Idle);
    assert_eq!(state("unknown", None), PodState::Idle);
}

#[test]
fn prefixes_are_placed_by_plans_and_adapters_weighed_by_prompts() {
    let plan = |first: &[&str]| PlanReply {
        first_tier: first.iter().map(|s| s.to_string()).collect(),
        second_tier: vec![],
    };
    let prompt = |key: &str, model: &str, hotness: f64| PromptReply {
        key: key.into(),
        model: model.into(),
        tenant: None,
        origin: "static".into(),
        hotness,
        preview: String::new(),
    };
    let snapshot = Snapshot {
        pods: vec![
            PodSnapshot {
                summary: pod("a", "up", true, Some("done")),
                detail: Some(detail(&["x"], &[], &["x"])),
                plan: Some(plan(&["k1"])),
            },
            PodSnapshot {
                summary: pod("b", "up", false, Some("first_tier")),
                detail: None,
                plan: Some(plan(&["k2"])),
            },
        ],
        heatmap: HeatmapReply {
            adapters: vec!["x".into()],
            pods: vec!["a".into(), "b".into()],
            cells: vec![vec!["gpu".into()]],
        },
        prompts: PromptsReply {
            total: 3,
            prompts: vec![
                prompt("k2", "x", 2.0),
                prompt("k1", "x", 1.5),
                prompt("k3", "m", 1.0),
            ],
        },
        adapters: vec![],
    };
    let view = View::of(&snapshot, 3);
    let placed: Vec<Vec<String>> = view.prefixes.iter().map(|p| p.placed_on.clone()).collect();
    assert_eq!(
        placed,
        vec![vec!["b(warming)".to_string()], vec!["a".into()], vec![]]
    );
    // A missing cell (short row) is absent.
    assert_eq!(
        view.adapters[0].cells,
        vec![Residency::Resident, Residency::Absent]
    );
    assert_eq!(view.adapters[0].hotness, 3.5);
    assert_eq!(View::of(&snapshot, 1).prefixes.len(), 1);
}
