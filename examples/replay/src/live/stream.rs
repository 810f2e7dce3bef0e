//! One streamed completion: send it, time the first token, read the usage chunk.
//!
//! The request is `POST {target}/v1/completions` with `stream: true` and
//! `stream_options: {include_usage: true}`; the reply is Server-Sent Events. TTFT is the time
//! from sending to the first `data:` event carrying a choice; the last event's
//! `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` (when the server
//! returns it) are the prompt and cached tokens. The pod is the `pod_header` response header.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

/// Most bytes of event stream read from one reply (a runaway server cannot exhaust memory).
const MAX_REPLY_BYTES: usize = 16 << 20;

/// What one request measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The pod that served it (header value), if the reply named one.
    pub pod: Option<String>,
    pub ttft_s: f64,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub model: String,
    pub prompt: String,
    pub max_tokens: u64,
    pub user: String,
    /// `(header, tenant)` sent when the request has a tenant.
    pub tenant: Option<(String, String)>,
}

/// Sends `req` to `target` and reads the reply to its end.
pub async fn send(
    client: &reqwest::Client,
    target: &str,
    pod_header: &str,
    req: Outgoing,
    timeout: Duration,
) -> Result<Measured, String> {
    let mut body = json!({
        "model": req.model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(map) = body.as_object_mut() {
        map.insert("user".into(), Value::String(req.user));
    }
    let url = format!("{}/v1/completions", target.trim_end_matches('/'));
    let started = Instant::now();
    let work = async {
        let resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status();
        let pod = resp
            .headers()
            .get(pod_header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!(
                "{url}: HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let mut stream = resp.bytes_stream();
        let mut buffer: Vec<u8> = Vec::new();
        let mut read = 0usize;
        let mut ttft = None;
        let mut usage: Option<Value> = None;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("{url}: {e}"))?;
            read += chunk.len();
            if read > MAX_REPLY_BYTES {
                return Err(format!("{url}: reply longer than {MAX_REPLY_BYTES} bytes"));
            }
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                for line in String::from_utf8_lossy(&event).lines() {
                    let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                        continue;
                    };
                    if data == "[DONE]" {
                        continue;
                    }
                    let Ok(v) = serde_json::from_str::<Value>(data) else {
                        continue;
                    };
                    let has_choice = v
                        .get("choices")
                        .and_then(Value::as_array)
                        .is_some_and(|c| !c.is_empty());
                    if has_choice && ttft.is_none() {
                        ttft = Some(started.elapsed().as_secs_f64());
                    }
                    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                        usage = Some(u.clone());
                    }
                }
            }
        }
        let ttft_s = ttft.ok_or_else(|| format!("{url}: no token in the reply"))?;
        let prompt_tokens = usage
            .as_ref()
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64);
        let cached_tokens = usage
            .as_ref()
            .and_then(|u| u.get("prompt_tokens_details"))
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64);
        Ok(Measured {
            pod,
            ttft_s,
            prompt_tokens,
            cached_tokens,
        })
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        format!(
            "{url}: no complete reply within {} s",
            timeout.as_secs_f64()
        )
    })?
}
