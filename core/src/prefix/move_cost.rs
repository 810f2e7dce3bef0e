//! What moving a request off a pod costs against what waiting there costs: the rule behind
//! [`route_prefix`](super::route_prefix)'s steps 3 and 4 when the table prices a move
//! (`prefill_us_per_token`) and gives the pods' predicted queue waits (`wait_ms`).
//!
//! Moving a request prefills on the other pod what it matched where it was (taken as uncached
//! there: step 3 tries the entry's other holders first, and a pod that holds it too only makes
//! moving cheaper), and the request
//! then waits that pod's queue. What it matched is its matched blocks — or, on the entry's
//! newest holder, for a prompt longer than the index keys whose match reaches its deepest key,
//! the whole prompt
//! ([`PromptKeys::held_tokens`]: step 3 sticks on that assumption, and a move prefills the
//! session's whole context again). So a pod keeps a request while
//!
//! ```text
//! wait(here) ≤ matched tokens × prefill_us_per_token ÷ (1 − ρ(there)) + wait(there)
//! ```
//!
//! The prefill a move adds lands on a pod that is serving others, and a pod's compute is
//! shared: the requests queued behind the moved one wait for it too. In a queue whose server
//! is busy a share ρ of the time, work `S` added to it costs `S ÷ (1 − ρ)` in all — its own
//! `S` and `S × ρ ÷ (1 − ρ)` of delay imposed on the requests after it (the M/M/1 scaling of
//! response time) — while staying adds only the request's uncached tail. Hence the division,
//! with ρ the table's load of that pod (its busy share of the last minute) capped at
//! [`MAX_BUSY`]: an idle pod (a joining one) takes a move at its own price, a pod busy all
//! minute at twenty times it. Measured in the offline
//! evaluator on agentic sessions with shared prefill compute (`--prefill-compute shared`:
//! ≈ 100 k-token contexts whose move re-prefills 25 s): without the factor prewarm moved
//! sessions off busy holders onto pods as busy, each move queued the next, and token hit fell
//! to 0.666 (TTFT p95 142 s, SGLang's router 0.941 / 36.8 s); docs/evaluation.md has the
//! figures with it.
//!
//! For a request the index matched nothing of, the matched part is the whole prompt — the
//! most the placed pod can hold of it (a warmed hot prefix, a common system prompt) — and
//! "there" is the pod with the shortest wait. The waits assume a batching engine: a request
//! starts at once while the batch has room, so a busy pod with room costs no wait
//! (docs/routing.md says what else the rule assumes).

use crate::placement::clean_load;
use crate::wire::{RoutedPod, RoutingTable};

use super::PromptKeys;

/// The busiest a pod is taken to be when pricing a move onto it: a pod busy all of the last
/// minute says nothing of how far over capacity it is, and `1 ÷ (1 − 0.95)` = 20 × the
/// request's own prefill already keeps a long context where it is.
pub const MAX_BUSY: f64 = 0.95;

/// What prefilling `tokens` costs at the table's price, ms; `None` without a price.
fn move_price_ms(table: &RoutingTable, tokens: usize) -> Option<f64> {
    table
        .prefill_us_per_token
        .map(|us| tokens as f64 * us / 1000.0)
}

/// Whether the holder (`pool[pod]`, holding `held_tokens` of the prompt) keeps the request
/// against a move to `alt` (`None`: not chosen yet, the cheapest move, to an idle pod without
/// a wait); `None` without a price or the holder's wait (the load cap decides then).
pub(super) fn holder_keeps(
    table: &RoutingTable,
    pool: &[&RoutedPod],
    (pod, held_tokens): (usize, usize),
    alt: Option<usize>,
) -> Option<bool> {
    let wait = |i: usize| pool.get(i).and_then(|p| p.wait_ms);
    let here = wait(pod)?;
    let price = move_price_ms(table, held_tokens)?;
    let elsewhere = alt.and_then(wait).unwrap_or(0) as f64;
    let busy = alt
        .and_then(|i| pool.get(i))
        .map_or(0.0, |p| clean_load(p.load).min(MAX_BUSY));
    Some(here as f64 <= price / (1.0 - busy) + elsewhere)
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
    let tokens = keys.prompt_tokens();
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
