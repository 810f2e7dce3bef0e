//! Attribution of experiments: the filters' outcome records (`OutcomeRecord`, one per request,
//! measured at the proxy) summed in an [`ledger::OutcomeLedger`], and the per-arm report with
//! its significance tests ([`report`], [`stats`]; adjusted for prompt length: [`adjusted`]),
//! the grey release's decisions ([`release`]) and the warm-up's latency per key they read
//! ([`warmup`]); two samples held elsewhere compared by the same rule ([`compare`]); the new
//! pods' first requests of hot prefixes, the cohort a warm-up acts on ([`first_requests`]).
//! See docs/experiments.md#outcomes.

pub mod adjusted;
pub mod compare;
pub mod first_requests;
pub mod ledger;
pub mod release;
pub mod report;
pub mod stats;
pub mod warmup;
