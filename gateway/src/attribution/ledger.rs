//! The outcome ledger: the filters' outcome records summed per hour and per arm label
//! (`<experiment>/<arm>`, or none outside an experiment). Each bucket keeps exact counts and
//! moments and a bounded uniform sample of the times to first byte (reservoir sampling,
//! [`SAMPLE_CAP`] values), which the quantiles and the Mann-Whitney test read. Memory is bounded:
//! [`HOURS_KEPT`] hours × [`MAX_LABELS`] labels × the sample. The ledger goes into the
//! snapshot, so a restart keeps an experiment's evidence; a restored one is cut to the same
//! bounds ([`OutcomeLedger::bounded`]).

use std::collections::BTreeMap;

use prewarm_core::wire::OutcomeRecord;
use serde::{Deserialize, Serialize};

use super::report::new_pods_label;
use super::stats::Moments;

/// Hours of buckets kept (older ones are dropped).
pub const HOURS_KEPT: u64 = 48;
/// Distinct labels an hour holds (an experiment has at most 8 arms, each also on its new pods,
/// plus records without one); records of further labels are dropped, counted.
pub const MAX_LABELS: usize = 24;
/// Times to first byte a bucket samples.
pub const SAMPLE_CAP: usize = 4096;
/// One hour, ms.
pub const HOUR_MS: u64 = 3_600_000;

/// A status that counts as an error: the server's (5xx) and being throttled (429).
pub fn is_error(status: u16) -> bool {
    status >= 500 || status == 429
}

/// The outcomes of one label in one hour.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub requests: u64,
    pub errors: u64,
    /// Time to first byte, ms, of every request.
    pub ttfb: Moments,
    /// A uniform sample of the times to first byte, ms.
    pub sample: Vec<f64>,
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
        if self.sample.len() < SAMPLE_CAP {
            self.sample.push(ttfb);
        } else {
            let slot = self.next_random() % self.ttfb.n;
            if let Some(s) = usize::try_from(slot)
                .ok()
                .and_then(|i| self.sample.get_mut(i))
            {
                *s = ttfb;
            }
        }
        if let (Some(p), Some(c)) = (r.prompt_tokens, r.cached_tokens) {
            self.with_usage += 1;
            self.prompt_tokens = self.prompt_tokens.saturating_add(p);
            self.cached_tokens = self.cached_tokens.saturating_add(c);
        }
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
        self.sample.extend_from_slice(&other.sample);
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
            done.accepted += 1;
            if let (Some(arm), Some(pod)) = (&r.arm, &r.pod) {
                let cohort = new_pods_label(arm);
                let room = labels.contains_key(&cohort) || labels.len() < MAX_LABELS;
                if new_pod(pod) && room {
                    labels.entry(cohort).or_default().add(r);
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
        let oldest = (now_ms / HOUR_MS).saturating_sub(HOURS_KEPT - 1) * HOUR_MS;
        self.hours.retain(|hour, _| *hour >= oldest);
        for labels in self.hours.values_mut() {
            while labels.len() > MAX_LABELS {
                labels.pop_last();
            }
            for bucket in labels.values_mut() {
                bucket.sample.truncate(SAMPLE_CAP);
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
        }
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
