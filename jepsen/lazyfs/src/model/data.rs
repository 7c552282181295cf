//! One regular file's bytes, in 4 KiB pages: the durable pages (what the
//! last fsync made durable) and a dirty overlay of the pages changed since.
//! Reads see the overlay over the durable pages; fsync folds the overlay in;
//! a power cut throws it away (keeping, when torn, a prefix of the page
//! written last). Memory follows the data: absent pages read as zeros, and a
//! page is copied only when written.
//!
//! Invariant: in the live view every byte at or past `live_size` is zero
//! (truncation zeroes the tail of its boundary page and masks the pages past
//! it), so growing a file never needs to clear anything.

use std::collections::BTreeMap;

pub const PAGE: usize = 4096;
const PAGE_U64: u64 = PAGE as u64;

type Page = Box<[u8; PAGE]>;

fn zero_page() -> Page {
    Box::new([0u8; PAGE])
}

#[derive(Debug, Default, Clone)]
pub struct FileData {
    durable: BTreeMap<u64, Page>,
    durable_size: u64,
    /// Pages changed since the last fsync; `None` is a page cut off by a
    /// truncation (reads as zeros, and removes the durable page at fsync).
    dirty: BTreeMap<u64, Option<Page>>,
    live_size: u64,
    /// The page the last unsynced write ended in: what a torn write keeps a
    /// prefix of.
    last_page: Option<u64>,
    /// Bytes written or truncated away since the last fsync.
    unsynced_bytes: u64,
}

impl FileData {
    pub fn size(&self) -> u64 {
        self.live_size
    }

    /// Bytes changed since the last fsync (0 when clean).
    pub fn unsynced_bytes(&self) -> u64 {
        self.unsynced_bytes
    }

    pub fn is_dirty(&self) -> bool {
        !self.dirty.is_empty() || self.live_size != self.durable_size
    }

    /// Pages held in memory, durable and dirty.
    pub fn pages(&self) -> usize {
        self.durable.len() + self.dirty.values().filter(|p| p.is_some()).count()
    }

    fn live_page(&self, idx: u64) -> Option<&[u8; PAGE]> {
        match self.dirty.get(&idx) {
            Some(Some(p)) => Some(p),
            Some(None) => None,
            None => self.durable.get(&idx).map(|p| &**p),
        }
    }

    /// The dirty copy of page `idx`, made from the live page on first write.
    fn dirty_page(&mut self, idx: u64) -> &mut [u8; PAGE] {
        let durable = &self.durable;
        let slot = self
            .dirty
            .entry(idx)
            .or_insert_with(|| Some(durable.get(&idx).cloned().unwrap_or_else(zero_page)));
        slot.get_or_insert_with(zero_page)
    }

