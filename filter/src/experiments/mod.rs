//! The filter's side of experiments (`prewarm_core::experiment`): each inspected request's arm
//! of the routing table's experiment, and each one's outcome as the client saw it, for the
//! gateway's attribution.
//!
//! - [`arm`]: assigns a request its arm by its unit (user, tenant or connection), sets the arm
//!   header, and gives the arm's settings (whether and with which view of the table it is
//!   routed).
//! - [`outcome`]: watches a request's response (status, time to first byte, usage) and
//!   enqueues its outcome record when the stream is done.
//!
//! Invariants: an arm is core's hash of the unit and the experiment, so every worker and every
//! proxy puts a unit in the same arm with no state kept; the client's own arm header never
//! passes (the request path removes it); a request with no unit gets no arm and is routed as
//! without an experiment, counted. A response is watched as it streams, never held or changed,
//! and only up to a bound.

pub mod arm;
pub mod outcome;
