//! What podsim's `/v1/embeddings` computes, without I/O: the OpenAI embeddings request as vLLM's
//! pooling models accept it, and a deterministic unit vector per input.
//!
//! A vector depends only on the seed, the model and the input (text bytes or token ids), never
//! on the other inputs of the batch, so a cache in front of the pod can be checked byte for byte.
//! It is a seeded xxh3 stream mapped to [-1, 1) and L2-normalised; `dimensions` keeps the first
//! `d` components and normalises again (what Matryoshka models do), so a shorter vector is a
//! prefix of the longer one up to scale.
//!
//! Limits: at most [`MAX_INPUTS`] inputs (OpenAI's documented bound), each non-empty and no
//! longer than the pod's context; `dimensions` in 1..=the pod's embedding size. A request that
//! breaks one gets an [`EmbeddingError`] naming the field.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Most inputs in one request (OpenAI's bound on the `input` array).
pub const MAX_INPUTS: usize = 2048;

/// One input of a request: text, or token ids as `/v1/embeddings` also accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbeddingInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl EmbeddingInput {
    /// Tokens of this input: the array's length, or prewarm's 4-bytes-a-token stand-in.
    pub fn tokens(&self) -> usize {
        match self {
            Self::Text(t) => prewarm_core::tokens::token_count(t.len()),
            Self::Tokens(ids) => ids.len(),
        }
    }

    /// The bytes the vector is derived from (texts and token arrays never collide: a tag first).
    fn seed_bytes(&self) -> Vec<u8> {
        match self {
            Self::Text(t) => {
                let mut out = Vec::with_capacity(t.len().saturating_add(1));
                out.push(b't');
                out.extend_from_slice(t.as_bytes());
                out
            }
            Self::Tokens(ids) => {
                let mut out = Vec::with_capacity(ids.len().saturating_mul(4).saturating_add(1));
                out.push(b'i');
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out
            }
        }
    }
}

/// `encoding_format`: a JSON array of floats or base64 of little-endian f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// A parsed, validated embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingRequest {
    pub model: String,
    pub inputs: Vec<EmbeddingInput>,
    pub encoding_format: EncodingFormat,
    /// `dimensions`; `None` = the model's full size.
    pub dimensions: Option<usize>,
}

impl EmbeddingRequest {
    /// Input tokens over all inputs (`usage.prompt_tokens`).
    pub fn prompt_tokens(&self) -> usize {
        self.inputs
            .iter()
            .fold(0usize, |sum, i| sum.saturating_add(i.tokens()))
    }
}

/// A request podsim refuses, with the body field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EmbeddingError {
    /// The field, as `param` of the error body.
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> EmbeddingError {
    EmbeddingError {
        field,
        message: message.into(),
    }
}

/// What the pod allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingLimits {
    /// Components of a full vector.
    pub dim: usize,
    /// Tokens one input may have (the pod's `max_model_len`).
    pub max_input_tokens: usize,
}

fn token_ids(field: &'static str, items: &[Value]) -> Result<Vec<u32>, EmbeddingError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    invalid(
                        field,
                        format!("{field}: token ids must be integers in 0..=4294967295"),
                    )
                })
        })
        .collect()
}

fn inputs_of(value: &Value) -> Result<Vec<EmbeddingInput>, EmbeddingError> {
    let inputs = match value {
        Value::String(s) => vec![EmbeddingInput::Text(s.clone())],
        Value::Array(items) if items.is_empty() => {
            return Err(invalid("input", "input: must not be an empty list"))
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            vec![EmbeddingInput::Tokens(token_ids("input", items)?)]
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(EmbeddingInput::Text(s.clone())),
                Value::Array(ids) => Ok(EmbeddingInput::Tokens(token_ids("input", ids)?)),
                _ => Err(invalid(
                    "input",
                    "input: each item must be a string or an array of token ids",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(invalid(
                "input",
                "input: must be a string, an array of strings or token id arrays",
            ))
        }
    };
    if inputs.len() > MAX_INPUTS {
        return Err(invalid(
            "input",
            format!("input: {} items: at most {MAX_INPUTS}", inputs.len()),
        ));
    }
    Ok(inputs)
}

/// Parses and validates an embeddings body against `limits`.
pub fn parse_request(
    body: &[u8],
    limits: EmbeddingLimits,
) -> Result<EmbeddingRequest, EmbeddingError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| invalid("body", format!("body: not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(invalid("body", "body: must be a JSON object"));
    };
    let model = match map.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        None => return Err(invalid("model", "model: Field required")),
        Some(_) => return Err(invalid("model", "model: must be a non-empty string")),
    };
    let inputs = inputs_of(
        map.get("input")
            .ok_or_else(|| invalid("input", "input: Field required"))?,
    )?;
    for (i, input) in inputs.iter().enumerate() {
        let tokens = input.tokens();
        if tokens == 0 {
            return Err(invalid("input", format!("input[{i}]: must not be empty")));
        }
        if tokens > limits.max_input_tokens {
            return Err(invalid(
                "input",
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {tokens} tokens in the input for embedding generation. Please reduce the length of the input.",
                    limits.max_input_tokens
                ),
            ));
        }
    }
    let encoding_format = match map.get("encoding_format") {
        None | Some(Value::Null) => EncodingFormat::Float,
        Some(Value::String(f)) if f == "float" => EncodingFormat::Float,
        Some(Value::String(f)) if f == "base64" => EncodingFormat::Base64,
        Some(_) => {
            return Err(invalid(
                "encoding_format",
                "encoding_format: must be \"float\" or \"base64\"",
            ))
        }
    };
    let dimensions = match map.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().and_then(|d| usize::try_from(d).ok()) {
            Some(d) if (1..=limits.dim).contains(&d) => Some(d),
            _ => {
                return Err(invalid(
                    "dimensions",
                    format!("dimensions: {v}: must be an integer in 1..={}", limits.dim),
                ))
            }
        },
    };
    Ok(EmbeddingRequest {
        model,
        inputs,
        encoding_format,
        dimensions,
    })
}

