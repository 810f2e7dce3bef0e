//! Block fingerprints: the canonical prompt cut into blocks of `block_tokens` tokens (4 bytes a
//! token), each block's hash chaining the previous one, the chain seeded by the model or adapter.
//!
//! A prefix is therefore a chain of hashes, comparable across requests and processes: two prompts
//! share their first `k` blocks exactly when their chains agree on the first `k` hashes. Only full
//! blocks are hashed (as in vLLM's prefix cache). The hash is XXH3-64 with explicit seeds, which
//! is specified byte-for-byte and gives the same value on wasm32 and x86_64 and across releases;
//! the stability vectors in the tests pin it.
//!
//! Blocks group into 512-token shards (the KV shard unit) carrying `base_offset` and `valid_len`.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::tokens::{token_bytes, token_count, BYTES_PER_TOKEN};

/// The hash of one block, chained over every block before it.
/// Serialised as 16 lower-case hex digits (a JSON number cannot carry a u64 to every reader).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

impl Serialize for BlockHash {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for BlockHash {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom("block hash: expected 16 hex digits"))
    }
}

impl BlockHash {
    /// Lower-case, zero-padded hex: the form fingerprints take in logs, APIs and snapshots.
    pub fn to_hex(self) -> String {
        format!("{:016x}", self.0)
    }

    /// Parses the [`to_hex`](Self::to_hex) form.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(Self)
    }
}

/// Tokens in a shard, the unit in which warm prefixes are tracked.
pub const SHARD_TOKENS: usize = 512;

/// Domain tag mixed into the chain's seed so prewarm's hashes never collide with another use of
/// XXH3 over the model name.
const SEED_DOMAIN: u64 = 0x7072_6577_6172_6d31; // "prewarm1"

/// How prompts are cut into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FingerprintConfig {
    /// Tokens per block (default 64). Must divide [`SHARD_TOKENS`].
    pub block_tokens: usize,
    /// Only this many leading tokens are fingerprinted (default 32,768), so the work per request
    /// is bounded however long the prompt.
    pub max_prefix_tokens: usize,
}

impl Default for FingerprintConfig {
    fn default() -> Self {
        Self {
            block_tokens: 64,
            max_prefix_tokens: 32_768,
        }
    }
}

impl FingerprintConfig {
    /// Every problem with this configuration, as `field: value: rule`.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.block_tokens == 0 || !SHARD_TOKENS.is_multiple_of(self.block_tokens) {
            problems.push(format!(
                "block_tokens: {}: must be a divisor of {SHARD_TOKENS} greater than 0",
                self.block_tokens
            ));
        }
        if self.max_prefix_tokens == 0 || self.max_prefix_tokens > 1 << 20 {
            problems.push(format!(
                "max_prefix_tokens: {}: must be between 1 and 1048576",
                self.max_prefix_tokens
            ));
        }
        problems
    }

    /// Bytes of canonical prompt in one block.
    pub fn block_bytes(&self) -> usize {
        token_bytes(self.block_tokens.max(1))
    }

    /// Blocks in one 512-token shard.
    pub fn blocks_per_shard(&self) -> usize {
        (SHARD_TOKENS / self.block_tokens.max(1)).max(1)
    }

    /// Whether a chain of `blocks` blocks reached `max_prefix_tokens`: fingerprinting stopped
    /// there, so the prompt may go on past it.
    pub fn reaches_cap(&self, blocks: usize) -> bool {
        let cap = self.max_prefix_tokens / self.block_tokens.max(1);
        cap > 0 && blocks >= cap
    }
}

/// The seed of a chain: the model (or adapter) the prompt is for. Blocks of the same text for
/// different adapters are different cache entries, as in vLLM.
pub fn chain_seed(model: &str) -> u64 {
    xxh3_64_with_seed(model.as_bytes(), SEED_DOMAIN)
}

/// The hash of the block after `previous` holding `block`.
pub fn next_block_hash(previous: u64, block: &[u8]) -> BlockHash {
    BlockHash(xxh3_64_with_seed(block, previous))
}

/// The full-block hash chain of a canonical prompt.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BlockChain {
    /// One hash per full block, in order.
    pub blocks: Vec<BlockHash>,
    /// Tokens in the whole canonical prompt (not only the fingerprinted part).
    pub prompt_tokens: usize,
}

