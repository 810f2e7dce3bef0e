//! An experiment's report: per arm (all of its time, and hour by hour) the requests, time to
//! first byte p50/p95/mean, error rate and cached-token ratio; each arm against the first (the
//! reference): the difference of mean time to first byte, Welch's t and Mann-Whitney U with
//! their p-values, and the change of each against the period before the experiment. The same
//! for the requests served by pods that joined after the start (`new_pods`), where a warm-up
//! setting shows, and for their first requests of hot prefixes (`new_pods.first_requests`,
//! [`super::first_requests`]), the requests a warm-up prefills for.
//!
//! An arm differs *significantly* when both tests give p < [`SIGNIFICANCE`]: Welch's on the
//! means, which a long tail moves, and Mann-Whitney's on the whole distribution, which it does
//! not; requiring both keeps one heavy-tailed hour from deciding. Before the experiment the
//! records carry no arm, so both arms' baseline is the same population and the
//! difference-in-differences against it equals the difference of the arms; the report gives
//! each arm's change against it so a shift of the whole fleet (a new model, a traffic change)
//! shows as a change of both rather than of one. Each comparison also says how many requests an
//! arm would need for a verdict if what is observed holds (a power estimate), and the gateway
//! notes, as an event, when a comparison first becomes significant and after how many requests.
//!
//! Each comparison is also made on the times adjusted for prompt length ([`super::adjusted`]).

use serde::Serialize;

use super::adjusted::{prompt_adjusted, ByPrompt, PromptAdjusted};
use super::ledger::{Bucket, OutcomeLedger, HOUR_MS};
use super::stats::{mann_whitney, quantile, requests_for, welch, Moments, Test};
use crate::policy::fleet::RunningExperiment;

/// The p-value below which an arm differs significantly.
pub const SIGNIFICANCE: f64 = 0.01;
/// The power [`Reading::requests_needed`] is computed for.
pub const POWER: f64 = 0.8;
/// How far back the period before the experiment reaches, ms.
pub const BEFORE_MS: u64 = 24 * HOUR_MS;

/// One arm's outcomes over a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmSummary {
    pub arm: String,
    pub requests: u64,
    pub errors: u64,
    pub error_rate: Option<f64>,
    pub ttfb_p50_ms: Option<f64>,
    pub ttfb_p95_ms: Option<f64>,
    pub ttfb_mean_ms: Option<f64>,
    /// Cached over prompt tokens of the responses that reported both (`with_usage` of them).
    pub cached_token_ratio: Option<f64>,
    pub with_usage: u64,
}

impl ArmSummary {
    fn of(arm: &str, b: &Bucket) -> Self {
        let mut sorted = b.sample.clone();
        sorted.sort_by(f64::total_cmp);
        let ratio = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
        Self {
            arm: arm.to_string(),
            requests: b.requests,
            errors: b.errors,
            error_rate: ratio(b.errors, b.requests),
            ttfb_p50_ms: quantile(&sorted, 0.5),
            ttfb_p95_ms: quantile(&sorted, 0.95),
            ttfb_mean_ms: (b.ttfb.n > 0).then_some(b.ttfb.mean),
            cached_token_ratio: ratio(b.cached_tokens, b.prompt_tokens),
            with_usage: b.with_usage,
        }
    }
}

/// A test's result in the report.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TestResult {
    pub statistic: f64,
    pub p: f64,
}

impl From<Test> for TestResult {
    fn from(t: Test) -> Self {
        Self {
            statistic: t.statistic,
            p: t.p,
        }
    }
}

/// An arm against the reference arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub arm: String,
    pub reference: String,
    /// The arm's mean time to first byte minus the reference's, ms.
    pub ttfb_mean_diff_ms: Option<f64>,
    /// The arm's and the reference's mean minus the period before the experiment's, ms.
    pub arm_vs_before_ms: Option<f64>,
    pub reference_vs_before_ms: Option<f64>,
    /// The tests and what they say (serialised as the comparison's own fields).
    #[serde(flatten)]
    pub reading: Reading,
    /// The same comparison of the times adjusted for prompt length; `None` until both arms have
    /// requests whose prompts differ in length.
    pub prompt_adjusted: Option<PromptAdjusted>,
}

