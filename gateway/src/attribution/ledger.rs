//! The outcome ledger: the filters' outcome records summed per hour and per arm label
//! (`<experiment>/<arm>`, or none outside an experiment). Each bucket keeps exact counts and
//! moments, the co-moments of prompt tokens and time to first byte (for the report's adjustment
//! for prompt length), and a bounded uniform sample of the times to first byte with each one's
//! prompt tokens (reservoir sampling, [`SAMPLE_CAP`] values), which the quantiles and the
//! Mann-Whitney test read. Memory is bounded: [`HOURS_KEPT`] hours × [`MAX_LABELS`] labels × the
//! sample (12 bytes a value: at most 75 MB if every hour of every label filled it). A record of
//! an arm served by a new pod also counts under the arm's new-pods label, and, when it is the
//! pod's first request of a hot prefix ([`PrefixHistory`]), under the arm's first-requests label.
//! The ledger and its prefix history go into the snapshot, so a restart keeps an experiment's
//! evidence; a restored one is cut to the same bounds ([`OutcomeLedger::bounded`]).

use std::collections::BTreeMap;

use prewarm_core::wire::OutcomeRecord;
use serde::{Deserialize, Serialize};

use super::first_requests::PrefixHistory;
use super::report::{first_requests_label, new_pods_label};
use super::stats::{CoMoments, Moments};
use crate::error_rate::is_error;

/// Hours of buckets kept (older ones are dropped).
pub const HOURS_KEPT: u64 = 48;
/// Distinct labels an hour holds (an experiment has at most 8 arms, each also on its new pods and
/// on their first requests of hot prefixes, plus records without one); records of further labels
/// are dropped, counted.
pub const MAX_LABELS: usize = 32;
/// Times to first byte a bucket samples.
pub const SAMPLE_CAP: usize = 4096;
/// One hour, ms.
pub const HOUR_MS: u64 = 3_600_000;

/// The outcomes of one label in one hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub requests: u64,
    pub errors: u64,
    /// Time to first byte, ms, of every request.
    pub ttfb: Moments,
    /// A uniform sample of the times to first byte, ms.
    pub sample: Vec<f64>,
    /// The prompt tokens of each of [`Self::sample`]'s requests, where its response reported
    /// them (same index, same reservoir slot).
    #[serde(default)]
    pub sample_prompt_tokens: Vec<Option<u32>>,
    /// (prompt tokens, time to first byte ms) of every request whose response reported its
    /// prompt tokens: the report's adjustment for prompt length reads them.
    #[serde(default)]
    pub by_prompt: CoMoments,
    /// Requests whose response reported both prompt and cached tokens, and their sums.
    pub with_usage: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The reservoir's generator state.
    #[serde(skip)]
    rng: u64,
}

impl Bucket {
    fn add(&mut self, r: &OutcomeRecord) {
        self.requests += 1;
        self.errors += u64::from(is_error(r.status));
        let ttfb = r.ttfb_ms as f64;
        self.ttfb.push(ttfb);
        // a record's prompt is at most 10 M tokens (`OutcomeRecord::problem`)
        let prompt = r.prompt_tokens.and_then(|p| u32::try_from(p).ok());
        if let Some(p) = prompt {
            self.by_prompt.push(f64::from(p), ttfb);
        }
        self.align_sample();
        if self.sample.len() < SAMPLE_CAP {
            self.sample.push(ttfb);
            self.sample_prompt_tokens.push(prompt);
        } else {
            let slot = self.next_random() % self.ttfb.n;
            if let Some(i) = usize::try_from(slot)
                .ok()
                .filter(|i| *i < self.sample.len())
            {
                self.sample[i] = ttfb;
                self.sample_prompt_tokens[i] = prompt;
            }
        }
        if let (Some(p), Some(c)) = (r.prompt_tokens, r.cached_tokens) {
            self.with_usage += 1;
            self.prompt_tokens = self.prompt_tokens.saturating_add(p);
            self.cached_tokens = self.cached_tokens.saturating_add(c);
        }
    }

    /// Keeps the prompt tokens one-to-one with the sample (a snapshot from before they were
    /// kept has none: those values count as without usage).
    fn align_sample(&mut self) {
        self.sample_prompt_tokens.resize(self.sample.len(), None);
    }

    /// The sample's (time to first byte, prompt tokens) pairs of the requests that reported
    /// their prompt tokens.
    pub fn sample_with_prompt(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.sample
            .iter()
            .zip(&self.sample_prompt_tokens)
            .filter_map(|(t, p)| p.map(|p| (*t, f64::from(p))))
    }

