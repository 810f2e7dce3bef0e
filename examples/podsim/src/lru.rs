//! Least-recently-used order for the KV free-block queue and both LoRA caches (host cache, GPU
//! slots), on the `lru` crate: O(1) touch, remove and pop of the oldest entry. Unbounded on
//! purpose: the callers choose what to evict (an adapter with a running request is skipped, a
//! block in use is not in the queue), so capacity is theirs, not the queue's.

use std::hash::Hash;

use lru::LruCache;

/// Keys in use order: the front is the least recently used (the next to evict).
#[derive(Debug, Clone)]
pub struct LruQueue<K: Hash + Eq> {
    order: LruCache<K, ()>,
}

impl<K: Hash + Eq> Default for LruQueue<K> {
    fn default() -> Self {
        Self {
            order: LruCache::unbounded(),
        }
    }
}

impl<K: Hash + Eq> LruQueue<K> {
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Whether `key` is queued; does not change the order.
    pub fn contains(&self, key: &K) -> bool {
        self.order.contains(key)
    }

    /// Puts `key` at the back (most recently used), moving it there if present.
    pub fn push_back(&mut self, key: K) {
        self.order.put(key, ());
    }

    /// Removes `key`; true when it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        self.order.pop(key).is_some()
    }

    /// Removes and returns the least recently used key.
    pub fn pop_front(&mut self) -> Option<K> {
        self.order.pop_lru().map(|(key, ())| key)
    }

    /// Keys from least to most recently used.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &K> {
        self.order.iter().rev().map(|(key, ())| key)
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
