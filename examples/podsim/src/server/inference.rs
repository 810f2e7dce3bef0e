//! `POST /v1/completions` and `POST /v1/chat/completions`: parse with prewarm-core (a chat
//! request's prompt rendered with the chat template, see [`crate::chat`]), admit into
//! the pod model, wait (scaled) until the model's times, and answer with vLLM's JSON or
//! server-sent-event chunks (`[DONE]` last; usage in a final chunk with
//! `stream_options.include_usage`). A client that goes away aborts its request in the model.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use prewarm_core::request::{Endpoint, ParseError};
use serde::Deserialize;
use serde_json::{json, Value};

use super::errors::ApiError;
use super::{json_body, AppState};
use crate::pod::{Admission, RequestId};
use crate::request::{PrepareError, RequestSpec};

/// The generated text: 4-byte tokens, so completion lengths follow the token stand-in too.
const FILLER: [&str; 8] = [
    " pod", " sim", " war", "m ok", " kv ", "hit ", " lor", "a ok",
];

fn token_text(index: u64) -> &'static str {
    FILLER
        .get((index % FILLER.len() as u64) as usize)
        .copied()
        .unwrap_or(" ok ")
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// What prewarm-core does not parse but the reply depends on.
#[derive(Deserialize, Default)]
struct ReplyOptions {
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

pub async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, Endpoint::Completions, &headers, body).await
}

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(state, Endpoint::ChatCompletions, &headers, body).await
}

fn parse_error(e: ParseError) -> ApiError {
    let param = match &e {
        ParseError::MissingField { field } | ParseError::InvalidField { field, .. } => Some(*field),
        ParseError::Malformed { .. } => return ApiError::validation(Some("body"), e.to_string()),
        ParseError::TooLarge { .. } => None,
    };
    ApiError {
        param,
        ..ApiError::bad_request(e.to_string())
    }
}

/// A request the model admitted, and what its reply needs.
struct Accepted {
    admission: Admission,
    model: String,
    stream: bool,
    include_usage: bool,
}