/// One hour's arms.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HourReport {
    pub hour_ms: u64,
    pub arms: Vec<ArmSummary>,
}

/// The whole report of `GET /admin/experiments/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExperimentReport {
    pub generated_ms: u64,
    pub significance: f64,
    /// Records without an arm in the [`BEFORE_MS`] before the start.
    pub before: ArmSummary,
    /// Each arm since the start.
    pub arms: Vec<ArmSummary>,
    pub comparisons: Vec<Comparison>,
    /// The same on the pods that joined after the start: where warm-up acts.
    pub new_pods: NewPods,
    pub hours: Vec<HourReport>,
}

/// One of the report's cohorts with the names it goes by: every reader (events, metrics) walks
/// [`ExperimentReport::cohorts`] rather than its own list.
pub struct CohortView<'a> {
    /// The `cohort` label of its Prometheus series.
    pub name: &'static str,
    /// The suffix of its ledger labels and of the keys of its noted significances.
    pub suffix: &'static str,
    /// How an event names it (`""` for all requests).
    pub on: &'static str,
    pub arms: &'a [ArmSummary],
    pub comparisons: &'a [Comparison],
}

impl ExperimentReport {
    /// All requests, the new pods', and the new pods' first requests of hot prefixes.
    pub fn cohorts(&self) -> [CohortView<'_>; 3] {
        let firsts = &self.new_pods.first_requests;
        let [(all, all_suffix), (new, new_suffix), (first, first_suffix)] = COHORTS;
        [
            CohortView {
                name: all,
                suffix: all_suffix,
                on: "",
                arms: &self.arms,
                comparisons: &self.comparisons,
            },
            CohortView {
                name: new,
                suffix: new_suffix,
                on: " on the new pods",
                arms: &self.new_pods.arms,
                comparisons: &self.new_pods.comparisons,
            },
            CohortView {
                name: first,
                suffix: first_suffix,
                on: " on the new pods' first requests of hot prefixes",
                arms: &firsts.arms,
                comparisons: &firsts.comparisons,
            },
        ]
    }
}

/// The arms' outcomes on the pods that (re)joined after the experiment started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewPods {
    pub pods: Vec<String>,
    pub arms: Vec<ArmSummary>,
    pub comparisons: Vec<Comparison>,
    /// The same of their first requests of hot prefixes (`first_requests`): the requests a
    /// warm-up prefills for.
    pub first_requests: Cohort,
}

/// The arms and comparisons of one cohort of requests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cohort {
    pub arms: Vec<ArmSummary>,
    pub comparisons: Vec<Comparison>,
}

/// Each cohort's `cohort` label and the suffix of its ledger labels, in
/// [`ExperimentReport::cohorts`]'s order.
pub const COHORTS: [(&str, &str); 3] = [
    ("all", ""),
    ("new_pods", NEW_PODS),
    ("new_pods_first_requests", FIRST_REQUESTS),
];

/// Every ledger label of `experiment`'s arms with the arm and the `cohort` label it counts under:
/// what a record counted under one of them is in the metrics.
pub fn cohort_labels(experiment: &RunningExperiment) -> Vec<(String, &str, &'static str)> {
    let arms = &experiment.definition.arms;
    arms.iter()
        .flat_map(|a| {
            let arm_label = label(experiment, &a.name);
            COHORTS
                .map(|(cohort, suffix)| (format!("{arm_label}{suffix}"), a.name.as_str(), cohort))
        })
        .collect()
}

/// The label of an arm's records.
pub fn label(experiment: &RunningExperiment, arm: &str) -> String {
    format!("{}/{arm}", experiment.definition.id)
}

/// The label of an arm's records on pods that joined after the experiment started.
pub fn new_pods_label(arm_label: &str) -> String {
    format!("{arm_label}{NEW_PODS}")
}

/// The label of an arm's records that were a new pod's first request of a hot prefix.
pub fn first_requests_label(arm_label: &str) -> String {
    format!("{arm_label}{FIRST_REQUESTS}")
}

/// The suffix of the new pods' labels.
pub const NEW_PODS: &str = "@new";
/// The suffix of the labels of the new pods' first requests of hot prefixes.
pub const FIRST_REQUESTS: &str = "@new-first";
/// The suffix of a comparison adjusted for prompt length, in the keys of noted significances.
pub const PROMPT_ADJUSTED: &str = "/prompt-adjusted";

