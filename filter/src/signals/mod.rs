//! Signals: what requests tell the gateway, from the request that causes them to the batch a
//! root tick sends. The decisions (streaks, rates, triggers, pins) are core's; this part owns
//! their state and the way there.
//!
//! - [`observe`]: a request's observation against the state kept in shared data (the user's
//!   prompt pattern, pattern and adapter rates, shared prompts), and [`observe::fold_tally`],
//!   which folds this VM's tallies into it on the tick.
//! - [`tally`], [`prompt_tally`]: per-VM counts of adapter requests, hot-prefix uses and
//!   successes, and shared prompts per routing key, kept off shared data until the tick.
//! - [`queue`]: the signal, served-record and outcome queues every worker appends to and a root
//!   tick drains into one `SignalBatch`; each a [`ring::SharedRing`] in shared data.
//!
//! Invariants: the request path costs at most one shared-data update for its observation (the
//! rest is tallied per VM and folded on the tick), because each shared-data call takes Envoy's
//! process-wide lock; every tally and queue is bounded (keys, slots, bytes), and what does not
//! fit is dropped and counted, the queues' drops travelling in the next batch; nothing here
//! pauses a request or calls out from one.

pub mod observe;
pub mod prompt_tally;
pub mod queue;
pub mod ring;
pub mod tally;
