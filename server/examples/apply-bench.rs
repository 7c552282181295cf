//! Apply's cost per fire on one node's real store, without Raft, gRPC or
//! workers: the number the cluster benchmarks cannot isolate, since three
//! nodes, the bench's workers and its clients share the box.
//!
//! It opens a store in a temporary directory with the node's defaults
//! (flusher thread, flush window, page cache), creates `--jobs` jobs firing
//! every second (their phases spread over the second), then for
//! `--seconds` of real time applies what a leader would commit every
//! `--tick-ms`: a `Fire` of the entries due, an `Assign` of the runs the
//! previous tick made ready and a `Finish` of the runs it assigned. The
//! simulated clock follows the real one, so the flush window coalesces as
//! it does in a cluster firing the same rate.
//!
//! ```text
//! cargo run --release -p kairos-server --example apply-bench -- --jobs 15000 --seconds 20
//! ```
//!
//! It prints one JSON line: fires, and per fire the CPU of apply and of the
//! flusher, the sled writes, and the process's CPU (apply, flusher and
//! sled's own threads).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_server::core::{
    Command, Effect, FinishReport, JobSpec, Policy, RunId, RunState, ScheduleInput,
};
use kairos_server::metrics::Metrics;
use kairos_server::raft::{Entry, LogId};
use kairos_server::store::{self, sm};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, EntryPayload};

/// Wheel entries in one `Fire` (the leader's bound).
const FIRE_MAX: usize = 4096;

/// The node's allocator, so allocation costs what it costs in `kairos`.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    jobs: u64,
    seconds: u64,
    tick_ms: i64,
    flush_ms: u64,
    /// Each job's `keep_runs`: below `--seconds`, every fire past it also
    /// deletes the job's oldest run, as on a cluster that has run for long.
    keep_runs: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        jobs: 15_000,
        seconds: 20,
        tick_ms: 10,
        flush_ms: sm::FLUSH_MS_DEFAULT,
        keep_runs: Policy::default().keep_runs,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag}: needs a value"))?;
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: expected a whole number, got {value:?}"))?;
        match flag.as_str() {
            "--jobs" if (1..=1_000_000).contains(&n) => a.jobs = n,
            "--seconds" if (1..=3_600).contains(&n) => a.seconds = n,
            "--tick-ms" if (1..=1_000).contains(&n) => a.tick_ms = n as i64,
            "--flush-ms" if n <= sm::FLUSH_MS_MAX => a.flush_ms = n,
            "--keep-runs" if (1..=100_000).contains(&n) => a.keep_runs = n,
            "--jobs" | "--seconds" | "--tick-ms" | "--flush-ms" | "--keep-runs" => {
                return Err(format!("{flag}: {n} is out of range"))
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

type Attempts = Vec<(RunId, u32)>;

/// The log: one entry per command, numbered from 1.
struct Log(u64);

impl Log {
    fn entry(&mut self, cmd: Command) -> Entry {
        self.0 += 1;
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), self.0),
            payload: EntryPayload::Normal(cmd.into()),
        }
    }
}

fn spec(i: u64, keep_runs: u64) -> JobSpec {
    JobSpec {
        id: format!("bench-{i:07}"),
        schedule: ScheduleInput::Every { every_ms: 1000 },
        group: "bench".into(),
        payload: b"{\"task\":\"sync\"}".to_vec(),
        policy: Policy {
            keep_runs,
            ..Policy::default()
        },
        bounds: Default::default(),
        labels: Default::default(),
        workflow: None,
        max_concurrent: None,
        jitter: None,
        catch_up_max: None,
        also: Vec::new(),
    }
}

