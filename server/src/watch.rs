//! The watch stream's source: job changes and run transitions as this node
//! applied them, each tagged with the log index of the entry that produced it
//! and its sequence within that entry, kept in a bounded in-memory ring.
//!
//! Events come from the effects apply returned, so every replica derives the
//! same events at the same positions: a watcher may resume on any node from
//! the position after the last event it saw, with no gap and no repeat. The
//! ring is node-local and not replicated (nothing is written to sled): a node
//! holds the events of the entries from `first` (the entry after what sled
//! held when it opened, or after an installed snapshot or a restore) up to
//! what it applied, minus what the ring dropped when full. Asking for a
//! position before `first` is refused as compacted, naming `first`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::core::{Effect, JobChange, RunId, RunState};

/// Events a node keeps by default (`--watch-events`). An event holds a job
/// id, group and worker id (each at most a few hundred bytes), so the ring
/// stays within a few tens of MiB.
pub const RING_EVENTS_DEFAULT: usize = 100_000;
/// Smallest `--watch-events`.
pub const RING_EVENTS_MIN: usize = 16;
/// Largest `--watch-events`.
pub const RING_EVENTS_MAX: usize = 10_000_000;
/// Concurrent watch streams one node serves.
pub const WATCHERS_MAX: usize = 256;
/// Job ids and groups one watch may filter on (each).
pub const FILTER_MAX: usize = 64;
/// Events a watcher takes from the ring at once, and the events queued for
/// its stream: a watcher that does not read holds no more than this.
pub const WATCHER_BUFFER_EVENTS: usize = 256;

/// A point in the event order: entry `index`, event `seq` within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub index: u64,
    pub seq: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at: Position,
    pub job: String,
    pub group: String,
    pub change: Change,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Job(JobChange),
    /// An attempt became ready for a worker: the occurrence's first attempt
    /// (fired or triggered), or a retry.
    Fired {
        run: RunId,
        attempt: u32,
    },
    Assigned {
        run: RunId,
        attempt: u32,
        worker: String,
    },
    Finished {
        run: RunId,
        attempt: u32,
        worker: String,
        outcome: RunState,
    },
}

/// What one entry did, for watchers: `None` for effects watchers do not see.
fn change_of(e: &Effect) -> Option<(&str, &str, Change)> {
    Some(match e {
        Effect::JobChanged { job, group, change } => (job, group, Change::Job(*change)),
        Effect::Ready(r) => (
            &r.run.job,
            &r.group,
            Change::Fired {
                run: r.run.clone(),
                attempt: r.attempt,
            },
        ),
        Effect::Assigned {
            run,
            attempt,
            group,
            worker,
        } => (
            &run.job,
            group,
            Change::Assigned {
                run: run.clone(),
                attempt: *attempt,
                worker: worker.clone(),
            },
        ),
        Effect::Finished(f) => (
            &f.run.job,
            &f.group,
            Change::Finished {
                run: f.run.clone(),
                attempt: f.attempt,
                worker: f.worker.clone(),
                outcome: f.outcome,
            },
        ),
        Effect::Scheduled(_)
        | Effect::Ended { .. }
        | Effect::Cancel { .. }
        | Effect::Restored
        | Effect::FiringResumed
        | Effect::Backfilled(_)
        | Effect::Misfired { .. } => return None,
    })
}

/// What watchers learn from one applied entry.
pub struct Applied {
    pub index: u64,
    pub events: Vec<Event>,
    /// The entry replaced the state (the last part of a restore): events
    /// before it no longer describe it, so the ring starts after it.
    pub replaced: bool,
}

impl Applied {
    pub fn new(index: u64, effects: &[Effect]) -> Self {
        Applied {
            index,
            events: events_of(index, effects),
            replaced: effects.contains(&Effect::Restored),
        }
    }
}

