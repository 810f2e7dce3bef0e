//! podsim binary (under construction).
fn main() {}
