//! What moving a request off a pod costs against what waiting there costs: the rule behind
//! [`route_prefix`](super::route_prefix)'s steps 3 and 4 when the table prices a move
//! (`prefill_us_per_token`) and gives the pods' predicted queue waits (`wait_ms`).
//!
//! Moving a request prefills on the other pod what it matched where it was (taken as uncached
//! there: a pod that holds it too is rare and only makes moving cheaper), and the request
//! then waits that pod's queue. So a pod keeps a request while
//!
//! ```text
//! wait(here) ≤ matched tokens × prefill_us_per_token + wait(there)
//! ```
//!
//! For a request the index matched nothing of, the matched part is the whole prompt — the
//! most the placed pod can hold of it (a warmed hot prefix, a common system prompt) — and
//! "there" is the pod with the shortest wait. The waits assume a batching engine: a request
//! starts at once while the batch has room, so a busy pod with room costs no wait
//! (docs/routing.md says what else the rule assumes).

use crate::wire::{RoutedPod, RoutingTable};

use super::PromptKeys;

/// What prefilling `tokens` costs at the table's price, ms; `None` without a price.
fn move_price_ms(table: &RoutingTable, tokens: usize) -> Option<f64> {
    table
        .prefill_us_per_token
        .map(|us| tokens as f64 * us / 1000.0)
}

/// Whether the holder (`pool[pod]`, `blocks` matched there) keeps the request against a move
/// to `alt` (`None`: not chosen yet, the cheapest move, to a pod without a wait); `None`
/// without a price or the holder's wait (the load cap decides then).
pub(super) fn holder_keeps(
    table: &RoutingTable,
    pool: &[&RoutedPod],
    (pod, blocks): (usize, usize),
    alt: Option<usize>,
) -> Option<bool> {
    let wait = |i: usize| pool.get(i).and_then(|p| p.wait_ms);
    let here = wait(pod)?;
    let price = move_price_ms(table, blocks.saturating_mul(table.block_tokens))?;
    let elsewhere = alt.and_then(wait).unwrap_or(0) as f64;
    Some(here as f64 <= price + elsewhere)
}

/// Step 4's last word: the pod of `pool` with the shortest wait instead of the placed one
/// (`placed`) when `placed`'s wait exceeds it by more than prefilling the whole prompt costs —
/// the most the placed pod can hold of it (module doc). `placed` without a price or its wait.
pub(super) fn shorter_wait(
    table: &RoutingTable,
    pool: &[&RoutedPod],
    placed: usize,
    keys: &PromptKeys,
) -> usize {
    let tokens = keys.blocks.len().saturating_mul(table.block_tokens);
    let (Some(price), Some(here)) = (
        move_price_ms(table, tokens),
        pool.get(placed).and_then(|p| p.wait_ms),
    ) else {
        return placed;
    };
    let Some((best, wait)) = pool
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.wait_ms.map(|w| (i, w)))
        .min_by_key(|&(i, w)| (w, i != placed))
    else {
        return placed;
    };
    if here as f64 > wait as f64 + price {
        best
    } else {
        placed
    }
}
