//! The replicated state machine on sled. Entries are applied through the
//! pure core into memory: the net writes since the last written window
//! (`Dirty`), read through by every query, so a key written and rewritten
//! or deleted within one flush window reaches sled once or not at all. The
//! open window is sealed every `flush_ms`, or sooner past
//! [`FLUSH_KEYS`]/[`FLUSH_BYTES`], with the `last_applied` and membership
//! it reflects; the flusher ([`StateMachine::run_flusher`]) writes sealed
//! windows while apply goes on: in one atomic sled batch up to
//! [`BATCH_KEYS`], past that through a redo record
//! ([`StateMachine::write_through_redo`]), so no batch holds sled's write
//! lock for a whole window. Apply writes windows itself only past
//! [`HELD_KEYS`]/[`HELD_BYTES`]. The log is the durability: after a crash
//! openraft applies the log again from the persisted `last_applied` (the
//! log store keeps the committed index), and the log is only purged up to
//! a snapshot, which is built from written state. Snapshots and digests
//! write every window, then read sled pinned at the persisted
//! `last_applied` ([`Pinned`], `pin`): windows go on being written under
//! the read, each keeping first what sled held at the pin for the keys the
//! read has not reached, up to [`PIN_BYTES`]; past that sled is held still
//! and apply goes on into memory, up to [`HELD_KEYS`]/[`HELD_BYTES`]. So
//! they are a point-in-time view that does not stop apply; snapshot files
//! are streamed (`snapfile`), never held whole in memory.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, Mutex};

use super::durable::Db;
use super::kv::{KvTree, TreeView};
use super::pin::Pin;
use super::snapfile;
use super::StoreError;
use crate::core::codec::FormatError;
use crate::core::codec::{decode, encode};
use crate::core::{self, keys, Effect, Job, Overlay, Response, Run, RunId, StateView, WheelKey};
use crate::core::{Layered, Pending};
use crate::raft::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::watch::{self, Hub};

/// Effects of one applied batch, for the leader's tasks.
pub type EffectBatch = Arc<Vec<Effect>>;

/// What applying a batch of entries gives back, gathered chunk by chunk.
struct Applied {
    responses: Vec<Response>,
    effects: Vec<Effect>,
    /// The joint-configuration failpoint fired.
    crash: bool,
    /// Per entry of the chunk being applied, for the watch ring.
    watched: Vec<watch::Applied>,
}

/// CPU time the calling thread has used (for the apply and flush CPU
/// metrics; a blocking thread runs one whole apply or window write).
fn thread_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    std::time::Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// The entry after `applied` (0 before any).
fn next_index(applied: Option<LogId>) -> u64 {
    applied.map_or(0, |l| l.index + 1)
}

/// A read of the applied state (the windows held in memory, newest first,
/// over sled). Holds a read lock on
/// the state held in memory: keep it for one query, not across an await.
pub struct StateRead<'a> {
    dirty: parking_lot::RwLockReadGuard<'a, Dirty>,
    tree: TreeView<'a>,
}

impl StateView for StateRead<'_> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.dirty.get(key).unwrap_or_else(|| self.tree.get(key))
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let layers = self.dirty.layers();
        Stack::new(&layers, &self.tree).range(start, end, limit)
    }
}

/// Windows of net writes (oldest first) over a base: a key's value is its
/// newest window's, or the base's if no window holds it.
struct Stack<'a> {
    layers: &'a [&'a Pending],
    base: &'a dyn StateView,
    /// With the base sled itself and all of [`Dirty`]'s windows: run keys
    /// the bounds show sled cannot hold are not looked up there.
    runs: Option<(&'a RunBounds, &'a dyn KvTree)>,
    /// With all of [`Dirty`]'s windows: the oldest runs of jobs whose
    /// history a fire trims, kept from one read to the next.
    heads: Option<&'a RunHeads>,
}

impl<'a> Stack<'a> {
    fn new(layers: &'a [&'a Pending], base: &'a dyn StateView) -> Self {
        Stack {
            layers,
            base,
            runs: None,
            heads: None,
        }
    }

    /// `Dirty`'s windows (all of them, as [`Dirty::layers`] gives them)
    /// over sled, with its run bounds and run heads.
    fn of_dirty(layers: &'a [&'a Pending], base: &'a TreeView<'a>, dirty: &'a Dirty) -> Self {
        Stack {
            layers,
            base,
            runs: Some((&dirty.runs, base.0)),
            heads: Some(&dirty.heads),
        }
    }

    /// [`StateView::range`] without the run heads.
    fn read_range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self.layers.split_last() {
            None => self.base.range(start, end, limit),
            Some((newest, older)) => {
                Layered::new(newest, &Stack::new(older, self.base)).range(start, end, limit)
            }
        }
    }
}

impl StateView for Stack<'_> {
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.layers.iter().rev().find_map(|w| w.get(key)) {
            Some(v) => v.clone(),
            None if (self.runs).is_some_and(|(b, tree)| b.beyond(key, self.layers, tree)) => None,
            None => self.base.get(key),
        }
    }

    fn range(&self, start: &[u8], end: &[u8], limit: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        let read = |n| self.read_range(start, end, n);
        match self.heads.and_then(|h| h.range(start, end, limit, read)) {
            Some(rows) => rows,
            None => self.read_range(start, end, limit),
        }
    }
}

#[derive(Clone)]
pub struct Options {
    /// Capacity of the effect channel; a lagging leader task resyncs from state.
    pub effect_capacity: usize,
    /// Where apply times are observed.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Applied state is written to sled at least this often (0: after
    /// every applied batch). See [`StateMachine::run_flusher`].
    pub flush_ms: u64,
    /// Events the watch ring holds (`--watch-events`).
    pub watch_events: usize,
    /// Keys and bytes of applied state apply holds in memory, not yet in
    /// sled, before it writes sealed windows itself or, while sled is held
    /// still, waits ([`HELD_KEYS`], [`HELD_BYTES`]; smaller only in tests).
    pub held_limits: (usize, usize),
    /// Bytes a snapshot or digest's read keeps for the keys written under
    /// it ([`PIN_BYTES`]; smaller only in tests).
    pub pin_bytes: usize,
    /// Keys in the open window after which apply seals it at once
    /// ([`FLUSH_KEYS`]; smaller only in tests).
    pub flush_keys: usize,
    /// Called once when a durable sync fails: by default the node stops
    /// ([`super::durable`]); tests that provoke a failure pass their own.
    pub on_sync_failure: super::durable::Fatal,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            effect_capacity: 4096,
            metrics: Arc::default(),
            flush_ms: FLUSH_MS_DEFAULT,
            watch_events: crate::watch::RING_EVENTS_DEFAULT,
            held_limits: (HELD_KEYS, HELD_BYTES),
            pin_bytes: PIN_BYTES,
            flush_keys: FLUSH_KEYS,
            on_sync_failure: super::durable::stop_the_node(),
        }
    }
}

/// Default of `--flush-ms`. Three seconds, not one: a key rewritten within
/// a window reaches sled once, and at saturation a job firing every second
/// then costs a node 2.1-2.7 sled writes per fire instead of 5.1-5.6, for
/// 14,148 fires/s against 10,029 (medians of three alternated runs,
/// BENCHMARKS.md twenty-sixth pass). A crashed node applies up to one
/// window of log again.
pub const FLUSH_MS_DEFAULT: u64 = 3_000;
/// Largest `--flush-ms`.
pub const FLUSH_MS_MAX: u64 = 60_000;
/// Keys in the open flush window after which apply seals it at once.
/// Large enough that a saturated node mostly seals on the `--flush-ms`
/// tick, so a run created, assigned and finished within that window
/// reaches sled once, and an active-run entry added and removed not at all.
/// At 131,072 a node firing 16,200 jobs a second sealed every two seconds
/// on this bound, before the tick: 262,144 writes about a fifth fewer keys
/// per fire there, and past saturation delivers 17-30 % more fires
/// (BENCHMARKS.md, thirtieth pass).
pub const FLUSH_KEYS: usize = 262_144;
/// Keys at most in one atomic sled batch. A batch holds sled's
/// process-wide write lock and pins its log until it is sealed, and the
/// Raft log's appends and fsyncs wait for both; a window of more keys goes
/// through a redo record instead ([`StateMachine::write_through_redo`]).
pub const BATCH_KEYS: usize = 4_096;
/// Bytes (keys and values) in the open flush window after which apply seals it at once.
pub const FLUSH_BYTES: usize = 32 << 20;
/// Applied keys held in memory, not yet in sled (the open window and the
/// sealed ones the flusher has not written), past which apply stops
/// applying: it writes the sealed windows itself (so a slow disk slows
/// apply instead of growing memory) or, while sled is held still under a
/// snapshot or digest's read ([`PIN_BYTES`]), waits for it to be let go.
/// Two full windows, so a saturated node applies on while the last one is
/// written.
pub const HELD_KEYS: usize = 2 * FLUSH_KEYS;
/// Applied bytes held in memory past which apply stops as for [`HELD_KEYS`].
pub const HELD_BYTES: usize = 128 << 20;
/// Bytes of values a snapshot or digest's read keeps for the keys written
/// under it ([`Pin`]), past which sled is held still until the read
/// ends. A kept value goes once the read passes its key. At ten million
/// timers and 48,000 creates/s a 39 s snapshot read kept at most 92 MB
/// (BENCHMARKS, twenty-fifth pass).
pub const PIN_BYTES: usize = 256 << 20;

/// Applied state not yet in sled: the net writes of the entries applied
/// since the last written window, in windows, each ending with its
/// `last_applied` (and the membership, if it changed). Reads go through
/// the windows newest first, then sled: a window stays readable until it
/// is written, so a key is never read from a half-written sled.
#[derive(Default)]
struct Dirty {
    /// The open window: net writes applied since the last seal.
    open: Pending,
    open_bytes: usize,
    /// Sealed windows, oldest first, waiting to be written to sled one at
    /// a time (by the flusher, or by apply past [`HELD_KEYS`]), so sled is
    /// at an entry boundary after each.
    sealed: std::collections::VecDeque<Window>,
    /// Keys and bytes of the sealed windows.
    sealed_keys: usize,
    sealed_bytes: usize,
    /// Windows sealed so far: tells [`Dirty::merge`] whether the windows
    /// below the open one changed since a chunk's [`Vanished`] was taken.
    seals: u64,
    /// What run keys sled can hold, for apply's reads: reset with the rest
    /// when a snapshot replaces the state.
    runs: RunBounds,
    /// The oldest runs of jobs, for apply's reads: reset likewise.
    heads: RunHeads,
}

/// Bounds on the run keys in sled, by job, so apply need not ask sled for a
/// run it cannot hold. Every fire looks up its occurrence's run first (a
/// manual trigger at the same instant may have made it) and nearly always
/// finds none, which cost a sled lookup per fire on every node: 7-8 % of a
/// follower's CPU at saturation (BENCHMARKS.md, nineteenth pass). The
/// keys beside a run (a workflow run's inputs, a backfilled run's range)
/// are bounded the same way, each space on its own: a fire that trims its
/// job's history deletes those of the oldest run if present, and most
/// jobs have none (twenty-ninth pass).
///
/// A job's bound is the greatest (scheduled time, shard) suffix among its
/// run keys in sled and in the windows, taken from both the first time the
/// job's runs are asked for, and raised by every run key merged into the
/// open window after that ([`Dirty::merge`]): so it is never below a key
/// sled holds (a key reaches sled only from a window). A deleted run may
/// leave it high, which only sends a lookup to sled. A key above it is
/// absent; any other is looked up as before, so apply reads exactly what it
/// read without the bounds.
#[derive(Default)]
struct RunBounds(parking_lot::Mutex<std::collections::HashMap<Vec<u8>, Vec<u8>>>);

/// Jobs whose bounds are kept; past it they are dropped and taken again.
const RUN_BOUNDS_MAX: usize = 65_536;

impl RunBounds {
    /// Whether `key`, a key no window in `layers` holds, is a run key
    /// above its job's bound, so that sled cannot hold it. `layers` are all
    /// of `Dirty`'s windows.
    fn beyond(&self, key: &[u8], layers: &[&Pending], tree: &dyn KvTree) -> bool {
        let Some((job, suffix)) = keys::split_run_side_key(key) else {
            return false;
        };
        let mut bounds = self.0.lock();
        if let Some(bound) = bounds.get(job) {
            return suffix > bound.as_slice();
        }
        if bounds.len() >= RUN_BOUNDS_MAX {
            bounds.clear();
        }
        let end = keys::prefix_end(job);
        let in_windows = layers.iter().filter_map(|w| {
            let range = (
                std::ops::Bound::Included(job),
                std::ops::Bound::Excluded(&end[..]),
            );
            w.range::<[u8], _>(range)
                .next_back()
                .map(|(k, _)| k.clone())
        });
        let in_sled = tree.last_key_in(job, &end).expect("state read failed");
        let top = in_windows.chain(in_sled).max();
        let bound = top.map(|k| k[job.len()..].to_vec()).unwrap_or_default();
        let beyond = suffix > bound.as_slice();
        bounds.insert(job.to_vec(), bound);
        beyond
    }

    /// Raises the bounds kept for the run keys `net` puts.
    fn raise(&mut self, net: &Pending) {
        let bounds = self.0.get_mut();
        if bounds.is_empty() {
            return;
        }
        for (k, v) in net {
            let Some((job, suffix)) = v.as_ref().and_then(|_| keys::split_run_side_key(k)) else {
                continue;
            };
            if let Some(bound) = bounds.get_mut(job) {
                if suffix > bound.as_slice() {
                    *bound = suffix.to_vec();
                }
            }
        }
    }
}

