//! The Raft log and vote on sled. Appends, votes, truncations and the purge
//! marker are durable (`store::durable`: sled's flush, then `fdatasync`)
//! before openraft is told; an append returns once written, and its
//! callback fires from the sync thread, so appends pipeline into one sync; truncation and purge never leave holes: purge records
//! the purged id first, then removes entries from the front, off openraft's
//! core (reads never return an entry at or below the purged id).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError};

use super::kv::KvTree;
use super::StoreError;
use crate::core::codec::{decode, encode};
use crate::core::Write;
use crate::metrics::Metrics;
use crate::raft::{Entry, LogId, StorageError, TypeConfig, Vote};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: Arc<super::durable::Db>,
    log: Arc<sled::Tree>,
    meta: Arc<sled::Tree>,
    /// Where append times and the commit index are reported.
    metrics: Arc<Metrics>,
    /// The purged index plus one (0: nothing purged): reads start there,
    /// whatever entries below it are still being removed.
    purged_below: Arc<std::sync::atomic::AtomicU64>,
    /// Held by whoever removes purged entries, one removal at a time.
    removing: Arc<std::sync::Mutex<()>>,
}

fn io_err(
    subject: ErrorSubject<u64>,
    verb: ErrorVerb,
    e: impl std::error::Error + 'static,
) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::new(&e)).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Read, e)
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Write, e)
}

impl LogStore {
    pub fn open(db: Arc<super::durable::Db>, metrics: Arc<Metrics>) -> Result<Self, StoreError> {
        let log = Arc::new(db.open_tree("raft_log")?);
        let meta = Arc::new(db.open_tree("raft_meta")?);
        let store = LogStore {
            db,
            log,
            meta,
            metrics,
            purged_below: Arc::default(),
            removing: Arc::default(),
        };
        let purged: Option<LogId> = store
            .meta_get(KEY_PURGED)
            .map_err(|e| StoreError::Corrupt(format!("last purged id: {e}")))?;
        let below = purged.map_or(0, |l| l.index.saturating_add(1));
        store
            .purged_below
            .store(below, std::sync::atomic::Ordering::Release);
        Ok(store)
    }

