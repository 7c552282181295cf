//! Issue #16 item 2 on a 3-node cluster through kairosctl: a job with
//! several schedules (`--cron`, `--also-cron`, `--also-every`) runs at the
//! union of their instants, an instant matched by two crons once; `job
//! next` previews the union and `job get` lists every schedule. Bad sets of
//! schedules are refused naming the field and the rule.

use std::time::Duration;

use kairos_tests::{wait_for, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// Whole seconds divisible by 2 or 3 (the two crons), and the instants
/// `anchor + k * 5 s` (`--also-every 5s`), in order, from `from` to `to`.
fn union(anchor: i64, from: i64, to: i64) -> Vec<i64> {
    let by_cron = |t: i64| t % 1000 == 0 && ((t / 1000) % 2 == 0 || (t / 1000) % 3 == 0);
    let by_every = |t: i64| t > anchor && (t - anchor) % 5000 == 0;
    (from..=to)
        .filter(|t| by_cron(*t) || by_every(*t))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_several_schedules_runs_at_their_union_and_a_shared_instant_once() {
    let cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let create = [
        "job",
        "create",
        "multi",
        "--cron",
        "*/2 * * * * *",
        "--also-cron",
        "*/3 * * * * *",
        "--also-every",
        "5s",
        "--group",
        "g",
    ];
    let (ok, out) = cluster.kairosctl(&create);
    assert!(ok, "{out}");

    let j = cluster.kairosctl_json(&["job", "get", "multi"])[0].clone();
    assert_eq!(
        j["schedule"], "cron */2 * * * * *; cron */3 * * * * *; every 5000ms",
        "{j}"
    );
    assert_eq!(j["also_cron"], serde_json::json!(["*/3 * * * * *"]), "{j}");
    assert_eq!(j["also_every"], serde_json::json!(["5s"]), "{j}");
    let anchor = j["created_at_ms"].as_i64().unwrap();

    // The preview is the union, from the pending occurrence on.
    let next = cluster.kairosctl_json(&["job", "next", "multi", "--count", "8"]);
    let next: Vec<i64> = next
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    assert_eq!(next.len(), 8, "{next:?}");
    assert_eq!(next, union(anchor, next[0], next[7]), "{next:?}");

    // Ten seconds of runs: exactly the union's instants, one run each.
    let runs = wait_for("ten seconds of occurrences", WAIT, || async {
        let runs = c.list_runs("multi", 1000).await.ok()?;
        let first = runs.first()?.scheduled_at_ms;
        (runs.last()?.scheduled_at_ms >= first + 10_000).then_some(runs)
    })
    .await;
    let mut at: Vec<i64> = runs.iter().map(|r| r.scheduled_at_ms).collect();
    at.sort_unstable();
    let (first, last) = (at[0], at[at.len() - 1]);
    assert_eq!(at, union(anchor, anchor + 1, last), "runs: {at:?}");
    let shared: Vec<&i64> = at.iter().filter(|t| *t % 6000 == 0).collect();
    assert!(
        !shared.is_empty(),
        "a second divisible by 6 lies in {first}..{last}"
    );

    // Refusals name the field and the rule, and create nothing.
    let refused = [
        (
            vec!["--every", "2s", "--also-every", "2s"],
            "also[0]: repeats another of the job's schedules",
        ),
        (
            vec!["--at", "2099-01-01T00:00:00Z", "--also-every", "2s"],
            "also: only a cron, Quartz or every schedule may have more schedules",
        ),
        (
            vec!["--every", "1s", "--also-cron", "61 * * * *"],
            "also[0]: schedule.cron.expr",
        ),
    ];
    for (flags, why) in refused {
        let mut args = vec!["job", "create", "bad", "--group", "g"];
        args.extend(flags);
        cluster.kairosctl_refused(&args, why);
    }
    let mut eight = vec!["job", "create", "bad", "--group", "g", "--every", "1s"];
    let extra = ["2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s"];
    for e in &extra {
        eight.extend(["--also-every", e]);
    }
    cluster.kairosctl_refused(&eight, "also: at most 7 more schedules (8 in all), got 8");
    let (ok, out) = cluster.kairosctl(&["job", "get", "bad"]);
    assert!(!ok, "{out}");
}