/// Rows a job's head keeps: a fire past its job's `keep_runs` reads the
/// two oldest runs (the one it deletes and the next), so one read of a
/// head serves five fires.
const HEAD_ROWS: usize = 6;
/// Bytes of keys and values all heads keep, past which they are dropped
/// and taken again: about 35,000 jobs' heads of runs of 150 bytes.
const HEADS_BYTES: usize = 32 << 20;

/// The oldest run records of jobs, as the windows over sled read them, so
/// that a fire trimming its job's history need not read them again.
///
/// At steady state, when a job's history has reached its `keep_runs`,
/// every fire deletes the job's oldest run, and finding it took a range
/// read through every window and sled (a sled iterator copies a whole
/// node) and its run's decoding: 56 % more apply CPU per fire than before
/// the histories filled (BENCHMARKS.md, twenty-ninth pass).
///
/// A head is taken by a read of the first rows of a job's runs (the whole
/// [`keys::runs_of`] range, at most [`HEAD_ROWS`]) and holds every run key
/// of the job up to its last row's (all of them when `all`), with their
/// values. Every chunk's net writes are applied to the heads as they are
/// merged into the open window ([`Dirty::merge`]), which is the only
/// change to what the windows over sled read (sealing and writing a
/// window change where a pair is, not its value). So a head always reads
/// what the windows over sled would; a head emptied, or grown past
/// [`HEAD_ROWS`], is cut back to what it still knows.
#[derive(Default)]
struct RunHeads(parking_lot::Mutex<Heads>);

#[derive(Default)]
struct Heads {
    jobs: std::collections::HashMap<Vec<u8>, Head>,
    bytes: usize,
}

struct Head {
    /// In key order.
    rows: std::collections::VecDeque<(Vec<u8>, Vec<u8>)>,
    /// The rows are all the job's runs (else those up to the last row's key).
    all: bool,
}

impl Head {
    fn bytes(&self) -> usize {
        self.rows.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Applies one write of a run key of this job.
    fn write(&mut self, key: &[u8], value: &Option<Vec<u8>>) {
        let at = self.rows.binary_search_by(|(k, _)| k.as_slice().cmp(key));
        match (at, value) {
            (Ok(i), Some(v)) => self.rows[i].1.clone_from(v),
            (Ok(i), None) => {
                self.rows.remove(i);
            }
            (Err(i), Some(v)) if i < self.rows.len() || self.all => {
                self.rows.insert(i, (key.to_vec(), v.clone()));
                if self.rows.len() > HEAD_ROWS {
                    self.rows.pop_back();
                    self.all = false;
                }
            }
            // Past the rows known, or a deletion of a key not held.
            (Err(_), _) => {}
        }
    }
}

impl RunHeads {
    /// The first `limit` rows of `[start, end)`, when that is one job's
    /// whole runs range and `limit` at most [`HEAD_ROWS`]: from the job's
    /// head, or read with `read` (given a limit) and kept. `None` for any
    /// other read.
    fn range(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        read: impl FnOnce(usize) -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
        if limit > HEAD_ROWS || !keys::is_runs_of(start) || end != keys::prefix_end(start) {
            return None;
        }
        let mut heads = self.0.lock();
        if let Some(h) = heads
            .jobs
            .get(start)
            .filter(|h| h.all || h.rows.len() >= limit)
        {
            return Some(h.rows.iter().take(limit).cloned().collect());
        }
        let rows = read(HEAD_ROWS);
        let out = rows.iter().take(limit).cloned().collect();
        let head = Head {
            all: rows.len() < HEAD_ROWS,
            rows: rows.into(),
        };
        if heads.bytes >= HEADS_BYTES {
            heads.jobs.clear();
            heads.bytes = 0;
        }
        heads.bytes += start.len() + head.bytes();
        if let Some(old) = heads.jobs.insert(start.to_vec(), head) {
            heads.bytes -= start.len() + old.bytes();
        }
        Some(out)
    }

    /// Applies a chunk's net writes to the heads kept.
    fn write(&mut self, net: &Pending) {
        let heads = self.0.get_mut();
        if heads.jobs.is_empty() {
            return;
        }
        for (k, v) in net {
            let Some((job, _)) = keys::split_run_key(k) else {
                continue;
            };
            let Some(head) = heads.jobs.get_mut(job) else {
                continue;
            };
            let before = head.bytes();
            head.write(k, v);
            let after = head.bytes();
            heads.bytes = heads.bytes + after - before;
            if head.rows.is_empty() && !head.all {
                heads.jobs.remove(job);
                heads.bytes -= job.len();
            }
        }
    }
}

/// Keys a chunk deleted that no sealed window nor sled holds, as found
/// under the read lock the chunk was applied under (when `seals` windows
/// had been sealed): deleting them writes nothing, so the open window drops
/// them instead of carrying a deletion to sled. A run's active entry put at
/// its fire and deleted at its finish within one window so costs no write.
struct Vanished {
    keys: Vec<Vec<u8>>,
    seals: u64,
}

/// A sealed window: shared with the writer while it is written.
struct Window {
    pairs: Arc<Pending>,
    bytes: usize,
}

fn pair_size(k: &[u8], v: &Option<Vec<u8>>) -> usize {
    k.len() + v.as_ref().map_or(0, Vec::len)
}

impl Dirty {
    /// Adds a chunk's net writes to the open window, then drops from it the
    /// deletions of keys nothing below it holds (`vanished`; checked again
    /// against `tree` and the sealed windows if a window was sealed since
    /// they were found: the one sealed may hold a key put earlier).
    fn merge(&mut self, net: Pending, vanished: Vanished, tree: &dyn StateView) {
        self.runs.raise(&net);
        self.heads.write(&net);
        for (k, v) in net {
            // One search of the open window per key (it holds up to `FLUSH_KEYS`).
            self.open_bytes += pair_size(&k, &v);
            match self.open.entry(k) {
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    self.open_bytes -= pair_size(e.key(), e.get());
                    e.insert(v);
                }
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(v);
                }
            }
        }
        let mut gone = vanished.keys;
        if vanished.seals != self.seals {
            let sealed = self.sealed_layers();
            let below = Stack::new(&sealed, tree);
            gone.retain(|k| below.get(k).is_none());
        }
        for k in gone {
            if let Some(old) = self.open.remove(&k) {
                self.open_bytes -= pair_size(&k, &old);
            }
        }
    }

    /// The sealed windows, oldest first: the state below the open window
    /// over sled.
    fn sealed_layers(&self) -> Vec<&Pending> {
        self.sealed.iter().map(|w| &*w.pairs).collect()
    }

    /// Seals the open window for writing; false when it is empty.
    fn seal(&mut self) -> bool {
        if self.open.is_empty() {
            return false;
        }
        let pairs = Arc::new(std::mem::take(&mut self.open));
        let bytes = std::mem::take(&mut self.open_bytes);
        self.seals += 1;
        self.sealed_keys += pairs.len();
        self.sealed_bytes += bytes;
        self.sealed.push_back(Window { pairs, bytes });
        true
    }

    /// Drops the oldest sealed window (written to sled).
    fn written(&mut self) {
        if let Some(w) = self.sealed.pop_front() {
            self.sealed_keys -= w.pairs.len();
            self.sealed_bytes -= w.bytes;
        }
    }

    /// The newest value of `key` held here: `Some(None)` for a deletion,
    /// `None` when no window holds it.
    fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let newest = self.open.get(key);
        let newest = newest.or_else(|| self.sealed.iter().rev().find_map(|w| w.pairs.get(key)));
        newest.cloned()
    }

    /// The windows, oldest first.
    fn layers(&self) -> Vec<&Pending> {
        let mut layers = self.sealed_layers();
        layers.push(&self.open);
        layers
    }

    /// Keys held, counted once per window they are in.
    fn keys(&self) -> usize {
        self.open.len() + self.sealed_keys
    }

    /// The open window reached its bounds ([`FLUSH_KEYS`], [`FLUSH_BYTES`]).
    fn window_full(&self, keys: usize) -> bool {
        self.open.len() >= keys || self.open_bytes >= FLUSH_BYTES
    }

    /// Past what apply may hold in memory ([`HELD_KEYS`], [`HELD_BYTES`]).
    fn over(&self, limits: (usize, usize)) -> bool {
        self.keys() >= limits.0 || self.open_bytes + self.sealed_bytes >= limits.1
    }
}

#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Db>,
    tree: sled::Tree,
    /// The redo record of a flush larger than one batch, while it is written.
    redo: sled::Tree,
    snapshot_path: PathBuf,
    apply_lock: Mutex<()>,
    /// Held by whoever reads sled pinned ([`Pinned`]: snapshot builds,
    /// digests) or replaces it (install, the final flush); taken before
    /// `apply_lock`, never after it.
    pin_lock: Arc<Mutex<()>>,
    /// Held by whoever writes sealed windows to sled (the flusher, apply
    /// past `held_limits`, a pin, the final flush) or replaces sled
    /// (install); taken last, after `pin_lock` and `apply_lock`. Only
    /// on blocking threads.
    write_lock: parking_lot::Mutex<()>,
    /// The read pinned under `pin_lock`, if any: every window written
    /// meanwhile first keeps in it what sled held at the pin for the keys
    /// the read has yet to reach ([`StateMachine::keep_pinned`]).
    pin: parking_lot::Mutex<Option<Pin>>,
    /// Bytes a pin may keep ([`PIN_BYTES`]; smaller only in tests).
    pin_bytes: usize,
    /// Set while sled is held still (a pin's kept values reached
    /// `pin_bytes`): windows are not written and apply goes on into
    /// memory, up to `held_limits`.
    held: std::sync::atomic::AtomicBool,
    /// Set while a pin is on its way: the flusher starts no round of
    /// writes meanwhile, so the pin writes up to its own seal and no
    /// further (a round under way, or apply past `held_limits`, may still
    /// write later windows first: sled is then pinned at a later index).
    pin_pending: std::sync::atomic::AtomicBool,
    /// Keys and bytes held in memory past which apply writes the sealed
    /// windows itself, or while sled is held still waits.
    held_limits: (usize, usize),
    /// Keys in the open window after which apply seals it.
    flush_keys: usize,
    /// Where apply waits for sled to be let go, past `held_limits`.
    thaw: (parking_lot::Mutex<()>, parking_lot::Condvar),
    /// Wakes the flusher thread: set when a window was sealed full, sled
    /// was let go, or the flusher is to stop.
    wake: (parking_lot::Mutex<bool>, parking_lot::Condvar),
    /// Why writing a window to sled failed: apply stops with it.
    write_failed: parking_lot::Mutex<Option<String>>,
    /// Times apply waited for sled to be let go (for tests and metrics).
    frozen_waits: AtomicU64,
    effects: broadcast::Sender<EffectBatch>,
    /// Applied and not yet flushed; written only under the apply lock.
    dirty: parking_lot::RwLock<Dirty>,
    flush_ms: u64,
    /// State keys written to or deleted from sled since open (for benchmarks).
    writes_total: AtomicU64,
    metrics: Arc<crate::metrics::Metrics>,
    /// Entries in the durable wheel index: counted once after open
    /// ([`Self::count_timers`]) and after a snapshot install, then kept in
    /// step by each window written to sled ([`Self::write_oldest`]), which
    /// learns from sled whether a key was there at no extra read while the
    /// window goes through its redo record. So it lags the applied state by
    /// at most the flush window, and apply spends no read on it.
    pending_timers: AtomicU64,
    /// Set once `pending_timers` was counted.
    timers_counted: std::sync::atomic::AtomicBool,
    /// Watch events of the entries applied since open (not replicated).
    watch: Arc<Hub>,
    /// Why this node stopped applying (an entry or snapshot it does not
    /// read), for `LocalStatus`: Raft stops there, the process serves on.
    refusal: std::sync::Mutex<Option<String>>,
    /// The last state digest taken, for `digest`.
    last_digest: parking_lot::Mutex<Option<TakenDigest>>,
    /// Digests computed since open (each a pass over the whole state).
    digests_taken: AtomicU64,
    /// A digest is being taken for `digest_within` (one at a time).
    digest_running: std::sync::atomic::AtomicBool,
    /// Counts the digests `digest_within` started that have ended.
    digest_ended: tokio::sync::watch::Sender<u64>,
    /// The last snapshot this node built since open: when it ended and
    /// how long it took (`raft::snapshots` spaces builds out by it).
    last_build: parking_lot::Mutex<Option<Built>>,
    /// Tests: a flush through the redo record stops after this many pairs.
    #[cfg(test)]
    redo_stop: std::sync::atomic::AtomicUsize,
    /// Tests: each digest's hash takes this many milliseconds longer.
    #[cfg(test)]
    hash_delay_ms: AtomicU64,
}

/// A state digest and when, at which index and how fast it was taken.
#[derive(Clone)]
struct TakenDigest {
    index: u64,
    hex: String,
    at: std::time::Instant,
    took: std::time::Duration,
}

/// A snapshot this node built: when it ended and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Built {
    pub ended: std::time::Instant,
    pub took: std::time::Duration,
}

/// A digest is taken again no sooner than this many times its last
/// duration: hashing a large state takes seconds of CPU, so callers asking
/// in a loop (`cluster status`) get the last one instead.
const DIGEST_SPACING: u32 = 4;
/// A digest whose hashing took less than this is taken again as soon as
/// anything was applied: spacing it out would save nothing and serve a
/// stale state.
const DIGEST_CHEAP: std::time::Duration = std::time::Duration::from_millis(100);

fn sm_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::new(&e)).into()
}

fn snap_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, openraft::AnyError::new(&e)).into()
}

