//! Prompt similarity: a bottom-k MinHash sketch of word 3-shingles that estimates the Jaccard
//! similarity of two prompts in O(k) time and 8·k bytes, and the exact Jaccard for tests.
//!
//! Each shingle (three consecutive words split on ASCII whitespace; all the words when there are
//! fewer) is hashed once (FNV-1a per word, combined and finalised with SplitMix64); the sketch keeps the `k` smallest distinct hashes. For two sketches,
//! the `k` smallest hashes of their union are a uniform sample of the union of the shingle sets,
//! and the fraction of them present in both sketches estimates the Jaccard similarity with a
//! standard error of about `sqrt(J(1−J)/k)` (≤ 0.0625 at the default k = 64). When a prompt has
//! fewer than `k` shingles the sketch holds them all and the estimate is exact.

/// Hashes kept by a sketch by default.
pub const DEFAULT_SKETCH_SIZE: usize = 64;

/// Only the leading this-many tokens of a prompt are sketched: one shard, the prefix index's unit
/// ([`SHARD_TOKENS`](crate::fingerprint::SHARD_TOKENS)). A template leads its prompts, so that is where one user's
/// prompts of one template agree, and it is what decides where a prompt goes (its routing key);
/// what the streak then warms, the common prefix, comes from the exact block chain, not from the
/// sketch, which only gates it. The bound keeps the sketch's cost on the request path at one
/// shard's text (~2 KiB) however long the prompt: it was 2,048 tokens (~8 KiB), which made the
/// sketch three quarters of core's request path at 16 KB bodies (docs/benchmarks.md).
pub const SKETCH_MAX_TOKENS: usize = crate::fingerprint::SHARD_TOKENS;

/// Words in a shingle.
pub const SHINGLE_WORDS: usize = 3;

/// A bottom-k MinHash sketch: the `k` smallest distinct shingle hashes, ascending.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sketch {
    mins: Vec<u64>,
    k: usize,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The SplitMix64 finaliser: spreads a combined value over all 64 bits.
fn finalise(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Order-sensitive combination of up to [`SHINGLE_WORDS`] word hashes.
fn shingle_hash(words: &[u64]) -> u64 {
    let combined = words
        .iter()
        .enumerate()
        .fold(words.len() as u64, |acc, (i, w)| {
            acc ^ w.rotate_left((i as u32).wrapping_mul(21))
        });
    finalise(combined)
}

/// The last [`SHINGLE_WORDS`] word hashes seen.
struct ShingleWindow {
    ring: [u64; SHINGLE_WORDS],
    seen: usize,
}

impl ShingleWindow {
    /// Adds a word; returns the hash of the full window it completes.
    fn push(&mut self, word: u64) -> Option<u64> {
        self.ring.rotate_left(1);
        if let Some(last) = self.ring.last_mut() {
            *last = word;
        }
        self.seen = self.seen.saturating_add(1);
        (self.seen >= SHINGLE_WORDS).then(|| shingle_hash(&self.ring))
    }

    /// The one shingle of a text with fewer than [`SHINGLE_WORDS`] words.
    fn short_text(&self) -> Option<u64> {
        let start = SHINGLE_WORDS
            .checked_sub(self.seen)
            .filter(|s| (1..SHINGLE_WORDS).contains(s))?;
        Some(shingle_hash(self.ring.get(start..).unwrap_or(&[])))
    }
}

/// Calls `emit` with the hash of every shingle of `text`: windows of [`SHINGLE_WORDS`] words
/// split on ASCII whitespace (never inside a UTF-8 character), or one shingle of all the words
/// when there are fewer. One pass over the bytes: each word is hashed with FNV-1a as it is read.
fn for_each_shingle(text: &str, mut emit: impl FnMut(u64)) {
    let mut window = ShingleWindow {
        ring: [0; SHINGLE_WORDS],
        seen: 0,
    };
    let mut word = FNV_OFFSET;
    let mut in_word = false;
    for &b in text.as_bytes() {
        if b.is_ascii_whitespace() {
            if in_word {
                if let Some(h) = window.push(word) {
                    emit(h);
                }
                word = FNV_OFFSET;
                in_word = false;
            }
        } else {
            word = (word ^ u64::from(b)).wrapping_mul(FNV_PRIME);
            in_word = true;
        }
    }
    if in_word {
        if let Some(h) = window.push(word) {
            emit(h);
        }
    }
    if let Some(h) = window.short_text() {
        emit(h);
    }
}

impl Sketch {
    /// Sketches the first [`SKETCH_MAX_TOKENS`] tokens of `text` keeping `k` hashes (at least 1).
    pub fn of(text: &str, k: usize) -> Self {
        let k = k.max(1);
        let text = crate::tokens::truncate_to_tokens(text, SKETCH_MAX_TOKENS);
        let mut mins: Vec<u64> = Vec::with_capacity(k.saturating_add(1));
        for_each_shingle(text, |h| {
            if mins.len() == k && mins.last().is_some_and(|&max| h >= max) {
                return;
            }
            if let Err(pos) = mins.binary_search(&h) {
                mins.insert(pos, h);
                mins.truncate(k);
            }
        });
        Self { mins, k }
    }

    /// The hashes kept, ascending.
    pub fn hashes(&self) -> &[u64] {
        &self.mins
    }

    /// Whether the text had no shingle at all.
    pub fn is_empty(&self) -> bool {
        self.mins.is_empty()
    }

    /// Estimated Jaccard similarity in [0, 1]. Two empty sketches are not similar (0): an empty
    /// prompt says nothing about a template.
    pub fn jaccard(&self, other: &Sketch) -> f64 {
        let k = self.k.min(other.k).max(1);
        let (a, b) = (&self.mins, &other.mins);
        let (mut i, mut j, mut taken, mut both) = (0usize, 0usize, 0usize, 0usize);
        while taken < k {
            match (a.get(i), b.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    both += 1;
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => i += 1,
                (Some(_), Some(_)) => j += 1,
                (Some(_), None) => i += 1,
                (None, Some(_)) => j += 1,
                (None, None) => break,
            }
            taken += 1;
        }
        if taken == 0 {
            0.0
        } else {
            both as f64 / taken as f64
        }
    }

    /// Little-endian bytes: 8 a hash. The form kept in the filter's shared data.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.mins.iter().flat_map(|h| h.to_le_bytes()).collect()
    }

    /// Reads [`to_bytes`](Self::to_bytes); trailing partial hashes are ignored, order is
    /// restored, and at most `k` hashes are kept, so any bytes give a valid sketch.
    pub fn from_bytes(bytes: &[u8], k: usize) -> Self {
        let k = k.max(1);
        let mut mins: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect();
        mins.sort_unstable();
        mins.dedup();
        mins.truncate(k);
        Self { mins, k }
    }
}