impl BlockChain {
    /// Fingerprints `canonical` for `model`: at most `max_prefix_tokens` tokens, full blocks only.
    pub fn of(model: &str, canonical: &[u8], config: &FingerprintConfig) -> Self {
        let block_bytes = config.block_bytes();
        let limit = token_bytes(config.max_prefix_tokens).min(canonical.len());
        let hashed = canonical.get(..limit).unwrap_or(&[]);
        let mut previous = chain_seed(model);
        let blocks = hashed
            .chunks_exact(block_bytes)
            .map(|block| {
                let h = next_block_hash(previous, block);
                previous = h.0;
                h
            })
            .collect();
        Self {
            blocks,
            prompt_tokens: token_count(canonical.len()),
        }
    }

    /// The last hash of the chain: the fingerprint of the whole fingerprinted prefix.
    pub fn prefix_fingerprint(&self) -> Option<BlockHash> {
        self.blocks.last().copied()
    }

    /// Number of leading blocks `self` and `other` share.
    pub fn common_prefix_len(&self, other: &[BlockHash]) -> usize {
        common_prefix_len(&self.blocks, other)
    }

    /// The routing key of this prompt: the hash of its first shard's last full block (or of its
    /// last full block when shorter), so requests that share a template's first shard land on
    /// the same pod whatever follows. `None` when the prompt has no full block.
    pub fn routing_key(&self, config: &FingerprintConfig) -> Option<BlockHash> {
        routing_key(&self.blocks, config)
    }

    /// The chain grouped into 512-token shards.
    pub fn shards(&self, config: &FingerprintConfig) -> Vec<Shard> {
        shards_of(&self.blocks, config)
    }
}

