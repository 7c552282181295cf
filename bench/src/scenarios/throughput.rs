//! `throughput`: an offered load of `--rate` fires/s (default 25,000), 90%
//! from interval jobs (`every_ms`, default 1 s) and 10% from one-shot `at_ms`
//! timers created continuously one second ahead. Measured over `--duration`
//! (default 30 s) after a warm-up: worker receipts per second (`fires_per_s`),
//! lateness (worker receipt minus scheduled time), and, from the run history
//! of a sample of jobs, how many fires in the window had their finish
//! committed and how long scheduled-to-finish-committed took.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos_client::pb::{self, schedule::Kind};
use kairos_client::Client;

use super::{report_costs, report_lateness, report_nodes, Target};
use crate::load::{self, create_jobs, spec, wall_ms, Workers};
use crate::stats::{summarize, Report};
use crate::Opts;

const GROUP: &str = "tp";
const ONESHOT_SHARE: f64 = 0.1;
const ONESHOT_LEAD_MS: i64 = 1000;
const FEED_TICK: Duration = Duration::from_millis(100);
const CREATE_LIMIT: Duration = Duration::from_secs(300);
/// Interval jobs whose run history is checked after the run.
const SAMPLE_JOBS: usize = 50;
/// Most interval jobs (bounds memory and setup time).
const JOBS_MAX: u64 = 1_000_000;

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let dur = o.duration.unwrap_or(Duration::from_secs(30));
    let rate = o.rate.unwrap_or(25_000).max(1);
    let every = o.every_ms.unwrap_or(1000).max(1);
    let n_jobs = ((rate as f64 * (1.0 - ONESHOT_SHARE) * every as f64 / 1000.0).round() as u64)
        .clamp(1, JOBS_MAX);
    let oneshot_rate = (rate as f64 * ONESHOT_SHARE).round() as u64;
    let t = Target::new(o).await?;
    let workers = Workers::start(&t.endpoints, GROUP, o.workers, o.capacity);
    let clients = Arc::new(load::clients(&t.endpoints, o.clients).await?);
    eprintln!("throughput: creating {n_jobs} interval jobs every {every} ms");
    let specs = (0..n_jobs).map(|i| {
        let mut s = spec(format!("tp-{i}"), GROUP, Kind::EveryMs(every));
        s.keep_runs = o.keep_runs.unwrap_or_default();
        s
    });
    let cs = create_jobs(
        &clients,
        specs,
        o.in_flight(),
        Instant::now() + CREATE_LIMIT,
    )
    .await;
    let warm = (dur / 5).clamp(Duration::from_secs(1), Duration::from_secs(5));
    tokio::time::sleep(warm).await;
    eprintln!("throughput: measuring for {dur:?}");
    let costs0 = t.costs().await;
    let (before, w0) = (t.samples(), wall_ms());
    let feeder = tokio::spawn(feed_oneshots(clients.clone(), oneshot_rate, dur, o.clients));
    tokio::time::sleep(dur).await;
    let (after, w1) = (t.samples(), wall_ms());
    let costs1 = t.costs().await;
    let fed = feeder.await.unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let recs = workers.rec.snapshot();
    let mut r = Report::new("throughput");
    r.set("duration_s", dur.as_secs_f64());
    r.set("interval_jobs", n_jobs);
    r.set("every_ms", every);
    r.set("keep_runs", o.keep_runs.unwrap_or(0));
    r.set("jobs_created_per_s", cs.per_s());
    r.set("create_failures", cs.failed);
    r.set("creates_refused_after_retries", cs.refused);
    r.set("oneshots_created", fed.0);
    r.set("oneshot_create_failures", fed.1);
    let offered = n_jobs as f64 * 1000.0 / every as f64 + fed.0 as f64 / dur.as_secs_f64();
    r.set("offered_fires_per_s", offered);
    let win: Vec<_> = (recs.iter())
        .filter(|x| x.received_at_ms >= w0 && x.received_at_ms < w1)
        .collect();
    r.set(
        "fires_per_s",
        win.len() as f64 * 1000.0 / (w1 - w0).max(1) as f64,
    );
    report_lateness(&mut r, &win);
    committed_sample(&mut r, &clients[0], n_jobs, every, (w0, w1)).await;
    report_nodes(&mut r, &before, &after);
    report_costs(&mut r, &costs0, &costs1, win.len());
    if let Some(e) = cs.first_error {
        r.note(format!("job create error: {e}"));
    }
    workers.stop().await;
    Ok(r)
}

/// Creates one-shot timers due `ONESHOT_LEAD_MS` ahead at `rate`/s for `dur`;
/// returns (created, failed).
async fn feed_oneshots(
    clients: Arc<Vec<Client>>,
    rate: u64,
    dur: Duration,
    conc: usize,
) -> (u64, u64) {
    let (start, mut next_id, mut done) = (Instant::now(), 0u64, (0u64, 0u64));
    let per_tick = (rate as f64 * FEED_TICK.as_secs_f64()).round() as u64;
    let mut tick = tokio::time::interval(FEED_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while per_tick > 0 && start.elapsed() < dur {
        tick.tick().await;
        let at = wall_ms() + ONESHOT_LEAD_MS;
        let ids = next_id..next_id + per_tick;
        next_id += per_tick;
        let specs = ids.map(|i| spec(format!("tp-once-{i}"), GROUP, Kind::AtMs(at)));
        let st = create_jobs(&clients, specs, conc, Instant::now() + FEED_TICK * 10).await;
        done.0 += st.ok;
        done.1 += st.failed + st.refused + st.skipped;
    }
    done
}

/// From the run history of a sample of interval jobs: the share of fires
/// due in the window whose finish was committed, and scheduled-to-finish times.
/// With `--keep-runs` below the fires per job, only the runs kept count.
async fn committed_sample(r: &mut Report, c: &Client, n_jobs: u64, every: u64, win: (i64, i64)) {
    let step = (n_jobs as usize / SAMPLE_JOBS).max(1);
    let jobs: Vec<String> = (0..n_jobs as usize)
        .step_by(step)
        .take(SAMPLE_JOBS)
        .map(|i| format!("tp-{i}"))
        .collect();
    let expected_per_job = (win.1 - win.0) / every as i64;
    let limit = (expected_per_job as usize + 1000).min(100_000);
    let (mut due, mut ok, mut e2e) = (0u64, 0u64, Vec::new());
    for (_, runs) in load::runs_of(c, jobs, limit, 8).await {
        for run in runs.unwrap_or_default() {
            if run.scheduled_at_ms < win.0 || run.scheduled_at_ms >= win.1 {
                continue;
            }
            due += 1;
            if run.state == pb::RunState::Succeeded as i32 {
                ok += 1;
                e2e.push(run.finished_at_ms - run.scheduled_at_ms);
            }
        }
    }
    let sampled = SAMPLE_JOBS.min(n_jobs as usize) as u64;
    r.set("sample_jobs", sampled);
    r.set(
        "sample_fires_expected",
        sampled * expected_per_job.max(0) as u64,
    );
    r.set("sample_fires_fired", due);
    r.set("sample_finish_committed", ok);
    r.summary("sched_to_finish_commit_ms", summarize(&mut e2e));
}
