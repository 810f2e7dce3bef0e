//! The gateway's warm embedding entries into this proxy's shared level of the cache: with the
//! routing table's poll (one worker a tick), `GET /v1/embeddings/warm?after=<generation>` asks
//! for the entries the gateway computed since this proxy's last reply; each is written to its
//! slot with the gateway's expiry (`shared_level::put`), and the reply's generation is kept in
//! shared data, so every worker and a reloaded VM continue from it. A reply cut at the
//! gateway's byte bound (`more`) is followed by the next poll at once. A reply that is not a
//! 200 with a valid document, or is larger than [`MAX_WARM_BYTES`], is counted and dropped (and
//! says nothing of the gateway's health: an older gateway answers it 404);
//! no request waits on any of it.

use prewarm_core::embed_cache::{key_from_hex, CachedEmbedding};
use prewarm_core::wire::WarmEmbeddings;

use crate::embeddings::shared_level;
use crate::host::{Host, Metric};
use crate::shared::read_u64;
use crate::worker::Worker;

/// Largest reply read, bytes.
pub const MAX_WARM_BYTES: usize = 16 << 20;

/// The path of the next poll.
pub fn path<H: Host + ?Sized>(host: &H, worker: &Worker) -> String {
    let (value, _) = host.shared_get(&worker.keys.embedding_generation());
    let after = value.and_then(|v| read_u64(&v, 0)).unwrap_or(0);
    format!("/v1/embeddings/warm?after={after}")
}

/// A reply of `size` bytes with `status`: its entries written; true when more are waiting.
pub fn on_reply<H: Host + ?Sized>(
    host: &H,
    worker: &Worker,
    status: Option<u16>,
    size: usize,
) -> bool {
    if status != Some(200) || size > MAX_WARM_BYTES {
        host.count(Metric::EmbeddingWarmFetchFailures, 1);
        return false;
    }
    let body = host.call_response_body(size).unwrap_or_default();
    let Ok(doc) = WarmEmbeddings::decode(&body) else {
        host.count(Metric::EmbeddingWarmFetchFailures, 1);
        return false;
    };
    let config = &worker.config.embeddings.cache;
    let shared = (config.shared_slots, config.max_shared_entry_bytes);
    let now = host.now_ms();
    let mut written = 0u64;
    for e in &doc.entries {
        let Some(key) = key_from_hex(&e.key) else {
            continue;
        };
        // a hit answers with these bytes inside its JSON: only valid JSON goes in
        if serde_json::from_str::<serde::de::IgnoredAny>(&e.embedding).is_err() {
            continue;
        }
        if e.expires_ms <= now {
            continue;
        }
        let entry = CachedEmbedding {
            embedding: e.embedding.as_str().into(),
            prompt_tokens: e.prompt_tokens,
        };
        if shared_level::put(host, &worker.keys, shared, &key, &entry, e.expires_ms) {
            written += 1;
        }
    }
    let _ = host.shared_set(
        &worker.keys.embedding_generation(),
        &doc.generation.to_le_bytes(),
        None,
    );
    host.count(Metric::EmbeddingWarmFetches, 1);
    host.count(Metric::EmbeddingWarmEntries, written);
    doc.more && !doc.entries.is_empty()
}