/// The unit vector of `input` under `model`: `dim` components, then cut to `dimensions` and
/// normalised again.
pub fn embed(
    seed: u64,
    model: &str,
    input: &EmbeddingInput,
    dim: usize,
    dimensions: Option<usize>,
) -> Vec<f32> {
    let base = xxh3_64_with_seed(model.as_bytes(), seed);
    let key = xxh3_64_with_seed(&input.seed_bytes(), base);
    let len = dimensions.unwrap_or(dim).min(dim);
    let mut v: Vec<f32> = (0..len as u64)
        .map(|i| {
            let bits = xxh3_64_with_seed(&i.to_le_bytes(), key) >> 40; // 24 bits: exact in f32
            (bits as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// `vector` as `encoding_format` base64: little-endian f32 bytes, standard alphabet, padded.
pub fn base64_of(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                let index = ((n >> (18 - 6 * k)) & 63) as usize;
                out.push(char::from(ALPHABET.get(index).copied().unwrap_or(b'A')));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: EmbeddingLimits = EmbeddingLimits {
        dim: 384,
        max_input_tokens: 512,
    };

    fn parse(body: &str) -> Result<EmbeddingRequest, EmbeddingError> {
        parse_request(body.as_bytes(), LIMITS)
    }

    #[test]
    fn every_input_shape_parses() {
        let one = parse(r#"{"model":"m","input":"hello"}"#).unwrap();
        assert_eq!(one.inputs, vec![EmbeddingInput::Text("hello".into())]);
        let texts = parse(r#"{"model":"m","input":["a","bcdef"]}"#).unwrap();
        assert_eq!(texts.inputs.len(), 2);
        assert_eq!(texts.prompt_tokens(), 1 + 2);
        let ids = parse(r#"{"model":"m","input":[1,2,3]}"#).unwrap();
        assert_eq!(ids.inputs, vec![EmbeddingInput::Tokens(vec![1, 2, 3])]);
        let batches =
            parse(r#"{"model":"m","input":[[1,2],[3]],"encoding_format":"base64","dimensions":8}"#)
                .unwrap();
        assert_eq!(batches.inputs.len(), 2);
        assert_eq!(batches.encoding_format, EncodingFormat::Base64);
        assert_eq!(batches.dimensions, Some(8));
    }

    #[test]
    fn bad_bodies_name_their_field() {
        let cases = [
            ("[1]", "body"),
            ("{", "body"),
            (r#"{"input":"x"}"#, "model"),
            (r#"{"model":"m"}"#, "input"),
            (r#"{"model":"m","input":[]}"#, "input"),
            (r#"{"model":"m","input":""}"#, "input"),
            (r#"{"model":"m","input":[-1]}"#, "input"),
            (r#"{"model":"m","input":[{"a":1}]}"#, "input"),
            (r#"{"model":"m","input":7}"#, "input"),
            (
                r#"{"model":"m","input":"x","encoding_format":"hex"}"#,
                "encoding_format",
            ),
            (r#"{"model":"m","input":"x","dimensions":0}"#, "dimensions"),
            (
                r#"{"model":"m","input":"x","dimensions":385}"#,
                "dimensions",
            ),
            (
                r#"{"model":"m","input":"x","dimensions":1.5}"#,
                "dimensions",
            ),
        ];
        for (body, field) in cases {
            assert_eq!(parse(body).unwrap_err().field, field, "{body}");
        }
        let long = format!(r#"{{"model":"m","input":"{}"}}"#, "x".repeat(4 * 513));
        assert_eq!(parse(&long).unwrap_err().field, "input");
        let many = format!(
            r#"{{"model":"m","input":[{}]}}"#,
            vec!["\"a\""; MAX_INPUTS + 1].join(",")
        );
        assert_eq!(parse(&many).unwrap_err().field, "input");
    }

    #[test]
    fn vectors_are_unit_deterministic_and_distinct() {
        let a = EmbeddingInput::Text("alpha".into());
        let b = EmbeddingInput::Text("beta".into());
        let va = embed(0, "m", &a, 384, None);
        assert_eq!(va.len(), 384);
        let norm: f32 = va.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
        assert_eq!(va, embed(0, "m", &a, 384, None));
        assert_ne!(va, embed(0, "m", &b, 384, None));
        assert_ne!(va, embed(0, "other", &a, 384, None));
        assert_ne!(va, embed(1, "m", &a, 384, None));
        // Text "a" and the token id of byte 'a' are different inputs.
        let text = embed(0, "m", &EmbeddingInput::Text("a".into()), 8, None);
        assert_ne!(
            text,
            embed(0, "m", &EmbeddingInput::Tokens(vec![97]), 8, None)
        );
    }

    #[test]
    fn dimensions_cut_a_prefix_and_renormalise() {
        let a = EmbeddingInput::Tokens(vec![5, 6]);
        let full = embed(3, "m", &a, 384, None);
        let short = embed(3, "m", &a, 384, Some(16));
        assert_eq!(short.len(), 16);
        let scale = short[0] / full[0];
        for (s, f) in short.iter().zip(&full) {
            assert!((s - f * scale).abs() < 1e-5);
        }
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64_of(&[1.0]), "AACAPw==");
        assert_eq!(base64_of(&[0.0, 0.0]), "AAAAAAAAAAA=");
        assert_eq!(base64_of(&[]), "");
    }
}
