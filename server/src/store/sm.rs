//! The replicated state machine on sled. Each batch of log entries is
//! applied through the pure core and written in one atomic sled batch
//! together with `last_applied` and the membership. Snapshots and digests
//! are taken under the apply lock, so they are a point-in-time view at
//! `last_applied`; snapshot files are streamed (`snapfile`), never held
//! whole in memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, Mutex};

use super::kv::{KvTree, TreeView};
use super::snapfile;
use super::StoreError;
use crate::core::codec::FormatError;
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
    /// Where apply times are observed.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            effect_capacity: 4096,
            metrics: Arc::default(),
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
    metrics: Arc<crate::metrics::Metrics>,
    /// Why this node stopped applying (an entry or snapshot it does not
    /// read), for `LocalStatus`: Raft stops there, the process serves on.
    refusal: std::sync::Mutex<Option<String>>,
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
        let snapshot_path = dir.join("snapshot.bin");
        if KvTree::get(&tree, keys::META_RESTORING)?.is_some() {
            tracing::warn!("a snapshot install was interrupted; doing it again");
            finish_install(&tree, &snapshot_path.with_extension("recv"), &snapshot_path)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        }
        if let Some(before) = record_tzdata(&db.open_tree(LOCAL_TREE)?)? {
            tracing::error!(
                before = %before,
                now = core::schedule::TZDATA_VERSION,
                "this node's IANA tzdata changed since the data directory was last opened: \
                 replicas with different tzdata may compute different cron fire times; \
                 run the same build on every node"
            );
        }
        let (effects, _) = broadcast::channel(opts.effect_capacity);
        let inner = Inner {
            db,
            tree,
            snapshot_path,
            apply_lock: Mutex::new(()),
            effects,
            metrics: opts.metrics,
            refusal: std::sync::Mutex::default(),
        };
        Ok(StateMachine {
            inner: Arc::new(inner),
        })
    }

    /// Applies `cmd` straight to the store, outside Raft. Only for preparing
    /// a data directory that no node serves yet (`kairos restore`): what it
    /// writes is in no log, so every node of the new cluster must be
    /// prepared from the same file (bootstrap compares their digests).
    pub fn apply_offline(&self, cmd: &core::Command) -> Result<Response, StoreError> {
        let applied = core::apply(&TreeView(&self.inner.tree), cmd);
        self.inner.tree.apply(&applied.writes)?;
        self.inner.db.flush()?;
        Ok(applied.response)
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

    /// The cluster's active log format, as far as this node applied.
    pub fn log_format(&self) -> u32 {
        core::query::log_format(&self.view())
    }

    /// Why this node stopped applying, if it met something it does not read.
    pub fn refusal(&self) -> Option<String> {
        let r = self.inner.refusal.lock().unwrap_or_else(|e| e.into_inner());
        r.clone()
    }

    fn refuse(&self, why: String) {
        tracing::error!(
            "{why}; this node applies nothing more until it runs a binary that reads it"
        );
        let mut r = self.inner.refusal.lock().unwrap_or_else(|e| e.into_inner());
        *r = Some(why);
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

    /// The token whose secret hashes to `hash` (lowercase hex SHA-256).
    pub fn token_by_hash(&self, hash: &str) -> Option<core::Token> {
        let name: String = self.meta(&keys::token_hash(hash))?;
        self.meta(&keys::token(&name))
    }

    /// Whether a `Housekeep` at `now_ms` would find work.
    pub fn housekeeping_due(&self, now_ms: i64) -> bool {
        core::query::housekeeping_due(&self.view(), now_ms)
    }

    /// The file holding the current snapshot (`snapshot.bin`).
    pub fn snapshot_file(&self) -> std::path::PathBuf {
        self.inner.snapshot_path.clone()
    }

    /// The revision records of job id `job`, oldest first.
    pub fn job_history(&self, job: &str) -> Vec<core::JobRevision> {
        let prefix = keys::job_history_prefix(job);
        let end = keys::prefix_end(&prefix);
        let rows = self
            .view()
            .range(&prefix, &end, core::limits::JOB_REVISIONS_MAX + 2);
        rows.iter().filter_map(|(_, v)| decode(v).ok()).collect()
    }

    /// Every token, by name (at most `limits::TOKENS_MAX` exist).
    pub fn list_tokens(&self) -> Vec<core::Token> {
        let rows =
            (self.view()).range(&[keys::TOKEN], &[keys::TOKEN + 1], core::limits::TOKENS_MAX);
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
    /// State, attempt and worker come from the run record: an `Assign`
    /// updates only the record, not the active-index entry.
    pub fn active_runs(&self, limit: usize) -> Vec<(RunId, core::ActiveRun)> {
        self.active_runs_after(None, limit)
    }

    /// Up to `limit` active runs in key order, starting after `after` (or
    /// at the first); how the leader pages overflowed attempts back in.
    pub fn active_runs_after(
        &self,
        after: Option<&RunId>,
        limit: usize,
    ) -> Vec<(RunId, core::ActiveRun)> {
        let start = match after {
            Some(run) => {
                let mut k = keys::active(run);
                k.push(0);
                k
            }
            None => vec![keys::ACTIVE],
        };
        let rows = self.view().range(&start, &[keys::ACTIVE + 1], limit);
        rows.iter()
            .filter_map(|(k, v)| {
                let id = keys::run_id_from(k)?;
                let mut a: core::ActiveRun = decode(v).ok()?;
                if let Some(run) = self.get_run(&id) {
                    a.state = run.state;
                    a.attempt = run.attempt;
                    a.worker = run.worker;
                }
                Some((id, a))
            })
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
        let mut crash = false;
        for entry in entries {
            last = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::Empty),
                EntryPayload::Membership(m) => {
                    crash |=
                        m.get_joint_config().len() > 1 && crate::failpoint::on("crash-on-joint");
                    let stored = StoredMembership::new(Some(entry.log_id), m);
                    overlay.put(keys::META_MEMBERSHIP.to_vec(), encode(&stored));
                    responses.push(Response::Empty);
                }
                EntryPayload::Normal(logged) => {
                    let cmd = logged.command(entry.log_id.index).map_err(|e| {
                        // Nothing of this batch is written: the node stops
                        // applying here, and again at this entry after a restart.
                        self.refuse(format!("refusing to apply: {e}"));
                        StorageIOError::apply(entry.log_id, openraft::AnyError::new(&e))
                    })?;
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
        if crash {
            crash_now("applied a joint configuration");
        }
        Ok((responses, effects))
    }
}

/// The `crash-on-joint` failpoint (`crate::failpoint`): the leader applies
/// the joint entry before it proposes the second one, so a change is cut
/// between its two steps exactly.
fn crash_now(why: &str) {
    tracing::error!("failpoint: SIGKILL after it {why}");
    let me = rustix::process::getpid();
    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Streams the state to `snapshot.tmp` under the apply lock (a
    /// point-in-time view), then syncs it and renames it over `snapshot.bin`.
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let inner = self.inner.clone();
        let tmp = inner.snapshot_path.with_extension("tmp");
        let (writer, meta) = {
            let _g = inner.apply_lock.lock().await;
            // State must be durable before the log behind it may be purged.
            inner.db.flush_async().await.map_err(snap_err)?;
            let last = self.last_applied();
            let meta = SnapshotMeta {
                snapshot_id: match &last {
                    Some(l) => format!("{}-{}", l.leader_id.term, l.index),
                    None => "0-0".into(),
                },
                last_log_id: last,
                last_membership: self.membership(),
            };
            let (tree, tmp) = (inner.tree.clone(), tmp.clone());
            blocking(move || {
                let mut w = snapfile::Writer::create(&tmp, keys::STATE_VERSION, &meta)?;
                for pair in tree.iter() {
                    let (k, v) = pair.map_err(std::io::Error::other)?;
                    w.pair(&k, &v)?;
                }
                Ok((w, meta))
            })
            .await?
        };
        let path = inner.snapshot_path.clone();
        blocking(move || {
            writer.finish()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&path)
        })
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(self.open_snapshot_data().await?),
        })
    }
}

