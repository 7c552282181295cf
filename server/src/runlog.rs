//! One log line per step of a run's life — fired (or retry ready),
//! dispatched, finished — each inside a span of its own (`run.fire`,
//! `run.retry`, `run.dispatch`, `run.finish`) carrying the run id,
//! attempt, job, group and worker, so `grep RUN_ID` over the nodes' logs
//! (text or `--log-format json`) tells a run's story, and so does a search
//! for the `run` attribute among the spans exported over OTLP (`otel.rs`).
//! Every line is written by the leader, from committed effects or its own
//! hand-off, never from apply: followers apply the same entries and stay
//! silent. After a leader change the rest of the story is in the new
//! leader's log.

use tracing::{info, info_span};

use crate::core::{Finished, ReadyRun, RunId};

/// A step's span: `tracing` needs each span's name as a literal.
macro_rules! step {
    ($name:literal, $run:expr, $attempt:expr, $group:expr, $worker:expr) => {
        info_span!($name, run = %$run, attempt = $attempt, job = %$run.job, group = $group, worker = $worker)
    };
}

/// An attempt became ready: the fire itself (attempt 1, with its lateness)
/// or a retry after backoff.
pub fn ready(r: &ReadyRun, late_ms: i64) {
    if r.attempt == 1 {
        let _s = step!("run.fire", r.run, r.attempt, &r.group, "").entered();
        info!(late_ms, "run fired");
    } else {
        let _s = step!("run.retry", r.run, r.attempt, &r.group, "").entered();
        info!("run retry ready");
    }
}

/// The leader handed the attempt to `worker` after it waited `waited_ms` in the queue.
pub fn dispatched(run: &RunId, attempt: u32, group: &str, worker: &str, waited_ms: u128) {
    let _s = step!("run.dispatch", run, attempt, group, worker).entered();
    info!(waited_ms = waited_ms as u64, "run dispatched");
}

/// The run reached its terminal state.
pub fn finished(f: &Finished) {
    let _s = step!("run.finish", f.run, f.attempt, &f.group, &f.worker).entered();
    info!(outcome = f.outcome.as_str(), "run finished");
}
