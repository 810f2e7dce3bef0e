//! An ordered set with least-recently-used order: O(log n) insert, touch, remove and pop of the
//! oldest entry. It backs the KV free-block queue and both LoRA caches (host cache, GPU slots).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Keys in use order: the front is the least recently used (the next to evict).
#[derive(Debug, Clone)]
pub struct LruQueue<K: Hash + Eq + Clone> {
    order: BTreeMap<u64, K>,
    position: HashMap<K, u64>,
    next: u64,
}

impl<K: Hash + Eq + Clone> Default for LruQueue<K> {
    fn default() -> Self {
        Self {
            order: BTreeMap::new(),
            position: HashMap::new(),
            next: 0,
        }
    }
}

impl<K: Hash + Eq + Clone> LruQueue<K> {
    pub fn len(&self) -> usize {
        self.position.len()
    }

    pub fn is_empty(&self) -> bool {
        self.position.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.position.contains_key(key)
    }

    /// Puts `key` at the back (most recently used), moving it there if present.
    pub fn push_back(&mut self, key: K) {
        self.remove(&key);
        let at = self.next;
        self.next = self.next.wrapping_add(1);
        self.order.insert(at, key.clone());
        self.position.insert(key, at);
    }

    /// Removes `key`; true when it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        match self.position.remove(key) {
            Some(at) => {
                self.order.remove(&at);
                true
            }
            None => false,
        }
    }

    /// Removes and returns the least recently used key.
    pub fn pop_front(&mut self) -> Option<K> {
        let (_, key) = self.order.pop_first()?;
        self.position.remove(&key);
        Some(key)
    }

    /// Keys from least to most recently used.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &K> {
        self.order.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_is_least_recently_used() {
        let mut q = LruQueue::default();
        for k in [1, 2, 3] {
            q.push_back(k);
        }
        q.push_back(1); // touch
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), vec![2, 3, 1]);
        assert!(q.remove(&3));
        assert!(!q.remove(&3));
        assert_eq!(q.pop_front(), Some(2));
        assert_eq!(q.pop_front(), Some(1));
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
    }
}