/// Number of leading hashes two chains share.
pub fn common_prefix_len(a: &[BlockHash], b: &[BlockHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The routing key of a chain; see [`BlockChain::routing_key`].
pub fn routing_key(blocks: &[BlockHash], config: &FingerprintConfig) -> Option<BlockHash> {
    key_past_shards(blocks, 0, config)
}

/// The placement key of a chain whose first `shards` shards are common (held by several pods,
/// as `prefix::PrefixEntry::common` says): the hash ending the next shard, or the chain's last
/// block when it ends within that shard. [`routing_key`] is the case of no common shard.
pub fn key_past_shards(
    blocks: &[BlockHash],
    shards: usize,
    config: &FingerprintConfig,
) -> Option<BlockHash> {
    end_past_shards(blocks, shards, config.blocks_per_shard())
}

/// The item ending shard `shards` of `items` (`per_shard` a shard), or the last one.
pub(crate) fn end_past_shards<T: Copy>(items: &[T], shards: usize, per_shard: usize) -> Option<T> {
    let end = shards
        .saturating_add(1)
        .saturating_mul(per_shard.max(1))
        .min(items.len());
    end.checked_sub(1).and_then(|i| items.get(i)).copied()
}

/// A 512-token shard of a chain: where it starts, how much of it is filled, and the hash that
/// identifies everything up to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    /// Token offset of the shard's first token in the prompt.
    pub base_offset: usize,
    /// Tokens of the shard covered by full blocks (≤ 512).
    pub valid_len: usize,
    /// The chain hash of the shard's last full block.
    pub last_block: BlockHash,
}

/// The shards of a chain of `chained_tokens` tokens whose shard hashes are `last_blocks` (the
/// inverse of [`shards_of`] for a chain sent as its shard hashes).
pub fn shards_from_hashes(last_blocks: &[BlockHash], chained_tokens: u64) -> Vec<Shard> {
    last_blocks
        .iter()
        .enumerate()
        .map(|(index, last)| {
            let base_offset = index.saturating_mul(SHARD_TOKENS);
            let left = usize::try_from(chained_tokens)
                .unwrap_or(usize::MAX)
                .saturating_sub(base_offset);
            Shard {
                index,
                base_offset,
                valid_len: left.min(SHARD_TOKENS),
                last_block: *last,
            }
        })
        .collect()
}

/// Groups a chain into shards.
pub fn shards_of(blocks: &[BlockHash], config: &FingerprintConfig) -> Vec<Shard> {
    let per = config.blocks_per_shard();
    blocks
        .chunks(per)
        .enumerate()
        .filter_map(|(index, chunk)| {
            chunk.last().map(|last| Shard {
                index,
                base_offset: index.saturating_mul(SHARD_TOKENS),
                valid_len: chunk.len().saturating_mul(config.block_tokens),
                last_block: *last,
            })
        })
        .collect()
}

/// Tokens covered by `blocks` full blocks.
pub fn blocks_to_tokens(blocks: usize, config: &FingerprintConfig) -> usize {
    blocks.saturating_mul(config.block_tokens)
}

/// Bytes of canonical prompt covered by `blocks` full blocks.
pub fn blocks_to_bytes(blocks: usize, config: &FingerprintConfig) -> usize {
    blocks
        .saturating_mul(config.block_tokens)
        .saturating_mul(BYTES_PER_TOKEN)
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cfg() -> FingerprintConfig {
        FingerprintConfig::default()
    }

    #[test]
    fn shards_sent_as_hashes_come_back_as_they_were() {
        let c = cfg();
        for bytes in [0usize, 64, 2_047, 2_048, 2_049, 10_000, 200_000] {
            let chain = BlockChain::of("m", &vec![b'y'; bytes], &c);
            let shards = shards_of(&chain.blocks, &c);
            let hashes: Vec<BlockHash> = shards.iter().map(|s| s.last_block).collect();
            let tokens = (chain.blocks.len() * c.block_tokens) as u64;
            assert_eq!(shards_from_hashes(&hashes, tokens), shards, "{bytes} bytes");
        }
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        let c = cfg();
        assert!(BlockChain::of("m", &[b'x'; 255], &c).blocks.is_empty());
        let chain = BlockChain::of("m", &[b'x'; 257], &c);
        assert_eq!(chain.blocks.len(), 1);
        assert_eq!(chain.prompt_tokens, 65);
    }

    #[test]
    fn seed_separates_models() {
        let text = vec![b'a'; 1024];
        let a = BlockChain::of("base", &text, &cfg());
        let b = BlockChain::of("adapter-1", &text, &cfg());
        assert_eq!(a.blocks.len(), 4);
        assert_eq!(a.common_prefix_len(&b.blocks), 0);
    }

    #[test]
    fn max_prefix_tokens_bounds_the_work() {
        let c = FingerprintConfig {
            block_tokens: 64,
            max_prefix_tokens: 128,
        };
        let chain = BlockChain::of("m", &vec![b'z'; 100_000], &c);
        assert_eq!(chain.blocks.len(), 2);
        assert_eq!(chain.prompt_tokens, 25_000);
    }

    #[test]
    fn shards_carry_offsets_and_lengths() {
        let c = cfg(); // 8 blocks per shard
        let chain = BlockChain::of("m", &vec![b'q'; 256 * 11], &c);
        let shards = chain.shards(&c);
        assert_eq!(shards.len(), 2);
        assert_eq!((shards[0].base_offset, shards[0].valid_len), (0, 512));
        assert_eq!((shards[1].base_offset, shards[1].valid_len), (512, 192));
        assert_eq!(shards[1].last_block, chain.blocks[10]);
        assert_eq!(chain.routing_key(&c), Some(chain.blocks[7]));
    }

    #[test]
    fn routing_key_of_short_prompt_is_its_last_block() {
        let c = cfg();
        let chain = BlockChain::of("m", &[b'q'; 256 * 3], &c);
        assert_eq!(chain.routing_key(&c), Some(chain.blocks[2]));
        assert_eq!(BlockChain::of("m", b"tiny", &c).routing_key(&c), None);
    }

    #[test]
    fn hex_round_trip() {
        let h = BlockHash(0x00ab_cdef_0123_4567);
        assert_eq!(h.to_hex(), "00abcdef01234567");
        assert_eq!(BlockHash::from_hex(&h.to_hex()), Some(h));
        assert_eq!(BlockHash::from_hex("xyz"), None);
    }

    #[test]
    fn config_validation_names_fields() {
        let bad = FingerprintConfig {
            block_tokens: 48,
            max_prefix_tokens: 0,
        };
        let problems = bad.validate();
        assert_eq!(problems.len(), 2);
        assert!(problems[0].starts_with("block_tokens: 48:"));
        assert!(problems[1].starts_with("max_prefix_tokens: 0:"));
        assert!(cfg().validate().is_empty());
    }

    proptest! {
        #[test]
        fn extension_keeps_the_prefix_chain(
            base in proptest::collection::vec(any::<u8>(), 0..3000),
            tail in proptest::collection::vec(any::<u8>(), 0..3000),
            block_tokens in prop::sample::select(vec![8usize, 16, 64, 128]),
        ) {
            let c = FingerprintConfig { block_tokens, max_prefix_tokens: 32_768 };
            let short = BlockChain::of("m", &base, &c);
            let mut longer = base.clone();
            longer.extend_from_slice(&tail);
            let long = BlockChain::of("m", &longer, &c);
            prop_assert!(long.blocks.len() >= short.blocks.len());
            prop_assert_eq!(&long.blocks[..short.blocks.len()], &short.blocks[..]);
        }
    }
}
