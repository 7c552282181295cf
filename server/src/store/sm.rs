//! The replicated state machine on sled. Each batch of log entries is
//! applied through the pure core and written in one atomic sled batch
//! together with `last_applied` and the membership. Snapshots and digests
//! are taken under the apply lock, so they are a point-in-time view at
//! `last_applied`.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, Mutex};

use super::kv::{KvTree, TreeView};
use super::StoreError;
use crate::core::codec::{decode, encode};
use crate::core::{self, keys, Effect, Job, Overlay, Response, Run, RunId, StateView, WheelKey};
use crate::raft::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// Effects of one applied batch, for the leader's tasks.
pub type EffectBatch = Arc<Vec<Effect>>;

pub struct Options {
    /// Capacity of the effect channel; a lagging leader task resyncs from state.
    pub effect_capacity: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            effect_capacity: 4096,
        }
    }
}

#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<sled::Db>,
    tree: sled::Tree,
    snapshot_path: PathBuf,
    apply_lock: Mutex<()>,
    effects: broadcast::Sender<EffectBatch>,
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    version: u32,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn sm_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::new(&e)).into()
}

fn snap_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, openraft::AnyError::new(&e)).into()
}

impl StateMachine {
    pub fn open(db: Arc<sled::Db>, dir: &Path, opts: Options) -> Result<Self, StoreError> {
        let tree = db.open_tree("state")?;
        match KvTree::get(&tree, keys::META_VERSION)? {
            None => {
                tree.insert(keys::META_VERSION, encode(&keys::STATE_VERSION))?;
            }
            Some(b) => {
                let found: u32 = decode(&b).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                if found != keys::STATE_VERSION {
                    let dir = dir.display().to_string();
                    return Err(StoreError::Version {
                        dir,
                        found,
                        expected: keys::STATE_VERSION,
                    });
                }
            }
        }
        let (effects, _) = broadcast::channel(opts.effect_capacity);
        let snapshot_path = dir.join("snapshot.bin");
        let inner = Inner {
            db,
            tree,
            snapshot_path,
            apply_lock: Mutex::new(()),
            effects,
        };
        Ok(StateMachine {
            inner: Arc::new(inner),
        })
    }

    pub fn subscribe(&self) -> broadcast::Receiver<EffectBatch> {
        self.inner.effects.subscribe()
    }

