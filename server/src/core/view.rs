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

/// Net writes by key: `Some(value)` put, `None` deleted.
pub type Pending = BTreeMap<Vec<u8>, PendingValue>;

/// A key's net write in [`Pending`].
pub type PendingValue = Option<Vec<u8>>;

/// Pending writes layered over a base view. Later writes to a key replace
/// earlier ones, so the result is the net change.
///
/// A savepoint ([`Overlay::begin`]) lets one command write straight into
/// the overlay it is applied over (a batch's, a chunk of log entries')
/// and still leave nothing behind when it fails ([`Overlay::roll_back`]):
/// a journal keeps what each key held before the command's first write.
pub struct Overlay<'a, V: StateView + ?Sized> {
    base: &'a V,
    pending: Pending,
    /// Since the open savepoint, in order: each key written and what
    /// `pending` held for it before (`None`: nothing).
    journal: Vec<(Vec<u8>, Option<PendingValue>)>,
    journaling: bool,
}

impl<'a, V: StateView + ?Sized> Overlay<'a, V> {
    pub fn new(base: &'a V) -> Self {
        Overlay {
            base,
            pending: BTreeMap::new(),
            journal: Vec::new(),
            journaling: false,
        }
    }

    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.write(key, Some(value));
    }

    pub fn delete(&mut self, key: Vec<u8>) {
        self.write(key, None);
    }

    fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        if self.journaling {
            let before = self.pending.insert(key.clone(), value);
            self.journal.push((key, before));
        } else {
            self.pending.insert(key, value);
        }
    }

    /// Opens a savepoint: the writes from here on can be undone together.
    /// Savepoints do not nest.
    pub fn begin(&mut self) {
        assert!(!self.journaling, "a savepoint is already open");
        self.journaling = true;
    }

    /// Keys that `wanted` accepts, written since the savepoint and now
    /// holding a value (a key put and then deleted again does not count),
    /// in the order first written; a key may repeat.
    pub fn put_since_begin<'s>(
        &'s self,
        wanted: impl Fn(&[u8]) -> bool + 's,
    ) -> impl Iterator<Item = &'s [u8]> + 's {
        (self.journal.iter())
            .map(|(k, _)| k.as_slice())
            .filter(move |k| wanted(k) && matches!(self.pending.get(*k), Some(Some(_))))
    }

    /// Closes the savepoint, keeping its writes.
    pub fn commit(&mut self) {
        self.journal.clear();
        self.journaling = false;
    }

    /// Closes the savepoint, undoing every write since it.
    pub fn roll_back(&mut self) {
        for (key, before) in self.journal.drain(..).rev() {
            match before {
                Some(v) => self.pending.insert(key, v),
                None => self.pending.remove(&key),
            };
        }
        self.journaling = false;
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Keys written (put or deleted) so far.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// The net change, by key.
    pub fn into_pending(self) -> Pending {
        self.pending
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

/// Pending deletions a range read counts, at most, to size its first
/// page of base rows; and the smallest page it pulls after a page that
/// came back short of what it needed.
const PAGE_MIN: usize = 64;

impl<V: StateView + ?Sized> StateView for Overlay<'_, V> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        Layered::new(&self.pending, self.base).get(key)
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        Layered::new(&self.pending, self.base).range(start, end, limit)
    }
}

/// A borrowed [`Pending`] read over a base view: what [`Overlay`] reads
/// through, and how the store reads applied state not yet written to disk.
pub struct Layered<'a, V: StateView + ?Sized> {
    pending: &'a Pending,
    base: &'a V,
}

impl<'a, V: StateView + ?Sized> Layered<'a, V> {
    pub fn new(pending: &'a Pending, base: &'a V) -> Self {
        Layered { pending, base }
    }
}

