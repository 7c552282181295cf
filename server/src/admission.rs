//! Admission control for client writes on the leader. A write is admitted
//! only while the work already accepted stays within [`Bounds`]: client
//! commands admitted and not yet answered (count and encoded bytes), and
//! log entries the leader has appended but not yet applied (count, and the
//! time they take to apply at the rate it applies). Past a bound the
//! write is refused at once with a retry-after hint, before anything is
//! proposed, so a refusal changes nothing. An admitted command still queued
//! after `max_wait_ms` is refused the same way, unproposed, so an answer
//! never waits behind a queue that stopped moving; and while the oldest
//! client batch in the log has waited past `max_write_age_ms` for its
//! answer, every write is refused, so a write is not admitted into a log
//! that is slow now (a stalled commit or apply shows here at once, long
//! before any batch comes back to say so). Fires, assignments,
//! finishes and expiries never come here: they are committed work already.
//!
//! The retry-after hint ([`Hint`]) adapts to the refusals against the
//! admissions, so refused clients come back about as fast as writes fit.
//! The decisions ([`Bounds::check`], [`Bounds::check_wait`], [`Hint`]) are
//! pure functions of the load and times passed in; [`Admission`] holds the
//! counters, and a [`Ticket`] gives its share back when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Shortest and longest retry-after hint, and where it starts.
pub const RETRY_AFTER_MIN_MS: u64 = 50;
pub const RETRY_AFTER_MAX_MS: u64 = 5_000;
pub const RETRY_AFTER_START_MS: u64 = 200;
/// How often the hint is adapted to the refusals and admissions since.
pub const HINT_WINDOW_MS: i64 = 250;
/// Most client commands the bounds may allow in flight (the queue's capacity).
pub const COMMANDS_LIMIT: usize = 65_536;

/// What the leader accepts before it refuses client writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Client commands admitted and not yet answered (queued or proposed).
    pub max_commands: usize,
    /// Their encoded bytes.
    pub max_bytes: usize,
    /// Log entries appended on the leader and not yet applied there.
    pub max_backlog: u64,
    /// How long applying those may take, at the rate the leader applies
    /// while it has a backlog ([`Drain`]).
    pub max_backlog_ms: u64,
    /// Longest an admitted command waits in the queue before it is proposed.
    pub max_wait_ms: u64,
    /// How long the oldest client batch in the log may have waited for its
    /// answer: past it the log is slow now, a write admitted would wait
    /// behind it, and every write is refused (the reserve included) until
    /// it is answered. Unlike the other signals it needs no batch to come
    /// back first, so a stall is seen while it lasts.
    pub max_write_age_ms: u64,
    /// How late the leader's oldest due timer may be, still waiting to be
    /// proposed: past it the cluster is behind on work it already accepted,
    /// and new writes (which add more) get only the reserve.
    pub max_fire_lag_ms: u64,
    /// Client commands admitted whatever the backlog and the adaptive limit
    /// while fewer than this many are in flight: writes keep a share of the
    /// log when committed fires alone keep its backlog past the bounds.
    pub reserve: usize,
    /// A client batch slower than this from proposal to answer tells the
    /// leader's firing loop to let less fire work into the log ahead of
    /// writes (`leader::pace`); 0: fires never yield to writes.
    pub write_target_ms: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_commands: 2_048,
            max_bytes: 16 << 20,
            max_backlog: 64,
            max_backlog_ms: 200,
            max_wait_ms: 100,
            max_write_age_ms: 200,
            max_fire_lag_ms: 1_000,
            reserve: 16,
            write_target_ms: 300,
        }
    }
}

/// The work in flight when a write arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub commands: usize,
    pub bytes: usize,
    pub backlog: u64,
    /// Estimated time to apply the backlog.
    pub backlog_ms: u64,
    /// How long the oldest due timer the leader holds back has been due.
    pub fire_lag_ms: u64,
    /// How long the oldest client batch proposed and not yet answered has
    /// waited (0 when none is).
    pub write_age_ms: u64,
}

/// Which bound a write would pass, and by how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub what: &'static str,
    pub have: u64,
    pub max: u64,
}

/// A refused write: the refusal and when to try again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader overloaded ({} {}, bound {}); nothing was written; retry after {retry_after_ms} ms", .refusal.what, .refusal.have, .refusal.max)]
pub struct Overloaded {
    pub refusal: Refusal,
    pub retry_after_ms: u64,
}

