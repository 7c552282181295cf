//! A point-in-time read of a tree that is written under it. Snapshot
//! builds and digests read the whole state: at ten million timers that is
//! tens of seconds, too long to hold every write back (apply may hold only
//! so much in memory before it waits, and writes already in the log then
//! outlive their client's deadline). Instead the reader walks the tree in
//! key order, a chunk at a time, and whoever writes to the tree meanwhile
//! first keeps what it held at the pinned point for every key the reader
//! has not passed yet ([`Pin::keep_before`]). The reader takes those kept
//! values over the tree's: what it sees is the tree as it was when pinned.
//!
//! The writer and the reader take turns under one lock (the caller's): the
//! reader reads a chunk and moves past it under the lock, and the writer,
//! before it writes a key, keeps the key's value under the lock unless the
//! reader is past it. So a key is either read before it is written, or its
//! pinned value is kept before it is written, and the reader takes that
//! value over whatever sled holds when it gets there: the write itself
//! need not hold the lock. A kept value is dropped as soon as the reader
//! passes its key, and a key the reader has passed is never kept again.

use std::collections::BTreeMap;

use super::kv::KvTree;

/// Bytes counted per kept key beyond its key and value (the map's node).
const KEPT_OVERHEAD: usize = 64;

/// What a reader of a pinned tree has passed, and what the tree held at the
/// pinned point for the keys written since, ahead of the reader.
#[derive(Default, Debug)]
pub struct Pin {
    /// The greatest key read; `None` before the first chunk.
    passed: Option<Vec<u8>>,
    /// The whole tree has been read: no value is kept any more.
    done: bool,
    /// The pinned value (`None`: absent) of every key above `passed`
    /// written since the pin.
    kept: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Bytes of `kept` (keys, values, [`KEPT_OVERHEAD`] each).
    bytes: usize,
    /// The most `bytes` ever was.
    peak: usize,
}

/// Why [`Pin::keep_before`] refused a write.
#[derive(Debug, PartialEq, Eq)]
pub struct PinFull;

impl Pin {
    /// Whether the reader has yet to read `key`.
    fn ahead(&self, key: &[u8]) -> bool {
        !self.done && self.passed.as_deref().is_none_or(|p| key > p)
    }

    /// Keeps the pinned value of every key in `keys` the reader has yet to
    /// read, before the caller writes them to `tree` (one writer at a time,
    /// each write after its keys were kept). Refuses, keeping nothing of
    /// `keys`, when that would take the kept values past `limit` bytes: the
    /// caller must then not write them until the read ends.
    pub fn keep_before<'k>(
        &mut self,
        tree: &dyn KvTree,
        keys: impl Iterator<Item = &'k [u8]>,
        limit: usize,
    ) -> Result<Result<(), PinFull>, sled::Error> {
        let mut new = BTreeMap::new();
        let mut bytes = 0;
        for key in keys {
            if !self.ahead(key) || self.kept.contains_key(key) || new.contains_key(key) {
                continue;
            }
            let was = tree.get(key)?;
            bytes += key.len() + was.as_ref().map_or(0, Vec::len) + KEPT_OVERHEAD;
            if self.bytes + bytes > limit {
                return Ok(Err(PinFull));
            }
            new.insert(key.to_vec(), was);
        }
        self.kept.extend(new);
        self.bytes += bytes;
        self.peak = self.peak.max(self.bytes);
        Ok(Ok(()))
    }

    /// The next pairs of the tree as it was when pinned, in key order, at
    /// most about `limit` read from `tree`; `None` once all were read.
    pub fn next_chunk(
        &mut self,
        tree: &dyn KvTree,
        limit: usize,
    ) -> Result<Option<Vec<(Vec<u8>, Vec<u8>)>>, sled::Error> {
        if self.done {
            return Ok(None);
        }
        let limit = limit.max(1);
        let start = match &self.passed {
            // The least key above `p`.
            Some(p) => [p.as_slice(), &[0]].concat(),
            None => Vec::new(),
        };
        let read = tree.range_from(&start, limit)?;
        let last = read.len() == limit;
        // Kept values up to the last key read (all of them at the end).
        let mut kept = Vec::new();
        while let Some(entry) = self.kept.first_entry() {
            if last && entry.key() > &read[read.len() - 1].0 {
                break;
            }
            let (k, v) = entry.remove_entry();
            self.bytes -= k.len() + v.as_ref().map_or(0, Vec::len) + KEPT_OVERHEAD;
            kept.push((k, v));
        }
        if last {
            self.passed = Some(read[read.len() - 1].0.clone());
        } else {
            self.done = true;
        }
        Ok(Some(merge(read, kept)))
    }

    /// The most bytes of kept values this pin held at once.
    pub fn peak_bytes(&self) -> usize {
        self.peak
    }
}

