//! Computing the filters' hot embedding inputs ahead of their expiry
//! ([`crate::warm_embeddings`]): the filters' reports go into the store; once a second the due
//! entries (hot, and never computed here or expiring within `lead_ms`) are computed on an up pod
//! serving their model — at most `calls_per_second`, `concurrency` at a time — and published
//! under a new generation for the filters' `GET /v1/embeddings/warm`.

use std::sync::{Arc, MutexGuard};

use futures::stream::{self, StreamExt};
use prewarm_core::embed_cache::{key_from_hex, split_response};
use prewarm_core::wire::{EmbeddingSeen, WarmEmbeddings};

use super::Gateway;
use crate::engine::Engine;
use crate::policy::fleet::PodHealth;
use crate::telemetry::Telemetry;
use crate::warm_embeddings::store::{Due, WarmStore};

/// What one computation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Computed {
    Ok,
    NoPod,
    Failed,
    BadReply,
}

impl Computed {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NoPod => "no_pod",
            Self::Failed => "failed",
            Self::BadReply => "bad_reply",
        }
    }
}

impl Gateway {
    pub fn warm_embeddings(&self) -> MutexGuard<'_, WarmStore> {
        self.warm_embeddings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Folds a batch's embedding reports into the store.
    pub fn ingest_embeddings(&self, records: &[EmbeddingSeen]) {
        if records.is_empty() {
            return;
        }
        let now = self.now();
        let seen = self
            .warm_embeddings()
            .seen(records, now, &self.config.warm_embeddings);
        let t = &self.telemetry.embedding_reports;
        Telemetry::add(t, &[("kind", "added")], seen.added);
        Telemetry::add(t, &[("kind", "hits")], seen.hits);
        Telemetry::add(t, &[("kind", "ignored")], seen.ignored);
        Telemetry::add(t, &[("kind", "evicted")], seen.evicted);
    }

    /// The warm entries computed since generation `after`, for a filter's poll.
    pub fn warm_embeddings_since(&self, after: u64) -> WarmEmbeddings {
        let max = self.config.warm_embeddings.reply_bytes;
        self.warm_embeddings().since(after, self.now(), max)
    }

    /// One round: computes the due entries, then drops the cold expired ones.
    pub async fn compute_warm_embeddings(self: &Arc<Self>) {
        let config = &self.config.warm_embeddings;
        let now = self.now();
        let due = if config.enabled {
            self.warm_embeddings()
                .due(now, config, config.calls_per_second)
        } else {
            Vec::new()
        };
        let outcomes: Vec<Computed> = stream::iter(due)
            .map(|d| self.compute_one(d))
            .buffer_unordered(config.concurrency)
            .collect()
            .await;
        for o in outcomes {
            Telemetry::count(
                &self.telemetry.embedding_computations,
                &[("outcome", o.label())],
            );
        }
        let mut store = self.warm_embeddings();
        store.expire(self.now(), config);
        self.telemetry.warm_embeddings.set(store.len() as i64);
    }

    /// An up pod serving `model`, chosen by the key so one input goes to one pod.
    fn embedding_pod(&self, model: &str, key: &str) -> Option<Arc<dyn Engine>> {
        let state = self.state();
        let candidates: Vec<Arc<dyn Engine>> = state
            .pods
            .iter()
            .filter(|(id, p)| {
                let up = state
                    .fleet
                    .pod(id)
                    .is_some_and(|f| f.health == PodHealth::Up);
                up && (p.served.base.as_deref() == Some(model) || p.served.has_adapter(model))
            })
            .map(|(_, p)| p.engine.clone())
            .collect();
        let pick = key_from_hex(key).map_or(0, |k| {
            let mut first = [0u8; 8];
            first.copy_from_slice(&k[..8]);
            u64::from_le_bytes(first)
        });
        let n = candidates.len() as u64;
        let i = pick.checked_rem(n)? as usize;
        candidates.get(i).cloned()
    }

    async fn compute_one(self: &Arc<Self>, due: Due) -> Computed {
        let config = &self.config.warm_embeddings;
        let Some(engine) = self.embedding_pod(&due.model, &due.key) else {
            self.warm_embeddings()
                .failed(&due.key, self.now(), config.backoff_ms);
            return Computed::NoPod;
        };
        let request: serde_json::Value = match serde_json::from_str(&due.request) {
            Ok(v) => v,
            Err(_) => return Computed::BadReply,
        };
        let outcome = match engine.embeddings(&request).await {
            Ok(body) => match split_response(&body, 1).and_then(|mut e| e.pop()) {
                Some(entry) => {
                    self.warm_embeddings().computed(
                        &due.key,
                        entry.embedding.into(),
                        entry.prompt_tokens,
                        self.now(),
                        config,
                    );
                    return Computed::Ok;
                }
                None => Computed::BadReply,
            },
            Err(e) => {
                tracing::debug!(key = %due.key, error = %e, "embedding warm-up failed");
                Computed::Failed
            }
        };
        self.warm_embeddings()
            .failed(&due.key, self.now(), config.backoff_ms);
        outcome
    }
}
