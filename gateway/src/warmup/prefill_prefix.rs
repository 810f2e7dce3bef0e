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
    /// The prefix or the pod left the pool, or the prefix is an adapter's that the pod does
    /// not serve.
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
        // An adapter's prefix is only warm where the adapter is: when the pod did not get the
        // adapter (its load was refused or failed), the filter does not route the adapter
        // here, and a prefill would only earn a 404.
        let unserved = state.pool.get(&key).is_some_and(|v| {
            state.registry.get(v.model).is_some()
                && !state
                    .pods
                    .get(pod_id)
                    .is_some_and(|p| p.lora.served().any(|a| a == v.model))
        });
        if unserved {
            return PrefillOutcome::Gone;
        }
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
