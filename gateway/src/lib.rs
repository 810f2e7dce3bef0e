//! prewarm-gateway (under construction).

pub mod policy;
