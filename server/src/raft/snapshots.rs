//! When this node builds a snapshot. openraft's own policy counts entries
//! only, so with a large state a node rebuilt it back to back: at ten
//! million timers a build reads ~13 M pairs in 40-50 s, and under creates
//! the next `--snapshot-logs` entries arrived before it ended
//! (BENCHMARKS.md, twenty-fifth and twenty-sixth passes). openraft runs
//! with `SnapshotPolicy::Never` and [`build_when_due`] asks it for each
//! build instead.
//!
//! A build is due once `--snapshot-logs` entries were applied past the
//! current snapshot, and no sooner than [`SPACING`] times the last build's
//! duration after it ended: a node spends at most about a fifth of its
//! time building, whatever its state's size. The log behind the snapshot
//! grows meanwhile (restart does not read it: apply replays only what
//! follows the flushed state), but never past [`LOGS_CAP`] times
//! `--snapshot-logs` entries: then a build is due whatever the spacing.
//! A state small enough to build in milliseconds is snapshotted as before.

use std::time::Duration;

use super::Raft;
use crate::store::StateMachine;

/// A build waits this many times the last build's duration after it ended.
pub const SPACING: u32 = 4;
/// Past this many times `--snapshot-logs` entries a build is due at once.
pub const LOGS_CAP: u64 = 10;

/// What to do about a snapshot now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Too few entries past the current snapshot.
    No,
    /// Build one.
    Now,
    /// Enough entries, but the last build ended too recently: ask again after this long.
    After(Duration),
}

/// Whether a build is due with `entries` applied past the current
/// snapshot, one due every `every` entries, and the last build of this
/// node (`since` it ended, how long it `took`), if any.
pub fn due(entries: u64, every: u64, last: Option<(Duration, Duration)>) -> Due {
    if entries < every {
        return Due::No;
    }
    if entries >= every.saturating_mul(LOGS_CAP) {
        return Due::Now;
    }
    match last {
        None => Due::Now,
        Some((since, took)) => {
            let gap = took.saturating_mul(SPACING);
            match gap.checked_sub(since) {
                Some(left) if !left.is_zero() => Due::After(left),
                _ => Due::Now,
            }
        }
    }
}

/// Entries applied past the snapshot: both are log indexes, `None` before the first.
fn entries_past(applied: Option<u64>, snapshot: Option<u64>) -> u64 {
    let next = |i: Option<u64>| i.map_or(0, |i| i.saturating_add(1));
    next(applied).saturating_sub(next(snapshot))
}

/// Asks openraft for a snapshot whenever [`due`] says so, re-reading
/// after every change of Raft's metrics (each applied batch) and when a
/// spacing ends. It asks once per snapshot it has seen: a request that
/// meets a build under way (a backup's) is dropped by openraft, and that
/// build's end changes the snapshot and so allows the next request.
/// Returns when Raft stops.
pub async fn build_when_due(raft: Raft, sm: StateMachine, every: u64) {
    let mut metrics = raft.metrics();
    let mut asked_at: Option<Option<u64>> = None;
    loop {
        let (applied, snapshot) = {
            let m = metrics.borrow_and_update();
            (m.last_applied.map(|l| l.index), m.snapshot.map(|l| l.index))
        };
        let last = sm.last_build().map(|b| (b.ended.elapsed(), b.took));
        let wait = match due(entries_past(applied, snapshot), every, last) {
            Due::No => None,
            Due::After(left) => Some(left),
            Due::Now => {
                if asked_at != Some(snapshot) {
                    asked_at = Some(snapshot);
                    if raft.trigger().snapshot().await.is_err() {
                        return;
                    }
                }
                None
            }
        };
        let spacing_ends = async {
            match wait {
                Some(left) => tokio::time::sleep(left).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = spacing_ends => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_build_is_due_after_the_entries_and_once_its_spacing_has_passed() {
        // Too few entries, whatever the last build.
        assert_eq!(due(0, 100, None), Due::No);
        assert_eq!(due(99, 100, None), Due::No);
        assert_eq!(due(99, 100, Some((S * 1000, S))), Due::No);
        // Enough entries and no build of this node yet (or a node that restarted).
        assert_eq!(due(100, 100, None), Due::Now);
        // A 10 s build ended 30 s ago: 10 s more to wait; at 40 s it is due.
        assert_eq!(due(100, 100, Some((S * 30, S * 10))), Due::After(S * 10));
        assert_eq!(due(5_000, 100, Some((S * 40, S * 10))), Due::Now);
        assert_eq!(due(100, 100, Some((S * 41, S * 10))), Due::Now);
        // A build of a small state spaces nothing.
        assert_eq!(
            due(100, 100, Some((Duration::ZERO, Duration::ZERO))),
            Due::Now
        );
    }

    #[test]
    fn past_the_cap_a_build_is_due_whatever_the_spacing() {
        let just_built = Some((Duration::ZERO, S * 60));
        assert_eq!(
            due(100 * LOGS_CAP - 1, 100, just_built),
            Due::After(S * 60 * SPACING)
        );
        assert_eq!(due(100 * LOGS_CAP, 100, just_built), Due::Now);
        // A cap that overflows saturates instead of wrapping to a small one.
        assert_eq!(
            due(u64::MAX - 1, u64::MAX / 2, just_built),
            Due::After(S * 240)
        );
        assert_eq!(due(u64::MAX, u64::MAX, just_built), Due::Now);
    }

    #[test]
    fn entries_are_counted_from_the_snapshot_to_the_applied_index() {
        assert_eq!(entries_past(None, None), 0);
        assert_eq!(entries_past(Some(0), None), 1);
        assert_eq!(entries_past(Some(41), Some(1)), 40);
        assert_eq!(entries_past(Some(5), Some(5)), 0);
        // An installed snapshot ahead of what is applied yet counts as none.
        assert_eq!(entries_past(Some(3), Some(9)), 0);
        assert_eq!(entries_past(Some(u64::MAX), None), u64::MAX);
    }
}
