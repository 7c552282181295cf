//! `rolling-restart`: `--count` (default 10) interval jobs every
//! `--every-ms` (200) under real workers. After a steady phase, every node
//! is restarted in turn, the current leader first while it has not been
//! restarted yet: first with graceful stops (SIGTERM: a leader hands
//! leadership over before it stops), then with SIGKILL for comparison (a
//! killed leader is restarted once another node leads, as after a crash).
//! Each phase reports the fire delay (scheduled to the Fire command's
//! time) and lateness (scheduled to worker receipt) of the occurrences due
//! in it, the elections (Raft terms) it took and how many stopped nodes
//! were leading; the whole window is then checked for lost, doubled and
//! off-grid fires like `failover`. `--duration` (default 35 s) is spread
//! over the steady phase and the six restarts.

use std::collections::BTreeSet;
use std::time::Duration;

use kairos_client::pb::schedule::Kind;
use kairos_client::Client;
use serde_json::json;

use super::failover::verify_history;
use super::{report_lateness_as, Target};
use crate::cluster::LocalCluster;
use crate::load::{self, create_jobs, spec, wall_ms, Rec, Workers};
use crate::stats::Report;
use crate::Opts;

const GROUP: &str = "rr";
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
const SERVE_TIMEOUT: Duration = Duration::from_secs(60);
/// A phase's window ends this long before it does, so every slot in it is due.
const TAIL_MS: i64 = 1000;
const DRAIN: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, PartialEq)]
enum Stop {
    Graceful,
    Kill,
}

/// What one phase of restarts did.
struct Phase {
    name: &'static str,
    window: (i64, i64),
    elections: u64,
    leader_stops: u64,
    stop_ms: Vec<u64>,
}

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let dur = o.duration.unwrap_or(Duration::from_secs(35));
    let n_jobs = o.count.unwrap_or(10).clamp(1, 100_000);
    let every = o.every_ms.unwrap_or(200).max(1);
    let t = Target::new(o).await?;
    let c = t.require_local("rolling-restart")?;
    let segment = dur / (1 + 2 * c.size() as u32);
    let workers = Workers::start(&t.endpoints, GROUP, o.workers, o.capacity);
    let clients = load::clients(&t.endpoints, 8).await?;
    let client = Client::new(t.endpoints.clone()).with_retry_for(SERVE_TIMEOUT);
    let specs = (0..n_jobs).map(|i| spec(format!("rr-{i}"), GROUP, Kind::EveryMs(every)));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let cs = create_jobs(&clients, specs, 16, deadline).await;
    anyhow::ensure!(cs.failed == 0, "creating jobs: {:?}", cs.first_error);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let w0 = wall_ms();
    tokio::time::sleep(segment).await;
    let steady = Phase {
        name: "steady",
        window: (w0, wall_ms() - TAIL_MS),
        elections: 0,
        leader_stops: 0,
        stop_ms: Vec::new(),
    };
    let graceful = restart_all(c, &client, Stop::Graceful, segment).await?;
    let killed = restart_all(c, &client, Stop::Kill, segment).await?;
    tokio::time::sleep(DRAIN).await;

    let recs = workers.rec.snapshot();
    let mut r = Report::new("rolling-restart");
    r.set("jobs", n_jobs);
    r.set("every_ms", every);
    for p in [&steady, &graceful, &killed] {
        report_phase(&mut r, p, &recs);
    }
    let window = (w0, killed.window.1);
    let jobs = (0..n_jobs).map(|i| format!("rr-{i}")).collect();
    verify_history(&mut r, &client, jobs, every as i64, window).await;
    r.note("fire delay = Fire command time - scheduled time; lateness = worker receipt - scheduled time");
    workers.stop().await;
    Ok(r)
}

/// Restarts every node once, the current leader first while it has not
/// been restarted, each followed by `segment` of normal running.
async fn restart_all(
    c: &LocalCluster,
    client: &Client,
    how: Stop,
    segment: Duration,
) -> anyhow::Result<Phase> {
    let name = match how {
        Stop::Graceful => "graceful",
        Stop::Kill => "kill",
    };
    let start_ms = wall_ms();
    let term0 = max_term(client).await?;
    let mut left: BTreeSet<u64> = (1..=c.size()).collect();
    let (mut leader_stops, mut stop_ms) = (0, Vec::new());
    while let Some(first) = left.first().copied() {
        let (leader, _) = load::leader(client).await?;
        let id = if left.contains(&leader) {
            leader
        } else {
            first
        };
        left.remove(&id);
        leader_stops += u64::from(id == leader);
        let took = match how {
            Stop::Graceful => c.terminate(id, STOP_TIMEOUT).await?,
            Stop::Kill => {
                let at = std::time::Instant::now();
                c.kill(id)?;
                if id == leader {
                    // Restarted at once it would resume leading in its
                    // term (openraft keeps a committed vote for itself): a
                    // crash is down longer than a lease.
                    wait_other_leader(client, id).await?;
                }
                at.elapsed()
            }
        };
        stop_ms.push(took.as_millis() as u64);
        c.restart(id)?;
        c.wait_serving(id, SERVE_TIMEOUT).await?;
        eprintln!("rolling-restart: {name} restart of node {id} done");
        tokio::time::sleep(segment).await;
    }
    Ok(Phase {
        name,
        window: (start_ms, wall_ms() - TAIL_MS),
        elections: max_term(client).await? - term0,
        leader_stops,
        stop_ms,
    })
}

/// Waits until a node other than `old` leads.
async fn wait_other_leader(client: &Client, old: u64) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < SERVE_TIMEOUT {
        if matches!(client.status().await, Ok(s) if s.leader != 0 && s.leader != old) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("no leader other than node {old} after {SERVE_TIMEOUT:?}")
}

/// The highest Raft term any node reports.
async fn max_term(client: &Client) -> anyhow::Result<u64> {
    let s = client.status().await?;
    Ok(s.nodes.iter().map(|n| n.term).max().unwrap_or(0))
}

fn report_phase(r: &mut Report, p: &Phase, recs: &[Rec]) {
    let win: Vec<&Rec> = (recs.iter())
        .filter(|x| x.scheduled_at_ms >= p.window.0 && x.scheduled_at_ms <= p.window.1)
        .collect();
    let prefix = format!("{}_", p.name);
    r.set(
        &format!("{prefix}window_s"),
        (p.window.1 - p.window.0) as f64 / 1000.0,
    );
    report_lateness_as(r, &prefix, &win);
    if !p.stop_ms.is_empty() {
        r.set(&format!("{prefix}elections"), p.elections);
        r.set(&format!("{prefix}leader_stops"), p.leader_stops);
        r.set(&format!("{prefix}stop_ms"), json!(p.stop_ms));
    }
}
