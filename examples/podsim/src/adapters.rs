//! LoRA adapters on one pod: the three sets of vLLM.
//!
//! - **registered**: names the server knows (what `/v1/models` lists);
//! - **host cache**: up to `max_cpu_loras` adapters read from disk, LRU;
//! - **GPU slots**: up to `max_loras` adapters active, LRU; an adapter used by a running request
//!   (or pinned, SGLang) is never evicted from either cache.
//!
//! Both caches evict silently. Using an adapter missing from the host cache costs a disk load;
//! using one missing from the GPU slots costs a host→GPU copy.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::lru::LruQueue;

/// An adapter as registered: its name, where its files are, its rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdapterSpec {
    pub name: String,
    /// The adapter directory (`root` of its `/v1/models` card).
    pub path: String,
    /// LoRA rank `r` from `adapter_config.json`.
    pub rank: u32,
    /// SGLang's `pinned`: holds a GPU slot permanently.
    pub pinned: bool,
}

/// What using an adapter cost at the moment it was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// It was not in the host cache: a disk load.
    pub host_miss: bool,
    /// It was not in a GPU slot: a host→GPU copy.
    pub slot_miss: bool,
}

/// The registered adapters and both caches.
#[derive(Debug, Clone, Default)]
pub struct AdapterSets {
    registered: BTreeMap<String, AdapterSpec>,
    host: LruQueue<String>,
    slots: LruQueue<String>,
    max_cpu_loras: usize,
    max_loras: usize,
}

impl AdapterSets {
    pub fn new(max_loras: usize, max_cpu_loras: usize) -> Self {
        Self {
            max_loras,
            max_cpu_loras,
            ..Self::default()
        }
    }

    pub fn get(&self, name: &str) -> Option<&AdapterSpec> {
        self.registered.get(name)
    }

    pub fn registered(&self) -> impl Iterator<Item = &AdapterSpec> {
        self.registered.values()
    }

    pub fn registered_count(&self) -> usize {
        self.registered.len()
    }

    /// Adapters in the host cache, least recently used first.
    pub fn host_cached(&self) -> impl Iterator<Item = &str> {
        self.host.iter().map(String::as_str)
    }

    /// Adapters holding a GPU slot, least recently used first.
    pub fn in_gpu_slots(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().map(String::as_str)
    }

    pub fn is_in_host_cache(&self, name: &str) -> bool {
        self.host.contains(&name.to_string())
    }

    pub fn is_in_gpu_slot(&self, name: &str) -> bool {
        self.slots.contains(&name.to_string())
    }

    /// Pinned adapters, which occupy a slot whether or not a request uses them.
    pub fn pinned(&self) -> impl Iterator<Item = &str> {
        self.registered
            .values()
            .filter(|a| a.pinned)
            .map(|a| a.name.as_str())
    }

    /// Registers `spec` and reads it into the host cache (what a load request does).
    pub fn register(&mut self, spec: AdapterSpec, busy: &HashMap<String, usize>) {
        let name = spec.name.clone();
        let pinned = spec.pinned;
        self.registered.insert(name.clone(), spec);
        self.insert_host(name.clone(), busy);
        if pinned {
            self.insert_slot(name, busy);
        }
    }

    /// Forgets `name` everywhere; false when it was not registered.
    pub fn unregister(&mut self, name: &str) -> bool {
        let key = name.to_string();
        self.host.remove(&key);
        self.slots.remove(&key);
        self.registered.remove(name).is_some()
    }

    /// Makes `name` host-cached and GPU-resident for a request, evicting least recently used
    /// adapters that `busy` (running adapters → request count) does not hold.
    pub fn place(&mut self, name: &str, busy: &HashMap<String, usize>) -> Placement {
        let key = name.to_string();
        let placement = Placement {
            host_miss: !self.host.contains(&key),
            slot_miss: !self.slots.contains(&key),
        };
        self.insert_host(key.clone(), busy);
        self.insert_slot(key, busy);
        placement
    }

    fn evictable(&self, name: &str, busy: &HashMap<String, usize>) -> bool {
        !busy.contains_key(name) && !self.registered.get(name).is_some_and(|a| a.pinned)
    }

    fn insert_host(&mut self, key: String, busy: &HashMap<String, usize>) {
        let evicted = self.insert(Cache::Host, key, busy);
        // An adapter leaves the GPU with the host cache, as vLLM's remove_adapter does.
        for victim in evicted {
            self.slots.remove(&victim);
        }
    }

    fn insert_slot(&mut self, key: String, busy: &HashMap<String, usize>) {
        self.insert(Cache::Slots, key, busy);
    }

    /// Puts `key` at the back of `which` and evicts its least recently used evictable
    /// adapters down to capacity; returns them.
    fn insert(&mut self, which: Cache, key: String, busy: &HashMap<String, usize>) -> Vec<String> {
        let capacity = match which {
            Cache::Host => self.max_cpu_loras,
            Cache::Slots => self.max_loras,
        };
        let mut evicted = Vec::new();
        self.cache_mut(which).push_back(key.clone());
        while self.cache(which).len() > capacity {
            let victim = self
                .cache(which)
                .iter()
                .find(|k| **k != key && self.evictable(k, busy))
                .cloned();
            let Some(victim) = victim else { break };
            self.cache_mut(which).remove(&victim);
            evicted.push(victim);
        }
        evicted
    }

    fn cache(&self, which: Cache) -> &LruQueue<String> {
        match which {
            Cache::Host => &self.host,
            Cache::Slots => &self.slots,
        }
    }

    fn cache_mut(&mut self, which: Cache) -> &mut LruQueue<String> {
        match which {
            Cache::Host => &mut self.host,
            Cache::Slots => &mut self.slots,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Cache {
    Host,
    Slots,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> AdapterSpec {
        AdapterSpec {
            name: name.into(),
            path: format!("/adapters/{name}"),
            rank: 8,
            pinned: false,
        }
    }

    #[test]
    fn both_caches_are_lru_and_spare_busy_adapters() {
        let idle = HashMap::new();
        let mut sets = AdapterSets::new(2, 3);
        for n in ["a", "b", "c", "d"] {
            sets.register(spec(n), &idle);
        }
        // Host cache holds the three most recent registrations.
        assert_eq!(sets.host_cached().collect::<Vec<_>>(), vec!["b", "c", "d"]);
        assert_eq!(sets.in_gpu_slots().count(), 0);
        assert_eq!(
            sets.place("a", &idle),
            Placement {
                host_miss: true,
                slot_miss: true
            }
        );
        assert_eq!(sets.host_cached().collect::<Vec<_>>(), vec!["c", "d", "a"]);
        sets.place("c", &idle);
        let busy: HashMap<String, usize> = [("a".to_string(), 1)].into();
        // d takes c's slot, not busy a's.
        let p = sets.place("d", &busy);
        assert_eq!((p.host_miss, p.slot_miss), (false, true));
        assert_eq!(sets.in_gpu_slots().collect::<Vec<_>>(), vec!["a", "d"]);
        assert!(sets.unregister("a"));
        assert!(!sets.unregister("a"));
        assert!(!sets.is_in_gpu_slot("a"));
    }
}
