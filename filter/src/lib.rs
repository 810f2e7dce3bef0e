//! prewarm-filter (under construction).
