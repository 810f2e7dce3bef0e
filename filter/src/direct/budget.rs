//! The bounds on the filter's direct calls, kept in shared data so every worker VM of one Envoy
//! shares them (each change one compare-and-swap):
//!
//! | key | value |
//! |---|---|
//! | `direct/budget` | minute start ms (8) + calls (8) + prefill tokens (8) spent in that minute |
//! | `direct/pod/<slot>` ([`POD_SLOTS`] of them) | pod hash (8) + ms until which the pod is busy (8) + why (1: 0 a call in flight, 1 backing off after a failed call) |
//!
//! The budget is a fixed one-minute window: a call is taken only if both its count and its
//! tokens fit what is left. A pod's in-flight flag expires by itself after the call's timeout
//! (plus a tick's margin, set by the caller), so a VM reloaded with a call in flight never blocks
//! that pod for good. A failed call leaves the pod backing off for a while instead (the filter
//! cannot read Envoy's host health: a pod that refused a connection is likely down, and calling
//! it every tick would only spend the budget on 503s). Pods hash into fixed slots, and two pods
//! sharing a slot only wait for each other (fewer calls, never more).

use prewarm_core::fingerprint::chain_seed;

use crate::host::Host;
use crate::shared::{read_u64, update, Keys};

/// Slots of the in-flight flags.
pub const POD_SLOTS: u64 = 256;

/// The budget window, ms.
pub const BUDGET_WINDOW_MS: u64 = 60_000;

/// Why a call was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Budget,
    InFlight,
    /// The pod's last call failed a short while ago.
    Backoff,
    /// Shared data could not be updated (compare-and-swap gave up): not sent, to stay bounded.
    Contended,
}

/// The limits of one Envoy's direct calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub calls_per_min: u64,
    pub tokens_per_min: u64,
    pub cas_retries: u32,
}

fn budget_key(keys: &Keys) -> String {
    keys.custom("direct/budget")
}

/// The in-flight key of `pod`.
pub fn pod_key(keys: &Keys, pod: &str) -> String {
    keys.custom(&format!("direct/pod/{}", chain_seed(pod) % POD_SLOTS))
}

/// Spends one call and `tokens` prefill tokens of this minute's budget, if both fit.
pub fn spend<H: Host + ?Sized>(
    host: &H,
    keys: &Keys,
    limits: Limits,
    tokens: u64,
    now: u64,
) -> Result<(), Refused> {
    let taken = update(host, &budget_key(keys), limits.cas_retries, |bytes| {
        let start = read_u64(bytes, 0).unwrap_or(0);
        let fresh = now.saturating_sub(start) >= BUDGET_WINDOW_MS || start > now;
        let (start, calls, spent) = if fresh {
            (now, 0, 0)
        } else {
            (
                start,
                read_u64(bytes, 8).unwrap_or(0),
                read_u64(bytes, 16).unwrap_or(0),
            )
        };
        let calls = calls.saturating_add(1);
        let spent = spent.saturating_add(tokens);
        if calls > limits.calls_per_min || spent > limits.tokens_per_min {
            return (None, false);
        }
        let mut value = start.to_le_bytes().to_vec();
        value.extend_from_slice(&calls.to_le_bytes());
        value.extend_from_slice(&spent.to_le_bytes());
        (Some(value), true)
    });
    match taken {
        Some(true) => Ok(()),
        Some(false) => Err(Refused::Budget),
        None => Err(Refused::Contended),
    }
}

/// Marks a call to `pod` in flight until `until`, unless one already is.
pub fn claim_pod<H: Host + ?Sized>(
    host: &H,
    keys: &Keys,
    retries: u32,
    pod: &str,
    now: u64,
    until: u64,
) -> Result<(), Refused> {
    let claimed = update(host, &pod_key(keys, pod), retries, |bytes| {
        let busy_until = read_u64(bytes, 8).unwrap_or(0);
        if busy_until > now {
            let why = match bytes.get(16) {
                Some(1) => Refused::Backoff,
                _ => Refused::InFlight,
            };
            return (None, Err(why));
        }
        (Some(pod_value(pod, until, 0)), Ok(()))
    });
    claimed.unwrap_or(Err(Refused::Contended))
}

fn pod_value(pod: &str, until: u64, why: u8) -> Vec<u8> {
    let mut value = chain_seed(pod).to_le_bytes().to_vec();
    value.extend_from_slice(&until.to_le_bytes());
    value.push(why);
    value
}

/// After a failed call: `pod` is not called again before `until`.
pub fn back_off_pod<H: Host + ?Sized>(host: &H, keys: &Keys, retries: u32, pod: &str, until: u64) {
    let _ = update(host, &pod_key(keys, pod), retries, |_| {
        (Some(pod_value(pod, until, 1)), ())
    });
}

/// Clears `pod`'s in-flight flag (if the slot is still its own).
pub fn release_pod<H: Host + ?Sized>(host: &H, keys: &Keys, retries: u32, pod: &str) {
    let owner = chain_seed(pod);
    let _ = update(host, &pod_key(keys, pod), retries, |bytes| {
        if read_u64(bytes, 0) != Some(owner) {
            return (None, ());
        }
        (Some(pod_value(pod, 0, 0)), ())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    const LIMITS: Limits = Limits {
        calls_per_min: 3,
        tokens_per_min: 1000,
        cas_retries: 4,
    };

    #[test]
    fn the_minute_budget_holds_calls_and_tokens_and_renews() {
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        let other = host.sibling();
        assert_eq!(spend(&host, &keys, LIMITS, 600, 0), Ok(()));
        assert_eq!(
            spend(&other, &keys, LIMITS, 600, 10),
            Err(Refused::Budget),
            "tokens"
        );
        assert_eq!(spend(&other, &keys, LIMITS, 100, 10), Ok(()));
        assert_eq!(spend(&host, &keys, LIMITS, 0, 20), Ok(()));
        assert_eq!(
            spend(&host, &keys, LIMITS, 0, 30),
            Err(Refused::Budget),
            "calls"
        );
        assert_eq!(
            spend(&host, &keys, LIMITS, 900, 60_000),
            Ok(()),
            "a new minute"
        );
    }

    #[test]
    fn one_call_in_flight_per_pod_until_released_or_expired() {
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        let other = host.sibling();
        assert_eq!(claim_pod(&host, &keys, 4, "a", 0, 100), Ok(()));
        assert_eq!(
            claim_pod(&other, &keys, 4, "a", 50, 150),
            Err(Refused::InFlight)
        );
        release_pod(&host, &keys, 4, "a");
        assert_eq!(claim_pod(&other, &keys, 4, "a", 60, 160), Ok(()));
        assert_eq!(claim_pod(&host, &keys, 4, "a", 161, 300), Ok(()), "expired");
        back_off_pod(&host, &keys, 4, "a", 1_000);
        assert_eq!(
            claim_pod(&other, &keys, 4, "a", 999, 2_000),
            Err(Refused::Backoff)
        );
        assert_eq!(
            claim_pod(&other, &keys, 4, "a", 1_000, 2_000),
            Ok(()),
            "backed off"
        );
        host.fail_next_sets(10);
        assert_eq!(
            claim_pod(&host, &keys, 4, "b", 0, 100),
            Err(Refused::Contended)
        );
    }
}
