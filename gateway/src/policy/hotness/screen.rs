//! Screening of a signal batch from the network before the pool sees it: names within
//! [`super::MAX_NAME_BYTES`], and every prefill's block hashes equal to core's fingerprint of its own
//! text ([`BlockChain::of`], the function the filter fingerprints with), so nobody who can reach
//! `/v1/signals` can file text under another prefix's key.
//!
//! The filter cuts a prefix's text back to a character boundary, so the text may end up to 3
//! bytes short of its last block: that block's hash cannot be recomputed and is taken as sent;
//! every block the text covers is checked.

use prewarm_core::fingerprint::{BlockChain, FingerprintConfig};
use prewarm_core::tokens::BYTES_PER_TOKEN;
use prewarm_core::wire::{PrefillSignal, Signal, SignalBatch};

use super::{check_name, PoolError};

/// Bytes a prefix's text may fall short of its last block (a cut multi-byte character).
const MAX_CUT_BYTES: usize = BYTES_PER_TOKEN - 1;

/// Whether `signal.prefix` is core's fingerprint of `signal.prefix_text` for `signal.model`.
pub fn check_prefix_hashes(
    signal: &PrefillSignal,
    fingerprint: &FingerprintConfig,
) -> Result<(), PoolError> {
    let claimed = &signal.prefix;
    if claimed.is_empty() {
        return Err(PoolError::EmptyPrefix);
    }
    let chain = BlockChain::of(&signal.model, signal.prefix_text.as_bytes(), fingerprint);
    let full = claimed.len().min(chain.blocks.len());
    // Only the last block may be uncovered, and only by a cut character.
    let covered_enough = full == claimed.len()
        || (full + 1 == claimed.len()
            && signal.prefix_text.len().saturating_add(MAX_CUT_BYTES)
                >= claimed.len().saturating_mul(fingerprint.block_bytes()));
    if !covered_enough {
        return Err(PoolError::TooManyBlocks {
            blocks: claimed.len(),
        });
    }
    match claimed
        .iter()
        .zip(&chain.blocks)
        .position(|(sent, computed)| sent != computed)
    {
        Some(block) => Err(PoolError::HashMismatch { block }),
        None => Ok(()),
    }
}

fn check_signal(signal: &Signal, fingerprint: &FingerprintConfig) -> Result<(), PoolError> {
    match signal {
        Signal::Prefill(p) => {
            check_name("model", &p.model)?;
            if let Some(t) = &p.tenant {
                check_name("tenant", t)?;
            }
            check_prefix_hashes(p, fingerprint)
        }
        Signal::Feedback(f) => check_name("model", &f.model),
        Signal::Pin(p) => {
            check_name("adapter", &p.adapter)?;
            match &p.tenant {
                Some(t) => check_name("tenant", t),
                None => Ok(()),
            }
        }
    }
}

/// The batch without the signals that fail screening, and why each was refused.
pub fn screen(
    mut batch: SignalBatch,
    fingerprint: &FingerprintConfig,
) -> (SignalBatch, Vec<PoolError>) {
    let mut refused = Vec::new();
    batch
        .signals
        .retain(|s| match check_signal(s, fingerprint) {
            Ok(()) => true,
            Err(e) => {
                refused.push(e);
                false
            }
        });
    (batch, refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::hotness::MAX_NAME_BYTES;
    use prewarm_core::request::Endpoint;
    use prewarm_core::wire::PatternState;

    fn prefill(model: &str, text: &str, blocks: Vec<prewarm_core::BlockHash>) -> PrefillSignal {
        PrefillSignal {
            model: model.into(),
            tenant: None,
            endpoint: Endpoint::Completions,
            prefix_tokens: blocks.len() * 64,
            prefix: blocks,
            prefix_text: text.into(),
            state: PatternState::New,
            priority: 0,
            keep_warm: true,
            shape: None,
        }
    }

    #[test]
    fn the_text_must_fingerprint_to_the_hashes() {
        let fp = FingerprintConfig::default();
        let text = "abcd".repeat(128); // two blocks of 256 bytes
        let chain = BlockChain::of("m", text.as_bytes(), &fp);
        assert_eq!(chain.blocks.len(), 2);
        assert!(check_prefix_hashes(&prefill("m", &text, chain.blocks.clone()), &fp).is_ok());
        // Another model's chain, other text, a forged last hash: refused.
        let other = BlockChain::of("n", text.as_bytes(), &fp).blocks;
        assert_eq!(
            check_prefix_hashes(&prefill("m", &text, other), &fp),
            Err(PoolError::HashMismatch { block: 0 })
        );
        let mut forged = chain.blocks.clone();
        forged[1] = prewarm_core::BlockHash(7);
        assert_eq!(
            check_prefix_hashes(&prefill("m", &text, forged), &fp),
            Err(PoolError::HashMismatch { block: 1 })
        );
        let evil = "evil".repeat(128);
        assert!(check_prefix_hashes(&prefill("m", &evil, chain.blocks.clone()), &fp).is_err());
        // More blocks than the text covers.
        let short = &text[..256];
        assert_eq!(
            check_prefix_hashes(&prefill("m", short, chain.blocks.clone()), &fp),
            Err(PoolError::TooManyBlocks { blocks: 2 })
        );
    }

    #[test]
    fn a_text_cut_at_a_character_boundary_checks_every_covered_block() {
        let fp = FingerprintConfig::default();
        // 510 ASCII bytes then a 4-byte character across the second block's end.
        let full = format!("{}\u{1F600}", "a".repeat(510));
        let chain = BlockChain::of("m", full.as_bytes(), &fp);
        assert_eq!(chain.blocks.len(), 2);
        let cut = &full[..510];
        assert!(check_prefix_hashes(&prefill("m", cut, chain.blocks.clone()), &fp).is_ok());
        let mut forged = chain.blocks.clone();
        forged[0] = prewarm_core::BlockHash(1);
        assert!(check_prefix_hashes(&prefill("m", cut, forged), &fp).is_err());
    }

    #[test]
    fn screening_drops_only_the_bad_signals() {
        let fp = FingerprintConfig::default();
        let text = "abcd".repeat(64);
        let good = BlockChain::of("m", text.as_bytes(), &fp).blocks;
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let batch = SignalBatch::new(
            "",
            0,
            vec![
                Signal::Prefill(prefill("m", &text, good.clone())),
                Signal::Prefill(prefill(&long, &text, good.clone())),
                Signal::Prefill(prefill("m", &"zzzz".repeat(64), good)),
            ],
        );
        let (kept, refused) = screen(batch, &fp);
        assert_eq!(kept.signals.len(), 1);
        assert!(matches!(
            refused[0],
            PoolError::NameTooLong { field: "model", .. }
        ));
        assert!(matches!(refused[1], PoolError::HashMismatch { block: 0 }));
    }
}
