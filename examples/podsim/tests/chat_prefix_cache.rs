//! Chat requests in the pod model: the prompt is the served model's chat template's rendering,
//! so a chat request is served from cache only by a chat warm call of its prefix carrying the
//! same template inputs (tools, salt, adapter), never by a completion of another rendering.
//! Run over the three fixture templates (`tools/chat_templates`).

use podsim::chat::{ChatTemplate, ContentFormatArg};
use podsim::{AdapterSpec, Admission, Engine, Pod, PodConfig, PreparedRequest, RequestSpec};
use prewarm_core::request::Endpoint;
use serde_json::{json, Value};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn fixture(name: &str, source: &str, tokens: &[(&str, &str)]) -> ChatTemplate {
    ChatTemplate::new(
        vec![("default".into(), source.into())],
        tokens
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ContentFormatArg::Auto,
        name.into(),
    )
}

/// The fixtures with their families' special tokens.
fn templates() -> Vec<(&'static str, ChatTemplate)> {
    vec![
        ("llama3", ChatTemplate::builtin()),
        (
            "chatml",
            fixture(
                "chatml",
                include_str!("../../../tools/chat_templates/chatml.jinja"),
                &[("eos_token", "<|im_end|>")],
            ),
        ),
        (
            "mistral",
            fixture(
                "mistral",
                include_str!("../../../tools/chat_templates/mistral.jinja"),
                &[("bos_token", "<s>"), ("eos_token", "</s>")],
            ),
        ),
    ]
}

