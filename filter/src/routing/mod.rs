//! Routing: which pod a request goes to. This module chooses the pod from the routing table
//! with core's longest-prefix rule (`prewarm_core::prefix`): the pods holding the requested
//! adapter first (all pods when none does), the pod holding the longest run of the prompt's
//! shards by the prefix index unless it is over the load bound, else bounded-load rendezvous on
//! the prompt's chain. It also keeps the worker's copy of the table ([`TableCache`]), refreshed
//! from shared data only when its generation changed.
//!
//! - [`prefix_index`]: the prefix index in shared data, one index for every worker of a proxy.
//! - [`prefix_pending`]: a VM's routed requests' index writes, held for the root tick.
//! - [`prefix_reads`]: the index slots a VM read since its last tick, read once a tick.
//! - [`external_route`]: the pod another router chose (`endpoint_header_owner: external`),
//!   recorded as served like a pod this filter chose.
//!
//! Invariants: routing never fails a request (no table, no pod: the request goes on without an
//! endpoint header, counted by [`Unrouted`], and Envoy's load balancer picks); a request's routing
//! writes no shared data (its index writes wait for the tick, so its host calls do not grow with
//! the prompt); an endpoint header another router owns is never removed or set.

pub mod external_route;
pub mod prefix_index;
pub mod prefix_pending;
pub mod prefix_reads;

use std::cell::RefCell;
use std::rc::Rc;

use prewarm_core::prefix::{route_prefix, PrefixStore, PromptKeys};
use prewarm_core::wire::{RoutedPod, RoutingTable};
use prewarm_core::{rank, FingerprintConfig, PlacementCandidate};

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

/// Where a request goes: the placement's choice, then retry alternatives in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct Route<'t> {
    pub primary: &'t RoutedPod,
    pub alternatives: Vec<&'t RoutedPod>,
    /// Blocks of the prompt the prefix index matched on `primary` (0: placed by rendezvous).
    pub matched_blocks: usize,
}

impl Route<'_> {
    /// The endpoint header's value: `primary,alt1,alt2` (Envoy's `override_host` takes the
    /// first, and the next ones on retries).
    pub fn header_value(&self) -> String {
        let mut out = self.primary.address.clone();
        for alt in &self.alternatives {
            out.push(',');
            out.push_str(&alt.address);
        }
        out
    }
}

/// Where the prefix index is and how old its entries may be.
pub struct PrefixLookup<'s, S: PrefixStore + ?Sized> {
    pub store: &'s S,
    pub keys: &'s PromptKeys,
    pub now_ms: u64,
    pub horizon_ms: u64,
}

/// The pods for a prompt of `model`: core's prefix rule's choice among the adapter's holders
/// (all pods when none holds it), then up to `alternatives` more in rendezvous rank order of the
/// rule's key (holders first).
pub fn choose_pod<'t, S: PrefixStore + ?Sized>(
    table: Option<&'t RoutingTable>,
    model: &str,
    fingerprint: &FingerprintConfig,
    prefix: &PrefixLookup<'_, S>,
    alternatives: usize,
) -> Result<Route<'t>, Unrouted> {
    let table = table.ok_or(Unrouted::NoTable)?;
    if table.block_tokens != fingerprint.block_tokens {
        return Err(Unrouted::BlockTokens);
    }
    let routed = route_prefix(
        table,
        model,
        prefix.keys,
        prefix.store,
        prefix.now_ms,
        prefix.horizon_ms,
    )
    .ok_or(match prefix.keys.key() {
        // A short prompt is routed only for an adapter the table lists (core's rule, step 0).
        None => Unrouted::NoFullBlock,
        Some(_) => Unrouted::NoPod,
    })?;
    let primary = routed.primary;
    let mut route = Route {
        primary,
        alternatives: Vec::new(),
        matched_blocks: routed.matched_blocks,
    };
    if alternatives > 0 {
        let all: Vec<PlacementCandidate<'_>> = table
            .pods
            .iter()
            .map(|p| PlacementCandidate::new(&p.id, p.weight))
            .collect();
        let ranked: Vec<&RoutedPod> = rank(routed.key, &all)
            .into_iter()
            .filter_map(|i| table.pods.get(i))
            .filter(|p| p.id != primary.id)
            .collect();
        let holds = |p: &&RoutedPod| routed.pool.iter().any(|q| q.id == p.id);
        let (in_pool, others): (Vec<&RoutedPod>, Vec<&RoutedPod>) =
            ranked.into_iter().partition(holds);
        route.alternatives = in_pool
            .into_iter()
            .chain(others)
            .take(alternatives)
            .collect();
    }
    Ok(route)
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

/// A worker's parsed copy of the shared routing table, and its cold view when the table lists
/// warming pods (an experiment arm without warm-up routes to them too).
#[derive(Debug, Default)]
pub struct TableCache {
    current: RefCell<Option<Installed>>,
}

#[derive(Debug)]
struct Installed {
    generation: u64,
    table: Rc<RoutingTable>,
    /// The table with its warming pods among its pods; `None` when it lists none.
    cold: Option<Rc<RoutingTable>>,
}

