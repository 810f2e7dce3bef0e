//! Seeding the index with where the gateway warmed hot prefixes (the routing table's
//! `prefixes`): when a pod joins, its warm-up prefills the hot prefixes the new placement
//! gives it, but the index still names the pods that served them before, and a branch off
//! a prefix sticks to the pod the index names. A seed rewrites the prefix's deepest entries
//! (`PromptKeys::placed`: its deepest full shard's end and its partial shard's blocks) to the
//! warmed pod, so its next requests go there; the pod it named before stays among its earlier
//! holders (it still has the prefix). A seed writes each entry as interior (prompts go on past
//! a hot prefix) and keeps its count of moves: the gateway's placement is not traffic moving
//! between pods. An entry that already
//! names the pod, written within the refresh interval, is left alone: applying an unchanged
//! list costs one read a prefix.

use super::{entry_of, pod_hash, PrefixEntry, PrefixStore, REFRESH_FRACTION};
use crate::wire::PlacedPrefix;

/// Writes `prefixes` into `store` at `now_ms`; returns the writes the store refused.
pub fn seed<S: PrefixStore + ?Sized>(
    store: &mut S,
    prefixes: &[PlacedPrefix],
    now_ms: u64,
    horizon_ms: u64,
) -> u64 {
    let refresh = horizon_ms / REFRESH_FRACTION;
    let mut refused = 0u64;
    for (p, hash) in prefixes
        .iter()
        .flat_map(|p| p.keys.iter().map(move |k| (p, k.0)))
    {
        let pod = pod_hash(&p.pod);
        let old = entry_of(store, hash).filter(|e| e.fresh(now_ms, horizon_ms));
        if old.is_some_and(|e| e.pod == pod && now_ms.saturating_sub(e.at_ms) < refresh) {
            continue;
        }
        let entry = PrefixEntry {
            interior: true,
            moves: old.map_or(0, |e| e.moves),
            ..PrefixEntry::sent_to(old.as_ref(), hash, pod, now_ms, horizon_ms)
        };
        if !store.write(super::slot_of(hash, store.slots()), &entry.encode()) {
            refused = refused.saturating_add(1);
        }
    }
    refused
}
