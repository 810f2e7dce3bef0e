//! When an admitted request starts: the earliest time its whole run fits beside every request
//! already admitted (conservative backfilling).
//!
//! Output lengths are known at admission, so every admitted request has a fixed interval
//! `[start, finish)`. A new request of duration `d` starts at the earliest `s ≥ arrival` such that
//! at every instant of `[s, s + d)` the batch, with it added, holds at most `max_num_seqs`
//! requests and, for an adapter request, at most `max_loras` distinct adapters (pinned adapters
//! count as held). So a request whose adapter is already in the batch (or a base-model request)
//! runs at once even while another waits for a LoRA slot, as in vLLM, whose scheduler skips a
//! LoRA-blocked request; unlike vLLM, a later request never delays one already admitted, so a
//! busy adapter cannot starve a waiting one.

use std::collections::HashMap;

/// Model time in whole microseconds, for ordering.
pub fn micros(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e6).round() as u64
    } else {
        0
    }
}

/// An admitted request's place in time.
#[derive(Debug, Clone, Copy)]
pub struct Interval<'a> {
    pub start: f64,
    pub finish: f64,
    pub adapter: Option<&'a str>,
}

/// The limits a start must respect.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits<'a> {
    pub max_num_seqs: usize,
    pub max_loras: usize,
    /// Adapters that hold a slot whether or not a request uses them.
    pub pinned: &'a [&'a str],
}

/// The earliest start for a request of `duration` for `adapter` arriving at `arrival`, given
/// the admitted requests `admitted` (those finished by `arrival` are ignored).
pub fn earliest_start<'a>(
    admitted: impl Iterator<Item = Interval<'a>>,
    arrival: f64,
    duration: f64,
    adapter: Option<&str>,
    limits: BatchLimits<'_>,
) -> f64 {
    // (time µs, +1 start / −1 finish, adapter); finishes sort before starts at the same instant.
    let mut events: Vec<(u64, i8, Option<&'a str>)> = Vec::new();
    let t0 = micros(arrival);
    for i in admitted {
        let finish = micros(i.finish);
        if finish <= t0 {
            continue;
        }
        events.push((micros(i.start).max(t0), 1, i.adapter));
        events.push((finish, -1, i.adapter));
    }
    events.sort_unstable_by_key(|e| (e.0, e.1));

    // Piecewise-constant "would adding the request break a limit here" from t0 on.
    let mut segments: Vec<(u64, bool)> = Vec::with_capacity(events.len() + 1);
    let mut running = 0usize;
    let mut adapters: HashMap<&str, usize> = HashMap::new();
    let blocked = |running: usize, adapters: &HashMap<&str, usize>| {
        if running >= limits.max_num_seqs {
            return true;
        }
        match adapter {
            None => false,
            Some(a) if adapters.contains_key(a) => false,
            Some(a) => {
                let pinned_idle = limits
                    .pinned
                    .iter()
                    .filter(|p| **p != a && !adapters.contains_key(**p))
                    .count();
                adapters.len() + pinned_idle >= limits.max_loras
            }
        }
    };
    let mut k = 0;
    while k < events.len() {
        let Some(&(t, _, _)) = events.get(k) else {
            break;
        };
        while let Some(&(te, delta, a)) = events.get(k) {
            if te != t {
                break;
            }
            if delta > 0 {
                running += 1;
                if let Some(a) = a {
                    *adapters.entry(a).or_default() += 1;
                }
            } else {
                running = running.saturating_sub(1);
                if let Some(a) = a {
                    if let Some(n) = adapters.get_mut(a) {
                        *n -= 1;
                        if *n == 0 {
                            adapters.remove(a);
                        }
                    }
                }
            }
            k += 1;
        }
        if segments.is_empty() && t > t0 {
            segments.push((t0, false));
        }
        // The last segment (everything finished) never blocks, so a start always exists.
        let bad = k < events.len() && blocked(running, &adapters);
        segments.push((t, bad));
    }
    if segments.is_empty() {
        return arrival;
    }

    let d = micros(duration);
    let mut i = 0;
    'candidates: while let Some(&(begin, bad)) = segments.get(i) {
        if bad {
            i += 1;
            continue;
        }
        let s = begin.max(t0);
        let mut j = i + 1;
        while let Some(&(b, bad)) = segments.get(j) {
            if b >= s.saturating_add(d) {
                break;
            }
            if bad {
                i = j + 1;
                continue 'candidates;
            }
            j += 1;
        }
        return if s == t0 { arrival } else { s as f64 / 1e6 };
    }
    arrival
}

/// Adapters of the admitted requests running at `t`, with their counts.
pub fn adapters_at<'a>(
    admitted: impl Iterator<Item = Interval<'a>>,
    t: f64,
) -> HashMap<String, usize> {
    let t = micros(t);
    let mut out = HashMap::new();
    for i in admitted {
        if micros(i.start) <= t && t < micros(i.finish) {
            if let Some(a) = i.adapter {
                *out.entry(a.to_string()).or_default() += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(start: f64, finish: f64, adapter: Option<&str>) -> Interval<'_> {
        Interval {
            start,
            finish,
            adapter,
        }
    }

    const ONE_SEQ: BatchLimits = BatchLimits {
        max_num_seqs: 1,
        max_loras: 1,
        pinned: &[],
    };

    #[test]
    fn waits_for_a_sequence_place_and_backfills_gaps() {
        let admitted = [iv(0.0, 2.0, None), iv(3.0, 5.0, None)];
        // Busy until 2; a 1-second request fits in [2, 3).
        assert_eq!(
            earliest_start(admitted.into_iter(), 0.5, 1.0, None, ONE_SEQ),
            2.0
        );
        // A 1.5-second one does not: after 5.
        assert_eq!(
            earliest_start(admitted.into_iter(), 0.5, 1.5, None, ONE_SEQ),
            5.0
        );
        assert_eq!(
            earliest_start(admitted.into_iter(), 6.0, 1.5, None, ONE_SEQ),
            6.0
        );
        assert_eq!(
            earliest_start([].into_iter(), 0.25, 1.0, None, ONE_SEQ),
            0.25
        );
    }

    #[test]
    fn waits_for_a_lora_slot_unless_its_adapter_is_running() {
        let wide = BatchLimits {
            max_num_seqs: 8,
            max_loras: 1,
            pinned: &[],
        };
        let admitted = [iv(0.0, 3.0, Some("a"))];
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 1.0, Some("a"), wide),
            1.0
        );
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 1.0, Some("b"), wide),
            3.0
        );
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 1.0, None, wide),
            1.0
        );
        // b waits from 3 to 4; a request for a that would still run at 3 must wait for b.
        let admitted = [iv(0.0, 3.0, Some("a")), iv(3.0, 4.0, Some("b"))];
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 1.0, Some("a"), wide),
            1.0
        );
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 5.0, Some("a"), wide),
            4.0
        );
        let pinned = BatchLimits {
            pinned: &["p"],
            max_loras: 2,
            ..wide
        };
        assert_eq!(
            earliest_start(admitted.into_iter(), 1.0, 1.0, Some("c"), pinned),
            4.0
        );
        assert_eq!(adapters_at(admitted.into_iter(), 3.5).get("b"), Some(&1));
    }
}
