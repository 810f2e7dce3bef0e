//! Telling a restarted pod from one that kept running. A pod that restarts between two health
//! checks, or within fewer failed checks than `pods.unhealthy_after` (Kubernetes restarts a
//! container in seconds; a rolling restart keeps the address), is never seen down, yet it lost
//! its prefix cache and its runtime-loaded adapters. Left alone, the gateway would keep routing
//! to it as if warm while its KV and LoRA models believe in what it no longer holds.
//!
//! **The rule.** A pod that was up restarted when its `/metrics` scrape, compared with the last
//! one that carried the same value, shows
//! 1. a different process start time (`process_start_time_seconds`, the Prometheus client's
//!    standard process metric, which vLLM's API server exports when it runs one API server: a
//!    new process has a new start time) — evidence `start_time`; or else
//! 2. a prefix-cache counter (`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
//!    summed over their label sets) lower than before — evidence `counters`: counters only grow
//!    within one process, and a new process starts them at 0; or else
//! 3. the pod's KV-cache events showed its cache lost since the last scrape (a clear, or a
//!    sequence that went back: [`super::engine_blocks`]) — evidence `kv_events`, read at this
//!    scrape whatever the scrape shows (a reset cache leaves start time and counters as they
//!    were).
//!
//! A restart is then handled as the pod's return from down: a new epoch, its KV and LoRA
//! models forgotten, out of the routing table until its warm-up's first tier is done
//! ([`super::Fleet::on_check`] returns [`super::HealthChange::Joined`], and the shell reconciles
//! `/v1/models` and starts the warm-up as for any join).
//!
//! **Not evidence.** The first scrape of a pod (after the gateway or the pod was added) sets the
//! baseline: there is nothing to compare. A check that failed, or answered without `/metrics`,
//! or a scrape without one of the values, compares nothing and keeps the last values seen (so a
//! restart spanning a few failed checks is still caught by the next good one). Equal values are
//! the same process. A pod that was down, or never up, joins anyway: its values only become the
//! baseline. An adapter missing from `/v1/models` is not used: vLLM keeps an adapter's name
//! registered until it is unloaded, so a missing one is a restart *or* an unload by someone else
//! (an operator, another gateway); a restart shows in the start time or the counters anyway.
//!
//! **Assumptions.** The address reaches one engine process (not a Service balancing several: its
//! start times and counters would interleave). Counters may miss a restart when the new process
//! counted more tokens before its first scrape than the old one had in all (a pod restarted
//! under heavy traffic just after a quiet start); the start time does not, where it is exported.
//! vLLM with `--api-server-count` > 1 (Prometheus multiprocess mode) and SGLang (always in
//! multiprocess mode) export no process metrics; SGLang's counters are not read by the gateway,
//! so a quick SGLang restart is still caught only by its failed checks.
//!
//! Tests: the rule in this module's, named after what it holds; the fleet's handling in
//! `restart_tests.rs` (a restarted pod is warmed before it routes again, the first scrape is a
//! baseline, a changed start time is a restart, a restart within failed checks is caught, a pod
//! back from down joins once, a warm call of the old life does not warm the new one).

use serde::Serialize;

use super::pod::PodLoad;

/// What showed that a pod restarted (`prewarm_pod_restarts_total{evidence}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartEvidence {
    /// `process_start_time_seconds` changed.
    StartTime,
    /// A prefix-cache counter went down.
    Counters,
    /// The engine's KV-cache events showed a new process or a cleared cache
    /// ([`super::engine_blocks`]).
    KvEvents,
}

impl RestartEvidence {
    pub fn label(self) -> &'static str {
        match self {
            RestartEvidence::StartTime => "start_time",
            RestartEvidence::Counters => "counters",
            RestartEvidence::KvEvents => "kv_events",
        }
    }
}

/// The last values of a pod's scrapes that identify its process, and the restarts they showed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestartWatch {
    /// `process_start_time_seconds` of the last scrape that had it, unix seconds.
    start_time_s: Option<f64>,
    queries: Option<u64>,
    hits: Option<u64>,
    /// Restarts of the pod detected while it was up (since the gateway started).
    restarts: u64,
    /// The engine's KV-cache events showed the cache lost since the last scrape.
    cache_lost: bool,
}

impl RestartWatch {
    /// The process start time last seen, unix seconds.
    pub fn start_time_s(&self) -> Option<f64> {
        self.start_time_s
    }

    /// The engine's KV-cache events showed the cache lost (a new process, or a clear): the next
    /// scrape of a pod that is up is a restart whatever it shows.
    pub(super) fn note_cache_lost(&mut self) {
        self.cache_lost = true;
    }

