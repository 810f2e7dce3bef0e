//! Signals into the pool: the filters' prefill and feedback signals (one at a time or as a
//! batch), and the engines' verdicts on warm calls (a rejection backs an entry off, an accepted
//! call ends the series). Rules in the parent module's doc.

use std::sync::Arc;

use ahash::AHashMap as HashMap;
use prewarm_core::tokens::BYTES_PER_TOKEN;
use prewarm_core::wire::{FeedbackOutcome, FeedbackSignal, PrefillSignal, Signal, SignalBatch};

use super::{
    check_name, entry_bytes, shape_bytes, Entry, IngestReport, Origin, PoolError, PromptPool,
    SharedShape, MAX_BACKOFF_PERIODS,
};
use crate::policy::PrefixKey;

/// A signal's `prefix_tokens` is `blocks × block_tokens` and its text covers them, less at most
/// one partial character (the filter cuts the text back to a character boundary).
fn check_signal_lengths(signal: &PrefillSignal) -> Result<(), PoolError> {
    let blocks = signal.prefix.len().max(1);
    let tokens = signal.prefix_tokens;
    let covered = tokens.saturating_mul(BYTES_PER_TOKEN);
    if tokens == 0
        || !tokens.is_multiple_of(blocks)
        || signal.prefix_text.len().saturating_add(3) < covered
    {
        return Err(PoolError::InconsistentLength {
            tokens,
            text_bytes: signal.prefix_text.len(),
        });
    }
    Ok(())
}
impl PromptPool {
    /// Applies a prefill signal: a new dynamic entry (evicting the coldest at `max_entries`),
    /// or more hotness for a known one, whose shape the signal's replaces (the traffic's
    /// current shape wins; a salt a snapshot dropped is back). A shape that does not lie on the
    /// signal's text refuses the signal. Returns the entry's key.
    pub fn apply_prefill(
        &mut self,
        signal: PrefillSignal,
        now_ms: u64,
    ) -> Result<PrefixKey, PoolError> {
        self.tick(now_ms);
        let last = *signal.prefix.last().ok_or(PoolError::EmptyPrefix)?;
        let key = PrefixKey::new(&signal.model, last);
        if let Some(shape) = &signal.shape {
            shape.check(&signal.prefix_text)?;
        }
        let boost = self.config.signal_boost * (1.0 + f64::from(signal.priority.min(99)) / 100.0);
        if let Some(e) = self.entries.get(&key) {
            // The same chain; the text may differ by a character the filter cut.
            if let (Some(shape), false) = (&signal.shape, *e.text == *signal.prefix_text) {
                shape.check(&e.text)?;
            }
            self.replace_shape(&key, signal.shape.map(SharedShape::new))?;
            if let Some(e) = self.entries.get_mut(&key) {
                e.last_signal_ms = self.last_now_ms;
                // one arm that keeps it warm is enough
                e.keep_warm |= signal.keep_warm;
            }
            self.boost(&key, boost);
            return Ok(key);
        }
        self.check_prefix(&signal.prefix_text, signal.prefix.len())?;
        check_signal_lengths(&signal)?;
        check_name("model", &signal.model)?;
        if let Some(t) = &signal.tenant {
            check_name("tenant", t)?;
        }
        let shape = signal.shape.map(SharedShape::new);
        self.make_room(
            entry_bytes(signal.prefix_text.len(), signal.prefix.len())
                .saturating_add(shape_bytes(shape.as_ref())),
            true,
        )?;
        let (model, tenant) = self.acquire_names(&signal.model, signal.tenant.as_deref())?;
        let score = boost * self.factor;
        self.insert_entry(
            key,
            Entry {
                text: Arc::from(signal.prefix_text),
                blocks: Arc::from(signal.prefix),
                score,
                last_signal_ms: self.last_now_ms,
                model,
                tenant,
                adoptions: 0,
                successes: 0,
                endpoint: signal.endpoint,
                origin: Origin::Dynamic,
                keep_warm: signal.keep_warm,
                shape,
                salt_dropped: false,
                rejections: 0,
                backoff_until_ms: 0,
            },
        );
        self.order.insert((score.to_bits(), key));
        Ok(key)
    }

