//! The leader's dispatcher: per-group queues of ready run attempts, the
//! connected workers and their free capacity, and the lease of every
//! attempt handed out. It only ever dispatches what a committed Fire (or
//! retry) made ready: its input is the state machine's effects.
//!
//! Invariants: never more attempts in flight to a worker than its capacity;
//! an attempt with a live lease is not handed out again; a queue holds at
//! most `QUEUE_MAX` attempts per group (beyond that they stay in the durable
//! active table and are reloaded on resync).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;

use tokio::sync::mpsc;

use crate::core::{ActiveRun, RunId, RunState};

/// Most ready attempts queued in memory per group.
pub const QUEUE_MAX: usize = 100_000;
/// A worker that neither heartbeats nor finishes for this long loses its
/// attempts, even before their deadline (worker SDKs heartbeat every second).
pub const LEASE_MS: i64 = 5_000;

/// A message for one connected worker's stream.
#[derive(Debug, Clone)]
pub enum ToWorker {
    Assign {
        run: RunId,
        attempt: u32,
        deadline_ms: i64,
    },
    Cancel {
        run: RunId,
        attempt: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Queued {
    priority: u8,
    run: RunId,
    attempt: u32,
    timeout_ms: u64,
}

impl Ord for Queued {
    // Highest priority first, then earliest scheduled time.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.run.scheduled_at_ms.cmp(&self.run.scheduled_at_ms))
            .then_with(|| other.run.job.cmp(&self.run.job))
    }
}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

struct Worker {
    id: String,
    groups: Vec<String>,
    capacity: usize,
    in_flight: HashSet<RunId>,
    tx: mpsc::Sender<ToWorker>,
}

#[derive(Debug, Clone)]
struct Lease {
    attempt: u32,
    /// Hard end of the attempt: assignment (or takeover) plus the job's timeout.
    deadline_ms: i64,
    /// Liveness: extended by heartbeats.
    lease_until_ms: i64,
    conn: Option<u64>,
    expiring: bool,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, BinaryHeap<Queued>>,
    queued: HashSet<RunId>,
    workers: BTreeMap<u64, Worker>,
    leases: HashMap<RunId, Lease>,
    /// Worker that held a run's last ended attempt: its retry goes elsewhere if it can.
    prev_worker: HashMap<RunId, String>,
    next_conn: u64,
}

/// An attempt handed to a worker, to record through the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handed {
    pub run: RunId,
    pub attempt: u32,
    pub worker: String,
}

#[derive(Default)]
pub struct Dispatcher {
    state: Mutex<State>,
}

/// Queue depth and worker count of one group (status and metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub queued: usize,
    pub workers: usize,
    pub in_flight: usize,
}

