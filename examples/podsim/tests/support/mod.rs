//! What more than one of podsim's test binaries reads.

/// The value of the first sample in a Prometheus text exposition whose line starts with
/// `prefix` (a name, or a name with the start of its labels); panics, showing the text, when
/// there is none.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}
