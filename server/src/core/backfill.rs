//! Backfill (Temporal): the occurrences of a past range `[from, to)` of a
//! job's schedule, created as runs in scheduled order, a bounded step at a
//! time.
//!
//! A backfill is a durable cursor kept in the job record (`Job::backfill`)
//! and advanced by a wheel entry of its own (`EntryKind::Backfill`): the
//! leader fires that entry like any timer, and apply creates up to
//! `BACKFILL_STEP_OCCURRENCES` occurrences from the cursor, moves it, and
//! schedules the next step `BACKFILL_STEP_MS` later. A new leader finds the
//! entry in the durable wheel and goes on from the cursor; the cursor and
//! the runs of a step commit together, so nothing is created twice or left
//! out. An occurrence that already has a run (the schedule fired it, or an
//! earlier backfill did) is counted and not created again: runs are keyed
//! by `(job, scheduled_at)`.
//!
//! The range is expanded in apply from the schedule the backfill was
//! started with (kept in the record), so every replica walks the same
//! occurrences. Pure: what this module returns depends only on its
//! arguments.

use serde::{Deserialize, Serialize};

use super::command::CommandError;
use super::schedule::Schedule;
use super::types::limits;

/// How a backfilled occurrence meets the job's active runs (the job's
/// `max_concurrent`, else one for every overlap policy but `allow`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackfillOverlap {
    /// The backfill waits until the job has room, then goes on in order.
    #[default]
    BufferAll,
    /// An occurrence that finds the job full is recorded skipped.
    Skip,
    /// Every occurrence starts, whatever runs; only the step size limits them.
    Allow,
}

impl BackfillOverlap {
    pub const ALL: [BackfillOverlap; 3] = [
        BackfillOverlap::BufferAll,
        BackfillOverlap::Skip,
        BackfillOverlap::Allow,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BackfillOverlap::BufferAll => "buffer-all",
            BackfillOverlap::Skip => "skip",
            BackfillOverlap::Allow => "allow",
        }
    }

    pub fn parse(s: &str) -> Option<BackfillOverlap> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

/// A job's backfill: the range, its cursor and what it did so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backfill {
    pub from_ms: i64,
    pub to_ms: i64,
    pub overlap: BackfillOverlap,
    /// The schedule the range is expanded from (the job's at the start).
    pub schedule: Schedule,
    /// The next occurrence to create; `None` once the range is done.
    pub next_ms: Option<i64>,
    /// Occurrences in the range.
    pub total: u32,
    /// Occurrences whose runs this backfill created.
    pub started: u32,
    /// Occurrences that already had a run, left as they were.
    pub existing: u32,
    /// Occurrences recorded skipped (overlap `skip`, or the job at its
    /// most active runs).
    pub skipped: u32,
    /// Who started it (the token's name, "" without tokens) and when.
    pub by: String,
    pub started_at_ms: i64,
    /// When it finished or was cancelled; `None` while in progress.
    pub ended_at_ms: Option<i64>,
    pub cancelled: bool,
    /// Due time of its one step entry in the wheel, while in progress.
    pub step_at_ms: Option<i64>,
    /// Waiting for room (`buffer-all` with the job at its most active
    /// runs): the next step is a slow poll, and a run of the job ending
    /// brings it forward to then.
    pub waiting: bool,
}

impl Backfill {
    pub fn in_progress(&self) -> bool {
        self.ended_at_ms.is_none()
    }

    /// running | done | cancelled
    pub fn state(&self) -> &'static str {
        match (self.ended_at_ms, self.cancelled) {
            (None, _) => "running",
            (Some(_), false) => "done",
            (Some(_), true) => "cancelled",
        }
    }

    /// Occurrences the cursor has passed.
    pub fn done(&self) -> u32 {
        self.started + self.existing + self.skipped
    }
}