/// The events of the entry at `index`, in the order apply produced them.
pub fn events_of(index: u64, effects: &[Effect]) -> Vec<Event> {
    effects
        .iter()
        .filter_map(change_of)
        .zip(0u32..)
        .map(|((job, group, change), seq)| Event {
            at: Position { index, seq },
            job: job.to_string(),
            group: group.to_string(),
            change,
        })
        .collect()
}

/// Which events a watcher wants: empty lists match everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub jobs: Vec<String>,
    pub groups: Vec<String>,
}

impl Filter {
    fn matches(&self, e: &Event) -> bool {
        (self.jobs.is_empty() || self.jobs.contains(&e.job))
            && (self.groups.is_empty() || self.groups.contains(&e.group))
    }
}

/// The asked position is no longer held: re-list, then watch from `oldest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compacted {
    pub oldest: u64,
}

/// One read from the ring: the matching events and where to read next.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    pub events: Vec<Event>,
    pub next: Position,
}

/// The bounded ring. Pure: pushed entries in, reads out.
#[derive(Debug)]
pub struct Ring {
    events: VecDeque<Event>,
    capacity: usize,
    /// Every event of the entries from `first` to `next - 1` is held.
    first: u64,
    /// The entry after the last one pushed.
    next: u64,
}

impl Ring {
    /// An empty ring whose first entry will be `next`.
    pub fn new(capacity: usize, next: u64) -> Self {
        Ring {
            events: VecDeque::new(),
            capacity: capacity.max(1),
            first: next,
            next,
        }
    }

    pub fn first(&self) -> u64 {
        self.first
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    /// Adds the events of the entry at `index` (entries come in log order;
    /// one without events still moves `next`). When full, whole entries go,
    /// oldest first, so `first` is always an entry boundary.
    pub fn push(&mut self, index: u64, events: Vec<Event>) {
        debug_assert!(index >= self.next, "entries are pushed in log order");
        self.next = index + 1;
        self.events.extend(events);
        while self.events.len() > self.capacity {
            let gone = self.events.front().map_or(self.next - 1, |e| e.at.index);
            self.first = gone + 1;
            while self.events.front().is_some_and(|e| e.at.index == gone) {
                self.events.pop_front();
            }
        }
    }

    /// Forgets everything: the state was replaced (snapshot install,
    /// restore), so the events before `next` no longer describe it.
    pub fn reset(&mut self, next: u64) {
        self.events.clear();
        self.first = next;
        self.next = next;
    }

    /// Up to `max` events matching `filter` from `from` on. `next` moves
    /// past every event looked at, matching or not, and past the entries
    /// without events, so a watcher that keeps up is never compacted by
    /// events it does not want.
    pub fn read(&self, from: Position, filter: &Filter, max: usize) -> Result<Read, Compacted> {
        if from.index < self.first {
            return Err(Compacted { oldest: self.first });
        }
        let start = self.events.partition_point(|e| e.at < from);
        let mut events = Vec::new();
        let mut next = from.max(Position {
            index: self.next,
            seq: 0,
        });
        for e in self.events.range(start..) {
            if events.len() == max {
                next = e.at;
                break;
            }
            if filter.matches(e) {
                events.push(e.clone());
            }
        }
        Ok(Read { events, next })
    }
}

/// The ring shared by apply (writer) and watch streams (readers), with a
/// signal of the entry after the last one pushed.
pub struct Hub {
    ring: Mutex<Ring>,
    pushed: tokio::sync::watch::Sender<u64>,
    watchers: AtomicUsize,
    /// The node is stopping: streams end so the server can stop.
    closed: AtomicBool,
}

impl Hub {
    pub fn new(capacity: usize, next: u64) -> Self {
        Hub {
            ring: Mutex::new(Ring::new(capacity, next)),
            pushed: tokio::sync::watch::Sender::new(next),
            watchers: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Ends every stream (at its next wake) and refuses new ones.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.pushed.send_modify(|_| {});
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Adds the events of applied entries (in log order) and wakes watchers.
    pub fn push(&self, entries: Vec<Applied>) {
        let next = {
            let mut ring = self.ring.lock();
            for e in entries {
                match e.replaced {
                    true => ring.reset(e.index + 1),
                    false => ring.push(e.index, e.events),
                }
            }
            ring.next()
        };
        self.pushed.send_replace(next);
    }

    pub fn reset(&self, next: u64) {
        self.ring.lock().reset(next);
        self.pushed.send_replace(next);
    }

    pub fn read(&self, from: Position, filter: &Filter, max: usize) -> Result<Read, Compacted> {
        self.ring.lock().read(from, filter, max)
    }

    /// The oldest and next entry this node holds events for.
    pub fn bounds(&self) -> (u64, u64) {
        let ring = self.ring.lock();
        (ring.first(), ring.next())
    }

    /// Notified whenever entries are pushed or the ring is reset.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.pushed.subscribe()
    }

    /// A slot for one more watch stream, or `None` at `WATCHERS_MAX`.
    pub fn admit(self: &Arc<Self>) -> Option<WatcherSlot> {
        let taken = self
            .watchers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < WATCHERS_MAX).then_some(n + 1)
            });
        taken.ok().map(|_| WatcherSlot(self.clone()))
    }

    pub fn watchers(&self) -> usize {
        self.watchers.load(Ordering::Acquire)
    }
}