/// Both tests of one sample against another, and the report's rule on them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Verdict {
    pub welch: Option<TestResult>,
    pub mann_whitney: Option<TestResult>,
    /// Both tests below [`SIGNIFICANCE`].
    pub significant: bool,
}

/// Welch's test on the moments and Mann-Whitney's on the samples of `arm` against `reference`:
/// the rule of every comparison of the report.
fn verdict(
    arm: &Moments,
    arm_sample: &[f64],
    reference: &Moments,
    reference_sample: &[f64],
) -> Verdict {
    let w = welch(arm, reference);
    let m = mann_whitney(arm_sample, reference_sample);
    Verdict {
        welch: w.map(TestResult::from),
        mann_whitney: m.map(TestResult::from),
        significant: w.is_some_and(|t| t.p < SIGNIFICANCE) && m.is_some_and(|t| t.p < SIGNIFICANCE),
    }
}

/// A comparison's tests and what they say of the arm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reading {
    pub welch: Option<TestResult>,
    pub mann_whitney: Option<TestResult>,
    /// Both tests below [`SIGNIFICANCE`].
    pub significant: bool,
    /// Significant, and the arm's time to first byte is the shorter.
    pub better: bool,
    /// Significant, and the arm's time to first byte is the longer.
    pub worse: bool,
    /// Requests each of the two arms needs for Welch's test to reach [`SIGNIFICANCE`] with
    /// [`POWER`] if the observed difference and spreads hold (`stats::requests_for`): how far
    /// the experiment is from a verdict; `None` without a difference to find.
    pub requests_needed: Option<u64>,
}

/// The reading of the tests of `arm` against `reference`, whose means differ by `diff` (arm
/// minus reference): every comparison's, raw or adjusted.
pub fn reading(
    arm: &Moments,
    arm_sample: &[f64],
    reference: &Moments,
    reference_sample: &[f64],
    diff: Option<f64>,
) -> Reading {
    let v = verdict(arm, arm_sample, reference, reference_sample);
    Reading {
        welch: v.welch,
        mann_whitney: v.mann_whitney,
        significant: v.significant,
        better: v.significant && diff.is_some_and(|d| d < 0.0),
        worse: v.significant && diff.is_some_and(|d| d > 0.0),
        requests_needed: requests_for(arm, reference, SIGNIFICANCE, POWER),
    }
}

/// The arms and comparisons of the records under `labels` (name, label) since `start`.
fn cohort(
    ledger: &OutcomeLedger,
    labels: &[(String, String)],
    before: &Bucket,
    start: u64,
    end: u64,
) -> (Vec<ArmSummary>, Vec<Comparison>) {
    let totals: Vec<Bucket> = labels
        .iter()
        .map(|(_, l)| ledger.total(l, start, end))
        .collect();
    let mean = |b: &Bucket| (b.ttfb.n > 0).then_some(b.ttfb.mean);
    let mut comparisons = Vec::new();
    if let (Some((reference, _)), Some(ref_total)) = (labels.first(), totals.first()) {
        for ((name, _), total) in labels.iter().zip(&totals).skip(1) {
            let diff = mean(total).zip(mean(ref_total)).map(|(a, r)| a - r);
            comparisons.push(Comparison {
                arm: name.clone(),
                reference: reference.clone(),
                ttfb_mean_diff_ms: diff,
                arm_vs_before_ms: mean(total).zip(mean(before)).map(|(a, b)| a - b),
                reference_vs_before_ms: mean(ref_total).zip(mean(before)).map(|(r, b)| r - b),
                reading: reading(
                    &total.ttfb,
                    &total.sample,
                    &ref_total.ttfb,
                    &ref_total.sample,
                    diff,
                ),
                prompt_adjusted: prompt_adjusted(&ByPrompt::of(total), &ByPrompt::of(ref_total)),
            });
        }
    }
    let arms = labels
        .iter()
        .zip(&totals)
        .map(|((name, _), b)| ArmSummary::of(name, b))
        .collect();
    (arms, comparisons)
}

