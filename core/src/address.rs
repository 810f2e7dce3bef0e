//! What a pod address may be: `host:port`, the host an IPv4 address, a bracketed IPv6 address or
//! a DNS name, the port 1–65535. One rule for both ends: the gateway checks it where pods are
//! registered, the filter where a routing table is decoded, because the address goes verbatim
//! into a request header (`x-gateway-destination-endpoint`) whose value Envoy reads as a
//! comma-separated list of hosts. A comma, `@`, a control character or a space in it would
//! inject hosts or be refused by Envoy's header map.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Longest DNS name (RFC 1035), bytes.
pub const MAX_DNS_NAME: usize = 253;
/// Longest DNS label, bytes.
const MAX_DNS_LABEL: usize = 63;

/// Why an address was refused, as the rule it broke.
pub const ADDRESS_RULE: &str =
    "must be host:port (an IPv4 address, [IPv6] or a DNS name; port 1-65535)";

fn dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_DNS_LABEL
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

fn dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty() && host.len() <= MAX_DNS_NAME && host.split('.').all(dns_label)
}

fn port(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 5
        && text.bytes().all(|b| b.is_ascii_digit())
        && text.parse::<u16>().is_ok_and(|p| p > 0)
}

/// Whether `address` is a pod address (see the module doc).
pub fn is_pod_address(address: &str) -> bool {
    if let Some(rest) = address.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((ip, p)) => ip.parse::<Ipv6Addr>().is_ok() && port(p),
            None => false,
        };
    }
    match address.rsplit_once(':') {
        Some((host, p)) => {
            port(p) && (host.parse::<Ipv4Addr>().is_ok() || (dns_name(host) && !all_numeric(host)))
        }
        None => false,
    }
}

/// A dotted all-digit host that is not a valid IPv4 address (`300.1.1.1`, `1.2.3`) is refused
/// rather than read as a DNS name.
fn all_numeric(host: &str) -> bool {
    host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn accepts_ips_and_dns_names_with_a_port() {
        for ok in [
            "127.0.0.1:8000",
            "10.0.0.7:1",
            "pod-a.svc:80",
            "vllm-0.vllm.inference.svc.cluster.local:8000",
            "localhost:65535",
            "[::1]:8000",
            "[2001:db8::1]:443",
            "h:1",
            "example.com.:80",
        ] {
            assert!(is_pod_address(ok), "{ok}");
        }
    }

    #[test]
    fn refuses_what_a_header_or_envoy_would_misread() {
        let long_label = format!("{}:80", "a".repeat(64));
        let long_name = format!("{}:80", ["abcdefghi"; 26].join("."));
        for bad in [
            "",
            ":80",
            "x",
            "x:",
            "x:0",
            "x:65536",
            "x:99999",
            "x:+80",
            "x: 80",
            "a:1,b:2",
            "u@h:80",
            "h\r\nx-evil: 1:80",
            "h\u{0}:80",
            "h h:80",
            "http://x:80",
            "x/y:80",
            "-x:80",
            "x-:80",
            "a..b:80",
            "300.1.1.1:80",
            "1.2.3:80",
            "::1:80",
            "[::1]80",
            "[zz::1]:80",
            "é.com:80",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(!is_pod_address(bad), "{bad:?}");
        }
    }
}
