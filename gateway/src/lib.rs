//! prewarm-gateway (under construction).
