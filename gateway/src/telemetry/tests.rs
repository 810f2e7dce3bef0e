use super::*;

#[test]
fn renders_the_documented_names() {
    let t = Telemetry::new();
    Telemetry::count(&t.prefills, &[("pod", "a"), ("outcome", "ok")]);
    Telemetry::count(&t.warmup_key_errors, &[("pod", "a")]);
    Telemetry::count(&t.prefill_shapes, &[("shape", "unshaped")]);
    Telemetry::count(&t.pod_restarts, &[("pod", "a"), ("evidence", "counters")]);
    t.warmup_duration.observe(0.3);
    t.set_hit_ratio("a", 0.5);
    let text = t.render();
    for name in [
        "prewarm_prefills_total{pod=\"a\",outcome=\"ok\"} 1",
        "prewarm_warmup_key_errors_total{pod=\"a\"} 1",
        "prewarm_prefill_shapes_total{shape=\"unshaped\"} 1",
        "prewarm_pod_restarts_total{pod=\"a\",evidence=\"counters\"} 1",
        "prewarm_warmup_duration_seconds_count 1",
        "prewarm_modelled_hit_ratio{pod=\"a\"} 0.5",
        "prewarm_gold_pool_pods 0",
    ] {
        assert!(text.contains(name), "{name} not in\n{text}");
    }
}

#[test]
fn an_experiment_is_exported_for_all_requests_and_for_the_new_pods_apart() {
    use crate::attribution::ledger::OutcomeLedger;
    use crate::attribution::report::report;
    use prewarm_core::wire::OutcomeRecord;

    let definition = serde_json::from_value(serde_json::json!({"id": "e", "arms": [
        {"name": "warm", "weight": 0.5}, {"name": "cold", "weight": 0.5}]}))
    .unwrap();
    let running = RunningExperiment {
        definition,
        started_ms: 1_000,
        release: None,
        events: Vec::new(),
        joined_pods: vec!["new".into()],
        significant: Vec::new(),
    };
    let record = |arm: &str, pod: &str, i: u64| OutcomeRecord {
        arm: Some(format!("e/{arm}")),
        pod: Some(pod.into()),
        model: None,
        at_ms: 2_000 + i,
        ttfb_ms: if arm == "warm" { 100 } else { 300 } + i % 7,
        status: 200,
        stream: false,
        prompt_tokens: Some(1_000 + 100 * (i % 5)),
        cached_tokens: None,
        prefix: Some(prewarm_core::BlockHash(i % 3)),
    };
    let records: Vec<OutcomeRecord> = (0..40)
        .flat_map(|i| {
            let pod = if i % 4 == 0 { "new" } else { "old" };
            [record("warm", pod, i), record("cold", pod, i)]
        })
        .collect();
    let mut ledger = OutcomeLedger::default();
    let t = Telemetry::new();
    let ttfb = t.experiment_ttfb(Some(&running));
    ledger.ingest_observed(&records, 10_000, |p| p == "new", |l, r| ttfb.observe(l, r));
    t.set_experiment(Some((&running, &report(&ledger, &running, 10_000, false))));
    let text = t.render();
    for series in [
        "prewarm_experiment_arm_weight{experiment=\"e\",arm=\"cold\"} 0.5",
        "prewarm_experiment_report_requests{experiment=\"e\",arm=\"cold\",cohort=\"all\"} 40",
        "prewarm_experiment_report_requests{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\"} 10",
        // the histogram counts what the report counts, by the same cohorts
        "prewarm_experiment_ttfb_seconds_count{experiment=\"e\",arm=\"cold\",cohort=\"all\"} 40",
        "prewarm_experiment_ttfb_seconds_count{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\"} 10",
        "prewarm_experiment_ttfb_seconds_count{experiment=\"e\",arm=\"warm\",cohort=\"new_pods_first_requests\"} 2",
        // warm's times are 100..106 ms: all at or under 0.15 s, the six of 100 ms at or
        // under 0.1 s (a bucket's bound is inclusive)
        "prewarm_experiment_ttfb_seconds_bucket{le=\"0.075\",experiment=\"e\",arm=\"warm\",cohort=\"all\"} 0",
        "prewarm_experiment_ttfb_seconds_bucket{le=\"0.1\",experiment=\"e\",arm=\"warm\",cohort=\"all\"} 6",
        "prewarm_experiment_ttfb_seconds_bucket{le=\"0.15\",experiment=\"e\",arm=\"warm\",cohort=\"all\"} 40",
        "prewarm_experiment_p_value{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\",test=\"welch\"}",
        "prewarm_experiment_ttfb_mean_diff_seconds{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\"} 0.2",
        "prewarm_experiment_ttfb_adjusted_mean_diff_seconds{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\"}",
        "prewarm_experiment_p_value{experiment=\"e\",arm=\"cold\",cohort=\"new_pods\",test=\"mann_whitney_prompt_adjusted\"}",
        // the new pod's first requests of prefixes seen twice: warm's of the 2nd and 3rd
        // prefix (the first was not yet hot; cold's came after warm's on the same pod)
        "prewarm_experiment_report_requests{experiment=\"e\",arm=\"warm\",cohort=\"new_pods_first_requests\"} 2",
    ] {
        assert!(text.contains(series), "{series} not in\n{text}");
    }
    assert!(!text.contains("quantile"), "no quantile gauges:\n{text}");
    assert!(
        !text.contains("# TYPE prewarm_experiment_requests "),
        "renamed:\n{text}"
    );

    // Records of no arm, of another experiment or from before the start make no series.
    let stray = |arm: Option<&str>, at_ms| OutcomeRecord {
        arm: arm.map(str::to_string),
        at_ms,
        ..record("warm", "old", 0)
    };
    ledger.ingest_observed(
        &[
            stray(None, 3_000),
            stray(Some("other/warm"), 3_000),
            stray(Some("e/warm"), 500),
        ],
        10_000,
        |_| false,
        |l, r| ttfb.observe(l, r),
    );
    let text = t.render();
    assert!(!text.contains("other"), "{text}");
    assert!(
        text.contains("prewarm_experiment_ttfb_seconds_count{experiment=\"e\",arm=\"warm\",cohort=\"all\"} 40"),
        "{text}"
    );

    // The histogram stays while the experiment runs and goes when it ends.
    t.set_experiment(Some((&running, &report(&ledger, &running, 10_000, false))));
    assert!(t
        .render()
        .contains("prewarm_experiment_ttfb_seconds_count{"));
    t.set_experiment(None);
    let text = t.render();
    assert!(
        !text.contains("prewarm_experiment_ttfb_seconds_count{"),
        "{text}"
    );
}