/// Checks a backfill of `[from_ms, to_ms)` at state time `now_ms` and
/// expands it: the first occurrence and how many the range holds. Refused:
/// an empty or reversed range, a range ending after now, one with no
/// occurrence, and one with more than `BACKFILL_OCCURRENCES_MAX` (walked at
/// most that far plus one).
pub fn plan(
    s: &Schedule,
    from_ms: i64,
    to_ms: i64,
    now_ms: i64,
) -> Result<(i64, u32), CommandError> {
    let invalid = |m: String| Err(CommandError::Invalid(m));
    if from_ms >= to_ms {
        return invalid(format!("from: must be before to ({from_ms} >= {to_ms})"));
    }
    if to_ms > now_ms {
        return invalid(format!(
            "to: a backfill covers the past; {to_ms} is after the cluster time {now_ms}"
        ));
    }
    if *s == Schedule::Upstream {
        return invalid(
            "id: the job has no schedule of its own (it runs on upstream cycles)".into(),
        );
    }
    let max = limits::BACKFILL_OCCURRENCES_MAX;
    let Some(first) = next_in(s, from_ms.saturating_sub(1), to_ms)? else {
        return invalid(format!(
            "from, to: the job's schedule has no occurrence in [{from_ms}, {to_ms})"
        ));
    };
    let (mut at, mut total) = (first, 1u32);
    while let Some(next) = next_in(s, at, to_ms)? {
        if total == max {
            return invalid(format!(
                "from, to: the range holds more than {max} occurrences; backfill at most {max} at a time"
            ));
        }
        (at, total) = (next, total + 1);
    }
    Ok((first, total))
}

/// The occurrence after `after_ms`, if it is before `to_ms`.
pub fn next_in(s: &Schedule, after_ms: i64, to_ms: i64) -> Result<Option<i64>, CommandError> {
    let next = s
        .next_after(after_ms)
        .map_err(|e| CommandError::Invalid(e.to_string()))?;
    Ok(next.filter(|n| *n < to_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(ms: u64) -> Schedule {
        Schedule::Every {
            every_ms: ms,
            anchor_ms: 0,
        }
    }

    #[test]
    fn plan_counts_the_occurrences_of_a_half_open_range() {
        assert_eq!(plan(&every(1000), 1000, 5000, 10_000), Ok((1000, 4)));
        assert_eq!(plan(&every(1000), 1001, 5001, 10_000), Ok((2000, 4)));
        let cron = Schedule::Cron {
            expr: "0 * * * *".into(),
            tz: "UTC".into(),
        };
        // 00:00 to 03:00 holds 00:00, 01:00 and 02:00.
        assert_eq!(plan(&cron, 0, 3 * 3_600_000, 10 * 3_600_000), Ok((0, 3)));
    }

    #[test]
    fn plan_refuses_naming_the_field_and_the_rule() {
        let err = |r: Result<(i64, u32), CommandError>| r.unwrap_err().to_string();
        assert_eq!(
            err(plan(&every(1000), 5000, 5000, 10_000)),
            "from: must be before to (5000 >= 5000)"
        );
        assert_eq!(
            err(plan(&every(1000), 0, 10_001, 10_000)),
            "to: a backfill covers the past; 10001 is after the cluster time 10000"
        );
        assert_eq!(
            err(plan(&every(10_000), 1, 9_999, 20_000)),
            "from, to: the job's schedule has no occurrence in [1, 9999)"
        );
        assert!(err(plan(&Schedule::Upstream, 0, 1, 2)).starts_with("id: the job has no schedule"));
        let max = limits::BACKFILL_OCCURRENCES_MAX as i64;
        assert_eq!(plan(&every(1), 1, max + 1, max + 1), Ok((1, max as u32)));
        assert_eq!(
            err(plan(&every(1), 1, max + 2, max + 2)),
            "from, to: the range holds more than 1000 occurrences; backfill at most 1000 at a time"
        );
    }

    #[test]
    fn overlap_names_round_trip() {
        for o in BackfillOverlap::ALL {
            assert_eq!(BackfillOverlap::parse(o.as_str()), Some(o));
        }
        assert_eq!(BackfillOverlap::parse("replace"), None);
    }
}