impl Bounds {
    /// Checks each bound's range, naming its flag.
    pub fn validate(&self) -> Result<(), String> {
        let ranges = [
            (
                "admit-max-commands",
                self.max_commands as u64,
                COMMANDS_LIMIT as u64,
            ),
            ("admit-max-kb", (self.max_bytes >> 10) as u64, 1 << 20),
            ("admit-max-backlog", self.max_backlog, 1_000_000),
            ("admit-max-backlog-ms", self.max_backlog_ms, 60_000),
            ("admit-max-wait-ms", self.max_wait_ms, 60_000),
            ("admit-max-write-age-ms", self.max_write_age_ms, 60_000),
            ("admit-max-fire-lag-ms", self.max_fire_lag_ms, 3_600_000),
            // 0 is allowed: pacing off.
            ("admit-write-target-ms", self.write_target_ms.max(1), 60_000),
        ];
        for (flag, got, max) in ranges {
            if !(1..=max).contains(&got) {
                return Err(format!("{flag}: must be between 1 and {max}, got {got}"));
            }
        }
        if self.reserve > self.max_commands {
            return Err(format!(
                "admit-reserve: must be at most admit-max-commands ({}), got {}",
                self.max_commands, self.reserve
            ));
        }
        match self.max_bytes.is_multiple_of(1024) {
            true => Ok(()),
            false => Err(format!(
                "admit-max-kb: {} bytes is not whole KiB",
                self.max_bytes
            )),
        }
    }

    /// Whether one more command of `bytes` may join `load`. A command alone
    /// is admitted whatever its size (its size is bounded by the message cap);
    /// one that finds fewer than `reserve` in flight is admitted whatever the
    /// backlog (within the bytes bound and the write age).
    pub fn check(&self, load: Load, bytes: usize) -> Result<(), Refusal> {
        let refusal = |what, have, max: u64| Err(Refusal { what, have, max });
        let reserved = load.commands < self.reserve;
        let commands = load.commands as u64 + 1;
        if commands > self.max_commands as u64 && !reserved {
            return refusal(
                "client writes in flight",
                commands,
                self.max_commands as u64,
            );
        }
        let total = load.bytes.saturating_add(bytes) as u64;
        if load.commands > 0 && total > self.max_bytes as u64 {
            return refusal(
                "bytes of client writes in flight",
                total,
                self.max_bytes as u64,
            );
        }
        if load.write_age_ms > self.max_write_age_ms {
            let (what, max) = (
                "ms the oldest client write in the log waits for its answer",
                self.max_write_age_ms,
            );
            return refusal(what, load.write_age_ms, max);
        }
        if reserved {
            return Ok(());
        }
        if load.backlog > self.max_backlog {
            let max = self.max_backlog;
            return refusal("log entries not yet applied", load.backlog, max);
        }
        if load.backlog_ms > self.max_backlog_ms {
            let (what, max) = ("ms to apply the log not yet applied", self.max_backlog_ms);
            return refusal(what, load.backlog_ms, max);
        }
        if load.fire_lag_ms > self.max_fire_lag_ms {
            let (what, max) = (
                "ms the oldest due timer waits to fire",
                self.max_fire_lag_ms,
            );
            return refusal(what, load.fire_lag_ms, max);
        }
        Ok(())
    }

    /// Whether a command queued at `queued_ms` may still be proposed at
    /// `now_ms` (both on the monotonic clock).
    pub fn check_wait(&self, queued_ms: i64, now_ms: i64) -> Result<(), Refusal> {
        match now_ms.saturating_sub(queued_ms) > self.max_wait_ms as i64 {
            true => Err(self.overdue(queued_ms, now_ms)),
            false => Ok(()),
        }
    }

    /// The refusal of a command queued at `queued_ms` and still not proposed.
    pub fn overdue(&self, queued_ms: i64, now_ms: i64) -> Refusal {
        Refusal {
            what: "ms queued before proposing",
            have: now_ms.saturating_sub(queued_ms).max(0) as u64,
            max: self.max_wait_ms,
        }
    }
}

/// The retry-after hint, adapted every `HINT_WINDOW_MS` so that refused
/// clients come back at about the rate writes are admitted: clients told
/// to wait `ms` return at about `refused / window`, and `admitted / window`
/// is what fits, so the hint is scaled by refused / admitted (at most
/// halved or doubled per window, within its range). A window without a
/// refusal halves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub ms: u64,
    window_start_ms: i64,
    admitted: u64,
    refused: u64,
}

