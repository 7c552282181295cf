//! Runs across jobs: one page of the run records that match a filter (job,
//! group, states, a time bound), read through a [`StateView`]. The gRPC
//! `Runs.SearchRuns` and the console both call [`search`].
//!
//! Order is the run key order: by job (shorter ids first, then bytewise),
//! then scheduled time, then shard. A page holds at most `page` matches and
//! looks at most at `scan_max` records, so a selective filter over many runs
//! returns a short page (even an empty one) with a cursor to go on from.

use super::keys;
use super::types::{Run, RunId, RunState};
use super::view::StateView;

/// Largest page [`search`] callers should ask for.
pub const PAGE_MAX: usize = 500;
/// Run records one page may look at (matching or not).
pub const SCAN_MAX: usize = 10_000;

/// Which runs match. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only the runs of this job.
    pub job: Option<String>,
    /// Only runs of jobs in this worker group.
    pub group: Option<String>,
    /// Only runs in one of these states (empty: any).
    pub states: Vec<RunState>,
    /// Only runs that finished at or after this time (unix ms) or, while
    /// still active, fired at or after it.
    pub since_ms: Option<i64>,
}

impl RunFilter {
    pub fn matches(&self, r: &Run) -> bool {
        let at = if r.state.is_terminal() && r.finished_at_ms != 0 {
            r.finished_at_ms
        } else {
            r.fired_at_ms
        };
        self.group.as_ref().is_none_or(|g| &r.group == g)
            && (self.states.is_empty() || self.states.contains(&r.state))
            && self.since_ms.is_none_or(|s| at >= s)
    }
}

/// The core states an API state name stands for: "pending" also covers a
/// run waiting for its retry backoff (the API shows it as pending).
/// Accepts `timed_out` and `timed-out`.
pub fn states_named(name: &str) -> Option<&'static [RunState]> {
    use RunState::*;
    Some(match name {
        "pending" => &[Pending, RetryWait],
        "running" => &[Running],
        "succeeded" => &[Succeeded],
        "failed" => &[Failed],
        "timed_out" | "timed-out" => &[TimedOut],
        "skipped" => &[Skipped],
        "cancelled" => &[Cancelled],
        _ => return None,
    })
}

/// One page of [`search`]. `next_after` is the last run looked at: pass it
/// as `after` for the next page; `None` when nothing is left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunPage {
    pub runs: Vec<Run>,
    pub next_after: Option<RunId>,
}

