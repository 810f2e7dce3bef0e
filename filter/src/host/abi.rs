//! The proxy-wasm host functions the filter calls, bound directly so that every status the host
//! returns comes back as a value. The SDK's `hostcalls` wrappers `panic!` on any status they do
//! not expect (a header value Envoy refuses, a shared-data status of a newer host...), and a
//! panic traps the VM and costs the request a 503; here every status is the caller's to handle.
//!
//! Only `dispatch_http_call` stays the SDK's: it must register the call with the SDK's dispatcher
//! so the reply reaches the root context, and it already returns the statuses Envoy gives it.
//!
//! This is the crate's only `unsafe` code: foreign calls with pointers to live Rust buffers, and
//! taking ownership of buffers the host filled through the SDK's `proxy_on_memory_allocate`
//! (a boxed `[u8]` of exactly the returned size, hence `Vec::from_raw_parts(p, n, n)`).
#![allow(unsafe_code)]

use std::ptr::{null, null_mut};

/// A host status other than `Ok`, as the raw number (1 NotFound, 2 BadArgument, 8 CasMismatch...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostStatus(pub u32);

pub const OK: u32 = 0;
pub const NOT_FOUND: u32 = 1;

/// `MapType`: the request's headers.
pub const REQUEST_HEADERS: u32 = 0;
/// `MapType`: the response's headers.
pub const RESPONSE_HEADERS: u32 = 2;
/// `MapType`: the headers of a call's response.
pub const CALL_RESPONSE_HEADERS: u32 = 6;
/// `BufferType`: the request body.
pub const REQUEST_BODY: u32 = 0;
/// `BufferType`: the response body.
pub const RESPONSE_BODY: u32 = 1;
/// `BufferType`: a call's response body.
pub const CALL_RESPONSE_BODY: u32 = 4;
/// `BufferType`: the plugin configuration.
pub const PLUGIN_CONFIGURATION: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(out: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        kind: u32,
        start: usize,
        max_size: usize,
        out_data: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        out_data: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        out_data: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status_code: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        out_data: *mut *mut u8,
        out_size: *mut usize,
        out_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, out_id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
}

fn status(code: u32) -> Result<(), HostStatus> {
    if code == OK {
        Ok(())
    } else {
        Err(HostStatus(code))
    }
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`.
fn owned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        return None;
    }
    // SAFETY: the host filled `size` bytes it allocated with the SDK's allocator, which hands
    // out a boxed slice of exactly `size` bytes; ownership passes to us once.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

pub fn log(level: u32, message: &str) -> Result<(), HostStatus> {
    // SAFETY: pointer and length of a live string.
    status(unsafe { proxy_log(level, message.as_ptr(), message.len()) })
}

/// Host time, ns since the Unix epoch.
pub fn now_ns() -> Result<u64, HostStatus> {
    let mut t = 0u64;
    // SAFETY: `t` outlives the call.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut t) })?;
    Ok(t)
}

pub fn set_tick_period_ms(period: u32) -> Result<(), HostStatus> {
    // SAFETY: no pointers.
    status(unsafe { proxy_set_tick_period_milliseconds(period) })
}

/// Up to `max_size` bytes of buffer `kind` from `start`; `Ok(None)` when there is none.
pub fn buffer(kind: u32, start: usize, max_size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to live locals.
    match unsafe { proxy_get_buffer_bytes(kind, start, max_size, &mut data, &mut size) } {
        OK => Ok(owned(data, size)),
        NOT_FOUND => Ok(None),
        other => Err(HostStatus(other)),
    }
}

/// A property's raw value (`path` components joined with NUL, as the ABI wants); `Ok(None)` when
/// absent.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, HostStatus> {
    let joined = path.join("\0");
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: the path is a live buffer; out-pointers to live locals.
    let code = unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    match code {
        OK => Ok(owned(data, size)),
        NOT_FOUND => Ok(None),
        other => Err(HostStatus(other)),
    }
}

/// A header's value; `Ok(None)` when absent.
pub fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: the key is a live string; out-pointers to live locals.
    let code =
        unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size) };
    match code {
        OK => Ok(owned(data, size)),
        NOT_FOUND => Ok(None),
        other => Err(HostStatus(other)),
    }
}

pub fn replace_header(map: u32, name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: key and value are live buffers.
    status(unsafe {
        proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    })
}

pub fn remove_header(map: u32, name: &str) -> Result<(), HostStatus> {
    // SAFETY: the key is a live string.
    status(unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) })
}

/// A shared-data value and its cas; `(None, None)` when the key is missing.
pub fn shared_get(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), HostStatus> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    // SAFETY: the key is a live string; out-pointers to live locals.
    let code =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match code {
        OK => Ok((owned(data, size), (cas != 0).then_some(cas))),
        NOT_FOUND => Ok((None, None)),
        other => Err(HostStatus(other)),
    }
}

/// Writes a shared-data value; with a cas, only if nobody wrote since (else `Err`, status 8).
pub fn shared_set(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostStatus> {
    let data = if value.is_empty() {
        null()
    } else {
        value.as_ptr()
    };
    // SAFETY: key and value are live buffers.
    status(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), data, value.len(), cas.unwrap_or(0))
    })
}

/// Defines a metric (`kind` 0 counter, 1 gauge); its id.
pub fn define_metric(kind: u32, name: &str) -> Result<u32, HostStatus> {
    let mut id = 0u32;
    // SAFETY: the name is a live string; `id` outlives the call.
    status(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn increment_metric(id: u32, by: i64) -> Result<(), HostStatus> {
    // SAFETY: no pointers.
    status(unsafe { proxy_increment_metric(id, by) })
}

pub fn record_metric(id: u32, value: u64) -> Result<(), HostStatus> {
    // SAFETY: no pointers.
    status(unsafe { proxy_record_metric(id, value) })
}

/// A header map as the host reads it: the count, each name's and value's length, then each
/// name and value NUL-terminated (all lengths little-endian u32).
fn serialize_headers(headers: &[(&str, &[u8])]) -> Vec<u8> {
    let size: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 10).sum();
    let mut out = Vec::with_capacity(4 + size);
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    out.extend_from_slice(&len(headers.len()));
    for (k, v) in headers {
        out.extend_from_slice(&len(k.len()));
        out.extend_from_slice(&len(v.len()));
    }
    for (k, v) in headers {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Ends the stream with a response the filter makes (Envoy sends it once the callback returns).
pub fn send_local_response(
    status_code: u32,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Result<(), HostStatus> {
    let headers = serialize_headers(headers);
    // SAFETY: pointers and lengths of live buffers; no details, no gRPC status (-1).
    status(unsafe {
        proxy_send_local_response(
            status_code,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}