impl Hint {
    pub fn new(now_ms: i64) -> Self {
        Hint {
            ms: RETRY_AFTER_START_MS,
            window_start_ms: now_ms,
            admitted: 0,
            refused: 0,
        }
    }

    /// Counts one decision at `now_ms`, adapting first if windows ended.
    pub fn record(&mut self, now_ms: i64, admitted: bool) {
        let windows = (now_ms - self.window_start_ms) / HINT_WINDOW_MS;
        if windows > 0 {
            let (r, a) = (self.refused as u128, self.admitted.max(1) as u128);
            let scaled = (self.ms as u128 * r / a) as u64;
            self.ms = scaled.clamp(self.ms / 2, self.ms * 2);
            // Windows with no decision at all had no refusal either.
            for _ in 1..windows.min(16) {
                self.ms /= 2;
            }
            self.ms = self.ms.clamp(RETRY_AFTER_MIN_MS, RETRY_AFTER_MAX_MS);
            self.window_start_ms = now_ms;
            (self.admitted, self.refused) = (0, 0);
        }
        match admitted {
            true => self.admitted += 1,
            false => self.refused += 1,
        }
    }
}

/// How fast this node applies log entries while it has a backlog, and so
/// how long its current backlog takes to apply. Fed a reading of the
/// applied index and the backlog every `DRAIN_SAMPLE_MS`; the rate is an
/// average over readings taken while busy (an idle node says nothing about
/// its speed), so the first write after a quiet spell is not refused.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Drain {
    last: Option<(i64, u64, u64)>,
    per_s: Option<f64>,
    /// Estimated milliseconds to apply the backlog of the last reading.
    pub ms: u64,
}

/// How often the apply rate is read.
pub const DRAIN_SAMPLE_MS: u64 = 100;

impl Drain {
    /// A reading at `now_ms` of the applied index and the backlog.
    pub fn observe(&mut self, now_ms: i64, applied: u64, backlog: u64) {
        if let Some((t, a, b)) = self.last {
            let dt = now_ms - t;
            if dt > 0 && b > 0 {
                let rate = applied.saturating_sub(a) as f64 * 1000.0 / dt as f64;
                self.per_s = Some(self.per_s.map_or(rate, |r| r * 0.7 + rate * 0.3));
            }
        }
        self.last = Some((now_ms, applied, backlog));
        self.ms = match self.per_s {
            Some(r) if backlog > 0 => (backlog as f64 * 1000.0 / r.max(0.01)).min(1e12) as u64,
            _ => 0,
        };
    }
}

/// The leader's admission counters.
pub struct Admission {
    pub bounds: Bounds,
    state: Mutex<State>,
    refused: AtomicU64,
    /// Set by the leader's firing loop (`set_fire_lag`).
    fire_lag_ms: AtomicU64,
    /// Client batches answered slower / no slower than `write_target_ms`
    /// since the firing loop last asked (`take_write_pace`).
    slow_writes: AtomicU64,
    fast_writes: AtomicU64,
}

/// What client writes told the firing loop since it last asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePace {
    /// A client batch took longer than `Bounds::write_target_ms`.
    Slow,
    /// Client batches came back in time, or none is in flight (or the
    /// target is 0: fires never yield).
    Fast,
    /// Writes are in flight and none has come back since.
    Unknown,
}

struct State {
    commands: usize,
    bytes: usize,
    hint: Hint,
    drain: Drain,
    /// Client commands let in flight now, at most `max_commands`: halved
    /// after a client batch that took longer than `max_backlog_ms` from
    /// proposal to answer, grown by each batch that did not. While the log
    /// is slow, few writes wait in it and the rest are refused at once.
    limit: usize,
    /// Client batches proposed and not yet answered: id, and when proposed.
    proposed: Vec<(u64, i64)>,
    next_proposal: u64,
}

impl State {
    /// How long the oldest client batch in the log has waited at `now_ms`.
    fn write_age_ms(&self, now_ms: i64) -> u64 {
        let oldest = self.proposed.iter().map(|(_, at)| *at).min();
        oldest.map_or(0, |at| now_ms.saturating_sub(at).max(0) as u64)
    }
}

/// A client batch in the log, counted in the write age until dropped (once
/// its waiters have been answered, or the proposal was abandoned).
pub struct Proposed {
    admission: Arc<Admission>,
    id: u64,
}