fn process_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = args().map_err(anyhow::Error::msg)?;
    let dir = tempfile::tempdir()?;
    let metrics = Arc::new(Metrics::new());
    let opts = sm::Options {
        metrics: metrics.clone(),
        flush_ms: a.flush_ms,
        ..Default::default()
    };
    let (_log_store, mut sm) = store::open(dir.path(), 1 << 30, opts)?;
    tokio::spawn(sm.clone().run_flusher());
    let mut effects = sm.subscribe();
    let mut log = Log(0);

    // Jobs created over one simulated second, so their fires spread over it.
    let base: i64 = 1_800_000_000_000;
    let creates: Vec<Entry> = (0..a.jobs)
        .map(|i| {
            let now_ms = base + (i * 1000 / a.jobs) as i64;
            log.entry(Command::CreateJob {
                spec: spec(i, a.keep_runs),
                now_ms,
            })
        })
        .collect();
    for chunk in creates.chunks(1000) {
        sm.apply(chunk.to_vec()).await?;
    }
    sm.flush().await?;
    while effects.try_recv().is_ok() {}

    let start = Instant::now();
    let sim_start = base + 1000;
    let (cpu0, apply0, flush0, writes0) = (
        process_cpu(),
        metrics.apply_cpu_seconds(),
        metrics.flush_cpu_seconds(),
        sm.writes_total(),
    );
    let (mut fires, mut succeeded) = (0u64, 0u64);
    // Attempts made ready by the last tick, and those it assigned.
    let (mut ready, mut assigned): (Attempts, Attempts) = (Vec::new(), Vec::new());
    let mut t = sim_start;
    let mut complete_upto = i64::MIN;
    let end = sim_start + a.seconds as i64 * 1000;
    while t < end {
        // The simulated clock never runs ahead of the real one.
        let due_at = start + Duration::from_millis((t - sim_start) as u64);
        if let Some(wait) = due_at.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        // Everything due up to `complete_upto` has fired (fired entries leave the wheel).
        let keys = sm.wheel_range(None, complete_upto, t, FIRE_MAX);
        if keys.len() < FIRE_MAX {
            complete_upto = t;
        }
        let mut batch = Vec::with_capacity(3);
        if !keys.is_empty() {
            fires += keys.len() as u64;
            batch.push(log.entry(Command::Fire {
                now_ms: t,
                keys,
                widths: Vec::new(),
            }));
        }
        if !assigned.is_empty() {
            let reports = std::mem::take(&mut assigned)
                .into_iter()
                .map(|(run, attempt)| FinishReport {
                    run,
                    attempt,
                    success: true,
                    result: Vec::new(),
                    error: String::new(),
                    retryable: false,
                    worker: "w1".into(),
                    received_at_ms: t,
                    jitter_ms: 0,
                    timed_out: false,
                })
                .collect();
            batch.push(log.entry(Command::Finish { now_ms: t, reports }));
        }
        if !ready.is_empty() {
            let assignments: Vec<_> = ready
                .iter()
                .map(|(run, attempt)| (run.clone(), *attempt, "w1".to_string()))
                .collect();
            assigned = std::mem::take(&mut ready);
            batch.push(log.entry(Command::Assign {
                now_ms: t,
                assignments,
            }));
        }
        if !batch.is_empty() {
            sm.apply(batch).await?;
        }
        while let Ok(batch) = effects.try_recv() {
            for e in batch.iter() {
                match e {
                    Effect::Ready(r) => ready.push((r.run.clone(), r.attempt)),
                    Effect::Finished(f) if f.outcome == RunState::Succeeded => succeeded += 1,
                    _ => {}
                }
            }
        }
        t += a.tick_ms;
    }
    let wall = start.elapsed().as_secs_f64();
    // What was applied must be what a leader would have seen: every job
    // fired once per simulated second, and every run but the last two
    // ticks' was handed out and succeeded.
    let expected = a.jobs * a.seconds;
    let in_flight = (2 * a.jobs * a.tick_ms as u64).div_ceil(1000) + 1;
    if fires.abs_diff(expected) > a.jobs || succeeded + in_flight < fires {
        anyhow::bail!(
            "applied {fires} fires ({expected} expected) and {succeeded} finishes: \
             the store did not fire or finish what it was given"
        );
    }
    let per_fire = |secs: f64| (secs * 1e6 / fires.max(1) as f64 * 100.0).round() / 100.0;
    let report = serde_json::json!({
        "jobs": a.jobs,
        "seconds": wall,
        "fires": fires,
        "runs_succeeded": succeeded,
        "fires_per_s": (fires as f64 / wall).round(),
        "apply_cpu_us_per_fire": per_fire(metrics.apply_cpu_seconds() - apply0),
        "flush_cpu_us_per_fire": per_fire(metrics.flush_cpu_seconds() - flush0),
        "process_cpu_us_per_fire": per_fire((process_cpu() - cpu0).as_secs_f64()),
        "writes_per_fire": ((sm.writes_total() - writes0) as f64 / fires.max(1) as f64 * 100.0).round() / 100.0,
    });
    println!("{report}");
    Ok(())
}
