//! The embedding cache's contract: what identifies an embedding, how a pod's `/v1/embeddings`
//! response is split into per-input entries, and the response a hit is answered with. The
//! filter's per-proxy cache uses it today; a gateway store would use the same keys.
//!
//! **Key.** An embedding is a function of the model, the input and the request's other
//! parameters, so its key is SHA-256 over, each length-prefixed: a version tag, the model, every
//! top-level field but `input` and `user` (as canonical JSON, sorted by name: `dimensions`,
//! `encoding_format`, `truncate_prompt_tokens`, anything else an engine may read — a field this
//! rule does not know can only split entries, never merge them), the input's modality (`text`
//! or `tokens`) and the input itself (its UTF-8 text, or its token ids). `user` only labels the
//! caller. A request with several inputs has one key per input; it hits only when every input
//! does, so entries from different requests combine.
//!
//! **Entries.** An entry is one input's `embedding` value exactly as the pod sent it (raw JSON:
//! a float array, or a base64 string with `encoding_format: base64`), so a hit returns the pod's
//! bytes, never a re-encoding. Its `prompt_tokens` is the pod's `usage.prompt_tokens` for a
//! one-input response; a response for `n` inputs reports one total, which is split evenly (the
//! first inputs take the remainder) — the only figure of a hit that is not the pod's own.
//!
//! **Warm-up.** Each input of a request can be re-sent as a request of its own
//! ([`ParsedEmbeddings::single_input_requests`]: the same fields but `user`, `input` that one
//! input), whose key is
//! the input's: that is what the filter tells the gateway and what the gateway re-sends to a pod
//! to recompute an entry before it expires ([`crate::wire::EmbeddingSeen`],
//! [`crate::wire::WarmEmbeddings`]).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Most inputs in one cacheable request (OpenAI's own limit is 2,048).
pub const MAX_INPUTS: usize = 2048;

/// One input's cache key.
pub type EmbeddingKey = [u8; 32];

/// What the cache needs of an embeddings request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingsRequest {
    pub model: String,
    /// One key per input, in the request's order.
    pub keys: Vec<EmbeddingKey>,
}

/// Why a request is not cacheable (it is forwarded unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Uncacheable {
    #[error("not a JSON object")]
    NotAnObject,
    #[error("model: missing, empty or longer than 256 bytes")]
    Model,
    #[error("input: missing, empty, or not a string, strings, token ids or lists of token ids")]
    Input,
    #[error("input: more than {MAX_INPUTS} inputs")]
    TooManyInputs,
}

/// An embeddings request body, parsed once: its model, its other fields and its inputs, each
/// as the `input` of a request of its own — what its keys and its single-input requests are
/// made of.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedEmbeddings {
    pub model: String,
    /// Every top-level field but `input` and `user`.
    fields: serde_json::Map<String, Value>,
    /// A string, or a list of token ids, each.
    inputs: Vec<Value>,
}

impl ParsedEmbeddings {
    /// Parses `body`; bodies this rule cannot key are [`Uncacheable`].
    pub fn parse(body: &[u8]) -> Result<Self, Uncacheable> {
        let value: Value = serde_json::from_slice(body).map_err(|_| Uncacheable::NotAnObject)?;
        let Value::Object(mut fields) = value else {
            return Err(Uncacheable::NotAnObject);
        };
        let model = match fields.get("model") {
            Some(Value::String(m)) if !m.is_empty() && m.len() <= crate::wire::MAX_NAME_BYTES => {
                m.clone()
            }
            _ => return Err(Uncacheable::Model),
        };
        fields.remove("user");
        let inputs = split_inputs(fields.remove("input").ok_or(Uncacheable::Input)?)?;
        Ok(Self {
            model,
            fields,
            inputs,
        })
    }

