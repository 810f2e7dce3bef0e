//! The modelled hit ratio of each routable pod: of the hot prefixes (the pool's hottest, up to
//! the warm-up tiers' size) that placement routes to the pod, the share its KV model believes
//! resident. Exported as `prewarm_modelled_hit_ratio{pod}`; a pod no hot prefix routes to has no
//! ratio.

use prewarm_core::place;

use super::placement::{adapter_scopes, candidates_of, routable_pods};
use super::State;
use crate::config::GatewayConfig;
use crate::policy::candidates_for;

/// (pod id, ratio in [0, 1]) for every routable pod some hot prefix routes to.
pub fn modelled_hit_ratios(
    state: &State,
    config: &GatewayConfig,
    now_ms: u64,
) -> Vec<(String, f64)> {
    let routable = routable_pods(state, now_ms);
    let candidates = candidates_of(&routable);
    let limit = config
        .warmup
        .first_tier
        .saturating_add(config.warmup.second_tier);
    let scopes = adapter_scopes(state, &candidates, &config.pods, now_ms);
    let mut counts = vec![(0u64, 0u64); candidates.len()];
    for hot in state.pool.hot_prefixes(limit, &config.fingerprint.core()) {
        let among = candidates_for(hot.key.model, &candidates, &scopes);
        let Some(c) = place(hot.routing_key.0, among).and_then(|i| among.get(i)) else {
            continue;
        };
        let Some(i) = candidates.iter().position(|x| x.id == c.id) else {
            continue;
        };
        let Some(count) = counts.get_mut(i) else {
            continue;
        };
        count.1 += 1;
        if state
            .pods
            .get(c.id)
            .is_some_and(|p| p.kv.is_resident(&hot.key))
        {
            count.0 += 1;
        }
    }
    candidates
        .iter()
        .zip(counts)
        .filter(|(_, (_, total))| *total > 0)
        .map(|(c, (hits, total))| (c.id.to_string(), hits as f64 / total as f64))
        .collect()
}
