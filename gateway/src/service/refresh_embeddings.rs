//! The background loop that keeps the prompt index in step with the pool: every
//! `embeddings.refresh_seconds` it copies the pool's prompts (under the gateway's lock, texts
//! only) and refreshes [`PromptSearch`] off the async runtime. The first pass runs right after
//! the snapshot is restored; the gateway is ready once it has published an index. With
//! `warmup.sampling = "groups"` each rebuilt index's semantic groups go to the fleet core,
//! whose warm-up plans sample from them.

use std::sync::Arc;
use std::time::Duration;

use super::tasks::pause;
use super::Gateway;
use crate::embeddings::minilm::EmbedError;
use crate::embeddings::search::{PoolPrompt, PromptSearch};
use crate::policy::Sampling;

/// The pool's prompts, hottest first (at most `limit`).
fn pool_prompts(gateway: &Gateway, limit: usize) -> Vec<PoolPrompt> {
    let state = gateway.state();
    state
        .fleet
        .pool()
        .top(limit)
        .into_iter()
        .map(|v| PoolPrompt {
            key: v.key,
            model: v.model.to_string(),
            hotness: v.hotness,
            text: v.text.to_string(),
        })
        .collect()
}

pub async fn refresh_loop(gateway: Arc<Gateway>, search: Arc<PromptSearch>) {
    let period = Duration::from_secs(search.config().refresh_seconds);
    let sampling = gateway.state().fleet.config().warmup.sampling;
    loop {
        let prompts = pool_prompts(&gateway, search.config().max_prompts);
        let count = prompts.len();
        let s = search.clone();
        let started = std::time::Instant::now();
        // A rebuilt index re-forms the semantic groups warm-up plans sample from (only when
        // they do: leader clustering is O(prompts × groups)).
        let refreshed = tokio::task::spawn_blocking(move || {
            let rebuilt = s.refresh(prompts)?;
            let groups = (rebuilt && sampling == Sampling::Groups)
                .then(|| s.index().semantic_groups(s.config().group_cosine));
            Ok::<_, EmbedError>((rebuilt, groups))
        })
        .await;
        match refreshed {
            Ok(Ok((rebuilt, groups))) => {
                if let Some(groups) = groups {
                    gateway.state().fleet.set_semantic_groups(groups);
                }
                if rebuilt {
                    tracing::info!(
                        prompts = count,
                        ms = started.elapsed().as_millis() as u64,
                        "prompt index rebuilt"
                    );
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e, "prompt index refresh failed"),
            Err(e) => tracing::error!(error = %e, "prompt index refresh panicked"),
        }
        if !pause(&gateway, period).await {
            return;
        }
    }
}
