//! The interface the event loop drives a policy through, and what a policy sees of a request.

use podsim::Admission;
use prewarm_core::{place, BlockChain, FingerprintConfig};
use prewarm_gateway::policy::Tier;

use super::fleet::Fleet;
use crate::scenario::FleetEvent;

/// One trace request as policies see it.
#[derive(Debug)]
pub struct RequestCtx<'a> {
    pub index: usize,
    pub now_s: f64,
    /// The `model` field: the adapter, or the base model.
    pub model: &'a str,
    pub adapter: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub tier: Tier,
    /// The user the filter's similarity trigger keys on; none for a request that names none.
    pub user: Option<&'a str>,
    /// The canonical prompt.
    pub canonical: &'a str,
    /// Core's fingerprint chain of the canonical prompt.
    pub chain: &'a BlockChain,
    /// The tokens it asks for (`max_tokens`).
    pub max_tokens: u64,
}

/// A routing and warming policy over the simulated fleet.
pub trait Policy {
    fn name(&self) -> &'static str;

    /// A fleet event happened at `now_s` (the fleet has already applied it).
    fn on_event(&mut self, fleet: &mut Fleet, event: FleetEvent, now_s: f64);

    /// The earliest time the policy wants [`Policy::advance`] called, if any.
    fn next_wakeup(&self) -> Option<f64> {
        None
    }

    /// Background work due at `now_s` (keep-warm, warm-up steps).
    fn advance(&mut self, _fleet: &mut Fleet, _now_s: f64) {}

    /// The pod for a request.
    fn route(&mut self, fleet: &Fleet, request: &RequestCtx<'_>) -> usize;

    /// The request was admitted on `pod`.
    fn served(
        &mut self,
        _fleet: &mut Fleet,
        _request: &RequestCtx<'_>,
        _pod: usize,
        _admission: &Admission,
    ) {
    }

    /// Prompt tokens the policy's own requests made pods prefill (warm-up, keep-warm,
    /// touches); `None` for policies that send none.
    fn warmup_prefill_tokens(&self) -> Option<u64> {
        None
    }
}

/// Core placement of `chain` among `pool` (pod indices of `fleet`), as the filter places: the
/// routing key of the chain, plain rendezvous over the pods' ids with equal weights. `None`
/// when the prompt has no full block or the pool is empty.
pub fn place_among(
    fleet: &Fleet,
    pool: &[usize],
    chain: &BlockChain,
    fingerprint: &FingerprintConfig,
) -> Option<usize> {
    let key = chain.routing_key(fingerprint)?;
    let candidates = fleet.candidates(pool);
    place(key.0, &candidates).and_then(|i| pool.get(i).copied())
}