    /// One key per input, in the request's order.
    pub fn keys(&self) -> Vec<EmbeddingKey> {
        let mut params: Vec<(&String, String)> = self
            .fields
            .iter()
            .map(|(name, v)| (name, v.to_string()))
            .collect();
        params.sort();
        self.inputs
            .iter()
            .map(|input| {
                let mut h = Sha256::new();
                let mut field = |bytes: &[u8]| {
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(bytes);
                };
                field(b"prewarm-embeddings-v1");
                field(self.model.as_bytes());
                for (name, v) in &params {
                    field(name.as_bytes());
                    field(v.as_bytes());
                }
                match input {
                    Value::String(t) => {
                        field(b"text");
                        field(t.as_bytes());
                    }
                    ids => {
                        field(b"tokens");
                        for id in ids
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_u64)
                        {
                            field(&id.to_le_bytes());
                        }
                    }
                }
                h.finalize().into()
            })
            .collect()
    }

    /// Each input as a request of its own (the same fields but `user`; `input` that one input),
    /// in input order: its key is the input's. What the gateway re-sends to recompute an entry.
    pub fn single_input_requests(&self) -> Vec<String> {
        self.inputs
            .iter()
            .map(|input| {
                let mut single = self.fields.clone();
                single.insert("input".into(), input.clone());
                Value::Object(single).to_string()
            })
            .collect()
    }
}

/// The keys of an embeddings request body.
pub fn request_keys(body: &[u8]) -> Result<EmbeddingsRequest, Uncacheable> {
    let parsed = ParsedEmbeddings::parse(body)?;
    Ok(EmbeddingsRequest {
        keys: parsed.keys(),
        model: parsed.model,
    })
}

/// A key as 64 lowercase hex digits, as it travels between filter and gateway.
pub fn key_hex(key: &EmbeddingKey) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of 64 hex digits; `None` otherwise.
pub fn key_from_hex(hex: &str) -> Option<EmbeddingKey> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

fn is_token_ids(v: &Value) -> bool {
    matches!(v, Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_u64))
}

/// The request's `input` as its inputs: a string is one, a list of strings or of token-id lists
/// is one each, a list of token ids is one.
fn split_inputs(input: Value) -> Result<Vec<Value>, Uncacheable> {
    match input {
        Value::String(_) => Ok(vec![input]),
        Value::Array(items) if items.len() > MAX_INPUTS && !items.iter().all(Value::is_u64) => {
            Err(Uncacheable::TooManyInputs)
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => Ok(items),
        ids if is_token_ids(&ids) => Ok(vec![ids]),
        Value::Array(items) if !items.is_empty() && items.iter().all(is_token_ids) => Ok(items),
        _ => Err(Uncacheable::Input),
    }
}

/// One input's cached embedding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedEmbedding {
    /// The pod's `embedding` value, byte for byte.
    pub embedding: Box<str>,
    /// The input's prompt tokens (module doc).
    pub prompt_tokens: u64,
}

impl CachedEmbedding {
    /// Bytes an entry costs a cache: its embedding, its token count and its key.
    pub fn cost(&self) -> usize {
        self.embedding.len() + 8 + 32
    }
}

#[derive(Deserialize)]
struct RawResponse<'a> {
    #[serde(borrow)]
    data: Vec<RawItem<'a>>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct RawItem<'a> {
    index: usize,
    #[serde(borrow)]
    embedding: &'a RawValue,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: u64,
}

/// A pod's successful embeddings response for `inputs` inputs as one entry per input, in input
/// order; `None` unless it has exactly one item for each index below `inputs`.
pub fn split_response(body: &[u8], inputs: usize) -> Option<Vec<CachedEmbedding>> {
    let response: RawResponse<'_> = serde_json::from_slice(body).ok()?;
    if inputs == 0 || response.data.len() != inputs {
        return None;
    }
    let total = response.usage.map_or(0, |u| u.prompt_tokens);
    let n = inputs as u64;
    let mut entries: Vec<Option<CachedEmbedding>> = vec![None; inputs];
    for item in response.data {
        let slot = entries.get_mut(item.index)?;
        if slot.is_some() {
            return None;
        }
        let i = item.index as u64;
        *slot = Some(CachedEmbedding {
            embedding: item.embedding.get().into(),
            prompt_tokens: total / n + u64::from(i < total % n),
        });
    }
    entries.into_iter().collect()
}