impl StateMachine {
    pub fn open(db: Arc<Db>, dir: &Path, opts: Options) -> Result<Self, StoreError> {
        let tree = db.open_tree("state")?;
        let redo = db.open_tree(REDO_TREE)?;
        let snapshot_path = dir.join("snapshot.bin");
        if finish_redo(&db, &tree, &redo)? {
            tracing::warn!("a flush of the applied state was interrupted; wrote it again");
        }
        if KvTree::get(&tree, keys::META_RESTORING)?.is_some() {
            tracing::warn!("a snapshot install was interrupted; doing it again");
            finish_install(
                &db,
                &tree,
                &snapshot_path.with_extension("recv"),
                &snapshot_path,
            )
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
        // Counted after open, on a thread of its own (`count_timers`).
        let pending_timers = AtomicU64::new(0);
        // Entries up to what sled holds were applied by an earlier process:
        // their events are gone.
        let persisted: Option<LogId> =
            KvTree::get(&tree, keys::META_LAST_APPLIED)?.and_then(|raw| decode(&raw).ok());
        let watch = Arc::new(Hub::new(opts.watch_events, next_index(persisted)));
        let inner = Inner {
            db,
            tree,
            redo,
            snapshot_path,
            apply_lock: Mutex::new(()),
            pin_lock: Arc::new(Mutex::new(())),
            write_lock: Default::default(),
            pin: Default::default(),
            pin_bytes: opts.pin_bytes,
            held: Default::default(),
            pin_pending: Default::default(),
            held_limits: opts.held_limits,
            flush_keys: opts.flush_keys,
            thaw: Default::default(),
            wake: Default::default(),
            write_failed: Default::default(),
            frozen_waits: AtomicU64::new(0),
            effects,
            dirty: Default::default(),
            flush_ms: opts.flush_ms,
            writes_total: Default::default(),
            metrics: opts.metrics,
            pending_timers,
            timers_counted: Default::default(),
            watch,
            refusal: std::sync::Mutex::default(),
            last_digest: parking_lot::Mutex::new(None),
            digests_taken: AtomicU64::new(0),
            digest_running: Default::default(),
            digest_ended: tokio::sync::watch::Sender::new(0),
            last_build: parking_lot::Mutex::new(None),
            #[cfg(test)]
            redo_stop: std::sync::atomic::AtomicUsize::new(usize::MAX),
            #[cfg(test)]
            hash_delay_ms: AtomicU64::new(0),
        };
        let sm = StateMachine {
            inner: Arc::new(inner),
        };
        // Weak: a store dropped before the count begins is not kept open.
        let counting = Arc::downgrade(&sm.inner);
        let spawned = std::thread::Builder::new()
            .name("kairos-count".into())
            .spawn(move || {
                if let Some(inner) = counting.upgrade() {
                    StateMachine { inner }.count_timers();
                }
            });
        if spawned.is_err() {
            sm.count_timers();
        }
        Ok(sm)
    }

    /// Counts the wheel keys sled holds, under the write lock, so that no
    /// window is written meanwhile and the windows after it move an exact
    /// count (those written before moved a count this replaces). A pass
    /// over every timer: 7.2 s at ten million, the most of a restart when
    /// open waited for it (BENCHMARKS, twenty-fifth pass); now the node
    /// serves meanwhile, and only windows wait.
    fn count_timers(&self) {
        let _w = self.inner.write_lock.lock();
        let start = std::time::Instant::now();
        let n = count_wheel(&self.inner.tree);
        self.inner.pending_timers.store(n, Ordering::Relaxed);
        self.inner.timers_counted.store(true, Ordering::Release);
        tracing::info!(
            timers = n,
            took_ms = start.elapsed().as_millis() as u64,
            "counted the timers in the store"
        );
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

    /// Timers in the durable wheel index (occurrences and retries).
    /// `None` until counted after open (seconds with millions of timers).
    pub fn pending_timers(&self) -> Option<u64> {
        let counted = self.inner.timers_counted.load(Ordering::Acquire);
        counted.then(|| self.inner.pending_timers.load(Ordering::Relaxed))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<EffectBatch> {
        self.inner.effects.subscribe()
    }

    /// The watch ring of this node.
    pub fn watch(&self) -> &Arc<Hub> {
        &self.inner.watch
    }

    /// The applied state: what is held in memory over what is in sled.
    pub fn view(&self) -> StateRead<'_> {
        StateRead {
            dirty: self.inner.dirty.read_recursive(),
            tree: TreeView(&self.inner.tree),
        }
    }

    /// The `last_applied` written to sled (behind [`last_applied`] by at
    /// most one flush window).
    ///
    /// [`last_applied`]: Self::last_applied
    pub fn persisted_applied(&self) -> Option<LogId> {
        let raw = TreeView(&self.inner.tree).get(keys::META_LAST_APPLIED)?;
        decode(&raw).ok()
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
        let b = self.view().get(&keys::job(id))?;
        Job::from_record(&b).ok()
    }

    /// Jobs with ids after `after`, in id order.
    pub fn list_jobs(&self, after: &str, limit: usize) -> Vec<Job> {
        let mut start = keys::job(after);
        if !after.is_empty() {
            start.push(0);
        }
        let rows = self.view().range(&start, &[keys::JOB + 1], limit);
        rows.iter()
            .filter_map(|(_, v)| Job::from_record(v).ok())
            .collect()
    }

    /// One filtered page of jobs (`core::query::jobs_page`).
    pub fn jobs_page(
        &self,
        filter: &core::query::JobFilter,
        after: &str,
        page: usize,
    ) -> core::query::JobPage {
        core::query::jobs_page(
            &self.view(),
            filter,
            after,
            page,
            core::limits::LIST_SCAN_MAX,
        )
    }

    /// The cluster-wide firing pause, if set (`Command::PauseFiring`).
    pub fn firing_paused(&self) -> Option<core::PauseNote> {
        self.meta(keys::META_FIRING_PAUSED)
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

    /// The last snapshot this node built since it opened its store.
    pub fn last_build(&self) -> Option<Built> {
        *self.inner.last_build.lock()
    }

    /// The file holding the current snapshot (`snapshot.bin`).
    pub fn snapshot_file(&self) -> std::path::PathBuf {
        self.inner.snapshot_path.clone()
    }

    /// The revision records of job id `job`, oldest first.
    pub fn job_history(&self, job: &str) -> Vec<core::JobRevision> {
        core::query::job_history(&self.view(), job)
    }

    /// Every token, by name (at most `limits::TOKENS_MAX` exist).
    pub fn list_tokens(&self) -> Vec<core::Token> {
        let rows =
            (self.view()).range(&[keys::TOKEN], &[keys::TOKEN + 1], core::limits::TOKENS_MAX);
        rows.iter().filter_map(|(_, v)| decode(v).ok()).collect()
    }

    pub fn get_run(&self, id: &RunId) -> Option<Run> {
        let b = self.view().get(&keys::run(id))?;
        Run::from_record(&b).ok()
    }

    /// The upstream runs a workflow run consumed (empty for other runs).
    pub fn run_inputs(&self, id: &RunId) -> Vec<(String, RunId)> {
        self.meta(&keys::run_inputs(id)).unwrap_or_default()
    }

    /// The range of the backfill that created the run, if one did.
    pub fn run_backfill(&self, id: &RunId) -> Option<(i64, i64)> {
        self.meta(&keys::run_backfill(id))
    }

    /// Jobs that declare `job` as an upstream, at most `DOWNSTREAMS_MAX`.
    pub fn downstreams(&self, job: &str) -> Vec<String> {
        let prefix = keys::downstream_of(job);
        let rows = self.view().range(
            &prefix,
            &keys::prefix_end(&prefix),
            core::limits::DOWNSTREAMS_MAX,
        );
        rows.iter()
            .filter_map(|(k, _)| keys::downstream_from(k).map(str::to_string))
            .collect()
    }

    /// The results a workflow run's workers get (`workflow::merge_results`).
    pub fn upstream_results(&self, id: &RunId) -> Vec<u8> {
        let inputs = self.run_inputs(id);
        if inputs.is_empty() {
            return Vec::new();
        }
        let results: Vec<(String, Option<Vec<u8>>)> = inputs
            .into_iter()
            .map(|(job, run)| (job, self.get_run(&run).map(|r| r.result)))
            .collect();
        core::workflow::merge_results(&results, core::limits::UPSTREAM_RESULTS_MAX_BYTES)
    }

    /// Statistics over the job's kept run history (one pass over it).
    pub fn job_stats(&self, job: &str) -> core::stats::JobStats {
        core::stats::job_stats(&self.view(), job)
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
        rows.iter()
            .filter_map(|(_, v)| Run::from_record(v).ok())
            .collect()
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

    /// SHA-256 over the whole replicated state and the index it reflects,
    /// hashed on a blocking thread from sled pinned ([`Pinned`]), so
    /// apply goes on meanwhile. The last one is returned again while nothing
    /// was applied since, or, for one that took [`DIGEST_CHEAP`] or more to
    /// hash, while it is younger than `DIGEST_SPACING` times that.
    pub async fn digest(&self) -> (u64, String) {
        let pinned = {
            let serial = self.inner.pin_lock.clone().lock_owned().await;
            let index = self.last_applied().map_or(0, |l| l.index);
            if let Some(d) = self.inner.last_digest.lock().clone() {
                let spaced = d.took >= DIGEST_CHEAP && d.at.elapsed() < d.took * DIGEST_SPACING;
                let fresh = d.index == index || spaced;
                if fresh {
                    return (d.index, d.hex);
                }
            }
            match self.pin(serial).await {
                Ok(f) => f,
                Err(e) => return (0, format!("error: {e}")),
            }
        };
        let index = pinned.applied.map_or(0, |l| l.index);
        // Hashing a large state takes seconds: off the async workers, or
        // this node stops answering heartbeats and votes meanwhile.
        // Timed on the thread that hashes: a wait for a blocking thread on a
        // loaded box is not the hash's cost.
        let hashed = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            pinned.hash().map(|hex| (hex, start.elapsed()))
        });
        let (hex, took) = match hashed.await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return (0, format!("error: {e}")),
            Err(e) => return (0, format!("error: {e}")),
        };
        self.inner.digests_taken.fetch_add(1, Ordering::Relaxed);
        *self.inner.last_digest.lock() = Some(TakenDigest {
            index,
            hex: hex.clone(),
            at: std::time::Instant::now(),
            took,
        });
        (index, hex)
    }

    /// The newest digest this node can give within `budget`, with the
    /// index it reflects: a fresh one (as [`Self::digest`] would answer)
    /// if it is ready by then, else the last one taken, of an older index
    /// (`(0, "")` before the first). A hash not done within the budget goes
    /// on in the background, for a later caller; one runs at a time. So a
    /// status call answers promptly however large the state: hashing ten
    /// million timers takes half a minute (BENCHMARKS.md).
    pub async fn digest_within(&self, budget: std::time::Duration) -> (u64, String) {
        let mut ended = self.inner.digest_ended.subscribe();
        if !self.inner.digest_running.swap(true, Ordering::AcqRel) {
            // Ends the run however the task ends (a panic, a runtime shut down).
            struct Running(StateMachine);
            impl Drop for Running {
                fn drop(&mut self) {
                    self.0.inner.digest_running.store(false, Ordering::Release);
                    self.0.inner.digest_ended.send_modify(|n| *n += 1);
                }
            }
            let running = Running(self.clone());
            tokio::spawn(async move {
                let (index, hex) = running.0.digest().await;
                if hex.starts_with("error:") {
                    tracing::warn!(index, %hex, "state digest failed");
                }
                drop(running);
            });
        }
        // An error or elapsed budget both leave the last digest taken.
        let _ = tokio::time::timeout(budget, ended.changed()).await;
        let last = self.inner.last_digest.lock();
        last.as_ref()
            .map_or((0, String::new()), |d| (d.index, d.hex.clone()))
    }

    /// Pins sled for a point-in-time read: the open window is sealed (at
    /// an entry boundary, as the flusher seals it), the windows up to it
    /// are written, and every window written after them, until the
    /// returned guard is dropped, first keeps in the pin what sled held
    /// for the keys the read has yet to reach ([`Pin`]). So sled reads as
    /// the state at the index applied when the pin began (or a later one,
    /// see `pin_pending`), while windows go on being written under it. The
    /// apply lock is never taken: apply goes on into memory all the while,
    /// so a snapshot or digest does not stall it. `serial` is the held
    /// `pin_lock`.
    ///
    /// It used to take the apply lock and write under it: first the whole
    /// open window (0.4-0.8 s of held apply per snapshot under overload,
    /// BENCHMARKS fourteenth pass), then, with rounds of writing before the
    /// lock, still what apply added during the last round (up to 0.4 s,
    /// fifteenth pass). Then it held sled still for the whole read: apply
    /// filled `held_limits` in 3 s and waited out the rest of a 26 s read at
    /// ten million timers, and writes already in the log timed out
    /// (twenty-fourth pass).
    async fn pin(&self, serial: tokio::sync::OwnedMutexGuard<()>) -> Result<Pinned, StorageError> {
        let _pending = PinPending::set(self);
        let start = std::time::Instant::now();
        let sm = self.clone();
        let (held_keys, applied, membership) = blocking(move || {
            let (target, held_keys) = {
                let mut dirty = sm.inner.dirty.write();
                dirty.seal();
                let newest = dirty.get(keys::META_LAST_APPLIED).flatten();
                let target = newest.and_then(|b| decode::<LogId>(&b).ok());
                (target.map(|l| l.index), dirty.keys())
            };
            let _w = sm.inner.write_lock.lock();
            // Apply past its held limits may have written some (or later
            // windows) meanwhile; a later index is as good a point.
            while target > sm.persisted_applied().map(|l| l.index) {
                if !sm.write_oldest().map_err(std::io::Error::other)? {
                    break;
                }
            }
            // Under the write lock: no window is written between reading
            // the pinned point and pinning it.
            let applied = sm.persisted_applied();
            let membership: StoredMembership = TreeView(&sm.inner.tree)
                .get(keys::META_MEMBERSHIP)
                .and_then(|b| decode(&b).ok())
                .unwrap_or_default();
            *sm.inner.pin.lock() = Some(Pin::default());
            Ok((held_keys, applied, membership))
        })
        .await?;
        Ok(Pinned {
            sm: self.clone(),
            _serial: serial,
            applied,
            membership,
            took: start.elapsed(),
            held_keys,
        })
    }

    /// Makes room, past the limits of what apply may hold in memory: writes
    /// the sealed windows here (the open one sealed first if it is all
    /// there is), or, while sled is held still, waits until it is let go.
    /// Runs on apply's blocking thread.
    fn make_room(&self) -> Result<(), StorageError> {
        let limits = self.inner.held_limits;
        loop {
            if let Some(why) = self.inner.write_failed.lock().clone() {
                return Err(sm_err(std::io::Error::other(why)));
            }
            if !self.inner.dirty.read_recursive().over(limits) {
                return Ok(());
            }
            if self.inner.held.load(Ordering::Acquire) {
                self.wait_for_thaw(limits);
                continue;
            }
            {
                let mut dirty = self.inner.dirty.write();
                if dirty.sealed.is_empty() {
                    dirty.seal();
                }
            }
            // Sled may be held still meanwhile (a pin began and filled up;
            // it does not take the apply lock): `write_oldest` then writes
            // nothing and apply goes on past its limits for this chunk, to
            // wait at the next one.
            return self.write_sealed().map_err(sm_err);
        }
    }

    /// Waits while sled is held still and what apply holds is past `limits`.
    fn wait_for_thaw(&self, limits: (usize, usize)) {
        let (lock, thawed) = &self.inner.thaw;
        let mut g = lock.lock();
        let mut waited = false;
        while self.inner.held.load(Ordering::Acquire)
            && self.inner.dirty.read_recursive().over(limits)
        {
            if !waited {
                waited = true;
                self.inner.frozen_waits.fetch_add(1, Ordering::Relaxed);
            }
            thawed.wait(&mut g);
        }
    }

    /// Times apply waited for sled to be let go (`held_limits` reached).
    pub fn frozen_waits(&self) -> u64 {
        self.inner.frozen_waits.load(Ordering::Relaxed)
    }

    /// Applies `entries` in order into memory and returns their responses
    /// and effects. Entries are taken in chunks that end once the open
    /// window reaches [`FLUSH_KEYS`] (at an entry boundary); a full window
    /// is sealed and the flusher woken to write it while apply goes on
    /// (with `flush_ms` 0, every chunk is sealed and written here). An
    /// entry of a format this binary cannot read stops apply there, its
    /// chunk unapplied.
    fn apply_entries(
        &self,
        entries: Vec<Entry>,
    ) -> Result<(Vec<Response>, Vec<Effect>), StorageError> {
        let mut out = Applied {
            responses: Vec::with_capacity(entries.len()),
            effects: Vec::new(),
            crash: false,
            watched: Vec::new(),
        };
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            self.make_room()?;
            let (net, vanished) = self.apply_chunk(&mut entries, &mut out)?;
            let sealed = {
                let mut dirty = self.inner.dirty.write();
                dirty.merge(net, vanished, &TreeView(&self.inner.tree));
                let seal = dirty.window_full(self.inner.flush_keys) || self.inner.flush_ms == 0;
                seal && dirty.seal()
            };
            // Callers hold the apply lock: a snapshot install cannot come between.
            self.inner.watch.push(std::mem::take(&mut out.watched));
            if sealed && self.inner.flush_ms == 0 {
                self.write_sealed().map_err(sm_err)?;
            } else if sealed {
                self.wake_flusher();
            }
        }
        if out.crash {
            crash_now("applied a joint configuration");
        }
        Ok((out.responses, out.effects))
    }

