//! podsim (under construction).