/// Runs after `after` (exclusive; `None` = from the start) that match
/// `filter`: at most `page` of them, looking at most at `scan_max` records.
pub fn search<V: StateView + ?Sized>(
    view: &V,
    filter: &RunFilter,
    after: Option<&RunId>,
    page: usize,
    scan_max: usize,
) -> RunPage {
    const SCAN_CHUNK: usize = 256;
    let prefix = match &filter.job {
        Some(job) => keys::runs_of(job),
        None => vec![keys::RUN],
    };
    let end = keys::prefix_end(&prefix);
    let mut start = match after {
        Some(id) => {
            let mut k = keys::run(id);
            k.push(0); // the smallest key after `id`'s own
            k.max(prefix)
        }
        None => prefix,
    };
    let (mut runs, mut scanned, mut last) = (Vec::new(), 0usize, None);
    while scanned < scan_max && runs.len() < page {
        let want = SCAN_CHUNK.min(scan_max - scanned);
        let rows = view.range(&start, &end, want);
        for (k, v) in &rows {
            scanned += 1;
            start.clone_from(k);
            start.push(0);
            let Ok(run) = Run::from_record(v) else {
                continue;
            };
            last = Some(run.id.clone());
            if filter.matches(&run) {
                runs.push(run);
                if runs.len() == page {
                    break;
                }
            }
        }
        if rows.len() < want && runs.len() < page {
            // The range ended: nothing after this page.
            return RunPage {
                runs,
                next_after: None,
            };
        }
    }
    RunPage {
        runs,
        next_after: last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::codec::encode;
    use crate::core::MemView;

    fn run(job: &str, at: i64, group: &str, state: RunState, finished: i64) -> Run {
        Run {
            id: RunId::new(job, at),
            group: group.into(),
            priority: 5,
            fired_at_ms: at,
            state,
            attempt: 1,
            worker: String::new(),
            received_at_ms: 0,
            finished_at_ms: finished,
            result: Vec::new(),
            error: String::new(),
            note: String::new(),
            retry_at_ms: None,
            shard_count: 1,
            offset_ms: 0,
        }
    }

    fn view(runs: &[Run]) -> MemView {
        let mut v = MemView::default();
        for r in runs {
            v.map.insert(keys::run(&r.id), encode(r));
        }
        // A job record sorts before the run space and is never returned.
        v.map.insert(keys::job("a"), b"not a run".to_vec());
        v
    }

    fn ids(p: &RunPage) -> Vec<String> {
        p.runs.iter().map(|r| r.id.to_string()).collect()
    }

    fn sample() -> MemView {
        use RunState::*;
        view(&[
            run("a", 10, "g1", Failed, 15),
            run("a", 20, "g1", Succeeded, 25),
            run("b", 10, "g2", Failed, 12),
            run("b", 30, "g2", RetryWait, 0),
            run("cc", 5, "g1", TimedOut, 40),
            run("cc", 50, "g1", Running, 0),
        ])
    }

    #[test]
    fn filters_by_group_state_since_and_job() {
        let v = sample();
        let all = search(&v, &RunFilter::default(), None, 100, SCAN_MAX);
        assert_eq!(
            ids(&all),
            ["a@10", "a@20", "b@10", "b@30", "cc@5", "cc@50"],
            "job (shorter ids first), then scheduled time"
        );
        assert_eq!(all.next_after, None);
        let failed_g1 = RunFilter {
            group: Some("g1".into()),
            states: vec![RunState::Failed, RunState::TimedOut],
            ..Default::default()
        };
        assert_eq!(
            ids(&search(&v, &failed_g1, None, 100, SCAN_MAX)),
            ["a@10", "cc@5"]
        );
        // Finished at or after 25, or active and fired at or after it.
        let since = RunFilter {
            since_ms: Some(25),
            ..Default::default()
        };
        assert_eq!(
            ids(&search(&v, &since, None, 100, SCAN_MAX)),
            ["a@20", "b@30", "cc@5", "cc@50"]
        );
        let pending = RunFilter {
            job: Some("b".into()),
            states: states_named("pending").unwrap().to_vec(),
            ..Default::default()
        };
        assert_eq!(ids(&search(&v, &pending, None, 100, SCAN_MAX)), ["b@30"]);
        assert_eq!(states_named("timed-out"), Some(&[RunState::TimedOut][..]));
        assert_eq!(states_named("done"), None);
    }

    #[test]
    fn pages_by_count_and_by_scan_bound_and_resume_from_the_cursor() {
        let v = sample();
        let failed = RunFilter {
            states: vec![RunState::Failed],
            ..Default::default()
        };
        let p1 = search(&v, &failed, None, 1, SCAN_MAX);
        assert_eq!(ids(&p1), ["a@10"]);
        assert_eq!(p1.next_after, Some(RunId::new("a", 10)));
        let p2 = search(&v, &failed, p1.next_after.as_ref(), 1, SCAN_MAX);
        assert_eq!(ids(&p2), ["b@10"]);
        let p3 = search(&v, &failed, p2.next_after.as_ref(), 1, SCAN_MAX);
        assert_eq!((ids(&p3).len(), p3.next_after), (0, None));
        // Scanning 2 records finds one match and says where to go on.
        let short = search(&v, &failed, None, 10, 2);
        assert_eq!(
            (ids(&short), short.next_after.clone()),
            (vec!["a@10".to_string()], Some(RunId::new("a", 20)))
        );
        let rest = search(&v, &failed, short.next_after.as_ref(), 10, SCAN_MAX);
        assert_eq!(
            (ids(&rest), rest.next_after),
            (vec!["b@10".to_string()], None)
        );
        // A cursor of another job does not leak into a job-filtered search.
        let only_cc = RunFilter {
            job: Some("cc".into()),
            ..Default::default()
        };
        let p = search(&v, &only_cc, Some(&RunId::new("a", 10)), 10, SCAN_MAX);
        assert_eq!(ids(&p), ["cc@5", "cc@50"]);
    }
}
