//! The leader's dispatcher: per-group queues of ready run attempts, the
//! connected workers and their free capacity, and the lease of every
//! attempt handed out. It only ever dispatches what a committed Fire (or
//! retry) made ready: its input is the state machine's effects.
//!
//! Routing (per job, see [`Route`]) chooses among the group's workers:
//! least loaded, round robin, rendezvous hashing of the job id, or label
//! match. Whatever the route, a retry prefers a worker other than the one
//! whose attempt just ended, and the runs of one sharded or broadcast
//! occurrence prefer workers not already holding one of them.
//!
//! Invariants: never more attempts in flight to a worker than its capacity;
//! an attempt with a live lease is not handed out again; one dispatch pass
//! looks at most `SCAN_MAX` attempts per group, so attempts no worker can
//! take (labels, hashing) cost bounded work.
//!
//! The queues are a window over the replicated active-runs table: a group's
//! queue holds at most `queue_max` attempts. A ready attempt that finds it
//! full is not kept in memory; the group is marked overflowed, and once its
//! queue drains to `queue_max / 2` the leader reads the active table from
//! the group's cursor in pages of `PAGE_ROWS` ([`Dispatcher::page_wanted`],
//! [`Dispatcher::page_in`]) until the queue is full again or the table ends.
//! An attempt that overflowed behind the cursor makes the scan start over,
//! so none is lost; one already queued or leased is skipped, so none is
//! queued twice.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use crate::core::{keys, limits, ActiveRun, ReadyRun, Route, RunId, RunState};

/// Most ready attempts queued in memory per group (the default window).
pub const QUEUE_MAX: usize = 100_000;
/// Rows of the active-runs table read per page when paging attempts back in.
pub const PAGE_ROWS: usize = 1024;
/// Most queued attempts one dispatch pass examines per group.
pub const SCAN_MAX: usize = 1024;
/// A worker that neither heartbeats nor finishes for this long loses its
/// attempts, even before their deadline (worker SDKs heartbeat every second).
pub const LEASE_MS: i64 = 5_000;

/// A message for one connected worker's stream.
#[derive(Debug, Clone)]
pub enum ToWorker {
    /// `fired_at_ms` and `shard_count` come from the ready attempt, so the
    /// worker's session need not read the run record back (it does when
    /// the attempt was rebuilt from the active-run table: `None`).
    Assign {
        run: RunId,
        attempt: u32,
        deadline_ms: i64,
        fired_at_ms: Option<i64>,
        shard_count: u32,
    },
    Cancel {
        run: RunId,
        attempt: u32,
    },
}

#[derive(Debug, Clone)]
struct Queued {
    priority: u8,
    run: RunId,
    attempt: u32,
    timeout_ms: u64,
    route: Route,
    shard_count: u32,
    fired_at_ms: Option<i64>,
    /// When it became ready here (for the dispatch latency metric).
    ready_at: Instant,
}

impl Ord for Queued {
    // Highest priority first, then earliest scheduled time, then lowest shard.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.run.scheduled_at_ms.cmp(&self.run.scheduled_at_ms))
            .then_with(|| other.run.job.cmp(&self.run.job))
            .then_with(|| other.run.shard.cmp(&self.run.shard))
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What a worker announced in its hello.
#[derive(Debug, Clone, Default)]
pub struct WorkerInfo {
    pub id: String,
    pub groups: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub capacity: usize,
    /// The worker reports an attempt's outcome within this long after its
    /// deadline (it stops the attempt's processes gracefully first); the
    /// lease's hard end waits for it. At most [`STOP_GRACE_MAX_MS`].
    pub stop_grace_ms: i64,
}

/// Upper bound on a worker's announced stop grace.
pub const STOP_GRACE_MAX_MS: i64 = 60_000;

struct Worker {
    id: String,
    groups: Vec<String>,
    labels: BTreeMap<String, String>,
    capacity: usize,
    stop_grace_ms: i64,
    in_flight: HashSet<RunId>,
    tx: mpsc::Sender<ToWorker>,
}

impl Worker {
    fn serves(&self, group: &str, route: &Route) -> bool {
        let labels_match = match route {
            Route::Label(sel) => sel.iter().all(|(k, v)| self.labels.get(k) == Some(v)),
            _ => true,
        };
        labels_match && self.in_group(group)
    }

    fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    fn is_free(&self) -> bool {
        self.in_flight.len() < self.capacity
    }

    /// Whether this worker holds another run of the same occurrence.
    fn holds_sibling(&self, q: &Queued) -> bool {
        q.shard_count > 1
            && self.in_flight.iter().any(|r| {
                r.job == q.run.job && r.scheduled_at_ms == q.run.scheduled_at_ms && *r != q.run
            })
    }
}

#[derive(Debug, Clone)]
struct Lease {
    attempt: u32,
    /// Hard end of the attempt: assignment (or takeover) plus the job's
    /// timeout, plus the worker's stop grace.
    deadline_ms: i64,
    /// Liveness: extended by heartbeats.
    lease_until_ms: i64,
    conn: Option<u64>,
    /// Worker id holding the attempt, kept even when its stream drops so
    /// the retry can still avoid it.
    worker: String,
    expiring: bool,
    /// The attempt was asked to stop: asked again of whichever stream
    /// claims it later (a worker reconnecting to a new leader).
    stop: bool,
}

/// A group whose ready attempts did not all fit its queue: the rest is
/// found by scanning the active table after `cursor` (None: from the start).
#[derive(Debug, Clone, Default)]
struct Overflow {
    cursor: Option<RunId>,
    /// An attempt overflowed at or before the cursor during this scan: when
    /// the scan reaches the end of the table it starts over.
    missed: bool,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, BinaryHeap<Queued>>,
    queued: HashSet<RunId>,
    overflow: BTreeMap<String, Overflow>,
    workers: BTreeMap<u64, Worker>,
    leases: HashMap<RunId, Lease>,
    /// Worker that held a run's last ended attempt: its retry goes elsewhere if it can.
    prev_worker: HashMap<RunId, String>,
    /// Round robin: the connection each group handed its last attempt to.
    rr_last: HashMap<String, u64>,
    next_conn: u64,
}

/// An attempt handed to a worker, to record through the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    pub run: RunId,
    pub attempt: u32,
    pub group: String,
    pub worker: String,
    /// How long it waited here between ready and handed.
    pub waited: Duration,
}

