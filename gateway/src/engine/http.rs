//! The transport every engine client shares: one pod's base URL, a reqwest client with connect
//! and request timeouts that never follows redirects (a pod's 3xx is its answer, not a hop to
//! wherever it points), replies read up to [`MAX_REPLY_BYTES`], a semaphore bounding the
//! gateway's requests in flight to the pod, and retries of retryable failures with exponential
//! backoff plus jitter. A call made inside a warm-up span carries its W3C trace context.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::EngineError;

/// Largest pod reply read, bytes (4 MiB). The largest replies ENGINE-FACTS describes are
/// `/metrics` (tens to a few hundred KB for one model with its histograms and LoRA gauges) and
/// `/v1/models` (one card of a few hundred bytes per adapter, at most `--max-cpu-loras`);
/// 4 MiB is ten times either, and a pod streaming more is cut off and answered as a bad reply.
pub const MAX_REPLY_BYTES: usize = 4 << 20;

/// Retries of retryable failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Extra attempts after the first.
    pub retries: u32,
    /// Backoff before the first retry; doubles per attempt, plus up to 100% jitter.
    pub backoff: Duration,
}

impl RetryPolicy {
    /// The pause before retry number `attempt` (1-based): `backoff · 2^(attempt−1)` plus a
    /// jitter in [0, that), capped at 10 s.
    pub fn pause(&self, attempt: u32, jitter_unit: f64) -> Duration {
        let base = self
            .backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let jitter = base.mul_f64(jitter_unit.clamp(0.0, 1.0));
        base.saturating_add(jitter).min(Duration::from_secs(10))
    }
}

/// What a pod answered: status and body.
#[derive(Debug, Clone)]
pub struct PodReply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// One pod's HTTP transport.
#[derive(Clone)]
pub struct HttpPod {
    pub pod_id: String,
    base_url: String,
    client: reqwest::Client,
    in_flight: Arc<Semaphore>,
    retry: RetryPolicy,
}

impl HttpPod {
    /// `address` is `host:port`.
    pub fn new(
        pod_id: &str,
        address: &str,
        client: reqwest::Client,
        max_in_flight: usize,
        retry: RetryPolicy,
    ) -> Self {
        Self {
            pod_id: pod_id.to_string(),
            base_url: format!("http://{address}"),
            client,
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            retry,
        }
    }

    /// A client with the configured timeouts, shared by every pod.
    pub fn client(connect_timeout: Duration, request_timeout: Duration) -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .timeout(request_timeout)
            .pool_max_idle_per_host(16)
            .build()
            .unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// GET `path`, retried when retryable.
    pub async fn get(&self, path: &str) -> Result<PodReply, EngineError> {
        self.send(path, None, true).await
    }

    /// POST a JSON body; retried only when `idempotent`.
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
        idempotent: bool,
    ) -> Result<PodReply, EngineError> {
        self.send(path, Some(body), idempotent).await
    }

    async fn send(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
        idempotent: bool,
    ) -> Result<PodReply, EngineError> {
        let url = self.url(path);
        let mut attempt = 0u32;
        loop {
            let result = self.send_once(&url, body).await;
            let retry = match &result {
                Ok(reply) => reply.status >= 500 && idempotent,
                Err(e) => e.retryable() && (idempotent || connect_failure(e)),
            };
            if !retry || attempt >= self.retry.retries {
                return result;
            }
            attempt += 1;
            tokio::time::sleep(self.retry.pause(attempt, rand::random::<f64>())).await;
        }
    }

    async fn send_once(
        &self,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<PodReply, EngineError> {
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| EngineError::Unreachable {
                pod: self.pod_id.clone(),
                url: url.to_string(),
                message: "client closed".into(),
            })?;
        let mut request = match body {
            Some(b) => self.client.post(url).json(b),
            None => self.client.get(url),
        };
        for (name, value) in crate::traces::trace_headers() {
            request = request.header(name, value);
        }
        let mut response = request.send().await.map_err(|e| self.transport(url, &e))?;
        let status = response.status().as_u16();
        let too_big = || EngineError::BadReply {
            pod: self.pod_id.clone(),
            url: url.to_string(),
            message: format!("reply larger than {MAX_REPLY_BYTES} bytes"),
        };
        if response
            .content_length()
            .is_some_and(|n| n > MAX_REPLY_BYTES as u64)
        {
            return Err(too_big());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport(url, &e))?
        {
            if body.len().saturating_add(chunk.len()) > MAX_REPLY_BYTES {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(PodReply { status, body })
    }

    fn transport(&self, url: &str, e: &reqwest::Error) -> EngineError {
        if e.is_timeout() {
            EngineError::Timeout {
                pod: self.pod_id.clone(),
                url: url.to_string(),
            }
        } else {
            EngineError::Unreachable {
                pod: self.pod_id.clone(),
                url: url.to_string(),
                message: if e.is_connect() {
                    "connection refused or reset".into()
                } else {
                    e.to_string()
                },
            }
        }
    }

    /// An error for a reply the caller could not use.
    pub fn bad_reply(&self, path: &str, message: impl Into<String>) -> EngineError {
        EngineError::BadReply {
            pod: self.pod_id.clone(),
            url: self.url(path),
            message: message.into(),
        }
    }
}

/// A request that never reached the pod can be retried even when it is not idempotent.
fn connect_failure(e: &EngineError) -> bool {
    matches!(e, EngineError::Unreachable { message, .. } if message.starts_with("connection"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_bounded_jitter() {
        let r = RetryPolicy {
            retries: 3,
            backoff: Duration::from_millis(50),
        };
        assert_eq!(r.pause(1, 0.0), Duration::from_millis(50));
        assert_eq!(r.pause(2, 0.0), Duration::from_millis(100));
        assert_eq!(r.pause(3, 1.0), Duration::from_millis(400));
        assert_eq!(r.pause(30, 1.0), Duration::from_secs(10));
    }
}
