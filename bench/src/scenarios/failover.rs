//! `failover`: `--count` (default 50) interval jobs every `--every-ms` (200)
//! under real workers; the leader is SIGKILLed `--kills` (3) times and
//! restarted each time, spread over `--duration` (default 60 s). Reports the
//! gap from each kill to the first fire committed by the new leader (by the
//! run's `fired_at_ms`) and to its first delivery to a worker, and then
//! checks every job's run history inside the window: each scheduled time on
//! the job's grid appears exactly once (lost = missing slots, doubled =
//! repeated scheduled times, irregular = off-grid times). Redeliveries of the
//! same run to workers (allowed: at-least-once) are counted separately.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kairos_client::pb::{self, schedule::Kind};
use kairos_client::Client;
use serde_json::json;

use super::{report_lateness, Target};
use crate::load::{self, create_jobs, spec, wall_ms, Rec, Workers};
use crate::stats::{summarize, Report};
use crate::Opts;

const GROUP: &str = "fo";
const ELECTION_TIMEOUT: Duration = Duration::from_secs(30);
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);
/// The window ends this long before the last kill cycle's end, so every slot in it is due.
const TAIL_MS: i64 = 1000;
const DRAIN: Duration = Duration::from_secs(3);
/// How long after the drain a cluster that runs behind its load may take to
/// deliver every job's last slot in the window. The history is checked only
/// then: a slot not fired yet is late, not lost. Past this the check runs
/// anyway, and a slot still missing is reported lost.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);
const CATCH_UP_POLL: Duration = Duration::from_secs(1);
const RUNS_PER_JOB_MAX: usize = 200_000;
const KILLS_MAX: u32 = 100;

struct Kill {
    node: u64,
    at_ms: i64,
    election_ms: u64,
    restart_ms: u64,
}

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let dur = o.duration.unwrap_or(Duration::from_secs(60));
    let n_jobs = o.count.unwrap_or(50).clamp(1, 100_000);
    let every = o.every_ms.unwrap_or(200).max(1);
    let kills = o.kills.min(KILLS_MAX);
    let t = Target::new(o).await?;
    let c = t.require_local("failover")?;
    let workers = Workers::start(&t.endpoints, GROUP, o.workers, o.capacity);
    let clients = load::clients(&t.endpoints, 8).await?;
    let client = Client::new(t.endpoints.clone()).with_retry_for(ELECTION_TIMEOUT);
    let specs = (0..n_jobs).map(|i| spec(format!("fo-{i}"), GROUP, Kind::EveryMs(every)));
    let deadline = Instant::now() + Duration::from_secs(60);
    let cs = create_jobs(&clients, specs, 16, deadline).await;
    anyhow::ensure!(cs.failed == 0, "creating jobs: {:?}", cs.first_error);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let w0 = wall_ms();
    let segment = dur / (kills + 1);
    tokio::time::sleep(segment).await;
    let mut log = Vec::new();
    for k in 0..kills {
        log.push(kill_leader(c, &client).await?);
        eprintln!(
            "failover: kill {}/{kills} of node {} done",
            k + 1,
            log[k as usize].node
        );
        tokio::time::sleep(segment).await;
    }
    let w1 = wall_ms() - TAIL_MS;
    tokio::time::sleep(DRAIN).await;
    let waited = Instant::now();
    let mut recs = workers.rec.snapshot();
    while !each_fired_past(&recs, n_jobs, w1 - every as i64) && waited.elapsed() < CATCH_UP_LIMIT {
        tokio::time::sleep(CATCH_UP_POLL).await;
        recs = workers.rec.snapshot();
    }
    let mut r = Report::new("failover");
    r.set("jobs", n_jobs);
    r.set("every_ms", every);
    r.set("kills", kills as u64);
    r.set("window_s", (w1 - w0) as f64 / 1000.0);
    r.set("catch_up_wait_ms", waited.elapsed().as_millis() as u64);
    report_gaps(&mut r, &log, &recs);
    let win: Vec<&Rec> = (recs.iter())
        .filter(|x| x.scheduled_at_ms >= w0 && x.scheduled_at_ms <= w1)
        .collect();
    report_lateness(&mut r, &win);
    let mut seen: HashMap<&str, u32> = HashMap::new();
    win.iter()
        .for_each(|x| *seen.entry(&x.run_id).or_default() += 1);
    r.set(
        "worker_redeliveries",
        seen.values().map(|&n| n as u64 - 1).sum::<u64>(),
    );
    let jobs = (0..n_jobs).map(|i| format!("fo-{i}")).collect();
    verify_history(&mut r, &client, jobs, every as i64, (w0, w1)).await;
    workers.stop().await;
    Ok(r)
}

