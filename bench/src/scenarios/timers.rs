//! `timers-1m`: `--count` (default 1,000,000) pending one-shot `at_ms`
//! timers 30 days ahead, created by `--clients` (64) concurrent clients, each
//! on its own connection with `--pipeline` calls in flight, each creating one
//! timer (`CreateJob`) or `--batch` of them (`CreateJobs`). Reports the create rate, RSS per node before and
//! after (bytes per pending timer), on-disk bytes per timer (`du` of the data
//! directories), how long after the last create every replica had applied
//! them all (`followers_caught_up_ms`), and the time a SIGKILLed follower
//! takes after restart to serve again (/readyz 200 and Cluster.Status
//! through it) and to catch up.
//! `--duration` bounds the creation phase (default 20 min).

use std::time::{Duration, Instant};

use kairos_client::pb::schedule::Kind;
use kairos_client::Client;

use super::{elections, max_term, Target};
use crate::cluster::LocalCluster;
use crate::load::{self, create_jobs, spec, wall_ms};
use crate::stats::Report;
use crate::Opts;

const GROUP: &str = "timers";
const AHEAD_MS: i64 = 30 * 24 * 3600 * 1000;
const SETTLE: Duration = Duration::from_secs(2);
const SERVE_TIMEOUT: Duration = Duration::from_secs(300);
const COUNT_MAX: u64 = 10_000_000;
const MB: f64 = 1048576.0;

pub async fn run(o: &Opts) -> anyhow::Result<Report> {
    let count = o.count.unwrap_or(1_000_000).clamp(1, COUNT_MAX);
    let limit = o.duration.unwrap_or(Duration::from_secs(1200));
    let t = Target::new(o).await?;
    let clients = load::clients(&t.endpoints, o.clients).await?;
    tokio::time::sleep(SETTLE).await;
    let (rss0, disk0) = (t.samples(), t.disk());
    let term0 = max_term(&t, &clients[0]).await;
    let base = wall_ms() + AHEAD_MS;
    eprintln!(
        "timers-1m: creating {count} timers with {} clients, {} calls of {} in flight each",
        o.clients, o.pipeline, o.batch
    );
    let specs = (0..count).map(|i| spec(format!("t-{i}"), GROUP, Kind::AtMs(base + i as i64)));
    let deadline = Instant::now() + limit;
    let cs = match o.batch {
        1 => create_jobs(&clients, specs, o.in_flight(), deadline).await,
        n => load::create_job_batches(&clients, specs, n.into(), o.in_flight(), deadline).await,
    };
    eprintln!("timers-1m: {} created in {:?}", cs.ok, cs.elapsed);
    let mut r = Report::new("timers-1m");
    r.set("timers_requested", count);
    r.set("timers_created", cs.ok + cs.existed);
    r.set("create_failures", cs.failed);
    r.set("creates_refused_after_retries", cs.refused);
    r.set("create_skipped_time_limit", cs.skipped);
    r.set("create_s", cs.elapsed.as_secs_f64());
    r.set("creates_per_s", cs.per_s());
    // Apply stalls (a snapshot or digest of the whole state) show here.
    r.summary(
        "create_answer_ms",
        crate::stats::summarize(&mut cs.answer_ms.clone()),
    );
    r.set("clients", o.clients as u64);
    r.set("pipeline", u64::from(o.pipeline));
    r.set("batch", u64::from(o.batch));
    if let Some(e) = &cs.first_error {
        // Not a refusal (those are counted apart): the call itself is broken.
        r.fail(format!("{} creates failed, the first with {e}", cs.failed));
    }
    // How long after the last create every replica has applied it all
    // (read from /metrics, cheap: a status waits up to 1 s for digests).
    let waited = Instant::now();
    let caught_up = match &t.local {
        Some(c) => applied_equal(c, Duration::from_secs(120)).await,
        None => load::wait_applied_equal(&clients[0], Duration::from_secs(120)).await,
    };
    r.set("followers_caught_up", caught_up);
    if caught_up && t.local.is_some() {
        r.set(
            "followers_caught_up_ms",
            waited.elapsed().as_millis() as u64,
        );
    }
    tokio::time::sleep(SETTLE).await;
    let n = (cs.ok + cs.existed).max(1) as f64;
    let (rss1, disk1) = (t.samples(), t.disk());
    let (mut rss_max, mut disk_max) = (f64::MIN, f64::MIN);
    for (id, after) in &rss1 {
        let Some((_, before)) = rss0.iter().find(|(i, _)| i == id) else {
            continue;
        };
        let per = (after.rss_bytes as f64 - before.rss_bytes as f64) / n;
        r.set(
            &format!("node{id}_rss_before_mb"),
            before.rss_bytes as f64 / MB,
        );
        r.set(
            &format!("node{id}_rss_after_mb"),
            after.rss_bytes as f64 / MB,
        );
        r.set(&format!("node{id}_rss_bytes_per_timer"), per);
        rss_max = rss_max.max(per);
    }
    for (id, after) in &disk1 {
        let before = disk0.iter().find(|(i, _)| i == id).map_or(0, |d| d.1);
        let per = (*after as f64 - before as f64) / n;
        r.set(&format!("node{id}_disk_mb"), *after as f64 / MB);
        r.set(&format!("node{id}_disk_bytes_per_timer"), per);
        disk_max = disk_max.max(per);
    }
    if rss_max > f64::MIN {
        r.set("rss_bytes_per_timer_max", rss_max);
        r.set("disk_bytes_per_timer_max", disk_max);
    }
    // Elections while the timers were created and the cluster then idled:
    // with the store this size, snapshots and flushes must not starve heartbeats.
    let term1 = max_term(&t, &clients[0]).await;
    r.set("elections", elections(term0, term1));
    match &t.local {
        Some(c) => {
            restart_follower(&mut r, c, &clients[0]).await?;
            // A restarted follower should hear from the leader before its
            // election timeout: any term change here is an election it caused.
            let term2 = max_term(&t, &clients[0]).await;
            r.set("elections_around_restart", elections(term1, term2));
        }
        None => r.note("no RSS, disk or restart numbers: not a local cluster"),
    }
    Ok(r)
}

