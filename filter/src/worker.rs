//! What one VM (one Envoy worker, or the main thread) holds for all its contexts: the validated
//! configuration, its shared-data keys, its signal and served-record queues, its copy of the
//! routing table, and its tally.

use prewarm_core::FingerprintConfig;

use crate::config::FilterConfig;
use crate::routing::TableCache;
use crate::shared::Keys;
use crate::signal_queue::{ServedQueue, SignalQueue};
use crate::tally::Tally;

#[derive(Debug)]
pub struct Worker {
    pub config: FilterConfig,
    pub fingerprint: FingerprintConfig,
    pub keys: Keys,
    pub queue: SignalQueue,
    pub served: ServedQueue,
    pub table: TableCache,
    pub tally: Tally,
}

impl Worker {
    pub fn new(config: FilterConfig) -> Self {
        let keys = Keys::new(&config.shared_prefix);
        Self {
            fingerprint: config.fingerprint(),
            queue: SignalQueue::new(&config, &keys),
            served: ServedQueue::served(&config, &keys),
            keys,
            table: TableCache::default(),
            tally: Tally::default(),
            config,
        }
    }
}