    /// Up to `len` bytes from `offset` in the live view (short at the end).
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = self.live_size.min(offset.saturating_add(len as u64));
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut pos = offset;
        while pos < end {
            let (idx, at) = (pos / PAGE_U64, (pos % PAGE_U64) as usize);
            let n = (PAGE - at).min((end - pos) as usize);
            match self.live_page(idx) {
                Some(p) => out.extend_from_slice(&p[at..at + n]),
                None => out.resize(out.len() + n, 0),
            }
            pos += n as u64;
        }
        out
    }

    /// Writes `data` at `offset` in the live view, growing the file.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let (idx, at) = (pos / PAGE_U64, (pos % PAGE_U64) as usize);
            let n = (PAGE - at).min(rest.len());
            self.dirty_page(idx)[at..at + n].copy_from_slice(&rest[..n]);
            self.last_page = Some(idx);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.live_size = self.live_size.max(pos);
        self.unsynced_bytes += data.len() as u64;
    }

    /// Sets the live size; shrinking zeroes what is cut off.
    pub fn truncate(&mut self, size: u64) {
        let old = self.live_size;
        self.unsynced_bytes += old.abs_diff(size);
        self.live_size = size;
        if size >= old {
            return;
        }
        let at = (size % PAGE_U64) as usize;
        let first_gone = size.div_ceil(PAGE_U64);
        if at != 0 && self.live_page(size / PAGE_U64).is_some() {
            self.dirty_page(size / PAGE_U64)[at..].fill(0);
        }
        let gone: Vec<u64> = self
            .durable
            .range(first_gone..)
            .map(|(i, _)| *i)
            .chain(self.dirty.range(first_gone..).map(|(i, _)| *i))
            .collect();
        for idx in gone {
            self.dirty.insert(idx, None);
        }
    }

    /// fsync: the live view becomes durable.
    pub fn sync(&mut self) {
        for (idx, page) in std::mem::take(&mut self.dirty) {
            match page {
                Some(p) => self.durable.insert(idx, p),
                None => self.durable.remove(&idx),
            };
        }
        self.durable_size = self.live_size;
        self.last_page = None;
        self.unsynced_bytes = 0;
    }

    /// A torn write: the first `keep` bytes (clipped to the live size) of
    /// the last unsynced page written reach the durable pages. Returns the
    /// bytes kept; 0 when there is nothing to tear.
    pub fn tear(&mut self, keep: usize) -> u64 {
        let Some(idx) = self.last_page else { return 0 };
        let Some(Some(page)) = self.dirty.get(&idx) else {
            return 0;
        };
        let start = idx * PAGE_U64;
        if start >= self.live_size {
            return 0;
        }
        let keep = keep.min(PAGE).min((self.live_size - start) as usize);
        let mut torn = self.durable.get(&idx).cloned().unwrap_or_else(zero_page);
        torn[..keep].copy_from_slice(&page[..keep]);
        self.durable.insert(idx, torn);
        self.durable_size = self.durable_size.max(start + keep as u64);
        keep as u64
    }

    /// Power cut: back to the durable pages.
    pub fn revert(&mut self) {
        self.dirty.clear();
        self.live_size = self.durable_size;
        self.last_page = None;
        self.unsynced_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &[u8]) -> FileData {
        let mut f = FileData::default();
        f.write(0, bytes);
        f
    }

    #[test]
    fn reads_see_writes_across_pages_and_holes_read_zero() {
        let mut f = FileData::default();
        f.write(PAGE as u64 - 2, b"abcd");
        f.write(3 * PAGE as u64, b"z");
        assert_eq!(f.size(), 3 * PAGE as u64 + 1);
        assert_eq!(f.read(PAGE as u64 - 3, 6), b"\0abcd\0");
        assert_eq!(f.read(2 * PAGE as u64, 3), vec![0; 3]);
        assert_eq!(f.read(3 * PAGE as u64, 100), b"z", "short at the end");
        assert!(f.read(10 * PAGE as u64, 10).is_empty());
        assert_eq!(f.pages(), 3, "the hole holds no page");
    }

    #[test]
    fn sync_makes_durable_and_revert_drops_only_what_came_after() {
        let mut f = file(b"hello");
        assert!(f.is_dirty());
        f.sync();
        assert!(!f.is_dirty());
        f.write(0, b"J");
        f.write(5, b" world");
        assert_eq!(f.read(0, 100), b"Jello world");
        assert_eq!(f.unsynced_bytes(), 7);
        f.revert();
        assert_eq!(f.read(0, 100), b"hello");
        assert_eq!(f.size(), 5);
        assert_eq!(f.unsynced_bytes(), 0);
    }

    #[test]
    fn truncate_then_grow_reads_zeros_not_old_bytes() {
        let mut f = file(&[7u8; 2 * PAGE + 10]);
        f.sync();
        f.truncate(5);
        f.truncate(3 * PAGE as u64);
        assert_eq!(f.read(0, 6), [7, 7, 7, 7, 7, 0]);
        assert!(f.read(5, 3 * PAGE).iter().all(|b| *b == 0));
        f.sync();
        assert!(f.read(5, 3 * PAGE).iter().all(|b| *b == 0));
        assert_eq!(f.durable.len(), 1, "truncated pages left the durable set");
        f.truncate(2);
        f.revert();
        assert_eq!(f.size(), 3 * PAGE as u64, "an unsynced truncate is undone");
        assert_eq!(f.read(0, 6), [7, 7, 7, 7, 7, 0]);
    }

    #[test]
    fn tear_keeps_a_prefix_of_the_last_page_written() {
        let mut f = file(b"0123456789");
        f.sync();
        f.write(10, &[b'x'; 2 * PAGE - 10]);
        assert_eq!(f.tear(100), 100, "last page is page 1");
        f.revert();
        assert_eq!(f.size(), PAGE as u64 + 100);
        let back = f.read(0, 2 * PAGE);
        assert_eq!(&back[..10], b"0123456789");
        assert!(
            back[10..PAGE].iter().all(|b| *b == 0),
            "page 0 was not torn"
        );
        assert!(back[PAGE..].iter().all(|b| *b == b'x'));
        let mut clean = file(b"ab");
        clean.sync();
        assert_eq!(clean.tear(10), 0, "nothing unsynced: nothing to tear");
    }

    #[test]
    fn tear_of_an_overwrite_keeps_the_old_tail() {
        let mut f = file(&[b'o'; 100]);
        f.sync();
        f.write(0, &[b'n'; 100]);
        assert_eq!(f.tear(30), 30);
        f.revert();
        let back = f.read(0, 200);
        assert_eq!(back.len(), 100);
        assert!(back[..30].iter().all(|b| *b == b'n'));
        assert!(back[30..].iter().all(|b| *b == b'o'));
    }
}
