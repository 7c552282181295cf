//! Issue #16 items 4, 7, 8 through kairosctl on real clusters: a job with
//! `--max-runs` fires exactly that many times and shows finished; `--end-at`
//! stops a job; `cluster pause` stops all firing across a leader kill and
//! `cluster resume` applies the misfire policy; a pause note is recorded
//! and shown; label, state and prefix filters page through `job list`;
//! (item 6) `buffer-all` runs overlapping occurrences in order, and
//! `replace` starts the new run only once the worker stopped the old one.

use std::time::Duration;

use kairos_tests::{wait_for, Cluster, ShellWorker};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// `job create ID --every EVERY --group g` and `extra` flags.
fn create_args<'a>(id: &'a str, every: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["job", "create", id, "--every", every, "--group", "g"];
    args.extend_from_slice(extra);
    args
}

/// Runs kairosctl and expects success.
fn run(cluster: &Cluster, args: &[&str]) {
    let (ok, out) = cluster.kairosctl(args);
    assert!(ok, "kairosctl {args:?}: {out}");
}

fn job(cluster: &Cluster, id: &str) -> Value {
    cluster.kairosctl_json(&["job", "get", id])[0].clone()
}

fn ids(v: &Value) -> Vec<String> {
    let jobs = v.as_array().expect("a job array");
    jobs.iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect()
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_runs_and_end_at_finish_jobs_and_a_pause_note_is_shown() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();

    run(
        &cluster,
        &create_args("thrice", "200ms", &["--max-runs", "3"]),
    );
    let finished = wait_for("thrice finished", WAIT, || async {
        let j = job(&cluster, "thrice");
        (j["state"] == "finished").then_some(j)
    })
    .await;
    assert_eq!(finished["fired_count"], 3, "{finished}");
    assert_eq!(finished["next_fire_at_ms"], 0, "{finished}");
    assert_eq!(c.list_runs("thrice", 100).await.unwrap().len(), 3);

    let created = job(&cluster, "thrice")["created_at_ms"].as_i64().unwrap();
    let end = created + 1500;
    run(
        &cluster,
        &create_args("ends", "200ms", &["--end-at", &rfc3339(end)]),
    );
    wait_for("ends finished", WAIT, || async {
        (job(&cluster, "ends")["state"] == "finished").then_some(())
    })
    .await;
    let runs = c.list_runs("ends", 100).await.unwrap();
    assert!(!runs.is_empty());
    assert!(runs.iter().all(|r| r.scheduled_at_ms <= end), "{runs:?}");

    // Refusals name the field and the rule, and create nothing.
    cluster.kairosctl_refused(
        &create_args("bad", "1s", &["--max-runs", "0"]),
        "max_runs: must be between 1 and 1000000000",
    );
    cluster.kairosctl_refused(
        &create_args(
            "bad",
            "1s",
            &[
                "--start-at",
                &rfc3339(end + 10_000),
                "--end-at",
                &rfc3339(end + 5_000),
            ],
        ),
        "end_at_ms: must be after start_at_ms",
    );
    let (ok, out) = cluster.kairosctl(&["job", "get", "bad"]);
    assert!(!ok, "{out}");

    // A pause note, shown by get, cleared by resume.
    run(&cluster, &create_args("tick", "1h", &[]));
    let (ok, out) = cluster.kairosctl(&["job", "pause", "tick", "--note", "db migration"]);
    assert!(
        ok && out.contains("paused") && out.contains("db migration"),
        "{out}"
    );
    let j = job(&cluster, "tick");
    assert_eq!(
        (&j["state"], &j["pause_note"]),
        (&"paused".into(), &"db migration".into()),
        "{j}"
    );
    assert!(j["paused_at_ms"].as_i64().unwrap() > 0, "{j}");
    let long = "x".repeat(1025);
    cluster.kairosctl_refused(
        &["job", "pause", "tick", "--note", &long],
        "note: at most 1024 bytes, got 1025",
    );
    run(&cluster, &["job", "resume", "tick"]);
    let j = job(&cluster, "tick");
    assert_eq!(
        (&j["state"], &j["pause_note"]),
        (&"active".into(), &"".into()),
        "{j}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_pause_holds_across_a_leader_kill_and_resume_applies_the_misfire_policy() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    run(
        &cluster,
        &create_args(
            "beat",
            "200ms",
            &["--misfire", "fire-once", "--grace", "100ms"],
        ),
    );
    wait_for("beat fires", WAIT, || async {
        (!c.list_runs("beat", 10).await.ok()?.is_empty()).then_some(())
    })
    .await;
    let (ok, out) = cluster.kairosctl(&["cluster", "pause", "--note", "incident 7"]);
    assert!(
        ok && out.contains("PAUSED") && out.contains("incident 7"),
        "{out}"
    );
    let fired_before = c.list_runs("beat", 1000).await.unwrap().len();

    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    let status = cluster.kairosctl_json(&["cluster", "status"]);
    assert_eq!(status["firing"]["paused"], true, "{status}");
    assert_eq!(status["firing"]["note"], "incident 7", "{status}");

    // Wait until cluster time is well past the job's pending occurrence
    // (stamped on probe jobs the new leader commits): it was due, and
    // nothing fired.
    let due = job(&cluster, "beat")["next_fire_at_ms"].as_i64().unwrap();
    let mut probe = 0;
    wait_for("cluster time past the due occurrence", WAIT, || {
        probe += 1;
        let id = format!("probe-{probe}");
        run(
            &cluster,
            &["job", "create", &id, "--every", "1h", "--group", "p"],
        );
        let created = job(&cluster, &id)["created_at_ms"].as_i64().unwrap();
        async move { (created > due + 1000).then_some(()) }
    })
    .await;
    cluster.kairosctl_refused(&["job", "trigger", "beat"], "firing is paused");
    assert_eq!(c.list_runs("beat", 1000).await.unwrap().len(), fired_before);

    let (ok, out) = cluster.kairosctl(&["cluster", "resume"]);
    assert!(ok && out.contains("firing: on"), "{out}");
    let coalesced = wait_for("a coalesced run after resume", WAIT, || async {
        let runs = c.list_runs("beat", 1000).await.ok()?;
        runs.into_iter()
            .find(|r| r.note.contains("misfire fire-once: coalesced"))
    })
    .await;
    assert!(coalesced.scheduled_at_ms >= due, "{coalesced:?}");
    let status = cluster.kairosctl_json(&["cluster", "status"]);
    assert_eq!(status["firing"]["paused"], false, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_list_filters_by_labels_state_group_and_prefix_across_pages() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    for (id, group, team) in [
        ("web-1", "g", "web"),
        ("web-2", "g", "web"),
        ("web-3", "h", "web"),
        ("web-4", "g", "web"),
        ("web-5", "g", "web"),
        ("data-1", "g", "data"),
        ("data-2", "h", "data"),
    ] {
        let label = format!("team={team}");
        run(
            &cluster,
            &[
                "job",
                "create",
                id,
                "--every",
                "1h",
                "--group",
                group,
                "--label",
                &label,
                "--label",
                "example.com/tier=gold",
            ],
        );
    }
    run(&cluster, &["job", "pause", "web-4"]);
    let list = |args: &[&str]| {
        let mut all = vec!["job", "list", "--page-size", "2"];
        all.extend_from_slice(args);
        ids(&cluster.kairosctl_json(&all))
    };
    assert_eq!(
        list(&["--selector", "team=web"]),
        vec!["web-1", "web-2", "web-3", "web-4", "web-5"]
    );
    assert_eq!(
        list(&[
            "--selector",
            "team=web,example.com/tier=gold",
            "--group",
            "g"
        ]),
        vec!["web-1", "web-2", "web-4", "web-5"]
    );
    assert_eq!(list(&["--state", "paused"]), vec!["web-4"]);
    assert_eq!(list(&["--prefix", "data-", "--group", "h"]), vec!["data-2"]);
    assert_eq!(list(&["--selector", "team=ops"]), Vec::<String>::new());
    let j = job(&cluster, "web-1");
    assert_eq!(j["labels"]["team"], "web", "{j}");

    cluster.kairosctl_refused(
        &["job", "list", "--selector", "team"],
        "selector: \"team\" is not key=value",
    );
    cluster.kairosctl_refused(
        &create_args("bad", "1h", &["--label=-x=y"]),
        "job_labels (key)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_marks_the_occurrences_a_dst_change_moves() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    // 400 days of a 02:30 New York job hold a spring-forward day (one or
    // two, by the date), where 02:30 does not exist and it fires at 03:00.
    let (ok, out) = cluster.kairosctl(&[
        "schedule",
        "preview",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--count",
        "400",
    ]);
    assert!(ok, "{out}");
    let marked: Vec<&str> = out.lines().filter(|l| l.contains("DST:")).collect();
    assert!((1..=2).contains(&marked.len()), "{out}");
    for m in &marked {
        assert!(
            m.contains("does not exist on") && m.contains("fires at 03:00:00"),
            "{m}"
        );
    }
    // 01:30 repeats on the fall-back day and fires once.
    let (ok, out) = cluster.kairosctl(&[
        "schedule",
        "preview",
        "30 1 * * *",
        "--tz",
        "America/New_York",
        "--count",
        "400",
    ]);
    assert!(ok, "{out}");
    let marked: Vec<&str> = out.lines().filter(|l| l.contains("DST:")).collect();
    assert!((1..=2).contains(&marked.len()), "{out}");
    assert!(
        marked.iter().all(|m| m.contains("01:30:00 occurs twice")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_all_runs_every_overlapping_occurrence_one_at_a_time_in_order() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let _w = ShellWorker::start(&cluster, "g");
    cluster.kairosctl_refused(
        &create_args("bad", "1s", &["--max-concurrent", "0"]),
        "max_concurrent: must be between 1 and 4096, got 0",
    );
    let extra = [
        "--overlap",
        "buffer-all",
        "--max-concurrent",
        "1",
        "--payload",
        "sleep 0.4",
    ];
    run(&cluster, &create_args("q", "150ms", &extra));
    let queued = wait_for("occurrences to queue", WAIT, || async {
        let q = job(&cluster, "q")["queued_at_ms"].as_array()?.len();
        (q >= 2).then_some(q)
    })
    .await;
    assert!(queued <= 256);
    wait_for("5 runs to succeed", WAIT, || async {
        let runs = cluster.kairosctl_json(&["runs", "list", "--job", "q"]);
        let done = runs
            .as_array()?
            .iter()
            .filter(|r| r["state"] == "succeeded")
            .count();
        (done >= 5).then_some(())
    })
    .await;
    run(&cluster, &["job", "pause", "q"]);
    let runs = cluster.kairosctl_json(&["runs", "list", "--job", "q"]);
    let done: Vec<&Value> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "succeeded")
        .collect();
    // In scheduled order, each received after the one before it finished.
    for w in done.windows(2) {
        assert!(w[0]["scheduled_at_ms"].as_i64() < w[1]["scheduled_at_ms"].as_i64());
        assert!(
            w[1]["received_at_ms"].as_i64() >= w[0]["finished_at_ms"].as_i64(),
            "overlapping runs: {} and {}",
            w[0],
            w[1]
        );
        assert!(
            w[1]["note"]
                .as_str()
                .unwrap()
                .starts_with("overlap buffer-all"),
            "{}",
            w[1]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_starts_the_new_run_only_after_the_worker_stopped_the_old_one() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let _w = ShellWorker::start(&cluster, "g");
    // A label needs log format 3, so the cluster is at it before the job exists.
    let extra = [
        "--overlap",
        "replace",
        "--payload",
        "sleep 30",
        "--label",
        "t=replace",
    ];
    run(&cluster, &create_args("r", "1s", &extra));
    let replaced = |runs: &Value| -> Vec<Value> {
        (runs.as_array().unwrap().iter())
            .filter(|r| r["state"] == "cancelled")
            .cloned()
            .collect()
    };
    wait_for("3 runs replaced", WAIT, || async {
        let runs = cluster.kairosctl_json(&["runs", "list", "--job", "r"]);
        (replaced(&runs).len() >= 3).then_some(())
    })
    .await;
    run(&cluster, &["job", "pause", "r"]);
    let runs = cluster.kairosctl_json(&["runs", "list", "--job", "r"]);
    let started: Vec<&Value> = (runs.as_array().unwrap().iter())
        .filter(|r| r["state"] != "skipped")
        .collect();
    for w in started.windows(2) {
        if w[0]["state"] != "cancelled" {
            continue;
        }
        // The worker's own finish ended it, not its 60 s lease.
        assert_eq!(
            w[0]["note"], "replaced: attempt 1 stopped (failed)",
            "{}",
            w[0]
        );
        assert!(
            w[1]["fired_at_ms"].as_i64() >= w[0]["finished_at_ms"].as_i64(),
            "{} started before {} stopped",
            w[1]["run_id"],
            w[0]["run_id"]
        );
        // Its own note, unless it was replaced in turn.
        let notes = [
            "overlap replace: started once the replaced run(s) stopped",
            "replaced: attempt 1 stopped (failed)",
        ];
        assert!(notes.contains(&w[1]["note"].as_str().unwrap()), "{}", w[1]);
    }
}
