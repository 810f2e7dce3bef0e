//! Calls both dialects make the same way: a `max_tokens: 1` prefill in its traffic's shape, an
//! embeddings request, `GET /health`, `GET /v1/models` and `GET /metrics`.

use super::http::HttpPod;
use super::metrics_text::{parse_scrape, MetricsScrape, PodLoad};
use super::models::{parse_models, ServedModels};
use super::reply::{error_reply, AdapterReply};

use super::{AdapterOutcome, EngineError, PrefillRequest};

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

/// `request` as `model` (the engine's name for the request's model), `max_tokens: 1`: fills
/// the prefix cache with the tokens the traffic's requests look up. A rejection's message has
/// the request's salt masked.
pub async fn prefill(
    pod: &HttpPod,
    model: &str,
    request: &PrefillRequest,
) -> Result<(), EngineError> {
    let call = request.call(model);
    let reply = pod.post_json(call.path, &call.body, true).await?;
    if reply.status == 200 {
        return Ok(());
    }
    match rejected(pod, call.path, reply.status, &reply.body) {
        EngineError::Rejected {
            pod,
            url,
            status,
            kind,
            message,
        } => Err(EngineError::Rejected {
            pod,
            url,
            status,
            kind: request.redact(&kind),
            message: request.redact(&message),
        }),
        other => Err(other),
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
    scrape(pod).await.map(|s| s.load)
}

pub async fn scrape(pod: &HttpPod) -> Result<MetricsScrape, EngineError> {
    let path = "/metrics";
    let reply = pod.get(path).await?;
    if reply.status != 200 {
        return Err(rejected(pod, path, reply.status, &reply.body));
    }
    let text = std::str::from_utf8(&reply.body).map_err(|_| pod.bad_reply(path, "not UTF-8"))?;
    Ok(parse_scrape(text))
}
