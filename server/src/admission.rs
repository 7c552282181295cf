//! Admission control for client writes on the leader. A write is admitted
//! only while the work already accepted stays within [`Bounds`]: client
//! commands admitted and not yet answered (count and encoded bytes), and
//! log entries the leader has appended but not yet applied. Past a bound the
//! write is refused at once with a retry-after hint, before anything is
//! proposed, so a refusal changes nothing. An admitted command still queued
//! after `max_wait_ms` is refused the same way, unproposed, so an answer
//! never waits behind a queue that stopped moving. Fires, assignments,
//! finishes and expiries never come here: they are committed work already.
//!
//! The decisions ([`Bounds::check`], [`Bounds::check_wait`]) are pure
//! functions of the load and times passed in; [`Admission`] holds the
//! counters, and a [`Ticket`] gives its share back when dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Shortest and longest retry-after hint.
pub const RETRY_AFTER_MIN_MS: u64 = 50;
pub const RETRY_AFTER_MAX_MS: u64 = 2_000;
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
    /// Longest an admitted command waits in the queue before it is proposed.
    pub max_wait_ms: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_commands: 2_048,
            max_bytes: 16 << 20,
            max_backlog: 64,
            max_wait_ms: 500,
        }
    }
}

/// The work in flight when a write arrives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub commands: usize,
    pub bytes: usize,
    pub backlog: u64,
}

/// A refused write: which bound, how far past it, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("leader overloaded ({what} {have}, bound {max}); nothing was written; retry after {retry_after_ms} ms")]
pub struct Overloaded {
    pub what: &'static str,
    pub have: u64,
    pub max: u64,
    pub retry_after_ms: u64,
}

impl Bounds {
    /// Checks each bound's range, naming its flag.
    pub fn validate(&self) -> Result<(), String> {
        let in_range = |ok: bool, flag: &str, range: &str, got: u64| match ok {
            true => Ok(()),
            false => Err(format!("{flag}: must be between {range}, got {got}")),
        };
        let commands = self.max_commands;
        in_range(
            (1..=COMMANDS_LIMIT).contains(&commands),
            "admit-max-commands",
            "1 and 65536",
            commands as u64,
        )?;
        let kb = (self.max_bytes >> 10) as u64;
        in_range(
            (1..=1 << 20).contains(&kb) && self.max_bytes.is_multiple_of(1024),
            "admit-max-kb",
            "1 and 1048576",
            kb,
        )?;
        in_range(
            (1..=1_000_000).contains(&self.max_backlog),
            "admit-max-backlog",
            "1 and 1000000",
            self.max_backlog,
        )?;
        in_range(
            (1..=60_000).contains(&self.max_wait_ms),
            "admit-max-wait-ms",
            "1 and 60000",
            self.max_wait_ms,
        )
    }

    /// Whether one more command of `bytes` may join `load`. A command alone
    /// is admitted whatever its size (its size is bounded by the message cap).
    pub fn check(&self, load: Load, bytes: usize) -> Result<(), Overloaded> {
        let commands = load.commands as u64 + 1;
        if commands > self.max_commands as u64 {
            return Err(self.refusal("client writes in flight", commands, self.max_commands));
        }
        let total = load.bytes.saturating_add(bytes) as u64;
        if load.commands > 0 && total > self.max_bytes as u64 {
            return Err(self.refusal("bytes of client writes in flight", total, self.max_bytes));
        }
        if load.backlog > self.max_backlog {
            let max = self.max_backlog as usize;
            return Err(self.refusal("log entries not yet applied", load.backlog, max));
        }
        Ok(())
    }

    /// Whether a command queued at `queued_ms` may still be proposed at
    /// `now_ms` (both on the monotonic clock).
    pub fn check_wait(&self, queued_ms: i64, now_ms: i64) -> Result<(), Overloaded> {
        let waited = now_ms.saturating_sub(queued_ms).max(0) as u64;
        if waited > self.max_wait_ms {
            let max = self.max_wait_ms as usize;
            return Err(self.refusal("ms queued before proposing", waited, max));
        }
        Ok(())
    }

    /// Half the queue-wait bound (a full queue drains within about that),
    /// scaled by how far past its bound the load is.
    fn refusal(&self, what: &'static str, have: u64, max: usize) -> Overloaded {
        let max = max.max(1) as u64;
        let scaled = (self.max_wait_ms / 2).saturating_mul(have) / max;
        Overloaded {
            what,
            have,
            max,
            retry_after_ms: scaled.clamp(RETRY_AFTER_MIN_MS, RETRY_AFTER_MAX_MS),
        }
    }
}

/// The leader's admission counters.
pub struct Admission {
    pub bounds: Bounds,
    load: Mutex<(usize, usize)>,
    refused: AtomicU64,
}

/// One admitted command's share of the load, given back when dropped
/// (when its waiter has been answered, or the command was dropped).
pub struct Ticket {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Admission {
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Arc::new(Admission {
            bounds,
            load: Mutex::new((0, 0)),
            refused: AtomicU64::new(0),
        })
    }