pub struct Dispatcher {
    state: Mutex<State>,
    /// Most attempts queued in memory per group; the rest wait on disk.
    queue_max: usize,
    /// Woken when an overflowed group's queue drained to its low-water mark.
    page_signal: Notify,
}

impl Default for Dispatcher {
    fn default() -> Self {
        Self::with_queue_max(QUEUE_MAX)
    }
}

/// Queue depth and worker count of one group (status and metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub queued: usize,
    pub workers: usize,
    pub in_flight: usize,
}

impl Dispatcher {
    /// A dispatcher whose queues hold at most `queue_max` attempts per group (at least 1).
    pub fn with_queue_max(queue_max: usize) -> Self {
        Dispatcher {
            state: Mutex::default(),
            queue_max: queue_max.max(1),
            page_signal: Notify::new(),
        }
    }

    pub fn queue_max(&self) -> usize {
        self.queue_max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a worker stream; returns its connection id.
    pub fn register(&self, info: WorkerInfo, tx: mpsc::Sender<ToWorker>) -> u64 {
        let mut s = self.lock();
        s.next_conn += 1;
        let conn = s.next_conn;
        let w = Worker {
            id: info.id,
            groups: info.groups,
            labels: info.labels,
            capacity: info.capacity,
            stop_grace_ms: info.stop_grace_ms.clamp(0, STOP_GRACE_MAX_MS),
            in_flight: HashSet::new(),
            tx,
        };
        s.workers.insert(conn, w);
        conn
    }

    /// The worker is stopping: it gets no more attempts (those it holds stay leased).
    pub fn drain(&self, conn: u64) {
        if let Some(w) = self.lock().workers.get_mut(&conn) {
            w.capacity = 0;
        }
    }

    /// The stream closed. Its attempts keep their leases: the worker may
    /// reconnect and finish them; otherwise they expire and are retried.
    pub fn unregister(&self, conn: u64) {
        let mut s = self.lock();
        if let Some(w) = s.workers.remove(&conn) {
            for run in w.in_flight {
                if let Some(l) = s.leases.get_mut(&run) {
                    l.conn = None;
                }
            }
        }
    }

    /// Workers connected per group (distinct worker ids), in group order:
    /// the width of a broadcast occurrence fired now. Bounded by `WIDTHS_MAX` groups.
    pub fn widths(&self) -> Vec<(String, u32)> {
        let s = self.lock();
        let mut ids: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for w in s.workers.values().filter(|w| w.capacity > 0) {
            for g in &w.groups {
                ids.entry(g).or_default().insert(&w.id);
            }
        }
        ids.into_iter()
            .take(limits::WIDTHS_MAX)
            .map(|(g, ids)| (g.to_string(), ids.len() as u32))
            .collect()
    }

    /// A committed attempt is ready for a worker. If its group's queue is
    /// full it stays only on disk, and the group is paged in later.
    pub fn ready(&self, r: ReadyRun) {
        let mut s = self.lock();
        if s.is_known(&r.run, r.attempt) {
            return;
        }
        if s.queues.get(&r.group).map_or(0, BinaryHeap::len) >= self.queue_max {
            let o = s.overflow.entry(r.group).or_default();
            if o.cursor.as_ref().is_some_and(|c| !after(&r.run, c)) {
                o.missed = true;
            }
            return;
        }
        s.enqueue(r);
    }

    /// The overflowed group whose queue drained to its low-water mark, and
    /// the active-table key after which its next page starts.
    pub fn page_wanted(&self) -> Option<(String, Option<RunId>)> {
        let s = self.lock();
        s.overflow
            .iter()
            .find(|(g, _)| s.queues.get(*g).map_or(0, BinaryHeap::len) <= self.queue_max / 2)
            .map(|(g, o)| (g.clone(), o.cursor.clone()))
    }

    /// One page of the active table (in key order, after the cursor that
    /// [`Self::page_wanted`] gave) for an overflowed group; `end` when the
    /// table has no rows after it. Queues the group's pending attempts that
    /// are neither queued nor leased until the queue is full; the cursor
    /// moves past each row looked at.
    pub fn page_in(&self, group: &str, rows: Vec<(RunId, ActiveRun)>, end: bool) {
        let mut s = self.lock();
        let Some(mut o) = s.overflow.remove(group) else {
            return;
        };
        let mut full = false;
        for (run, a) in rows {
            if s.queues.get(group).map_or(0, BinaryHeap::len) >= self.queue_max {
                full = true;
                break;
            }
            if o.cursor.as_ref().is_some_and(|c| !after(&run, c)) {
                continue; // not after the cursor: a stale page
            }
            o.cursor = Some(run.clone());
            if a.group == group && a.state == RunState::Pending && !s.is_known(&run, a.attempt) {
                s.enqueue(ready_of(run, a));
            }
        }
        match (full || !end, o.missed) {
            (true, _) => {}
            (false, true) => o = Overflow::default(),
            (false, false) => return, // everything on disk was seen
        }
        s.overflow.insert(group.to_string(), o);
    }

    /// Waits until some overflowed group wants a page (see [`Self::page_wanted`]).
    pub async fn page_needed(&self) {
        self.page_signal.notified().await
    }

    /// Wakes [`Self::page_needed`] if a group wants a page now.
    pub fn signal_if_page_wanted(&self) {
        if self.page_wanted().is_some() {
            self.page_signal.notify_one();
        }
    }

    /// An attempt ended (finished, expired, cancelled) through the log.
    pub fn ended(&self, run: &RunId, attempt: u32) {
        let mut s = self.lock();
        if s.leases.get(run).is_none_or(|l| l.attempt > attempt) {
            return;
        }
        let Some(lease) = s.leases.remove(run) else {
            return;
        };
        if let Some(w) = lease.conn.and_then(|c| s.workers.get_mut(&c)) {
            w.in_flight.remove(run);
        }
        if s.prev_worker.len() >= QUEUE_MAX {
            s.prev_worker.clear();
        }
        if !lease.worker.is_empty() {
            s.prev_worker.insert(run.clone(), lease.worker);
        }
    }

    pub fn cancel(&self, run: &RunId, attempt: u32) {
        let mut s = self.lock();
        let Some(l) = s.leases.get_mut(run).filter(|l| l.attempt == attempt) else {
            return;
        };
        l.stop = true;
        if let Some(w) = l.conn.and_then(|c| s.workers.get(&c)) {
            let _ = w.tx.try_send(ToWorker::Cancel {
                run: run.clone(),
                attempt,
            });
        }
    }

    /// A worker reported the finish of an attempt: its slot is free at once,
    /// so dispatch does not wait for the commit. The lease stays (detached
    /// from the worker) until the commit ends it, or expires if it never does.
    pub fn finishing(&self, conn: u64, run: &RunId, attempt: u32) -> bool {
        let mut s = self.lock();
        let held = s
            .leases
            .get(run)
            .is_some_and(|l| l.attempt == attempt && l.conn == Some(conn));
        if !held {
            return false;
        }
        if let Some(l) = s.leases.get_mut(run) {
            l.conn = None;
        }
        s.workers
            .get_mut(&conn)
            .is_some_and(|w| w.in_flight.remove(run))
    }

    /// Whether `run`'s attempt is leased to another worker session than
    /// (`conn`, `worker`): then a finish from this session is forged or
    /// misrouted and must not be taken. Without a lease, apply decides.
    pub fn held_by_other(&self, conn: u64, worker: &str, run: &RunId) -> bool {
        let s = self.lock();
        s.leases.get(run).is_some_and(|l| match l.conn {
            Some(c) => c != conn,
            None => !l.worker.is_empty() && l.worker != worker,
        })
    }

    /// Extends the leases of attempts a worker says it is still running.
    /// Only the worker that holds a lease may extend or reclaim it.
    pub fn heartbeat(&self, conn: u64, runs: &[RunId], now_ms: i64) {
        let mut s = self.lock();
        let State {
            workers, leases, ..
        } = &mut *s;
        let Some(w) = workers.get_mut(&conn) else {
            return;
        };
        for run in runs {
            // An attempt recorded for no worker yet (its Assign had not
            // committed before a failover) is claimed by whoever runs it.
            let Some(l) = leases
                .get_mut(run)
                .filter(|l| l.worker == w.id || l.worker.is_empty())
            else {
                continue;
            };
            if l.worker.is_empty() {
                l.worker = w.id.clone();
            }
            l.lease_until_ms = now_ms.saturating_add(LEASE_MS);
            if l.conn.is_none() {
                l.conn = Some(conn);
                if l.stop {
                    let attempt = l.attempt;
                    let _ = w.tx.try_send(ToWorker::Cancel {
                        run: run.clone(),
                        attempt,
                    });
                }
            }
            if l.conn == Some(conn) {
                w.in_flight.insert(run.clone());
            }
        }
    }

    /// Hands queued attempts to workers with free capacity, each by its
    /// job's route. Returns what was handed out, to be recorded through the log.
    pub fn dispatch(&self, now_ms: i64) -> Vec<Handed> {
        let mut s = self.lock();
        let mut handed = Vec::new();
        let groups: Vec<String> = s
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(g, _)| g.clone())
            .collect();
        for g in groups {
            s.dispatch_group(&g, now_ms, &mut handed);
        }
        drop(s);
        self.signal_if_page_wanted();
        handed
    }

