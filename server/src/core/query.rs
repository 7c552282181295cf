//! Read queries over the replicated state that need more than one key,
//! kept next to the key encoding they depend on. Pure: they read through a
//! [`StateView`], so the API serves them from sled and tests from memory.

use super::codec::decode;
use super::keys;
use super::types::{Run, RunId};
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
        .filter_map(|(_, v)| decode(v).ok())
        .collect()
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
