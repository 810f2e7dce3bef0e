//! SGLang's dialect: `POST /load_lora_adapter` / `/unload_lora_adapter` (no `/v1`) with JSON
//! replies `{"success", "error_message", "loaded_adapters"}`, and adapters selected as
//! `"model": "<base>:<adapter>"` (a prefill too: the same body as vLLM's, its traffic's shape,
//! with that model).

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::json;

use super::http::HttpPod;
use super::reply::sglang;
use super::ServedModels;
use super::{
    common, AdapterLoad, AdapterOutcome, Engine, EngineError, MetricsScrape, PodLoad,
    PrefillRequest,
};
use crate::config::EngineKind;

pub struct SglangEngine {
    pod: HttpPod,
    base_model: String,
}

impl SglangEngine {
    pub fn new(pod: HttpPod, base_model: &str) -> Self {
        Self {
            pod,
            base_model: base_model.to_string(),
        }
    }

    /// The `model` of a request: the base model itself, or `base:adapter`.
    pub fn request_model(&self, model: &str) -> String {
        if model == self.base_model {
            model.to_string()
        } else {
            format!("{}:{model}", self.base_model)
        }
    }

    async fn adapter_call(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<AdapterOutcome, EngineError> {
        let reply = self.pod.post_json(path, &body, false).await?;
        common::adapter_outcome(&self.pod, path, sglang(reply.status, &reply.body))
    }
}

impl Engine for SglangEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sglang
    }

    fn health(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        common::health(&self.pod).boxed()
    }

    fn prefill<'a>(
        &'a self,
        request: &'a PrefillRequest,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        async move {
            let model = self.request_model(&request.model);
            common::prefill(&self.pod, &model, request).await
        }
        .boxed()
    }

    fn load_adapter<'a>(
        &'a self,
        load: &'a AdapterLoad,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        let body = json!({"lora_name": load.name, "lora_path": load.path, "pinned": false});
        self.adapter_call("/load_lora_adapter", body).boxed()
    }

    fn unload_adapter<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        self.adapter_call("/unload_lora_adapter", json!({"lora_name": name}))
            .boxed()
    }

    fn embeddings<'a>(
        &'a self,
        request: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Vec<u8>, EngineError>> {
        common::embeddings(&self.pod, request).boxed()
    }

    fn models(&self) -> BoxFuture<'_, Result<ServedModels, EngineError>> {
        common::models(&self.pod).boxed()
    }

    fn load(&self) -> BoxFuture<'_, Result<PodLoad, EngineError>> {
        common::load(&self.pod).boxed()
    }

    fn scrape(&self) -> BoxFuture<'_, Result<MetricsScrape, EngineError>> {
        common::scrape(&self.pod).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RetryPolicy;

    #[test]
    fn adapters_are_addressed_as_base_colon_adapter() {
        let pod = HttpPod::new(
            "p",
            "127.0.0.1:1",
            reqwest::Client::new(),
            1,
            RetryPolicy {
                retries: 0,
                backoff: std::time::Duration::ZERO,
            },
        );
        let e = SglangEngine::new(pod, "llama");
        assert_eq!(e.request_model("llama"), "llama");
        assert_eq!(e.request_model("sql"), "llama:sql");
    }
}
