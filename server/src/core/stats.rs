//! Per-job statistics computed from the job's kept run history: counts by
//! state, the lateness of the latest fires, and the last run. Pure over a
//! [`StateView`] (the API serves it from sled, tests from memory).
//!
//! The counts cover the run records the job keeps (its `keep_runs`, at
//! most `limits::KEEP_RUNS_MAX`, and `keep_for`), not every run ever: a
//! replicated counter would change what apply writes for entries an older
//! binary in a mixed-version cluster applies without it, so replicas would
//! differ. Reading the history costs one pass over the kept records, in
//! pages of [`PAGE_RUNS`].

use std::collections::VecDeque;

use super::query::runs_after;
use super::types::{Run, RunState, WheelKey};
use super::view::StateView;

/// Fired runs (the latest, by scheduled time) whose lateness gives the percentiles.
pub const LATENESS_RUNS: usize = 100;
/// Run records read per page.
pub const PAGE_RUNS: usize = 1000;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobStats {
    /// Run records counted (the kept history).
    pub runs: u64,
    /// Runs that were started (every record but the skipped ones).
    pub fired: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub timed_out: u64,
    pub cancelled: u64,
    pub skipped: u64,
    /// Pending, running or waiting to retry.
    pub active: u64,
    /// Fired runs the lateness percentiles cover (at most [`LATENESS_RUNS`]).
    pub lateness_runs: u32,
    /// Scheduled time to fire, nearest-rank percentiles, in milliseconds.
    pub lateness_ms_p50: i64,
    pub lateness_ms_p99: i64,
    /// Scheduled time of the oldest record counted (the history's start).
    pub oldest_scheduled_at_ms: Option<i64>,
    /// The run with the latest scheduled time (highest shard of it).
    pub last_run: Option<Run>,
}

pub fn job_stats<V: StateView + ?Sized>(view: &V, job: &str) -> JobStats {
    let mut st = JobStats::default();
    let mut late_ms = VecDeque::with_capacity(LATENESS_RUNS);
    let mut after = None;
    loop {
        let page = runs_after(view, job, after.as_ref(), PAGE_RUNS);
        for run in &page {
            st.count(run);
            if run.state != RunState::Skipped {
                if late_ms.len() == LATENESS_RUNS {
                    late_ms.pop_front();
                }
                let due = WheelKey::jittered(&run.id.job, run.id.scheduled_at_ms, run.offset_ms);
                let late = run.fired_at_ms.saturating_sub(due.fire_at_ms);
                late_ms.push_back(late.max(0));
            }
        }
        let full = page.len() == PAGE_RUNS;
        if let Some(last) = page.into_iter().last() {
            after = Some(last.id.clone());
            // The result (up to 512 KiB) is not part of the statistics.
            st.last_run = Some(Run {
                result: Vec::new(),
                ..last
            });
        }
        if !full {
            break;
        }
    }
    let mut sorted: Vec<i64> = late_ms.into_iter().collect();
    sorted.sort_unstable();
    st.lateness_runs = sorted.len() as u32;
    st.lateness_ms_p50 = nearest_rank(&sorted, 50);
    st.lateness_ms_p99 = nearest_rank(&sorted, 99);
    st
}

impl JobStats {
    fn count(&mut self, run: &Run) {
        self.runs += 1;
        self.oldest_scheduled_at_ms
            .get_or_insert(run.id.scheduled_at_ms);
        let n = match run.state {
            RunState::Succeeded => &mut self.succeeded,
            RunState::Failed => &mut self.failed,
            RunState::TimedOut => &mut self.timed_out,
            RunState::Cancelled => &mut self.cancelled,
            RunState::Skipped => &mut self.skipped,
            RunState::Pending | RunState::Running | RunState::RetryWait => &mut self.active,
        };
        *n += 1;
        if run.state != RunState::Skipped {
            self.fired += 1;
        }
    }
}

/// The `pct`-th percentile of `sorted` by nearest rank (0 when empty).
fn nearest_rank(sorted: &[i64], pct: usize) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * pct).div_ceil(100).max(1);
    sorted[rank - 1]
}
