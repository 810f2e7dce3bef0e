//! replay (under construction).