/// `read` (from the tree now) with `kept` (pinned values) taken over it,
/// both in key order; a key whose pinned value is absent is left out.
fn merge(
    read: Vec<(Vec<u8>, Vec<u8>)>,
    kept: Vec<(Vec<u8>, Option<Vec<u8>>)>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    use std::cmp::Ordering;
    let mut out = Vec::with_capacity(read.len() + kept.len());
    let mut kept = kept.into_iter().peekable();
    for (k, v) in read {
        let mut value = Some(v);
        while let Some((next, _)) = kept.peek() {
            match next.as_slice().cmp(&k) {
                Ordering::Greater => break,
                Ordering::Less => {
                    // Deleted since the pin (or written and deleted).
                    let (kk, kv) = kept.next().expect("peeked");
                    out.extend(kv.map(|kv| (kk, kv)));
                }
                Ordering::Equal => {
                    value = kept.next().expect("peeked").1;
                    break;
                }
            }
        }
        out.extend(value.map(|v| (k, v)));
    }
    out.extend(kept.filter_map(|(k, v)| v.map(|v| (k, v))));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;

    fn temporary_tree() -> (sled::Db, sled::Tree) {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        (db, tree)
    }

    /// Short keys over few bytes, so that keys collide, and one is often
    /// another's prefix (`[1]`, `[1, 0]`): the least key above a passed one.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        vec(prop_oneof![Just(0u8), Just(1), Just(2), Just(255)], 1..4)
    }

    #[derive(Debug, Clone)]
    enum Step {
        Read(usize),
        /// Keep, let the reader read chunks of these sizes, then write.
        Write(Vec<(Vec<u8>, Option<Vec<u8>>)>, Vec<usize>),
    }

    fn step() -> impl Strategy<Value = Step> {
        let writes = vec((key(), proptest::option::of(vec(any::<u8>(), 0..3))), 1..8);
        prop_oneof![
            (1usize..6).prop_map(Step::Read),
            (writes, vec(1usize..4, 0..3)).prop_map(|(w, r)| Step::Write(w, r)),
        ]
    }

    fn write(tree: &sled::Tree, writes: &[(Vec<u8>, Option<Vec<u8>>)]) {
        for (k, v) in writes {
            match v {
                Some(v) => tree.insert(k.as_slice(), v.as_slice()).unwrap(),
                None => tree.remove(k.as_slice()).unwrap(),
            };
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// However writes and chunked reads interleave, the reader sees
        /// the tree as it was when pinned, and no kept value outlives it.
        #[test]
        fn a_pinned_read_is_the_tree_as_it_was_whatever_is_written_under_it(
            initial in btree_map(key(), vec(any::<u8>(), 0..3), 0..24),
            steps in vec(step(), 0..24),
        ) {
            let (_db, tree) = temporary_tree();
            write(&tree, &initial.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect::<Vec<_>>());
            let mut pin = Pin::default();
            let mut read = Vec::new();
            for step in steps {
                match step {
                    Step::Read(n) => read.extend(pin.next_chunk(&tree, n).unwrap().unwrap_or_default()),
                    Step::Write(writes, reads_between) => {
                        let keys = writes.iter().map(|(k, _)| k.as_slice());
                        prop_assert_eq!(pin.keep_before(&tree, keys, usize::MAX).unwrap(), Ok(()));
                        for n in reads_between {
                            read.extend(pin.next_chunk(&tree, n).unwrap().unwrap_or_default());
                        }
                        write(&tree, &writes);
                    }
                }
            }
            while let Some(chunk) = pin.next_chunk(&tree, 3).unwrap() {
                read.extend(chunk);
            }
            prop_assert_eq!(read, initial.into_iter().collect::<Vec<_>>());
            prop_assert!(pin.kept.is_empty());
            prop_assert_eq!(pin.bytes, 0);
        }
    }

    #[test]
    fn past_its_limit_a_pin_refuses_the_write_and_keeps_nothing_of_it() {
        let (_db, tree) = temporary_tree();
        tree.insert(b"a", b"1").unwrap();
        tree.insert(b"b", b"2").unwrap();
        let mut pin = Pin::default();
        let one = 1 + 1 + KEPT_OVERHEAD;
        let keys = [&b"a"[..]];
        assert_eq!(
            pin.keep_before(&tree, keys.into_iter(), one).unwrap(),
            Ok(())
        );
        let keys = [&b"a"[..], &b"b"[..]];
        assert_eq!(
            pin.keep_before(&tree, keys.into_iter(), one).unwrap(),
            Err(PinFull)
        );
        assert_eq!((pin.kept.len(), pin.bytes), (1, one), "b is not kept");
        // Once the reader passed a key, writing it keeps nothing.
        assert_eq!(
            pin.next_chunk(&tree, 1).unwrap(),
            Some(vec![(b"a".to_vec(), b"1".to_vec())])
        );
        assert_eq!((pin.kept.len(), pin.bytes, pin.peak_bytes()), (0, 0, one));
        let keys = [&b"a"[..]];
        assert_eq!(pin.keep_before(&tree, keys.into_iter(), 0).unwrap(), Ok(()));
        assert_eq!(
            pin.keep_before(&tree, [&b"b"[..]].into_iter(), 0).unwrap(),
            Err(PinFull)
        );
    }
}
