//! Several pods from one process (`--pods N`): each keeps its own prefix cache and metrics, the
//! binary prints one readiness line a pod, and bad values exit 64 naming the flag.

mod support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use podsim::server::fleet::{pod_addrs, start_fleet, stop_fleet};
use podsim::server::ServerConfig;
use podsim::PodConfig;
use serde_json::{json, Value};

const BASE: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A completion of `prompt` on the pod at `url`: its `usage`.
async fn complete(url: &str, prompt: &str) -> Value {
    let body = json!({"model": BASE, "prompt": prompt, "max_tokens": 1});
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let reply: Value = r.json().await.unwrap();
    reply["usage"].clone()
}

/// The value of the first sample of `/metrics` whose line starts with `prefix`.
async fn metric(url: &str, prefix: &str) -> f64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    support::metric(&text, prefix)
}

#[tokio::test]
async fn pods_of_one_process_keep_their_own_caches_and_counters() {
    let mut config = ServerConfig::new(PodConfig::default());
    config.time_scale = 1000.0;
    config.enable_prompt_tokens_details = true;
    let addrs = pod_addrs("127.0.0.1", 0, 2).unwrap();
    let pods = start_fleet(&config, &[], &addrs).await.unwrap();
    assert_eq!(pods.len(), 2);
    assert_ne!(pods[0].addr, pods[1].addr);
    let (a, b) = (
        format!("http://{}", pods[0].addr),
        format!("http://{}", pods[1].addr),
    );
    let prompt = "the same long prompt ".repeat(40); // 840 bytes: 210 tokens, 13 full blocks

    let first = complete(&a, &prompt).await;
    let again = complete(&a, &prompt).await;
    assert_eq!(first["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(again["prompt_tokens_details"]["cached_tokens"], 208);
    // Pod b never saw the prompt: nothing of it is cached there.
    let elsewhere = complete(&b, &prompt).await;
    assert_eq!(elsewhere["prompt_tokens_details"]["cached_tokens"], 0);

    let queried = "vllm:prefix_cache_queries_total{";
    assert_eq!(metric(&a, queried).await, 420.0);
    assert_eq!(metric(&b, queried).await, 210.0);
    assert_eq!(metric(&a, "vllm:prefix_cache_hits_total{").await, 208.0);
    assert_eq!(metric(&b, "vllm:prefix_cache_hits_total{").await, 0.0);
    stop_fleet(pods, std::time::Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_fleet_that_cannot_bind_every_pod_starts_none() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    // a port free now, for the first pod, which binds it before the second fails
    let first = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let addrs = vec![first.clone(), taken_addr.clone()];
    let config = ServerConfig::new(PodConfig::default());
    let Err(e) = start_fleet(&config, &[], &addrs).await else {
        panic!("a fleet started on a taken port");
    };
    assert!(e.to_string().contains(&taken_addr), "{e}");
    // the first pod was stopped: its port is free again
    TcpListener::bind(&first).unwrap_or_else(|e| panic!("{first} still held: {e}"));
}

/// The podsim binary with `flags`, stdout piped.
fn podsim(flags: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_podsim"))
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A child killed when the test ends, a failing one included.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_prints_one_readiness_line_a_pod_and_each_pod_answers() {
    let mut child = Killed(podsim(&["--port", "0", "--pods", "3"]));
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut urls = Vec::new();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        let url = line
            .strip_prefix("podsim listening on ")
            .unwrap_or_else(|| panic!("not a readiness line: {line}"));
        urls.push(url.to_string());
    }
    let mut distinct = urls.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{urls:?}");
    // Each answers, and a request to one is counted by that one only.
    complete(&urls[1], "hello, pod").await; // 10 bytes: 3 tokens
    for (i, url) in urls.iter().enumerate() {
        let tokens = metric(url, "vllm:prefix_cache_queries_total{").await;
        assert_eq!(tokens, if i == 1 { 3.0 } else { 0.0 }, "{url}");
    }
}

#[test]
fn bad_pod_counts_and_port_ranges_exit_64_naming_the_flag() {
    for (flags, problem) in [
        (&["--pods", "0"][..], "--pods: 0:"),
        (&["--pods", "4097"], "--pods: 4097:"),
        (&["--port", "65000", "--pods", "600"], "--pods: 600:"),
    ] {
        let out = podsim(flags).wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(stderr.contains(problem), "{flags:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{flags:?}");
    }
}

#[test]
fn a_taken_port_in_the_range_exits_64_with_no_pod_announced() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    // The range ends at the taken port, whatever holds the ports before it.
    let first = (port - 1).to_string();
    let out = podsim(&["--port", &first, "--pods", "2"])
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("bind 127.0.0.1:"), "{stderr}");
    assert!(out.stdout.is_empty());
}