/// Held by a watch stream while it runs.
pub struct WatcherSlot(Arc<Hub>);

impl Drop for WatcherSlot {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_event(index: u64, seq: u32, job: &str, group: &str) -> Event {
        Event {
            at: Position { index, seq },
            job: job.into(),
            group: group.into(),
            change: Change::Job(JobChange::Created),
        }
    }

    fn at(index: u64, seq: u32) -> Position {
        Position { index, seq }
    }

    fn positions(r: &Read) -> Vec<(u64, u32)> {
        r.events.iter().map(|e| (e.at.index, e.at.seq)).collect()
    }

    fn ring_with(capacity: usize, entries: &[(u64, u32)]) -> Ring {
        let mut ring = Ring::new(capacity, 1);
        for (index, n) in entries {
            let events = (0..*n).map(|s| job_event(*index, s, "a", "g")).collect();
            ring.push(*index, events);
        }
        ring
    }

    #[test]
    fn events_are_numbered_within_their_entry_and_unwatched_effects_are_left_out() {
        let run = RunId::new("a", 5);
        let effects = vec![
            Effect::Scheduled(crate::core::WheelKey::occurrence("a", 9)),
            Effect::JobChanged {
                job: "a".into(),
                group: "g".into(),
                change: JobChange::Paused,
            },
            Effect::Ended {
                run: run.clone(),
                attempt: 1,
            },
            Effect::Assigned {
                run: run.clone(),
                attempt: 1,
                group: "g".into(),
                worker: "w".into(),
            },
        ];
        let events = events_of(7, &effects);
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].at, &events[0].change),
            (at(7, 0), &Change::Job(JobChange::Paused))
        );
        let assigned = Change::Assigned {
            run,
            attempt: 1,
            worker: "w".into(),
        };
        assert_eq!((events[1].at, &events[1].change), (at(7, 1), &assigned));
    }

    #[test]
    fn a_resumed_read_continues_exactly_after_the_last_event_seen() {
        let ring = ring_with(100, &[(1, 2), (2, 0), (3, 3)]);
        let first = ring.read(at(1, 0), &Filter::default(), 3).unwrap();
        assert_eq!(positions(&first), vec![(1, 0), (1, 1), (3, 0)]);
        assert_eq!(first.next, at(3, 1));
        let rest = ring.read(first.next, &Filter::default(), 10).unwrap();
        assert_eq!(positions(&rest), vec![(3, 1), (3, 2)]);
        assert_eq!(rest.next, at(4, 0), "caught up: the next entry");
        let mid = ring.read(at(3, 2), &Filter::default(), 10).unwrap();
        assert_eq!(positions(&mid), vec![(3, 2)]);
    }

    #[test]
    fn a_read_past_what_was_applied_waits_there() {
        let ring = ring_with(100, &[(1, 1)]);
        let r = ring.read(at(9, 0), &Filter::default(), 10).unwrap();
        assert_eq!((r.events.len(), r.next), (0, at(9, 0)));
    }

    #[test]
    fn a_full_ring_drops_whole_entries_and_older_positions_are_compacted() {
        let ring = ring_with(4, &[(1, 2), (2, 2), (3, 1)]);
        assert_eq!(ring.first(), 2, "entry 1 went whole");
        assert_eq!(
            ring.read(at(1, 1), &Filter::default(), 10),
            Err(Compacted { oldest: 2 })
        );
        let r = ring.read(at(2, 0), &Filter::default(), 10).unwrap();
        assert_eq!(positions(&r), vec![(2, 0), (2, 1), (3, 0)]);
    }

    #[test]
    fn an_entry_larger_than_the_ring_leaves_it_empty_from_the_next_entry() {
        let ring = ring_with(2, &[(1, 1), (2, 3)]);
        assert_eq!((ring.first(), ring.next()), (3, 3));
        assert_eq!(
            ring.read(at(2, 0), &Filter::default(), 10),
            Err(Compacted { oldest: 3 })
        );
    }

    #[test]
    fn a_reset_compacts_everything_before_it() {
        let mut ring = ring_with(100, &[(1, 2)]);
        ring.reset(50);
        assert_eq!(
            ring.read(at(2, 0), &Filter::default(), 10),
            Err(Compacted { oldest: 50 })
        );
        assert_eq!(
            ring.read(at(50, 0), &Filter::default(), 10).unwrap().events,
            vec![]
        );
    }

    #[test]
    fn filters_select_by_job_and_group_and_the_cursor_passes_what_they_skip() {
        let mut ring = Ring::new(100, 1);
        ring.push(
            1,
            vec![job_event(1, 0, "a", "g1"), job_event(1, 1, "b", "g2")],
        );
        ring.push(2, vec![job_event(2, 0, "c", "g1")]);
        let by_job = Filter {
            jobs: vec!["b".into()],
            groups: vec![],
        };
        let r = ring.read(at(1, 0), &by_job, 10).unwrap();
        assert_eq!((positions(&r), r.next), (vec![(1, 1)], at(3, 0)));
        let by_group = Filter {
            jobs: vec![],
            groups: vec!["g1".into()],
        };
        let r = ring.read(at(1, 0), &by_group, 10).unwrap();
        assert_eq!(positions(&r), vec![(1, 0), (2, 0)]);
        let both = Filter {
            jobs: vec!["a".into()],
            groups: vec!["g2".into()],
        };
        assert_eq!(ring.read(at(1, 0), &both, 10).unwrap().events, vec![]);
    }

    #[test]
    fn the_last_part_of_a_restore_compacts_everything_up_to_it() {
        let hub = Hub::new(100, 1);
        let created = Effect::JobChanged {
            job: "a".into(),
            group: "g".into(),
            change: JobChange::Created,
        };
        hub.push(vec![
            Applied::new(1, std::slice::from_ref(&created)),
            Applied::new(2, &[Effect::Restored]),
            Applied::new(3, &[created]),
        ]);
        let all = Filter::default();
        assert_eq!(hub.read(at(1, 0), &all, 10), Err(Compacted { oldest: 3 }));
        let after = hub.read(at(3, 0), &all, 10).unwrap();
        assert_eq!((positions(&after), hub.bounds()), (vec![(3, 0)], (3, 4)));
    }

    #[test]
    fn watchers_beyond_the_limit_are_refused_and_a_dropped_slot_is_given_back() {
        let hub = Arc::new(Hub::new(16, 1));
        let slots: Vec<_> = (0..WATCHERS_MAX).map(|_| hub.admit().unwrap()).collect();
        assert!(hub.admit().is_none());
        drop(slots);
        assert_eq!(hub.watchers(), 0);
        assert!(hub.admit().is_some());
    }
}
