//! `POST /v1/embeddings`: vLLM's pooling-model reply (`object: "list"`, one
//! `{"index", "object": "embedding", "embedding"}` per input, `usage` with prompt tokens only)
//! over podsim's deterministic vectors ([`crate::embedding`]).
//!
//! Latency: one forward pass over every input's tokens, the pod's prefill figure
//! ([`crate::LatencyProfile::prefill`]) with nothing cached: vLLM keeps no prefix cache for
//! encoder-only pooling models, and an embedding request generates no token. Embedding requests
//! do not enter the generation batch's model.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::errors::ApiError;
use super::{json_body, AppState};
use crate::embedding::{
    base64_of, embed, parse_request, EmbeddingError, EmbeddingLimits, EncodingFormat,
};

impl From<EmbeddingError> for ApiError {
    fn from(e: EmbeddingError) -> Self {
        ApiError {
            param: Some(e.field),
            ..ApiError::bad_request(e.message)
        }
    }
}

pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match answer(&state, &headers, body).await {
        Ok(reply) => Json(reply).into_response(),
        Err(e) => state.error(e),
    }
}

async fn answer(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Value, ApiError> {
    let body = json_body(headers, body)?;
    let config = &state.config;
    let limits = EmbeddingLimits {
        dim: config.embedding_dim,
        max_input_tokens: usize::try_from(config.pod.max_model_len).unwrap_or(usize::MAX),
    };
    let request = parse_request(&body, limits)?;
    state.lock_pod().resolve_model(&request.model)?;
    let tokens = request.prompt_tokens();
    state.clock.sleep(config.pod.latency.prefill(tokens)).await;

    let data: Vec<Value> = request
        .inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = embed(
                config.pod.seed,
                &request.model,
                input,
                config.embedding_dim,
                request.dimensions,
            );
            let embedding = match request.encoding_format {
                EncodingFormat::Float => json!(vector),
                EncodingFormat::Base64 => json!(base64_of(&vector)),
            };
            json!({"index": index, "object": "embedding", "embedding": embedding})
        })
        .collect();
    let id = state.next_request_id();
    Ok(json!({
        "id": format!("embd-{:016x}{id:016x}", state.created),
        "object": "list",
        "created": state.created,
        "model": request.model,
        "data": data,
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": null,
        },
    }))
}
