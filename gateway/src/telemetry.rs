//! The gateway's Prometheus metrics (prometheus-client), served at `/metrics`:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `prewarm_warmup_duration_seconds` | histogram | — (from warm-up start to first tier done) |
//! | `prewarm_health_round_seconds` | histogram | — (one health round: every pod's `/health` and `/metrics`, and every fifth round `/v1/models`, checked concurrently) |
//! | `prewarm_warmup_key_seconds` | histogram | `kind` (prefill / load / touch: each warm-up key's call, retries included) |
//! | `prewarm_warmup_key_errors_total` | counter | `pod` (prefills of a warm-up that failed) |
//! | `prewarm_prefills_total` | counter | `pod`, `outcome` (ok / unreachable / timeout / rejected / bad_reply) |
//! | `prewarm_prefill_shapes_total` | counter | `shape` (chat: a chat prefix sent with its messages, tools, kwargs and salt / completion / unshaped: a chat prefix known without its shape, sent as a completion of its canonical text, which caches nothing its traffic looks up) |
//! | `prewarm_adapter_loads_total` | counter | `pod`, `outcome` (ok / already / refused_manifest / error kinds) |
//! | `prewarm_adapter_unloads_total` | counter | `pod`, `outcome` |
//! | `prewarm_signals_ingested_total` | counter | `kind` (prefill / pin / feedback / rejected / dropped_by_filter) |
//! | `prewarm_routing_table_generation` | gauge | — |
//! | `prewarm_routing_table_pods` | gauge | — |
//! | `prewarm_routing_table_replies_total` | counter | `kind` (whole / delta / unchanged: what `GET /v1/routing` answered) |
//! | `prewarm_routing_table_reply_bytes_total` | counter | `kind` (whole / delta: the bodies' bytes) |
//! | `prewarm_modelled_hit_ratio` | gauge | `pod` (hot prefixes placed on the pod believed resident) |
//! | `prewarm_kv_model_hit_gap` | gauge | `pod` (modelled minus observed prefix-cache hit ratio over the last scrape interval) |
//! | `prewarm_policy_decisions_total` | counter | `policy`, `decision` (policy `pool`: `back_off` — an engine rejected an entry's warm call —, `backed_off` and `salt_dropped` — a prefill not sent) |
//! | `prewarm_snapshot_fallbacks_total` | counter | `reason` (previous_generation / none_usable / refused) |
//! | `prewarm_snapshots_written_total` | counter | `outcome` (ok / error / refused: the restore refused, see `state.on_unusable_snapshot`) |
//! | `prewarm_pods` | gauge | `state` (up / down / warming) |
//! | `prewarm_pod_restarts_total` | counter | `pod`, `evidence` (start_time: `process_start_time_seconds` changed / counters: a prefix-cache counter went down / kv_events: the engine's KV-cache events showed a new process or a cleared cache) — restarts of pods that were up, each re-warmed as a joining pod (`policy::fleet::restart`) |
//! | `prewarm_kv_event_batches_total` | counter | `pod`, `outcome` (applied / undecodable / missed: sequence numbers skipped / replayed: missed batches read again from the pod's replay socket / unknown_topic, pod `-`: a listener message naming no pod) — the pods' KV-cache event batches (`service::kv_events`) |
//! | `prewarm_kv_event_blocks_total` | counter | `pod`, `kind` (stored / removed: GPU blocks the events reported / offloaded: blocks of an offload tier / dropped: stores past the ledger's bound) |
//! | `prewarm_pod_engine_cached_blocks` | gauge | `pod` (GPU blocks the pod's KV-cache events say it holds; see `complete` in `GET /admin/pods`) |
//! | `prewarm_gold_pool_pods` | gauge | — (pods in the gold tier pool; 0: one pool for every tier) |
//! | `prewarm_adapter_auto_rollbacks_total` | counter | `reason` (inconsistent: a rollout left the holders on different versions; errors: more than 0.5 % of its requests erred during its watch) |
//! | `prewarm_experiment_arm_weight` | gauge | `experiment`, `arm` (the running experiment's arms' shares of the units) |
//! | `prewarm_experiment_ttfb_seconds` | histogram | `experiment`, `arm`, `cohort` (the time to first byte of each outcome record of the running experiment's arms, observed as it arrives; `cohort`: `all`, `new_pods` — served by pods that joined since the start — or `new_pods_first_requests` — their first requests of hot prefixes, `attribution::first_requests`; `_count` is the records' counter; the series go when the experiment ends) |
//! | `prewarm_experiment_report_requests` | gauge | `experiment`, `arm`, `cohort` (outcome records in the report: since the start, of the ledger's kept hours; recomputed at each scrape from the ledger, which a restart restores, so not a counter) |
//! | `prewarm_experiment_error_ratio` | gauge | `experiment`, `arm`, `cohort` (5xx and 429 over requests) |
//! | `prewarm_experiment_cached_token_ratio` | gauge | `experiment`, `arm`, `cohort` (cached over prompt tokens, of responses reporting both) |
//! | `prewarm_experiment_ttfb_mean_diff_seconds` | gauge | `experiment`, `arm`, `cohort` (the arm's mean time to first byte minus the first arm's) |
//! | `prewarm_experiment_ttfb_adjusted_mean_diff_seconds` | gauge | `experiment`, `arm`, `cohort` (the same, of times adjusted for prompt length: `attribution::report`) |
//! | `prewarm_experiment_p_value` | gauge | `experiment`, `arm`, `cohort`, `test` (welch / mann_whitney, against the first arm; welch_prompt_adjusted / mann_whitney_prompt_adjusted on the adjusted times) |
//! | `prewarm_experiment_release_step` | gauge | `experiment` (the grey release's step; -1: rolled back) |
//! | `prewarm_experiment_rollbacks_total` | counter | `experiment`, `arm`, `reason` (ttfb / errors / warmup) |
//! | `prewarm_embedding_reports_total` | counter | `kind` (added / hits / ignored / evicted: the filters' embedding-cache reports) |
//! | `prewarm_embedding_computations_total` | counter | `outcome` (ok / no_pod / failed / bad_reply: hot embedding inputs computed for the filters) |
//! | `prewarm_warm_embeddings` | gauge | — (embedding inputs kept for the filters' caches) |
//! | `prewarm_outcomes_ingested_total` | counter | `kind` (accepted / rejected: impossible / dropped: bounds / dropped_by_filter) |
//! | `prewarm_listener_connections` | gauge | `listener` (main / filter: connections open now) |
//! | `prewarm_listener_connection_cap` | gauge | `listener` (the most it holds open: `server::connections`) |
//! | `prewarm_listener_at_cap_total` | counter | `listener` (times it reached its cap and stopped accepting until a connection closed) |
//!
//! Latency is a histogram (aggregated with `histogram_quantile`), never a gauge of a quantile;
//! the `*_mean_diff_seconds` gauges are a statistic of the report (a difference of two means),
//! not a latency to aggregate. The series of every family labelled by `pod` go when the pod
//! leaves the fleet ([`Telemetry::forget_pod`]: removed through the admin API or by DNS
//! discovery), so an autoscaled fleet does not pile them up; a pod that is merely down keeps
//! them.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};