/// The exact Jaccard similarity of the two texts' shingle sets over the same leading
/// [`SKETCH_MAX_TOKENS`] tokens the sketch sees (for tests and evaluation).
pub fn exact_jaccard(a: &str, b: &str) -> f64 {
    let a = crate::tokens::truncate_to_tokens(a, SKETCH_MAX_TOKENS);
    let b = crate::tokens::truncate_to_tokens(b, SKETCH_MAX_TOKENS);
    use std::collections::BTreeSet;
    let set = |text: &str| {
        let mut set = BTreeSet::new();
        for_each_shingle(text, |h| {
            set.insert(h);
        });
        set
    };
    let (sa, sb) = (set(a), set(b));
    let union = sa.union(&sb).count();
    if union == 0 {
        return 0.0;
    }
    sa.intersection(&sb).count() as f64 / union as f64
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    use proptest::prelude::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn identical_texts_are_fully_similar() {
        let t = "You are a helpful assistant that answers in SQL only. Question: how many rows";
        let a = Sketch::of(t, 64);
        assert_eq!(a.jaccard(&a), 1.0);
        assert_eq!(exact_jaccard(t, t), 1.0);
    }

    #[test]
    fn disjoint_texts_are_not_similar() {
        let a = Sketch::of("alpha beta gamma delta", 64);
        let b = Sketch::of("one two three four", 64);
        assert_eq!(a.jaccard(&b), 0.0);
        assert_eq!(Sketch::default().jaccard(&Sketch::default()), 0.0);
    }

    #[test]
    fn small_texts_are_exact() {
        let a = "w1 w2 w3 w4 w5";
        let b = "w1 w2 w3 w4 x5";
        // shingles: a = {123, 234, 345}, b = {123, 234, 34x}: 2 shared of 4
        assert_eq!(Sketch::of(a, 64).jaccard(&Sketch::of(b, 64)), 0.5);
        assert_eq!(exact_jaccard(a, b), 0.5);
    }

    #[test]
    fn bytes_round_trip_and_garbage_is_safe() {
        let s = Sketch::of("a b c d e f g h i j k l m n o p", 8);
        assert_eq!(Sketch::from_bytes(&s.to_bytes(), 8), s);
        let g = Sketch::from_bytes(&[7u8; 21], 8);
        assert_eq!(g.hashes().len(), 1);
    }

    /// The sketch reads one shard: what follows it (a long user message, a session's growing
    /// context) costs nothing and changes nothing.
    #[test]
    fn text_past_the_first_shard_does_not_change_the_sketch() {
        let head = text_from(&(0..600).collect::<Vec<_>>());
        assert!(head.len() > crate::tokens::token_bytes(SKETCH_MAX_TOKENS));
        let a = format!("{head} {}", text_from(&(1000..3000).collect::<Vec<_>>()));
        let b = format!("{head} {}", text_from(&(5000..7000).collect::<Vec<_>>()));
        assert_eq!(Sketch::of(&a, 64), Sketch::of(&b, 64));
    }

    fn text_from(words: &[usize]) -> String {
        words
            .iter()
            .map(|w| format!("w{w}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    proptest! {
        /// The estimate is within 5/16 of the exact value: five standard errors at k = 64
        /// (√(J(1−J)/k) ≤ 1/16). At four (0.25), 1 of 200,000 random cases of these
        /// strategies was over (by 0.0001), enough to fail a clean-clone CI run of f61ffa3 (three
        /// builds each draw 256 cases); none of them was over five.
        #[test]
        fn estimate_is_close_to_exact(
            shared in proptest::collection::vec(0usize..5000, 0..400),
            only_a in proptest::collection::vec(0usize..5000, 0..400),
            only_b in proptest::collection::vec(0usize..5000, 0..400),
        ) {
            let a = text_from(&[shared.clone(), only_a].concat());
            let b = text_from(&[shared, only_b].concat());
            let est = Sketch::of(&a, 64).jaccard(&Sketch::of(&b, 64));
            let exact = exact_jaccard(&a, &b);
            prop_assert!((est - exact).abs() <= 0.3125, "est {est} exact {exact}");
        }
    }
}
