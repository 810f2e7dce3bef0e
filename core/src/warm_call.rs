//! What a warming call to a pod is, shared by the gateway's engine clients and the filter's
//! direct calls so both send the same request. A prefill is sent in its traffic's shape
//! ([`prefill_call`], [`crate::warm_shape`]): a chat prefix as a `max_tokens: 1` chat request of
//! its messages with `continue_final_message: true` and `add_generation_prompt: false` (the
//! last, cut message left open, so the engine renders exactly the traffic's tokens up to the
//! cut) and the traffic's `tools`, `chat_template_kwargs` and `cache_salt`; any other prefix as
//! a `max_tokens: 1` completion of its text plus [`PREFILL_SUFFIX`] (one token, so the engine
//! caches the whole prefix: it always recomputes a prompt's last token), with the traffic's
//! `cache_salt`. An adapter touch is a `max_tokens: 1` completion of that one token with the
//! adapter as `model` (vLLM has no pin API: a recent use keeps it in its LRU slots). Also which
//! pod an adapter is kept on when the filter pins it.

use serde_json::json;

use crate::request::{Endpoint, JsonText};
use crate::warm_shape::WarmShape;

use crate::placement::{adapter_order, PlacementCandidate};
use crate::route::serving_pods;
use crate::wire::{RoutedPod, RoutingTable};

/// The extra text a prefill appends to a prefix: one token (4 bytes).
pub const PREFILL_SUFFIX: &str = "\n>>>";

/// The path of an unshaped warming call and of adapter touches (a plain completion: vLLM and
/// SGLang both serve it).
pub const WARM_CALL_PATH: &str = "/v1/completions";

/// A prefill as it goes to a pod: the path and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmCall {
    pub path: &'static str,
    pub body: serde_json::Value,
    /// Whether it repeats its traffic's shape; `false` for a chat prefix known without one (an
    /// entry from an older snapshot, or a request past the shape's bounds), which is warmed as
    /// a completion of its canonical text and counted.
    pub shaped: bool,
}

/// The prefill of a prefix: `text` is its canonical text, `endpoint` the endpoint its traffic
/// used, `shape` how it used it. See the module docs.
pub fn prefill_call(
    endpoint: Endpoint,
    model: &str,
    text: &str,
    shape: Option<&WarmShape>,
) -> WarmCall {
    let chat = shape.filter(|s| s.is_chat() && endpoint == Endpoint::ChatCompletions);
    if let Some((shape, messages)) = chat.and_then(|s| Some((s, s.messages(text)?))) {
        let mut body = json!({
            "model": model,
            "messages": messages,
            "max_tokens": 1,
            "temperature": 0,
            "stream": false,
            "add_generation_prompt": false,
            "continue_final_message": true,
        });
        if let Some(fields) = body.as_object_mut() {
            if let Some(tools) = &shape.tools {
                fields.insert("tools".into(), raw(tools));
            }
            if let Some(kwargs) = &shape.chat_template_kwargs {
                fields.insert("chat_template_kwargs".into(), raw(kwargs));
            }
            if let Some(choice) = &shape.tool_choice {
                fields.insert("tool_choice".into(), raw(choice));
            }
            if let Some(salt) = &shape.cache_salt {
                fields.insert("cache_salt".into(), json!(salt));
            }
        }
        return WarmCall {
            path: Endpoint::ChatCompletions.path(),
            body,
            shaped: true,
        };
    }
    let mut body = prefill_json(model, text);
    if let (Some(salt), Some(fields)) = (
        shape.and_then(|s| s.cache_salt.as_ref()),
        body.as_object_mut(),
    ) {
        fields.insert("cache_salt".into(), json!(salt));
    }
    WarmCall {
        path: WARM_CALL_PATH,
        body,
        shaped: endpoint != Endpoint::ChatCompletions,
    }
}

/// A kept JSON text as a value (it was JSON when the request was parsed; `null` otherwise).
fn raw(text: &JsonText) -> serde_json::Value {
    serde_json::from_str(text.get()).unwrap_or(serde_json::Value::Null)
}

/// The prompt a prefill sends.
pub fn prefill_prompt(prefix_text: &str) -> String {
    let mut prompt = String::with_capacity(prefix_text.len() + PREFILL_SUFFIX.len());
    prompt.push_str(prefix_text);
    prompt.push_str(PREFILL_SUFFIX);
    prompt
}

/// A one-token completion of `prompt` for `model`, as JSON.
pub fn one_token_completion_json(model: &str, prompt: &str) -> serde_json::Value {
    json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
        "stream": false,
    })
}

/// The JSON body of a one-token completion of `prompt` for `model`.
pub fn one_token_completion(model: &str, prompt: &str) -> Vec<u8> {
    one_token_completion_json(model, prompt)
        .to_string()
        .into_bytes()
}