/// Waits until every node of `c` reports one applied index on /metrics.
async fn applied_equal(c: &LocalCluster, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        let mut applied = Vec::new();
        for id in 1..=c.size() {
            let Ok(http) = c.http(id) else { return false };
            applied.push(crate::cluster::http_metric(&http, "kairos_raft_applied_index").await);
        }
        if applied.iter().all(|a| a.is_some() && *a == applied[0]) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// SIGKILLs a follower, starts it again and times it until it serves and has caught up.
async fn restart_follower(r: &mut Report, c: &LocalCluster, client: &Client) -> anyhow::Result<()> {
    let status = client.status().await?;
    let target = status
        .nodes
        .iter()
        .map(|n| n.applied_index)
        .max()
        .unwrap_or(0);
    let id = (1..=c.size()).find(|&i| i != status.leader).unwrap_or(1);
    eprintln!("timers-1m: SIGKILL and restart follower node {id}");
    c.kill(id)?;
    let start = Instant::now();
    c.restart(id)?;
    let serving = c.wait_serving(id, SERVE_TIMEOUT).await?;
    r.set("restarted_node", id);
    r.set("restart_to_serving_ms", serving.as_millis() as u64);
    // Its applied index from /metrics (cheap), not from `Status`.
    let http = c.http(id)?;
    while start.elapsed() < SERVE_TIMEOUT {
        let applied = crate::cluster::http_metric(&http, "kairos_raft_applied_index").await;
        if applied.is_some_and(|a| a as u64 >= target) {
            r.set(
                "restart_to_caught_up_ms",
                start.elapsed().as_millis() as u64,
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Until `cluster status` through it names a leader (the definition of
    // serving before the seventh pass): that includes a digest of its whole
    // state, and of the others' unless nothing was applied since their last.
    let local = Client::new([c.endpoint(id)?]).with_retry_for(Duration::from_millis(200));
    while start.elapsed() < SERVE_TIMEOUT {
        if local.status().await.is_ok_and(|s| s.leader != 0) {
            r.set("restart_to_status_ms", start.elapsed().as_millis() as u64);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(s) = c.pid(id).and_then(crate::procfs::sample) {
        r.set(
            &format!("node{id}_rss_after_restart_mb"),
            s.rss_bytes as f64 / MB,
        );
    }
    Ok(())
}