    pub fn view(&self) -> TreeView<'_> {
        TreeView(&self.inner.tree)
    }

    fn meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Option<T> {
        self.view().get(key).and_then(|b| decode(&b).ok())
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.meta(keys::META_LAST_APPLIED)
    }

    pub fn membership(&self) -> StoredMembership {
        self.meta(keys::META_MEMBERSHIP).unwrap_or_default()
    }

    /// The largest cluster time any applied command carried.
    pub fn state_time(&self) -> i64 {
        core::apply::state_time(&self.view())
    }

    pub fn get_job(&self, id: &str) -> Option<Job> {
        self.meta(&keys::job(id))
    }

    /// Jobs with ids after `after`, in id order.
    pub fn list_jobs(&self, after: &str, limit: usize) -> Vec<Job> {
        let mut start = keys::job(after);
        if !after.is_empty() {
            start.push(0);
        }
        let rows = self.view().range(&start, &[keys::JOB + 1], limit);
        rows.iter().filter_map(|(_, v)| decode(v).ok()).collect()
    }

    pub fn get_run(&self, id: &RunId) -> Option<Run> {
        self.meta(&keys::run(id))
    }

    /// Runs of `job` scheduled strictly after `after_ms`, in scheduled order.
    pub fn list_runs(&self, job: &str, after_ms: i64, limit: usize) -> Vec<Run> {
        if after_ms == i64::MAX {
            return Vec::new();
        }
        let start = keys::run(&RunId::new(job, after_ms.saturating_add(1)));
        let mut end = keys::runs_of(job);
        end.extend_from_slice(&[0xff; 9]);
        let rows = self.view().range(&start, &end, limit);
        rows.iter().filter_map(|(_, v)| decode(v).ok()).collect()
    }

    /// Wheel keys due in `(from_ms, upto_ms]` in key order, or, with `after`,
    /// keys strictly after that key and due at or before `upto_ms`.
    pub fn wheel_range(
        &self,
        after: Option<&WheelKey>,
        from_ms: i64,
        upto_ms: i64,
        limit: usize,
    ) -> Vec<WheelKey> {
        let start = match after {
            Some(k) => {
                let mut s = keys::wheel(k);
                s.push(0);
                s
            }
            None if from_ms == i64::MIN => vec![keys::WHEEL],
            None => keys::wheel_upto(from_ms),
        };
        let rows = self.view().range(&start, &keys::wheel_upto(upto_ms), limit);
        rows.iter()
            .filter_map(|(k, _)| keys::wheel_from(k))
            .collect()
    }

    /// Every run that is not terminal (bounded by the number of active runs).
    pub fn active_runs(&self, limit: usize) -> Vec<(RunId, core::ActiveRun)> {
        let rows = self
            .view()
            .range(&[keys::ACTIVE], &[keys::ACTIVE + 1], limit);
        rows.iter()
            .filter_map(|(k, v)| Some((keys::run_id_from(k)?, decode(v).ok()?)))
            .collect()
    }

    /// SHA-256 over the whole replicated state, taken under the apply lock.
    pub async fn digest(&self) -> (u64, String) {
        let _g = self.inner.apply_lock.lock().await;
        let mut h = Sha256::new();
        let res = self.inner.tree.for_each(&mut |k, v| {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k);
            h.update((v.len() as u64).to_be_bytes());
            h.update(v);
        });
        if let Err(e) = res {
            return (0, format!("error: {e}"));
        }
        let idx = self.last_applied().map(|l| l.index).unwrap_or(0);
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        (idx, hex)
    }

    fn apply_entries(
        &self,
        entries: Vec<Entry>,
    ) -> Result<(Vec<Response>, Vec<Effect>), StorageError> {
        let base = TreeView(&self.inner.tree);
        let mut overlay = Overlay::new(&base);
        let mut responses = Vec::with_capacity(entries.len());
        let mut effects = Vec::new();
        let mut last = None;
        for entry in entries {
            last = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::Empty),
                EntryPayload::Membership(m) => {
                    let stored = StoredMembership::new(Some(entry.log_id), m);
                    overlay.put(keys::META_MEMBERSHIP.to_vec(), encode(&stored));
                    responses.push(Response::Empty);
                }
                EntryPayload::Normal(cmd) => {
                    let applied = core::apply(&overlay, &cmd);
                    for w in applied.writes {
                        match w {
                            core::Write::Put(k, v) => overlay.put(k, v),
                            core::Write::Delete(k) => overlay.delete(k),
                        }
                    }
                    effects.extend(applied.effects);
                    responses.push(applied.response);
                }
            }
        }
        if let Some(last) = last {
            overlay.put(keys::META_LAST_APPLIED.to_vec(), encode(&last));
        }
        self.inner
            .tree
            .apply(&overlay.into_writes())
            .map_err(sm_err)?;
        Ok((responses, effects))
    }

    async fn write_snapshot_file(
        &self,
        meta: &SnapshotMeta,
        data: &[u8],
    ) -> Result<(), StorageError> {
        let tmp = self.inner.snapshot_path.with_extension("tmp");
        let bytes = encode(&(meta.clone(), data.to_vec()));
        let path = self.inner.snapshot_path.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write as _;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })
        .await
        .map_err(snap_err)?
        .map_err(snap_err)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (meta, data) = {
            let _g = self.inner.apply_lock.lock().await;
            // State must be durable before the log behind it may be purged.
            self.inner.db.flush_async().await.map_err(snap_err)?;
            let mut pairs = Vec::new();
            self.inner
                .tree
                .for_each(&mut |k, v| pairs.push((k.to_vec(), v.to_vec())))
                .map_err(snap_err)?;
            let last = self.last_applied();
            let membership = self.membership();
            let id = match last {
                Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, pairs.len()),
                None => format!("0-0-{}", pairs.len()),
            };
            let meta = SnapshotMeta {
                last_log_id: last,
                last_membership: membership,
                snapshot_id: id,
            };
            (
                meta,
                encode(&SnapshotFile {
                    version: keys::STATE_VERSION,
                    pairs,
                }),
            )
        };
        self.write_snapshot_file(&meta, &data).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied(), self.membership()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let (responses, effects) = {
            let _g = self.inner.apply_lock.lock().await;
            self.apply_entries(entries)?
        };
        if !effects.is_empty() {
            // No receiver (not leader) is fine: followers have no leader work.
            let _ = self.inner.effects.send(Arc::new(effects));
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let file: SnapshotFile = decode(&data).map_err(snap_err)?;
        if file.version != keys::STATE_VERSION {
            let e = StoreError::Corrupt(format!("snapshot format version {}", file.version));
            return Err(snap_err(e));
        }
        {
            let _g = self.inner.apply_lock.lock().await;
            self.inner.tree.clear().map_err(snap_err)?;
            let writes: Vec<core::Write> = file
                .pairs
                .into_iter()
                .map(|(k, v)| core::Write::Put(k, v))
                .collect();
            self.inner.tree.apply(&writes).map_err(snap_err)?;
            self.inner.db.flush_async().await.map_err(snap_err)?;
        }
        self.write_snapshot_file(meta, &data).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let bytes = match tokio::fs::read(&self.inner.snapshot_path).await {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(snap_err(e)),
        };
        let (meta, data): (SnapshotMeta, Vec<u8>) = decode(&bytes).map_err(snap_err)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}
