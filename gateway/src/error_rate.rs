//! The error-rate rule of a rollback, shared by an experiment's grey release
//! (`attribution::release`) and an adapter rollout's watch (`registry::watch`): what counts as
//! an error and when a share of errors is too many. A leaf, so that both decide by one rule.

/// A status that counts as an error: the server's (5xx) and being throttled (429).
pub fn is_error(status: u16) -> bool {
    status >= 500 || status == 429
}

/// The error rate above which the first arm (or an adapter's rollout) is rolled back.
pub const ERROR_RATE_LIMIT: f64 = 0.005;

/// Whether `errors` in `requests` exceed [`ERROR_RATE_LIMIT`] of at least `min_requests`: the
/// rate once there are `min_requests`, and before that as soon as the errors alone exceed the
/// limit's share of `min_requests` (no later success can bring the rate back under).
pub fn errors_exceed(errors: u64, requests: u64, min_requests: u64) -> bool {
    errors as f64 > ERROR_RATE_LIMIT * requests.max(min_requests) as f64
}
