//! Warm-up step: make one adapter resident on a pod through the LoRA policy (which may first
//! unload a victim), with the manifest verified before the load.

use std::sync::Arc;

use crate::service::adapters::PodDecision;
use crate::service::{now_ms, Gateway};

/// Whether the adapter ended up loaded; `None` when it could not be attempted (unregistered,
/// refused by the policy).
pub async fn load_adapter(gateway: &Arc<Gateway>, pod_id: &str, name: &str) -> Option<bool> {
    let decisions = {
        let mut state = gateway.state();
        let record = state.registry.get(name)?;
        let (tier, priority) = (record.tier, if record.pinned { 99 } else { 50 });
        let pinned = record.pinned;
        let pod = state.pods.get_mut(pod_id)?;
        let now = now_ms();
        let result = if pinned {
            pod.lora.pin(name, tier, now)
        } else {
            pod.lora.ensure_resident(name, tier, priority, now)
        };
        match result {
            Ok(d) => d,
            Err(refusal) => {
                pod.note_error(refusal.to_string());
                return None;
            }
        }
    };
    let outcomes = gateway
        .execute_decisions(PodDecision::on_pod(pod_id, decisions))
        .await;
    Some(outcomes.iter().all(|o| o.error.is_none()))
}