    /// Admits a command of `bytes` while `backlog` entries wait to be applied.
    pub fn admit(self: &Arc<Self>, bytes: usize, backlog: u64) -> Result<Ticket, Overloaded> {
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let now = Load {
            commands: load.0,
            bytes: load.1,
            backlog,
        };
        if let Err(e) = self.bounds.check(now, bytes) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        *load = (load.0 + 1, load.1.saturating_add(bytes));
        Ok(Ticket {
            admission: self.clone(),
            bytes,
        })
    }

    /// Refuses an admitted command that waited too long (its ticket goes with it).
    pub fn expire(&self, queued_ms: i64, now_ms: i64) -> Result<(), Overloaded> {
        let res = self.bounds.check_wait(queued_ms, now_ms);
        if res.is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    /// Client commands and their bytes in flight now.
    pub fn load(&self) -> (usize, usize) {
        *self.load.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Client writes refused since start.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut load = (self.admission.load.lock()).unwrap_or_else(|e| e.into_inner());
        *load = (load.0.saturating_sub(1), load.1.saturating_sub(self.bytes));
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
            max_wait_ms: 400,
        }
    }

    fn load(commands: usize, bytes: usize, backlog: u64) -> Load {
        Load {
            commands,
            bytes,
            backlog,
        }
    }

    #[test]
    fn each_bound_refuses_past_it_and_names_itself() {
        let b = bounds();
        assert_eq!(b.check(load(2, 900, 10), 100), Ok(()));
        let e = b.check(load(3, 0, 0), 1).unwrap_err();
        assert_eq!((e.what, e.have, e.max), ("client writes in flight", 4, 3));
        let e = b.check(load(1, 900, 0), 101).unwrap_err();
        assert_eq!(e.what, "bytes of client writes in flight");
        assert_eq!((e.have, e.max), (1001, 1000));
        let e = b.check(load(0, 0, 11), 1).unwrap_err();
        assert_eq!(e.what, "log entries not yet applied");
        assert!(e.to_string().contains("retry after"), "{e}");
        assert!(e.to_string().contains("nothing was written"), "{e}");
    }

    #[test]
    fn a_command_alone_is_admitted_whatever_its_size() {
        assert_eq!(bounds().check(load(0, 0, 0), 1 << 30), Ok(()));
        assert!(bounds().check(load(1, 1, 0), 1 << 30).is_err());
    }

    #[test]
    fn the_hint_grows_with_the_overload_within_its_range() {
        let b = bounds();
        let hint = |backlog| b.check(load(0, 0, backlog), 1).unwrap_err().retry_after_ms;
        // 200 ms (half the wait bound) x 11/10, then x 50/10, then capped.
        assert_eq!(hint(11), 220);
        assert_eq!(hint(50), 1000);
        assert_eq!(hint(10_000), RETRY_AFTER_MAX_MS);
        let tiny = Bounds {
            max_wait_ms: 10,
            ..b
        };
        let e = tiny.check(load(0, 0, 11), 1).unwrap_err();
        assert_eq!(e.retry_after_ms, RETRY_AFTER_MIN_MS);
    }

    #[test]
    fn a_command_queued_too_long_is_refused() {
        let b = bounds();
        assert_eq!(b.check_wait(1_000, 1_400), Ok(()));
        let e = b.check_wait(1_000, 1_401).unwrap_err();
        assert_eq!((e.have, e.max), (401, 400));
        // A clock read out of order never refuses.
        assert_eq!(b.check_wait(1_000, 900), Ok(()));
    }

    #[test]
    fn tickets_hold_their_share_until_dropped() {
        let a = Admission::new(bounds());
        let t1 = a.admit(300, 0).unwrap();
        let t2 = a.admit(300, 0).unwrap();
        let t3 = a.admit(300, 0).unwrap();
        assert_eq!(a.load(), (3, 900));
        assert!(a.admit(1, 0).is_err());
        drop(t2);
        assert_eq!(a.load(), (2, 600));
        assert!(a.admit(401, 0).is_err(), "1001 bytes in flight");
        let t4 = a.admit(400, 0).unwrap();
        assert_eq!(a.refused_total(), 2);
        drop((t1, t3, t4));
        assert_eq!(a.load(), (0, 0));
        assert!(a.expire(0, 401).is_err());
        assert_eq!(a.refused_total(), 3);
    }

    #[test]
    fn out_of_range_bounds_are_refused_naming_the_flag() {
        assert_eq!(Bounds::default().validate(), Ok(()));
        let zero = Bounds {
            max_commands: 0,
            ..Bounds::default()
        };
        assert!(zero.validate().unwrap_err().contains("admit-max-commands"));
        let wait = Bounds {
            max_wait_ms: 0,
            ..Bounds::default()
        };
        assert!(wait.validate().unwrap_err().contains("admit-max-wait-ms"));
        let kb = Bounds {
            max_bytes: 0,
            ..Bounds::default()
        };
        assert!(kb.validate().unwrap_err().contains("admit-max-kb"));
        let backlog = Bounds {
            max_backlog: 0,
            ..Bounds::default()
        };
        assert!(backlog
            .validate()
            .unwrap_err()
            .contains("admit-max-backlog"));
    }
}
