//! What makes a write to sled durable. sled 0.34's flush writes its buffers
//! and ends, on Linux, in `sync_file_range`: the pages reach the device's
//! queue, but neither its volatile cache nor the file's size is flushed, and
//! sled's only `fsync` is its background thread's, every 500 ms, whose
//! failure it only logs. So every flush that must survive a power cut goes
//! through [`Durable::sync`]:
//!
//! 1. sled's `flush` (its buffers written out);
//! 2. `fdatasync` of sled's data file (`db/db`);
//! 3. `fsync` of every blob file sled created since the last sync (sled
//!    writes values over a quarter segment to files of their own, and never
//!    syncs them), and of each directory (`db/`, `db/blobs/`) whose entries
//!    changed since the last sync.
//!
//! One sync covers every write made before it started, so callers that ask
//! while one is running share the next (group commit): a thread of its own
//! takes every waiter queued, syncs once, and answers them all.
//!
//! A sync that fails is fatal. The thread answers every waiter with the
//! error, answers every later request with it at once (never syncing again:
//! a retried `fsync` can report success over pages the kernel already
//! dropped), and calls the [`Fatal`] hook, which by default logs and ends
//! the process ([`EXIT_SYNC_FAILED`], or a restart in place for a full
//! disk: see `disk`).
//!
//! sled's own periodic flusher is turned off ([`sled_config`]): its
//! `sync_all`, whose failure sled only logs, would be the retry this rules
//! out. The failpoint `skip-log-sync` restores the old behaviour (sled's
//! flush alone, and its periodic thread) so the harness can show the loss.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// Exit status of a node stopped by a failed sync.
pub const EXIT_SYNC_FAILED: i32 = 74;

/// Called once, with the reason, when a sync fails.
pub type Fatal = Arc<dyn Fn(&SyncError) + Send + Sync>;

/// The default [`Fatal`]: the node stops. A full disk restarts the
/// process in place (`crate::disk::restart_in_place`: it waits for space
/// before it opens the store again, then recovers from its log); any other
/// failure ends it with [`EXIT_SYNC_FAILED`], for an operator to look at
/// the disk. Either way nothing is synced again by this process.
pub fn stop_the_node() -> Fatal {
    Arc::new(|e: &SyncError| {
        if e.disk_full {
            let why = format!("{e}: the disk is full; restarting in place to wait for space");
            tracing::error!("{why}");
            eprintln!("kairos: {why}");
            crate::disk::restart_in_place();
        }
        let why = format!(
            "{e}; exiting with status {EXIT_SYNC_FAILED}. Check the disk, then start the \
             node again: it recovers from its log"
        );
        tracing::error!("{why}");
        eprintln!("kairos: {why}");
        std::process::exit(EXIT_SYNC_FAILED)
    })
}

/// Why a sync failed: the step, the path and the error. Cloned to every
/// waiter; `disk_full` when the cause was `ENOSPC`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("durable sync failed, the node stops: {what}: {message}")]
pub struct SyncError {
    pub what: String,
    pub message: String,
    pub disk_full: bool,
}

impl SyncError {
    fn new(what: impl Into<String>, e: &std::io::Error) -> SyncError {
        SyncError {
            what: what.into(),
            message: e.to_string(),
            // sled keeps the kind of the errors it clones, not their number.
            disk_full: e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
                || e.kind() == std::io::ErrorKind::StorageFull,
        }
    }

    fn sled(e: &sled::Error) -> SyncError {
        match e {
            sled::Error::Io(io) => SyncError::new("sled flush", io),
            other => SyncError {
                what: "sled flush".into(),
                message: other.to_string(),
                disk_full: false,
            },
        }
    }
}

/// A sled database whose `flush` is durable: it derefs to `sled::Db` for
/// everything else, and its own [`Db::flush`] and [`Db::flush_async`]
/// (which method resolution picks before sled's) go through [`Durable`].
pub struct Db {
    sled: Arc<sled::Db>,
    durable: Durable,
}

impl std::ops::Deref for Db {
    type Target = sled::Db;
    fn deref(&self) -> &sled::Db {
        &self.sled
    }
}

impl Db {
    /// Opens sled in `dir` by [`sled_config`] (with a cache of
    /// `cache_bytes`) and starts its sync thread.
    pub fn open(
        dir: &Path,
        cache_bytes: u64,
        metrics: Arc<crate::metrics::Metrics>,
        fatal: Fatal,
    ) -> Result<Db, super::StoreError> {
        let sled = Arc::new(
            sled_config(dir)
                .mode(sled::Mode::HighThroughput)
                .cache_capacity(cache_bytes)
                .open()?,
        );
        let durable = Durable::start(sled.clone(), dir, metrics, fatal)?;
        Ok(Db { sled, durable })
    }