/// The OpenAI embeddings response a hit is answered with: the entries' embeddings in input
/// order, `usage` their token counts summed, `id` from the first key.
pub fn hit_response(
    model: &str,
    keys: &[EmbeddingKey],
    entries: &[CachedEmbedding],
    created_s: u64,
) -> Vec<u8> {
    let tokens: u64 = entries.iter().map(|e| e.prompt_tokens).sum();
    let id: String = keys
        .first()
        .map(|k| k.iter().take(8).map(|b| format!("{b:02x}")).collect())
        .unwrap_or_default();
    let model = Value::String(model.to_string()).to_string();
    let payload: usize = entries.iter().map(|e| e.embedding.len() + 48).sum();
    let mut out = String::with_capacity(payload + model.len() + 160);
    out.push_str(&format!(
        r#"{{"id":"embd-prewarm-{id}","object":"list","created":{created_s},"model":{model},"data":["#
    ));
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"index":{i},"object":"embedding","embedding":{}}}"#,
            e.embedding
        ));
    }
    out.push_str(&format!(
        r#"],"usage":{{"prompt_tokens":{tokens},"total_tokens":{tokens}}}}}"#
    ));
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn keys(body: &str) -> Vec<EmbeddingKey> {
        request_keys(body.as_bytes())
            .map(|r| r.keys)
            .unwrap_or_default()
    }

    #[test]
    fn different_inputs_never_share_a_key() {
        let texts = ["a", "b", "ab", "a ", "", "\u{e9}", "e\u{301}"];
        let mut seen = std::collections::BTreeSet::new();
        for t in texts {
            let body = serde_json::json!({"model": "m", "input": t}).to_string();
            assert!(seen.insert(keys(&body)), "{t:?}");
        }
        // text and the same digits as token ids are different inputs
        assert_ne!(
            keys(r#"{"model":"m","input":"1"}"#),
            keys(r#"{"model":"m","input":[1]}"#)
        );
        assert_ne!(
            keys(r#"{"model":"m","input":[[1,2]]}"#),
            keys(r#"{"model":"m","input":[[12]]}"#)
        );
    }

    #[test]
    fn every_parameter_that_can_change_the_output_is_in_the_key() {
        let base = keys(r#"{"model":"m","input":"x"}"#);
        for other in [
            r#"{"model":"n","input":"x"}"#,
            r#"{"model":"m","input":"x","dimensions":128}"#,
            r#"{"model":"m","input":"x","encoding_format":"base64"}"#,
            r#"{"model":"m","input":"x","encoding_format":"float"}"#,
            r#"{"model":"m","input":"x","truncate_prompt_tokens":8}"#,
        ] {
            assert_ne!(keys(other), base, "{other}");
        }
        assert_ne!(
            keys(r#"{"model":"m","input":"x","dimensions":128}"#),
            keys(r#"{"model":"m","input":"x","dimensions":256}"#)
        );
        // the caller's label and the fields' order do not
        assert_eq!(keys(r#"{"model":"m","input":"x","user":"u1"}"#), base);
        assert_eq!(
            keys(r#"{"dimensions":8,"model":"m","input":"x","encoding_format":"float"}"#),
            keys(r#"{"encoding_format":"float","input":"x","model":"m","dimensions":8}"#)
        );
    }

    #[test]
    fn each_input_of_a_batch_has_the_key_it_has_alone() {
        let batch = keys(r#"{"model":"m","input":["x","y"]}"#);
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.first(), keys(r#"{"model":"m","input":"x"}"#).first());
        assert_eq!(batch.get(1), keys(r#"{"model":"m","input":["y"]}"#).first());
        let tokens = keys(r#"{"model":"m","input":[[1,2],[3]]}"#);
        assert_eq!(tokens.get(1), keys(r#"{"model":"m","input":[3]}"#).first());
    }

    #[test]
    fn each_input_as_a_request_of_its_own_has_the_inputs_key() {
        for body in [
            r#"{"model":"m","input":["x","y"],"dimensions":8,"user":"u"}"#,
            r#"{"model":"m","input":"x"}"#,
            r#"{"model":"m","input":[[1,2],[3]],"encoding_format":"base64"}"#,
            r#"{"model":"m","input":[1,2,3]}"#,
        ] {
            let singles = ParsedEmbeddings::parse(body.as_bytes())
                .map(|p| p.single_input_requests())
                .unwrap_or_default();
            let each: Vec<EmbeddingKey> = singles.iter().flat_map(|s| keys(s)).collect();
            assert_eq!(each, keys(body), "{body}");
            assert!(singles.iter().all(|s| !s.contains("\"user\"")));
        }
        assert_eq!(
            ParsedEmbeddings::parse(br#"{"model":"m","input":[]}"#),
            Err(Uncacheable::Input)
        );
    }

    #[test]
    fn keys_travel_as_hex_and_back() {
        let k = keys(r#"{"model":"m","input":"x"}"#)[0];
        let hex = key_hex(&k);
        assert_eq!(hex.len(), 64);
        assert_eq!(key_from_hex(&hex), Some(k));
        for bad in ["", "zz", &hex[..62], &format!("{}é", &hex[..62])] {
            assert_eq!(key_from_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn bad_requests_are_uncacheable_not_errors_of_the_filter() {
        for (body, why) in [
            ("[1]", Uncacheable::NotAnObject),
            ("{", Uncacheable::NotAnObject),
            (r#"{"input":"x"}"#, Uncacheable::Model),
            (r#"{"model":"","input":"x"}"#, Uncacheable::Model),
            (r#"{"model":"m"}"#, Uncacheable::Input),
            (r#"{"model":"m","input":[]}"#, Uncacheable::Input),
            (r#"{"model":"m","input":["x",1]}"#, Uncacheable::Input),
            (r#"{"model":"m","input":[[1],[]]}"#, Uncacheable::Input),
            (r#"{"model":"m","input":[-1]}"#, Uncacheable::Input),
            (r#"{"model":"m","input":{"a":1}}"#, Uncacheable::Input),
        ] {
            assert_eq!(request_keys(body.as_bytes()), Err(why), "{body}");
        }
        let many = serde_json::json!({"model": "m", "input": vec!["x"; MAX_INPUTS + 1]});
        assert_eq!(
            request_keys(many.to_string().as_bytes()),
            Err(Uncacheable::TooManyInputs)
        );
        // a long token list is one input
        let long = serde_json::json!({"model": "m", "input": vec![7; MAX_INPUTS + 1]});
        assert_eq!(keys(&long.to_string()).len(), 1);
    }

    const POD: &str = r#"{"id":"embd-1","object":"list","created":5,"model":"m","data":[{"index":1,"object":"embedding","embedding":[0.5,-1.25e-3,3]},{"index":0,"object":"embedding","embedding":[1.0000001,2]}],"usage":{"prompt_tokens":7,"total_tokens":7}}"#;

    #[test]
    fn a_hit_returns_the_pods_vectors_byte_for_byte_in_input_order() {
        let entries = split_response(POD.as_bytes(), 2).unwrap_or_default();
        let bodies: Vec<&str> = entries.iter().map(|e| &*e.embedding).collect();
        assert_eq!(bodies, ["[1.0000001,2]", "[0.5,-1.25e-3,3]"]);
        assert_eq!(entries.iter().map(|e| e.prompt_tokens).sum::<u64>(), 7);
        let k = keys(r#"{"model":"m","input":["x","y"]}"#);
        let hit = hit_response("m", &k, &entries, 9);
        let parsed: Value = serde_json::from_slice(&hit).unwrap_or_default();
        assert_eq!(parsed["data"][1]["index"], 1);
        assert_eq!(parsed["usage"]["prompt_tokens"], 7);
        let text = String::from_utf8(hit).unwrap_or_default();
        assert!(text.contains(r#""index":0,"object":"embedding","embedding":[1.0000001,2]}"#));
        assert!(text.contains(r#""embedding":[0.5,-1.25e-3,3]}"#));
    }

    #[test]
    fn a_response_that_does_not_match_the_inputs_is_not_stored() {
        assert_eq!(split_response(POD.as_bytes(), 3), None);
        assert_eq!(split_response(POD.as_bytes(), 1), None);
        let dup = POD.replace(r#""index":1"#, r#""index":0"#);
        assert_eq!(split_response(dup.as_bytes(), 2), None);
        let far = POD.replace(r#""index":1"#, r#""index":5"#);
        assert_eq!(split_response(far.as_bytes(), 2), None);
        assert_eq!(split_response(b"{\"error\":\"x\"}", 1), None);
        assert_eq!(split_response(b"not json", 1), None);
    }
}
