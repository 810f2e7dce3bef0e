//! Rendering trace blocks as text, so the whole stack hashes real bytes.
//!
//! Each 512-token block id becomes a fixed, deterministic 2,048-byte text (4 bytes a token):
//! lower-case pseudo-words drawn from a splitmix64 generator seeded by the id. Equal ids give
//! byte-identical text, so requests sharing leading ids share a byte prefix and therefore a
//! prefix of every block chain (core's 64-token fingerprints, podsim's 16-token KV blocks). A
//! request's prompt is its blocks' texts concatenated and cut to `input_length` tokens; it is
//! sent as a completion prompt, so the canonical prompt is the text itself.
//!
//! [`ChainMemo`] computes core's fingerprint chain of a rendered prompt from the block ids,
//! remembering the eight 64-token hashes each (previous hash, block id) step yields, so a
//! prefix shared by many requests is hashed once. It equals `BlockChain::of` (tested).

use std::collections::HashMap;

use prewarm_core::fingerprint::{chain_seed, next_block_hash, BlockChain, FingerprintConfig};
use prewarm_core::tokens::{token_bytes, token_count};
use prewarm_core::BlockHash;

use crate::trace::{TraceRequest, TRACE_BLOCK_TOKENS};

/// Bytes of one rendered trace block.
pub const BLOCK_BYTES: usize = TRACE_BLOCK_TOKENS * prewarm_core::tokens::BYTES_PER_TOKEN;

/// splitmix64: the deterministic generator behind block texts and seeded draws.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The fixed text of block `id`: exactly [`BLOCK_BYTES`] ASCII bytes.
pub fn block_text(id: u64) -> String {
    let mut state = id ^ 0x7072_6577_6172_6d62;
    let mut out: Vec<u8> = Vec::with_capacity(BLOCK_BYTES + 16);
    while out.len() < BLOCK_BYTES {
        let r = splitmix64(&mut state);
        let len = 2 + (r % 7) as usize;
        out.extend((0..len).map(|k| b'a' + ((r >> (8 + 5 * k)) % 26) as u8));
        out.push(b' ');
    }
    out.truncate(BLOCK_BYTES);
    // only ASCII letters and spaces were written
    String::from_utf8(out).unwrap_or_default()
}

/// Block texts by id, rendered once each.
#[derive(Debug, Default)]
pub struct BlockTexts {
    texts: HashMap<u64, String>,
}

impl BlockTexts {
    pub fn get(&mut self, id: u64) -> &str {
        self.texts.entry(id).or_insert_with(|| block_text(id))
    }

    /// The prompt of `request`: its blocks' texts, cut to `input_length` tokens.
    pub fn prompt(&mut self, request: &TraceRequest) -> String {
        let want = token_bytes(request.input_length as usize);
        let mut out = String::with_capacity(want.min(request.hash_ids.len() * BLOCK_BYTES));
        for id in &request.hash_ids {
            if out.len() >= want {
                break;
            }
            let text = self.get(*id);
            let take = (want - out.len()).min(text.len());
            out.push_str(text.get(..take).unwrap_or(""));
        }
        out
    }
}

/// Memoised fingerprint chains of rendered prompts; see the module docs.
#[derive(Debug)]
pub struct ChainMemo {
    config: FingerprintConfig,
    steps: HashMap<(u64, u64), Vec<BlockHash>>,
}

impl ChainMemo {
    /// `config.block_tokens` must divide 512 (core's rule for valid configs).
    pub fn new(config: FingerprintConfig) -> Self {
        Self {
            config,
            steps: HashMap::new(),
        }
    }

    pub fn config(&self) -> &FingerprintConfig {
        &self.config
    }

    /// `BlockChain::of(model, prompt, config)` where `prompt` is the rendering of `request`.
    pub fn chain(
        &mut self,
        model: &str,
        request: &TraceRequest,
        texts: &mut BlockTexts,
    ) -> BlockChain {
        let prompt_tokens =
            (request.input_length as usize).min(request.hash_ids.len() * TRACE_BLOCK_TOKENS);
        let hashed_tokens = prompt_tokens.min(self.config.max_prefix_tokens);
        let block_bytes = self.config.block_bytes();
        let mut blocks = Vec::with_capacity(hashed_tokens / self.config.block_tokens.max(1));
        let mut previous = chain_seed(model);
        let mut covered = 0usize;
        for id in &request.hash_ids {
            let remaining = hashed_tokens.saturating_sub(covered);
            if remaining < self.config.block_tokens {
                break;
            }
            if remaining >= TRACE_BLOCK_TOKENS {
                let step = self.steps.entry((previous, *id)).or_insert_with(|| {
                    let text = texts.get(*id);
                    let mut p = previous;
                    text.as_bytes()
                        .chunks_exact(block_bytes)
                        .map(|b| {
                            let h = next_block_hash(p, b);
                            p = h.0;
                            h
                        })
                        .collect()
                });
                blocks.extend_from_slice(step);
                previous = step.last().map_or(previous, |h| h.0);
                covered += TRACE_BLOCK_TOKENS;
            } else {
                let text = texts.get(*id);
                let bytes = text.as_bytes().get(..token_bytes(remaining)).unwrap_or(&[]);
                for b in bytes.chunks_exact(block_bytes) {
                    let h = next_block_hash(previous, b);
                    previous = h.0;
                    blocks.push(h);
                }
                break;
            }
        }
        BlockChain {
            blocks,
            prompt_tokens: token_count(token_bytes(prompt_tokens)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64], input_length: u64) -> TraceRequest {
        TraceRequest::synthetic(0, ids, input_length, 1)
    }

    #[test]
    fn equal_ids_render_equal_bytes_and_prompts_are_cut() {
        assert_eq!(block_text(7), block_text(7));
        assert_ne!(block_text(7), block_text(8));
        assert_eq!(block_text(7).len(), BLOCK_BYTES);
        let mut texts = BlockTexts::default();
        let a = texts.prompt(&req(&[1, 2, 3], 1100));
        let b = texts.prompt(&req(&[1, 2, 9], 1500));
        assert_eq!(a.len(), 4400);
        assert_eq!(a.get(..4096), b.get(..4096));
        assert_ne!(a.get(4096..4400), b.get(4096..4400));
    }

    #[test]
    fn memoised_chain_equals_core() {
        let mut texts = BlockTexts::default();
        for config in [
            FingerprintConfig::default(),
            FingerprintConfig {
                block_tokens: 16,
                max_prefix_tokens: 700,
            },
        ] {
            let mut memo = ChainMemo::new(config);
            for (ids, len) in [
                (vec![1u64, 2, 3], 1100u64),
                (vec![1, 2, 4], 1536),
                (vec![5], 70),
                (vec![5], 10),
            ] {
                for model in ["base", "adapter-a"] {
                    let r = req(&ids, len);
                    let want = BlockChain::of(model, texts.prompt(&r).as_bytes(), &config);
                    assert_eq!(memo.chain(model, &r, &mut texts), want, "{ids:?} {len}");
                }
            }
        }
    }
}