impl Dispatcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a worker stream; returns its connection id.
    pub fn register(
        &self,
        id: &str,
        groups: Vec<String>,
        capacity: usize,
        tx: mpsc::Sender<ToWorker>,
    ) -> u64 {
        let mut s = self.lock();
        s.next_conn += 1;
        let conn = s.next_conn;
        let w = Worker {
            id: id.to_string(),
            groups,
            capacity,
            in_flight: HashSet::new(),
            tx,
        };
        s.workers.insert(conn, w);
        conn
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

    /// A committed attempt is ready for a worker.
    pub fn ready(&self, run: RunId, attempt: u32, group: &str, priority: u8, timeout_ms: u64) {
        let mut s = self.lock();
        if s.leases.get(&run).is_some_and(|l| l.attempt >= attempt) || s.queued.contains(&run) {
            return;
        }
        let q = s.queues.entry(group.to_string()).or_default();
        if q.len() >= QUEUE_MAX {
            return;
        }
        q.push(Queued {
            priority,
            run: run.clone(),
            attempt,
            timeout_ms,
        });
        s.queued.insert(run);
    }

    /// An attempt ended (finished, expired, cancelled) through the log.
    pub fn ended(&self, run: &RunId, attempt: u32) {
        let mut s = self.lock();
        if s.leases.get(run).is_some_and(|l| l.attempt <= attempt) {
            if let Some(conn) = s.leases.remove(run).and_then(|l| l.conn) {
                if let Some(w) = s.workers.get_mut(&conn) {
                    w.in_flight.remove(run);
                    let id = w.id.clone();
                    if s.prev_worker.len() >= QUEUE_MAX {
                        s.prev_worker.clear();
                    }
                    s.prev_worker.insert(run.clone(), id);
                }
            }
        }
    }

    pub fn cancel(&self, run: &RunId, attempt: u32) {
        let s = self.lock();
        let conn = s
            .leases
            .get(run)
            .filter(|l| l.attempt == attempt)
            .and_then(|l| l.conn);
        if let Some(w) = conn.and_then(|c| s.workers.get(&c)) {
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

    /// Extends the leases of attempts a worker says it is still running.
    pub fn heartbeat(&self, conn: u64, runs: &[RunId], now_ms: i64) {
        let mut s = self.lock();
        for run in runs {
            if let Some(l) = s.leases.get_mut(run) {
                l.lease_until_ms = now_ms.saturating_add(LEASE_MS);
                if l.conn.is_none() {
                    l.conn = Some(conn);
                }
            }
        }
        let State {
            workers, leases, ..
        } = &mut *s;
        if let Some(w) = workers.get_mut(&conn) {
            w.in_flight.extend(
                runs.iter()
                    .filter(|r| leases.get(*r).is_some_and(|l| l.conn == Some(conn)))
                    .cloned(),
            );
        }
    }

    /// Hands queued attempts to workers with free capacity, least loaded
    /// first. Returns what was handed out, to be recorded through the log.
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
            loop {
                let Some(top) = s.queues.get(&g).and_then(|q| q.peek()) else {
                    break;
                };
                let avoid = s.prev_worker.get(&top.run).map(String::as_str);
                let Some(conn) = pick_worker(&s.workers, &g, avoid) else {
                    break;
                };
                let Some(item) = s.queues.get_mut(&g).and_then(|q| q.pop()) else {
                    break;
                };
                s.queued.remove(&item.run);
                s.prev_worker.remove(&item.run);
                let deadline_ms = now_ms.saturating_add(item.timeout_ms as i64);
                let Some(w) = s.workers.get_mut(&conn) else {
                    break;
                };
                let msg = ToWorker::Assign {
                    run: item.run.clone(),
                    attempt: item.attempt,
                    deadline_ms,
                };
                if w.tx.try_send(msg).is_err() {
                    // The stream is gone or full: put the attempt back and stop using this worker.
                    w.capacity = 0;
                    s.queued.insert(item.run.clone());
                    s.queues.entry(g.clone()).or_default().push(item);
                    continue;
                }
                w.in_flight.insert(item.run.clone());
                handed.push(Handed {
                    run: item.run.clone(),
                    attempt: item.attempt,
                    worker: w.id.clone(),
                });
                let lease = Lease {
                    attempt: item.attempt,
                    deadline_ms,
                    lease_until_ms: now_ms.saturating_add(LEASE_MS),
                    conn: Some(conn),
                    expiring: false,
                };
                s.leases.insert(item.run, lease);
            }
        }
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
        s.leases.clear();
        for w in s.workers.values_mut() {
            w.in_flight.clear();
        }
        drop(s);
        for (run, a) in active {
            match a.state {
                RunState::Pending => self.ready(run, a.attempt, &a.group, a.priority, a.timeout_ms),
                RunState::Running => {
                    let deadline_ms = now_ms.saturating_add(a.timeout_ms as i64);
                    let lease = Lease {
                        attempt: a.attempt,
                        deadline_ms,
                        lease_until_ms: now_ms.saturating_add(LEASE_MS),
                        conn: None,
                        expiring: false,
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

/// The worker of `group` with free capacity and the fewest attempts in flight.
/// A retry prefers any worker other than `avoid` (the one whose attempt just ended).
fn pick_worker(workers: &BTreeMap<u64, Worker>, group: &str, avoid: Option<&str>) -> Option<u64> {
    workers
        .iter()
        .filter(|(_, w)| w.in_flight.len() < w.capacity && w.groups.iter().any(|g| g == group))
        .min_by_key(|(_, w)| (Some(w.id.as_str()) == avoid, w.in_flight.len()))
        .map(|(c, _)| *c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rid(job: &str, t: i64) -> RunId {
        RunId::new(job, t)
    }

    #[test]
    fn respects_capacity_and_priority() {
        let d = Dispatcher::default();
        let (tx, mut rx) = mpsc::channel(16);
        let conn = d.register("w1", vec!["g".into()], 2, tx);
        d.ready(rid("low", 1), 1, "g", 1, 1000);
        d.ready(rid("high", 5), 1, "g", 9, 1000);
        d.ready(rid("mid", 2), 1, "g", 5, 1000);
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
    fn a_leased_attempt_is_not_handed_out_again_until_it_expires() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        let conn = d.register("w1", vec!["g".into()], 5, tx);
        d.ready(rid("a", 1), 1, "g", 5, 60_000);
        assert_eq!(d.dispatch(0).len(), 1);
        d.ready(rid("a", 1), 1, "g", 5, 60_000);
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
        d.ready(rid("a", 1), 2, "g", 5, 100);
        assert_eq!(d.dispatch(200)[0].attempt, 2);
    }

    #[test]
    fn rebuild_leases_running_attempts_and_queues_pending_ones() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        d.register("w1", vec!["g".into()], 5, tx);
        let a = |state| ActiveRun {
            group: "g".into(),
            priority: 5,
            state,
            attempt: 1,
            timeout_ms: 100,
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
    fn a_retry_goes_to_another_worker_when_one_is_free() {
        let d = Dispatcher::default();
        let (tx1, _rx1) = mpsc::channel(16);
        let (tx2, _rx2) = mpsc::channel(16);
        d.register("slow", vec!["g".into()], 1, tx1);
        d.ready(rid("a", 1), 1, "g", 5, 1000);
        assert_eq!(d.dispatch(0)[0].worker, "slow");
        d.register("fast", vec!["g".into()], 1, tx2);
        d.ended(&rid("a", 1), 1);
        d.ready(rid("a", 1), 2, "g", 5, 1000);
        let h = d.dispatch(10);
        assert_eq!((h[0].worker.as_str(), h[0].attempt), ("fast", 2));
    }

    #[test]
    fn a_reported_finish_frees_the_slot_before_the_commit() {
        let d = Dispatcher::default();
        let (tx, _rx) = mpsc::channel(16);
        let conn = d.register("w", vec!["g".into()], 1, tx);
        d.ready(rid("a", 1), 1, "g", 5, 1000);
        d.ready(rid("b", 2), 1, "g", 5, 1000);
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
}
