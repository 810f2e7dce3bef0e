//! The pod another router chose, when `endpoint_header_owner` is `external`: the Gateway API
//! Inference Extension's endpoint picker (an ext_proc service) or llm-d's sets the endpoint
//! header before this filter runs — `ip:port`, or a comma-separated list whose first entry is
//! the pick and the rest fallbacks (the Inference Extension's endpoint picker protocol). The
//! filter never removes or sets that header; it finds the routing table's pod whose `address`
//! is the first entry, so that `request` records it as served exactly as it records a pod it
//! chose itself (the prefix index, the outcome's pod, a served record for the gateway's KV
//! model). A header that is absent, malformed (over [`MAX_EXTERNAL_ENDPOINT_BYTES`], not UTF-8,
//! an empty, non-printable or overlong first entry) or naming no pod of the table is ignored
//! and counted ([`Unrecorded`]); the request is never touched either way.
//!
//! The header is read in the request-headers callback ([`read_pick`]): once the filter lets the
//! headers go on (with `routing` off it does not hold them), Envoy's wasm host no longer gives
//! them to the body callbacks, where the pod is looked up ([`pod_of`]). Only the first address
//! is kept meanwhile, at most [`MAX_PICK_ADDRESS_BYTES`].
//!
//! Trust: the value is read as the other router left it. That router must overwrite a client's
//! value (the endpoint picker's ext_proc `set_headers` do) and run before this filter in the
//! HTTP filter chain (docs/filter-config.md, "Beside another router").

use prewarm_core::wire::MAX_NAME_BYTES;

use crate::config::FilterConfig;
use crate::host::{Host, Metric};
use crate::worker::Worker;

/// Longest endpoint header read (bytes): a pick and its fallbacks, `[IPv6]:port` each (47
/// bytes), fit many times over; a longer value is garbage, counted as malformed.
pub const MAX_EXTERNAL_ENDPOINT_BYTES: usize = 4096;

/// Longest first address kept (bytes): a host name's 253 and a port fit; an `[IPv6]:port` is 47.
pub const MAX_PICK_ADDRESS_BYTES: usize = MAX_NAME_BYTES;

/// Why the other router's pick was not recorded; each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrecorded {
    /// No endpoint header (the router did not pick, or failed open).
    Absent,
    /// Over the size bounds, not UTF-8, or an empty, non-printable or overlong first entry.
    Malformed,
    /// No routing table yet (the gateway not reached): no pod to match.
    NoTable,
    /// An address no pod of the table has (a pod the gateway does not know, a client's value).
    UnknownPod,
}

impl Unrecorded {
    pub fn metric(self) -> Metric {
        match self {
            Self::Absent => Metric::ExternalAbsent,
            Self::Malformed => Metric::ExternalMalformed,
            Self::NoTable => Metric::ExternalNoTable,
            Self::UnknownPod => Metric::ExternalUnknownPod,
        }
    }
}

/// The first address of an endpoint header's value (the pick; the rest are fallbacks),
/// without surrounding blanks.
pub fn first_address(value: &[u8]) -> Result<&str, Unrecorded> {
    if value.len() > MAX_EXTERNAL_ENDPOINT_BYTES {
        return Err(Unrecorded::Malformed);
    }
    let text = std::str::from_utf8(value).map_err(|_| Unrecorded::Malformed)?;
    let first = text.split(',').next().unwrap_or_default().trim();
    let printable = first.bytes().all(|b| b.is_ascii_graphic());
    if first.is_empty() || !printable || first.len() > MAX_PICK_ADDRESS_BYTES {
        return Err(Unrecorded::Malformed);
    }
    Ok(first)
}

/// The address the request's endpoint header names first, read while the request's headers are
/// at hand.
pub fn read_pick<H: Host + ?Sized>(host: &H, config: &FilterConfig) -> Result<String, Unrecorded> {
    let value = host
        .request_header(&config.routing.endpoint_header)
        .ok_or(Unrecorded::Absent)?;
    first_address(&value).map(str::to_string)
}

/// The id of the routing table's pod at `address` (the table refreshed first, as routing does;
/// its warming pods included, since the other router does not know prewarm's warm-up).
pub fn pod_of<H: Host + ?Sized>(
    host: &H,
    worker: &Worker,
    address: &str,
) -> Result<String, Unrecorded> {
    worker.table.refresh(host, &worker.keys);
    let table = worker.table.view(false).ok_or(Unrecorded::NoTable)?;
    table
        .pods
        .iter()
        .find(|p| p.address == address)
        .map(|p| p.id.clone())
        .ok_or(Unrecorded::UnknownPod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pick_is_the_first_address_of_the_list() {
        assert_eq!(first_address(b"10.0.0.7:8000"), Ok("10.0.0.7:8000"));
        assert_eq!(
            first_address(b" 10.0.0.7:8000 , 10.0.0.8:8000"),
            Ok("10.0.0.7:8000")
        );
        assert_eq!(first_address(b"[fd00::7]:8000"), Ok("[fd00::7]:8000"));
    }

    #[test]
    fn garbage_is_malformed_whatever_its_shape() {
        let huge = vec![b'1'; MAX_EXTERNAL_ENDPOINT_BYTES + 1];
        for value in [
            &b""[..],
            b"   ",
            b",10.0.0.7:8000",
            b"\xff\xfe:80",
            b"10.0.0.7:\x018000",
            b"10.0.0 .7:8000",
            &huge,
        ] {
            assert_eq!(
                first_address(value),
                Err(Unrecorded::Malformed),
                "{value:?}"
            );
        }
        let long_address = vec![b'1'; MAX_PICK_ADDRESS_BYTES + 1];
        assert_eq!(first_address(&long_address), Err(Unrecorded::Malformed));
        // a long list of fallbacks is fine: only the first address is kept
        let mut at_limit = b"10.0.0.7:8000".to_vec();
        at_limit.resize(MAX_EXTERNAL_ENDPOINT_BYTES, b',');
        assert_eq!(first_address(&at_limit), Ok("10.0.0.7:8000"));
    }
}