    /// Restarts detected while the pod was up, since the gateway started.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Compares a successful scrape with the values last seen and keeps its own: whether they
    /// show a restart of a pod that was `up` (see the module docs; counted). Values the scrape
    /// lacks keep their last ones.
    pub(super) fn observe(
        &mut self,
        up: bool,
        start_time_s: Option<f64>,
        load: &PodLoad,
    ) -> Option<RestartEvidence> {
        // A start time that is not a finite number is no start time.
        let start_time_s = start_time_s.filter(|s| s.is_finite());
        let new_process = matches!((self.start_time_s, start_time_s), (Some(a), Some(b)) if a != b);
        let went_down = |last: Option<u64>, now: Option<u64>| matches!((last, now), (Some(l), Some(n)) if n < l);
        let counters_down = went_down(self.queries, load.prefix_cache_queries)
            || went_down(self.hits, load.prefix_cache_hits);
        self.start_time_s = start_time_s.or(self.start_time_s);
        self.queries = load.prefix_cache_queries.or(self.queries);
        self.hits = load.prefix_cache_hits.or(self.hits);
        let cache_lost = std::mem::take(&mut self.cache_lost);
        let evidence = if !up {
            // a pod coming back from down (or never up) joins anyway: only a new baseline
            None
        } else if new_process {
            Some(RestartEvidence::StartTime)
        } else if counters_down {
            Some(RestartEvidence::Counters)
        } else if cache_lost {
            Some(RestartEvidence::KvEvents)
        } else {
            None
        };
        if evidence.is_some() {
            self.restarts = self.restarts.saturating_add(1);
        }
        evidence
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(q: Option<u64>, h: Option<u64>) -> PodLoad {
        PodLoad {
            prefix_cache_queries: q,
            prefix_cache_hits: h,
            ..PodLoad::default()
        }
    }

    #[test]
    fn nothing_to_compare_is_no_restart() {
        let mut w = RestartWatch::default();
        assert_eq!(
            w.observe(true, Some(100.0), &load(Some(500), Some(10))),
            None
        );
        // a scrape without the values compares nothing and forgets nothing
        assert_eq!(w.observe(true, None, &load(None, None)), None);
        assert_eq!(
            w.observe(true, None, &load(Some(0), Some(0))),
            Some(RestartEvidence::Counters),
            "still compared with the last values seen"
        );
    }

    #[test]
    fn equal_or_growing_values_are_the_same_process() {
        let mut w = RestartWatch::default();
        for (q, h) in [(0, 0), (0, 0), (10, 0), (10, 0), (30, 20)] {
            assert_eq!(w.observe(true, Some(100.25), &load(Some(q), Some(h))), None);
        }
    }

    #[test]
    fn either_counter_going_down_is_a_restart() {
        let mut w = RestartWatch::default();
        w.observe(true, None, &load(Some(100), Some(50)));
        assert_eq!(
            w.observe(true, None, &load(Some(120), Some(0))),
            Some(RestartEvidence::Counters)
        );
        assert_eq!(w.observe(true, None, &load(Some(150), Some(10))), None);
        assert_eq!(
            w.observe(true, None, &load(Some(5), Some(10))),
            Some(RestartEvidence::Counters)
        );
    }

    #[test]
    fn a_new_start_time_is_a_restart_whatever_the_counters_say() {
        let mut w = RestartWatch::default();
        w.observe(true, Some(100.0), &load(Some(10), Some(0)));
        assert_eq!(
            w.observe(true, Some(160.5), &load(Some(900), Some(400))),
            Some(RestartEvidence::StartTime)
        );
        assert_eq!(w.start_time_s(), Some(160.5));
        assert_eq!(
            w.observe(true, Some(f64::NAN), &load(Some(900), Some(400))),
            None
        );
        assert_eq!(w.start_time_s(), Some(160.5));
        assert_eq!(w.restarts(), 1);
    }

    #[test]
    fn a_cache_the_events_showed_lost_is_a_restart_at_the_next_scrape_of_an_up_pod() {
        let mut w = RestartWatch::default();
        w.observe(true, Some(100.0), &load(Some(10), Some(0)));
        w.note_cache_lost();
        assert_eq!(
            w.observe(true, Some(100.0), &load(Some(20), Some(5))),
            Some(RestartEvidence::KvEvents),
            "same process, growing counters: only the events show it"
        );
        assert_eq!(
            w.observe(true, Some(100.0), &load(Some(30), Some(5))),
            None,
            "once"
        );
        w.note_cache_lost();
        assert_eq!(
            w.observe(true, Some(200.0), &load(Some(0), Some(0))),
            Some(RestartEvidence::StartTime),
            "the scrape's own evidence names it first"
        );
        w.note_cache_lost();
        assert_eq!(
            w.observe(false, None, &load(None, None)),
            None,
            "a pod not up joins anyway"
        );
        assert_eq!(
            w.observe(true, None, &load(None, None)),
            None,
            "and the note is spent"
        );
        assert_eq!(w.restarts(), 2);
    }

    #[test]
    fn a_pod_that_was_not_up_only_takes_a_new_baseline() {
        let mut w = RestartWatch::default();
        w.observe(true, Some(100.0), &load(Some(500), Some(100)));
        assert_eq!(w.observe(false, Some(200.0), &load(Some(0), Some(0))), None);
        assert_eq!(w.restarts(), 0);
        assert_eq!(w.observe(true, Some(200.0), &load(Some(0), Some(0))), None);
    }
}
