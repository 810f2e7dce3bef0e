//! vLLM's dialect: `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` (runtime LoRA
//! updating), plain-text successes, nested or flat JSON errors, adapters selected by their name
//! as `model`.

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::json;

use super::http::HttpPod;
use super::reply::{vllm_load, vllm_unload};
use super::ServedModels;
use super::{
    common, AdapterLoad, AdapterOutcome, Engine, EngineError, MetricsScrape, PodLoad,
    PrefillRequest,
};
use crate::config::EngineKind;

pub struct VllmEngine {
    pod: HttpPod,
}

impl VllmEngine {
    pub fn new(pod: HttpPod) -> Self {
        Self { pod }
    }
}

impl Engine for VllmEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Vllm
    }

    fn health(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        common::health(&self.pod).boxed()
    }

    fn prefill<'a>(
        &'a self,
        request: &'a PrefillRequest,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        common::prefill(&self.pod, &request.model, request).boxed()
    }

    fn load_adapter<'a>(
        &'a self,
        load: &'a AdapterLoad,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        async move {
            let path = "/v1/load_lora_adapter";
            let body = json!({"lora_name": load.name, "lora_path": load.path});
            let reply = self.pod.post_json(path, &body, false).await?;
            common::adapter_outcome(&self.pod, path, vllm_load(reply.status, &reply.body))
        }
        .boxed()
    }

    fn unload_adapter<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<AdapterOutcome, EngineError>> {
        async move {
            let path = "/v1/unload_lora_adapter";
            let reply = self
                .pod
                .post_json(path, &json!({"lora_name": name}), true)
                .await?;
            common::adapter_outcome(&self.pod, path, vllm_unload(reply.status, &reply.body))
        }
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
