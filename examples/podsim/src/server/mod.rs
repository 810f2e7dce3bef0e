//! HTTP shell (under construction).