impl TableCache {
    pub fn table(&self) -> Option<Rc<RoutingTable>> {
        self.current.borrow().as_ref().map(|i| i.table.clone())
    }

    /// The table an arm routes with: with `warmup`, the pods past their warm-up (the table);
    /// without, the warming pods too.
    pub fn view(&self, warmup: bool) -> Option<Rc<RoutingTable>> {
        let current = self.current.borrow();
        let installed = current.as_ref()?;
        match (&installed.cold, warmup) {
            (Some(cold), false) => Some(cold.clone()),
            _ => Some(installed.table.clone()),
        }
    }

    pub fn generation(&self) -> Option<u64> {
        self.current.borrow().as_ref().map(|i| i.generation)
    }

    pub fn install(&self, generation: u64, table: RoutingTable) {
        let cold = (!table.warming.is_empty()).then(|| {
            let mut cold = table.clone();
            cold.pods.append(&mut cold.warming);
            Rc::new(cold)
        });
        *self.current.borrow_mut() = Some(Installed {
            generation,
            table: Rc::new(table),
            cold,
        });
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
    use prewarm_core::prefix::{MemoryStore, DEFAULT_HORIZON_MS};
    use prewarm_core::rank;
    use prewarm_core::BlockChain;

    fn lookup<'s>(store: &'s MemoryStore, keys: &'s PromptKeys) -> PrefixLookup<'s, MemoryStore> {
        PrefixLookup {
            store,
            keys,
            now_ms: 0,
            horizon_ms: DEFAULT_HORIZON_MS,
        }
    }

    fn pod(id: &str, adapters: &[&str]) -> RoutedPod {
        RoutedPod::new(id, &format!("{id}:80"), adapters)
    }

    fn table(pods: Vec<RoutedPod>) -> RoutingTable {
        RoutingTable::of_pods(1, 64, pods)
    }

    #[test]
    fn placement_follows_core_and_prefers_adapter_holders() {
        let fp = FingerprintConfig::default();
        let keys = PromptKeys::of(&BlockChain::of("m", &[b'a'; 600], &fp), &fp);
        let store = MemoryStore::new(64);
        let t = table(vec![pod("a", &[]), pod("b", &[]), pod("c", &["lora"])]);
        let ids: Vec<PlacementCandidate<'_>> = t
            .pods
            .iter()
            .map(|p| PlacementCandidate::new(&p.id, 1.0))
            .collect();
        let want = rank(keys.key().unwrap(), &ids)[0];
        let route = choose_pod(Some(&t), "m", &fp, &lookup(&store, &keys), 2).unwrap();
        assert_eq!(route.primary.id, t.pods[want].id);
        assert_eq!(route.alternatives.len(), 2);
        assert!(route.alternatives.iter().all(|p| p.id != route.primary.id));
        let lora = choose_pod(Some(&t), "lora", &fp, &lookup(&store, &keys), 1).unwrap();
        assert_eq!(lora.primary.id, "c");
        assert_eq!(lora.alternatives.len(), 1, "non-holders as last resort");
        assert_eq!(
            lora.header_value(),
            format!("c:80,{}", lora.alternatives[0].address)
        );
    }

    #[test]
    fn refuses_without_table_block_or_matching_block_size() {
        let fp = FingerprintConfig::default();
        let store = MemoryStore::new(64);
        let keys = PromptKeys::of(&BlockChain::of("m", &[b'a'; 600], &fp), &fp);
        let short = PromptKeys::of(&BlockChain::of("m", b"hi", &fp), &fp);
        let go = |t: Option<&RoutingTable>, k: &PromptKeys| {
            choose_pod(t, "m", &fp, &lookup(&store, k), 0).map(|r| r.primary.id.clone())
        };
        assert_eq!(go(None, &keys), Err(Unrouted::NoTable));
        let mut t = table(vec![pod("a", &[])]);
        assert_eq!(go(Some(&t), &short), Err(Unrouted::NoFullBlock));
        t.block_tokens = 32;
        assert_eq!(go(Some(&t), &keys), Err(Unrouted::BlockTokens));
        t.block_tokens = 64;
        t.pods.clear();
        assert_eq!(go(Some(&t), &keys), Err(Unrouted::NoPod));
    }

    #[test]
    fn a_short_prompt_for_a_listed_adapter_goes_to_its_holder() {
        let fp = FingerprintConfig::default();
        let store = MemoryStore::new(64);
        let short = PromptKeys::of(&BlockChain::of("lora", b"hi", &fp), &fp);
        let t = table(vec![pod("a", &[]), pod("b", &["lora"]), pod("c", &[])]);
        let go = |model: &str| {
            choose_pod(Some(&t), model, &fp, &lookup(&store, &short), 0).map(|r| r.header_value())
        };
        assert_eq!(go("lora").unwrap(), "b:80");
        // The base model and an adapter no pod lists stay with the proxy's load balancer.
        assert_eq!(go("m"), Err(Unrouted::NoFullBlock));
        assert_eq!(go("unlisted"), Err(Unrouted::NoFullBlock));
    }
}
