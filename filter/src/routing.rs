//! Choosing the pod for a request from the routing table with core's placement: the pods
//! holding the requested adapter first (all pods when none does), keyed by the prompt's
//! `routing_key`, bounded-load when the table gives a load factor. Also the worker's copy of
//! the table, refreshed from shared data only when its generation changed.

use std::cell::RefCell;
use std::rc::Rc;

use prewarm_core::wire::{RoutedPod, RoutingTable};
use prewarm_core::{place, place_bounded, BlockChain, FingerprintConfig, PlacementCandidate};

use crate::host::{Host, Metric};
use crate::shared::{read_u64, Keys};

/// Why a request was not routed; each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrouted {
    NoTable,
    BlockTokens,
    NoFullBlock,
    NoPod,
}

impl Unrouted {
    pub fn metric(self) -> Metric {
        match self {
            Self::NoTable => Metric::UnroutedNoTable,
            Self::BlockTokens => Metric::UnroutedBlockTokens,
            Self::NoFullBlock => Metric::UnroutedNoBlock,
            Self::NoPod => Metric::UnroutedNoPod,
        }
    }
}

/// The pod for a prompt of `model`: its `address`.
pub fn choose_pod<'t>(
    table: Option<&'t RoutingTable>,
    model: &str,
    chain: &BlockChain,
    fingerprint: &FingerprintConfig,
) -> Result<&'t RoutedPod, Unrouted> {
    let table = table.ok_or(Unrouted::NoTable)?;
    if table.block_tokens != fingerprint.block_tokens {
        return Err(Unrouted::BlockTokens);
    }
    let key = chain
        .routing_key(fingerprint)
        .ok_or(Unrouted::NoFullBlock)?;
    let holders: Vec<&RoutedPod> = table
        .pods
        .iter()
        .filter(|p| p.adapters.iter().any(|a| a == model))
        .collect();
    let pool: Vec<&RoutedPod> = if holders.is_empty() {
        table.pods.iter().collect()
    } else {
        holders
    };
    let candidates: Vec<PlacementCandidate<'_>> = pool
        .iter()
        .map(|p| PlacementCandidate::new(&p.id, p.weight))
        .collect();
    let chosen = match table.load_factor {
        Some(factor) => {
            let loads: Vec<f64> = pool.iter().map(|p| p.load.unwrap_or(0.0)).collect();
            place_bounded(key.0, &candidates, &loads, factor)
        }
        None => place(key.0, &candidates),
    };
    chosen
        .and_then(|i| pool.get(i).copied())
        .ok_or(Unrouted::NoPod)
}

/// Generation and fetch time of the table in shared data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableStamp {
    pub generation: u64,
    pub fetched_at_ms: u64,
}

impl TableStamp {
    pub fn read<H: Host + ?Sized>(host: &H, keys: &Keys) -> Option<Self> {
        let (value, _) = host.shared_get(&keys.generation());
        let value = value?;
        Some(Self {
            generation: read_u64(&value, 0)?,
            fetched_at_ms: read_u64(&value, 8)?,
        })
    }

    pub fn to_bytes(self) -> Vec<u8> {
        let mut out = self.generation.to_le_bytes().to_vec();
        out.extend_from_slice(&self.fetched_at_ms.to_le_bytes());
        out
    }
}

/// A worker's parsed copy of the shared routing table.
#[derive(Debug, Default)]
pub struct TableCache {
    current: RefCell<Option<(u64, Rc<RoutingTable>)>>,
}

impl TableCache {
    pub fn table(&self) -> Option<Rc<RoutingTable>> {
        self.current.borrow().as_ref().map(|(_, t)| t.clone())
    }

    pub fn generation(&self) -> Option<u64> {
        self.current.borrow().as_ref().map(|(g, _)| *g)
    }

    pub fn install(&self, generation: u64, table: RoutingTable) {
        *self.current.borrow_mut() = Some((generation, Rc::new(table)));
    }

    /// Reloads the table from shared data when another worker published a new generation.
    pub fn refresh<H: Host + ?Sized>(&self, host: &H, keys: &Keys) -> Option<TableStamp> {
        let stamp = TableStamp::read(host, keys)?;
        if self.generation() != Some(stamp.generation) {
            let (body, _) = host.shared_get(&keys.table());
            if let Some(table) = body.and_then(|b| RoutingTable::decode(&b).ok()) {
                if table.generation == stamp.generation {
                    self.install(stamp.generation, table);
                    host.count(Metric::TableAdopted, 1);
                }
            }
        }
        Some(stamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prewarm_core::rank;

    fn pod(id: &str, adapters: &[&str]) -> RoutedPod {
        RoutedPod {
            id: id.into(),
            address: format!("{id}:80"),
            weight: 1.0,
            adapters: adapters.iter().map(|a| a.to_string()).collect(),
            load: None,
        }
    }

    fn table(pods: Vec<RoutedPod>) -> RoutingTable {
        RoutingTable {
            version: "1.0".into(),
            generation: 1,
            generated_at_ms: 0,
            block_tokens: 64,
            load_factor: None,
            pods,
        }
    }

    #[test]
    fn placement_follows_core_and_prefers_adapter_holders() {
        let fp = FingerprintConfig::default();
        let chain = BlockChain::of("m", &[b'a'; 600], &fp);
        let t = table(vec![pod("a", &[]), pod("b", &[]), pod("c", &["lora"])]);
        let ids: Vec<PlacementCandidate<'_>> = t
            .pods
            .iter()
            .map(|p| PlacementCandidate::new(&p.id, 1.0))
            .collect();
        let want = rank(chain.routing_key(&fp).unwrap().0, &ids)[0];
        assert_eq!(
            choose_pod(Some(&t), "m", &chain, &fp).unwrap().id,
            t.pods[want].id
        );
        assert_eq!(choose_pod(Some(&t), "lora", &chain, &fp).unwrap().id, "c");
    }

    #[test]
    fn refuses_without_table_block_or_matching_block_size() {
        let fp = FingerprintConfig::default();
        let chain = BlockChain::of("m", &[b'a'; 600], &fp);
        assert_eq!(choose_pod(None, "m", &chain, &fp), Err(Unrouted::NoTable));
        let mut t = table(vec![pod("a", &[])]);
        let short = BlockChain::of("m", b"hi", &fp);
        assert_eq!(
            choose_pod(Some(&t), "m", &short, &fp),
            Err(Unrouted::NoFullBlock)
        );
        t.block_tokens = 32;
        assert_eq!(
            choose_pod(Some(&t), "m", &chain, &fp),
            Err(Unrouted::BlockTokens)
        );
        t.block_tokens = 64;
        t.pods.clear();
        assert_eq!(choose_pod(Some(&t), "m", &chain, &fp), Err(Unrouted::NoPod));
    }
}
