//! Calls both dialects make the same way: a `max_tokens: 1` completion, an embeddings request,
//! `GET /health`, `GET /v1/models` and `GET /metrics`.

use super::http::HttpPod;
use super::metrics_text::{parse_pod_load, PodLoad};
use super::models::{parse_models, ServedModels};
use super::reply::{error_reply, AdapterReply};
use prewarm_core::warm_call::{prefill_json, WARM_CALL_PATH};

use super::{AdapterOutcome, EngineError};

/// A rejected reply as an error naming the pod and URL.
pub fn rejected(pod: &HttpPod, path: &str, status: u16, body: &[u8]) -> EngineError {
    let e = error_reply(body);
    EngineError::Rejected {
        pod: pod.pod_id.clone(),
        url: pod.url(path),
        status,
        kind: e.kind,
        message: e.message,
    }
}

/// A decoded adapter reply as the call's result.
pub fn adapter_outcome(
    pod: &HttpPod,
    path: &str,
    reply: AdapterReply,
) -> Result<AdapterOutcome, EngineError> {
    match reply {
        AdapterReply::Ok(o) => Ok(o),
        AdapterReply::Failed { status, error } => Err(EngineError::Rejected {
            pod: pod.pod_id.clone(),
            url: pod.url(path),
            status,
            kind: error.kind,
            message: error.message,
        }),
    }
}

/// A completion of the prefix plus one token with `max_tokens: 1`: fills the prefix cache.
pub async fn prefill(pod: &HttpPod, model: &str, prefix_text: &str) -> Result<(), EngineError> {
    let path = WARM_CALL_PATH;
    let body = prefill_json(model, prefix_text);
    let reply = pod.post_json(path, &body, true).await?;
    if reply.status == 200 {
        Ok(())
    } else {
        Err(rejected(pod, path, reply.status, &reply.body))
    }
}

/// `POST /v1/embeddings` with `request` (an OpenAI embeddings request): the 200 reply's body.
/// Recomputing an embedding is harmless, so a retryable failure is retried.
pub async fn embeddings(
    pod: &HttpPod,
    request: &serde_json::Value,
) -> Result<Vec<u8>, EngineError> {
    let path = "/v1/embeddings";
    let reply = pod.post_json(path, request, true).await?;
    if reply.status == 200 {
        Ok(reply.body)
    } else {
        Err(rejected(pod, path, reply.status, &reply.body))
    }
}

pub async fn health(pod: &HttpPod) -> Result<(), EngineError> {
    let reply = pod.get("/health").await?;
    if reply.status == 200 {
        Ok(())
    } else {
        Err(rejected(pod, "/health", reply.status, &reply.body))
    }
}

pub async fn models(pod: &HttpPod) -> Result<ServedModels, EngineError> {
    let path = "/v1/models";
    let reply = pod.get(path).await?;
    if reply.status != 200 {
        return Err(rejected(pod, path, reply.status, &reply.body));
    }
    parse_models(&reply.body).map_err(|m| pod.bad_reply(path, m))
}

pub async fn load(pod: &HttpPod) -> Result<PodLoad, EngineError> {
    let path = "/metrics";
    let reply = pod.get(path).await?;
    if reply.status != 200 {
        return Err(rejected(pod, path, reply.status, &reply.body));
    }
    let text = std::str::from_utf8(&reply.body).map_err(|_| pod.bad_reply(path, "not UTF-8"))?;
    Ok(parse_pod_load(text))
}