    /// Every write made before the call is durable when this returns.
    pub fn flush(&self) -> Result<(), SyncError> {
        self.durable.sync_blocking()
    }

    pub async fn flush_async(&self) -> Result<(), SyncError> {
        self.durable.sync().await
    }

    pub fn durable(&self) -> &Durable {
        &self.durable
    }
}

impl From<SyncError> for sled::Error {
    fn from(e: SyncError) -> sled::Error {
        sled::Error::Io(std::io::Error::other(e))
    }
}

impl From<SyncError> for super::StoreError {
    fn from(e: SyncError) -> super::StoreError {
        super::StoreError::Sled(e.into())
    }
}

/// The sled configuration for a durable database in `dir`: sled's periodic
/// flusher off (see the module's text), unless `skip-log-sync` is set.
pub fn sled_config(dir: &Path) -> sled::Config {
    let periodic = skip_sync().then_some(500);
    sled::Config::new().path(dir).flush_every_ms(periodic)
}

fn skip_sync() -> bool {
    crate::failpoint::on("skip-log-sync")
}

type Waiter = Box<dyn FnOnce(Result<(), SyncError>) + Send>;

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiter>,
    /// Set by the first failure; every later request gets it.
    failed: Option<SyncError>,
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Entries of `db/` and `db/blobs/` as of the last sync.
    seen: Mutex<BTreeSet<PathBuf>>,
    fatal: Fatal,
}

impl Shared {
    /// Records the first failure, answers `batch` and everything queued
    /// with it, and calls the hook; a later failure is only answered.
    fn fail(&self, e: SyncError, batch: Vec<Waiter>) {
        let (first, late) = {
            let mut q = lock(&self.queue);
            let first = q.failed.is_none();
            if first {
                q.failed = Some(e.clone());
            }
            (first, std::mem::take(&mut q.waiting))
        };
        tracing::error!("{e}");
        for w in batch.into_iter().chain(late) {
            w(Err(e.clone()));
        }
        if first {
            (self.fatal)(&e);
        }
    }
}

/// A handle on the sync thread of one sled database. Cloned freely; the
/// thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct Durable {
    shared: Arc<Shared>,
    _owner: Arc<Owner>,
    #[cfg(test)]
    fail_next: Arc<std::sync::atomic::AtomicBool>,
}

/// Stops the thread when the last [`Durable`] goes.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        lock(&self.0.queue).stop = true;
        self.0.wake.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one sync does: sled's flush, then the files and directories.
struct Syncer {
    db: Arc<sled::Db>,
    dir: PathBuf,
    data: File,
    shared: Arc<Shared>,
    metrics: Arc<crate::metrics::Metrics>,
    /// Tests: the next sync fails with `EIO`.
    #[cfg(test)]
    fail_next: Arc<std::sync::atomic::AtomicBool>,
}

impl Durable {
    /// Starts the sync thread for `db`, opened in `dir` by [`sled_config`].
    /// Everything already there is made durable first: the data file, the
    /// directories from `dir` up to its parent's parent (the data directory
    /// and where it was created), and every blob.
    pub fn start(
        db: Arc<sled::Db>,
        dir: &Path,
        metrics: Arc<crate::metrics::Metrics>,
        fatal: Fatal,
    ) -> Result<Durable, SyncError> {
        let data_path = dir.join("db");
        let data = File::open(&data_path)
            .map_err(|e| SyncError::new(format!("open {}", data_path.display()), &e))?;
        let shared = Arc::new(Shared {
            queue: Mutex::default(),
            wake: Condvar::new(),
            seen: Mutex::default(),
            fatal,
        });
        let mut syncer = Syncer {
            db,
            dir: dir.to_path_buf(),
            data,
            shared: shared.clone(),
            metrics,
            #[cfg(test)]
            fail_next: Arc::default(),
        };
        #[cfg(test)]
        let fail_next = syncer.fail_next.clone();
        syncer.sync_all_entries()?;
        for up in dir.ancestors().skip(1).take(2) {
            sync_dir(up)?;
        }
        std::thread::Builder::new()
            .name("kairos-sync".into())
            .spawn(move || syncer.run())
            .map_err(|e| SyncError::new("start the sync thread", &e))?;
        Ok(Durable {
            _owner: Arc::new(Owner(shared.clone())),
            shared,
            #[cfg(test)]
            fail_next,
        })
    }