    /// Attempts whose lease ran out; each is returned once until `expire_failed`.
    pub fn expired(&self, now_ms: i64) -> Vec<(RunId, u32)> {
        let mut s = self.lock();
        let mut out = Vec::new();
        for (run, l) in s.leases.iter_mut() {
            if !l.expiring && (l.deadline_ms <= now_ms || l.lease_until_ms <= now_ms) {
                l.expiring = true;
                out.push((run.clone(), l.attempt));
            }
        }
        out
    }

    /// The expiry proposal did not commit: look at these leases again later.
    pub fn expire_failed(&self, runs: &[(RunId, u32)]) {
        let mut s = self.lock();
        for (run, attempt) in runs {
            if let Some(l) = s.leases.get_mut(run).filter(|l| l.attempt == *attempt) {
                l.expiring = false;
            }
        }
    }

    /// Rebuilds from the replicated active-runs table (new leader, or after
    /// missing effects). Attempts that may be in flight get a full lease
    /// from `now_ms`, so a worker that still runs them can report in first.
    pub fn rebuild(&self, active: Vec<(RunId, ActiveRun)>, now_ms: i64) {
        let mut s = self.lock();
        s.queues.clear();
        s.queued.clear();
        s.overflow.clear();
        s.leases.clear();
        for w in s.workers.values_mut() {
            w.in_flight.clear();
        }
        drop(s);
        for (run, a) in active {
            match a.state {
                RunState::Pending => self.ready(ready_of(run, a)),
                RunState::Running => {
                    let deadline_ms = now_ms.saturating_add(a.timeout_ms as i64);
                    let lease = Lease {
                        attempt: a.attempt,
                        deadline_ms,
                        lease_until_ms: now_ms.saturating_add(LEASE_MS),
                        conn: None,
                        worker: a.worker,
                        expiring: false,
                        stop: false,
                    };
                    self.lock().leases.insert(run, lease);
                }
                _ => {}
            }
        }
    }

    /// Leadership lost: drop every worker stream (they reconnect to the new leader) and all state.
    pub fn clear(&self) {
        *self.lock() = State::default();
    }

