//! The Raft log and vote on sled. Appends and votes are fsynced before they
//! are acknowledged; truncation and purge never leave holes: purge records
//! the purged id first, then removes entries from the front.

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
    db: Arc<sled::Db>,
    log: Arc<sled::Tree>,
    meta: Arc<sled::Tree>,
    /// Where append times and the commit index are reported.
    metrics: Arc<Metrics>,
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
    pub fn open(db: Arc<sled::Db>, metrics: Arc<Metrics>) -> Result<Self, StoreError> {
        let log = Arc::new(db.open_tree("raft_log")?);
        let meta = Arc::new(db.open_tree("raft_meta")?);
        Ok(LogStore {
            db,
            log,
            meta,
            metrics,
        })
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
        self.meta.insert(key, encode(v)).map_err(write_err)?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
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
            None => last_purged,
        };
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
            .map_err(write_err)?;
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
        KvTree::apply(&*self.log, &writes).map_err(write_err)?;
        let res = self
            .db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other);
        self.metrics.log_appended(start.elapsed());
        callback.log_io_completed(res);
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
        KvTree::apply(&*self.log, &writes).map_err(write_err)?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
    }

    /// Records the purged id, then deletes the entries up to it from the
    /// front in batches of [`PURGE_BATCH`] (a crash between them leaves a
    /// shorter prefix removed, never a hole). Entries are contiguous from
    /// the first, so their keys are computed, not read: openraft's core
    /// awaits the purge, and reading the ~10,000 entries behind a snapshot
    /// (tens of MB under load) only to take their keys was work done under
    /// it for nothing.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.meta_put(KEY_PURGED, &log_id).await?;
        let Some(first) = self.first_index() else {
            return Ok(());
        };
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || {
            let mut from = first;
            while from <= log_id.index {
                let to = from
                    .saturating_add(PURGE_BATCH)
                    .min(log_id.index.saturating_add(1));
                let mut batch = sled::Batch::default();
                for i in from..to {
                    batch.remove(&i.to_be_bytes());
                }
                log.apply_batch(batch)?;
                if to == from {
                    break;
                }
                from = to;
            }
            Ok::<_, sled::Error>(())
        })
        .await
        .map_err(write_err)?
        .map_err(write_err)
    }
}

/// Entries a purge deletes per sled batch.
const PURGE_BATCH: u64 = 1024;

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

    #[tokio::test]
    async fn a_purge_removes_exactly_the_prefix_in_batches_and_records_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(sled::open(dir.path()).unwrap());
        let mut store = LogStore::open(db, Arc::default()).unwrap();
        fill(&store, 7, 3_000);
        store.purge(entry(2_500).log_id).await.unwrap();
        assert_eq!(store.first_index(), Some(2_501));
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2_500));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3_000));
        let kept = store.try_get_log_entries(0..u64::MAX).await.unwrap();
        let want: Vec<u64> = (2_501..=3_000).collect();
        assert_eq!(
            kept.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            want
        );
        // Past the last entry: the log is empty, its last id the purged one.
        store.purge(entry(3_100).log_id).await.unwrap();
        assert_eq!(store.first_index(), None);
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|l| l.index), Some(3_100));
    }
}