/// The report of `experiment` from `ledger` at `now_ms`, with its hours when `with_hours`.
pub fn report(
    ledger: &OutcomeLedger,
    experiment: &RunningExperiment,
    now_ms: u64,
    with_hours: bool,
) -> ExperimentReport {
    let start = experiment.started_ms;
    let end = now_ms.saturating_add(1);
    let labels: Vec<(String, String)> = experiment
        .definition
        .arms
        .iter()
        .map(|a| (a.name.clone(), label(experiment, &a.name)))
        .collect();
    let relabelled = |suffix: fn(&str) -> String| -> Vec<(String, String)> {
        labels
            .iter()
            .map(|(name, l)| (name.clone(), suffix(l)))
            .collect()
    };
    let new_labels = relabelled(new_pods_label);
    let first_labels = relabelled(first_requests_label);
    let before = ledger.total("", start.saturating_sub(BEFORE_MS), start);
    let (arms, comparisons) = cohort(ledger, &labels, &before, start, end);
    let (new_arms, new_comparisons) = cohort(ledger, &new_labels, &before, start, end);
    let (first_arms, first_comparisons) = cohort(ledger, &first_labels, &before, start, end);
    let mut hours = Vec::new();
    let mut hour = start / HOUR_MS * HOUR_MS;
    while with_hours && hour < end {
        let arms = labels
            .iter()
            .map(|(name, l)| ArmSummary::of(name, &ledger.total(l, hour, hour + HOUR_MS)))
            .collect();
        hours.push(HourReport {
            hour_ms: hour,
            arms,
        });
        hour += HOUR_MS;
    }
    ExperimentReport {
        generated_ms: now_ms,
        significance: SIGNIFICANCE,
        before: ArmSummary::of("before", &before),
        arms,
        comparisons,
        new_pods: NewPods {
            pods: experiment.joined_pods.clone(),
            arms: new_arms,
            comparisons: new_comparisons,
            first_requests: Cohort {
                arms: first_arms,
                comparisons: first_comparisons,
            },
        },
        hours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::wire::OutcomeRecord;

    fn running() -> RunningExperiment {
        let definition = serde_json::from_value(serde_json::json!({"id": "e", "arms": [
            {"name": "warm", "weight": 0.5}, {"name": "cold", "weight": 0.5}]}))
        .unwrap();
        RunningExperiment {
            definition,
            started_ms: 10 * HOUR_MS,
            release: None,
            events: Vec::new(),
            joined_pods: Vec::new(),
            significant: Vec::new(),
        }
    }

    fn records(arm: Option<&str>, at_ms: u64, base: u64, n: u64) -> Vec<OutcomeRecord> {
        (0..n)
            .map(|i| OutcomeRecord {
                arm: arm.map(str::to_string),
                pod: Some("p-new".into()),
                model: None,
                at_ms: at_ms + i,
                ttfb_ms: base + (i * 37) % 100,
                status: if i % 50 == 0 { 503 } else { 200 },
                stream: true,
                prompt_tokens: Some(1000),
                cached_tokens: Some(if base < 200 { 800 } else { 100 }),
                prefix: None,
            })
            .collect()
    }

    #[test]
    fn a_slower_arm_is_significantly_worse_and_an_equal_one_is_not() {
        let e = running();
        let mut ledger = OutcomeLedger::default();
        let now = e.started_ms + 2 * HOUR_MS;
        ledger.ingest(
            &records(None, e.started_ms - HOUR_MS, 150, 400),
            now,
            |_| false,
        );
        ledger.ingest(
            &records(Some("e/warm"), e.started_ms + 10, 100, 400),
            now,
            |_| true,
        );
        ledger.ingest(
            &records(Some("e/cold"), e.started_ms + HOUR_MS, 300, 400),
            now,
            |p| p == "p-new",
        );
        let r = report(&ledger, &e, now, true);
        assert_eq!(r.arms[0].requests, 400);
        assert_eq!(r.arms[0].error_rate, Some(8.0 / 400.0));
        assert_eq!(r.arms[0].cached_token_ratio, Some(0.8));
        assert_eq!(r.before.requests, 400);
        let c = &r.comparisons[0];
        assert_eq!((c.arm.as_str(), c.reference.as_str()), ("cold", "warm"));
        assert!(
            c.reading.significant && c.reading.worse && !c.reading.better,
            "{c:?}"
        );
        assert!((c.ttfb_mean_diff_ms.unwrap() - 200.0).abs() < 1e-9);
        assert!((c.arm_vs_before_ms.unwrap() - 150.0).abs() < 1e-9);
        assert_eq!(r.hours.len(), 3, "the start's hour, the next, and now's");
        assert_eq!(r.hours[0].arms[0].requests, 400);
        assert_eq!(r.hours[1].arms[1].requests, 400);
        // the same records were all served by a new pod
        assert_eq!(r.new_pods.arms[1].requests, 400);
        assert!(r.new_pods.comparisons[0].reading.worse);

        let mut same = OutcomeLedger::default();
        same.ingest(
            &records(Some("e/warm"), e.started_ms, 100, 400),
            now,
            |_| false,
        );
        same.ingest(
            &records(Some("e/cold"), e.started_ms, 100, 400),
            now,
            |_| false,
        );
        let c = &report(&same, &e, now, false).comparisons[0];
        assert!(
            !c.reading.significant && !c.reading.worse && !c.reading.better,
            "{c:?}"
        );
    }

    /// `n` requests of `arm` whose prompts span 1 k to 30 k tokens (plus `longer`), each taking
    /// 0.1 ms a token, 0–19 ms of noise and `slower_ms` more.
    fn by_prompt(arm: &str, n: u64, longer: u64, slower_ms: u64) -> Vec<OutcomeRecord> {
        (0..n)
            .map(|i| {
                let prompt = 1_000 + (i * 7_919) % 29_000 + longer;
                OutcomeRecord {
                    arm: Some(format!("e/{arm}")),
                    pod: Some("p".into()),
                    model: None,
                    at_ms: 10 * HOUR_MS + i,
                    ttfb_ms: prompt / 10 + (i * 37) % 20 + slower_ms,
                    status: 200,
                    stream: true,
                    prompt_tokens: Some(prompt),
                    cached_tokens: Some(0),
                    prefix: None,
                }
            })
            .collect()
    }

    fn comparison_of(warm: &[OutcomeRecord], cold: &[OutcomeRecord]) -> Comparison {
        let e = running();
        let now = e.started_ms + HOUR_MS;
        let mut ledger = OutcomeLedger::default();
        ledger.ingest(warm, now, |_| false);
        ledger.ingest(cold, now, |_| false);
        report(&ledger, &e, now, false).comparisons[0].clone()
    }

    #[test]
    fn adjusting_for_prompt_length_finds_an_effect_the_prompts_spread_hides() {
        let c = comparison_of(
            &by_prompt("warm", 300, 0, 0),
            &by_prompt("cold", 300, 0, 40),
        );
        assert!(
            !c.reading.significant,
            "40 ms under ~840 ms of prompt spread: {c:?}"
        );
        let a = c.prompt_adjusted.expect("prompts differ in length");
        assert!(
            a.reading.significant && a.reading.worse && !a.reading.better,
            "{a:?}"
        );
        assert!((a.ttfb_mean_diff_ms - 40.0).abs() < 1.0, "{a:?}");
        assert!((a.ms_per_1k_prompt_tokens - 100.0).abs() < 1.0, "{a:?}");
        assert_eq!((a.requests, a.reference_requests), (300, 300));
    }

    #[test]
    fn an_arm_that_drew_the_longer_prompts_is_not_slower_once_adjusted() {
        let c = comparison_of(
            &by_prompt("warm", 300, 0, 0),
            &by_prompt("cold", 300, 3_000, 0),
        );
        assert!(
            c.reading.worse,
            "raw: 300 ms slower from its prompts alone: {c:?}"
        );
        let a = c.prompt_adjusted.expect("prompts differ in length");
        assert!(!a.reading.significant, "{a:?}");
        assert!(a.ttfb_mean_diff_ms.abs() < 1.0, "{a:?}");
    }

    #[test]
    fn an_arm_without_outcomes_reports_nothing_rather_than_zeros() {
        let e = running();
        let r = report(&OutcomeLedger::default(), &e, e.started_ms + 5, false);
        assert_eq!(r.arms[1].ttfb_p95_ms, None);
        assert_eq!(r.arms[1].error_rate, None);
        let c = &r.comparisons[0].reading;
        assert!(c.welch.is_none() && !c.significant);
        assert_eq!(r.comparisons[0].prompt_adjusted, None);
    }
}
