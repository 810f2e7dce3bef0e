//! What one VM (one Envoy worker, or the main thread) holds for all its contexts: the validated
//! configuration, its shared-data keys, its signal and served-record queues, its copy of the
//! routing table (in standalone mode, the one built from `direct_pods`), its tallies (adapters
//! and hot prefixes' uses; shared prompts), the key of credential identities and its embedding
//! cache. Its queues: signals, served records, outcome records and the prefix index's pending
//! writes; and the prefix index's slots it read this tick.

use std::cell::RefCell;

use prewarm_core::FingerprintConfig;

use crate::config::{DirectMode, FilterConfig};
use crate::direct::config::static_table;
use crate::embeddings::cache::EmbeddingCache;
use crate::embeddings::reports::EmbeddingReports;
use crate::request::credential::IdentityKey;
use crate::routing::prefix_pending::PendingPrefixWrites;
use crate::routing::prefix_reads::PrefixReads;
use crate::routing::TableCache;
use crate::shared::Keys;
use crate::signals::prompt_tally::PromptTally;
use crate::signals::queue::{OutcomeQueue, ServedQueue, SignalQueue};
use crate::signals::tally::Tally;

#[derive(Debug)]
pub struct Worker {
    pub config: FilterConfig,
    pub fingerprint: FingerprintConfig,
    pub keys: Keys,
    pub queue: SignalQueue,
    pub served: ServedQueue,
    pub outcomes: OutcomeQueue,
    pub table: TableCache,
    pub tally: Tally,
    /// Requests per routing key, for the cross-user trigger (`prompt_tally`).
    pub prompts: PromptTally,
    /// The key of credential identities (`request::credential`).
    pub identity: IdentityKey,
    /// The embedding cache of this VM (`embedding_cache`; empty while off).
    pub embeddings: RefCell<EmbeddingCache>,
    /// What this VM tells the gateway of its embedding cache since its last batch.
    pub embed_reports: EmbeddingReports,
    /// This VM's routed requests' prefix-index writes, applied on the root tick.
    pub prefix_pending: PendingPrefixWrites,
    /// The prefix index's slots as this VM read them since its last tick.
    pub prefix_reads: PrefixReads,
}

impl Worker {
    pub fn new(config: FilterConfig) -> Self {
        let keys = Keys::new(&config.shared_data.shared_prefix);
        let table = TableCache::default();
        // standalone: the static pods are the table, for routing and direct calls alike
        if config.direct.direct_calls == DirectMode::Always {
            table.install(0, static_table(&config));
        }
        Self {
            fingerprint: config.requests.fingerprint(),
            queue: SignalQueue::new(&config, &keys),
            served: ServedQueue::served(&config, &keys),
            outcomes: OutcomeQueue::outcomes(&config, &keys),
            keys,
            table,
            tally: Tally::default(),
            prompts: PromptTally::new(config.shared_data.shared_prompt_tally_bytes),
            identity: IdentityKey::new(&config),
            embeddings: RefCell::new(EmbeddingCache::new(
                config.embeddings.cache.max_bytes,
                config.embeddings.cache.ttl_ms,
            )),
            embed_reports: EmbeddingReports::default(),
            prefix_pending: PendingPrefixWrites::default(),
            prefix_reads: PrefixReads::default(),
            config,
        }
    }
}
