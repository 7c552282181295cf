//! Issue #16 item 3 on a real cluster: a job with `--jitter` shows the
//! pending occurrence's offset (`job get`, `job next`); the leader is
//! killed between the occurrence's scheduling and its fire, and the new
//! leader fires it at that same offset, never before it, with the nominal
//! scheduled time kept. Bad jitters are refused naming the rule; the
//! fire-all catch-up cap (item 9) is stored, shown and range-checked.

use std::time::Duration;

use kairos_tests::{wait_for, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// kairosctl's duration text for `ms` (as `ms_text` writes it).
fn ms_text(ms: i64) -> String {
    if ms > 0 && ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jittered_occurrence_fires_at_its_offset_after_a_leader_kill() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let create = [
        "job", "create", "jit", "--every", "10s", "--jitter", "8s", "--group", "g",
    ];
    let (ok, out) = cluster.kairosctl(&create);
    assert!(ok, "{out}");

    let j = cluster.kairosctl_json(&["job", "get", "jit"])[0].clone();
    assert_eq!(j["jitter"], "8s", "{j}");
    assert_eq!(j["jitter_ms"], 8000, "{j}");
    let nominal = j["next_fire_at_ms"].as_i64().unwrap();
    let offset = j["next_offset_ms"].as_i64().unwrap();
    assert!((0..8000).contains(&offset), "{j}");
    let (ok, next) = cluster.kairosctl(&["job", "next", "jit", "--count", "3"]);
    assert!(ok, "{next}");
    let first = next.lines().next().unwrap_or_default();
    assert!(
        first.ends_with(&format!("  +{}", ms_text(offset))),
        "job next shows the pending occurrence's offset {offset}: {next}"
    );
    assert!(next.contains("(nominal times; jitter 8s"), "{next}");

    // The occurrence is scheduled (its wheel entry committed); its fire is
    // at least 10 s away. The leader dies now.
    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);

    let run = wait_for("the jittered occurrence fires", WAIT, || async {
        let runs = c.list_runs("jit", 10).await.ok()?;
        runs.into_iter().find(|r| r.scheduled_at_ms == nominal)
    })
    .await;
    assert_eq!(run.offset_ms as i64, offset, "{run:?}");
    assert!(
        run.fired_at_ms >= nominal + offset,
        "never before its jittered time: {run:?}"
    );
    assert_eq!(run.note, "", "{run:?}");
    let (ok, table) = cluster.kairosctl(&["runs", "get", &run.run_id]);
    assert!(
        ok && table.contains(&format!("+{}", ms_text(offset))),
        "{table}"
    );

    // Refusals name the field and the rule, and create nothing.
    cluster.kairosctl_refused(
        &[
            "job", "create", "bad", "--every", "10s", "--jitter", "10s", "--group", "g",
        ],
        "jitter: must be shorter than the schedule's gap between occurrences (10000 ms)",
    );
    cluster.kairosctl_refused(
        &[
            "job", "create", "bad", "--every", "1d", "--jitter", "2h", "--group", "g",
        ],
        "jitter: must be between 1 ms and 1 h",
    );
    cluster.kairosctl_refused(
        &[
            "job",
            "create",
            "bad",
            "--cron",
            "*/5 * * * *",
            "--jitter",
            "5m",
            "--group",
            "g",
        ],
        "jitter: must be shorter than the schedule's gap between occurrences (300000 ms)",
    );
    cluster.kairosctl_refused(
        &[
            "job",
            "create",
            "bad",
            "--every",
            "1s",
            "--catch-up-max",
            "0",
            "--group",
            "g",
        ],
        "catch_up_max: must be between 1 and 10000, got 0",
    );
    let (ok, out) = cluster.kairosctl(&["job", "get", "bad"]);
    assert!(!ok, "{out}");

    // The catch-up cap (item 9) is stored and shown.
    let create = [
        "job",
        "create",
        "capped",
        "--every",
        "1h",
        "--catch-up-max",
        "7",
        "--group",
        "g",
    ];
    let (ok, out) = cluster.kairosctl(&create);
    assert!(ok, "{out}");
    let j = cluster.kairosctl_json(&["job", "get", "capped"])[0].clone();
    assert_eq!(j["catch_up_max"], 7, "{j}");
    let (ok, text) = cluster.kairosctl(&["job", "get", "capped"]);
    assert!(ok && text.contains("catch-up at most 7"), "{text}");
}