    /// xorshift64*: a fixed sequence per bucket, so a replay samples the same values.
    fn next_random(&mut self) -> u64 {
        if self.rng == 0 {
            self.rng = 0x9E37_79B9_7F4A_7C15;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Both buckets as one (the sample is the two samples together).
    pub fn merge(&mut self, other: &Bucket) {
        self.requests += other.requests;
        self.errors += other.errors;
        self.ttfb.merge(&other.ttfb);
        self.by_prompt.merge(&other.by_prompt);
        self.align_sample();
        self.sample.extend_from_slice(&other.sample);
        self.sample_prompt_tokens.extend(
            (0..other.sample.len()).map(|i| other.sample_prompt_tokens.get(i).copied().flatten()),
        );
        self.with_usage += other.with_usage;
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
    }
}

/// What an ingest did with a batch's records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ingested {
    pub accepted: u64,
    /// Impossible records (`OutcomeRecord::problem`) or from too far in the future.
    pub rejected: u64,
    /// Records of a label beyond [`MAX_LABELS`] in their hour, or older than the kept hours.
    pub dropped: u64,
}

/// Buckets by hour start and label (`""` for no arm).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutcomeLedger {
    hours: BTreeMap<u64, BTreeMap<String, Bucket>>,
    /// The prefixes seen, for the new pods' first requests of hot prefixes.
    #[serde(default)]
    prefixes: PrefixHistory,
}

impl OutcomeLedger {
    /// Adds `records` received at `now_ms`; a record with an arm served by a pod for which
    /// `new_pod` holds also counts under its arm's new-pods label (`report::new_pods_label`).
    pub fn ingest(
        &mut self,
        records: &[OutcomeRecord],
        now_ms: u64,
        new_pod: impl Fn(&str) -> bool,
    ) -> Ingested {
        self.ingest_observed(records, now_ms, new_pod, |_, _| {})
    }

    /// [`Self::ingest`], calling `counted` with each label a record was counted under and the
    /// record (the gateway's time-to-first-byte histogram observes the same cohorts).
    pub fn ingest_observed(
        &mut self,
        records: &[OutcomeRecord],
        now_ms: u64,
        new_pod: impl Fn(&str) -> bool,
        mut counted: impl FnMut(&str, &OutcomeRecord),
    ) -> Ingested {
        let mut done = Ingested::default();
        let oldest = (now_ms / HOUR_MS).saturating_sub(HOURS_KEPT - 1) * HOUR_MS;
        for r in records {
            // a filter's clock a minute ahead is tolerated, not more
            if r.problem().is_some() || r.at_ms > now_ms.saturating_add(60_000) {
                done.rejected += 1;
                continue;
            }
            let hour = r.at_ms / HOUR_MS * HOUR_MS;
            if hour < oldest {
                done.dropped += 1;
                continue;
            }
            let labels = self.hours.entry(hour).or_default();
            let label = r.arm.as_deref().unwrap_or("");
            if !labels.contains_key(label) && labels.len() >= MAX_LABELS {
                done.dropped += 1;
                continue;
            }
            labels.entry(label.to_string()).or_default().add(r);
            counted(label, r);
            done.accepted += 1;
            let on_new_pod = r.pod.as_deref().is_some_and(&new_pod);
            let first = self.prefixes.note(r.pod.as_deref(), r.prefix, on_new_pod);
            if let Some(arm) = r.arm.as_deref().filter(|_| on_new_pod) {
                let cohorts = [
                    Some(new_pods_label(arm)),
                    first.then(|| first_requests_label(arm)),
                ];
                for cohort in cohorts.into_iter().flatten() {
                    if labels.contains_key(&cohort) || labels.len() < MAX_LABELS {
                        labels.entry(cohort.clone()).or_default().add(r);
                        counted(&cohort, r);
                    }
                }
            }
        }
        while self
            .hours
            .first_key_value()
            .is_some_and(|(h, _)| *h < oldest)
        {
            self.hours.pop_first();
        }
        done
    }

    /// The ledger within its bounds at `now_ms` (a restored snapshot's): hours kept, labels an
    /// hour, sample size.
    pub fn bounded(mut self, now_ms: u64) -> Self {
        self.prefixes = self.prefixes.bounded();
        let oldest = (now_ms / HOUR_MS).saturating_sub(HOURS_KEPT - 1) * HOUR_MS;
        self.hours.retain(|hour, _| *hour >= oldest);
        for labels in self.hours.values_mut() {
            while labels.len() > MAX_LABELS {
                labels.pop_last();
            }
            for bucket in labels.values_mut() {
                bucket.sample.truncate(SAMPLE_CAP);
                bucket.align_sample();
            }
        }
        self
    }