fn prepare(
    template: &ChatTemplate,
    engine: Engine,
    endpoint: Endpoint,
    body: Value,
) -> PreparedRequest {
    RequestSpec::prepare(
        endpoint,
        body.to_string().as_bytes(),
        1 << 24,
        template,
        engine,
    )
    .unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn chat(template: &ChatTemplate, body: Value) -> PreparedRequest {
    prepare(template, Engine::Vllm, Endpoint::ChatCompletions, body)
}

fn submit(pod: &mut Pod, now: f64, request: &PreparedRequest) -> Admission {
    pod.submit_salted(now, &request.spec, request.cache_salt.as_deref())
        .unwrap()
}

fn sentence(topic: &str, bytes: usize) -> String {
    let line = format!("Notes on {topic}: keep answers short, cite the table and the column. ");
    line.repeat(bytes / line.len() + 1)
        .get(..bytes)
        .unwrap()
        .to_string()
}

/// A conversation whose last (user) message is long, and its warm call: the messages before it
/// and the first 60 % of it.
fn conversation() -> (Vec<Value>, Vec<Value>) {
    let last = sentence("the quarterly report", 3000);
    let cut = last.get(..1800).unwrap().to_string();
    let head = vec![
        json!({"role": "system", "content": sentence("the SQL house style", 1500)}),
        json!({"role": "user", "content": sentence("the first question", 300)}),
        json!({"role": "assistant", "content": sentence("the first answer", 300)}),
    ];
    let mut full = head.clone();
    full.push(json!({"role": "user", "content": last}));
    let mut prefix = head;
    prefix.push(json!({"role": "user", "content": cut}));
    (prefix, full)
}

fn warm_call(messages: &[Value], extra: Value) -> Value {
    let mut body = json!({"model": BASE, "messages": messages, "max_tokens": 1,
        "continue_final_message": true, "add_generation_prompt": false});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

fn request(messages: &[Value], extra: Value) -> Value {
    let mut body = json!({"model": BASE, "messages": messages, "max_tokens": 4});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

#[test]
fn a_chat_warm_call_of_the_prefix_serves_nine_tenths_of_it_to_the_full_request() {
    let (prefix, full) = conversation();
    for (name, template) in templates() {
        let mut pod = Pod::new(PodConfig::default()).unwrap();
        let warm = chat(&template, warm_call(&prefix, json!({})));
        let req = chat(&template, request(&full, json!({})));
        // The open final message: the warm rendering is exactly a prefix of the request's.
        assert!(
            req.spec
                .canonical_prompt
                .starts_with(&warm.spec.canonical_prompt),
            "{name}: {:?}",
            warm.spec
                .canonical_prompt
                .get(warm.spec.canonical_prompt.len() - 40..)
        );
        assert_eq!(submit(&mut pod, 0.0, &warm).cached_tokens, 0);
        let shared = warm.spec.prompt_tokens();
        let cached = submit(&mut pod, 1.0, &req).cached_tokens;
        assert!(shared > 900, "{name}: {shared}");
        assert!(cached * 10 >= shared * 9, "{name}: {cached} of {shared}");
    }
}

#[test]
fn a_warm_call_that_closes_its_last_message_leaves_the_request_less_cached() {
    // Without the two flags the cut message is closed (end of turn, assistant header): the
    // rendering is not a prefix of the request's, and the request misses its last blocks.
    let (prefix, full) = conversation();
    for (name, template) in templates() {
        let mut pod = Pod::new(PodConfig::default()).unwrap();
        let closed = chat(
            &template,
            json!({"model": BASE, "messages": prefix, "max_tokens": 1}),
        );
        let req = chat(&template, request(&full, json!({})));
        assert!(
            !req.spec
                .canonical_prompt
                .starts_with(&closed.spec.canonical_prompt),
            "{name}"
        );
        submit(&mut pod, 0.0, &closed);
        let open = chat(&template, warm_call(&prefix, json!({})));
        let cached = submit(&mut pod, 1.0, &req).cached_tokens;
        assert!(cached < open.spec.prompt_tokens(), "{name}: {cached}");
    }
}

#[test]
fn a_completion_of_the_canonical_rendering_caches_nothing_a_chat_request_uses() {
    let system = sentence("the SQL house style", 2400);
    let question = "How many orders shipped late last week?";
    for (name, template) in templates() {
        let mut pod = Pod::new(PodConfig::default()).unwrap();
        // prewarm's canonical rendering of the conversation, as a completion.
        let canonical = prepare(
            &template,
            Engine::Vllm,
            Endpoint::Completions,
            json!({"model": BASE, "prompt": format!("<|system|>\n{system}\n<|user|>\n{question}\n"), "max_tokens": 1}),
        );
        assert_eq!(submit(&mut pod, 0.0, &canonical).cached_tokens, 0);
        let req = chat(
            &template,
            request(
                &[
                    json!({"role": "system", "content": system}),
                    json!({"role": "user", "content": question}),
                ],
                json!({}),
            ),
        );
        let a = submit(&mut pod, 1.0, &req);
        assert!(a.prompt_tokens > 600, "{name}");
        assert_eq!(a.cached_tokens, 0, "{name}");
    }
}

#[test]
fn a_salted_request_is_cached_only_after_a_warm_call_with_the_same_salt() {
    let (prefix, full) = conversation();
    let template = ChatTemplate::builtin();
    let mut pod = Pod::new(PodConfig::default()).unwrap();
    let warm = chat(
        &template,
        warm_call(&prefix, json!({"cache_salt": "tenant-a"})),
    );
    submit(&mut pod, 0.0, &warm);
    for other in [json!({"cache_salt": "tenant-b"}), json!({})] {
        let a = submit(
            &mut pod,
            1.0,
            &chat(&template, request(&full, other.clone())),
        );
        assert_eq!(a.cached_tokens, 0, "{other}");
    }
    let same = submit(
        &mut pod,
        2.0,
        &chat(&template, request(&full, json!({"cache_salt": "tenant-a"}))),
    );
    assert!(same.cached_tokens * 10 >= warm.spec.prompt_tokens() * 9);

    // Completions carry the salt too (vLLM accepts it on /v1/completions).
    let prompt = sentence("a completion", 2000);
    let completion = |salt: Value| {
        let mut body = json!({"model": BASE, "prompt": prompt, "max_tokens": 1});
        if let (Some(b), Some(s)) = (body.as_object_mut(), salt.as_object()) {
            b.extend(s.clone());
        }
        prepare(&template, Engine::Vllm, Endpoint::Completions, body)
    };
    submit(&mut pod, 3.0, &completion(json!({"cache_salt": "s1"})));
    assert_eq!(
        submit(&mut pod, 4.0, &completion(json!({}))).cached_tokens,
        0
    );
    assert_eq!(
        submit(&mut pod, 5.0, &completion(json!({"cache_salt": "s2"}))).cached_tokens,
        0
    );
    assert!(submit(&mut pod, 6.0, &completion(json!({"cache_salt": "s1"}))).cached_tokens > 400);
}

#[test]
fn a_request_with_tools_is_cached_only_after_a_warm_call_with_the_same_tools() {
    let tool = |name: &str, what: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}})
    };
    let weather = json!([tool("get_weather", "Today's weather in a city")]);
    let stocks = json!([tool("get_stock", "A share price")]);
    let question = sentence("the trip", 3000);
    let messages = [
        json!({"role": "system", "content": "You plan trips."}),
        json!({"role": "user", "content": question}),
    ];
    let cut = [
        messages[0].clone(),
        json!({"role": "user", "content": question.get(..2000).unwrap()}),
    ];
    for (name, template) in templates() {
        let mut pod = Pod::new(PodConfig::default()).unwrap();
        let warm = chat(&template, warm_call(&cut, json!({"tools": weather})));
        submit(&mut pod, 0.0, &warm);
        let shared = warm.spec.prompt_tokens();
        let other = submit(
            &mut pod,
            1.0,
            &chat(&template, request(&messages, json!({"tools": stocks}))),
        );
        assert!(
            other.cached_tokens * 2 < shared,
            "{name}: {} of {shared}",
            other.cached_tokens
        );
        let none = submit(
            &mut pod,
            2.0,
            &chat(&template, request(&messages, json!({}))),
        );
        assert!(
            none.cached_tokens * 2 < shared,
            "{name}: {}",
            none.cached_tokens
        );
        let same = submit(
            &mut pod,
            3.0,
            &chat(&template, request(&messages, json!({"tools": weather}))),
        );
        assert!(
            same.cached_tokens * 10 >= shared * 9,
            "{name}: {} of {shared}",
            same.cached_tokens
        );
    }
}

