//! The published routing table: the fleet core's table (its one owner), kept as ready-to-serve
//! JSON with its generation, which is the ETag (`"<generation>"`) `GET /v1/routing` compares
//! with `If-None-Match`. Re-encoded only when the core's generation moves.

use std::sync::Arc;

use prewarm_core::wire::RoutingTable;

use super::Gateway;

/// The table as served.
#[derive(Debug, Clone)]
pub struct PublishedTable {
    pub generation: u64,
    pub pods: usize,
    /// The encoded [`RoutingTable`].
    pub json: Arc<[u8]>,
}

impl PublishedTable {
    pub fn empty() -> Self {
        let block_tokens = prewarm_core::FingerprintConfig::default().block_tokens;
        Self::of(&RoutingTable::of_pods(0, block_tokens, Vec::new()))
    }

    pub fn of(table: &RoutingTable) -> Self {
        Self {
            generation: table.generation,
            pods: table.pods.len(),
            json: table.encode().into(),
        }
    }

    /// The ETag of this generation, quotes included.
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.generation)
    }
}

impl Gateway {
    /// The table filters get now.
    pub fn published_table(&self) -> Arc<PublishedTable> {
        self.table
            .read()
            .map(|t| t.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Rebuilds the core's table; publishes it when its generation moved.
    pub fn republish_table(&self) {
        let published = {
            let mut state = self.state();
            state.fleet.rebuild_table(self.clock.now_ms());
            let gold_pods = state.fleet.tier_pools().gold_pods();
            self.telemetry.gold_pool_pods.set(gold_pods as i64);
            let table = state.fleet.table();
            if table.generation == self.published_table().generation && table.generation != 0 {
                return;
            }
            PublishedTable::of(table)
        };
        self.telemetry
            .table_generation
            .set(published.generation as i64);
        self.telemetry.table_pods.set(published.pods as i64);
        tracing::info!(
            generation = published.generation,
            pods = published.pods,
            "routing table published"
        );
        match self.table.write() {
            Ok(mut t) => *t = Arc::new(published),
            Err(p) => *p.into_inner() = Arc::new(published),
        }
    }
}