    pub fn stats(&self) -> BTreeMap<String, GroupStats> {
        let s = self.lock();
        let mut out: BTreeMap<String, GroupStats> = BTreeMap::new();
        for (g, q) in &s.queues {
            out.entry(g.clone()).or_default().queued = q.len();
        }
        for w in s.workers.values() {
            for g in &w.groups {
                let e = out.entry(g.clone()).or_default();
                e.workers += 1;
                e.in_flight += w.in_flight.len();
            }
        }
        out
    }

    pub fn is_registered(&self, conn: u64) -> bool {
        self.lock().workers.contains_key(&conn)
    }
}

impl State {
    /// Whether this attempt (or a later one of the run) is queued or leased.
    fn is_known(&self, run: &RunId, attempt: u32) -> bool {
        self.queued.contains(run) || self.leases.get(run).is_some_and(|l| l.attempt >= attempt)
    }

    fn enqueue(&mut self, r: ReadyRun) {
        let q = self.queues.entry(r.group).or_default();
        q.push(Queued {
            priority: r.priority,
            run: r.run.clone(),
            attempt: r.attempt,
            timeout_ms: r.timeout_ms,
            route: r.route,
            shard_count: r.shard_count,
            fired_at_ms: r.fired_at_ms,
            ready_at: Instant::now(),
        });
        self.queued.insert(r.run);
    }

    /// Hands out the group's queued attempts in priority order. An attempt
    /// no worker can take now (route) is put back; the pass ends when no
    /// worker of the group has room, or after `SCAN_MAX` attempts.
    fn dispatch_group(&mut self, g: &str, now_ms: i64, handed: &mut Vec<Handed>) {
        let mut deferred = Vec::new();
        for _ in 0..SCAN_MAX {
            if !self.workers.values().any(|w| w.is_free() && w.in_group(g)) {
                break;
            }
            let Some(item) = self.queues.get_mut(g).and_then(|q| q.pop()) else {
                break;
            };
            let avoid = self.prev_worker.get(&item.run).map(String::as_str);
            let rr_last = self.rr_last.get(g).copied();
            match pick_worker(&self.workers, g, &item, avoid, rr_last) {
                Some(conn) => {
                    if let Err(item) = self.hand(conn, g, item, now_ms, handed) {
                        deferred.push(item);
                    }
                }
                None => deferred.push(item),
            }
        }
        let q = self.queues.entry(g.to_string()).or_default();
        q.extend(deferred);
    }

    /// Sends one attempt to a worker and leases it; gives the attempt back
    /// when the worker's stream is gone or full (that worker gets no more).
    fn hand(
        &mut self,
        conn: u64,
        g: &str,
        item: Queued,
        now_ms: i64,
        handed: &mut Vec<Handed>,
    ) -> Result<(), Queued> {
        let Some(w) = self.workers.get_mut(&conn) else {
            return Err(item);
        };
        let deadline_ms = now_ms.saturating_add(item.timeout_ms as i64);
        let msg = ToWorker::Assign {
            run: item.run.clone(),
            attempt: item.attempt,
            deadline_ms,
            fired_at_ms: item.fired_at_ms,
            shard_count: item.shard_count,
        };
        if w.tx.try_send(msg).is_err() {
            w.capacity = 0;
            return Err(item);
        }
        w.in_flight.insert(item.run.clone());
        handed.push(Handed {
            run: item.run.clone(),
            attempt: item.attempt,
            group: g.to_string(),
            worker: w.id.clone(),
            waited: item.ready_at.elapsed(),
        });
        let lease = Lease {
            attempt: item.attempt,
            deadline_ms: deadline_ms.saturating_add(w.stop_grace_ms),
            lease_until_ms: now_ms.saturating_add(LEASE_MS),
            conn: Some(conn),
            worker: w.id.clone(),
            expiring: false,
            stop: false,
        };
        self.queued.remove(&item.run);
        self.prev_worker.remove(&item.run);
        self.rr_last.insert(g.to_string(), conn);
        self.leases.insert(item.run, lease);
        Ok(())
    }
}

/// Whether `run` sorts after `cursor` in the active table (key order, which
/// is not `RunId`'s own order: keys start with the job id's length).
fn after(run: &RunId, cursor: &RunId) -> bool {
    keys::active(run) > keys::active(cursor)
}

/// The ready attempt an active-table row stands for.
fn ready_of(run: RunId, a: ActiveRun) -> ReadyRun {
    ReadyRun {
        run,
        attempt: a.attempt,
        // The table does not hold it: the run record does.
        fired_at_ms: None,
        group: a.group,
        priority: a.priority,
        timeout_ms: a.timeout_ms,
        route: a.route,
        shard_count: a.shard_count,
        // Only a fresh fire's lateness counts it, and that comes from apply.
        offset_ms: 0,
    }
}

/// The connection that gets `q` by its route, or None if no suitable worker
/// has room. Every route prefers a worker other than `avoid` (the one whose
/// attempt of this run just ended) and, for sharded occurrences, one not
/// already holding a sibling run.
fn pick_worker(
    workers: &BTreeMap<u64, Worker>,
    group: &str,
    q: &Queued,
    avoid: Option<&str>,
    rr_last: Option<u64>,
) -> Option<u64> {
    let avoided = |w: &Worker| Some(w.id.as_str()) == avoid;
    let members = workers.iter().filter(|(_, w)| w.serves(group, &q.route));
    match &q.route {
        Route::ConsistentHash => {
            // The top-ranked connected worker, busy or not: a job stays on
            // its worker and waits for room rather than moving.
            let key = hash_key(&q.run);
            let (conn, w) = members.max_by_key(|(c, w)| {
                (
                    !avoided(w),
                    !w.holds_sibling(q),
                    rendezvous(&w.id, &key),
                    Reverse(**c),
                )
            })?;
            w.is_free().then_some(*conn)
        }
        Route::RoundRobin => {
            let last = rr_last.unwrap_or(0);
            members
                .filter(|(_, w)| w.is_free())
                .min_by_key(|(c, w)| (avoided(w), w.holds_sibling(q), **c <= last, **c))
                .map(|(c, _)| *c)
        }
        Route::LeastLoaded | Route::Label(_) => members
            .filter(|(_, w)| w.is_free())
            .min_by_key(|(_, w)| (avoided(w), w.holds_sibling(q), w.in_flight.len()))
            .map(|(c, _)| *c),
    }
}

