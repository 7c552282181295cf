//! Read access to the replicated state for the core, and the overlay that
//! lets one apply see its own earlier writes. Production reads sled through
//! this trait; tests use [`MemView`].

use std::collections::BTreeMap;

/// A change the storage layer writes atomically with `last_applied`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Read-only view of the state key space.
pub trait StateView {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>>;
    /// Up to `limit` pairs with keys in `[start, end)`, in key order.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)>;
}

/// In-memory state, for tests and for replaying writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemView {
    pub map: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MemView {
    pub fn write(&mut self, writes: &[Write]) {
        for w in writes {
            match w {
                Write::Put(k, v) => {
                    self.map.insert(k.clone(), v.clone());
                }
                Write::Delete(k) => {
                    self.map.remove(k);
                }
            }
        }
    }
}

impl StateView for MemView {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.map.get(key).cloned()
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        if start >= end {
            return Vec::new();
        }
        self.map
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Pending writes layered over a base view. Later writes to a key replace
/// earlier ones, so the result is the net change.
pub struct Overlay<'a, V: StateView + ?Sized> {
    base: &'a V,
    pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a, V: StateView + ?Sized> Overlay<'a, V> {
    pub fn new(base: &'a V) -> Self {
        Overlay {
            base,
            pending: BTreeMap::new(),
        }
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.pending.insert(key, Some(value));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        self.pending.insert(key, None);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn into_writes(self) -> Vec<Write> {
        self.pending
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => Write::Put(k, v),
                None => Write::Delete(k),
            })
            .collect()
    }
}

impl<V: StateView + ?Sized> StateView for Overlay<'_, V> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.pending.get(key) {
            Some(v) => v.clone(),
            None => self.base.get(key),
        }
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        if start >= end {
            return Vec::new();
        }
        // Deletions can hide base rows, so read enough of the base to still fill `limit`.
        let hidden = self.pending.range(start.to_vec()..end.to_vec()).count();
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = self
            .base
            .range(start, end, limit.saturating_add(hidden))
            .into_iter()
            .collect();
        for (k, v) in self.pending.range(start.to_vec()..end.to_vec()) {
            match v {
                Some(v) => merged.insert(k.clone(), v.clone()),
                None => merged.remove(k),
            };
        }
        merged.into_iter().take(limit).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_reads_its_own_writes_and_hides_deletes() {
        let mut base = MemView::default();
        base.write(&[
            Write::Put(b"a".to_vec(), b"1".to_vec()),
            Write::Put(b"b".to_vec(), b"2".to_vec()),
            Write::Put(b"c".to_vec(), b"3".to_vec()),
        ]);
        let mut o = Overlay::new(&base);
        o.delete(b"a".to_vec());
        o.put(b"bb".to_vec(), b"x".to_vec());
        assert_eq!(o.get(b"a"), None);
        assert_eq!(o.get(b"bb"), Some(b"x".to_vec()));
        let keys: Vec<_> = o.range(b"a", b"z", 2).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![b"b".to_vec(), b"bb".to_vec()]);
        assert_eq!(
            o.into_writes(),
            vec![
                Write::Delete(b"a".to_vec()),
                Write::Put(b"bb".to_vec(), b"x".to_vec())
            ]
        );
    }
}
