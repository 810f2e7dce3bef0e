//! The oracle: Belady (furthest next use) bounds, and the per-request envelope that makes the
//! oracle never lose by construction.
//!
//! - **KV**: for each pod, the requests the reference routing (the `prewarm` run's) sent there,
//!   as accesses to 512-token trace blocks (keyed by the adapter and the block-id path, as KV is
//!   keyed by adapter and prefix), replayed through a cache of the pod's capacity (its KV blocks
//!   × 16 / 512 trace blocks) with Belady's rule and bypass. A request's Belady hit is the
//!   tokens of its blocks found in the cache (any block, not only leading ones), capped at the
//!   engine's `⌊(prompt − 1)/16⌋·16`. A restart empties the pod's cache. Running requests never
//!   pin blocks and output tokens take no space. This bounds any demand-fetching cache on that
//!   pod sequence. It is also what a prefix cache would reuse: blocks are keyed by their whole
//!   path, so a block's next use always comes right after its predecessor's, and Belady never
//!   keeps a block without the one before it — its hits are leading blocks. Alone (no
//!   envelope) it is the `prewarm_belady` row: `prewarm`'s routing with Belady's eviction,
//!   which splits the gap between `prewarm` (the engine's LRU on the same routing) and the
//!   oracle into eviction and routing.
//! - **Adapters**: for each pod, the adapters of its requests through `max_loras` slots with
//!   Belady's rule; a request hits when its adapter is in a slot on arrival.
//! - **Envelope**: routing other than the reference one, and prefetching (warm-up, keep-warm,
//!   touches), can beat a demand-fetching bound on one routing. The oracle's figures for a
//!   request are therefore the best of the Belady bound and of every evaluated policy on that
//!   request: hit tokens = the maximum, adapter hit = any, TTFT = the latency model at those
//!   hits with no queueing (prefill overhead + uncached tokens, plus a host→GPU copy when no
//!   slot hit), never above the best policy's TTFT. So the oracle never loses on any metric.

use std::collections::{BTreeSet, HashMap};

use podsim::LatencyProfile;
use prewarm_core::fingerprint::{chain_seed, next_block_hash};

use crate::outcome::Outcome;
use crate::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// Belady over a sequence of accesses: `hits[i]` says whether access `i` hit a cache of
/// `capacity` entries (bypass allowed). `resets` are sequence positions before which the
/// cache empties.
pub fn belady<K: Copy + Eq + std::hash::Hash + Ord>(
    accesses: &[K],
    capacity: usize,
    resets: &[usize],
) -> Vec<bool> {
    let n = accesses.len();
    let mut next = vec![usize::MAX; n];
    let mut seen: HashMap<K, usize> = HashMap::new();
    for i in (0..n).rev() {
        if let Some(k) = accesses.get(i) {
            if let (Some(&j), Some(slot)) = (seen.get(k), next.get_mut(i)) {
                *slot = j;
            }
            seen.insert(*k, i);
        }
    }
    let mut cached: HashMap<K, usize> = HashMap::new();
    let mut order: BTreeSet<(usize, K)> = BTreeSet::new();
    let mut hits = Vec::with_capacity(n);
    for (i, k) in accesses.iter().enumerate() {
        if resets.contains(&i) {
            cached.clear();
            order.clear();
        }
        let nu = next.get(i).copied().unwrap_or(usize::MAX);
        if let Some(old) = cached.get(k).copied() {
            hits.push(true);
            order.remove(&(old, *k));
            order.insert((nu, *k));
            cached.insert(*k, nu);
            continue;
        }
        hits.push(false);
        if capacity == 0 || nu == usize::MAX {
            continue;
        }
        if cached.len() >= capacity {
            match order.last().copied() {
                Some((far, victim)) if far > nu => {
                    order.remove(&(far, victim));
                    cached.remove(&victim);
                }
                _ => continue,
            }
        }
        order.insert((nu, *k));
        cached.insert(*k, nu);
    }
    hits
}

/// What the oracle needs of the run.
pub struct OracleInput<'a> {
    pub trace: &'a [TraceRequest],
    /// Model per request (adapter or base).
    pub models: &'a [String],
    pub adapters: &'a [Option<String>],
    pub gold: &'a [bool],
    /// The reference routing: pod per request (`None`: not served).
    pub pods: &'a [Option<usize>],
    /// Restart times per pod.
    pub restarts: &'a [Vec<f64>],
    pub kv_blocks: usize,
    pub block_size: usize,
    pub max_loras: usize,
    pub latency: LatencyProfile,
    pub adapter_rank: u32,
}