    /// Returns once every write to the database made before the call is
    /// durable, or the sync failed (then the node is stopping).
    pub async fn sync(&self) -> Result<(), SyncError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Err((_, e)) = self.enqueue(Box::new(move |r| {
            let _ = tx.send(r);
        })) {
            return Err(e);
        }
        rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// [`Durable::sync`] for threads outside the async runtime (the flusher).
    pub fn sync_blocking(&self) -> Result<(), SyncError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if let Err((_, e)) = self.enqueue(Box::new(move |r| {
            let _ = tx.send(r);
        })) {
            return Err(e);
        }
        rx.recv().unwrap_or_else(|_| Err(stopped()))
    }

    /// The files and directories the last sync saw (tests).
    #[cfg(test)]
    fn synced_entries(&self) -> BTreeSet<PathBuf> {
        lock(&self.shared.seen).clone()
    }

    /// Queues `then` to be called, on the sync thread, with the outcome of
    /// the sync that covers every write made before this call; returns at
    /// once. Calls made one after another are answered in that order.
    pub fn sync_then(&self, then: impl FnOnce(Result<(), SyncError>) + Send + 'static) {
        if let Err((w, e)) = self.enqueue(Box::new(then)) {
            w(Err(e)); // already failed: nothing is queued behind it
        }
    }

    /// A write to sled failed (sled then fails every later write too): the
    /// store is lost to this process, as after a failed sync.
    pub fn write_failed(&self, what: &str, e: &sled::Error) {
        let mut err = SyncError::sled(e);
        err.what = what.to_string();
        self.shared.fail(err, Vec::new());
    }

    /// The failure that stopped syncing, if one did.
    pub fn failed(&self) -> Option<SyncError> {
        lock(&self.shared.queue).failed.clone()
    }

    fn enqueue(&self, w: Waiter) -> Result<(), (Waiter, SyncError)> {
        let mut q = lock(&self.shared.queue);
        if let Some(e) = &q.failed {
            return Err((w, e.clone()));
        }
        q.waiting.push(w);
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }
}

fn stopped() -> SyncError {
    SyncError {
        what: "sync thread".into(),
        message: "stopped".into(),
        disk_full: false,
    }
}

fn sync_dir(dir: &Path) -> Result<(), SyncError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| SyncError::new(format!("fsync directory {}", dir.display()), &e))
}

impl Syncer {
    fn run(mut self) {
        let shared = self.shared.clone();
        loop {
            let batch = {
                let mut q = lock(&shared.queue);
                while q.waiting.is_empty() && !q.stop {
                    q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                if q.waiting.is_empty() {
                    return; // stopped, nobody waiting
                }
                std::mem::take(&mut q.waiting)
            };
            let start = std::time::Instant::now();
            let result = self.sync_once();
            self.metrics.synced(start.elapsed(), batch.len());
            match result {
                Ok(()) => batch.into_iter().for_each(|w| w(Ok(()))),
                Err(e) => {
                    shared.fail(e, batch);
                    return;
                }
            }
        }
    }

    fn sync_once(&mut self) -> Result<(), SyncError> {
        self.db.flush().map_err(|e| SyncError::sled(&e))?;
        if skip_sync() {
            return Ok(());
        }
        #[cfg(test)]
        if self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            let e = std::io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error());
            return Err(SyncError::new("injected", &e));
        }
        self.data.sync_data().map_err(|e| {
            SyncError::new(format!("fdatasync {}", self.dir.join("db").display()), &e)
        })?;
        self.sync_new_entries()
    }

    /// Syncs blob files not seen at the last sync and the directories whose
    /// listing changed. Two `getdents` per sync; sled creates blobs rarely.
    fn sync_new_entries(&mut self) -> Result<(), SyncError> {
        let now = self.listing()?;
        let seen = std::mem::take(&mut *lock(&self.shared.seen));
        if now == seen {
            *lock(&self.shared.seen) = seen;
            return Ok(());
        }
        let blobs = self.dir.join("blobs");
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for p in now.symmetric_difference(&seen) {
            if let Some(parent) = p.parent() {
                dirs.insert(parent.to_path_buf());
            }
        }
        for p in now.difference(&seen) {
            if p.parent() == Some(blobs.as_path()) || is_snapshot(p) {
                sync_file(p)?;
            }
        }
        for d in &dirs {
            sync_dir(d)?;
        }
        *lock(&self.shared.seen) = now;
        Ok(())
    }

    /// At start: every file and both directories, whatever was seen.
    fn sync_all_entries(&mut self) -> Result<(), SyncError> {
        self.data
            .sync_all()
            .map_err(|e| SyncError::new(format!("fsync {}", self.dir.join("db").display()), &e))?;
        let now = self.listing()?;
        for p in &now {
            if p.is_file() {
                sync_file(p)?;
            }
        }
        sync_dir(&self.dir.join("blobs"))?;
        sync_dir(&self.dir)?;
        *lock(&self.shared.seen) = now;
        Ok(())
    }

    fn listing(&self) -> Result<BTreeSet<PathBuf>, SyncError> {
        let mut out = BTreeSet::new();
        for d in [self.dir.clone(), self.dir.join("blobs")] {
            let entries = std::fs::read_dir(&d)
                .map_err(|e| SyncError::new(format!("list {}", d.display()), &e))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| SyncError::new(format!("list {}", d.display()), &e))?;
                out.insert(entry.path());
            }
        }
        Ok(out)
    }
}

