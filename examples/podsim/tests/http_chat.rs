//! Chat over HTTP: where the template comes from (`--chat-template`, the model folder's
//! `tokenizer_config.json`), the flags' errors in vLLM's shape, malformed templates, SGLang's
//! dialect, and `cache_salt` on completions. Servers run in-process on 127.0.0.1:0.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Parser;
use podsim::cli::Args;
use podsim::server::run::{start, RunningServer};
use serde_json::{json, Value};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "podsim-chat-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A server from command-line flags, as `podsim` builds it.
async fn serve(flags: &[&str]) -> (RunningServer, String) {
    let mut argv = vec!["podsim"];
    argv.extend_from_slice(flags);
    argv.extend_from_slice(&["--time-scale", "1000", "--enable-prompt-tokens-details"]);
    let config = Args::parse_from(argv).server_config(false).unwrap();
    let server = start(config, &[], "127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", server.addr);
    (server, url)
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

fn hi(model: &str) -> Value {
    json!({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
}

fn tokens(text: &str) -> u64 {
    text.len().div_ceil(4) as u64
}

#[tokio::test]
async fn both_generation_flags_are_a_400_naming_the_field_on_vllm_only() {
    let body = json!({"model": BASE, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
        "continue_final_message": true, "add_generation_prompt": true});
    let (server, url) = serve(&[]).await;
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), body.clone()).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(
        reply,
        json!({"error": {"message": "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            "type": "BadRequestError", "param": null, "code": 400}})
    );
    server.stop(Duration::from_secs(2)).await;
    // SGLang has no add_generation_prompt field: nothing to conflict with.
    let (server, url) = serve(&["--engine", "sglang"]).await;
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), body).await;
    assert_eq!(status, 200, "{reply}");
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn the_builtin_template_is_llama_3_1s() {
    let (server, url) = serve(&[]).await;
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), hi(BASE)).await;
    assert_eq!(status, 200, "{reply}");
    let rendered = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
        Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>\
        <|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>\
        <|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_eq!(reply["usage"]["prompt_tokens"], tokens(rendered));
    // chat_template_kwargs are template variables.
    let mut body = hi(BASE);
    body["chat_template_kwargs"] = json!({"date_string": "1 January 2025"});
    let (_, reply) = post(&format!("{url}/v1/chat/completions"), body).await;
    assert_eq!(
        reply["usage"]["prompt_tokens"],
        tokens(&rendered.replace("26 Jul 2024", "1 January 2025"))
    );
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_template_file_given_by_flag_is_used() {
    let dir = temp_dir("file");
    let path = dir.join("chatml.jinja");
    std::fs::copy("../../tools/chat_templates/chatml.jinja", &path).unwrap();
    let (server, url) = serve(&["--chat-template", path.to_str().unwrap()]).await;
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), hi(BASE)).await;
    assert_eq!(status, 200, "{reply}");
    let rendered = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
        <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(reply["usage"]["prompt_tokens"], tokens(rendered));
    server.stop(Duration::from_secs(2)).await;
    // A path that is not there (and does not look like a template) is a bad flag.
    let problems = Args::parse_from(["podsim", "--chat-template", "/no/such/template.jinja"])
        .server_config(false)
        .unwrap_err();
    assert!(
        problems[0].starts_with("--chat-template: /no/such/template.jinja:"),
        "{problems:?}"
    );
}

