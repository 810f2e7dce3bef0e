//! Whether the gateway is answering, as its signal and table calls show, for the takeover of
//! `direct_calls: when_gateway_down`: one shared-data word, `direct/gateway`, the time of the
//! first failed call of the current failure streak (0 once a call succeeded). Every worker's
//! replies feed it, so the whole Envoy takes over, and hands back, together. A call is failed
//! when it could not be dispatched or its reply was not 2xx/304 (Envoy synthesizes 503 on
//! connect failure and 504 on timeout).

use crate::host::Host;
use crate::shared::{read_u64, update, Keys};

fn key(keys: &Keys) -> String {
    keys.custom("direct/gateway")
}

/// Records one call's outcome at `now`.
pub fn record<H: Host + ?Sized>(host: &H, keys: &Keys, retries: u32, ok: bool, now: u64) {
    let _ = update(host, &key(keys), retries, |bytes| {
        let since = read_u64(bytes, 0).unwrap_or(0);
        let next = if ok {
            0
        } else if since == 0 {
            now.max(1)
        } else {
            since
        };
        if next == since && !bytes.is_empty() {
            (None, ())
        } else {
            (Some(next.to_le_bytes().to_vec()), ())
        }
    });
}

/// Whether the gateway's calls have all failed for at least `after_ms` up to `now`.
pub fn is_down<H: Host + ?Sized>(host: &H, keys: &Keys, after_ms: u64, now: u64) -> bool {
    let (value, _) = host.shared_get(&key(keys));
    let since = value.and_then(|v| read_u64(&v, 0)).unwrap_or(0);
    since != 0 && now.saturating_sub(since) >= after_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    #[test]
    fn down_after_a_failure_streak_of_the_takeover_time_and_up_at_the_first_success() {
        let host = FakeHost::new();
        let keys = Keys::new("p/");
        assert!(!is_down(&host, &keys, 0, 0), "never failed");
        record(&host, &keys, 4, false, 1_000);
        record(&host.sibling(), &keys, 4, false, 3_000);
        assert!(!is_down(&host, &keys, 5_000, 5_999));
        assert!(
            is_down(&host, &keys, 5_000, 6_000),
            "from the first failure"
        );
        record(&host, &keys, 4, true, 6_100);
        assert!(!is_down(&host, &keys, 5_000, 20_000));
        record(&host, &keys, 4, false, 20_000);
        assert!(!is_down(&host, &keys, 5_000, 24_000), "a new streak");
    }
}