impl<V: StateView + ?Sized> StateView for Layered<'_, V> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.pending.get(key) {
            Some(v) => v.clone(),
            None => self.base.get(key),
        }
    }

    /// Merges base pages with the pending writes in key order, lazily: the
    /// work is for the rows returned (plus base rows hidden by deletions),
    /// not for every pending write in the range.
    ///
    /// A page asks the base for the rows still wanted plus the pending
    /// deletions that may hide some (counted up to [`PAGE_MIN`]), so a
    /// short read, such as a job's two oldest runs when a fire trims its
    /// history, asks the base for a few rows, which the store's run heads
    /// can answer (`store::sm::RunHeads`). A page that still comes back
    /// short is followed by ones at least twice its size.
    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        use std::ops::Bound::{Excluded, Included};
        let mut out = Vec::new();
        if start >= end || limit == 0 {
            return out;
        }
        let mut pending = self
            .pending
            .range::<[u8], _>((Included(start), Excluded(end)))
            .peekable();
        let mut from = start.to_vec();
        let mut next_min = 0usize;
        'pages: loop {
            let hidden = pending
                .clone()
                .take(PAGE_MIN)
                .filter(|(_, v)| v.is_none())
                .count();
            let want = (limit - out.len()).saturating_add(hidden).max(next_min);
            next_min = want.saturating_mul(2).max(PAGE_MIN);
            let page = self.base.range(&from, end, want);
            let last_page = page.len() < want;
            for (k, v) in page {
                // Pending writes before this base row come first.
                while let Some((pk, pv)) = pending.next_if(|(pk, _)| pk.as_slice() < k.as_slice()) {
                    if let Some(pv) = pv {
                        out.push((pk.clone(), pv.clone()));
                    }
                    if out.len() == limit {
                        return out;
                    }
                }
                // A pending write to the same key replaces or hides it.
                match pending.next_if(|(pk, _)| pk.as_slice() == k.as_slice()) {
                    Some((_, Some(pv))) => out.push((k.clone(), pv.clone())),
                    Some((_, None)) => {}
                    None => out.push((k.clone(), v)),
                }
                if out.len() == limit {
                    return out;
                }
                from = k;
                from.push(0);
            }
            if last_page {
                break 'pages;
            }
        }
        for (pk, pv) in pending {
            if let Some(pv) = pv {
                out.push((pk.clone(), pv.clone()));
                if out.len() == limit {
                    break;
                }
            }
        }
        out
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

    /// A savepoint undone leaves the overlay as it was before it: a key it
    /// overwrote gets its earlier pending value back, a key it deleted its
    /// earlier put, and keys it wrote first are gone again, however often
    /// each was written inside it.
    #[test]
    fn a_rolled_back_savepoint_leaves_the_overlay_as_it_was() {
        let mut base = MemView::default();
        base.write(&[Write::Put(b"base".to_vec(), b"0".to_vec())]);
        let mut o = Overlay::new(&base);
        o.put(b"a".to_vec(), b"1".to_vec());
        o.delete(b"gone".to_vec());
        let before = o.pending.clone();
        o.begin();
        o.put(b"a".to_vec(), b"2".to_vec());
        o.put(b"a".to_vec(), b"3".to_vec());
        o.put(b"gone".to_vec(), b"back".to_vec());
        o.delete(b"base".to_vec());
        o.put(b"new".to_vec(), b"4".to_vec());
        o.delete(b"new".to_vec());
        o.put(b"dedup".to_vec(), b"5".to_vec());
        let put: Vec<&[u8]> = o.put_since_begin(|k| k != b"a").collect();
        assert_eq!(put, vec![b"gone".as_slice(), b"dedup".as_slice()]);
        assert_eq!(o.get(b"base"), None);
        o.roll_back();
        assert_eq!(o.pending, before);
        assert_eq!(o.get(b"base"), Some(b"0".to_vec()));
        assert_eq!(o.put_since_begin(|_| true).count(), 0);

        // Committed, the writes stay and the next savepoint starts empty.
        o.begin();
        o.put(b"a".to_vec(), b"6".to_vec());
        o.commit();
        o.begin();
        o.put(b"b".to_vec(), b"7".to_vec());
        o.roll_back();
        assert_eq!(o.get(b"a"), Some(b"6".to_vec()));
        assert_eq!(o.get(b"b"), None);
    }

    /// Counts the base rows a range read pulls.
    struct Counting {
        base: MemView,
        rows: std::cell::Cell<usize>,
    }

    impl StateView for Counting {
        fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
            self.base.get(key)
        }

        fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
            let rows = self.base.range(start, end, limit);
            self.rows.set(self.rows.get() + rows.len());
            rows
        }
    }

    fn key(i: u32) -> Vec<u8> {
        [b"k".as_slice(), &i.to_be_bytes()].concat()
    }

    /// Keys 0..1000 (`key`), each holding `[1]`, counting the rows read.
    fn thousand_rows() -> Counting {
        let mut base = MemView::default();
        base.write(
            &(0..1000)
                .map(|i| Write::Put(key(i), vec![1]))
                .collect::<Vec<_>>(),
        );
        Counting {
            base,
            rows: Default::default(),
        }
    }

    #[test]
    fn a_short_range_read_does_work_for_its_limit_not_for_all_pending_writes() {
        let base = thousand_rows();
        let mut o = Overlay::new(&base);
        for i in 1000..3000 {
            o.put(key(i), vec![2]);
        }
        o.delete(key(0));
        o.delete(key(1));
        let got = o.range(b"k", b"l", 2);
        assert_eq!(got, vec![(key(2), vec![1]), (key(3), vec![1])]);
        assert_eq!(
            base.rows.get(),
            4,
            "2 rows wanted and 2 hidden by deletions: read {} base rows",
            base.rows.get()
        );
        // Deletions, pending puts and base rows still merge in key order.
        let all = o.range(b"k", b"l", usize::MAX);
        assert_eq!(all.len(), 2998);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(all[997], (key(999), vec![1]));
        assert_eq!(all[998], (key(1000), vec![2]));
        assert_eq!(o.range(b"k", b"l", 0), vec![]);
    }

    #[test]
    fn more_deletions_than_a_first_page_counts_are_read_past_in_growing_pages() {
        let base = thousand_rows();
        let mut o = Overlay::new(&base);
        // Far more than PAGE_MIN hidden before the first row left.
        for i in 0..300 {
            o.delete(key(i));
        }
        o.put(key(301), vec![2]);
        let got = o.range(b"k", b"l", 3);
        assert_eq!(
            got,
            vec![
                (key(300), vec![1]),
                (key(301), vec![2]),
                (key(302), vec![1])
            ]
        );
        // Pages of 3 + 64, then at least twice the last: 67, 134, 268.
        assert!(
            base.rows.get() <= 67 + 134 + 268,
            "read {} base rows",
            base.rows.get()
        );
        let all = o.range(b"k", b"l", usize::MAX);
        assert_eq!(all.len(), 700);
        assert_eq!(all[0].0, key(300));
    }
}