#[tokio::test]
async fn the_model_folders_tokenizer_config_gives_template_and_special_tokens() {
    let dir = temp_dir("model");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({
            "bos_token": {"content": "<s>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
            "eos_token": "</s>",
            "chat_template": std::fs::read_to_string("../../tools/chat_templates/mistral.jinja").unwrap(),
        })
        .to_string(),
    )
    .unwrap();
    let model = dir.to_str().unwrap().to_string();
    let (server, url) = serve(&[&model]).await;
    let (status, reply) = post(&format!("{url}/v1/chat/completions"), hi(&model)).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["usage"]["prompt_tokens"],
        tokens("<s>[INST] hi[/INST]")
    );
    // Mistral's template refuses roles that do not alternate.
    let (status, reply) = post(
        &format!("{url}/v1/chat/completions"),
        json!({"model": model, "max_tokens": 1, "messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        reply["error"]["message"],
        "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."
    );
    // --chat-template wins over the folder, and the folder's special tokens stay.
    server.stop(Duration::from_secs(2)).await;
    let (server, url) = serve(&[
        &model,
        "--chat-template",
        "{{ bos_token }}{{ messages[0].content }}",
    ])
    .await;
    let (_, reply) = post(&format!("{url}/v1/chat/completions"), hi(&model)).await;
    assert_eq!(reply["usage"]["prompt_tokens"], tokens("<s>hi"));
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn malformed_templates_are_a_400_and_the_pod_keeps_serving() {
    for (template, expected) in [
        ("{% for m in messages %}{{ m.content }", "syntax error"),
        (
            "{{ raise_exception('This model does not take a system role') }}",
            "This model does not take a system role",
        ),
        (
            "{{ messages[0].content.no_such_method() }}",
            "unknown method",
        ),
        ("{{ undefined_thing | tojson }}", "not JSON serializable"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", ""),
    ] {
        let (server, url) = serve(&["--chat-template", template]).await;
        let (status, reply) = post(&format!("{url}/v1/chat/completions"), hi(BASE)).await;
        if expected.is_empty() {
            assert_eq!(status, 200, "{template}: {reply}");
        } else {
            assert_eq!(status, 400, "{template}: {reply}");
            assert_eq!(reply["error"]["type"], "BadRequestError");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(message.contains(expected), "{template}: {message}");
        }
        let (status, _) = post(
            &format!("{url}/v1/completions"),
            json!({"model": BASE, "prompt": "still serving", "max_tokens": 1}),
        )
        .await;
        assert_eq!(status, 200);
        server.stop(Duration::from_secs(2)).await;
    }
}

#[tokio::test]
async fn chat_fields_of_the_wrong_shape_are_400s_naming_the_field() {
    let (server, url) = serve(&[]).await;
    for (field, value, param) in [
        ("add_generation_prompt", json!([1]), "add_generation_prompt"),
        ("chat_template_kwargs", json!("x"), "chat_template_kwargs"),
        ("tools", json!({"a": 1}), "tools"),
        ("tools", json!([]), "tools"),
        ("cache_salt", json!(""), "cache_salt"),
        ("cache_salt", json!("a/b"), "cache_salt"),
        ("messages", json!([{"content": "no role"}]), "messages"),
    ] {
        let mut body = hi(BASE);
        body[field] = value.clone();
        let (status, reply) = post(&format!("{url}/v1/chat/completions"), body).await;
        assert_eq!(status, 400, "{field}={value}: {reply}");
        assert_eq!(reply["error"]["param"], param, "{field}={value}: {reply}");
    }
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_salted_completion_is_cached_only_for_the_same_salt() {
    let (server, url) = serve(&[]).await;
    let prompt = "A completion long enough for several blocks. ".repeat(40);
    let cached = |salt: Option<&str>| {
        let mut body = json!({"model": BASE, "prompt": prompt, "max_tokens": 1});
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        let url = url.clone();
        async move {
            let (status, reply) = post(&format!("{url}/v1/completions"), body).await;
            assert_eq!(status, 200, "{reply}");
            reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(cached(Some("s1")).await, 0);
    assert_eq!(cached(None).await, 0);
    assert_eq!(cached(Some("s2")).await, 0);
    assert!(cached(Some("s1")).await > 400);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn sglang_continues_a_final_assistant_message_and_ignores_add_generation_prompt() {
    let (server, url) = serve(&["--engine", "sglang"]).await;
    let llama = |messages: &str| {
        format!(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n\
             Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>{messages}"
        )
    };
    let user = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
    let header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    for (body, rendered) in [
        (
            json!({"model": BASE, "max_tokens": 1, "add_generation_prompt": false,
                "messages": [{"role": "user", "content": "hi"}]}),
            llama(&format!("{user}{header}")),
        ),
        (
            json!({"model": BASE, "max_tokens": 1, "continue_final_message": true,
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}]}),
            llama(&format!("{user}{header}Sure: ")),
        ),
        (
            json!({"model": BASE, "max_tokens": 1, "cache_salt": ["not", "a string"],
                "messages": [{"role": "user", "content": "hi"}]}),
            String::new(),
        ),
    ] {
        let (status, reply) = post(&format!("{url}/v1/chat/completions"), body).await;
        if rendered.is_empty() {
            assert_eq!(status, 400, "{reply}");
            continue;
        }
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["usage"]["prompt_tokens"], tokens(&rendered));
    }
    server.stop(Duration::from_secs(2)).await;
}