/// The Belady bound per request: (hit tokens, adapter hit).
pub fn belady_bounds(input: &OracleInput<'_>) -> Vec<(u64, Option<bool>)> {
    let n = input.trace.len();
    let mut out: Vec<(u64, Option<bool>)> = vec![(0, None); n];
    let pods = input
        .pods
        .iter()
        .flatten()
        .copied()
        .max()
        .map_or(0, |m| m + 1);
    let capacity = input.kv_blocks.saturating_mul(input.block_size) / TRACE_BLOCK_TOKENS;
    for pod in 0..pods {
        let requests: Vec<usize> = (0..n)
            .filter(|&i| input.pods.get(i).copied().flatten() == Some(pod))
            .collect();
        let restarts = input.restarts.get(pod).cloned().unwrap_or_default();
        let mut keys: Vec<u64> = Vec::new();
        let mut owner: Vec<(usize, u64)> = Vec::new();
        let mut kv_resets = Vec::new();
        let mut lora_keys: Vec<u64> = Vec::new();
        let mut lora_owner: Vec<usize> = Vec::new();
        let mut lora_resets = Vec::new();
        let mut last_t = f64::NEG_INFINITY;
        for &i in &requests {
            let Some(r) = input.trace.get(i) else {
                continue;
            };
            let t = r.arrival_s();
            if restarts.iter().any(|&x| x > last_t && x <= t) {
                kv_resets.push(keys.len());
                lora_resets.push(lora_keys.len());
            }
            last_t = t;
            let model = input.models.get(i).map_or("", String::as_str);
            let mut previous = chain_seed(model);
            let mut left = r.input_length;
            for id in &r.hash_ids {
                if left == 0 {
                    break;
                }
                previous = next_block_hash(previous, &id.to_le_bytes()).0;
                let tokens = left.min(TRACE_BLOCK_TOKENS as u64);
                keys.push(previous);
                owner.push((i, tokens));
                left -= tokens;
            }
            if let Some(Some(a)) = input.adapters.get(i) {
                lora_keys.push(chain_seed(a));
                lora_owner.push(i);
            }
        }
        for (hit, (i, tokens)) in belady(&keys, capacity, &kv_resets).into_iter().zip(owner) {
            if let Some(slot) = out.get_mut(i) {
                if hit {
                    slot.0 += tokens;
                }
            }
        }
        for (hit, i) in belady(&lora_keys, input.max_loras, &lora_resets)
            .into_iter()
            .zip(lora_owner)
        {
            if let Some(slot) = out.get_mut(i) {
                slot.1 = Some(hit);
            }
        }
    }
    for (i, slot) in out.iter_mut().enumerate() {
        let prompt = input.trace.get(i).map_or(0, |r| r.input_length);
        let cap = prompt.saturating_sub(1) / input.block_size as u64 * input.block_size as u64;
        slot.0 = slot.0.min(cap);
    }
    out
}

/// The oracle's outcomes: the envelope of the Belady bound and every policy's outcome per
/// request (see the module docs). `policies` are the other policies' outcomes.
pub fn envelope(input: &OracleInput<'_>, policies: &[&[Outcome]]) -> Vec<Outcome> {
    let bounds = belady_bounds(input);
    let mut best: HashMap<usize, Vec<&Outcome>> = HashMap::new();
    for outs in policies {
        for o in outs.iter() {
            best.entry(o.request).or_default().push(o);
        }
    }
    let activation = input.latency.adapter_activation(input.adapter_rank);
    let mut out = Vec::new();
    for (i, r) in input.trace.iter().enumerate() {
        let Some(pod) = input.pods.get(i).copied().flatten() else {
            continue;
        };
        let others = best.get(&i).map(Vec::as_slice).unwrap_or(&[]);
        let (bound_hit, bound_adapter) = bounds.get(i).copied().unwrap_or((0, None));
        let prompt = others.first().map_or(r.input_length, |o| o.prompt_tokens);
        let hit = others
            .iter()
            .map(|o| o.cached_tokens)
            .fold(bound_hit, u64::max)
            .min(prompt);
        let adapter_hit =
            bound_adapter.map(|b| b || others.iter().any(|o| o.adapter_hit == Some(true)));
        let model_ttft = input.latency.prefill((prompt - hit) as usize)
            + if adapter_hit == Some(false) {
                activation
            } else {
                0.0
            };
        let ttft = others.iter().map(|o| o.ttft_s).fold(model_ttft, f64::min);
        out.push(Outcome {
            request: i,
            arrival_s: r.arrival_s(),
            pod,
            prompt_tokens: prompt,
            cached_tokens: hit,
            cached_elsewhere_tokens: None,
            ttft_s: ttft,
            adapter_hit,
            gold: input.gold.get(i).copied().unwrap_or(false),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn belady_keeps_what_comes_back_soonest() {
        // capacity 2: 1 2 3 1 2 3 ... LRU misses every time; Belady hits 4 of 9
        let seq: Vec<u32> = [1, 2, 3, 1, 2, 3, 1, 2, 3].to_vec();
        let hits = belady(&seq, 2, &[]);
        assert_eq!(hits.iter().filter(|h| **h).count(), 4);
        assert!(!hits[0] && !hits[1] && !hits[2]);
        // a reset forgets everything
        let hits = belady(&[1u32, 1, 1], 4, &[2]);
        assert_eq!(hits, vec![false, true, false]);
    }
}