impl Drop for Proposed {
    fn drop(&mut self) {
        let mut st = self.admission.state();
        st.proposed.retain(|(id, _)| *id != self.id);
    }
}

/// One admitted command's share of the load, given back when dropped
/// (when its waiter has been answered, or the command was dropped).
pub struct Ticket {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Admission {
    pub fn new(bounds: Bounds, now_ms: i64) -> Arc<Self> {
        Arc::new(Admission {
            bounds,
            state: Mutex::new(State {
                commands: 0,
                bytes: 0,
                hint: Hint::new(now_ms),
                drain: Drain::default(),
                limit: bounds.max_commands,
                proposed: Vec::new(),
                next_proposal: 0,
            }),
            refused: AtomicU64::new(0),
            fire_lag_ms: AtomicU64::new(0),
            slow_writes: AtomicU64::new(0),
            fast_writes: AtomicU64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The load at `now_ms`: `st`'s counts and write age, `backlog` and
    /// the firing loop's lag.
    fn load_with(&self, st: &State, backlog: u64, now_ms: i64) -> Load {
        Load {
            commands: st.commands,
            bytes: st.bytes,
            backlog,
            backlog_ms: st.drain.ms,
            fire_lag_ms: self.fire_lag(),
            write_age_ms: st.write_age_ms(now_ms),
        }
    }

    /// Records a client batch proposed at `now_ms`; it counts in the write
    /// age until the returned guard is dropped.
    pub fn proposing(self: &Arc<Self>, now_ms: i64) -> Proposed {
        let mut st = self.state();
        st.next_proposal += 1;
        let id = st.next_proposal;
        st.proposed.push((id, now_ms));
        Proposed {
            admission: self.clone(),
            id,
        }
    }

    /// Admits a command of `bytes` while `backlog` entries wait to be applied.
    pub fn admit(
        self: &Arc<Self>,
        bytes: usize,
        backlog: u64,
        now_ms: i64,
    ) -> Result<Ticket, Overloaded> {
        let mut st = self.state();
        let load = self.load_with(&st, backlog, now_ms);
        let bounds = Bounds {
            max_commands: st.limit,
            ..self.bounds
        };
        let res = bounds.check(load, bytes);
        self.decide(&mut st, res, now_ms)?;
        (st.commands, st.bytes) = (st.commands + 1, st.bytes.saturating_add(bytes));
        Ok(Ticket {
            admission: self.clone(),
            bytes,
        })
    }

    /// Refuses a write at once, before any work on it, if even a small
    /// command would be refused now. Admits nothing.
    pub fn precheck(&self, backlog: u64, now_ms: i64) -> Result<(), Overloaded> {
        let mut st = self.state();
        let load = self.load_with(&st, backlog, now_ms);
        match self.bounds.check(load, 0) {
            Ok(()) => Ok(()),
            refused => self.decide(&mut st, refused, now_ms),
        }
    }

    /// Checks an admitted command again as it is about to be proposed:
    /// refused (unproposed; its ticket goes with it) if it waited too long,
    /// or if the backlog it would queue behind has grown past its bounds.
    pub fn recheck(&self, queued_ms: i64, backlog: u64, now_ms: i64) -> Result<(), Overloaded> {
        let mut st = self.state();
        // The others in flight: its own share is counted already.
        let behind = Load {
            commands: st.commands.saturating_sub(1),
            bytes: 0,
            ..self.load_with(&st, backlog, now_ms)
        };
        let res = (self.bounds.check_wait(queued_ms, now_ms)).and(self.bounds.check(behind, 0));
        match res {
            Ok(()) => Ok(()),
            refused => self.decide(&mut st, refused, now_ms),
        }
    }

    /// Refuses a command its waiter withdrew from the queue, unproposed.
    pub fn withdraw(&self, queued_ms: i64, now_ms: i64) -> Overloaded {
        let overdue = self.bounds.overdue(queued_ms, now_ms);
        self.refuse(&mut self.state(), overdue, now_ms)
    }

    /// Records the decision in the hint; a refusal carries the hint.
    fn decide(
        &self,
        st: &mut State,
        res: Result<(), Refusal>,
        now_ms: i64,
    ) -> Result<(), Overloaded> {
        match res {
            Ok(()) => {
                st.hint.record(now_ms, true);
                Ok(())
            }
            Err(refusal) => Err(self.refuse(st, refusal, now_ms)),
        }
    }

    fn refuse(&self, st: &mut State, refusal: Refusal, now_ms: i64) -> Overloaded {
        st.hint.record(now_ms, false);
        self.refused.fetch_add(1, Ordering::Relaxed);
        Overloaded {
            refusal,
            retry_after_ms: st.hint.ms,
        }
    }

    /// A client batch of `commands` took `took_ms` from proposal to answer.
    pub fn completed(&self, took_ms: u64, commands: usize) {
        match took_ms > self.bounds.write_target_ms {
            true => self.slow_writes.fetch_add(1, Ordering::Relaxed),
            false => self.fast_writes.fetch_add(1, Ordering::Relaxed),
        };
        let mut st = self.state();
        st.limit = match took_ms > self.bounds.max_backlog_ms {
            true => st.limit / 2,
            false => st.limit.saturating_add(commands),
        }
        .clamp(1, self.bounds.max_commands);
    }

    /// Client commands let in flight now (see `State::limit`).
    pub fn limit(&self) -> usize {
        self.state().limit
    }

    /// A reading of this node's applied index and backlog (see [`Drain`]).
    pub fn observe_apply(&self, now_ms: i64, applied: u64, backlog: u64) {
        self.state().drain.observe(now_ms, applied, backlog);
    }

    /// Client commands and their bytes in flight now.
    pub fn load(&self) -> (usize, usize) {
        let st = self.state();
        (st.commands, st.bytes)
    }

    /// How long the oldest due timer the firing loop holds back has been
    /// due (0 when it holds none back, while firing is paused, and when
    /// this node stops leading).
    pub fn set_fire_lag(&self, ms: u64) {
        self.fire_lag_ms.store(ms, Ordering::Relaxed);
    }

    pub fn fire_lag(&self) -> u64 {
        self.fire_lag_ms.load(Ordering::Relaxed)
    }

    /// How client batches came back since the last call (see [`WritePace`]).
    pub fn take_write_pace(&self) -> WritePace {
        let slow = self.slow_writes.swap(0, Ordering::Relaxed);
        let fast = self.fast_writes.swap(0, Ordering::Relaxed);
        if self.bounds.write_target_ms == 0 {
            return WritePace::Fast;
        }
        match (slow, fast) {
            (1.., _) => WritePace::Slow,
            (0, 1..) => WritePace::Fast,
            (0, 0) if self.load().0 == 0 => WritePace::Fast,
            (0, 0) => WritePace::Unknown,
        }
    }

    /// Client writes refused since start.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.admission.state();
        st.commands = st.commands.saturating_sub(1);
        st.bytes = st.bytes.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds() -> Bounds {
        Bounds {
            max_commands: 3,
            max_bytes: 1000,
            max_backlog: 10,
            max_backlog_ms: 500,
            max_wait_ms: 400,
            max_write_age_ms: 700,
            max_fire_lag_ms: 1_000,
            reserve: 0,
            write_target_ms: 300,
        }
    }

    fn load(commands: usize, bytes: usize, backlog: u64) -> Load {
        Load {
            commands,
            bytes,
            backlog,
            backlog_ms: 0,
            fire_lag_ms: 0,
            write_age_ms: 0,
        }
    }

    fn refused(what: &'static str, have: u64, max: u64) -> Result<(), Refusal> {
        Err(Refusal { what, have, max })
    }

    #[test]
    fn each_bound_refuses_past_it_and_names_itself() {
        let b = bounds();
        assert_eq!(b.check(load(2, 900, 10), 100), Ok(()));
        let writes = "client writes in flight";
        assert_eq!(b.check(load(3, 0, 0), 1), refused(writes, 4, 3));
        let bytes = "bytes of client writes in flight";
        assert_eq!(b.check(load(1, 900, 0), 101), refused(bytes, 1001, 1000));
        let backlog = "log entries not yet applied";
        assert_eq!(b.check(load(0, 0, 11), 1), refused(backlog, 11, 10));
        let slow = Load {
            backlog_ms: 501,
            ..load(0, 0, 2)
        };
        let ms = "ms to apply the log not yet applied";
        assert_eq!(b.check(slow, 1), refused(ms, 501, 500));
        let behind = Load {
            fire_lag_ms: 1_001,
            ..load(0, 0, 2)
        };
        let lag = "ms the oldest due timer waits to fire";
        assert_eq!(b.check(behind, 1), refused(lag, 1_001, 1_000));
        let at_bound = Load {
            fire_lag_ms: 1_000,
            ..load(0, 0, 2)
        };
        assert_eq!(b.check(at_bound, 1), Ok(()));
        let stuck = Load {
            write_age_ms: 701,
            ..load(0, 0, 0)
        };
        let age = "ms the oldest client write in the log waits for its answer";
        assert_eq!(b.check(stuck, 1), refused(age, 701, 700));
    }

    #[test]
    fn while_the_oldest_write_in_the_log_waits_past_its_bound_every_write_is_refused() {
        let a = Admission::new(
            Bounds {
                reserve: 3,
                ..bounds()
            },
            0,
        );
        let t = a.admit(1, 0, 0).unwrap();
        let first = a.proposing(1_000);
        let second = a.proposing(1_500);
        // Young enough: admitted, within the reserve whatever the backlog.
        let t2 = a.admit(1, 50, 1_700).expect("oldest waited 700 ms");
        let e = a.admit(1, 0, 1_701).err().unwrap();
        let age = "ms the oldest client write in the log waits for its answer";
        assert_eq!((e.refusal.what, e.refusal.have), (age, 701));
        assert!(a.precheck(0, 1_701).is_err());
        let e = a.recheck(1_650, 0, 1_701).err().unwrap();
        assert_eq!(e.refusal.what, age, "queued ones are refused unproposed");
        // The oldest answered: the age is the next one's.
        drop(first);
        assert_eq!(a.precheck(0, 2_200), Ok(()));
        assert!(a.precheck(0, 2_201).is_err());
        drop(second);
        assert_eq!(a.precheck(0, 1_000_000), Ok(()), "none in the log");
        assert_eq!(a.refused_total(), 4);
        drop((t, t2));
    }

    #[test]
    fn while_fires_lag_only_the_reserve_gets_in_and_the_rest_come_back_with_it() {
        let a = Admission::new(
            Bounds {
                reserve: 1,
                ..bounds()
            },
            0,
        );
        a.set_fire_lag(5_000);
        let t = a.admit(1, 0, 0).expect("the reserve");
        let e = a.admit(1, 0, 0).err().unwrap();
        assert_eq!(e.refusal.what, "ms the oldest due timer waits to fire");
        assert!(a.precheck(0, 0).is_err());
        drop(t);
        a.set_fire_lag(0);
        let t = [a.admit(1, 0, 0), a.admit(1, 0, 0), a.admit(1, 0, 0)];
        assert!(t.iter().all(Result::is_ok), "caught up: the whole limit");
    }

    #[test]
    fn the_drain_time_is_the_backlog_at_the_rate_applied_while_busy() {
        let mut d = Drain::default();
        // Idle: nothing to learn, nothing to drain.
        d.observe(0, 100, 0);
        d.observe(100, 100, 0);
        assert_eq!(d.ms, 0);
        // Busy with no rate measured yet: not refused for it.
        d.observe(200, 100, 5);
        assert_eq!(d.ms, 0);
        // 4 entries in 100 ms while busy: 40/s, so 8 entries take 200 ms.
        d.observe(300, 104, 8);
        assert_eq!(d.ms, 200);
        // Stuck on one entry: the rate decays and the estimate grows.
        d.observe(400, 104, 8);
        assert_eq!(d.ms, 285, "8 / (40 x 0.7) s");
        d.observe(500, 104, 8);
        assert!(d.ms > 400, "{}", d.ms);
        // Drained: nothing to wait for, whatever the rate.
        d.observe(600, 112, 0);
        assert_eq!(d.ms, 0);
    }

    #[test]
    fn a_command_alone_is_admitted_whatever_its_size() {
        assert_eq!(bounds().check(load(0, 0, 0), 1 << 30), Ok(()));
        assert!(bounds().check(load(1, 1, 0), 1 << 30).is_err());
    }

    #[test]
    fn a_command_queued_too_long_is_refused() {
        let b = bounds();
        assert_eq!(b.check_wait(1_000, 1_400), Ok(()));
        let waited = "ms queued before proposing";
        assert_eq!(b.check_wait(1_000, 1_401), refused(waited, 401, 400));
        // A clock read out of order never refuses.
        assert_eq!(b.check_wait(1_000, 900), Ok(()));
    }

    /// One window of `refused` refusals and `admitted` admissions, then
    /// the hint the next window starts with.
    fn after_window(h: &mut Hint, t: &mut i64, refused: u64, admitted: u64) -> u64 {
        (0..refused).for_each(|_| h.record(*t, false));
        (0..admitted).for_each(|_| h.record(*t, true));
        *t += HINT_WINDOW_MS;
        h.record(*t, true);
        h.ms
    }

    #[test]
    fn the_hint_follows_refusals_against_admissions_within_its_range() {
        let (mut h, mut t) = (Hint::new(0), 0);
        assert_eq!(h.ms, RETRY_AFTER_START_MS);
        // Ten refused for each admitted: at most doubled per window, up to the max.
        assert_eq!(after_window(&mut h, &mut t, 1000, 100), 400);
        assert_eq!(after_window(&mut h, &mut t, 1000, 100), 800);
        for _ in 0..10 {
            after_window(&mut h, &mut t, 1000, 100);
        }
        assert_eq!(h.ms, RETRY_AFTER_MAX_MS);
        // (Each window also counts the admission that closed the one before.)
        // As many come back as fit: the hint holds.
        assert_eq!(after_window(&mut h, &mut t, 101, 100), RETRY_AFTER_MAX_MS);
        // 3 refused per 4 admitted: scaled by 3/4.
        assert_eq!(after_window(&mut h, &mut t, 300, 399), 3750);
        // No refusal: halved per window, down to the min.
        assert_eq!(after_window(&mut h, &mut t, 0, 50), 1875);
        for _ in 0..10 {
            after_window(&mut h, &mut t, 0, 50);
        }
        assert_eq!(h.ms, RETRY_AFTER_MIN_MS);
    }

    #[test]
    fn quiet_windows_halve_the_hint_each() {
        let (mut h, mut t) = (Hint::new(0), 0);
        after_window(&mut h, &mut t, 1000, 1);
        after_window(&mut h, &mut t, 1000, 1);
        assert_eq!(h.ms, 800);
        // Three windows pass without a decision: one adapt (no refusal
        // since) and two quiet windows.
        h.record(t + 3 * HINT_WINDOW_MS, false);
        assert_eq!(h.ms, 100);
    }

    #[test]
    fn tickets_hold_their_share_until_dropped_and_refusals_carry_the_hint() {
        let a = Admission::new(bounds(), 0);
        let t1 = a.admit(300, 0, 0).unwrap();
        let t2 = a.admit(300, 0, 0).unwrap();
        let t3 = a.admit(300, 0, 0).unwrap();
        assert_eq!(a.load(), (3, 900));
        let e = a.admit(1, 0, 0).err().unwrap();
        assert_eq!(e.retry_after_ms, RETRY_AFTER_START_MS);
        assert!(e.to_string().contains("retry after 200 ms"), "{e}");
        assert!(e.to_string().contains("nothing was written"), "{e}");
        assert!(a.precheck(0, 0).is_err(), "full");
        drop(t2);
        assert_eq!(a.load(), (2, 600));
        assert_eq!(a.precheck(0, 0), Ok(()));
        assert!(a.precheck(11, 0).is_err(), "backlog");
        assert!(a.admit(401, 0, 0).is_err(), "1001 bytes in flight");
        let t4 = a.admit(400, 0, 0).unwrap();
        assert_eq!(a.refused_total(), 4);
        drop((t1, t3, t4));
        assert_eq!(a.load(), (0, 0));
        assert_eq!(a.recheck(0, 10, 400), Ok(()));
        assert!(a.recheck(0, 10, 401).is_err(), "waited too long");
        assert!(a.recheck(400, 11, 401).is_err(), "backlog grew meanwhile");
        let e = a.withdraw(0, 300);
        assert_eq!((e.refusal.have, e.refusal.max), (300, 400));
        assert_eq!(a.refused_total(), 7);
    }

    #[test]
    fn slow_batches_halve_the_writes_let_in_flight_and_fast_ones_grow_it() {
        let a = Admission::new(bounds(), 0);
        assert_eq!(a.limit(), 3);
        a.completed(501, 1);
        assert_eq!(a.limit(), 1);
        a.completed(501, 1);
        assert_eq!(a.limit(), 1, "never below one");
        let t = a.admit(1, 0, 0).unwrap();
        let e = a.admit(1, 0, 0).err().unwrap();
        assert_eq!((e.refusal.have, e.refusal.max), (2, 1));
        drop(t);
        a.completed(500, 1);
        assert_eq!(a.limit(), 2);
        a.completed(10, 100);
        assert_eq!(a.limit(), 3, "never above the bound");
    }

    #[test]
    fn the_firing_loop_hears_whether_writes_came_back_in_time() {
        let a = Admission::new(bounds(), 0);
        assert_eq!(a.take_write_pace(), WritePace::Fast, "no writes at all");
        let t = a.admit(1, 0, 0).unwrap();
        assert_eq!(
            a.take_write_pace(),
            WritePace::Unknown,
            "one in flight, none back"
        );
        a.completed(300, 1);
        assert_eq!(a.take_write_pace(), WritePace::Fast);
        a.completed(300, 1);
        a.completed(301, 1);
        assert_eq!(
            a.take_write_pace(),
            WritePace::Slow,
            "one slow batch is enough"
        );
        assert_eq!(a.take_write_pace(), WritePace::Unknown, "taken");
        drop(t);
        assert_eq!(a.take_write_pace(), WritePace::Fast);
        // Target 0: fires never yield, however slow the writes.
        let off = Admission::new(
            Bounds {
                write_target_ms: 0,
                ..bounds()
            },
            0,
        );
        let _t = off.admit(1, 0, 0).unwrap();
        off.completed(60_000, 1);
        assert_eq!(off.take_write_pace(), WritePace::Fast);
    }

    #[test]
    fn a_reserve_of_writes_gets_in_whatever_the_backlog_and_the_limit() {
        let a = Admission::new(
            Bounds {
                reserve: 2,
                ..bounds()
            },
            0,
        );
        a.completed(501, 1);
        assert_eq!(a.limit(), 1, "a slow log");
        let backlog = 50;
        let t1 = a.admit(1, backlog, 0).expect("first of the reserve");
        let t2 = a
            .admit(1, backlog, 0)
            .expect("second, past the limit of one");
        let e = a.admit(1, backlog, 0).err().unwrap();
        assert_eq!(e.refusal.what, "client writes in flight");
        assert_eq!(a.recheck(0, backlog, 1), Ok(()), "one other in flight");
        drop(t2);
        let e = a.admit(1000, backlog, 0).err().unwrap();
        assert_eq!(e.refusal.what, "bytes of client writes in flight");
        assert!(a.precheck(backlog, 0).is_ok());
        drop(t1);
        let t = [a.admit(1, 0, 0), a.admit(1, 0, 0)];
        assert!(t.iter().all(Result::is_ok));
        let e = a.admit(1, backlog, 0).err().unwrap();
        assert_eq!(
            e.refusal.what, "client writes in flight",
            "the reserve is full"
        );
    }

    #[test]
    fn out_of_range_bounds_are_refused_naming_the_flag() {
        let d = Bounds::default();
        assert_eq!(d.validate(), Ok(()));
        for (bounds, flag) in [
            (
                Bounds {
                    max_commands: 0,
                    ..d
                },
                "admit-max-commands",
            ),
            (
                Bounds {
                    max_commands: 65_537,
                    ..d
                },
                "admit-max-commands",
            ),
            (Bounds { max_bytes: 0, ..d }, "admit-max-kb"),
            (
                Bounds {
                    max_bytes: 1500,
                    ..d
                },
                "admit-max-kb",
            ),
            (
                Bounds {
                    max_backlog: 0,
                    ..d
                },
                "admit-max-backlog",
            ),
            (
                Bounds {
                    max_backlog_ms: 0,
                    ..d
                },
                "admit-max-backlog-ms",
            ),
            (
                Bounds {
                    max_fire_lag_ms: 0,
                    ..d
                },
                "admit-max-fire-lag-ms",
            ),
            (
                Bounds {
                    write_target_ms: 60_001,
                    ..d
                },
                "admit-write-target-ms",
            ),
            (
                Bounds {
                    max_wait_ms: 60_001,
                    ..d
                },
                "admit-max-wait-ms",
            ),
            (
                Bounds {
                    max_write_age_ms: 0,
                    ..d
                },
                "admit-max-write-age-ms",
            ),
            (
                Bounds {
                    reserve: d.max_commands + 1,
                    ..d
                },
                "admit-reserve",
            ),
        ] {
            let e = bounds.validate().unwrap_err();
            assert!(e.starts_with(&format!("{flag}:")), "{bounds:?}: {e}");
        }
    }
}