/// sled's snapshot files (`snap.<lsn>`): sled syncs their data, not the rename.
fn is_snapshot(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("snap."))
}

fn sync_file(p: &Path) -> Result<(), SyncError> {
    match File::open(p) {
        Ok(f) => f
            .sync_all()
            .map_err(|e| SyncError::new(format!("fsync {}", p.display()), &e)),
        // Gone since listed (sled collects old blobs and snapshots).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SyncError::new(format!("open {}", p.display()), &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn open(dir: &Path, fatal: Fatal) -> (Arc<sled::Db>, Durable) {
        let db = Arc::new(sled_config(dir).open().unwrap());
        let d = Durable::start(db.clone(), dir, Arc::default(), fatal).unwrap();
        (db, d)
    }

    fn no_fatal() -> Fatal {
        Arc::new(|e| panic!("unexpected sync failure: {e}"))
    }

    #[tokio::test]
    async fn concurrent_syncs_share_one_sync_and_all_return() {
        let dir = tempfile::tempdir().unwrap();
        let (db, d) = open(dir.path(), no_fatal());
        let tree = db.open_tree("t").unwrap();
        let mut tasks = Vec::new();
        for i in 0..64u32 {
            tree.insert(i.to_be_bytes(), &[1u8; 16][..]).unwrap();
            let d = d.clone();
            tasks.push(tokio::spawn(async move { d.sync().await }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let blocking = d.clone();
        std::thread::spawn(move || blocking.sync_blocking().unwrap())
            .join()
            .unwrap();
        assert!(d.failed().is_none());
    }

    #[tokio::test]
    async fn a_new_blob_file_and_its_directory_are_synced() {
        let dir = tempfile::tempdir().unwrap();
        let (db, d) = open(dir.path(), no_fatal());
        // Over a quarter of sled's 512 KiB segment: sled writes a blob file.
        db.insert(b"big", vec![7u8; 300 * 1024]).unwrap();
        d.sync().await.unwrap();
        let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))
            .unwrap()
            .collect();
        assert!(
            !blobs.is_empty(),
            "sled wrote no blob file for a 300 KiB value"
        );
        assert_eq!(
            d.synced_entries(),
            listing(dir.path()),
            "the syncer saw the blob"
        );
    }

    fn listing(dir: &Path) -> BTreeSet<PathBuf> {
        [dir.to_path_buf(), dir.join("blobs")]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).unwrap())
            .map(|e| e.unwrap().path())
            .collect()
    }

    #[tokio::test]
    async fn a_failed_sync_answers_every_waiter_calls_the_hook_once_and_never_syncs_again() {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let fatal: Fatal = Arc::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let (db, d) = open(dir.path(), fatal);
        d.sync().await.unwrap();
        d.fail_next.store(true, Ordering::SeqCst);
        db.insert(b"k", b"v").unwrap();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let d = d.clone();
                tokio::spawn(async move { d.sync().await })
            })
            .collect();
        for w in waiters {
            let e = w.await.unwrap().unwrap_err();
            assert_eq!(e.what, "injected");
            assert!(!e.disk_full);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the hook runs once");
        // Never retried: later requests fail at once, whatever the disk says.
        let later = d.sync().await.unwrap_err();
        assert_eq!(later.what, "injected");
        assert_eq!(d.failed().map(|e| e.what), Some("injected".into()));
        let blocking = d.clone();
        let e = std::thread::spawn(move || blocking.sync_blocking().unwrap_err())
            .join()
            .unwrap();
        assert_eq!(e.what, "injected");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn enospc_is_told_apart() {
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        assert!(SyncError::new("w", &full).disk_full);
        let eio = std::io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error());
        assert!(!SyncError::new("w", &eio).disk_full);
    }
}
