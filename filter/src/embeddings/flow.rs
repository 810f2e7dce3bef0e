//! The embedding cache on a request's path. At the end of an opted-in model's `/v1/embeddings`
//! body, the filter keys each input (core's `embed_cache`); when this VM's cache — or, for the
//! inputs it lacks, the proxy's shared level (`shared_level`) — holds every one, it answers the
//! request itself (`x-prewarm-cache: hit`) and the pod is never called.
//! Otherwise the request goes on unchanged and its response is *watched*, not held: each chunk
//! is copied as it passes (up to `max_response_bytes`), and only after the last one reached the
//! client is a `200` response split into entries and stored, in this VM's cache and the shared
//! level. A request the rule cannot key, a refused local reply, a non-200, an encoded,
//! oversized or unparsable response: counted, the request and its response untouched.
//! With `warm_from_gateway`, each stored input and each hit is reported to the gateway
//! (`reports`), which keeps the hot ones warm (`warm`).

use prewarm_core::embed_cache::{
    hit_response, split_response, CachedEmbedding, EmbeddingKey, ParsedEmbeddings,
};

use crate::embeddings::shared_level;
use crate::host::{Host, Metric};
use crate::request::response::readable_ok;
use crate::worker::Worker;

/// What became of a request the cache looked at.
#[derive(Debug)]
pub enum Lookup {
    /// Answered from the cache: the request must not go on.
    Answered,
    /// Forwarded; its response is stored when it comes back.
    Forward(Capture),
    /// Forwarded; nothing to store.
    Pass,
}

/// Looks `body` (a request for `model`) up in the worker's cache.
pub fn on_request<H: Host + ?Sized>(host: &H, worker: &Worker, model: &str, body: &[u8]) -> Lookup {
    let config = &worker.config.embeddings.cache;
    if !config.caches(model) {
        return Lookup::Pass;
    }
    let Ok(parsed) = ParsedEmbeddings::parse(body) else {
        host.count(Metric::EmbeddingUncacheable, 1);
        return Lookup::Pass;
    };
    let keys = parsed.keys();
    let now = host.now_ms();
    let found = lookup(host, worker, &keys, now);
    let reports = config.warmed_by_gateway();
    let Some(entries) = found else {
        host.count(Metric::EmbeddingMisses, 1);
        // what recomputes each input, for the gateway once the pod's response is stored
        let singles = reports.then(|| parsed.single_input_requests());
        return Lookup::Forward(Capture {
            model: parsed.model,
            keys,
            singles,
            body: Vec::new(),
            reading: true,
        });
    };
    let reply = hit_response(&parsed.model, &keys, &entries, now / 1000);
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("x-prewarm-cache", b"hit"),
    ];
    if host.send_response(200, &headers, &reply) {
        host.count(Metric::EmbeddingHits, 1);
        if reports {
            for key in &keys {
                if !worker.embed_reports.hit(&parsed.model, key) {
                    host.count(Metric::EmbeddingReportsDropped, 1);
                }
            }
        }
        Lookup::Answered
    } else {
        host.count(Metric::EmbeddingReplyFailures, 1);
        // not stored as a report: the pod's answer would only repeat what the cache holds
        Lookup::Forward(Capture {
            model: parsed.model,
            keys,
            singles: None,
            body: Vec::new(),
            reading: true,
        })
    }
}

/// Every key's entry from this VM's cache, else from the proxy's shared level (then kept in
/// this VM's too); `None` at the first key neither holds.
fn lookup<H: Host + ?Sized>(
    host: &H,
    worker: &Worker,
    keys: &[EmbeddingKey],
    now: u64,
) -> Option<Vec<CachedEmbedding>> {
    let slots = worker.config.embeddings.cache.shared_slots;
    let mut cache = worker.embeddings.borrow_mut();
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(entry) = cache.get(key, now) {
            found.push(entry);
            continue;
        }
        let (entry, expires_ms) = shared_level::get(host, &worker.keys, slots, key, now)?;
        host.count(Metric::EmbeddingSharedHits, 1);
        cache.insert_until(*key, entry.clone(), expires_ms);
        found.push(entry);
    }
    Some(found)
}

/// A forwarded request's response being watched for the cache.
#[derive(Debug)]
pub struct Capture {
    model: String,
    keys: Vec<EmbeddingKey>,
    /// Each input as a request of its own, for the gateway (when it warms the cache).
    singles: Option<Vec<String>>,
    body: Vec<u8>,
    reading: bool,
}

impl Capture {
    fn give_up<H: Host + ?Sized>(&mut self, host: &H) {
        if self.reading {
            host.count(Metric::EmbeddingNotStored, 1);
        }
        self.reading = false;
        self.body = Vec::new();
    }

    /// The response's headers: only an unencoded `200` is read.
    pub fn on_headers<H: Host + ?Sized>(&mut self, host: &H) {
        if !readable_ok(host) {
            self.give_up(host);
        }
    }

    /// A chunk of `size` bytes of the response; at its end, the entries are stored.
    pub fn on_body<H: Host + ?Sized>(
        &mut self,
        host: &H,
        worker: &Worker,
        size: usize,
        end_of_stream: bool,
    ) {
        if !self.reading {
            return;
        }
        let limit = worker.config.embeddings.cache.max_response_bytes;
        if self.body.len().saturating_add(size) > limit {
            self.give_up(host);
            return;
        }
        if size > 0 {
            match host.response_body(0, size) {
                Some(chunk) => self.body.extend_from_slice(&chunk),
                None => return self.give_up(host),
            }
        }
        if !end_of_stream {
            return;
        }
        let Some(entries) = split_response(&self.body, self.keys.len()) else {
            return self.give_up(host);
        };
        self.reading = false;
        self.body = Vec::new();
        let config = &worker.config.embeddings.cache;
        let shared = (config.shared_slots, config.max_shared_entry_bytes);
        let now = host.now_ms();
        let mut cache = worker.embeddings.borrow_mut();
        let expires_ms = cache.expiry(now);
        for (key, entry) in self.keys.iter().zip(&entries) {
            shared_level::put(host, &worker.keys, shared, key, entry, expires_ms);
        }
        for (key, request) in self
            .keys
            .iter()
            .zip(self.singles.take().unwrap_or_default())
        {
            if !worker.embed_reports.stored(&self.model, key, request) {
                host.count(Metric::EmbeddingReportsDropped, 1);
            }
        }
        let stored = cache.insert(&self.keys, entries, now);
        let bytes = cache.bytes() as u64;
        drop(cache);
        host.count(Metric::EmbeddingStored, stored.stored);
        host.count(Metric::EmbeddingNotStored, stored.too_large);
        host.count(Metric::EmbeddingEvicted, stored.evicted);
        host.gauge(Metric::EmbeddingBytes, bytes);
    }
}