    /// An engine rejected a warm call of `key` (a 4xx: the request itself is refused, so
    /// sending it again would be refused again): the entry backs off, one decay period after
    /// the first rejection in a row, doubling with each up to [`MAX_BACKOFF_PERIODS`]. A call
    /// already in flight when a back-off started does not extend it. Returns the back-off's
    /// end, or `None` when it was already backing off or is gone.
    pub fn prefill_rejected(&mut self, key: &PrefixKey, now_ms: u64) -> Option<u64> {
        let period = self.config.decay_period_ms.max(1);
        let e = self.entries.get_mut(key)?;
        if now_ms < e.backoff_until_ms {
            return None;
        }
        let doublings = e.rejections.min(MAX_BACKOFF_PERIODS.trailing_zeros());
        let periods = (1u64 << doublings).min(MAX_BACKOFF_PERIODS);
        e.rejections = e.rejections.saturating_add(1);
        e.backoff_until_ms = now_ms.saturating_add(period.saturating_mul(periods));
        Some(e.backoff_until_ms)
    }

    /// An engine accepted a warm call of `key`: a series of rejections is over.
    pub fn prefill_accepted(&mut self, key: &PrefixKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.rejections = 0;
        }
    }

    /// Applies feedback: `adoption_boost` or `success_boost` per request it stands for, at
    /// most `max_feedback_count` requests. Returns whether the prefix was in the pool.
    pub fn apply_feedback(&mut self, signal: &FeedbackSignal, now_ms: u64) -> bool {
        let cap = self.config.max_feedback_count.max(1);
        self.apply_feedback_capped(signal, signal.count.clamp(1, cap), now_ms)
    }

    fn apply_feedback_capped(&mut self, signal: &FeedbackSignal, count: u32, now_ms: u64) -> bool {
        self.tick(now_ms);
        let key = PrefixKey::new(&signal.model, signal.prefix);
        let Some(e) = self.entries.get_mut(&key) else {
            return false;
        };
        let per = match signal.outcome {
            FeedbackOutcome::Adopted => {
                e.adoptions = e.adoptions.saturating_add(count);
                self.config.adoption_boost
            }
            FeedbackOutcome::Succeeded => {
                e.successes = e.successes.saturating_add(count);
                self.config.success_boost
            }
        };
        self.boost(&key, per * f64::from(count));
        true
    }

    /// Applies every prefill and feedback signal of a decoded batch; pins are handed back. The
    /// feedback for one prefix counts at most `max_feedback_count` requests per batch, however
    /// many signals carry it.
    pub fn ingest(&mut self, batch: SignalBatch, now_ms: u64) -> IngestReport {
        let mut report = IngestReport::default();
        let cap = self.config.max_feedback_count.max(1);
        let mut counted: HashMap<PrefixKey, u32> = HashMap::new();
        for signal in batch.signals {
            match signal {
                Signal::Prefill(p) => match self.apply_prefill(p, now_ms) {
                    Ok(_) => report.prefills += 1,
                    Err(e) => {
                        report.rejected += 1;
                        if report.reasons.len() < 8 {
                            report.reasons.push(e);
                        }
                    }
                },
                Signal::Feedback(f) => {
                    let used = counted
                        .entry(PrefixKey::new(&f.model, f.prefix))
                        .or_insert(0);
                    let count = f.count.max(1).min(cap.saturating_sub(*used));
                    *used = used.saturating_add(count);
                    if count == 0 {
                        report.feedback_capped += 1;
                    } else if self.apply_feedback_capped(&f, count, now_ms) {
                        report.feedback += 1;
                    } else {
                        report.feedback_unknown += 1;
                    }
                }
                Signal::Pin(p) => report.pins.push(p),
            }
        }
        report
    }
}