/// SIGKILLs the leader, waits for a new one, restarts the old node and waits until it serves.
async fn kill_leader(c: &crate::cluster::LocalCluster, client: &Client) -> anyhow::Result<Kill> {
    let (old, _) = load::leader(client).await?;
    let at_ms = wall_ms();
    let start = Instant::now();
    c.kill(old)?;
    loop {
        anyhow::ensure!(
            start.elapsed() < ELECTION_TIMEOUT,
            "no new leader after {ELECTION_TIMEOUT:?}"
        );
        match client.status().await {
            Ok(s) if s.leader != 0 && s.leader != old => break,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let election_ms = start.elapsed().as_millis() as u64;
    c.restart(old)?;
    let restart_ms = c.wait_serving(old, SERVE_TIMEOUT).await?.as_millis() as u64;
    Ok(Kill {
        node: old,
        at_ms,
        election_ms,
        restart_ms,
    })
}

/// Whether each of the `jobs` jobs had an occurrence scheduled after
/// `after` delivered. A job fires its occurrences in order, so each of its
/// earlier slots was fired by then too (or is lost, which the history shows).
fn each_fired_past(recs: &[Rec], jobs: u64, after: i64) -> bool {
    let past: HashSet<&str> = (recs.iter())
        .filter(|x| x.scheduled_at_ms > after)
        .map(|x| x.job.as_str())
        .collect();
    past.len() as u64 >= jobs
}

/// Kill-to-first-fire (fired_at of the first run fired after the kill) and kill-to-first-delivery gaps.
fn report_gaps(r: &mut Report, log: &[Kill], recs: &[Rec]) {
    let (mut fire, mut deliver, mut per) = (Vec::new(), Vec::new(), Vec::new());
    for k in log {
        let after: Vec<&Rec> = recs.iter().filter(|x| x.fired_at_ms >= k.at_ms).collect();
        let f = after.iter().map(|x| x.fired_at_ms - k.at_ms).min();
        let d = after.iter().map(|x| x.received_at_ms - k.at_ms).min();
        fire.extend(f);
        deliver.extend(d);
        per.push(
            json!({"node": k.node, "election_ms": k.election_ms, "fire_gap_ms": f,
            "delivery_gap_ms": d, "restart_to_serving_ms": k.restart_ms}),
        );
    }
    let (fs, ds) = (summarize(&mut fire), summarize(&mut deliver));
    r.set("gap_ms_p50", json!(fs.map(|s| s.p50)));
    r.set("gap_ms_max", json!(fs.map(|s| s.max)));
    r.set("delivery_gap_ms_p50", json!(ds.map(|s| s.p50)));
    r.set("delivery_gap_ms_max", json!(ds.map(|s| s.max)));
    r.set("per_kill", json!(per));
}

#[derive(Default, Debug, PartialEq)]
struct Check {
    expected: u64,
    lost: u64,
    doubled: u64,
    irregular: u64,
    not_succeeded: u64,
}

/// Checks one job's runs (any order) against its grid `anchor + k*every` inside `w`.
fn check_job(runs: &[pb::Run], every: i64, w: (i64, i64)) -> Check {
    let mut ch = Check::default();
    let Some(anchor) = runs.iter().map(|r| r.scheduled_at_ms).min() else {
        return ch;
    };
    let mut seen = HashSet::new();
    for run in runs
        .iter()
        .filter(|r| r.scheduled_at_ms >= w.0 && r.scheduled_at_ms <= w.1)
    {
        if !seen.insert(run.scheduled_at_ms) {
            ch.doubled += 1;
        }
        if (run.scheduled_at_ms - anchor) % every != 0 {
            ch.irregular += 1;
        }
        if run.state != pb::RunState::Succeeded as i32 {
            ch.not_succeeded += 1;
        }
    }
    let first = anchor + ((w.0 - anchor).max(0) + every - 1) / every * every;
    for slot in (first..=w.1).step_by(every as usize) {
        ch.expected += 1;
        ch.lost += u64::from(!seen.contains(&slot));
    }
    ch
}

pub(super) async fn verify_history(
    r: &mut Report,
    c: &Client,
    jobs: Vec<String>,
    every: i64,
    w: (i64, i64),
) {
    let mut total = Check::default();
    let mut errors = 0u64;
    for (job, runs) in load::runs_of(c, jobs, RUNS_PER_JOB_MAX, 8).await {
        let Ok(runs) = runs else {
            errors += 1;
            eprintln!("failover: listing runs of {job} failed: {runs:?}");
            continue;
        };
        let ch = check_job(&runs, every, w);
        total.expected += ch.expected;
        total.lost += ch.lost;
        total.doubled += ch.doubled;
        total.irregular += ch.irregular;
        total.not_succeeded += ch.not_succeeded;
    }
    r.set("fires_expected", total.expected);
    r.set("fires_lost", total.lost);
    r.set("fires_doubled", total.doubled);
    r.set("fires_irregular", total.irregular);
    r.set("runs_not_succeeded", total.not_succeeded);
    r.set("history_list_errors", errors);
    if total.lost + total.doubled + total.irregular + errors > 0 {
        r.fail(format!(
            "run history: {} lost, {} doubled, {} off-grid, {} jobs unreadable",
            total.lost, total.doubled, total.irregular, errors
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(at: i64) -> pb::Run {
        pb::Run {
            scheduled_at_ms: at,
            state: pb::RunState::Succeeded as i32,
            ..Default::default()
        }
    }

    fn rec(job: &str, at: i64) -> Rec {
        Rec {
            run_id: format!("{job}@{at}"),
            job: job.into(),
            scheduled_at_ms: at,
            fired_at_ms: at,
            received_at_ms: at,
            attempt: 1,
        }
    }

    #[test]
    fn the_history_waits_for_every_job_to_fire_past_the_window() {
        let recs = vec![
            rec("a", 900),
            rec("a", 1100),
            rec("b", 1000),
            rec("b", 1000),
        ];
        assert!(
            !each_fired_past(&recs, 2, 1000),
            "b has not fired past 1000"
        );
        assert!(each_fired_past(&recs, 2, 999));
        assert!(
            !each_fired_past(&recs, 3, 999),
            "a third job has not fired at all"
        );
    }

    #[test]
    fn grid_check_counts_lost_doubled_irregular() {
        let runs: Vec<pb::Run> = [0, 200, 400, 400, 800, 850, 1000].map(run).to_vec();
        let ch = check_job(&runs, 200, (100, 1000));
        assert_eq!(ch.expected, 5); // 200 400 600 800 1000
        assert_eq!((ch.lost, ch.doubled, ch.irregular), (1, 1, 1));
    }
}
