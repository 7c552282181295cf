//! The project's key-value trait and its sled implementation. Everything
//! above this file sees ordered byte keys, atomic batches and flush.

use crate::core::{StateView, Write};

/// An ordered key-value tree with atomic batches.
pub trait KvTree: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, sled::Error>;
    /// Pairs with keys in `[start, end)`, up to `limit`, in key order.
    fn range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, sled::Error>;
    /// Pairs with keys from `start` on, up to `limit`, in key order.
    fn range_from(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, sled::Error>;
    fn last(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>, sled::Error>;
    /// The greatest key in `[start, end)`.
    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>, sled::Error>;
    fn first(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>, sled::Error>;
    /// Applies all writes atomically.
    fn apply(&self, writes: &[Write]) -> Result<(), sled::Error>;
    fn clear(&self) -> Result<(), sled::Error>;
    /// Visits every pair in key order.
    fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), sled::Error>;
}

impl KvTree for sled::Tree {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, sled::Error> {
        Ok(sled::Tree::get(self, key)?.map(|v| v.to_vec()))
    }

    fn range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, sled::Error> {
        if start >= end {
            return Ok(Vec::new());
        }
        owned(sled::Tree::range(self, start..end), limit)
    }

    fn range_from(
        &self,
        start: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, sled::Error> {
        owned(sled::Tree::range(self, start..), limit)
    }

    fn last(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>, sled::Error> {
        Ok(sled::Tree::last(self)?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn last_key_in(&self, start: &[u8], end: &[u8]) -> Result<Option<Vec<u8>>, sled::Error> {
        if start >= end {
            return Ok(None);
        }
        let last = sled::Tree::range(self, start..end)
            .next_back()
            .transpose()?;
        Ok(last.map(|(k, _)| k.to_vec()))
    }

    fn first(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>, sled::Error> {
        Ok(sled::Tree::first(self)?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn apply(&self, writes: &[Write]) -> Result<(), sled::Error> {
        let mut batch = sled::Batch::default();
        for w in writes {
            match w {
                Write::Put(k, v) => batch.insert(k.as_slice(), v.as_slice()),
                Write::Delete(k) => batch.remove(k.as_slice()),
            }
        }
        self.apply_batch(batch)
    }

    fn clear(&self) -> Result<(), sled::Error> {
        sled::Tree::clear(self)
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), sled::Error> {
        for r in self.iter() {
            let (k, v) = r?;
            f(&k, &v);
        }
        Ok(())
    }
}

/// Up to `limit` pairs of `iter`, copied out of sled's buffers.
fn owned(iter: sled::Iter, limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>, sled::Error> {
    iter.take(limit)
        .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
        .collect()
}

/// The core's read view over a tree. A read error here means the disk
/// failed under apply; continuing would diverge from the other replicas.
pub struct TreeView<'a>(pub &'a dyn KvTree);

impl StateView for TreeView<'_> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key).expect("state read failed")
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.0.range(start, end, limit).expect("state read failed")
    }
}