/// A pod that left the fleet leaves no series in any family labelled by `pod`; another
/// pod's stay.
#[test]
fn a_departed_pods_series_are_removed_from_every_pod_family() {
    let t = Telemetry::new();
    for pod in ["gone", "stays"] {
        Telemetry::count(&t.warmup_key_errors, &[("pod", pod)]);
        Telemetry::count(&t.prefills, &[("pod", pod), ("outcome", "ok")]);
        Telemetry::count(&t.prefills, &[("pod", pod), ("outcome", "timeout")]);
        Telemetry::count(&t.adapter_loads, &[("pod", pod), ("outcome", "ok")]);
        Telemetry::count(&t.adapter_unloads, &[("pod", pod), ("outcome", "ok")]);
        Telemetry::count(&t.pod_restarts, &[("pod", pod), ("evidence", "start_time")]);
        t.set_hit_ratio(pod, 0.5);
        t.set_kv_hit_gap(pod, 0.1);
    }
    let before = t.render();
    assert_eq!(before.matches("pod=\"gone\"").count(), 8, "{before}");
    t.forget_pod("gone");
    let text = t.render();
    assert!(!text.contains("pod=\"gone\""), "{text}");
    assert_eq!(text.matches("pod=\"stays\"").count(), 8, "{text}");
    // A pod of the same id that joins again starts from zero.
    Telemetry::count(&t.prefills, &[("pod", "gone"), ("outcome", "ok")]);
    assert!(t
        .render()
        .contains("prewarm_prefills_total{pod=\"gone\",outcome=\"ok\"} 1"));
}