    fn meta_get<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match KvTree::get(&*self.meta, key).map_err(read_err)? {
            None => Ok(None),
            Some(b) => decode(&b).map(Some).map_err(read_err),
        }
    }

    async fn meta_put<T: serde::Serialize>(&self, key: &[u8], v: &T) -> Result<(), StorageError> {
        let written = self.meta.insert(key, encode(v));
        self.wrote(written, "writing the Raft metadata")?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
    }

    /// A sled write failed: sled refuses every write after it, so the
    /// store is lost to this process; the node stops (`store::durable`).
    fn lost(&self, e: sled::Error, what: &str) -> StorageError {
        self.db.durable().write_failed(what, &e);
        write_err(e)
    }

    fn wrote<T>(&self, r: Result<T, sled::Error>, what: &str) -> Result<T, StorageError> {
        r.map_err(|e| self.lost(e, what))
    }

    /// Index of the first entry still in the log (for metrics and tests).
    pub fn first_index(&self) -> Option<u64> {
        KvTree::first(&*self.log)
            .ok()
            .flatten()
            .and_then(|(k, _)| Some(u64::from_be_bytes(k.try_into().ok()?)))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let start = start.max(self.purged_below.load(std::sync::atomic::Ordering::Acquire));
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let rows = KvTree::range(
            &*self.log,
            &start.to_be_bytes(),
            &end.to_be_bytes(),
            usize::MAX,
        )
        .map_err(read_err)?;
        rows.iter()
            .map(|(_, v)| decode::<Entry>(v).map_err(read_err))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.meta_get(KEY_PURGED)?;
        let last = match KvTree::last(&*self.log).map_err(read_err)? {
            Some((_, v)) => Some(decode::<Entry>(&v).map_err(read_err)?.log_id),
            None => None,
        };
        // Never below the purged id: with no entry left, or only entries
        // at or below it still being removed.
        let last = std::cmp::max_by_key(last_purged, last, |l| l.map(|l| l.index));
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.meta_put(KEY_VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.meta_get(KEY_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.metrics
            .set_commit_index(committed.map_or(0, |c| c.index));
        // Not fsynced on its own: it is an optimisation for restart, and rides the next flush.
        self.meta
            .insert(KEY_COMMITTED, encode(&committed))
            .map_err(|e| self.lost(e, "writing the committed index"))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.meta_get::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let start = std::time::Instant::now();
        let entries: Vec<Entry> = entries.into_iter().collect();
        if let Some(n) = crate::failpoint::value("stall-log-after") {
            if entries.iter().any(|e| e.log_id.index > n) {
                tracing::error!("failpoint: log appends past index {n} never complete");
                std::future::pending::<()>().await;
            }
        }
        let writes: Vec<Write> = entries
            .iter()
            .map(|e| Write::Put(e.log_id.index.to_be_bytes().to_vec(), encode(e)))
            .collect();
        KvTree::apply(&*self.log, &writes)
            .map_err(|e| self.lost(e, "appending to the Raft log"))?;
        // Answered from the sync thread once durable, so openraft can send
        // the next entries meanwhile: one sync covers all appended by then.
        let metrics = self.metrics.clone();
        self.db.durable().sync_then(move |res| {
            metrics.log_appended(start.elapsed());
            callback.log_io_completed(res.map_err(std::io::Error::other));
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let rows = KvTree::range(
            &*self.log,
            &log_id.index.to_be_bytes(),
            &u64::MAX.to_be_bytes(),
            usize::MAX,
        )
        .map_err(read_err)?;
        let writes: Vec<Write> = rows.into_iter().map(|(k, _)| Write::Delete(k)).collect();
        KvTree::apply(&*self.log, &writes).map_err(|e| self.lost(e, "truncating the Raft log"))?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
    }

    /// Records the purged id (reads stop returning the entries up to it),
    /// then removes those entries from the front on a blocking thread that
    /// this does not wait for, one at a time in key order (a crash leaves a
    /// shorter prefix removed, never a hole; the next purge removes the
    /// rest). Entries are contiguous from the first, so their keys are
    /// computed, not read.
    ///
    /// openraft's core awaits the purge, and used to wait for the removal:
    /// at ten million timers about 9,000 entries of 40 KB after each
    /// snapshot, in sled batches that hold sled's write lock, so the node
    /// appended, applied and sent nothing for about 3 s (BENCHMARKS,
    /// twenty-fifth pass).
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.meta_put(KEY_PURGED, &log_id).await?;
        let below = log_id.index.saturating_add(1);
        self.purged_below
            .fetch_max(below, std::sync::atomic::Ordering::AcqRel);
        let store = self.clone();
        let removing = tokio::task::spawn_blocking(move || store.remove_purged(log_id.index));
        drop(removing); // not awaited
        Ok(())
    }
}

impl LogStore {
    /// Removes the entries up to `upto` (purged), from the first one on.
    fn remove_purged(&self, upto: u64) {
        let _one = self.removing.lock().unwrap_or_else(|e| e.into_inner());
        let Some(first) = self.first_index() else {
            return;
        };
        for i in first..=upto {
            if let Err(e) = self.log.remove(i.to_be_bytes()) {
                tracing::error!("removing purged log entry {i}: {e}; the next purge tries again");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(i: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Blank,
        }
    }

    /// Entries `from..=to` written straight into the log tree.
    fn fill(store: &LogStore, from: u64, to: u64) {
        let writes: Vec<Write> = (from..=to)
            .map(|i| Write::Put(i.to_be_bytes().to_vec(), encode(&entry(i))))
            .collect();
        KvTree::apply(&*store.log, &writes).unwrap();
    }

    /// Waits until the log's first entry is `want` (the removal of purged
    /// entries goes on after the purge returns).
    async fn first_becomes(store: &LogStore, want: Option<u64>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while store.first_index() != want {
            assert!(
                std::time::Instant::now() < deadline,
                "first entry stays {:?}",
                store.first_index()
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    #[allow(clippy::await_holding_lock)] // the test holds a lock as its owner would
    #[tokio::test]
    async fn a_purge_records_the_prefix_and_removes_exactly_it_after_returning() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(
            super::super::durable::Db::open(
                dir.path(),
                1 << 20,
                Arc::default(),
                Arc::new(|e| panic!("{e}")),
            )
            .unwrap(),
        );
        let mut store = LogStore::open(db.clone(), Arc::default()).unwrap();
        fill(&store, 7, 3_000);
        let hold = store.removing.clone();
        // Held across awaits on purpose: as a removal under way holds it.
        let removal = hold.lock().unwrap();
        store.purge(entry(2_500).log_id).await.unwrap();
        // Answered before anything is removed, and reads see the purge.
        assert_eq!(store.first_index(), Some(7), "nothing removed yet");
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2_500));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3_000));
        let want: Vec<u64> = (2_501..=3_000).collect();
        let kept = store.try_get_log_entries(0..u64::MAX).await.unwrap();
        assert_eq!(
            kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            want
        );
        // Past the last entry: the log's last id is the purged one, though
        // entries below it are still there.
        store.purge(entry(3_100).log_id).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3_100));
        assert!(store
            .try_get_log_entries(0..u64::MAX)
            .await
            .unwrap()
            .is_empty());
        drop(removal);
        first_becomes(&store, None).await;
        // Reopened, reads still start after the purged id.
        fill(&store, 3_000, 3_200); // as after a crash mid-removal
        drop(store);
        let mut reopened = LogStore::open(db, Arc::default()).unwrap();
        let kept = reopened.try_get_log_entries(0..u64::MAX).await.unwrap();
        let want: Vec<u64> = (3_101..=3_200).collect();
        assert_eq!(
            kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            want
        );
    }
}
