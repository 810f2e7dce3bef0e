//! Where a request's inspection may be cut short, for `make bench-filter`'s stage ladder only:
//! a proxy configured with `bench_stop_after` does the request path up to and including that
//! stage and then lets the request go on unrouted, so the Envoy CPU each stage adds can be read
//! as the difference between two proxies. Never set in production: a stopped request is not
//! observed or routed past its stage.

use serde::Deserialize;

/// A stage of the request path, in the order the path runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The headers inspected and held while Envoy buffers the body; the body is never read.
    Headers,
    /// The body copied into the VM.
    Body,
    /// The body parsed into a request.
    Parse,
    /// The canonical prompt, its block chain and its prefix-index keys.
    Fingerprint,
    /// The request observed: sketched, its user's pattern, tallies and signals.
    Observe,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_named_in_snake_case() {
        let s: Stage = serde_json::from_str("\"fingerprint\"").unwrap_or(Stage::Headers);
        assert_eq!(s, Stage::Fingerprint);
        assert!(serde_json::from_str::<Stage>("\"route\"").is_err());
    }
}
