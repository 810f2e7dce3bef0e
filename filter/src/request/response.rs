//! What the filter reads of a response it watches (never holds or changes).

use crate::host::Host;

/// Whether the response is a `200` whose body the filter can read as sent: not
/// `content-encoding`-encoded (a compressed body is not parsed).
pub fn readable_ok<H: Host + ?Sized>(host: &H) -> bool {
    let ok = host.response_header(":status").as_deref() == Some(b"200");
    let encoded = host
        .response_header("content-encoding")
        .is_some_and(|e| !e.eq_ignore_ascii_case(b"identity"));
    ok && !encoded
}