    /// Applies entries from `entries` over the state until the open window
    /// would reach [`FLUSH_KEYS`] or what is held in memory the held limit.
    /// Returns the chunk's net writes (with its `last_applied`) and the
    /// keys among them deleted that nothing below the open window holds.
    fn apply_chunk(
        &self,
        entries: &mut std::iter::Peekable<std::vec::IntoIter<Entry>>,
        out: &mut Applied,
    ) -> Result<(Pending, Vanished), StorageError> {
        let dirty = self.inner.dirty.read_recursive();
        let tree = TreeView(&self.inner.tree);
        let layers = dirty.layers();
        let state = Stack::of_dirty(&layers, &tree, &dirty);
        let mut overlay = Overlay::new(&state);
        let mut last = None;
        let room = (self.inner.flush_keys.saturating_sub(dirty.open.len()))
            .min(self.inner.held_limits.0.saturating_sub(dirty.keys()));
        while last.is_none() || overlay.len() < room {
            let Some(entry) = entries.next() else {
                break;
            };
            match entry.payload {
                EntryPayload::Blank => {
                    out.watched
                        .push(watch::Applied::new(entry.log_id.index, &[]));
                    out.responses.push(Response::Empty)
                }
                EntryPayload::Membership(m) => {
                    out.crash |=
                        m.get_joint_config().len() > 1 && crate::failpoint::on("crash-on-joint");
                    let stored = StoredMembership::new(Some(entry.log_id), m);
                    overlay.put(keys::META_MEMBERSHIP.to_vec(), encode(&stored));
                    out.watched
                        .push(watch::Applied::new(entry.log_id.index, &[]));
                    out.responses.push(Response::Empty);
                }
                EntryPayload::Normal(logged) => {
                    let cmd = logged.command(entry.log_id.index).map_err(|e| {
                        // The node stops here, and meets this entry again after a restart.
                        self.refuse(format!("refusing to apply: {e}"));
                        StorageIOError::apply(entry.log_id, openraft::AnyError::new(&e))
                    })?;
                    let (response, effects) = core::apply_into(&mut overlay, &cmd);
                    let index = entry.log_id.index;
                    out.watched.push(watch::Applied::new(index, &effects));
                    out.effects.extend(effects);
                    out.responses.push(response);
                }
            }
            last = Some(entry.log_id);
        }
        if let Some(last) = last {
            overlay.put(keys::META_LAST_APPLIED.to_vec(), encode(&last));
        }
        let net = overlay.into_pending();
        let sealed = dirty.sealed_layers();
        let below = Stack::new(&sealed, &tree);
        let vanished = Vanished {
            keys: net
                .iter()
                .filter(|(k, v)| v.is_none() && below.get(k).is_none())
                .map(|(k, _)| k.clone())
                .collect(),
            seals: dirty.seals,
        };
        Ok((net, vanished))
    }

    /// Writes `pairs` (a flush window, ending with its `last_applied`)
    /// without one large atomic batch: their redo record first, made
    /// durable; then each pair on its own, so sled's write lock is never
    /// held for the whole window; made durable; then the record goes. A
    /// crash in between leaves the record, and open writes the pairs again
    /// ([`finish_redo`]): they are the window's net writes, so writing them
    /// over any part of themselves gives the state at its `last_applied`.
    fn write_through_redo(
        &self,
        pairs: &core::Pending,
        timers: &mut TimerDelta,
    ) -> Result<(), sled::Error> {
        let (db, tree, redo) = (&self.inner.db, &self.inner.tree, &self.inner.redo);
        let applied: LogId = pairs
            .get(keys::META_LAST_APPLIED)
            .and_then(|v| v.as_deref())
            .and_then(|raw| decode(raw).ok())
            .expect("a flush window holds its last_applied");
        let mut chunks = 0u32;
        let mut chunk: Vec<(&[u8], Option<&[u8]>)> = Vec::new();
        let mut bytes = 0;
        let mut pairs_left = pairs.len();
        for (k, v) in pairs {
            chunk.push((k, v.as_deref()));
            bytes += k.len() + v.as_ref().map_or(0, Vec::len);
            pairs_left -= 1;
            if bytes >= REDO_CHUNK_BYTES || pairs_left == 0 {
                redo.insert(redo_chunk_key(chunks), encode(&chunk))?;
                chunks += 1;
                chunk.clear();
                bytes = 0;
            }
        }
        let head = RedoHead {
            index: applied.index,
            chunks,
        };
        redo.insert(REDO_HEAD, encode(&head))?;
        db.flush()?;
        let crash_at = crate::failpoint::on("crash-mid-flush").then_some(pairs.len() / 2);
        for (i, (k, v)) in pairs.iter().enumerate() {
            if Some(i) == crash_at {
                db.flush()?;
                crash_now("wrote half of a flush's pairs");
            }
            #[cfg(test)]
            if i == self.inner.redo_stop.load(Ordering::Relaxed) {
                return Ok(()); // a crash here, as the tests see it
            }
            let was = match v {
                Some(v) => tree.insert(k.as_slice(), v.as_slice())?,
                None => tree.remove(k.as_slice())?,
            };
            timers.count(k, v.is_some(), was.is_some());
        }
        db.flush()?;
        clear_redo(redo, chunks)
    }

    /// Writes every sealed window to sled, oldest first, each with the
    /// `last_applied` it ends with; nothing while sled is held still
    /// (`held`). Readers and apply go on meanwhile: every key of a
    /// window is read from memory until it is written.
    fn write_sealed(&self) -> Result<(), sled::Error> {
        let _w = self.inner.write_lock.lock();
        self.write_sealed_locked()
    }

    /// [`Self::write_sealed`] with the write lock held by the caller.
    fn write_sealed_locked(&self) -> Result<(), sled::Error> {
        while self.write_oldest()? {}
        Ok(())
    }