#[test]
fn the_adapter_stays_in_the_block_key_of_chat_requests() {
    let (prefix, full) = conversation();
    let template = ChatTemplate::builtin();
    let mut pod = Pod::new(PodConfig {
        enable_lora: true,
        max_loras: 2,
        max_cpu_loras: 2,
        ..PodConfig::default()
    })
    .unwrap();
    pod.load_adapter(
        AdapterSpec {
            name: "sql-lora".into(),
            path: "/a/sql".into(),
            rank: 8,
            pinned: false,
        },
        false,
    )
    .unwrap();
    let warm = chat(&template, warm_call(&prefix, json!({"model": "sql-lora"})));
    submit(&mut pod, 0.0, &warm);
    let base = submit(&mut pod, 1.0, &chat(&template, request(&full, json!({}))));
    assert_eq!(base.cached_tokens, 0);
    let adapter = submit(
        &mut pod,
        2.0,
        &chat(&template, request(&full, json!({"model": "sql-lora"}))),
    );
    assert!(adapter.cached_tokens * 10 >= warm.spec.prompt_tokens() * 9);
}

#[test]
fn on_sglang_a_warm_call_of_a_cut_user_message_still_serves_the_shared_prefix() {
    // SGLang has no add_generation_prompt and continues only a final assistant message: the
    // warm call renders its cut user message closed, with the generation prompt after it. The
    // request still shares every byte up to the cut.
    let (prefix, full) = conversation();
    for (name, template) in templates() {
        let mut pod = Pod::new(PodConfig {
            engine: Engine::Sglang,
            ..PodConfig::default()
        })
        .unwrap();
        let warm = prepare(
            &template,
            Engine::Sglang,
            Endpoint::ChatCompletions,
            warm_call(&prefix, json!({})),
        );
        let req = prepare(
            &template,
            Engine::Sglang,
            Endpoint::ChatCompletions,
            request(&full, json!({})),
        );
        let common = warm
            .spec
            .canonical_prompt
            .bytes()
            .zip(req.spec.canonical_prompt.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            common < warm.spec.canonical_prompt.len(),
            "{name}: closed on SGLang"
        );
        submit(&mut pod, 0.0, &warm);
        let cached = submit(&mut pod, 1.0, &req).cached_tokens;
        let shared = common / 4;
        assert!(cached * 10 >= shared * 9, "{name}: {cached} of {shared}");
    }
}
