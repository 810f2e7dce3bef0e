//! The identity of a tracked prompt prefix, shared by every policy: the model it is for and the
//! last block hash of its chain (core's fingerprint), plus the summary warm-up planning needs.

use std::fmt;
use std::str::FromStr;

use prewarm_core::fingerprint::{chain_seed, BlockHash};
use serde::{Deserialize, Serialize};

/// A prefix fingerprint: `chain_seed(model)` and the last [`BlockHash`] of the prefix's chain.
///
/// The chain is already seeded by the model, so `last` alone nearly identifies a prefix; the
/// model seed makes the key exact and lets the pool group by model without a string compare.
/// Displayed (and parsed) as `MMMMMMMMMMMMMMMM-LLLLLLLLLLLLLLLL` (16 hex digits each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrefixKey {
    /// `prewarm_core::fingerprint::chain_seed(model)`.
    pub model: u64,
    /// The last block hash of the prefix.
    pub last: BlockHash,
}

impl PrefixKey {
    /// The key of the prefix of `model` whose chain ends in `last`.
    pub fn new(model: &str, last: BlockHash) -> Self {
        Self {
            model: chain_seed(model),
            last,
        }
    }
}

impl fmt::Display for PrefixKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:016x}", self.model, self.last.0)
    }
}

/// Why a string is not a [`PrefixKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefix key: {0:?}: expected two 16-digit hex numbers joined by '-'")]
pub struct PrefixKeyParseError(pub String);

impl FromStr for PrefixKey {
    type Err = PrefixKeyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PrefixKeyParseError(s.chars().take(64).collect());
        let (model, last) = s.split_once('-').ok_or_else(err)?;
        let model = BlockHash::from_hex(model).ok_or_else(err)?;
        let last = BlockHash::from_hex(last).ok_or_else(err)?;
        Ok(Self {
            model: model.0,
            last,
        })
    }
}

/// A hot prefix as warm-up planning sees it (see `PromptPool::hot_prefixes`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotPrefix {
    pub key: PrefixKey,
    /// `prewarm_core::fingerprint::routing_key` of the prefix's chain: what placement hashes.
    pub routing_key: BlockHash,
    /// Tokens the prefix covers (full blocks).
    pub tokens: usize,
    /// Current hotness.
    pub hotness: f64,
    /// Every shard of it is common to the fleet (cached on at least `COMMON_HOLDERS` pods): the
    /// requests that start with it are keyed past it, and those bringing more than they share
    /// spread over every pod, a joining one included (those mostly made of it go to its holders
    /// until they are full, then to any pod), so every pod's warm-up prefills it.
    pub fleet_wide: bool,
    /// The fewest pods any shard of it is modelled resident on, counted up to
    /// `COMMON_HOLDERS` (0 when unknown): each shard counted once, in the same pass as
    /// `fleet_wide`. Two or more is a prefix whose traffic overflowed one pod (the warm-up's
    /// `SPREAD_HOLDERS`); below that, counting stopped at the first shard under it, so 1 reads
    /// "at most one".
    pub holders: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips() {
        let k = PrefixKey::new("m", BlockHash(0xab));
        let s = k.to_string();
        assert_eq!(s.len(), 33);
        assert_eq!(s.parse::<PrefixKey>(), Ok(k));
        assert!("zz-00".parse::<PrefixKey>().is_err());
        assert!("0000000000000001".parse::<PrefixKey>().is_err());
    }
}