    /// Writes the oldest sealed window (one atomic batch up to
    /// [`BATCH_KEYS`], through the redo record past it), then drops it
    /// from memory; returns whether one was written. Callers hold the
    /// write lock.
    fn write_oldest(&self) -> Result<bool, sled::Error> {
        if self.inner.held.load(Ordering::Acquire) {
            return Ok(false);
        }
        let front = self
            .inner
            .dirty
            .read_recursive()
            .sealed
            .front()
            .map(|w| w.pairs.clone());
        let Some(window) = front else {
            return Ok(false);
        };
        let (start, cpu) = (std::time::Instant::now(), thread_cpu());
        if !self.keep_pinned(&window)? {
            return Ok(false); // held still until the read ends
        }
        let mut timers = TimerDelta::default();
        if window.len() <= BATCH_KEYS {
            let mut batch = sled::Batch::default();
            for (k, v) in window.iter() {
                if keys::is_wheel(k) {
                    // A batch tells nothing of what it replaced; only
                    // the wheel keys of a small window are looked up.
                    let was = self.inner.tree.contains_key(k)?;
                    timers.count(k, v.is_some(), was);
                }
                match v {
                    Some(v) => batch.insert(k.as_slice(), v.as_slice()),
                    None => batch.remove(k.as_slice()),
                }
            }
            self.inner.tree.apply_batch(batch)?;
        } else {
            self.write_through_redo(&window, &mut timers)?;
        }
        timers.apply_to(&self.inner.pending_timers);
        let cpu = thread_cpu().saturating_sub(cpu);
        self.inner.metrics.state_flushed(start.elapsed(), cpu);
        // Reads of its keys go to sled from here on.
        self.inner.dirty.write().written();
        (self.inner.writes_total).fetch_add(window.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Keeps, in the pinned read if one is under way, what sled holds for
    /// each key of `window` the read has yet to reach, before the window is
    /// written ([`Pin::keep_before`]). False if that would pass
    /// `pin_bytes`: sled is then held still (`held`, set under the pin's
    /// lock, so never after the read ended) until the read ends. The pin's
    /// lock is taken for [`KEEP_CHUNK`] keys at a time, and not held while
    /// the window is written: the read goes on meanwhile, taking the kept
    /// values over what it finds in sled.
    fn keep_pinned(&self, window: &core::Pending) -> Result<bool, sled::Error> {
        if self.inner.pin.lock().is_none() {
            return Ok(true);
        }
        let keys: Vec<&[u8]> = window.keys().map(Vec::as_slice).collect();
        for chunk in keys.chunks(KEEP_CHUNK) {
            let mut pin = self.inner.pin.lock();
            let Some(pin) = pin.as_mut() else {
                return Ok(true); // the read ended
            };
            let limit = self.inner.pin_bytes;
            if pin
                .keep_before(&self.inner.tree, chunk.iter().copied(), limit)?
                .is_err()
            {
                self.inner.held.store(true, Ordering::Release);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes windows from a tick or a full window on, and records a
    /// failure for apply to stop with.
    fn write_sealed_or_record(&self) {
        if let Err(e) = self.write_sealed() {
            tracing::error!("writing applied state to sled: {e}; apply stops");
            self.inner
                .db
                .durable()
                .write_failed("writing applied state", &e);
            *self.inner.write_failed.lock() = Some(format!("writing applied state to sled: {e}"));
        }
    }

    /// Applied keys held in memory, not yet written to sled.
    pub fn unflushed_keys(&self) -> usize {
        self.inner.dirty.read_recursive().keys()
    }

    /// Writes the applied state held in memory to sled now (graceful
    /// shutdown, tests), after any snapshot or digest reading sled.
    pub async fn flush(&self) -> Result<(), StorageError> {
        let _serial = self.inner.pin_lock.lock().await;
        let _g = self.inner.apply_lock.lock().await;
        let sm = self.clone();
        tokio::task::spawn_blocking(move || {
            sm.inner.dirty.write().seal();
            sm.write_sealed()
        })
        .await
        .map_err(sm_err)?
        .map_err(sm_err)
    }

    /// The flusher: a thread of its own, at the same CPU priority as apply
    /// and Raft, that seals the open window
    /// `flush_ms` after the last tick's write ended and writes the sealed
    /// windows to sled while apply goes on; woken early by a window sealed
    /// full or sled let go. Under load a window spans `flush_ms` plus one
    /// write, so the slower the writes, the more each window coalesces (up
    /// to [`FLUSH_KEYS`]); if the writes fall behind, apply writes itself
    /// past [`HELD_KEYS`]. The thread stops when this task
    /// is dropped.
    ///
    /// Not at a lower priority: every sled write, the Raft log's included,
    /// goes through one shared log whose buffers are made durable in order,
    /// and sled's batches take a process-wide lock that waits for readers in
    /// flight, so a flusher the scheduler sets aside holds the Raft appends
    /// back behind it. At nice 10 the leader stalled 1.5-2.5 s (no log line
    /// at all) in every 5x-overload run, at nice 0 at most 0.95 s
    /// (BENCHMARKS, twelfth pass).
    pub async fn run_flusher(self) {
        struct StopOnDrop(StateMachine, Arc<std::sync::atomic::AtomicBool>);
        impl Drop for StopOnDrop {
            fn drop(&mut self) {
                self.1.store(true, Ordering::Release);
                self.0.wake_flusher();
            }
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _stop = StopOnDrop(self.clone(), stop.clone());
        let sm = self.clone();
        let started = std::thread::Builder::new()
            .name("kairos-flusher".into())
            .spawn(move || sm.flusher_loop(&stop));
        if let Err(e) = started {
            tracing::error!("starting the flusher thread: {e}; apply writes the state itself");
        }
        std::future::pending::<()>().await
    }

    fn flusher_loop(&self, stop: &std::sync::atomic::AtomicBool) {
        let every = std::time::Duration::from_millis(self.inner.flush_ms.max(1));
        let mut tick = std::time::Instant::now() + every;
        loop {
            let ticked = {
                let (lock, woken) = &self.inner.wake;
                let mut pending_wake = lock.lock();
                loop {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    if std::mem::take(&mut *pending_wake) {
                        break false;
                    }
                    if std::time::Instant::now() >= tick {
                        break true;
                    }
                    woken.wait_until(&mut pending_wake, tick);
                }
            };
            // A pin on its way writes what is held itself (`pin`).
            if self.inner.pin_pending.load(Ordering::Acquire) {
                tick = std::time::Instant::now() + every;
                continue;
            }
            if ticked {
                self.inner.dirty.write().seal();
            }
            self.write_sealed_or_record();
            if ticked {
                tick = std::time::Instant::now() + every;
            }
        }
    }

    /// Wakes the flusher thread (a window sealed full, sled let go, stop).
    fn wake_flusher(&self) {
        let (lock, woken) = &self.inner.wake;
        *lock.lock() = true;
        woken.notify_one();
    }

    /// State keys written or deleted by apply since this node started.
    pub fn writes_total(&self) -> u64 {
        self.inner.writes_total.load(Ordering::Relaxed)
    }
}

/// The `crash-on-joint` failpoint (`crate::failpoint`): the leader applies
/// the joint entry before it proposes the second one, so a change is cut
/// between its two steps exactly.
fn crash_now(why: &str) {
    // Straight to stderr: a line queued for the log writer would die with the process.
    eprintln!("failpoint: SIGKILL after it {why}");
    let me = rustix::process::getpid();
    let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Streams the state to `snapshot.tmp` from sled pinned at the applied
    /// index (a point-in-time view; apply and the flusher go on
    /// meanwhile), then syncs it and renames it over `snapshot.bin`.
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let start = std::time::Instant::now();
        let serial = self.inner.pin_lock.clone().lock_owned().await;
        let pinned = self.pin(serial).await?;
        // State must be in sled, and durable, before the log behind it
        // may be purged: the snapshot's index is then the persisted one.
        self.inner.db.flush_async().await.map_err(snap_err)?;
        let meta = SnapshotMeta {
            snapshot_id: match &pinned.applied {
                Some(l) => format!("{}-{}", l.leader_id.term, l.index),
                None => "0-0".into(),
            },
            last_log_id: pinned.applied,
            last_membership: pinned.membership.clone(),
        };
        let (pin_ms, held_keys) = (pinned.took.as_millis() as u64, pinned.held_keys);
        let tmp = self.inner.snapshot_path.with_extension("tmp");
        let path = self.inner.snapshot_path.clone();
        let m = meta.clone();
        let (pairs, kept_bytes) = blocking(move || {
            let mut w = snapfile::Writer::create(&tmp, keys::STATE_VERSION, &m)?;
            pinned.for_each(&mut |k, v| w.pair(k, v))?;
            // Every pair is in the file: the pin may go.
            let kept_bytes = pinned.kept_peak();
            drop(pinned);
            let pairs = w.finish()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&path)?;
            Ok((pairs, kept_bytes))
        })
        .await?;
        if let Some(ms) = crate::failpoint::value("slow-snapshot") {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let took = start.elapsed();
        *self.inner.last_build.lock() = Some(Built {
            ended: std::time::Instant::now(),
            took,
        });
        self.inner.metrics.snapshot_built(took);
        tracing::info!(
            index = meta.last_log_id.map_or(0, |l| l.index),
            pairs,
            took_ms = took.as_millis() as u64,
            pin_ms,
            held_keys,
            kept_bytes,
            "snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(self.open_snapshot_data().await?),
        })
    }
}

/// `pin_pending` while a pin is on its way; cleared on every way out of
/// it, an error's included.
struct PinPending(StateMachine);

impl PinPending {
    fn set(sm: &StateMachine) -> Self {
        sm.inner.pin_pending.store(true, Ordering::Release);
        PinPending(sm.clone())
    }
}

impl Drop for PinPending {
    fn drop(&mut self) {
        self.0.inner.pin_pending.store(false, Ordering::Release);
    }
}

/// Sled's state tree pinned for a point-in-time read
/// ([`StateMachine::pin`]): until this is dropped, windows written keep
/// what sled held at `applied` for the keys the read has yet to reach, so
/// [`Pinned::for_each`] reads exactly the state at `applied`.
struct Pinned {
    sm: StateMachine,
    _serial: tokio::sync::OwnedMutexGuard<()>,
    /// The index the read reflects.
    applied: Option<LogId>,
    membership: StoredMembership,
    /// How long pinning took (waiting for a write under way, then
    /// writing what was held), and the keys held when it began.
    took: std::time::Duration,
    held_keys: usize,
}

/// Pairs read from sled per turn of a pinned read; a window's keeping
/// waits for at most one turn.
const PIN_READ_CHUNK: usize = 1024;
/// Keys of a window kept per turn of a pinned read's lock.
const KEEP_CHUNK: usize = 256;

impl Pinned {
    /// Visits every pair of the state at `applied`, in key order, a chunk
    /// at a time; windows are written between chunks.
    fn for_each(
        &self,
        f: &mut dyn FnMut(&[u8], &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let inner = &self.sm.inner;
        loop {
            let chunk = {
                let mut pin = inner.pin.lock();
                let pin = pin.as_mut().expect("pinned until dropped");
                pin.next_chunk(&inner.tree, PIN_READ_CHUNK)
                    .map_err(std::io::Error::other)?
            };
            let Some(pairs) = chunk else {
                return Ok(());
            };
            for (k, v) in &pairs {
                f(k, v)?;
            }
        }
    }

    /// The most bytes the pin kept at once, so far.
    fn kept_peak(&self) -> usize {
        let pin = self.sm.inner.pin.lock();
        pin.as_ref().map_or(0, Pin::peak_bytes)
    }

    /// SHA-256 over every state pair in key order.
    fn hash(&self) -> std::io::Result<String> {
        #[cfg(test)]
        let delay = Some(self.sm.inner.hash_delay_ms.load(Ordering::Relaxed));
        #[cfg(not(test))]
        let delay = crate::failpoint::value("slow-digest");
        if let Some(ms) = delay {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let mut h = Sha256::new();
        self.for_each(&mut |k, v| {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k);
            h.update((v.len() as u64).to_be_bytes());
            h.update(v);
            Ok(())
        })?;
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let inner = &self.sm.inner;
        *inner.pin.lock() = None;
        let (lock, thawed) = &inner.thaw;
        {
            let _g = lock.lock();
            inner.held.store(false, Ordering::Release);
        }
        thawed.notify_all();
        // What was sealed while sled was held still is written now.
        self.sm.wake_flusher();
    }
}

/// Where a flush larger than one batch keeps its redo record (node-local,
/// outside the replicated state, empty but while such a flush is written).
const REDO_TREE: &str = "flush_redo";
const REDO_HEAD: &[u8] = b"head";
/// Bytes of pairs per value of the redo record.
const REDO_CHUNK_BYTES: usize = 1 << 20;

/// What a redo record holds: `chunks` values of pairs, the net writes of a
/// flush window that ends at `index`.
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct RedoHead {
    index: u64,
    chunks: u32,
}

fn redo_chunk_key(i: u32) -> [u8; 5] {
    let mut k = [b'c', 0, 0, 0, 0];
    k[1..].copy_from_slice(&i.to_be_bytes());
    k
}

fn clear_redo(redo: &sled::Tree, chunks: u32) -> Result<(), sled::Error> {
    let mut batch = sled::Batch::default();
    batch.remove(REDO_HEAD);
    for i in 0..chunks {
        batch.remove(&redo_chunk_key(i)[..]);
    }
    redo.apply_batch(batch)
}

/// Finishes a flush that a crash interrupted (its redo record is still
/// there); returns whether there was one. The pairs were made durable
/// before any later write, so a `last_applied` past the record's index
/// means they are all in sled and the record is only left over.
fn finish_redo(db: &Db, tree: &sled::Tree, redo: &sled::Tree) -> Result<bool, StoreError> {
    let corrupt = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Corrupt(format!(
            "the redo record of an interrupted flush: {what}: {e}"
        ))
    };
    let Some(raw) = KvTree::get(redo, REDO_HEAD)? else {
        return Ok(false);
    };
    let head: RedoHead = decode(&raw).map_err(|e| corrupt("head", &e))?;
    let persisted: Option<LogId> =
        KvTree::get(tree, keys::META_LAST_APPLIED)?.and_then(|raw| decode(&raw).ok());
    if persisted.map_or(0, |l| l.index) <= head.index {
        for i in 0..head.chunks {
            let raw = KvTree::get(redo, &redo_chunk_key(i))?.ok_or_else(|| {
                corrupt("a chunk", &format!("chunk {i} of {} missing", head.chunks))
            })?;
            let pairs: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                decode(&raw).map_err(|e| corrupt("a chunk", &e))?;
            let mut batch = sled::Batch::default();
            for (k, v) in pairs {
                match v {
                    Some(v) => batch.insert(k, v),
                    None => batch.remove(k),
                }
            }
            tree.apply_batch(batch)?;
        }
        db.flush()?;
    }
    clear_redo(redo, head.chunks)?;
    db.flush()?;
    Ok(true)
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

/// Wheel entries a window added to and removed from sled, as sled
/// answered each write (it was there or not).
#[derive(Default)]
struct TimerDelta {
    added: u64,
    removed: u64,
}

impl TimerDelta {
    /// Counts the write of `key` (a put when `put`) to a tree that held
    /// it when `was`; keys outside the wheel do not count.
    fn count(&mut self, key: &[u8], put: bool, was: bool) {
        if keys::is_wheel(key) {
            match (put, was) {
                (true, false) => self.added += 1,
                (false, true) => self.removed += 1,
                _ => {}
            }
        }
    }

    fn apply_to(&self, n: &AtomicU64) {
        n.fetch_add(self.added, Ordering::Relaxed);
        let removed = self.removed.min(n.load(Ordering::Relaxed));
        n.fetch_sub(removed, Ordering::Relaxed);
    }
}

/// Keys in the durable wheel index (one pass, at open and after an install).
fn count_wheel(tree: &sled::Tree) -> u64 {
    tree.scan_prefix([keys::WHEEL]).keys().count() as u64
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
fn install(db: &Db, tree: &sled::Tree, recv: &Path, current: &Path) -> std::io::Result<()> {
    let io = std::io::Error::other;
    tree.insert(keys::META_RESTORING, &[][..]).map_err(io)?;
    db.flush().map_err(std::io::Error::other)?;
    finish_install(db, tree, recv, current)
}

/// Loads the file being installed (still `recv`, or already renamed to
/// `current`), makes it the current snapshot and removes the marker.
fn finish_install(db: &Db, tree: &sled::Tree, recv: &Path, current: &Path) -> std::io::Result<()> {
    let io = std::io::Error::other;
    let renamed = !recv.try_exists()?;
    let source = if renamed { current } else { recv };
    load(db, tree, source)?;
    if !renamed {
        std::fs::rename(recv, current)?;
        sync_dir(current)?;
    }
    tree.remove(keys::META_RESTORING).map_err(io)?;
    db.flush().map_err(std::io::Error::other)?;
    Ok(())
}

/// Replaces the whole state but the install marker with the pairs of a
/// snapshot file, in bounded batches. The file is verified first (a second
/// time during install: the check is cheap next to the load, and the disk
/// may have changed it).
fn load(db: &Db, tree: &sled::Tree, path: &Path) -> std::io::Result<()> {
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
    db.flush().map_err(std::io::Error::other)?;
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
            // A batch can take a while: off the async workers, so Raft
            // messages and heartbeats on this node are not held up behind it.
            let sm = self.clone();
            let start = std::time::Instant::now();
            let (applied, cpu) = tokio::task::spawn_blocking(move || {
                let cpu = thread_cpu();
                (sm.apply_entries(entries), thread_cpu().saturating_sub(cpu))
            })
            .await
            .map_err(sm_err)?;
            self.inner.metrics.applied(start.elapsed(), cpu);
            applied?
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
        let _serial = self.inner.pin_lock.lock().await;
        let _g = self.inner.apply_lock.lock().await;
        let (sm, path) = (self.clone(), self.inner.snapshot_path.clone());
        let count = blocking(move || {
            let _w = sm.inner.write_lock.lock();
            // The snapshot replaces the state, including what is held in memory.
            *sm.inner.dirty.write() = Dirty::default();
            let tree = &sm.inner.tree;
            install(&sm.inner.db, tree, &recv, &path)?;
            Ok(count_wheel(tree))
        })
        .await?;
        self.inner.pending_timers.store(count, Ordering::Relaxed);
        self.inner.timers_counted.store(true, Ordering::Release);
        // The state jumped: the ring starts after the snapshot.
        self.inner.watch.reset(next_index(meta.last_log_id));
        Ok(())
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
            bounds: Default::default(),
            labels: Default::default(),
            workflow: None,
            max_concurrent: None,
            jitter: None,
            catch_up_max: None,
            also: Vec::new(),
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
        open_flushing_every(dir, Options::default().flush_ms)
    }

    /// Opens `dir`; reopened right after its last handle was dropped, sled's
    /// background flusher may hold the directory's lock a moment longer (a
    /// process that exits releases it at once), so a refused open is tried
    /// again for a while.
    fn open_flushing_every(dir: &Path, flush_ms: u64) -> StateMachine {
        let opts = Options {
            flush_ms,
            flush_keys: TEST_FLUSH_KEYS,
            ..Default::default()
        };
        open_with(dir, opts)
    }

    /// Opens `dir`, trying again while the store dropped just before (or a
    /// thread of it finishing) still holds the directory's lock.
    fn open_with(dir: &Path, opts: Options) -> StateMachine {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            match super::super::open(dir, 8 << 20, opts.clone()) {
                Ok((_, sm)) => return sm,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("reopening {}: {e}; trying again", dir.display());
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("open {}: {e}", dir.display()),
            }
        }
    }

    /// A state machine that flushes only when asked (or past its bounds):
    /// no flusher task runs in these tests.
    fn open_windowed(dir: &Path) -> StateMachine {
        open_flushing_every(dir, FLUSH_MS_MAX)
    }

    fn delete(i: u64, id: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
            payload: EntryPayload::Normal(
                Command::DeleteJob {
                    id: format!("job-{id}"),
                    now_ms: 1_000_000,
                }
                .into(),
            ),
        }
    }

    /// A digest that was cheap to hash is not spaced out: right after an
    /// apply the next one reflects it (t10 once read a stale empty digest
    /// after a create, its spacing inflated by a wait for a blocking thread).
    #[tokio::test]
    async fn a_cheap_digest_is_taken_again_as_soon_as_anything_was_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        let (index, empty) = sm.digest().await;
        assert_eq!(index, 0);
        sm.apply([create(1)]).await.unwrap();
        let (index, one) = sm.digest().await;
        assert_eq!(index, 1);
        assert_ne!(one, empty);
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 2);
    }

    /// `cluster status` asks every node for a digest. With a million
    /// timers hashing takes seconds: done on the async workers it stopped
    /// this node's heartbeats and votes, and elections followed.
    #[tokio::test(flavor = "current_thread")]
    async fn a_digest_is_hashed_off_the_async_workers_and_not_taken_again_for_the_same_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply((1..=3).map(create)).await.unwrap();
        // Bulk state straight into the tree: enough that hashing takes a while.
        let mut batch = sled::Batch::default();
        for i in 0..50_000u32 {
            batch.insert(
                [b"zbulk".as_slice(), &i.to_be_bytes()].concat(),
                vec![7u8; 64],
            );
        }
        sm.inner.tree.apply_batch(batch).unwrap();
        // The only worker thread ticks while the digest is taken.
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        tokio::task::yield_now().await;
        let before = ticks.load(Ordering::Relaxed);
        let (index, first) = sm.digest().await;
        let during = ticks.load(Ordering::Relaxed) - before;
        ticker.abort();
        assert_eq!(index, 3);
        assert_eq!(first.len(), 64, "{first}");
        assert!(during > 0, "the async worker was blocked while hashing");
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 1);
        // Nothing applied since: the same digest, not another pass.
        assert_eq!(sm.digest().await, (3, first.clone()));
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 1);
        // Applied since, and long enough after the last one: taken again.
        sm.apply([create(4)]).await.unwrap();
        let took = sm.inner.last_digest.lock().as_ref().unwrap().took;
        tokio::time::sleep(took * DIGEST_SPACING).await;
        let (index, second) = sm.digest().await;
        assert_eq!(index, 4);
        assert_ne!(second, first);
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 2);
    }

    /// A caller that cannot wait for a hash (a status, bounded by its
    /// peer's timeout) gets the last digest with the index it is of; the
    /// hash goes on, one at a time, and a later caller gets it.
    #[tokio::test]
    async fn a_digest_not_ready_within_the_budget_is_answered_with_the_last_one_and_its_index() {
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply((1..=3).map(create)).await.unwrap();
        // Under `DIGEST_CHEAP`: a digest is taken again once anything was applied.
        sm.inner.hash_delay_ms.store(50, Ordering::Relaxed);
        assert_eq!(
            sm.digest_within(Duration::ZERO).await,
            (0, String::new()),
            "none taken yet"
        );
        // This caller waits for the hash the first one started.
        let (index, first) = sm.digest_within(Duration::from_secs(60)).await;
        assert_eq!(index, 3);
        assert_eq!(first.len(), 64, "{first}");
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 1);
        // Spacing is not this test's (`a_cheap_digest_is_taken_again...`):
        // on a loaded box the delayed hash can measure past `DIGEST_CHEAP`,
        // and the next digest would then wait out its spacing.
        if let Some(d) = sm.inner.last_digest.lock().as_mut() {
            d.took = Duration::ZERO;
        }

        sm.apply([create(4)]).await.unwrap();
        assert_eq!(
            sm.digest_within(Duration::ZERO).await,
            (3, first.clone()),
            "the last digest, of the index it was taken at"
        );
        let (index, second) = sm.digest_within(Duration::from_secs(60)).await;
        assert_eq!(index, 4);
        assert_ne!(second, first);
        assert_eq!(sm.inner.digests_taken.load(Ordering::Relaxed), 2);
        // The same as a caller that waits for it.
        assert_eq!(sm.digest().await, (4, second));
    }

    #[tokio::test]
    async fn applied_state_is_read_from_memory_until_a_flush_writes_it_with_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply((1..=3).map(create)).await.unwrap();
        assert!(sm.get_job("job-2").is_some(), "queries see applied state");
        assert_eq!(sm.last_applied().map(|l| l.index), Some(3));
        assert_eq!(sm.persisted_applied(), None, "nothing written yet");
        assert_eq!(sm.writes_total(), 0);
        sm.flush().await.unwrap();
        assert_eq!(sm.persisted_applied().map(|l| l.index), Some(3));
        assert!(sm.writes_total() > 0);
        assert!(sm.get_job("job-2").is_some());
    }

    #[tokio::test]
    async fn keys_rewritten_within_a_window_reach_sled_once_and_the_state_is_the_same() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut every = open_flushing_every(a_dir.path(), 0);
        let mut windowed = open_windowed(b_dir.path());
        // Each job created and deleted again, one entry per apply call.
        let entries = || {
            (1..=20).map(|i| {
                if i % 2 == 1 {
                    create(i)
                } else {
                    delete(i, i - 1)
                }
            })
        };
        for e in entries() {
            every.apply([e]).await.unwrap();
        }
        for e in entries() {
            windowed.apply([e]).await.unwrap();
        }
        windowed.flush().await.unwrap();
        assert_eq!(every.digest().await, windowed.digest().await);
        // Meta keys rewritten by every entry, and the jobs created and
        // deleted again, reach sled once or not at all (42 vs 81 writes).
        assert!(
            windowed.writes_total() * 3 < every.writes_total() * 2,
            "windowed {} vs every batch {}",
            windowed.writes_total(),
            every.writes_total()
        );
    }

    /// Keys put and deleted again within one window are dropped from it,
    /// not carried to sled as deletions; a key that reached a sealed
    /// window or sled keeps its deletion.
    #[tokio::test]
    async fn a_key_put_and_deleted_within_one_window_is_never_written() {
        let (dir, ref_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(dir.path());
        sm.apply([create(1)]).await.unwrap();
        sm.flush().await.unwrap(); // job-1 in sled
        sm.apply([create(2)]).await.unwrap();
        assert!(
            sm.inner.dirty.write().seal(),
            "a tick: job-2 in a sealed window"
        );
        sm.apply([create(3)]).await.unwrap();
        sm.apply([delete(4, 1), delete(5, 2), delete(6, 3)])
            .await
            .unwrap();
        {
            let dirty = sm.inner.dirty.read();
            let open = |id: &str| dirty.open.get(&keys::job(id)).cloned();
            assert_eq!(open("job-1"), Some(None), "in sled: deleted there");
            assert_eq!(open("job-2"), Some(None), "in a sealed window");
            assert_eq!(open("job-3"), None, "never below the open window");
        }
        sm.flush().await.unwrap();
        let mut reference = open_flushing_every(ref_dir.path(), 0);
        for e in [
            create(1),
            create(2),
            create(3),
            delete(4, 1),
            delete(5, 2),
            delete(6, 3),
        ] {
            reference.apply([e]).await.unwrap();
        }
        assert_eq!(sm.digest().await, reference.digest().await);
    }

    /// The timer gauge counts the wheel entries sled holds: it moves as a
    /// window is written (a small one in one batch, a large one through
    /// its redo record), and an entry put and deleted within one window
    /// never counts.
    #[tokio::test]
    async fn the_timer_count_follows_the_wheel_entries_written_to_sled() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        let counts = |sm: &StateMachine| (counted(sm), count_wheel(&sm.inner.tree));
        sm.apply((1..=3).map(create)).await.unwrap();
        assert_eq!(counts(&sm), (0, 0), "applied, held in memory");
        sm.flush().await.unwrap();
        assert_eq!(counts(&sm), (3, 3));
        // job-1's entry leaves sled; job-5's comes and goes in the window.
        sm.apply([delete(4, 1), create(5), delete(6, 5)])
            .await
            .unwrap();
        sm.flush().await.unwrap();
        assert_eq!(counts(&sm), (2, 2));
        let n = CREATES_PAST_A_WINDOW;
        sm.apply((7..7 + n).map(create)).await.unwrap();
        sm.flush().await.unwrap();
        assert!(!has_redo(&sm));
        assert_eq!(counts(&sm), (2 + n, 2 + n), "windows past one batch");
        drop(sm);
        let mut reopened = open_windowed(dir.path());
        assert_eq!(counted(&reopened), 2 + n, "counted again after open");
        // Windows written right after open, before or after the count: exact.
        drop(reopened);
        reopened = open_windowed(dir.path());
        reopened.apply([delete(7 + n, 7)]).await.unwrap();
        reopened.flush().await.unwrap();
        assert_eq!(counted(&reopened), 1 + n);
    }

    /// The timer count, once counted after open.
    fn counted(sm: &StateMachine) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(n) = sm.pending_timers() {
                return n;
            }
            assert!(std::time::Instant::now() < deadline, "never counted");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A window sealed between a chunk's apply (which found a deleted key
    /// nowhere below the open window) and its merge may hold that key: the
    /// merge looks again and keeps the deletion.
    #[test]
    fn a_deletion_found_vanished_is_kept_if_a_window_was_sealed_before_the_merge() {
        let tree = crate::core::MemView::default();
        let key = b"ja".to_vec();
        let put: Pending = [(key.clone(), Some(b"v".to_vec()))].into();
        let del: Pending = [(key.clone(), None)].into();
        let none = |seals| Vanished {
            keys: Vec::new(),
            seals,
        };
        let vanished = |seals| Vanished {
            keys: vec![key.clone()],
            seals,
        };
        // No seal in between: put and deletion cancel out.
        let mut d = Dirty::default();
        d.merge(put.clone(), none(0), &tree);
        d.merge(del.clone(), vanished(0), &tree);
        assert!(d.open.is_empty());
        assert_eq!(d.open_bytes, 0);
        // Found vanished at 0 seals; the put is sealed before the merge.
        let mut d = Dirty::default();
        d.merge(put, none(0), &tree);
        assert!(d.seal());
        d.merge(del, vanished(0), &tree);
        assert_eq!(d.open.get(&key), Some(&None), "the deletion stays");
    }

    /// A long batch is applied in windows sealed at the key bound; the
    /// flusher writes a full one at once, each at its own entry boundary.
    #[tokio::test]
    async fn a_long_batch_is_sealed_in_windows_at_the_key_bound_and_the_flusher_writes_them() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(a_dir.path());
        let flusher = tokio::spawn(sm.clone().run_flusher());
        let n = CREATES_PAST_A_WINDOW;
        sm.apply((1..=n).map(create)).await.unwrap();
        assert_eq!(sm.last_applied().map(|l| l.index), Some(n));
        // Written by the flusher, woken by the full window (not its 60 s tick).
        while sm.persisted_applied().is_none() || has_sealed(&sm) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        flusher.abort();
        let persisted = sm.persisted_applied().map_or(0, |l| l.index);
        assert!(
            (1..n).contains(&persisted),
            "written at a window's entry boundary, got {persisted}"
        );
        assert!(sm.unflushed_keys() < TEST_FLUSH_KEYS);
        assert!(
            !has_redo(&sm),
            "the redo record goes once its window is written"
        );
        let mut every = open_flushing_every(b_dir.path(), 0);
        every.apply((1..=n).map(create)).await.unwrap();
        let want = every.digest().await;
        assert_eq!(sm.digest().await, want);
        // The flusher thread ends with its task: nothing holds the store.
        sm.flush().await.unwrap();
        drop(sm);
        let reopened = open_windowed(a_dir.path());
        assert_eq!(reopened.persisted_applied().map(|l| l.index), Some(n));
        assert_eq!(reopened.digest().await, want);
    }

    /// One step of a window's life, for the run bounds' and heads'
    /// property test. `key` names a job (`key % 3`) and a key space
    /// (`key / 3`: its runs, their inputs, their backfills).
    #[derive(Clone, Debug)]
    enum RunStep {
        /// A chunk puts (or deletes) the key of `key` at `at`.
        Merge {
            key: u8,
            at: u8,
            put: bool,
        },
        Seal,
        /// The flusher writes the oldest sealed window to sled.
        Write,
        /// Apply reads the key of `key` at `at`.
        Read {
            key: u8,
            at: u8,
        },
        /// Apply reads the first `limit` runs of job `job`.
        Range {
            job: u8,
            limit: usize,
        },
    }

    fn run_step() -> impl proptest::strategy::Strategy<Value = RunStep> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..9, 0u8..30, proptest::bool::weighted(0.7))
                .prop_map(|(key, at, put)| RunStep::Merge { key, at, put }),
            1 => Just(RunStep::Seal),
            1 => Just(RunStep::Write),
            2 => (0u8..9, 0u8..32).prop_map(|(key, at)| RunStep::Read { key, at }),
            2 => (0u8..3, 1..HEAD_ROWS + 2).prop_map(|(job, limit)| RunStep::Range { job, limit }),
        ]
    }

    fn run_side_key(key: u8, at: u8) -> Vec<u8> {
        let id = RunId::new(&format!("job-{}", key % 3), i64::from(at));
        match key / 3 {
            0 => keys::run(&id),
            1 => keys::run_inputs(&id),
            _ => keys::run_backfill(&id),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(96))]
        /// Reads through `Dirty`'s windows with its run bounds and run
        /// heads are the reads without them, whatever was in sled before,
        /// put or deleted in windows, sealed and written meanwhile: a bound
        /// never hides a key sled holds (of a run or beside one), and a
        /// head reads a job's first runs as the windows over sled do.
        #[test]
        fn run_bounds_and_heads_never_change_a_read(
            before in proptest::collection::btree_set((0u8..9, 0u8..30), 0..16),
            steps in proptest::collection::vec(run_step(), 1..80),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let tree = db.open_tree("state").unwrap();
            for (key, at) in &before {
                tree.insert(run_side_key(*key, *at), &b"old"[..]).unwrap();
            }
            let mut d = Dirty::default();
            let mut tick = 0u8;
            for step in steps {
                match step {
                    RunStep::Merge { key, at, put } => {
                        tick = tick.wrapping_add(1);
                        let v = put.then(|| vec![tick]);
                        let net: Pending = [(run_side_key(key, at), v)].into();
                        let vanished = Vanished { keys: Vec::new(), seals: d.seals };
                        d.merge(net, vanished, &TreeView(&tree));
                    }
                    RunStep::Seal => {
                        d.seal();
                    }
                    RunStep::Write => {
                        if let Some(w) = d.sealed.front() {
                            for (k, v) in w.pairs.iter() {
                                match v {
                                    Some(v) => tree.insert(k.as_slice(), v.as_slice()).unwrap(),
                                    None => tree.remove(k.as_slice()).unwrap(),
                                };
                            }
                            d.written();
                        }
                    }
                    RunStep::Read { key, at } => {
                        let layers = d.layers();
                        let base = TreeView(&tree);
                        let k = run_side_key(key, at);
                        let want = Stack::new(&layers, &base).get(&k);
                        let got = Stack::of_dirty(&layers, &base, &d).get(&k);
                        proptest::prop_assert_eq!(got, want, "key {} at {}", key, at);
                    }
                    RunStep::Range { job, limit } => {
                        let layers = d.layers();
                        let base = TreeView(&tree);
                        let start = keys::runs_of(&format!("job-{job}"));
                        let end = keys::prefix_end(&start);
                        let want = Stack::new(&layers, &base).range(&start, &end, limit);
                        let got = Stack::of_dirty(&layers, &base, &d).range(&start, &end, limit);
                        proptest::prop_assert_eq!(got, want, "job {} limit {}", job, limit);
                    }
                }
            }
        }
    }

    proptest::proptest! {
        /// Reads through windows (oldest first) over a base are the reads
        /// of the windows applied to the base in order, for gets and for
        /// ranges of every limit: deletions hide, newer windows win.
        #[test]
        fn a_stack_of_windows_reads_as_the_windows_applied_in_order(
            base in proptest::collection::btree_map(0u8..40, 0u8..4, 0..30),
            windows in proptest::collection::vec(
                proptest::collection::btree_map(0u8..40, proptest::option::of(4u8..8), 0..20),
                0..4,
            ),
            start in 0u8..40,
            len in 0u8..45,
            limit in 0usize..50,
        ) {
            let key = |k: u8| vec![b'k', k];
            let mut merged = core::MemView::default();
            for (k, v) in &base {
                merged.map.insert(key(*k), vec![*v]);
            }
            let below = core::MemView { map: merged.map.clone() };
            let layers: Vec<Pending> = windows
                .iter()
                .map(|w| w.iter().map(|(k, v)| (key(*k), v.map(|v| vec![v]))).collect())
                .collect();
            for w in &layers {
                for (k, v) in w {
                    match v {
                        Some(v) => merged.map.insert(k.clone(), v.clone()),
                        None => merged.map.remove(k),
                    };
                }
            }
            let refs: Vec<&Pending> = layers.iter().collect();
            let stack = Stack::new(&refs, &below);
            for k in 0u8..40 {
                proptest::prop_assert_eq!(stack.get(&key(k)), merged.get(&key(k)));
            }
            let (from, to) = (key(start), key(start.saturating_add(len)));
            proptest::prop_assert_eq!(stack.range(&from, &to, limit), merged.range(&from, &to, limit));
        }
    }

    fn has_sealed(sm: &StateMachine) -> bool {
        !sm.inner.dirty.read().sealed.is_empty()
    }

    /// Before the flusher, a full window was written on apply's path: a
    /// second of creates and fires waited behind every flush.
    #[allow(clippy::await_holding_lock)] // the test holds a lock as its owner would
    #[tokio::test]
    async fn apply_goes_on_while_a_sealed_window_is_written() {
        let (dir, ref_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(dir.path());
        let n = CREATES_PAST_A_WINDOW;
        let handle = sm.clone();
        // Held across awaits on purpose: as the flusher holds it while it writes.
        let writing = handle.inner.write_lock.lock();
        sm.apply((1..=n).map(create)).await.unwrap();
        sm.apply([delete(n + 1, 1)]).await.unwrap();
        assert!(has_sealed(&sm));
        assert_eq!(sm.persisted_applied(), None, "nothing written yet");
        assert!(sm.get_job("job-1").is_none() && sm.get_job("job-2").is_some());
        drop(writing);
        sm.write_sealed().unwrap();
        assert!(!has_sealed(&sm));
        let persisted = sm.persisted_applied().map_or(0, |l| l.index);
        assert!((1..n).contains(&persisted), "{persisted}");
        assert!(sm.get_job("job-1").is_none(), "reads see the newest state");
        sm.flush().await.unwrap();
        assert_eq!(sm.unflushed_keys(), 0);
        let mut reference = open_flushing_every(ref_dir.path(), 0);
        reference.apply((1..=n).map(create)).await.unwrap();
        reference.apply([delete(n + 1, 1)]).await.unwrap();
        assert_eq!(sm.digest().await, reference.digest().await);
    }

    /// Past what it may hold in memory, apply writes the sealed windows
    /// itself, after the write under way: a slow disk slows apply, it does
    /// not grow memory.
    #[allow(clippy::await_holding_lock)] // the test holds a lock as its owner would
    #[tokio::test]
    async fn past_the_held_limits_apply_waits_for_the_write_under_way_then_writes_itself() {
        let dir = tempfile::tempdir().unwrap();
        let held = 20_000;
        let opts = Options {
            flush_ms: FLUSH_MS_MAX,
            flush_keys: TEST_FLUSH_KEYS,
            held_limits: (held, usize::MAX),
            ..Default::default()
        };
        let (_, sm) = super::super::open(dir.path(), 8 << 20, opts).unwrap();
        let n = 2 * CREATES_PAST_A_WINDOW;
        // held across awaits on purpose
        let writing = sm.inner.write_lock.lock();
        let applying = tokio::spawn({
            let mut sm = sm.clone();
            async move { sm.apply((1..=n).map(create)).await.map(|r| r.len()) }
        });
        while sm.unflushed_keys() < held {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let reached = sm.unflushed_keys();
        assert!(reached < held + 16, "applied up to the limit: {reached}");
        assert!(!applying.is_finished(), "apply waits for the write lock");
        assert_eq!(sm.persisted_applied(), None);
        drop(writing);
        assert_eq!(applying.await.unwrap().unwrap(), n as usize);
        assert!(
            sm.persisted_applied().is_some(),
            "apply wrote windows itself"
        );
        assert!(sm.unflushed_keys() <= held);
        assert_eq!(sm.last_applied().map(|l| l.index), Some(n));
    }

    /// A window that could not be written stops apply with the reason, and
    /// nothing more is applied.
    #[tokio::test]
    async fn a_failed_window_write_stops_apply_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply([create(1)]).await.unwrap();
        *sm.inner.write_failed.lock() = Some("writing applied state to sled: no space".into());
        let e = sm.apply([create(2)]).await.unwrap_err().to_string();
        assert!(e.contains("no space"), "{e}");
        assert_eq!(sm.last_applied().map(|l| l.index), Some(1));
    }

    /// The flush window of the tests' nodes: past one sled batch
    /// ([`BATCH_KEYS`]), so a full window goes through the redo record.
    const TEST_FLUSH_KEYS: usize = 16_384;
    /// Creates whose keys fill more than one flush window ([`TEST_FLUSH_KEYS`]).
    const CREATES_PAST_A_WINDOW: u64 = 6_000;

    fn has_redo(sm: &StateMachine) -> bool {
        !sm.inner.redo.is_empty()
    }

    /// Applies `n` creates into memory only (no flush), with the window
    /// past one sled batch.
    async fn windowed_with_creates(dir: &Path, n: u64) -> StateMachine {
        let mut sm = open_windowed(dir);
        sm.apply((1..=n).map(create)).await.unwrap();
        assert!(sm.unflushed_keys() > BATCH_KEYS, "{}", sm.unflushed_keys());
        assert_eq!(sm.persisted_applied(), None);
        sm
    }

    /// A flush larger than one sled batch cut after some of its pairs (the
    /// worst case of a crash: those pairs durable, the rest not) is written
    /// again from its redo record at open, whichever pairs made it.
    #[tokio::test]
    async fn a_flush_past_one_batch_cut_midway_is_written_again_at_open() {
        let ref_dir = tempfile::tempdir().unwrap();
        let mut reference = open_flushing_every(ref_dir.path(), 0);
        reference.apply((1..=2000).map(create)).await.unwrap();
        let want = reference.digest().await;
        for cut in [0, 1, 2500, 6000] {
            let dir = tempfile::tempdir().unwrap();
            let sm = windowed_with_creates(dir.path(), 2000).await;
            let keys = sm.unflushed_keys();
            assert!(cut < keys, "{cut} of {keys}");
            sm.inner.redo_stop.store(cut, Ordering::Relaxed);
            sm.flush().await.unwrap();
            assert!(has_redo(&sm), "cut at {cut}: the record stays");
            drop(sm);
            let restarted = open_windowed(dir.path());
            assert!(!has_redo(&restarted), "cut at {cut}");
            assert_eq!(restarted.persisted_applied().map(|l| l.index), Some(2000));
            assert_eq!(restarted.digest().await, want, "cut at {cut}");
        }
    }

    /// A redo record left behind by a flush whose pairs were all made
    /// durable (a later flush's `last_applied` is past it) is dropped at
    /// open, not written over the newer state.
    #[tokio::test]
    async fn a_redo_record_older_than_the_persisted_state_is_dropped_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = windowed_with_creates(dir.path(), 2000).await;
        sm.flush().await.unwrap();
        sm.apply([delete(2001, 7)]).await.unwrap();
        sm.flush().await.unwrap();
        let stale: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            vec![(keys::job("job-7"), Some(b"stale".to_vec()))];
        sm.inner
            .redo
            .insert(redo_chunk_key(0), encode(&stale))
            .unwrap();
        let head = RedoHead {
            index: 2000,
            chunks: 1,
        };
        sm.inner.redo.insert(REDO_HEAD, encode(&head)).unwrap();
        let before = sm.digest().await;
        drop(sm);
        let restarted = open_windowed(dir.path());
        assert!(!has_redo(&restarted));
        assert!(restarted.get_job("job-7").is_none(), "deleted at 2001");
        assert_eq!(restarted.digest().await, before);
    }

    /// A redo record missing a chunk is refused at open with what is wrong,
    /// and nothing is written.
    #[tokio::test]
    async fn a_redo_record_missing_a_chunk_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let sm = windowed_with_creates(dir.path(), 2000).await;
        sm.inner.redo_stop.store(0, Ordering::Relaxed);
        sm.flush().await.unwrap();
        sm.inner.redo.remove(redo_chunk_key(0)).unwrap();
        drop(sm);
        // Reopened at once, sled's flusher may hold the directory's lock a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let e = loop {
            let e = super::super::open(dir.path(), 8 << 20, Options::default())
                .err()
                .expect("refused")
                .to_string();
            if e.contains("redo") || std::time::Instant::now() > deadline {
                break e;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(e.contains("redo record") && e.contains("chunk 0 of"), "{e}");
        assert!(e.contains("missing"), "{e}");
    }

    #[tokio::test]
    async fn a_crash_before_the_flush_is_made_good_by_applying_the_log_again() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut crashed = open_windowed(a_dir.path());
        crashed.apply((1..=3).map(create)).await.unwrap();
        crashed.flush().await.unwrap();
        crashed.apply([create(4), delete(5, 2)]).await.unwrap();
        drop(crashed); // what was applied after the flush is lost
        let mut restarted = open_windowed(a_dir.path());
        assert_eq!(restarted.last_applied().map(|l| l.index), Some(3));
        assert!(restarted.get_job("job-2").is_some());
        // openraft applies the log again from the persisted index.
        restarted.apply([create(4), delete(5, 2)]).await.unwrap();
        let mut reference = open(b_dir.path());
        reference
            .apply([create(1), create(2), create(3), create(4), delete(5, 2)])
            .await
            .unwrap();
        assert_eq!(restarted.digest().await, reference.digest().await);
    }

    #[tokio::test]
    async fn a_snapshot_is_built_from_flushed_state_so_purges_never_pass_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply((1..=5).map(create)).await.unwrap();
        assert_eq!(sm.persisted_applied(), None);
        let snap = build(&mut sm).await;
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(5));
        assert_eq!(sm.persisted_applied(), snap.meta.last_log_id);
    }

    async fn build(sm: &mut StateMachine) -> Snapshot {
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.unwrap()
    }

    /// Pins `sm`'s sled, as a snapshot build or a digest does.
    async fn pin(sm: &StateMachine) -> Pinned {
        let serial = sm.inner.pin_lock.clone().lock_owned().await;
        sm.pin(serial).await.unwrap()
    }

    /// A pin never takes the apply lock: while it waits for a write
    /// under way (here the write lock held, as by the flusher) and then
    /// writes a full window, apply goes on into memory, and sled is pinned
    /// at the index applied when the pin began. It used to write under
    /// the apply lock: the whole window, later what apply added during its
    /// last round of writing before the lock.
    #[allow(clippy::await_holding_lock)] // the test holds a lock as its owner would
    #[tokio::test]
    async fn a_pin_never_holds_apply_and_pins_the_index_it_began_at() {
        let (dir, ref_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(dir.path());
        let n = CREATES_PAST_A_WINDOW;
        sm.apply((1..=n).map(create)).await.unwrap();
        let handle = sm.clone();
        // Held across awaits on purpose: as the flusher holds it while it writes.
        let writing = handle.inner.write_lock.lock();
        let pinning = {
            let sm = sm.clone();
            tokio::spawn(async move { pin(&sm).await.applied.map(|l| l.index) })
        };
        // The freeze sealed the open window and waits for the write lock.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !sm.inner.dirty.read().open.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the pin never sealed");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(sm.inner.pin_pending.load(Ordering::Acquire));
        let applied = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            sm.apply([create(n + 1)]),
        )
        .await;
        let waiting = !pinning.is_finished();
        drop(writing); // first: a failed assert must not leave the freeze blocked
        assert!(applied.is_ok(), "apply was held by the pin");
        assert!(waiting, "the pin waited for the write lock");
        assert_eq!(pinning.await.unwrap(), Some(n), "pinned where it began");
        assert!(!sm.inner.pin_pending.load(Ordering::Acquire));
        assert!(sm.unflushed_keys() > 0, "entry n + 1 is held, not written");
        let mut reference = open_flushing_every(ref_dir.path(), 0);
        reference.apply((1..=n + 1).map(create)).await.unwrap();
        assert_eq!(sm.digest().await, reference.digest().await);
    }

    /// Before this, a snapshot build or digest held the apply lock while it
    /// read the whole tree: at 1M timers apply stopped for seconds, and
    /// every fire and create with it. Later it held sled still for the
    /// read: at 10M timers apply waited out most of a 26 s read.
    #[tokio::test]
    async fn windows_are_written_under_a_pinned_read_and_it_reads_the_state_at_its_index() {
        let (dir, ref_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(dir.path());
        let mut reference = open_windowed(ref_dir.path());
        sm.apply((1..=5).map(create)).await.unwrap();
        reference.apply((1..=5).map(create)).await.unwrap();
        let pinned = pin(&sm).await;
        assert_eq!(pinned.applied.map(|l| l.index), Some(5));
        // Half read: keys behind the read and ahead of it are written.
        let mut read = Vec::new();
        {
            let mut p = sm.inner.pin.lock();
            let chunk = p.as_mut().unwrap().next_chunk(&sm.inner.tree, 3).unwrap();
            read.extend(chunk.unwrap());
        }
        sm.apply((6..=8).map(create)).await.unwrap();
        sm.apply([delete(9, 1), delete(10, 5)]).await.unwrap();
        assert!(sm.inner.dirty.write().seal());
        sm.write_sealed().unwrap();
        assert_eq!(
            sm.persisted_applied().map(|l| l.index),
            Some(10),
            "written under the pin"
        );
        assert!(TreeView(&sm.inner.tree).get(&keys::job("job-5")).is_none());
        assert!(sm.get_job("job-8").is_some());
        pinned
            .for_each(&mut |k, v| {
                read.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        let mut at_5 = Vec::new();
        reference.flush().await.unwrap();
        reference
            .inner
            .tree
            .for_each(&mut |k, v| at_5.push((k.to_vec(), v.to_vec())))
            .unwrap();
        assert!(read == at_5, "the pinned read is the state at index 5");
        assert!(
            sm.inner.pin.lock().as_ref().unwrap().peak_bytes() > 0,
            "values were kept"
        );
        drop(pinned);
        assert!(sm.inner.pin.lock().is_none());
        reference.apply((6..=8).map(create)).await.unwrap();
        reference
            .apply([delete(9, 1), delete(10, 5)])
            .await
            .unwrap();
        assert_eq!(sm.digest().await, reference.digest().await);
        assert_eq!(sm.frozen_waits(), 0);
    }

    /// Opens with a pin that keeps nothing: a window written under a pinned
    /// read holds sled still until the read ends.
    fn open_holding_under_a_pin(dir: &Path, held_limits: (usize, usize)) -> StateMachine {
        let opts = Options {
            flush_ms: FLUSH_MS_MAX,
            flush_keys: TEST_FLUSH_KEYS,
            held_limits,
            pin_bytes: 0,
            ..Default::default()
        };
        open_with(dir, opts)
    }

    /// Windows sealed while sled was held still reach it one at a time
    /// once it is let go, each with its own `last_applied`: a crash between
    /// two of them leaves sled at an entry boundary, and the log makes up
    /// the rest.
    #[tokio::test]
    async fn windows_sealed_while_sled_was_held_are_written_one_by_one_each_at_its_index() {
        let (dir, ref_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_holding_under_a_pin(dir.path(), (HELD_KEYS, HELD_BYTES));
        sm.apply((1..=3).map(create)).await.unwrap();
        let frozen = pin(&sm).await;
        sm.apply((4..=5).map(create)).await.unwrap();
        assert!(sm.inner.dirty.write().seal(), "a tick");
        sm.apply([delete(6, 4)]).await.unwrap();
        assert!(sm.inner.dirty.write().seal(), "a tick");
        sm.apply((7..=8).map(create)).await.unwrap();
        sm.write_sealed().unwrap();
        assert_eq!(sm.persisted_applied().map(|l| l.index), Some(3), "held");
        assert!(sm.inner.held.load(Ordering::Acquire), "the pin was full");
        assert_eq!(sm.inner.dirty.read().sealed.len(), 2);
        drop(frozen);
        {
            let _w = sm.inner.write_lock.lock();
            assert!(sm.write_oldest().unwrap());
        }
        assert_eq!(sm.persisted_applied().map(|l| l.index), Some(5));
        assert!(sm.get_job("job-4").is_none(), "reads see the newest state");
        assert!(sm.get_job("job-8").is_some());
        drop(sm);
        let mut restarted = open_holding_under_a_pin(dir.path(), (HELD_KEYS, HELD_BYTES));
        assert_eq!(restarted.persisted_applied().map(|l| l.index), Some(5));
        assert!(
            restarted.get_job("job-4").is_some(),
            "deleted only at index 6"
        );
        restarted.apply([delete(6, 4)]).await.unwrap();
        restarted.apply((7..=8).map(create)).await.unwrap();
        restarted.flush().await.unwrap();
        assert_eq!(restarted.unflushed_keys(), 0);
        assert_eq!(restarted.persisted_applied().map(|l| l.index), Some(8));
        let mut reference = open_windowed(ref_dir.path());
        reference.apply((1..=5).map(create)).await.unwrap();
        reference.apply([delete(6, 4)]).await.unwrap();
        reference.apply((7..=8).map(create)).await.unwrap();
        assert_eq!(restarted.digest().await, reference.digest().await);
    }

    #[tokio::test]
    async fn past_the_held_limits_while_sled_is_held_apply_waits_for_it_to_be_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_holding_under_a_pin(dir.path(), (10, usize::MAX));
        sm.apply([create(1)]).await.unwrap();
        let frozen = pin(&sm).await;
        let applying = tokio::spawn({
            let mut sm = sm.clone();
            async move { sm.apply((2..=40).map(create)).await.map(|r| r.len()) }
        });
        while sm.frozen_waits() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(!applying.is_finished(), "apply waits while sled is held");
        let held = sm.unflushed_keys();
        assert!((10..40).contains(&held), "{held} keys held in memory");
        assert_eq!(sm.persisted_applied().map(|l| l.index), Some(1));
        drop(frozen);
        assert_eq!(applying.await.unwrap().unwrap(), 39);
        assert_eq!(sm.last_applied().map(|l| l.index), Some(40));
        sm.flush().await.unwrap();
        assert_eq!(sm.persisted_applied().map(|l| l.index), Some(40));
        assert_eq!(sm.list_jobs("", 100).len(), 40);
    }

    /// A snapshot built while entries are applied holds the state at its
    /// own index exactly: job-1 ..= job-N and `last_applied` N.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_built_while_entries_apply_is_the_state_at_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut sm = open_windowed(dir.path());
        sm.apply((1..=200).map(create)).await.unwrap();
        let applying = tokio::spawn({
            let mut sm = sm.clone();
            async move {
                for i in 201..=600 {
                    sm.apply([create(i)]).await.unwrap();
                }
            }
        });
        let snap = build(&mut sm).await;
        applying.await.unwrap();
        let index = snap.meta.last_log_id.unwrap().index;
        assert!(index >= 200);
        let mut reader = snapfile::Reader::open(&sm.snapshot_file()).unwrap();
        let (mut jobs, mut last) = (std::collections::BTreeSet::new(), None);
        while let Some((k, v)) = reader.next_pair().unwrap() {
            if k.first() == Some(&keys::JOB) {
                jobs.insert(String::from_utf8(k[1..].to_vec()).unwrap());
            } else if k == keys::META_LAST_APPLIED {
                last = decode::<LogId>(&v).ok();
            }
        }
        assert_eq!(last, snap.meta.last_log_id);
        let want: std::collections::BTreeSet<String> =
            (1..=index).map(|i| format!("job-{i}")).collect();
        assert_eq!(jobs, want);
        assert_eq!(sm.last_applied().map(|l| l.index), Some(600));
    }

    /// The (index, seq, job) of every event `sm` holds from `from` on.
    fn watched(sm: &StateMachine, from: u64) -> Result<Vec<(u64, u32, String)>, u64> {
        let at = watch::Position {
            index: from,
            seq: 0,
        };
        let read = sm.watch().read(at, &Default::default(), usize::MAX);
        let events = read.map_err(|c| c.oldest)?.events;
        Ok(events
            .into_iter()
            .map(|e| (e.at.index, e.at.seq, e.job))
            .collect())
    }

    #[tokio::test]
    async fn watch_events_carry_their_entry_index_and_a_restart_or_install_compacts_the_ring() {
        let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut sm = open_windowed(a_dir.path());
        sm.apply((1..=2).map(create)).await.unwrap();
        sm.flush().await.unwrap();
        sm.apply([delete(3, 1)]).await.unwrap();
        let want = |i: u64, id: u64| (i, 0, format!("job-{id}"));
        assert_eq!(
            watched(&sm, 0),
            Ok(vec![want(1, 1), want(2, 2), want(3, 1)])
        );
        assert_eq!(watched(&sm, 3), Ok(vec![want(3, 1)]));
        drop(sm);
        // Entries up to the flushed index were applied by the old process.
        let mut restarted = open_windowed(a_dir.path());
        assert_eq!(watched(&restarted, 2), Err(3));
        restarted.apply([delete(3, 1)]).await.unwrap();
        assert_eq!(watched(&restarted, 3), Ok(vec![want(3, 1)]));

        let (_, snap) = node_with_snapshot(b_dir.path(), 5).await;
        let meta = snap.meta.clone();
        let rx = receive(&mut restarted, snap).await;
        restarted.install_snapshot(&meta, rx).await.unwrap();
        assert_eq!(
            watched(&restarted, 3),
            Err(6),
            "the ring starts after the snapshot"
        );
    }

    /// A node with `jobs` applied and the snapshot it built.
    async fn node_with_snapshot(dir: &Path, jobs: u64) -> (StateMachine, Snapshot) {
        let mut sm = open(dir);
        sm.apply((1..=jobs).map(create)).await.unwrap();
        let snap = build(&mut sm).await;
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
