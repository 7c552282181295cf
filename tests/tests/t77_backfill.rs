//! Issue #16 item 5 through kairosctl on a 3-node cluster: `job backfill`
//! runs the occurrences of a past range in scheduled order, one at a time
//! under buffer-all, each marked as a backfill; the leader is killed -9
//! midway and the next one goes on from the durable cursor, so every
//! occurrence has exactly one run; refusals name the field and the rule;
//! `--cancel` stops a backfill and keeps its runs.

use std::time::Duration;

use kairos_tests::{wait_for, Cluster, ShellWorker};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const HOUR_MS: i64 = 3_600_000;
/// Occurrences of the hourly job in the backfilled range.
const HOURS: i64 = 24;

fn ok(cluster: &Cluster, args: &[&str]) -> String {
    let (ok, out) = cluster.kairosctl(args);
    assert!(ok, "kairosctl {args:?}: {out}");
    out
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339()
}

fn backfill_of(cluster: &Cluster, id: &str) -> Value {
    cluster.kairosctl_json(&["job", "get", id])[0]["backfill"].clone()
}

fn runs(cluster: &Cluster, id: &str) -> Vec<Value> {
    let v = cluster.kairosctl_json(&["runs", "list", "--job", id]);
    v.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_runs_each_past_occurrence_once_in_order_across_a_leader_kill() {
    let mut cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let log_path = log.path().to_str().unwrap().to_string();
    // Each execution appends its occurrence; one at a time (forbid: at most one active).
    let payload = format!("echo $KAIROS_SCHEDULED_AT >> {log_path}; sleep 0.2");
    ok(
        &cluster,
        &[
            "job",
            "create",
            "hourly",
            "--cron",
            "0 * * * *",
            "--group",
            "bf",
            "--overlap",
            "forbid",
            "--max-attempts",
            "3",
            "--payload",
            &payload,
        ],
    );
    let now = chrono::Utc::now().timestamp_millis();
    let to = now - now.rem_euclid(HOUR_MS);
    let from = to - HOURS * HOUR_MS;
    let (from_t, to_t) = (rfc3339(from), rfc3339(to));

    // Refusals, nothing started.
    let future = rfc3339(now + HOUR_MS);
    cluster.kairosctl_refused(
        &[
            "job", "backfill", "hourly", "--from", &from_t, "--to", &future,
        ],
        "to: a backfill covers the past",
    );
    let long_ago = rfc3339(to - 1001 * HOUR_MS);
    cluster.kairosctl_refused(
        &[
            "job", "backfill", "hourly", "--from", &long_ago, "--to", &to_t,
        ],
        "from, to: the range holds more than 1000 occurrences; backfill at most 1000 at a time",
    );
    cluster.kairosctl_refused(
        &[
            "job", "backfill", "hourly", "--from", &to_t, "--to", &from_t,
        ],
        "from: must be before to",
    );
    cluster.kairosctl_refused(
        &["job", "backfill", "nope", "--from", &from_t, "--to", &to_t],
        "job \"nope\" not found",
    );
    cluster.kairosctl_refused(
        &["job", "backfill", "hourly", "--cancel"],
        "job \"hourly\" has no backfill in progress",
    );
    assert_eq!(backfill_of(&cluster, "hourly"), Value::Null);

    // Started before any worker serves the group: the first run waits, so
    // a second backfill finds this one in progress.
    ok(
        &cluster,
        &[
            "job", "backfill", "hourly", "--from", &from_t, "--to", &to_t,
        ],
    );
    cluster.kairosctl_refused(
        &[
            "job", "backfill", "hourly", "--from", &from_t, "--to", &to_t,
        ],
        "has a backfill in progress",
    );
    let _w = ShellWorker::start(&cluster, "bf");
    let b = wait_for("a third of the range to run", WAIT, || async {
        let b = backfill_of(&cluster, "hourly");
        (b["started"].as_i64()? >= HOURS / 3).then_some(b)
    })
    .await;
    assert_eq!(b["state"], "running", "killed midway: {b}");
    let leader = cluster.wait_leader().await;
    cluster.kill(leader);
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);

    let b = wait_for("the backfill to finish", WAIT, || async {
        let b = backfill_of(&cluster, "hourly");
        (b["state"] == "done").then_some(b)
    })
    .await;
    assert_eq!(
        (
            b["total"].as_i64(),
            b["started"].as_i64(),
            b["existing"].as_i64()
        ),
        (Some(HOURS), Some(HOURS), Some(0)),
        "{b}"
    );
    let all = wait_for("every run to succeed", WAIT, || async {
        // Not the job's own occurrence at `to`, should the hour turn meanwhile.
        let r: Vec<Value> = (runs(&cluster, "hourly").into_iter())
            .filter(|r| r["scheduled_at_ms"].as_i64() < Some(to))
            .collect();
        r.iter().all(|r| r["state"] == "succeeded").then_some(r)
    })
    .await;
    // Exactly one run per occurrence of [from, to), each marked, in order.
    let times: Vec<i64> = all
        .iter()
        .map(|r| r["scheduled_at_ms"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (0..HOURS).map(|k| from + k * HOUR_MS).collect();
    assert_eq!(times, want);
    let range = format!("[{from}, {to})");
    assert!(
        all.iter().all(|r| r["backfill"] == range.as_str()),
        "{all:?}"
    );
    // One at a time: each run was created after the one before it finished.
    for w in all.windows(2) {
        assert!(
            w[1]["fired_at_ms"].as_i64() >= w[0]["finished_at_ms"].as_i64(),
            "{} fired before {} finished",
            w[1]["run_id"],
            w[0]["run_id"]
        );
    }
    // Executed in scheduled order; once per attempt (an attempt in flight
    // at the kill may run again as its next attempt).
    let lines: Vec<i64> = std::fs::read_to_string(log.path())
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let mut firsts = lines.clone();
    firsts.dedup();
    assert_eq!(firsts, want, "executions out of order: {lines:?}");
    let attempts: i64 = all.iter().map(|r| r["attempt"].as_i64().unwrap()).sum();
    assert_eq!(lines.len() as i64, attempts, "{lines:?}");
    let got = cluster.kairosctl_json(&["runs", "get", &format!("hourly@{from}")]);
    assert_eq!(got[0]["backfill"], range.as_str(), "{got}");

    // The killed node comes back and agrees.
    cluster.start_node(leader);
    let nodes = cluster.wait_converged(next, &[1, 2, 3]).await;
    let digest = &nodes[0].state_digest;
    assert!(nodes.iter().all(|n| &n.state_digest == digest), "{nodes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_backfill_and_keeps_its_runs() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    ok(
        &cluster,
        &[
            "job",
            "create",
            "idle",
            "--cron",
            "0 * * * *",
            "--group",
            "nobody",
            "--overlap",
            "forbid",
        ],
    );
    let now = chrono::Utc::now().timestamp_millis();
    let to = now - now.rem_euclid(HOUR_MS);
    let (from_t, to_t) = (rfc3339(to - 10 * HOUR_MS), rfc3339(to));
    ok(
        &cluster,
        &["job", "backfill", "idle", "--from", &from_t, "--to", &to_t],
    );
    // No worker serves "nobody": the first run waits and the rest with it.
    wait_for("the first run", WAIT, || async {
        (runs(&cluster, "idle").len() == 1).then_some(())
    })
    .await;
    let out = ok(&cluster, &["job", "backfill", "idle", "--cancel"]);
    assert!(out.contains("cancelled"), "{out}");
    let b = backfill_of(&cluster, "idle");
    assert_eq!(
        (b["state"].as_str(), b["started"].as_i64()),
        (Some("cancelled"), Some(1)),
        "{b}"
    );
    assert_eq!(runs(&cluster, "idle").len(), 1, "its run stays");
}