/// What consistent hashing hashes: the job id, plus the shard for shards above 0.
fn hash_key(run: &RunId) -> String {
    if run.shard == 0 {
        run.job.clone()
    } else {
        format!("{}/s{}", run.job, run.shard)
    }
}

/// Rendezvous (highest random weight) score of a worker for a key: FNV-1a
/// with a 64-bit finalizer, fixed so every leader ranks workers the same way.
fn rendezvous(worker: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in worker.bytes().chain([0xff]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(
        id: &str,
        groups: Vec<String>,
        labels: BTreeMap<String, String>,
        capacity: usize,
    ) -> WorkerInfo {
        WorkerInfo {
            id: id.to_string(),
            groups,
            labels,
            capacity,
            stop_grace_ms: 0,
        }
    }

    fn rid(job: &str, t: i64) -> RunId {
        RunId::new(job, t)
    }

    fn ready(run: RunId, attempt: u32, priority: u8, timeout_ms: u64) -> ReadyRun {
        ReadyRun {
            run,
            attempt,
            fired_at_ms: Some(7),
            group: "g".into(),
            priority,
            timeout_ms,
            route: Route::LeastLoaded,
            shard_count: 1,
            offset_ms: 0,
        }
    }

    #[test]
    fn respects_capacity_and_priority() {
        let d = Dispatcher::default();
        let (tx, mut rx) = mpsc::channel(16);
        let conn = d.register(info("w1", vec!["g".into()], BTreeMap::new(), 2), tx);
        d.ready(ready(rid("low", 1), 1, 1, 1000));
        d.ready(ready(rid("high", 5), 1, 9, 1000));
        d.ready(ready(rid("mid", 2), 1, 5, 1000));
        let handed = d.dispatch(0);
        let jobs: Vec<_> = handed.iter().map(|h| h.run.job.as_str()).collect();
        assert_eq!(jobs, ["high", "mid"]);
        assert!(matches!(rx.try_recv(), Ok(ToWorker::Assign { .. })));
        assert!(d.dispatch(0).is_empty(), "capacity 2 is full");
        d.ended(&rid("high", 5), 1);
        assert_eq!(d.dispatch(0)[0].run.job, "low");
        assert!(d.is_registered(conn));
    }

    #[test]
    fn only_the_session_holding_a_lease_may_finish_it() {
        let d = Dispatcher::default();
        let (tx1, _rx1) = mpsc::channel(16);
        let (tx2, _rx2) = mpsc::channel(16);
        let holder = d.register(info("w1", vec!["g".into()], BTreeMap::new(), 1), tx1);
        d.ready(ready(rid("a", 1), 1, 5, 60_000));
        assert_eq!(d.dispatch(0).len(), 1);
        let other = d.register(info("w2", vec!["g".into()], BTreeMap::new(), 1), tx2);
        assert!(d.held_by_other(other, "w2", &rid("a", 1)));
        assert!(!d.held_by_other(holder, "w1", &rid("a", 1)));
        // The holder's stream drops: its worker may come back on a new stream, nobody else.
        d.unregister(holder);
        assert!(!d.held_by_other(99, "w1", &rid("a", 1)));
        assert!(d.held_by_other(other, "w2", &rid("a", 1)));
        // No lease at all: apply decides (unknown run, stale attempt).
        assert!(!d.held_by_other(other, "w2", &rid("zzz", 1)));
    }

    #[test]
    fn a_draining_worker_gets_no_new_attempts_and_keeps_the_ones_it_holds() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        let conn = d.register(info("w1", vec!["g".into()], BTreeMap::new(), 5), tx);
        d.ready(ready(rid("a", 1), 1, 5, 60_000));
        assert_eq!(d.dispatch(0).len(), 1);
        d.drain(conn);
        d.ready(ready(rid("b", 1), 1, 5, 60_000));
        assert!(d.dispatch(10).is_empty(), "handed to a draining worker");
        assert_eq!(d.stats()["g"].queued, 1);
        // The held attempt is still leased to it: heartbeats keep it alive.
        d.heartbeat(conn, &[rid("a", 1)], 4_000);
        assert!(d.expired(4_000 + LEASE_MS - 1).is_empty());
    }

    #[test]
    fn a_worker_that_stops_its_own_attempts_gets_its_grace_past_the_deadline() {
        let d = Dispatcher::default();
        let (tx, mut rx) = mpsc::channel(16);
        let mut w = info("w1", vec!["g".into()], BTreeMap::new(), 5);
        w.stop_grace_ms = 7_000;
        let conn = d.register(w, tx);
        d.ready(ready(rid("a", 1), 1, 5, 1_000));
        assert_eq!(d.dispatch(0).len(), 1);
        // The worker is told the job's own deadline...
        match rx.try_recv() {
            Ok(ToWorker::Assign { deadline_ms, .. }) => assert_eq!(deadline_ms, 1_000),
            other => panic!("expected an assignment, got {other:?}"),
        }
        // ...and the leader waits the grace beyond it while heartbeats come.
        d.heartbeat(conn, &[rid("a", 1)], 4_000);
        assert!(d.expired(7_999).is_empty());
        assert_eq!(d.expired(8_000), vec![(rid("a", 1), 1)]);
    }

    #[test]
    fn a_leased_attempt_is_not_handed_out_again_until_it_expires() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        let conn = d.register(info("w1", vec!["g".into()], BTreeMap::new(), 5), tx);
        d.ready(ready(rid("a", 1), 1, 5, 60_000));
        assert_eq!(d.dispatch(0).len(), 1);
        d.ready(ready(rid("a", 1), 1, 5, 60_000));
        assert!(d.dispatch(0).is_empty());
        assert!(d.expired(LEASE_MS - 1).is_empty());
        // Heartbeats keep the lease alive, but not past the attempt's deadline.
        d.heartbeat(conn, &[rid("a", 1)], 4_000);
        assert!(d.expired(4_000 + LEASE_MS - 1).is_empty());
        d.heartbeat(conn, &[rid("a", 1)], 58_000);
        assert!(d.expired(59_999).is_empty());
        assert_eq!(d.expired(60_000), vec![(rid("a", 1), 1)]);
        assert!(d.expired(500).is_empty(), "reported once");
        // The retry is a new attempt and is dispatched.
        d.ended(&rid("a", 1), 1);
        d.ready(ready(rid("a", 1), 2, 5, 100));
        assert_eq!(d.dispatch(200)[0].attempt, 2);
    }

    #[test]
    fn rebuild_leases_running_attempts_and_queues_pending_ones() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        d.register(info("w1", vec!["g".into()], BTreeMap::new(), 5), tx);
        let a = |state| ActiveRun {
            group: "g".into(),
            priority: 5,
            state,
            attempt: 1,
            timeout_ms: 100,
            route: Route::LeastLoaded,
            worker: String::new(),
            shard_count: 1,
        };
        d.rebuild(
            vec![
                (rid("p", 1), a(RunState::Pending)),
                (rid("r", 1), a(RunState::Running)),
            ],
            1000,
        );
        let handed = d.dispatch(1000);
        assert_eq!(handed.len(), 1);
        assert_eq!(handed[0].run.job, "p");
        assert!(d.expired(1099).is_empty());
        assert!(d.expired(1100).contains(&(rid("r", 1), 1)));
    }

    #[test]
    fn an_assignment_carries_the_fire_time_apply_gave_and_none_for_a_rebuilt_attempt() {
        let d = Dispatcher::default();
        let (tx, mut rx) = mpsc::channel(16);
        d.register(info("w1", vec!["g".into()], BTreeMap::new(), 5), tx);
        d.ready(ReadyRun {
            fired_at_ms: Some(1_234),
            shard_count: 3,
            ..ready(rid("fresh", 1), 1, 5, 100)
        });
        assert_eq!(d.dispatch(0).len(), 1);
        match rx.try_recv() {
            Ok(ToWorker::Assign {
                fired_at_ms,
                shard_count,
                ..
            }) => assert_eq!((fired_at_ms, shard_count), (Some(1_234), 3)),
            other => panic!("expected an assignment, got {other:?}"),
        }
        // A new leader's attempt from the active-run table: the worker
        // session reads the fire time from the run record.
        let pending = ActiveRun {
            group: "g".into(),
            priority: 5,
            state: RunState::Pending,
            attempt: 1,
            timeout_ms: 100,
            route: Route::LeastLoaded,
            worker: String::new(),
            shard_count: 2,
        };
        d.rebuild(vec![(rid("old", 1), pending)], 0);
        assert_eq!(d.dispatch(0).len(), 1);
        match rx.try_recv() {
            Ok(ToWorker::Assign {
                run,
                fired_at_ms,
                shard_count,
                ..
            }) => assert_eq!(
                (run.job.as_str(), fired_at_ms, shard_count),
                ("old", None, 2)
            ),
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    #[test]
    fn a_stop_asked_before_the_worker_reconnects_reaches_it_when_it_claims_the_attempt() {
        let d = Dispatcher::default();
        let running = ActiveRun {
            group: "g".into(),
            priority: 5,
            state: RunState::Running,
            attempt: 2,
            timeout_ms: 60_000,
            route: Route::LeastLoaded,
            worker: "w1".into(),
            shard_count: 1,
        };
        // A new leader: the attempt is known from state, its worker not yet connected.
        d.rebuild(vec![(rid("r", 1), running)], 0);
        d.cancel(&rid("r", 1), 1);
        d.cancel(&rid("r", 1), 2);
        let (tx, mut rx) = mpsc::channel(16);
        let conn = d.register(info("w1", vec!["g".into()], BTreeMap::new(), 5), tx);
        d.heartbeat(conn, &[rid("r", 1)], 100);
        match rx.try_recv() {
            Ok(ToWorker::Cancel { run, attempt }) => assert_eq!((run, attempt), (rid("r", 1), 2)),
            other => panic!("expected the stop request, got {other:?}"),
        }
        d.heartbeat(conn, &[rid("r", 1)], 200);
        assert!(
            rx.try_recv().is_err(),
            "asked once per stream that claims it"
        );
    }

    #[test]
    fn a_retry_goes_to_another_worker_when_one_is_free() {
        let d = Dispatcher::default();
        let (tx1, _rx1) = mpsc::channel(16);
        let (tx2, _rx2) = mpsc::channel(16);
        d.register(info("slow", vec!["g".into()], BTreeMap::new(), 1), tx1);
        d.ready(ready(rid("a", 1), 1, 5, 1000));
        assert_eq!(d.dispatch(0)[0].worker, "slow");
        d.register(info("fast", vec!["g".into()], BTreeMap::new(), 1), tx2);
        d.ended(&rid("a", 1), 1);
        d.ready(ready(rid("a", 1), 2, 5, 1000));
        let h = d.dispatch(10);
        assert_eq!((h[0].worker.as_str(), h[0].attempt), ("fast", 2));
    }

    fn routed(run: RunId, route: Route, shard_count: u32) -> ReadyRun {
        ReadyRun {
            route,
            shard_count,
            ..ready(run, 1, 5, 1000)
        }
    }

    /// Registers workers `ids` in group g (capacity 100) with a `zone` label each.
    fn pool(d: &Dispatcher, ids: &[(&str, &str)]) -> Vec<(u64, mpsc::Receiver<ToWorker>)> {
        ids.iter()
            .map(|(id, zone)| {
                let (tx, rx) = mpsc::channel(1024);
                let labels = [("zone".to_string(), zone.to_string())].into();
                (d.register(info(id, vec!["g".into()], labels, 100), tx), rx)
            })
            .collect()
    }

    #[test]
    fn a_retry_after_failover_still_avoids_the_worker_of_the_expired_attempt() {
        let d = Dispatcher::default();
        let _pool = pool(&d, &[("slow", "a"), ("fast", "a")]);
        // A new leader knows the holder only from the replicated record, and
        // the slow worker's stream has not reported in yet.
        let active = ActiveRun {
            group: "g".into(),
            priority: 5,
            state: RunState::Running,
            attempt: 1,
            timeout_ms: 100,
            route: Route::LeastLoaded,
            worker: "slow".into(),
            shard_count: 1,
        };
        d.rebuild(vec![(rid("a", 1), active)], 0);
        assert_eq!(d.expired(100), vec![(rid("a", 1), 1)]);
        d.ended(&rid("a", 1), 1);
        d.ready(ready(rid("a", 1), 2, 5, 1000));
        assert_eq!(d.dispatch(200)[0].worker, "fast");
    }

    #[test]
    fn round_robin_hands_attempts_to_workers_in_turn() {
        let d = Dispatcher::default();
        let _pool = pool(&d, &[("w1", "a"), ("w2", "a"), ("w3", "a")]);
        let mut got = Vec::new();
        for t in 0..6 {
            d.ready(routed(rid("j", t), Route::RoundRobin, 1));
            got.extend(d.dispatch(0).into_iter().map(|h| h.worker));
        }
        assert_eq!(got, ["w1", "w2", "w3", "w1", "w2", "w3"]);
    }

    #[test]
    fn consistent_hash_keeps_a_job_on_its_worker_and_moves_only_a_leaver_s_jobs() {
        let d = Dispatcher::default();
        let conns = pool(&d, &[("w1", "a"), ("w2", "a"), ("w3", "a")]);
        let place = |d: &Dispatcher, t: i64| -> BTreeMap<String, String> {
            for j in 0..30 {
                d.ready(routed(rid(&format!("job{j}"), t), Route::ConsistentHash, 1));
            }
            let h = d.dispatch(0);
            assert_eq!(h.len(), 30);
            for x in &h {
                d.ended(&x.run, 1);
            }
            h.into_iter().map(|x| (x.run.job, x.worker)).collect()
        };
        let first = place(&d, 1);
        assert_eq!(place(&d, 2), first, "same jobs, same workers");
        let used: BTreeSet<&String> = first.values().collect();
        assert!(used.len() >= 2, "30 jobs spread over workers: {first:?}");
        d.unregister(conns[1].0);
        let after = place(&d, 3);
        for (job, w) in &first {
            if w != "w2" {
                assert_eq!(&after[job], w, "{job} moved though its worker stayed");
            } else {
                assert_ne!(after[job], "w2");
            }
        }
    }

    #[test]
    fn label_routing_uses_only_matching_workers_and_does_not_block_others() {
        let d = Dispatcher::default();
        let _pool = pool(&d, &[("eu", "eu"), ("us", "us")]);
        let sel = |z: &str| Route::Label([("zone".to_string(), z.to_string())].into());
        // Highest priority first, but nobody matches it: it must not hold the queue.
        d.ready(ReadyRun {
            priority: 9,
            ..routed(rid("mars", 1), sel("mars"), 1)
        });
        for t in 0..4 {
            d.ready(routed(rid("eu-job", t), sel("eu"), 1));
        }
        let h = d.dispatch(0);
        assert_eq!(h.len(), 4);
        assert!(h.iter().all(|x| x.worker == "eu"), "{h:?}");
        assert_eq!(d.stats()["g"].queued, 1, "the unmatched attempt waits");
    }

    #[test]
    fn shards_of_one_occurrence_spread_over_workers_and_widths_count_workers() {
        let d = Dispatcher::default();
        let _pool = pool(&d, &[("w1", "a"), ("w2", "a"), ("w3", "a")]);
        // Unrelated work leaves w1 idle and w2, w3 with one attempt each, so
        // least-loaded alone would put two shards on w1.
        for job in ["x", "y", "z"] {
            d.ready(ready(rid(job, 1), 1, 5, 1000));
        }
        assert_eq!(d.dispatch(0).len(), 3);
        d.ended(&rid("x", 1), 1);
        for shard in 0..3 {
            d.ready(routed(RunId::shard("s", 1, shard), Route::LeastLoaded, 3));
        }
        let workers: BTreeSet<String> = d.dispatch(0).into_iter().map(|h| h.worker).collect();
        assert_eq!(workers.len(), 3, "{workers:?}");
        let (tx, _rx) = mpsc::channel(1);
        d.register(
            info("w1", vec!["g".into(), "h".into()], BTreeMap::new(), 1),
            tx,
        );
        assert_eq!(d.widths(), vec![("g".to_string(), 3), ("h".to_string(), 1)]);
    }

    #[test]
    fn a_reported_finish_frees_the_slot_before_the_commit() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        let conn = d.register(info("w", vec!["g".into()], BTreeMap::new(), 1), tx);
        d.ready(ready(rid("a", 1), 1, 5, 1000));
        d.ready(ready(rid("b", 2), 1, 5, 1000));
        assert_eq!(d.dispatch(0).len(), 1);
        assert!(
            !d.finishing(conn, &rid("a", 1), 2),
            "a stale attempt frees nothing"
        );
        assert!(d.finishing(conn, &rid("a", 1), 1));
        assert_eq!(d.dispatch(0)[0].run, rid("b", 2));
        // The lease of the finished attempt still expires if its commit never comes.
        assert!(d.expired(1000).contains(&(rid("a", 1), 1)));
    }
    /// A stand-in for the replicated active-runs table, in key order.
    #[derive(Default)]
    struct Table(BTreeMap<Vec<u8>, (RunId, ActiveRun)>);

    impl Table {
        fn pending(&mut self, r: &ReadyRun) {
            let a = ActiveRun {
                group: r.group.clone(),
                priority: r.priority,
                state: RunState::Pending,
                attempt: r.attempt,
                timeout_ms: r.timeout_ms,
                route: r.route.clone(),
                worker: String::new(),
                shard_count: r.shard_count,
            };
            self.0.insert(keys::active(&r.run), (r.run.clone(), a));
        }

        fn remove(&mut self, run: &RunId) {
            self.0.remove(&keys::active(run));
        }

        /// What the leader does: page the active table into every group that wants it.
        fn page_into(&self, d: &Dispatcher, page: usize) {
            for _ in 0..10_000 {
                let Some((g, cursor)) = d.page_wanted() else {
                    return;
                };
                let from = cursor.map(|c| {
                    let mut k = keys::active(&c);
                    k.push(0);
                    k
                });
                let rows: Vec<_> = self
                    .0
                    .range(from.unwrap_or_default()..)
                    .take(page)
                    .map(|(_, r)| r.clone())
                    .collect();
                let end = rows.len() < page;
                d.page_in(&g, rows, end);
            }
            panic!("paging does not end");
        }
    }

    /// Runs a worker that finishes every attempt at once until nothing is
    /// left; returns every run it got, in order.
    fn drain_all(d: &Dispatcher, table: &mut Table, conn: u64) -> Vec<RunId> {
        let mut got = Vec::new();
        for _ in 0..1000 {
            table.page_into(d, 3);
            let h = d.dispatch(0);
            if h.is_empty() {
                break;
            }
            for x in h {
                assert!(d.finishing(conn, &x.run, x.attempt));
                table.remove(&x.run);
                d.ended(&x.run, x.attempt);
                got.push(x.run);
            }
        }
        got
    }

    #[test]
    fn a_full_queue_keeps_the_overflow_on_disk_and_pages_it_back_in() {
        let d = Dispatcher::with_queue_max(4);
        let mut table = Table::default();
        let all: Vec<RunId> = (0..25).map(|t| rid(&format!("job{}", t % 7), t)).collect();
        for run in &all {
            let r = ready(run.clone(), 1, 5, 1000);
            table.pending(&r);
            d.ready(r);
        }
        assert_eq!(d.stats()["g"].queued, 4, "the window holds queue_max");
        assert_eq!(d.page_wanted(), None, "a full queue wants no page");
        let (tx, _rx) = mpsc::channel(1024);
        let conn = d.register(info("w", vec!["g".into()], BTreeMap::new(), 2), tx);
        let got = drain_all(&d, &mut table, conn);
        let unique: BTreeSet<&RunId> = got.iter().collect();
        assert_eq!(got.len(), all.len(), "every run once: {got:?}");
        assert_eq!(unique.len(), all.len());
        assert_eq!(d.page_wanted(), None);
        assert!(table.0.is_empty());
    }

    #[test]
    fn paging_skips_queued_leased_running_and_other_groups_attempts() {
        let d = Dispatcher::with_queue_max(2);
        let mut table = Table::default();
        let (tx, _rx) = mpsc::channel(1024);
        let conn = d.register(info("w", vec!["g".into()], BTreeMap::new(), 1), tx);
        for t in 0..5 {
            let r = ready(rid("a", t), 1, 5, 1000);
            table.pending(&r);
            d.ready(r);
        }
        // Another group's pending attempt and a running one share the table.
        let other = ReadyRun {
            group: "h".into(),
            ..ready(rid("b", 1), 1, 5, 1000)
        };
        table.pending(&other);
        let running = ready(rid("c", 1), 1, 5, 1000);
        table.pending(&running);
        table
            .0
            .get_mut(&keys::active(&running.run))
            .unwrap()
            .1
            .state = RunState::Running;
        // One leased attempt (a@0, still pending in the table until its Assign commits).
        let first = d.dispatch(0);
        assert_eq!(first.len(), 1);
        table.page_into(&d, 2);
        let s = d.stats();
        assert_eq!(s["g"].queued, 2, "{s:?}");
        assert!(!s.contains_key("h"), "another group's attempt was queued");
        assert!(d.finishing(conn, &first[0].run, 1));
        table.remove(&first[0].run);
        d.ended(&first[0].run, 1);
        let got = drain_all(&d, &mut table, conn);
        let mut all: Vec<RunId> = first.into_iter().map(|h| h.run).collect();
        all.extend(got);
        assert_eq!(all, (0..5).map(|t| rid("a", t)).collect::<Vec<_>>());
    }

    #[test]
    fn an_attempt_that_overflows_behind_the_cursor_is_found_by_another_pass() {
        let d = Dispatcher::with_queue_max(2);
        let mut table = Table::default();
        for t in 10..16 {
            let r = ready(rid("m", t), 1, 5, 1000);
            table.pending(&r);
            d.ready(r);
        }
        let (tx, _rx) = mpsc::channel(1024);
        let conn = d.register(info("w", vec!["g".into()], BTreeMap::new(), 2), tx);
        let mut got: Vec<RunId> = d.dispatch(0).into_iter().map(|h| h.run).collect();
        for run in &got {
            assert!(d.finishing(conn, run, 1));
            table.remove(run);
            d.ended(run, 1);
        }
        // The scan moves past m@13 while the queue fills up again...
        table.page_into(&d, 2);
        assert_eq!(d.stats()["g"].queued, 2);
        // ...then an attempt sorting before the cursor overflows the full queue.
        let early = ready(rid("m", 1), 1, 5, 1000);
        table.pending(&early);
        d.ready(early);
        got.extend(drain_all(&d, &mut table, conn));
        let unique: BTreeSet<&RunId> = got.iter().collect();
        assert_eq!((got.len(), unique.len()), (7, 7), "{got:?}");
        assert!(
            got.contains(&rid("m", 1)),
            "the late attempt was lost: {got:?}"
        );
    }

    #[test]
    fn a_rebuild_over_the_cap_loses_nothing() {
        let d = Dispatcher::with_queue_max(3);
        let mut table = Table::default();
        for t in 0..10 {
            table.pending(&ready(rid("r", t), 1, 5, 1000));
        }
        d.rebuild(table.0.values().cloned().collect(), 0);
        assert_eq!(d.stats()["g"].queued, 3);
        let (tx, _rx) = mpsc::channel(1024);
        let conn = d.register(info("w", vec!["g".into()], BTreeMap::new(), 1), tx);
        assert_eq!(drain_all(&d, &mut table, conn).len(), 10);
    }
}
