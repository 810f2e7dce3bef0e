//! The `--system-prompt-tokens N` scenario: every request's prompt starts with the same
//! N-token system prompt, as most chat applications' requests do.
//!
//! The system prompt is N / 512 trace blocks prepended to every request's `hash_ids` (and N
//! added to its `input_length`), with reserved ids [`SYSTEM_PROMPT_FIRST_ID`]`, +1, …` that no
//! Mooncake trace uses; the renderer turns them into the same deterministic text for every
//! request (seeded by the id, 4 bytes a token like every block), so every layer — the filter's
//! fingerprints, podsim's KV blocks, the routers' trees, the oracle's trace blocks — sees one
//! shared prefix. N must be a multiple of 512: a Mooncake trace expresses sharing in whole
//! 512-token blocks, and a system prompt ending inside a block would need a block shared by
//! some requests' text and not others'.
//!
//! A request keeps its prefix group (the adapter draw, the filter's `user`): the transform runs
//! after the assignment, and a request without a `user` gets the one its first own block gave
//! (a `no_user` request stays without one). A request that names its own system prompt
//! (`system_blocks`, an application workload's) has this one in front of it: its system message
//! becomes both.

use crate::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// The id of the system prompt's first block.
pub const SYSTEM_PROMPT_FIRST_ID: u64 = 0xF000_0000_0000_0000;
/// Longest accepted system prompt, in tokens.
pub const MAX_SYSTEM_PROMPT_TOKENS: u64 = 65_536;

/// Checks `--system-prompt-tokens`; `Err` names the flag.
pub fn check(tokens: u64) -> Result<(), String> {
    let block = TRACE_BLOCK_TOKENS as u64;
    if tokens > MAX_SYSTEM_PROMPT_TOKENS || !tokens.is_multiple_of(block) {
        return Err(format!(
            "--system-prompt-tokens: {tokens}: must be a multiple of {block} between 0 and {MAX_SYSTEM_PROMPT_TOKENS}"
        ));
    }
    Ok(())
}

/// `trace` with a `tokens`-token system prompt in front of every request (unchanged for 0).
pub fn with_system_prompt(trace: Vec<TraceRequest>, tokens: u64) -> Vec<TraceRequest> {
    let blocks = tokens / TRACE_BLOCK_TOKENS as u64;
    if blocks == 0 {
        return trace;
    }
    let prefix: Vec<u64> = (0..blocks).map(|k| SYSTEM_PROMPT_FIRST_ID + k).collect();
    trace
        .into_iter()
        .map(|mut r| {
            if !r.no_user {
                r.user = Some(r.user_key());
            }
            r.system_blocks = r.system_blocks.map(|n| n.saturating_add(blocks as usize));
            let mut ids = prefix.clone();
            ids.append(&mut r.hash_ids);
            r.hash_ids = ids;
            r.input_length = r.input_length.saturating_add(tokens);
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::BlockTexts;
    use podsim::prefix_cache::prompt_block_hashes;

    fn trace() -> Vec<TraceRequest> {
        vec![
            TraceRequest::synthetic(0, &[1, 2], 1000, 4),
            TraceRequest::synthetic(5, &[7], 300, 4),
            TraceRequest::synthetic(9, &[1, 3, 4], 1100, 4),
        ]
    }

    #[test]
    fn zero_tokens_leave_the_trace_unchanged() {
        assert_eq!(with_system_prompt(trace(), 0), trace());
    }

    #[test]
    fn a_system_prompt_makes_every_requests_first_blocks_equal() {
        let engine_block_tokens = 16;
        for tokens in [512u64, 2048] {
            let shared = (tokens as usize).div_ceil(engine_block_tokens);
            let trace = with_system_prompt(trace(), tokens);
            let mut texts = BlockTexts::default();
            let chains: Vec<Vec<u64>> = trace
                .iter()
                .map(|r| prompt_block_hashes("base", texts.prompt(r).as_bytes(), 64))
                .collect();
            for (r, c) in trace.iter().zip(&chains) {
                assert_eq!(c.len() as u64, (r.input_length) / 16, "{r:?}");
                assert_eq!(c.get(..shared), chains[0].get(..shared), "{tokens}");
            }
            // what follows the system prompt is each request's own text
            assert_ne!(chains[0].get(shared), chains[1].get(shared));
            assert_eq!(trace[0].user_key(), "group-1");
            assert_eq!(trace[1].user_key(), "group-7");
        }
    }

    #[test]
    fn lengths_that_are_not_whole_trace_blocks_are_refused_naming_the_flag() {
        assert!(check(0).is_ok() && check(512).is_ok() && check(65_536).is_ok());
        for bad in [100, 513, 65_537 + 511] {
            assert!(check(bad)
                .unwrap_err()
                .starts_with(&format!("--system-prompt-tokens: {bad}:")));
        }
    }
}
