//! One log line per step of a run's life — fired (or retry ready),
//! dispatched, finished — each inside a `run` span carrying the run id,
//! attempt, job, group and worker, so `grep RUN_ID` over the nodes' logs
//! (text or `--log-format json`) tells a run's story. Every line is written
//! by the leader, from committed effects or its own hand-off, never from
//! apply: followers apply the same entries and stay silent. After a leader
//! change the rest of the story is in the new leader's log.

use tracing::{info, info_span, Span};

use crate::core::{Finished, ReadyRun, RunId};

fn span(run: &RunId, attempt: u32, group: &str, worker: &str) -> Span {
    info_span!("run", run = %run, attempt, job = %run.job, group, worker)
}

/// An attempt became ready: the fire itself (attempt 1, with its lateness)
/// or a retry after backoff.
pub fn ready(r: &ReadyRun, late_ms: i64) {
    let _s = span(&r.run, r.attempt, &r.group, "").entered();
    if r.attempt == 1 {
        info!(late_ms, "run fired");
    } else {
        info!("run retry ready");
    }
}

/// The leader handed the attempt to `worker` after it waited `waited_ms` in the queue.
pub fn dispatched(run: &RunId, attempt: u32, group: &str, worker: &str, waited_ms: u128) {
    let _s = span(run, attempt, group, worker).entered();
    info!(waited_ms = waited_ms as u64, "run dispatched");
}

/// The run reached its terminal state.
pub fn finished(f: &Finished) {
    let _s = span(&f.run, f.attempt, &f.group, &f.worker).entered();
    info!(outcome = f.outcome.as_str(), "run finished");
}