/// A prefill of `prefix_text` for `model`, as JSON (the gateway's engine clients send it).
pub fn prefill_json(model: &str, prefix_text: &str) -> serde_json::Value {
    one_token_completion_json(model, &prefill_prompt(prefix_text))
}

/// The body of a prefill of `prefix_text` for `model`.
pub fn prefill_body(model: &str, prefix_text: &str) -> Vec<u8> {
    prefill_json(model, prefix_text).to_string().into_bytes()
}

/// The body of a touch of `adapter`.
pub fn touch_body(adapter: &str) -> Vec<u8> {
    one_token_completion(adapter, PREFILL_SUFFIX)
}

/// The pod an adapter is pinned on from a routing table: the first, by rendezvous over the
/// adapter name's chain seed (the key the gateway places adapters by), of the pods the table
/// lists as holding it, or of all pods when none does.
pub fn adapter_pod<'t>(table: &'t RoutingTable, adapter: &str) -> Option<&'t RoutedPod> {
    let pool = serving_pods(table, adapter);
    let candidates: Vec<PlacementCandidate<'_>> = pool
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, p.weight))
        .collect();
    let first = adapter_order(adapter, &candidates).into_iter().next()?;
    pool.get(first).copied()
}

#[cfg(test)]
mod tests {
    // Under Node (wasm32-unknown-unknown), `#[test]` is wasm-bindgen-test's: `make wasm-tests`.
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn pod(id: &str, adapters: &[&str]) -> RoutedPod {
        RoutedPod::new(id, &format!("{id}:8000"), adapters)
    }

    fn table(pods: Vec<RoutedPod>) -> RoutingTable {
        RoutingTable::of_pods(1, 64, pods)
    }

    #[test]
    fn prefill_is_one_token_longer_than_the_prefix() {
        let p = prefill_prompt("abcdefgh");
        assert_eq!(
            crate::tokens::token_count(p.len()),
            crate::tokens::token_count(8) + 1
        );
        let body: serde_json::Value = serde_json::from_slice(&prefill_body("m", "abcd")).unwrap();
        assert_eq!(body["max_tokens"], 1);
        assert_eq!(body["model"], "m");
        assert_eq!(body["prompt"], "abcd\n>>>");
    }

    #[test]
    fn a_chat_prefix_is_warmed_as_chat_with_its_messages_left_open_and_its_extras() {
        let body = r#"{"model":"m","messages":[{"role":"system","content":"Be brief and exact, always."},
            {"role":"user","content":"Tell me"}],"tools":[{"type":"function"}],"tool_choice":"none",
            "chat_template_kwargs":{"x":1},"cache_salt":"s"}"#;
        let r = crate::parse_request(Endpoint::ChatCompletions, body.as_bytes(), 1 << 20).unwrap();
        let canonical = crate::canonical_prompt(&r);
        let text = &canonical[..20];
        let shape = WarmShape::of(&r, text.len()).unwrap();
        let call = prefill_call(r.endpoint, "m", text, shape.as_ref());
        assert_eq!(call.path, "/v1/chat/completions");
        assert!(call.shaped);
        assert_eq!(call.body["continue_final_message"], true);
        assert_eq!(call.body["add_generation_prompt"], false);
        assert_eq!(call.body["max_tokens"], 1);
        assert_eq!(call.body["messages"][0]["role"], "system");
        assert_eq!(call.body["messages"][0]["content"], "Be brief ");
        assert_eq!(call.body["tools"][0]["type"], "function");
        assert_eq!(call.body["tool_choice"], "none");
        assert_eq!(call.body["chat_template_kwargs"]["x"], 1);
        assert_eq!(call.body["cache_salt"], "s");
    }

    #[test]
    fn an_unshaped_chat_prefix_falls_back_to_a_completion_and_says_so() {
        let call = prefill_call(Endpoint::ChatCompletions, "m", "<|system|>\nabc", None);
        assert_eq!(call.path, WARM_CALL_PATH);
        assert!(!call.shaped);
        let call = prefill_call(Endpoint::Completions, "m", "abc", None);
        assert!(call.shaped);
        assert_eq!(call.body, prefill_json("m", "abc"));
    }

    #[test]
    fn adapter_pod_prefers_holders_then_ranks_every_pod() {
        let t = table(vec![pod("a", &[]), pod("b", &["x"]), pod("c", &[])]);
        assert_eq!(adapter_pod(&t, "x").unwrap().id, "b");
        let all: Vec<PlacementCandidate<'_>> = t
            .pods
            .iter()
            .map(|p| PlacementCandidate::new(&p.id, 1.0))
            .collect();
        let want = crate::placement::rank(crate::fingerprint::chain_seed("y"), &all)[0];
        assert_eq!(adapter_pod(&t, "y").unwrap().id, t.pods[want].id);
        assert!(adapter_pod(&table(vec![]), "y").is_none());
    }
}