    /// The buckets of `label` from `from_ms` (inclusive) to `to_ms` (exclusive), hour by
    /// hour, with their hour's start.
    pub fn hours_of<'a>(
        &'a self,
        label: &'a str,
        from_ms: u64,
        to_ms: u64,
    ) -> impl Iterator<Item = (u64, &'a Bucket)> + 'a {
        let from_hour = from_ms / HOUR_MS * HOUR_MS;
        self.hours
            .range(from_hour..to_ms.max(from_hour))
            .filter_map(move |(h, labels)| labels.get(label).map(|b| (*h, b)))
    }

    /// The buckets of `label` over `[from_ms, to_ms)` as one.
    pub fn total(&self, label: &str, from_ms: u64, to_ms: u64) -> Bucket {
        let mut total = Bucket::default();
        for (_, b) in self.hours_of(label, from_ms, to_ms) {
            total.merge(b);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(arm: Option<&str>, at_ms: u64, ttfb_ms: u64, status: u16) -> OutcomeRecord {
        OutcomeRecord {
            arm: arm.map(str::to_string),
            pod: None,
            model: None,
            at_ms,
            ttfb_ms,
            status,
            stream: false,
            prompt_tokens: Some(100),
            cached_tokens: Some(40),
            prefix: None,
        }
    }

    /// A prefix seen twice (before the experiment, on an old pod) is hot: an arm's first
    /// request of it on a new pod counts under the arm's first-requests label as well, its
    /// second there does not, nor does an old pod's.
    #[test]
    fn a_new_pods_first_request_of_a_hot_prefix_is_counted_apart() {
        let mut l = OutcomeLedger::default();
        let now = 10 * HOUR_MS;
        let of = |arm: Option<&str>, pod: &str, ttfb: u64| OutcomeRecord {
            pod: Some(pod.into()),
            prefix: Some(prewarm_core::BlockHash(42)),
            ..record(arm, now - 100 + ttfb, ttfb, 200)
        };
        l.ingest(
            &[
                of(None, "old", 1),
                of(Some("e/a"), "old", 2),
                of(Some("e/a"), "new", 30),
                of(Some("e/a"), "new", 4),
                of(Some("e/b"), "old", 5),
            ],
            now,
            |pod| pod == "new",
        );
        let count = |label: &str| l.total(label, 0, now + 1).requests;
        assert_eq!(count("e/a"), 3);
        assert_eq!(count("e/a@new"), 2);
        assert_eq!(count("e/a@new-first"), 1);
        assert_eq!(l.total("e/a@new-first", 0, now + 1).ttfb.mean, 30.0);
        assert_eq!(count("e/b@new-first"), 0);
        let json = serde_json::to_string(&l).unwrap();
        let mut back: OutcomeLedger = serde_json::from_str(&json).unwrap();
        back.ingest(&[of(Some("e/a"), "new", 6)], now, |pod| pod == "new");
        assert_eq!(
            back.total("e/a@new-first", 0, now + 1).requests,
            1,
            "a restart remembers what the pod served"
        );
    }

    #[test]
    fn records_land_in_their_hour_and_label_with_exact_sums() {
        let mut l = OutcomeLedger::default();
        let now = 10 * HOUR_MS + 5;
        let got = l.ingest(
            &[
                record(Some("e/a"), now - 1, 100, 200),
                record(Some("e/a"), now - 2, 300, 503),
                record(None, now - HOUR_MS, 50, 200),
                OutcomeRecord {
                    pod: Some("p-new".into()),
                    ..record(Some("e/a"), now - 3, 20, 200)
                },
            ],
            now,
            |pod| pod == "p-new",
        );
        assert_eq!(got.accepted, 4);
        let on_new = l.total("e/a@new", 0, now + 1);
        assert_eq!(
            (on_new.requests, on_new.ttfb.mean),
            (1, 20.0),
            "also on the new pods"
        );
        let a = l.total("e/a", 0, now + 1);
        assert_eq!((a.requests, a.errors, a.ttfb.mean), (3, 1, 140.0));
        assert_eq!(
            (a.with_usage, a.prompt_tokens, a.cached_tokens),
            (3, 300, 120)
        );
        let hours: Vec<u64> = l.hours_of("", 0, now).map(|(h, _)| h).collect();
        assert_eq!(hours, vec![9 * HOUR_MS]);
        assert_eq!(
            l.total("e/a", 0, 10 * HOUR_MS).requests,
            0,
            "to is exclusive"
        );
    }

    #[test]
    fn impossible_future_and_ancient_records_are_not_counted() {
        let mut l = OutcomeLedger::default();
        let now = 100 * HOUR_MS;
        let got = l.ingest(
            &[
                record(None, now, 10, 99),
                record(None, now + 3_600_000, 10, 200),
                record(None, now - HOURS_KEPT * HOUR_MS, 10, 200),
                record(None, now, 10, 200),
            ],
            now,
            |_| true,
        );
        assert_eq!(
            got,
            Ingested {
                accepted: 1,
                rejected: 2,
                dropped: 1
            }
        );
    }

    #[test]
    fn memory_is_bounded_in_labels_samples_and_hours() {
        let mut l = OutcomeLedger::default();
        let mut now = 0;
        for hour in 0..(HOURS_KEPT + 5) {
            now = hour * HOUR_MS + 1;
            let records: Vec<OutcomeRecord> = (0..(MAX_LABELS + 3))
                .map(|i| record(Some(&format!("e/{i}")), now, 5, 200))
                .collect();
            let got = l.ingest(&records, now, |_| false);
            assert_eq!(got.dropped, 3);
        }
        assert_eq!(l.hours.len() as u64, HOURS_KEPT);
        let many: Vec<OutcomeRecord> = (0..(SAMPLE_CAP as u64 * 3))
            .map(|i| record(Some("e/0"), now, i, 200))
            .collect();
        l.ingest(&many, now, |_| false);
        let b = l.total("e/0", now, now + 1);
        assert_eq!(b.sample.len(), SAMPLE_CAP);
        assert_eq!(b.requests, SAMPLE_CAP as u64 * 3 + 1);
        // the reservoir stays uniform: its mean is near the stream's
        let mean = b.sample.iter().sum::<f64>() / b.sample.len() as f64;
        assert!(
            (mean - b.ttfb.mean).abs() < 0.05 * b.ttfb.mean,
            "{mean} vs {}",
            b.ttfb.mean
        );
    }

    #[test]
    fn a_sampled_time_keeps_its_own_prompt_tokens_through_the_reservoir_and_old_snapshots() {
        let mut l = OutcomeLedger::default();
        let now = 10 * HOUR_MS;
        // time i has prompt i + 1, or none for odd i
        let many: Vec<OutcomeRecord> = (0..(SAMPLE_CAP as u64 * 3))
            .map(|i| OutcomeRecord {
                prompt_tokens: i.is_multiple_of(2).then_some(i + 1),
                cached_tokens: None,
                ..record(Some("e/a"), now, i, 200)
            })
            .collect();
        l.ingest(&many, now, |_| false);
        let b = l.total("e/a", 0, now + 1);
        assert_eq!(b.sample_prompt_tokens.len(), b.sample.len());
        for (t, p) in b.sample.iter().zip(&b.sample_prompt_tokens) {
            let t = *t as u64;
            assert_eq!(*p, t.is_multiple_of(2).then_some(t as u32 + 1), "time {t}");
        }
        assert_eq!(b.by_prompt.n, SAMPLE_CAP as u64 * 3 / 2);
        assert_eq!(
            b.sample_with_prompt().count(),
            b.sample_prompt_tokens.iter().flatten().count()
        );

        // a snapshot from before prompt tokens were sampled: its times count as without usage
        let mut json = serde_json::to_value(&l).unwrap();
        let bucket = &mut json["hours"][(now).to_string()]["e/a"];
        bucket
            .as_object_mut()
            .unwrap()
            .remove("sample_prompt_tokens");
        bucket.as_object_mut().unwrap().remove("by_prompt");
        let mut old: OutcomeLedger = serde_json::from_value(json).unwrap();
        old.ingest(&many[..4], now, |_| false);
        let b = old.total("e/a", 0, now + 1);
        assert_eq!(b.sample_prompt_tokens.len(), b.sample.len());
        assert!(
            b.sample_with_prompt().count() <= 2,
            "only the new records' prompts"
        );
    }

    #[test]
    fn a_ledger_survives_its_json_and_a_restored_one_is_cut_to_the_bounds() {
        let mut l = OutcomeLedger::default();
        let now = 200 * HOUR_MS;
        l.ingest(&[record(Some("e/a"), now - 5, 70, 200)], now, |_| false);
        let json = serde_json::to_string(&l).unwrap();
        let back: OutcomeLedger = serde_json::from_str(&json).unwrap();
        let b = back.total("e/a", 0, now + 1);
        assert_eq!(
            (b.requests, b.ttfb.mean, b.sample.clone()),
            (1, 70.0, vec![70.0])
        );

        let mut big = back.clone();
        let hour = 199 * HOUR_MS;
        let labels = big.hours.get_mut(&hour).unwrap();
        labels.get_mut("e/a").unwrap().sample = vec![1.0; SAMPLE_CAP * 2];
        for i in 0..MAX_LABELS * 2 {
            labels.insert(format!("z{i}"), Bucket::default());
        }
        big.hours.insert(HOUR_MS, BTreeMap::new());
        let cut = big.bounded(now);
        assert_eq!(cut.hours.len(), 1);
        assert_eq!(cut.hours[&hour].len(), MAX_LABELS);
        assert_eq!(cut.total("e/a", 0, now + 1).sample.len(), SAMPLE_CAP);
    }
}
