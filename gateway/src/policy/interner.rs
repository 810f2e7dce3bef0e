//! Reference-counted string interning for the prompt pool: models and tenants repeat across
//! thousands of entries, so each entry stores a 4-byte id instead of its own string.

use ahash::AHashMap as HashMap;
use std::sync::Arc;

/// An interned string's id.
pub(crate) type NameId = u32;

/// Strings with reference counts; a name is freed when its last user releases it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Interner {
    names: Vec<Option<(Arc<str>, u32)>>,
    index: HashMap<Arc<str>, NameId>,
    free: Vec<NameId>,
}

impl Interner {
    /// The id of `name`, adding a reference; `None` when `limit` distinct names are held.
    pub(crate) fn acquire(&mut self, name: &str, limit: usize) -> Option<NameId> {
        if let Some(&id) = self.index.get(name) {
            if let Some(Some((_, refs))) = self.names.get_mut(id as usize) {
                *refs = refs.saturating_add(1);
            }
            return Some(id);
        }
        if self.index.len() >= limit {
            return None;
        }
        let name: Arc<str> = Arc::from(name);
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(slot) = self.names.get_mut(id as usize) {
                    *slot = Some((name.clone(), 1));
                }
                id
            }
            None => {
                let id = NameId::try_from(self.names.len()).ok()?;
                self.names.push(Some((name.clone(), 1)));
                id
            }
        };
        self.index.insert(name, id);
        Some(id)
    }

    /// Drops one reference to `id`.
    pub(crate) fn release(&mut self, id: NameId) {
        let Some(slot) = self.names.get_mut(id as usize) else {
            return;
        };
        let gone = match slot {
            Some((_, refs)) if *refs > 1 => {
                *refs -= 1;
                None
            }
            Some((name, _)) => Some(name.clone()),
            None => None,
        };
        if let Some(name) = gone {
            *slot = None;
            self.index.remove(&name);
            self.free.push(id);
        }
    }

    /// The string of `id` (empty for a released id).
    pub(crate) fn get(&self, id: NameId) -> &str {
        match self.names.get(id as usize) {
            Some(Some((name, _))) => name,
            _ => "",
        }
    }

    /// The shared string of `id` (a reference count, no copy; `None` for a released id).
    pub(crate) fn shared(&self, id: NameId) -> Option<Arc<str>> {
        match self.names.get(id as usize) {
            Some(Some((name, _))) => Some(name.clone()),
            _ => None,
        }
    }

    /// Distinct names held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_shared_and_freed_with_their_last_reference() {
        let mut i = Interner::default();
        let a = i.acquire("m", 10).unwrap();
        assert_eq!(i.acquire("m", 10), Some(a));
        let b = i.acquire("n", 10).unwrap();
        assert_ne!(a, b);
        assert_eq!(i.get(a), "m");
        i.release(a);
        assert_eq!(i.get(a), "m");
        i.release(a);
        assert_eq!(i.get(a), "");
        assert_eq!(i.len(), 1);
        assert_eq!(i.acquire("o", 2), Some(a), "freed ids are reused");
        assert_eq!(i.acquire("p", 2), None, "limit reached");
    }
}
