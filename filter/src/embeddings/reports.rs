//! What this VM tells the gateway about its embedding cache, for the gateway to keep hot
//! inputs warm (`embedding_cache.warm_from_gateway`): each input it stored from a pod's response,
//! with the input as a request of its own (what the gateway re-sends to recompute it), and how
//! many requests it answered for each input from the cache since the last batch. Sent with the
//! signals (`SignalBatch::embeddings`) by this VM's root on its tick. Bounded: at most
//! [`MAX_EMBEDDINGS_PER_BATCH`] records between two ticks; beyond, nothing more is kept
//! (`prewarm_filter_embeddings_reports_dropped_total`). Never client input alone: a stored input is reported
//! only once the pod's response for it was stored.

use std::cell::RefCell;
use std::collections::HashMap;

use prewarm_core::embed_cache::{key_hex, EmbeddingKey};
use prewarm_core::wire::{EmbeddingSeen, MAX_EMBEDDINGS_PER_BATCH, MAX_EMBEDDING_REQUEST_BYTES};

#[derive(Debug, Default)]
pub struct EmbeddingReports {
    stored: RefCell<Vec<EmbeddingSeen>>,
    hits: RefCell<HashMap<EmbeddingKey, (String, u32)>>,
}

impl EmbeddingReports {
    fn full(&self) -> bool {
        self.stored.borrow().len() + self.hits.borrow().len() >= MAX_EMBEDDINGS_PER_BATCH
    }

    /// `key` of `model` was stored; `request` recomputes it. False when not kept (full, or a
    /// request above [`MAX_EMBEDDING_REQUEST_BYTES`]).
    pub fn stored(&self, model: &str, key: &EmbeddingKey, request: String) -> bool {
        if request.len() > MAX_EMBEDDING_REQUEST_BYTES || self.full() {
            return false;
        }
        self.stored.borrow_mut().push(EmbeddingSeen {
            model: model.to_string(),
            key: key_hex(key),
            request: Some(request),
            hits: 0,
        });
        true
    }

    /// A request for `key` of `model` was answered from the cache. False when not kept.
    pub fn hit(&self, model: &str, key: &EmbeddingKey) -> bool {
        if let Some((_, n)) = self.hits.borrow_mut().get_mut(key) {
            *n = n.saturating_add(1);
            return true;
        }
        if self.full() {
            return false;
        }
        self.hits.borrow_mut().insert(*key, (model.to_string(), 1));
        true
    }

    /// Everything since the last take, stored inputs first.
    pub fn take(&self) -> Vec<EmbeddingSeen> {
        let mut out = std::mem::take(&mut *self.stored.borrow_mut());
        let hits = std::mem::take(&mut *self.hits.borrow_mut());
        let mut hits: Vec<_> = hits.into_iter().collect();
        hits.sort_by_key(|(key, _)| *key);
        out.extend(hits.into_iter().map(|(key, (model, hits))| EmbeddingSeen {
            model,
            key: key_hex(&key),
            request: None,
            hits,
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_of_one_key_fold_and_everything_is_taken_once() {
        let r = EmbeddingReports::default();
        assert!(r.stored("m", &[1; 32], "{}".into()));
        assert!(r.hit("m", &[2; 32]) && r.hit("m", &[2; 32]));
        let taken = r.take();
        assert_eq!(taken.len(), 2);
        assert_eq!(taken[0].request.as_deref(), Some("{}"));
        assert_eq!((taken[1].hits, taken[1].request.as_ref()), (2, None));
        assert!(r.take().is_empty());
    }

    #[test]
    fn reports_are_bounded_between_ticks() {
        let r = EmbeddingReports::default();
        for i in 0..MAX_EMBEDDINGS_PER_BATCH {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            assert!(r.hit("m", &key));
        }
        assert!(!r.hit("m", &[255; 32]));
        assert!(r.hit("m", &[0; 32]), "a known key still counts");
        assert!(!r.stored("m", &[254; 32], "{}".into()));
        assert!(!r.stored("m", &[9; 32], "x".repeat(MAX_EMBEDDING_REQUEST_BYTES + 1)));
        assert_eq!(r.take().len(), MAX_EMBEDDINGS_PER_BATCH);
    }
}
