//! Read queries over the replicated state that need more than one key,
//! kept next to the key encoding they depend on. Pure: they read through a
//! [`StateView`], so the API serves them from sled and tests from memory.

use super::codec::decode;
use super::keys;
use super::types::{limits, Job, JobRevision, JobState, Labels, Run, RunId};
use super::view::StateView;

/// Runs of `job` strictly after `after` (or from the first one), in
/// (scheduled time, shard) order, at most `limit`. The cursor is a whole
/// run id, so a page may end in the middle of a sharded occurrence.
pub fn runs_after<V: StateView + ?Sized>(
    view: &V,
    job: &str,
    after: Option<&RunId>,
    limit: usize,
) -> Vec<Run> {
    let prefix = keys::runs_of(job);
    let start = match after {
        Some(id) => {
            let mut k = keys::run(id);
            k.push(0); // the smallest key after `id`'s own
            k
        }
        None => prefix.clone(),
    };
    view.range(&start, &keys::prefix_end(&prefix), limit)
        .iter()
        .filter_map(|(_, v)| Run::from_record(v).ok())
        .collect()
}

/// The revision records of job id `job`, oldest first, at most
/// `limits::JOB_REVISIONS_MAX` (the newest): those stored, over all the
/// id's generations, and the create a job implies until it first changes
/// (log format 5, `Job::created_by`).
pub fn job_history<V: StateView + ?Sized>(view: &V, job: &str) -> Vec<JobRevision> {
    let max = limits::JOB_REVISIONS_MAX;
    let prefix = keys::job_history_prefix(job);
    let mut rows: Vec<(Vec<u8>, JobRevision)> =
        (view.range(&prefix, &keys::prefix_end(&prefix), max + 1))
            .into_iter()
            .filter_map(|(k, v)| Some((k, decode(&v).ok()?)))
            .collect();
    let current = view
        .get(&keys::job(job))
        .and_then(|b| Job::from_record(&b).ok());
    if let Some((job, create)) = current.and_then(|j| j.implied_revision().map(|c| (j, c))) {
        let key = keys::job_history(&job.id, job.created_at_ms, create.revision);
        rows.retain(|(k, _)| *k != key);
        let at = rows.partition_point(|(k, _)| *k < key);
        rows.insert(at, (key, create));
    }
    let skip = rows.len().saturating_sub(max);
    rows.into_iter().skip(skip).map(|(_, r)| r).collect()
}

/// The cluster's active log format: what leaders write entries at.
pub fn log_format<V: StateView + ?Sized>(view: &V) -> u32 {
    view.get(keys::META_LOG_FORMAT)
        .and_then(|b| decode(&b).ok())
        .unwrap_or(super::command::LOG_FORMAT_INITIAL)
}

/// Whether a `Housekeep` at `now_ms` has work: a deleted job with runs
/// left, or a job whose oldest runs are due for its history limits. Two
/// reads of one key each, so the leader can ask often.
pub fn housekeeping_due<V: StateView + ?Sized>(view: &V, now_ms: i64) -> bool {
    let deleted = [keys::DELETED_JOB];
    let start = [keys::RETENTION_DUE];
    !view.range(&deleted, &[keys::DELETED_JOB + 1], 1).is_empty()
        || !view
            .range(&start, &keys::retention_due_upto(now_ms), 1)
            .is_empty()
}

/// What `ListJobs` keeps: every set condition must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub group: Option<String>,
    /// Every pair must be among the job's labels.
    pub selector: Labels,
    pub state: Option<JobState>,
    pub id_prefix: String,
}

impl JobFilter {
    pub fn matches(&self, job: &Job) -> bool {
        self.group.as_ref().is_none_or(|g| *g == job.group)
            && self.state.is_none_or(|st| st == job.state())
            && self
                .selector
                .iter()
                .all(|(k, v)| job.labels.get(k) == Some(v))
    }
}

/// One page of [`jobs_page`]: `next_after` is where the next page starts
/// (empty when the listing is complete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    pub next_after: String,
}

/// Jobs whose id is after `after` and that match `filter`, in id order:
/// at most `page` of them, looking at most at `scan_max` jobs (the API
/// passes `limits::LIST_SCAN_MAX`; read `SCAN_CHUNK` at a time), so a
/// selective filter over many jobs returns a short page with a token
/// rather than scanning them all.
pub fn jobs_page<V: StateView + ?Sized>(
    view: &V,
    filter: &JobFilter,
    after: &str,
    page: usize,
    scan_max: usize,
) -> JobPage {
    const SCAN_CHUNK: usize = 128;
    let prefix = keys::job(&filter.id_prefix);
    let end = keys::prefix_end(&prefix);
    let mut start = keys::job(after).max(prefix);
    if !after.is_empty() && start == keys::job(after) {
        start.push(0); // the smallest key after `after`'s own
    }
    let (mut out, mut scanned, mut last) = (Vec::new(), 0usize, String::new());
    while scanned < scan_max && out.len() < page {
        let want = SCAN_CHUNK.min(scan_max - scanned);
        let rows = view.range(&start, &end, want);
        for (k, v) in &rows {
            scanned += 1;
            start = k.clone();
            start.push(0);
            let Ok(job) = Job::from_record(v) else {
                continue;
            };
            last.clone_from(&job.id);
            if filter.matches(&job) {
                out.push(job);
                if out.len() == page {
                    break;
                }
            }
        }
        if rows.len() < want && out.len() < page {
            // The range ended: nothing after this page.
            return JobPage {
                jobs: out,
                next_after: String::new(),
            };
        }
    }
    JobPage {
        jobs: out,
        next_after: last,
    }
}
