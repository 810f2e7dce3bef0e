//! The token stand-in shared by every part of prewarm: 4 bytes of canonical prompt make a token
//! (the field's convention for estimating tokens without a tokenizer).
//!
//! The filter, the gateway, podsim and the evaluator all count tokens with these functions, so a
//! prompt has the same length, the same blocks and the same cached tokens everywhere.

/// Bytes per token in the stand-in tokenizer.
pub const BYTES_PER_TOKEN: usize = 4;

/// Tokens in `bytes` bytes of canonical prompt: a partial trailing token counts as one.
pub fn token_count(bytes: usize) -> usize {
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// Bytes covered by `tokens` whole tokens.
pub fn token_bytes(tokens: usize) -> usize {
    tokens.saturating_mul(BYTES_PER_TOKEN)
}

/// The prefix of `text` covering at most `tokens` tokens, cut back to a UTF-8 character boundary
/// so that it is always valid text.
pub fn truncate_to_tokens(text: &str, tokens: usize) -> &str {
    let mut end = token_bytes(tokens).min(text.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn counts_partial_tokens_as_one() {
        assert_eq!(token_count(0), 0);
        assert_eq!(token_count(1), 1);
        assert_eq!(token_count(4), 1);
        assert_eq!(token_count(5), 2);
    }

    #[test]
    fn truncation_keeps_utf8_valid() {
        let text = "ab\u{00e9}\u{00e9}cd"; // é is 2 bytes: a b é(2,3) é(4,5) c d
        assert_eq!(truncate_to_tokens(text, 1), "ab\u{00e9}");
        assert_eq!(truncate_to_tokens("abcdé", 1), "abcd");
        assert_eq!(truncate_to_tokens("aé", 10), "aé");
        // a cut inside a character moves back to its start
        assert_eq!(truncate_to_tokens("abcé", 1), "abc");
    }
}
