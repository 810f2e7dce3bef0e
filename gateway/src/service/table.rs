//! The published routing table: rebuilt by the policy's builder from the pods' state whenever it
//! may have changed (each pod listed with the adapters it serves of its tier's pool), and kept
//! as ready-to-serve JSON with its generation, which is the ETag (`"<generation>"`)
//! `GET /v1/routing` compares with `If-None-Match`.

use std::sync::Arc;

use prewarm_core::wire::RoutingTable;

use super::placement::{listed_adapters, tier_pools};
use super::{now_ms, Gateway};
use crate::policy::PodRoute;

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
        Self::of(&RoutingTable {
            version: prewarm_core::wire::WIRE_VERSION.into(),
            generation: 0,
            generated_at_ms: 0,
            block_tokens: prewarm_core::FingerprintConfig::default().block_tokens,
            load_factor: None,
            pods: Vec::new(),
        })
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

    /// Rebuilds the table from the pods' state; publishes it when its content changed.
    pub fn republish_table(&self) {
        let now = now_ms();
        let published = {
            let mut guard = self.state();
            let state = &mut *guard;
            let pools = tier_pools(state, &self.config.pods);
            let routes: Vec<PodRoute<'_>> = state
                .pods
                .values()
                .map(|p| PodRoute {
                    id: &p.spec.id,
                    address: &p.spec.address,
                    weight: p.spec.weight,
                    load: Some(p.load.kv_usage),
                    adapters: listed_adapters(p, &state.registry, &pools),
                    routable: p.routable(now),
                })
                .collect();
            let first = state.routing.table().generated_at_ms == 0;
            if !state.routing.build(&routes, now) && !first {
                return;
            }
            PublishedTable::of(state.routing.table())
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
