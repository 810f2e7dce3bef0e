//! Labelled families the gateway's metrics are made of: [`PodFamily`], a family whose series of a
//! pod can go when the pod leaves, and [`CounterFamily`], what counting takes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::Labels;

/// A family labelled by `pod` that knows each pod's label sets, so that a pod's series can go
/// when it leaves the fleet (prometheus-client's `Family` removes a label set it is given and
/// cannot list them). Every family with a `pod` label is one.
pub struct PodFamily<M> {
    pub(super) family: Family<Labels, M>,
    by_pod: Arc<Mutex<HashMap<String, HashSet<Labels>>>>,
}

impl<M: Default> Default for PodFamily<M> {
    fn default() -> Self {
        Self {
            family: Family::default(),
            by_pod: Arc::default(),
        }
    }
}

impl<M: Default> PodFamily<M> {
    /// Runs `f` on the series of `labels` (created when new), noted under its `pod` label.
    pub fn with(&self, labels: &Labels, f: impl FnOnce(&M)) {
        // Noted and created under one lock, so that `forget` never misses a series.
        let mut by_pod = self.by_pod.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, pod)) = labels.iter().find(|(k, _)| k == "pod") {
            let sets = by_pod.entry(pod.clone()).or_default();
            if !sets.contains(labels) {
                sets.insert(labels.clone());
            }
        }
        f(&self.family.get_or_create(labels));
    }

    /// Removes every series of `pod`.
    pub(super) fn forget(&self, pod: &str) {
        let mut by_pod = self.by_pod.lock().unwrap_or_else(PoisonError::into_inner);
        for labels in by_pod.remove(pod).unwrap_or_default() {
            self.family.remove(&labels);
        }
    }
}

/// A labelled counter family, with or without a `pod` label: what [`Telemetry::count`] and
/// [`Telemetry::add`] take.
pub trait CounterFamily {
    fn inc_by(&self, labels: &Labels, n: u64);
}

impl CounterFamily for Family<Labels, Counter> {
    fn inc_by(&self, labels: &Labels, n: u64) {
        self.get_or_create(labels).inc_by(n);
    }
}

impl CounterFamily for PodFamily<Counter> {
    fn inc_by(&self, labels: &Labels, n: u64) {
        self.with(labels, |c| {
            c.inc_by(n);
        });
    }
}