fn admit(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Accepted, ApiError> {
    let body = json_body(headers, body)?;
    let prepared = RequestSpec::prepare(
        endpoint,
        &body,
        state.config.max_body_bytes,
        &state.config.chat_template,
        state.config.pod.engine,
    )
    .map_err(|e| match e {
        PrepareError::Parse(e) => parse_error(e),
        PrepareError::Chat(e) => ApiError::from(e),
    })?;
    let request = prepared.request;
    let options: ReplyOptions = serde_json::from_slice(&body).unwrap_or_default();
    let mut pod = state.lock_pod();
    let now = state.clock.now();
    let admission = pod.submit_salted(now, &prepared.spec, prepared.cache_salt.as_deref())?;
    state.exporter.observe_admission(&admission);
    let snapshot = pod.metrics(now);
    state.exporter.sync(&snapshot);
    Ok(Accepted {
        admission,
        model: request.model,
        stream: request.stream,
        include_usage: options
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

/// Aborts the request in the model when the reply is dropped before its last token.
struct AbortOnDrop {
    state: Arc<AppState>,
    id: RequestId,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let now = self.state.clock.now();
            self.state.lock_pod().abort(now, self.id);
        }
    }
}

async fn serve(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let accepted = match admit(&state, endpoint, headers, body) {
        Ok(a) => a,
        Err(e) => return state.error(e),
    };
    let guard = AbortOnDrop {
        state: state.clone(),
        id: accepted.admission.id,
        armed: true,
    };
    let reply = Reply {
        endpoint,
        id: reply_id(endpoint, state.created, accepted.admission.id),
        created: state.created,
        model: accepted.model,
        details: state.config.enable_prompt_tokens_details,
    };
    if accepted.stream {
        stream_reply(guard, reply, accepted.admission, accepted.include_usage)
    } else {
        let mut guard = guard;
        state.clock.sleep_until(accepted.admission.finish_at).await;
        guard.armed = false;
        Json(reply.whole(&accepted.admission)).into_response()
    }
}

fn reply_id(endpoint: Endpoint, created: u64, id: RequestId) -> String {
    let prefix = match endpoint {
        Endpoint::ChatCompletions => "chatcmpl",
        _ => "cmpl",
    };
    format!("{prefix}-{created:016x}{id:016x}")
}

/// The fixed parts of one reply.
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    details: bool,
}

impl Reply {
    fn usage(&self, a: &Admission) -> Value {
        let details = if self.details {
            json!({"cached_tokens": a.cached_tokens})
        } else {
            Value::Null
        };
        json!({
            "prompt_tokens": a.prompt_tokens,
            "total_tokens": (a.prompt_tokens as u64).saturating_add(a.output_tokens),
            "completion_tokens": a.output_tokens,
            "prompt_tokens_details": details,
        })
    }

    fn is_chat(&self) -> bool {
        self.endpoint == Endpoint::ChatCompletions
    }

    fn whole(&self, a: &Admission) -> Value {
        let text: String = (0..a.output_tokens).map(token_text).collect();
        let choice = if self.is_chat() {
            json!({"index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null, "finish_reason": "length", "stop_reason": null})
        } else {
            json!({"index": 0, "text": text, "logprobs": null,
                "finish_reason": "length", "stop_reason": null, "prompt_logprobs": null})
        };
        json!({
            "id": self.id,
            "object": if self.is_chat() { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(a),
        })
    }

    /// One SSE event: the chunk envelope around `choices` (and `usage` when given).
    fn chunk_with(&self, choices: Value, usage: Option<Value>) -> Bytes {
        let object = if self.is_chat() {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let mut chunk = json!({"id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices});
        if let (Some(usage), Some(map)) = (usage, chunk.as_object_mut()) {
            map.insert("usage".into(), usage);
        }
        sse(&chunk)
    }

    fn chunk(&self, choices: Value) -> Bytes {
        self.chunk_with(choices, None)
    }

    fn token_chunk(&self, index: u64, last: bool) -> Bytes {
        let finish = if last { json!("length") } else { Value::Null };
        let text = token_text(index);
        if self.is_chat() {
            self.chunk(json!([{"index": 0, "delta": {"content": text},
                "logprobs": null, "finish_reason": finish, "stop_reason": null}]))
        } else {
            self.chunk(json!([{"index": 0, "text": text, "logprobs": null,
                "finish_reason": finish, "stop_reason": null}]))
        }
    }

    fn role_chunk(&self) -> Bytes {
        self.chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
            "logprobs": null, "finish_reason": null}]),
        )
    }

    fn usage_chunk(&self, a: &Admission) -> Bytes {
        self.chunk_with(json!([]), Some(self.usage(a)))
    }
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

struct StreamState {
    guard: AbortOnDrop,
    reply: Reply,
    admission: Admission,
    include_usage: bool,
    next: u64,
    finished: bool,
}

fn stream_reply(
    guard: AbortOnDrop,
    reply: Reply,
    admission: Admission,
    include_usage: bool,
) -> Response {
    let start = StreamState {
        guard,
        reply,
        admission,
        include_usage,
        next: 0,
        finished: false,
    };
    let events = futures::stream::unfold(start, |mut s| async move {
        if s.finished {
            return None;
        }
        let total = s.admission.output_tokens;
        if s.next < total {
            let index = s.next;
            let clock = s.guard.state.clock;
            clock.sleep_until(s.admission.token_at(index)).await;
            let last = index + 1 == total;
            let mut out = Vec::new();
            if index == 0 && s.reply.is_chat() {
                out.extend_from_slice(&s.reply.role_chunk());
            }
            out.extend_from_slice(&s.reply.token_chunk(index, last));
            if last {
                s.guard.armed = false;
                if s.include_usage {
                    out.extend_from_slice(&s.reply.usage_chunk(&s.admission));
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                s.finished = true;
            }
            s.next += 1;
            return Some((Ok::<Bytes, Infallible>(Bytes::from(out)), s));
        }
        None
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(events),
    )
        .into_response()
}
