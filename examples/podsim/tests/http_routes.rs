//! HTTP tests of every route and error shape against an in-process server on 127.0.0.1:0.

mod support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use support::metric;

use futures::StreamExt;
use podsim::cli::LoraModule;
use podsim::server::errors::ErrorFormat;
use podsim::server::run::{start, RunningServer};
use podsim::server::ServerConfig;
use podsim::{Engine, PodConfig};
use serde_json::{json, Value};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn adapter_dir(name: &str, rank: u32) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "podsim-http-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("adapter_config.json"),
        json!({"r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"}).to_string(),
    )
    .unwrap();
    dir
}

fn lora_config() -> ServerConfig {
    let mut c = ServerConfig::new(PodConfig {
        enable_lora: true,
        max_loras: 1,
        max_cpu_loras: 2,
        ..PodConfig::default()
    });
    c.allow_runtime_lora_updating = true;
    c.time_scale = 100.0;
    c
}

async fn serve(config: ServerConfig, modules: &[LoraModule]) -> (RunningServer, String) {
    let server = start(config, modules, "127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", server.addr);
    (server, url)
}

async fn post(url: &str, body: Value) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn completion_reports_usage_and_cached_tokens_only_with_the_flag() {
    let mut config = lora_config();
    config.enable_prompt_tokens_details = true;
    let (server, url) = serve(config, &[]).await;
    let prompt = "p".repeat(4 * 100);
    let body = json!({"model": BASE, "prompt": prompt, "max_tokens": 3});
    let (status, text) = post(&format!("{url}/v1/completions"), body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let v = parse(&text);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], BASE);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap().len(), 12);
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 103);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, text) = post(&format!("{url}/v1/completions"), body).await;
    assert_eq!(
        parse(&text)["usage"]["prompt_tokens_details"]["cached_tokens"],
        96
    );
    server.stop(Duration::from_secs(2)).await;

    let (server, url) = serve(lora_config(), &[]).await;
    let (_, text) = post(
        &format!("{url}/v1/completions"),
        json!({"model": BASE, "prompt": "hello", "max_tokens": 1}),
    )
    .await;
    assert_eq!(parse(&text)["usage"]["prompt_tokens_details"], Value::Null);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn chat_streams_chunks_then_usage_then_done() {
    let (server, url) = serve(lora_config(), &[]).await;
    let body = json!({"model": BASE, "stream": true, "max_tokens": 4,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi there"}]});
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = resp.text().await.unwrap();
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap())
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| parse(e))
        .collect();
    assert_eq!(chunks.len(), 1 + 4 + 1, "role, 4 tokens, usage: {text}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for c in &chunks[1..5] {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["choices"][0]["delta"]["content"].as_str().unwrap().len(),
            4
        );
    }
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 4);
    // Without include_usage: no usage chunk.
    let body = json!({"model": BASE, "stream": true, "max_tokens": 2, "prompt": "x"});
    let (_, text) = post(&format!("{url}/v1/completions"), body).await;
    assert_eq!(text.matches("data: ").count(), 3, "{text}");
    assert!(!text.contains("usage"));
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn models_health_metrics_and_unknown_routes() {
    let dir = adapter_dir("sql", 8);
    let modules = [LoraModule {
        name: "sql-lora".into(),
        path: dir.display().to_string(),
    }];
    let (server, url) = serve(lora_config(), &modules).await;
    let (status, text) = get(&format!("{url}/v1/models")).await;
    assert_eq!(status, 200);
    let v = parse(&text);
    assert_eq!(v["object"], "list");
    let base = &v["data"][0];
    assert_eq!(base["id"], BASE);
    assert_eq!(base["owned_by"], "vllm");
    assert_eq!(base["root"], BASE);
    assert_eq!(base["parent"], Value::Null);
    assert_eq!(base["max_model_len"], 8192);
    assert_eq!(base["permission"][0]["object"], "model_permission");
    let card = &v["data"][1];
    assert_eq!(card["id"], "sql-lora");
    assert_eq!(card["root"], dir.display().to_string());
    assert_eq!(card["parent"], BASE);
    assert_eq!(card["max_model_len"], Value::Null);

    assert_eq!(get(&format!("{url}/health")).await.0, 200);
    let (status, text) = get(&format!("{url}/v2/nothing")).await;
    assert_eq!(
        (status, parse(&text)),
        (404, json!({"detail": "Not Found"}))
    );

    let prompt = "q".repeat(4 * 40);
    for _ in 0..2 {
        let (s, t) = post(
            &format!("{url}/v1/completions"),
            json!({"model": "sql-lora", "prompt": prompt, "max_tokens": 2}),
        )
        .await;
        assert_eq!(s, 200, "{t}");
    }
    let (status, m) = get(&format!("{url}/metrics")).await;
    assert_eq!(status, 200);
    let labels = format!(r#"{{model_name="{BASE}",engine="0"}}"#);
    assert_eq!(
        metric(&m, &format!("vllm:num_requests_running{labels}")),
        0.0
    );
    assert_eq!(
        metric(&m, &format!("vllm:num_requests_waiting{labels}")),
        0.0
    );
    assert_eq!(
        metric(&m, &format!("vllm:kv_cache_usage_perc{labels}")),
        0.0
    );
    assert_eq!(
        metric(&m, &format!("vllm:prefix_cache_queries_total{labels}")),
        80.0
    );
    assert_eq!(
        metric(&m, &format!("vllm:prefix_cache_hits_total{labels}")),
        32.0
    );
    // vLLM's API server keeps prometheus_client's process collector: the process start time
    let started = metric(&m, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(started > 1.7e9 && started <= now, "{started}");
    assert!(m.contains("# TYPE process_start_time_seconds gauge"));
    assert_eq!(
        metric(
            &m,
            &format!(
                r#"vllm:request_success_total{{model_name="{BASE}",engine="0",finished_reason="length"}}"#
            )
        ),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            &format!("vllm:time_to_first_token_seconds_count{labels}")
        ),
        2.0
    );
    assert!(m.contains(r#"vllm:time_to_first_token_seconds_bucket{le="2560.0","#));
    assert!(m.contains("# TYPE vllm:inter_token_latency_seconds histogram"));
    assert!(m.contains(r#"vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="26624""#));
    // One series per combination ever seen, each stamped with the unix time it was current.
    let lora: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("vllm:lora_requests_info{"))
        .collect();
    assert!(
        lora.iter()
            .any(|l| l.contains(r#"running_lora_adapters="sql-lora""#)),
        "{lora:?}"
    );
    assert!(lora
        .iter()
        .any(|l| l.contains(r#"waiting_lora_adapters="",running_lora_adapters="""#)));
    assert!(lora.iter().all(|l| l.contains(r#"max_lora="1""#)));
    let stamp: f64 = lora[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(stamp > 1.7e9);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn request_errors_use_the_nested_or_flat_format() {
    let (server, url) = serve(lora_config(), &[]).await;
    let (status, text) = post(
        &format!("{url}/v1/chat/completions"),
        json!({"model": "missing", "messages": []}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        parse(&text),
        json!({"error": {"message": "The model `missing` does not exist.",
            "type": "NotFoundError", "param": "model", "code": 404}})
    );
    let (status, text) = post(
        &format!("{url}/v1/completions"),
        json!({"model": BASE, "prompt": "x", "max_tokens": 0}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(parse(&text)["error"]["type"], "BadRequestError");
    assert_eq!(parse(&text)["error"]["param"], "max_tokens");
    let (status, text) = post(
        &format!("{url}/v1/chat/completions"),
        json!({"model": BASE}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(parse(&text)["error"]["message"], "messages: missing");
    let (status, text) = post(
        &format!("{url}/v1/completions"),
        json!({"model": BASE, "prompt": "x".repeat(4 * 8200)}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(parse(&text)["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("This model's maximum context length is 8192 tokens."));
    assert_eq!(parse(&text)["error"]["param"], "input_tokens");
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v = parse(&r.text().await.unwrap());
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("application/json"));
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    server.stop(Duration::from_secs(2)).await;

    let mut flat = lora_config();
    flat.error_format = ErrorFormat::Flat;
    let (server, url) = serve(flat, &[]).await;
    let (status, text) = post(
        &format!("{url}/v1/completions"),
        json!({"model": "missing", "prompt": "x"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        parse(&text),
        json!({"object": "error", "message": "The model `missing` does not exist.",
            "type": "NotFoundError", "param": "model", "code": 404})
    );
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn lora_routes_exist_only_with_the_environment_flag() {
    let mut config = lora_config();
    config.allow_runtime_lora_updating = false;
    let (server, url) = serve(config, &[]).await;
    let (status, _) = post(
        &format!("{url}/v1/load_lora_adapter"),
        json!({"lora_name": "a", "lora_path": "/x"}),
    )
    .await;
    assert_eq!(status, 404);
    server.stop(Duration::from_secs(2)).await;
    let mut config = lora_config();
    config.pod.enable_lora = false;
    let (server, url) = serve(config, &[]).await;
    let (status, _) = post(
        &format!("{url}/v1/unload_lora_adapter"),
        json!({"lora_name": "a"}),
    )
    .await;
    assert_eq!(status, 404);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn vllm_lora_load_and_unload_replies() {
    let (server, url) = serve(lora_config(), &[]).await;
    let load = format!("{url}/v1/load_lora_adapter");
    let unload = format!("{url}/v1/unload_lora_adapter");
    let dir = adapter_dir("a", 8).display().to_string();
    let (status, text) = post(&load, json!({"lora_name": "a", "lora_path": dir})).await;
    assert_eq!(
        (status, text.as_str()),
        (200, "Success: LoRA adapter 'a' added successfully.")
    );
    let (status, text) = post(&load, json!({"lora_name": "a", "lora_path": dir})).await;
    assert_eq!(status, 400);
    let v = parse(&text);
    assert_eq!(v["error"]["type"], "InvalidUserInput");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("has already been loaded"));
    let (status, _) = post(
        &load,
        json!({"lora_name": "a", "lora_path": dir, "load_inplace": true}),
    )
    .await;
    assert_eq!(status, 200);
    // A missing field fails request validation (vLLM 0.32: FastAPI's "Bad Request" naming the
    // field); an empty one reaches the handler (InvalidUserInput).
    let (status, text) = post(&load, json!({"lora_name": "b"})).await;
    assert_eq!(status, 400);
    assert_eq!(parse(&text)["error"]["type"], "Bad Request");
    assert_eq!(parse(&text)["error"]["param"], "body.lora_path");
    let (status, text) = post(&load, json!({"lora_name": "b", "lora_path": ""})).await;
    assert_eq!(status, 400);
    assert_eq!(parse(&text)["error"]["type"], "InvalidUserInput");
    let (status, text) = post(
        &load,
        json!({"lora_name": "c", "lora_path": "/no/such/dir"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        parse(&text)["error"]["message"],
        "Loading lora c failed: No adapter found for /no/such/dir"
    );
    let empty = adapter_dir("empty", 8);
    std::fs::remove_file(empty.join("adapter_config.json")).unwrap();
    let (status, _) = post(
        &load,
        json!({"lora_name": "e", "lora_path": empty.display().to_string()}),
    )
    .await;
    assert_eq!(status, 404);
    let big = adapter_dir("big", 64).display().to_string();
    let (status, text) = post(&load, json!({"lora_name": "big", "lora_path": big})).await;
    assert_eq!(status, 500);
    let v = parse(&text);
    assert_eq!(v["error"]["type"], "InternalServerError");
    assert_eq!(
        v["error"]["message"],
        "LoRA rank 64 is greater than max_lora_rank 16."
    );
    let bad = adapter_dir("bad", 8);
    std::fs::write(bad.join("adapter_config.json"), "{").unwrap();
    let (status, _) = post(
        &load,
        json!({"lora_name": "bad", "lora_path": bad.display().to_string()}),
    )
    .await;
    assert_eq!(status, 500);
    // The adapter serves requests, then goes.
    let (status, _) = post(
        &format!("{url}/v1/completions"),
        json!({"model": "a", "prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, text) = post(&unload, json!({"lora_name": "a"})).await;
    assert_eq!(
        (status, text.as_str()),
        (200, "Success: LoRA adapter 'a' removed successfully.")
    );
    let (status, text) = post(&unload, json!({"lora_name": "a"})).await;
    assert_eq!(status, 404);
    assert_eq!(
        parse(&text)["error"]["message"],
        "The lora adapter 'a' cannot be found."
    );
    let (_, text) = get(&format!("{url}/v1/models")).await;
    assert_eq!(parse(&text)["data"].as_array().unwrap().len(), 1);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn sglang_mode_serves_its_lora_routes_naming_and_metrics() {
    let mut config = lora_config();
    config.pod.engine = Engine::Sglang;
    config.pod.max_loaded_loras = Some(1);
    config.allow_runtime_lora_updating = false;
    let (server, url) = serve(config, &[]).await;
    let dir = adapter_dir("s", 8).display().to_string();
    let (status, _) = post(
        &format!("{url}/v1/load_lora_adapter"),
        json!({"lora_name": "s", "lora_path": dir}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, text) = post(
        &format!("{url}/load_lora_adapter"),
        json!({"lora_name": "s", "lora_path": dir, "pinned": false}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        parse(&text),
        json!({"success": true, "error_message": "", "loaded_adapters": {"s": dir}})
    );
    let (status, text) = post(
        &format!("{url}/load_lora_adapter"),
        json!({"lora_name": "t", "lora_path": dir}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(parse(&text)["success"], false);
    let (status, text) = post(
        &format!("{url}/v1/chat/completions"),
        json!({"model": format!("{BASE}:s"), "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (_, m) = get(&format!("{url}/metrics")).await;
    assert!(m.contains("sglang:num_queue_reqs{"));
    assert!(m.contains("sglang:cache_hit_rate{"));
    assert!(!m.contains("vllm:"));
    assert!(
        !m.contains("process_start_time_seconds"),
        "SGLang's multiprocess registry has no process metrics"
    );
    let (status, text) = post(
        &format!("{url}/unload_lora_adapter"),
        json!({"lora_name": "s"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(parse(&text)["loaded_adapters"], json!({}));
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_aborts_its_request() {
    let mut config = lora_config();
    config.time_scale = 1.0;
    let (server, url) = serve(config, &[]).await;
    let resp = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": BASE, "prompt": "x", "max_tokens": 1000, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    drop(body);
    let aborted = format!(
        r#"vllm:request_success_total{{model_name="{BASE}",engine="0",finished_reason="abort"}}"#
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = get(&format!("{url}/metrics")).await;
        if metric(&m, &aborted) == 1.0 {
            assert_eq!(metric(&m, "vllm:num_requests_running{"), 0.0);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no abort counted:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop(Duration::from_secs(2)).await;
}

async fn poll_metrics(url: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = get(&format!("{url}/metrics")).await;
        if ok(&m) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_request_for_a_second_adapter_waits_for_the_only_slot() {
    let modules: Vec<LoraModule> = ["a", "b"]
        .iter()
        .map(|n| LoraModule {
            name: n.to_string(),
            path: adapter_dir(n, 8).display().to_string(),
        })
        .collect();
    let mut config = lora_config();
    config.time_scale = 10.0;
    let (server, url) = serve(config, &modules).await;
    let send = |model: &'static str, max_tokens: u64| {
        let url = url.clone();
        tokio::spawn(async move {
            post(
                &format!("{url}/v1/completions"),
                json!({"model": model, "prompt": "x", "max_tokens": max_tokens}),
            )
            .await
        })
    };
    // 300 tokens × 12 ms = 3.6 s of model time, 0.36 s of real time.
    let first = send("a", 300);
    poll_metrics(&url, "a running", |m| {
        metric(m, "vllm:num_requests_running{") == 1.0
    })
    .await;
    let second = send("b", 1);
    let m = poll_metrics(&url, "b waiting", |m| {
        metric(m, "vllm:num_requests_waiting{") == 1.0
    })
    .await;
    assert!(
        m.contains(r#"vllm:lora_requests_info{max_lora="1",waiting_lora_adapters="b",running_lora_adapters="a"}"#),
        "{m}"
    );
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    let m = poll_metrics(&url, "idle", |m| {
        metric(m, "vllm:num_requests_running{") == 0.0
    })
    .await;
    assert_eq!(metric(&m, "vllm:num_requests_waiting{"), 0.0);
    // b queued ~3.6 s of model time: its TTFT lands in the (2.5, 5] bucket.
    let labels = format!(r#"model_name="{BASE}",engine="0"}}"#);
    let le = |b: &str| {
        metric(
            &m,
            &format!(r#"vllm:time_to_first_token_seconds_bucket{{le="{b}",{labels}"#),
        )
    };
    assert_eq!(le("2.5"), 1.0);
    assert_eq!(le("5.0"), 2.0);
    server.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn embeddings_answer_like_a_pooling_model_with_stable_vectors() {
    let (server, url) = serve(lora_config(), &[]).await;
    let endpoint = format!("{url}/v1/embeddings");
    let body = json!({"model": BASE, "input": ["alpha", "beta gamma"]});
    let (status, text) = post(&endpoint, body).await;
    assert_eq!(status, 200, "{text}");
    let v = parse(&text);
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], BASE);
    assert!(v["id"].as_str().unwrap().starts_with("embd-"));
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 3);
    assert_eq!(v["usage"]["total_tokens"], 5);
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    assert_eq!(data[0]["object"], "embedding");
    let alpha = data[0]["embedding"].as_array().unwrap();
    assert_eq!(alpha.len(), 384);
    let norm: f64 = alpha.iter().map(|x| x.as_f64().unwrap().powi(2)).sum();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");

    // The same input alone gives byte-equal vectors; base64 and dimensions change the shape.
    let (_, again) = post(&endpoint, json!({"model": BASE, "input": "alpha"})).await;
    assert_eq!(parse(&again)["data"][0]["embedding"], data[0]["embedding"]);
    let (_, b64) = post(
        &endpoint,
        json!({"model": BASE, "input": "alpha", "encoding_format": "base64", "dimensions": 2}),
    )
    .await;
    let encoded = parse(&b64)["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(encoded.len(), 12); // 8 bytes of two f32

    for (body, param, status) in [
        (json!({"model": BASE}), "input", 400),
        (
            json!({"model": BASE, "input": "x", "dimensions": 385}),
            "dimensions",
            400,
        ),
        (
            json!({"model": BASE, "input": "x", "encoding_format": "hex"}),
            "encoding_format",
            400,
        ),
        (
            json!({"model": BASE, "input": "x".repeat(4 * 8193)}),
            "input",
            400,
        ),
        (json!({"model": "nope", "input": "x"}), "model", 404),
    ] {
        let (got, text) = post(&endpoint, body).await;
        assert_eq!(got, status, "{text}");
        assert_eq!(parse(&text)["error"]["param"], param, "{text}");
    }
    server.stop(Duration::from_secs(2)).await;
}