/// Node-local metadata, outside the replicated state (so outside its
/// snapshots and digest): the tzdata version of the binary.
const LOCAL_TREE: &str = "local";

/// Stores this binary's tzdata version; returns the one stored before if it
/// differs (a node that upgraded its tzdata).
fn record_tzdata(local: &sled::Tree) -> Result<Option<String>, StoreError> {
    let now = core::schedule::TZDATA_VERSION;
    let before =
        KvTree::get(local, keys::META_TZDATA)?.map(|b| String::from_utf8_lossy(&b).into_owned());
    if before.as_deref() != Some(now) {
        local.insert(keys::META_TZDATA, now.as_bytes())?;
    }
    Ok(before.filter(|b| b != now))
}

/// Runs blocking file and tree work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(snap_err)?
        .map_err(snap_err)
}

/// Makes a rename in the file's directory durable.
fn sync_dir(file: &Path) -> std::io::Result<()> {
    match file.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Pairs written per sled batch while a snapshot is loaded.
const RESTORE_BATCH: usize = 4096;

/// Installs a received snapshot file that [`snapfile::verify`] accepted.
/// A marker key is written first and removed last: a node that crashes
/// midway finds it on open and finishes the install ([`finish_install`]).
/// `snapshot.bin` stays the previous snapshot until the state holds the new one.
fn install(tree: &sled::Tree, recv: &Path, current: &Path) -> std::io::Result<()> {
    let io = std::io::Error::other;
    tree.insert(keys::META_RESTORING, &[][..]).map_err(io)?;
    tree.flush().map_err(io)?;
    finish_install(tree, recv, current)
}

/// Loads the file being installed (still `recv`, or already renamed to
/// `current`), makes it the current snapshot and removes the marker.
fn finish_install(tree: &sled::Tree, recv: &Path, current: &Path) -> std::io::Result<()> {
    let io = std::io::Error::other;
    let renamed = !recv.try_exists()?;
    let source = if renamed { current } else { recv };
    load(tree, source)?;
    if !renamed {
        std::fs::rename(recv, current)?;
        sync_dir(current)?;
    }
    tree.remove(keys::META_RESTORING).map_err(io)?;
    tree.flush().map_err(io)?;
    Ok(())
}

/// Replaces the whole state but the install marker with the pairs of a
/// snapshot file, in bounded batches. The file is verified first (a second
/// time during install: the check is cheap next to the load, and the disk
/// may have changed it).
fn load(tree: &sled::Tree, path: &Path) -> std::io::Result<()> {
    snapfile::verify(path)?;
    let io = std::io::Error::other;
    // Delete everything but the marker, in bounded batches.
    loop {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for k in tree.iter().keys() {
            let k = k.map_err(io)?;
            if &*k != keys::META_RESTORING {
                batch.remove(k);
                n += 1;
            }
            if n == RESTORE_BATCH {
                break;
            }
        }
        if n == 0 {
            break;
        }
        tree.apply_batch(batch).map_err(io)?;
    }
    let mut reader = snapfile::Reader::open(path)?;
    let mut batch = sled::Batch::default();
    let mut n = 0;
    while let Some((k, v)) = reader.next_pair()? {
        batch.insert(k, v);
        n += 1;
        if n == RESTORE_BATCH {
            tree.apply_batch(std::mem::take(&mut batch)).map_err(io)?;
            n = 0;
        }
    }
    tree.apply_batch(batch).map_err(io)?;
    tree.flush().map_err(io)?;
    Ok(())
}

impl StateMachine {
    async fn open_snapshot_data(&self) -> Result<tokio::fs::File, StorageError> {
        tokio::fs::File::open(&self.inner.snapshot_path)
            .await
            .map_err(snap_err)
    }

    fn receive_path(&self) -> PathBuf {
        self.inner.snapshot_path.with_extension("recv")
    }

    /// Makes `snapshot.recv` hold the data handed to `install_snapshot`, durably.
    /// Normally that is the file [`begin_receiving_snapshot`] opened, which
    /// openraft filled chunk by chunk; but the data is whatever handle the
    /// caller passes (openraft's storage suite passes the leader's own
    /// snapshot file), so any other file is copied in from its start.
    ///
    /// [`begin_receiving_snapshot`]: RaftStateMachine::begin_receiving_snapshot
    async fn received_file(&self, snapshot: Box<tokio::fs::File>) -> Result<PathBuf, StorageError> {
        use std::os::unix::fs::MetadataExt;
        use tokio::io::AsyncSeekExt;
        let recv = self.receive_path();
        let given = snapshot.metadata().await.map_err(snap_err)?;
        let is_recv = match tokio::fs::metadata(&recv).await {
            Ok(m) => (m.dev(), m.ino()) == (given.dev(), given.ino()),
            Err(_) => false,
        };
        let mut src = *snapshot;
        if is_recv {
            src.sync_all().await.map_err(snap_err)?;
            return Ok(recv);
        }
        src.seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(snap_err)?;
        let mut dst = tokio::fs::File::create(&recv).await.map_err(snap_err)?;
        tokio::io::copy(&mut src, &mut dst)
            .await
            .map_err(snap_err)?;
        dst.sync_all().await.map_err(snap_err)?;
        Ok(recv)
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
            let start = std::time::Instant::now();
            let applied = self.apply_entries(entries)?;
            self.inner.metrics.applied(start.elapsed());
            applied
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

    /// Chunks from the leader are written straight to `snapshot.recv`.
    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let f = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.receive_path())
            .await
            .map_err(snap_err)?;
        Ok(Box::new(f))
    }

    /// Verifies the whole received file (format, pair count, checksum,
    /// log id) before anything is replaced, then loads it into the state
    /// and makes it the current snapshot. A refused file changes nothing.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let recv = self.received_file(snapshot).await?;
        let verified = {
            let recv = recv.clone();
            tokio::task::spawn_blocking(move || snapfile::verify(&recv))
                .await
                .map_err(snap_err)?
        };
        // A snapshot of a format this binary does not read is refused here,
        // both versions named, and the node stops rather than misload it.
        let (_, held) = verified.map_err(|e| {
            let why = format!("refusing to install a received snapshot: {e}");
            let format = e.get_ref().is_some_and(|inner| inner.is::<FormatError>());
            if format {
                self.refuse(why);
            } else {
                tracing::error!("{why}");
            }
            snap_err(e)
        })?;
        if held.last_log_id != meta.last_log_id {
            let e = StoreError::Corrupt(format!(
                "received snapshot holds {:?}, expected {:?}",
                held.last_log_id, meta.last_log_id
            ));
            return Err(snap_err(e));
        }
        let _g = self.inner.apply_lock.lock().await;
        let (tree, path) = (self.inner.tree.clone(), self.inner.snapshot_path.clone());
        blocking(move || install(&tree, &recv, &path)).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let path = self.inner.snapshot_path.clone();
        if !tokio::fs::try_exists(&path).await.map_err(snap_err)? {
            return Ok(None);
        }
        let header = blocking(move || snapfile::Reader::open(&path)).await?;
        Ok(Some(Snapshot {
            meta: header.meta,
            snapshot: Box::new(self.open_snapshot_data().await?),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Command, JobSpec, Policy, ScheduleInput};
    use openraft::{CommittedLeaderId, EntryPayload};

    fn create(i: u64) -> Entry {
        let spec = JobSpec {
            id: format!("job-{i}"),
            schedule: ScheduleInput::Every { every_ms: 1000 + i },
            group: "g".into(),
            payload: vec![i as u8; 100],
            policy: Policy::default(),
        };
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(
                Command::CreateJob {
                    spec,
                    now_ms: 1_000_000,
                }
                .into(),
            ),
        }
    }

    fn open(dir: &Path) -> StateMachine {
        super::super::open(dir, 8 << 20, Default::default())
            .unwrap()
            .1
    }

    /// A node with `jobs` applied and the snapshot it built.
    async fn node_with_snapshot(dir: &Path, jobs: u64) -> (StateMachine, Snapshot) {
        let mut sm = open(dir);
        sm.apply((1..=jobs).map(create)).await.unwrap();
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        (sm, snap)
    }

    /// Copies a snapshot's data into `to` as openraft's chunked receive would.
    async fn receive(to: &mut StateMachine, snap: Snapshot) -> Box<tokio::fs::File> {
        let mut rx = to.begin_receiving_snapshot().await.unwrap();
        let mut data = snap.snapshot;
        tokio::io::copy(&mut data, &mut *rx).await.unwrap();
        rx
    }

    #[tokio::test]
    async fn a_snapshot_streams_to_another_node_and_an_interrupted_install_is_redone() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut a, snap) = node_with_snapshot(a_dir.path(), 500).await;
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(500));
        let current = a.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snap.meta);

        let mut b = open(b_dir.path());
        b.apply((1..=3).map(create)).await.unwrap(); // stale state the install must replace
        let meta = snap.meta.clone();
        let rx = receive(&mut b, snap).await;
        b.install_snapshot(&meta, rx).await.unwrap();
        let want = a.digest().await;
        assert_eq!(b.digest().await, want);
        assert_eq!(b.get_job("job-500").map(|j| j.payload.len()), Some(100));

        // A crash midway through an install leaves the marker: open loads the file again.
        b.inner.tree.insert(keys::META_RESTORING, &[][..]).unwrap();
        b.inner.tree.insert(b"jhalf-written", &b"x"[..]).unwrap();
        b.inner.tree.remove(keys::job("job-7")).unwrap();
        b.inner.db.flush().unwrap();
        drop(b);
        let b = open(b_dir.path());
        assert_eq!(b.digest().await, want);
    }

    #[tokio::test]
    async fn an_install_interrupted_before_the_rename_is_finished_from_the_received_file() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut a, snap) = node_with_snapshot(a_dir.path(), 20).await;
        let (mut b, _) = node_with_snapshot(b_dir.path(), 3).await;
        let meta = snap.meta.clone();
        drop(receive(&mut b, snap).await);
        // The crash: marker written and the state half replaced, file not yet renamed.
        b.inner.tree.insert(keys::META_RESTORING, &[][..]).unwrap();
        b.inner.tree.remove(keys::job("job-2")).unwrap();
        b.inner.db.flush().unwrap();
        drop(b);
        let mut b = open(b_dir.path());
        assert_eq!(b.digest().await, a.digest().await);
        let current = b.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, meta, "the received file became the snapshot");
        assert!(!b.receive_path().exists());
        assert_eq!(a.get_current_snapshot().await.unwrap().unwrap().meta, meta);
    }

    #[tokio::test]
    async fn a_received_snapshot_for_another_log_id_is_refused_and_changes_nothing() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_a, snap) = node_with_snapshot(a_dir.path(), 5).await;
        let mut b = open(b_dir.path());
        b.apply((1..=2).map(create)).await.unwrap();
        let before = b.digest().await;
        let mut other = snap.meta.clone();
        let rx = receive(&mut b, snap).await;
        other.last_log_id = Some(LogId::new(CommittedLeaderId::new(1, 1), 4));
        assert!(b.install_snapshot(&other, rx).await.is_err());
        assert_eq!(b.digest().await, before);
    }

    /// Receives `snap` into `to` after `damage` changed its bytes.
    async fn receive_damaged(
        to: &mut StateMachine,
        snap: Snapshot,
        damage: impl FnOnce(&mut Vec<u8>),
    ) -> Box<tokio::fs::File> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut bytes = Vec::new();
        let mut data = snap.snapshot;
        data.read_to_end(&mut bytes).await.unwrap();
        damage(&mut bytes);
        let mut rx = to.begin_receiving_snapshot().await.unwrap();
        rx.write_all(&bytes).await.unwrap();
        rx.flush().await.unwrap();
        rx
    }

    /// A damaged transfer is refused by install; the node keeps its state
    /// and its own snapshot, still applies, and reopens.
    /// Returns what the node reports as its refusal.
    async fn a_damaged_snapshot_is_refused(damage: fn(&mut Vec<u8>)) -> Option<String> {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_a, snap) = node_with_snapshot(a_dir.path(), 50).await;
        let (mut b, own) = node_with_snapshot(b_dir.path(), 3).await;
        let before = b.digest().await;
        let meta = snap.meta.clone();
        let rx = receive_damaged(&mut b, snap, damage).await;
        assert!(b.install_snapshot(&meta, rx).await.is_err());
        let refusal = b.refusal();
        assert_eq!(b.digest().await, before, "state untouched");
        let current = b.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, own.meta, "the previous snapshot is kept");

        let responses = b.apply([create(4)]).await.unwrap();
        assert!(matches!(responses[..], [Response::Job(_)]), "{responses:?}");
        let after = b.digest().await;
        assert_eq!(after.0, 4);
        drop((b, current));
        let b = open(b_dir.path());
        assert_eq!(b.digest().await, after, "reopens with the same state");
        refusal
    }

    #[tokio::test]
    async fn an_entry_of_a_newer_log_format_stops_applying_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open(dir.path());
        sm.apply([create(1)]).await.unwrap();
        assert_eq!(sm.refusal(), None);
        let before = sm.digest().await;
        // A batch whose second entry a newer binary wrote: the first of it
        // is not applied either, so a restart meets the same entry again.
        let mut newer = create(3);
        if let EntryPayload::Normal(c) = &mut newer.payload {
            c.format = crate::core::command::LOG_FORMAT + 1;
        }
        let e = sm.apply([create(2), newer]).await.unwrap_err().to_string();
        let want = format!(
            "log entry 3 has format version {}, newer than this binary's {}",
            crate::core::command::LOG_FORMAT + 1,
            crate::core::command::LOG_FORMAT
        );
        assert!(e.contains(&want), "{e}");
        assert_eq!(sm.digest().await, before);
        assert_eq!(sm.last_applied().map(|l| l.index), Some(1));
        // Reported (LocalStatus), not only logged.
        let refusal = sm.refusal().expect("the refusal is reported");
        assert!(refusal.contains(&want), "{refusal}");
    }

    #[tokio::test]
    async fn tzdata_is_recorded_at_open_outside_the_replicated_state() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut a, mut b) = (open(a_dir.path()), open(b_dir.path()));
        a.apply([create(1)]).await.unwrap();
        b.apply([create(1)]).await.unwrap();
        let local = b.inner.db.open_tree(LOCAL_TREE).unwrap();
        let stored = KvTree::get(&local, keys::META_TZDATA).unwrap();
        assert_eq!(
            stored.as_deref(),
            Some(core::schedule::TZDATA_VERSION.as_bytes())
        );
        // A node that last ran other tzdata: reported once, then recorded.
        local.insert(keys::META_TZDATA, &b"1999z"[..]).unwrap();
        assert_eq!(record_tzdata(&local).unwrap().as_deref(), Some("1999z"));
        assert_eq!(record_tzdata(&local).unwrap(), None);
        // Node-local: not part of the digest two replicas compare.
        local.insert(keys::META_TZDATA, &b"1999z"[..]).unwrap();
        assert_eq!(a.digest().await, b.digest().await);
        assert!(b.view().get(keys::META_TZDATA).is_none());
    }

    #[tokio::test]
    async fn a_truncated_snapshot_is_refused_and_the_node_keeps_its_state_and_serves() {
        let refusal = a_damaged_snapshot_is_refused(|b| b.truncate(b.len() * 2 / 3)).await;
        assert_eq!(refusal, None, "a damaged transfer is no format refusal");
    }

    #[tokio::test]
    async fn a_snapshot_of_a_newer_state_format_is_refused_and_reported() {
        // The version follows the 8 magic bytes.
        let refusal = a_damaged_snapshot_is_refused(|b| {
            b[8..12].copy_from_slice(&(keys::STATE_VERSION + 1).to_le_bytes())
        })
        .await
        .expect("reported");
        let want = format!(
            "snapshot file has format version {}, newer than this binary's {}",
            keys::STATE_VERSION + 1,
            keys::STATE_VERSION
        );
        assert!(refusal.contains(&want), "{refusal}");
    }

    #[tokio::test]
    async fn a_snapshot_with_a_flipped_byte_is_refused_and_the_node_keeps_its_state_and_serves() {
        a_damaged_snapshot_is_refused(|b| {
            let mid = b.len() / 2;
            b[mid] ^= 0x01;
        })
        .await;
    }
}