use prewarm_core::wire::OutcomeRecord;

use crate::attribution::report::{cohort_labels, ExperimentReport};
use crate::policy::fleet::RunningExperiment;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

mod families;
pub use families::{CounterFamily, PodFamily};

/// Bucket bounds of `prewarm_experiment_ttfb_seconds`, s. An LLM's time to first byte runs from
/// ~25 ms (a prefix-cache hit of a short prompt on an idle pod) to tens of seconds (a long
/// prompt prefilled cold behind a queue); what an experiment compares — a warm prefix against a
/// cold one — lies mostly between 50 ms and 3 s, so there the bounds are at most 1.5× apart
/// (`histogram_quantile` interpolates within a bucket: its error is bounded by the ratio), and
/// coarser beyond. 60 s is where clients and proxies time out; later ones fall in `+Inf`.
/// 21 series a (experiment, arm, cohort): at most 8 arms × 3 cohorts.
pub const TTFB_BUCKETS_SECONDS: [f64; 20] = [
    0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.45, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
    20.0, 30.0, 60.0,
];

fn ttfb_histogram() -> Histogram {
    Histogram::new(TTFB_BUCKETS_SECONDS)
}

/// Every metric the gateway exports.
pub struct Telemetry {
    registry: Registry,
    pub warmup_duration: Histogram,
    pub warmup_key_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    pub health_round_seconds: Histogram,
    pub warmup_key_errors: PodFamily<Counter>,
    pub prefills: PodFamily<Counter>,
    pub prefill_shapes: Family<Labels, Counter>,
    pub adapter_loads: PodFamily<Counter>,
    pub adapter_unloads: PodFamily<Counter>,
    pub signals: Family<Labels, Counter>,
    pub table_generation: Gauge,
    pub table_pods: Gauge,
    pub table_replies: Family<Labels, Counter>,
    pub table_reply_bytes: Family<Labels, Counter>,
    pub hit_ratio: PodFamily<Gauge<f64, AtomicU64>>,
    pub kv_hit_gap: PodFamily<Gauge<f64, AtomicU64>>,
    pub decisions: Family<Labels, Counter>,
    pub snapshot_fallbacks: Family<Labels, Counter>,
    pub snapshots_written: Family<Labels, Counter>,
    pub pods: Family<Labels, Gauge>,
    pub pod_restarts: PodFamily<Counter>,
    pub kv_event_batches: PodFamily<Counter>,
    pub kv_event_blocks: PodFamily<Counter>,
    pub engine_cached_blocks: PodFamily<Gauge>,
    pub auto_rollbacks: Family<Labels, Counter>,
    pub gold_pool_pods: Gauge,
    pub experiment_arm_weight: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_report_requests: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_ttfb: Family<Labels, Histogram, fn() -> Histogram>,
    /// The experiment whose arms `experiment_ttfb` holds (the last exported).
    ttfb_experiment: Mutex<Option<String>>,
    pub experiment_error_ratio: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_cached_ratio: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_p_value: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_ttfb_diff: Family<Labels, Gauge<f64, AtomicU64>>,
    pub experiment_ttfb_adjusted_diff: Family<Labels, Gauge<f64, AtomicU64>>,
    pub outcomes: Family<Labels, Counter>,
    pub embedding_reports: Family<Labels, Counter>,
    pub embedding_computations: Family<Labels, Counter>,
    pub warm_embeddings: Gauge,
    pub experiment_release_step: Family<Labels, Gauge>,
    pub experiment_rollbacks: Family<Labels, Counter>,
    pub listener_connections: Family<Labels, Gauge>,
    pub listener_connection_cap: Family<Labels, Gauge>,
    pub listener_at_cap: Family<Labels, Counter>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let warmup_duration = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        let t = Self {
            warmup_duration,
            health_round_seconds: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            warmup_key_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            warmup_key_errors: PodFamily::default(),
            prefills: PodFamily::default(),
            prefill_shapes: Family::default(),
            adapter_loads: PodFamily::default(),
            adapter_unloads: PodFamily::default(),
            signals: Family::default(),
            table_generation: Gauge::default(),
            table_pods: Gauge::default(),
            table_replies: Family::default(),
            table_reply_bytes: Family::default(),
            hit_ratio: PodFamily::default(),
            kv_hit_gap: PodFamily::default(),
            decisions: Family::default(),
            snapshot_fallbacks: Family::default(),
            snapshots_written: Family::default(),
            pods: Family::default(),
            pod_restarts: PodFamily::default(),
            kv_event_batches: PodFamily::default(),
            kv_event_blocks: PodFamily::default(),
            engine_cached_blocks: PodFamily::default(),
            auto_rollbacks: Family::default(),
            gold_pool_pods: Gauge::default(),
            experiment_arm_weight: Family::default(),
            experiment_report_requests: Family::default(),
            experiment_ttfb: Family::new_with_constructor(ttfb_histogram),
            ttfb_experiment: Mutex::new(None),
            experiment_error_ratio: Family::default(),
            experiment_cached_ratio: Family::default(),
            experiment_p_value: Family::default(),
            experiment_ttfb_diff: Family::default(),
            experiment_ttfb_adjusted_diff: Family::default(),
            embedding_reports: Family::default(),
            embedding_computations: Family::default(),
            warm_embeddings: Gauge::default(),
            outcomes: Family::default(),
            experiment_release_step: Family::default(),
            experiment_rollbacks: Family::default(),
            listener_connections: Family::default(),
            listener_connection_cap: Family::default(),
            listener_at_cap: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "prewarm_warmup_duration_seconds",
            "Seconds from a pod's warm-up start to its first tier done",
            t.warmup_duration.clone(),
        );
        registry.register(
            "prewarm_health_round_seconds",
            "Seconds one health round took (every pod checked concurrently)",
            t.health_round_seconds.clone(),
        );
        registry.register(
            "prewarm_warmup_key_seconds",
            "Seconds a warm-up key's call took (prefill, adapter load or touch), retries included",
            t.warmup_key_seconds.clone(),
        );
        registry.register(
            "prewarm_warmup_key_errors",
            "Warm-up prefills that failed",
            t.warmup_key_errors.family.clone(),
        );
        registry.register(
            "prewarm_prefills",
            "Prefills sent to pods by outcome",
            t.prefills.family.clone(),
        );
        registry.register(
            "prewarm_prefill_shapes",
            "Prefills sent to pods by the form they went in (chat, completion, unshaped)",
            t.prefill_shapes.clone(),
        );
        registry.register(
            "prewarm_adapter_loads",
            "Adapter loads by outcome",
            t.adapter_loads.family.clone(),
        );
        registry.register(
            "prewarm_adapter_unloads",
            "Adapter unloads by outcome",
            t.adapter_unloads.family.clone(),
        );
        registry.register(
            "prewarm_signals_ingested",
            "Signals received from filters by kind",
            t.signals.clone(),
        );
        registry.register(
            "prewarm_routing_table_generation",
            "Generation of the routing table served",
            t.table_generation.clone(),
        );
        registry.register(
            "prewarm_routing_table_pods",
            "Pods in the routing table",
            t.table_pods.clone(),
        );
        registry.register(
            "prewarm_routing_table_replies",
            "Routing table polls answered, by what they got (whole, delta, unchanged)",
            t.table_replies.clone(),
        );
        registry.register(
            "prewarm_routing_table_reply_bytes",
            "Bytes of routing table bodies sent, by kind (whole, delta)",
            t.table_reply_bytes.clone(),
        );
        registry.register(
            "prewarm_modelled_hit_ratio",
            "Share of the hot prefixes placed on a pod that the KV model believes resident",
            t.hit_ratio.family.clone(),
        );
        registry.register(
            "prewarm_kv_model_hit_gap",
            "Modelled minus observed prefix-cache hit ratio of a pod over the last scrape interval",
            t.kv_hit_gap.family.clone(),
        );
        registry.register(
            "prewarm_policy_decisions",
            "Decisions returned by the policies",
            t.decisions.clone(),
        );
        registry.register(
            "prewarm_snapshot_fallbacks",
            "Snapshot loads that could not use the current generation",
            t.snapshot_fallbacks.clone(),
        );
        registry.register(
            "prewarm_snapshots_written",
            "Snapshot writes by outcome",
            t.snapshots_written.clone(),
        );
        registry.register("prewarm_pods", "Pods by state", t.pods.clone());
        registry.register(
            "prewarm_pod_restarts",
            "Restarts of pods that were up (re-warmed as joining pods), by evidence",
            t.pod_restarts.family.clone(),
        );
        registry.register(
            "prewarm_kv_event_batches",
            "KV-cache event batches read from the pods, by outcome",
            t.kv_event_batches.family.clone(),
        );
        registry.register(
            "prewarm_kv_event_blocks",
            "Blocks the pods' KV-cache events reported, by kind",
            t.kv_event_blocks.family.clone(),
        );
        registry.register(
            "prewarm_pod_engine_cached_blocks",
            "GPU blocks the pod's KV-cache events say it holds",
            t.engine_cached_blocks.family.clone(),
        );
        registry.register(
            "prewarm_gold_pool_pods",
            "Pods in the gold tier pool (0: one pool for every tier)",
            t.gold_pool_pods.clone(),
        );
        registry.register(
            "prewarm_adapter_auto_rollbacks",
            "Adapter rollouts the gateway rolled back by itself, by reason",
            t.auto_rollbacks.clone(),
        );
        registry.register(
            "prewarm_experiment_arm_weight",
            "The running experiment's arms' shares of the units",
            t.experiment_arm_weight.clone(),
        );
        registry.register(
            "prewarm_experiment_report_requests",
            "Outcome records of each arm in the experiment's report (since the start, of the kept hours)",
            t.experiment_report_requests.clone(),
        );
        registry.register(
            "prewarm_experiment_ttfb_seconds",
            "Time to first byte of each arm's outcome records as they arrive",
            t.experiment_ttfb.clone(),
        );
        registry.register(
            "prewarm_experiment_error_ratio",
            "Share of each arm's requests answered 5xx or 429",
            t.experiment_error_ratio.clone(),
        );
        registry.register(
            "prewarm_experiment_cached_token_ratio",
            "Cached over prompt tokens of each arm's responses that report both",
            t.experiment_cached_ratio.clone(),
        );
        registry.register(
            "prewarm_experiment_ttfb_mean_diff_seconds",
            "Each arm's mean time to first byte minus the first arm's",
            t.experiment_ttfb_diff.clone(),
        );
        registry.register(
            "prewarm_experiment_ttfb_adjusted_mean_diff_seconds",
            "Each arm's mean time to first byte adjusted for prompt length minus the first arm's",
            t.experiment_ttfb_adjusted_diff.clone(),
        );
        registry.register(
            "prewarm_experiment_p_value",
            "p-value of each arm against the first, by test",
            t.experiment_p_value.clone(),
        );
        registry.register(
            "prewarm_experiment_release_step",
            "The running grey release's step (-1: rolled back)",
            t.experiment_release_step.clone(),
        );
        registry.register(
            "prewarm_experiment_rollbacks",
            "Grey releases the gateway rolled back, by reason",
            t.experiment_rollbacks.clone(),
        );
        registry.register(
            "prewarm_listener_connections",
            "Connections a listener holds open",
            t.listener_connections.clone(),
        );
        registry.register(
            "prewarm_listener_connection_cap",
            "The most connections a listener holds open",
            t.listener_connection_cap.clone(),
        );
        registry.register(
            "prewarm_listener_at_cap",
            "Times a listener reached its connection cap and stopped accepting",
            t.listener_at_cap.clone(),
        );
        registry.register(
            "prewarm_outcomes_ingested",
            "Outcome records from filters by what became of them",
            t.outcomes.clone(),
        );
        registry.register(
            "prewarm_embedding_reports",
            "Embedding inputs the filters reported, by what became of them",
            t.embedding_reports.clone(),
        );
        registry.register(
            "prewarm_embedding_computations",
            "Embedding inputs the gateway computed for the filters' caches, by outcome",
            t.embedding_computations.clone(),
        );
        registry.register(
            "prewarm_warm_embeddings",
            "Embedding inputs the gateway keeps for the filters' caches",
            t.warm_embeddings.clone(),
        );
        Self { registry, ..t }
    }

    /// Exports the arms of the running experiment and its report (`None`: none runs), and
    /// only those; the time-to-first-byte histogram keeps its series while the same experiment
    /// runs and loses them when it ends or another starts.
    pub fn set_experiment(&self, experiment: Option<(&RunningExperiment, &ExperimentReport)>) {
        {
            let id = experiment.map(|(r, _)| &r.definition.id);
            let mut held = self
                .ttfb_experiment
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if held.as_ref() != id {
                // Not on the first export after a start (nothing held yet): a restored
                // experiment's records observed before it stay.
                if held.is_some() {
                    self.experiment_ttfb.clear();
                }
                *held = id.cloned();
            }
        }
        let families = [
            &self.experiment_arm_weight,
            &self.experiment_report_requests,
            &self.experiment_error_ratio,
            &self.experiment_cached_ratio,
            &self.experiment_p_value,
            &self.experiment_ttfb_diff,
            &self.experiment_ttfb_adjusted_diff,
        ];
        for f in families {
            f.clear();
        }
        self.experiment_release_step.clear();
        let Some((running, report)) = experiment else {
            return;
        };
        let e = &running.definition;
        if let Some(state) = &running.release {
            let step = match state.rolled_back {
                Some(_) => -1,
                None => i64::try_from(state.step).unwrap_or(i64::MAX),
            };
            self.experiment_release_step
                .get_or_create(&labels(&[("experiment", e.id.as_str())]))
                .set(step);
        }
        let set = |family: &Family<Labels, Gauge<f64, AtomicU64>>, pairs: &[(&str, &str)], v| {
            family.get_or_create(&labels(pairs)).set(v);
        };
        for arm in &e.arms {
            let pairs = [("experiment", e.id.as_str()), ("arm", arm.name.as_str())];
            set(&self.experiment_arm_weight, &pairs, arm.weight);
        }
        // Every arm since the start (`all`), on the pods that joined since (`new_pods`: where a
        // warm-up setting acts) and on their first requests of hot prefixes.
        for view in report.cohorts() {
            let (cohort, arms, comparisons) = (view.name, view.arms, view.comparisons);
            for summary in arms {
                let pairs = [
                    ("experiment", e.id.as_str()),
                    ("arm", summary.arm.as_str()),
                    ("cohort", cohort),
                ];
                set(
                    &self.experiment_report_requests,
                    &pairs,
                    summary.requests as f64,
                );
                if let Some(r) = summary.error_rate {
                    set(&self.experiment_error_ratio, &pairs, r);
                }
                if let Some(r) = summary.cached_token_ratio {
                    set(&self.experiment_cached_ratio, &pairs, r);
                }
            }
            for c in comparisons {
                let pairs = [
                    ("experiment", e.id.as_str()),
                    ("arm", c.arm.as_str()),
                    ("cohort", cohort),
                ];
                if let Some(diff) = c.ttfb_mean_diff_ms {
                    set(&self.experiment_ttfb_diff, &pairs, diff / 1000.0);
                }
                let adjusted = c.prompt_adjusted.as_ref();
                if let Some(a) = adjusted {
                    set(
                        &self.experiment_ttfb_adjusted_diff,
                        &pairs,
                        a.ttfb_mean_diff_ms / 1000.0,
                    );
                }
                for (test, result) in [
                    ("welch", c.reading.welch),
                    ("mann_whitney", c.reading.mann_whitney),
                    (
                        "welch_prompt_adjusted",
                        adjusted.and_then(|a| a.reading.welch),
                    ),
                    (
                        "mann_whitney_prompt_adjusted",
                        adjusted.and_then(|a| a.reading.mann_whitney),
                    ),
                ] {
                    if let Some(r) = result {
                        let with_test = [pairs[0], pairs[1], pairs[2], ("test", test)];
                        set(&self.experiment_p_value, &with_test, r.p);
                    }
                }
            }
        }
    }

    /// Where the outcome records of `running`'s arms go in `prewarm_experiment_ttfb_seconds`
    /// (`None`: no experiment runs, nothing is observed).
    pub fn experiment_ttfb(&self, running: Option<&RunningExperiment>) -> ExperimentTtfb<'_> {
        let series = running.map_or_else(Vec::new, |r| {
            let id = r.definition.id.as_str();
            cohort_labels(r)
                .into_iter()
                .map(|(ledger_label, arm, cohort)| {
                    let pairs = [("experiment", id), ("arm", arm), ("cohort", cohort)];
                    (ledger_label, labels(&pairs))
                })
                .collect()
        });
        ExperimentTtfb {
            histogram: &self.experiment_ttfb,
            started_ms: running.map_or(u64::MAX, |r| r.started_ms),
            series,
        }
    }

    /// Removes the series of `pod` from every family labelled by `pod`: it left the fleet.
    pub fn forget_pod(&self, pod: &str) {
        for family in [
            &self.warmup_key_errors,
            &self.prefills,
            &self.adapter_loads,
            &self.adapter_unloads,
            &self.pod_restarts,
            &self.kv_event_batches,
            &self.kv_event_blocks,
        ] {
            family.forget(pod);
        }
        self.engine_cached_blocks.forget(pod);
        self.hit_ratio.forget(pod);
        self.kv_hit_gap.forget(pod);
    }

    /// Counts one event in a labelled counter family.
    pub fn count(family: &impl CounterFamily, pairs: &[(&str, &str)]) {
        family.inc_by(&labels(pairs), 1);
    }

    /// Adds `n` to a labelled counter.
    pub fn add(family: &impl CounterFamily, pairs: &[(&str, &str)], n: u64) {
        family.inc_by(&labels(pairs), n);
    }

    pub fn set_hit_ratio(&self, pod: &str, ratio: f64) {
        self.hit_ratio.with(&labels(&[("pod", pod)]), |g| {
            g.set(ratio);
        });
    }

    pub fn set_kv_hit_gap(&self, pod: &str, gap: f64) {
        self.kv_hit_gap.with(&labels(&[("pod", pod)]), |g| {
            g.set(gap);
        });
    }

    pub fn set_engine_cached_blocks(&self, pod: &str, blocks: usize) {
        self.engine_cached_blocks
            .with(&labels(&[("pod", pod)]), |g| {
                g.set(i64::try_from(blocks).unwrap_or(i64::MAX));
            });
    }

    pub fn set_pods(&self, state: &str, n: i64) {
        self.pods.get_or_create(&labels(&[("state", state)])).set(n);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The running experiment's series of `prewarm_experiment_ttfb_seconds`, by the ledger label
/// a record counts under ([`crate::attribution::ledger::OutcomeLedger::ingest_observed`]).
pub struct ExperimentTtfb<'a> {
    histogram: &'a Family<Labels, Histogram, fn() -> Histogram>,
    started_ms: u64,
    /// (ledger label, its series' labels): at most 8 arms × 3 cohorts.
    series: Vec<(String, Labels)>,
}

impl ExperimentTtfb<'_> {
    /// Observes `record`'s time to first byte under `ledger_label`'s series, if it is one of
    /// the running experiment's arms (a label from elsewhere — no arm, a past experiment —
    /// creates no series) and was measured since the start, as the report counts.
    pub fn observe(&self, ledger_label: &str, record: &OutcomeRecord) {
        if record.at_ms < self.started_ms {
            return;
        }
        if let Some((_, pairs)) = self.series.iter().find(|(l, _)| l == ledger_label) {
            self.histogram
                .get_or_create(pairs)
                .observe(record.ttfb_ms as f64 / 1000.0);
        }
    }
}

#[cfg(test)]
mod tests;
