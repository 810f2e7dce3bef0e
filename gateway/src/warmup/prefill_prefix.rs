//! Warm-up step: prefill one hot prefix on a pod (a `max_tokens: 1` completion of the prefix
//! plus one token), and record it in the pod's KV model when it succeeded.

use std::sync::Arc;

use prewarm_core::fingerprint::shards_of;

use crate::engine::PrefillRequest;
use crate::policy::PrefixKey;
use crate::service::{now_ms, Gateway};
use crate::telemetry::Telemetry;

/// How a prefill ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillOutcome {
    Done,
    Failed,
    /// The prefix left the pool or the pod left the pool.
    Gone,
}

/// Prefills `key` on `pod_id`.
pub async fn prefill_prefix(
    gateway: &Arc<Gateway>,
    pod_id: &str,
    key: PrefixKey,
) -> PrefillOutcome {
    let request = {
        let state = gateway.state();
        state.pool.get(&key).map(|v| {
            (
                PrefillRequest {
                    model: v.model.to_string(),
                    prefix_text: v.text.to_string(),
                },
                v.blocks.to_vec(),
            )
        })
    };
    let Some((request, blocks)) = request else {
        return PrefillOutcome::Gone;
    };
    let Some((engine, _)) = gateway.pod_handle(pod_id) else {
        return PrefillOutcome::Gone;
    };
    let result = engine.prefill(&request).await;
    let label = match &result {
        Ok(()) => "ok",
        Err(e) => e.label(),
    };
    Telemetry::count(
        &gateway.telemetry.prefills,
        &[("pod", pod_id), ("outcome", label)],
    );
    match result {
        Ok(()) => {
            let shards = shards_of(&blocks, &gateway.config.fingerprint.core());
            if let Some(pod) = gateway.state().pods.get_mut(pod_id) {
                pod.kv.record_prefill(key, &shards, now_ms());
            }
            PrefillOutcome::Done
        }
        Err(e) => {
            tracing::warn!(pod = %pod_id, prefix = %key, error = %e, "prefill failed");
            if let Some(pod) = gateway.state().pods.get_mut(pod_id) {
                pod.kv.prefill_failed(&key);
                pod.note_error(e.to_string());
            }
            PrefillOutcome::Failed
        }
    }
}
