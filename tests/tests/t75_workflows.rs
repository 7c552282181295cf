//! Workflows end to end (issue #15): a diamond whose last job's run is
//! created by the finish that completes its cycle, then survives a kill -9
//! of the leader before any worker took it, and runs exactly once with both
//! upstream results; and the README's extract → transform → report with the
//! shell worker, a failure, a blocked state and a manual retry.

use std::time::Duration;

use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::{pb, Client};
use kairos_tests::{create, every_job, wait_for, Cluster, ShellWorker};
use serde_json::Value;

fn downstream(id: &str, group: &str, ups: &[&str]) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::UpstreamOnly(true)),
        }),
        group: group.into(),
        upstream: ups.iter().map(|u| u.to_string()).collect(),
        ..Default::default()
    }
}

/// Answers each task with `{"job": …, "upstream": <its upstream results>}`.
fn echoing_worker(endpoints: Vec<String>, group: &str) -> tokio::task::JoinHandle<()> {
    let w = Worker::connect(endpoints, group).id(format!("w-{group}"));
    tokio::spawn(async move {
        let _ = w
            .run(|t: Task| async move {
                let upstream: Value =
                    serde_json::from_slice(&t.upstream_results).unwrap_or(Value::Null);
                let out = serde_json::json!({ "job": t.job, "upstream": upstream });
                Outcome::Success(out.to_string().into_bytes())
            })
            .await;
    })
}

async fn runs(c: &Client, job: &str) -> Vec<pb::Run> {
    c.list_runs(job, 1000).await.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diamond_run_created_before_a_leader_kill_runs_once_on_the_next_leader_with_both_results()
{
    let mut cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("a", "g", 3_600_000)).await.unwrap();
    create(&c, downstream("b", "g", &["a"])).await.unwrap();
    create(&c, downstream("c", "g", &["a"])).await.unwrap();
    // d's group has no worker yet: its run waits, created but not dispatched.
    create(&c, downstream("d", "dg", &["b", "c"]))
        .await
        .unwrap();
    let _w = echoing_worker(cluster.endpoints(), "g");
    let r = pb::JobRef { id: "a".into() };
    c.jobs(|mut j| {
        let r = r.clone();
        async move { j.trigger_job(r).await }
    })
    .await
    .unwrap();
    wait_for("d's run", Duration::from_secs(60), || async {
        (runs(&c, "d").await.len() == 1).then_some(())
    })
    .await;

    let leader = cluster.wait_leader().await;
    cluster.kill(leader);
    let next = cluster.wait_leader().await;
    assert_ne!(next, leader);
    let _dw = echoing_worker(cluster.endpoints(), "dg");
    let d = wait_for("d to succeed", Duration::from_secs(60), || async {
        let r = runs(&c, "d").await;
        (r.len() == 1 && r[0].state == pb::RunState::Succeeded as i32).then(|| r[0].clone())
    })
    .await;
    let out: Value = serde_json::from_slice(&d.result).unwrap();
    assert_eq!(out["upstream"]["b"]["job"], "b", "{out}");
    assert_eq!(out["upstream"]["c"]["job"], "c", "{out}");
    assert_eq!(
        out["upstream"]["b"]["upstream"]["a"]["job"], "a",
        "b got a's result: {out}"
    );
    let b = runs(&c, "b").await;
    let cr = runs(&c, "c").await;
    assert_eq!((b.len(), cr.len()), (1, 1));
    let got = c
        .runs(|mut r| {
            let q = pb::RunRef {
                run_id: d.run_id.clone(),
            };
            async move { r.get_run(q).await }
        })
        .await
        .unwrap();
    assert_eq!(
        got.upstream_runs,
        vec![b[0].run_id.clone(), cr[0].run_id.clone()]
    );

    // The killed node comes back and agrees.
    cluster.start_node(leader);
    let nodes = cluster.wait_converged(next, &[1, 2, 3]).await;
    let digest = &nodes[0].state_digest;
    assert!(nodes.iter().all(|n| &n.state_digest == digest), "{nodes:?}");
}

fn ok(cluster: &Cluster, args: &[&str]) -> String {
    let (ok, out) = cluster.kairosctl(args);
    assert!(ok, "kairosctl {args:?}: {out}");
    out
}

fn run_json(cluster: &Cluster, job: &str) -> Vec<Value> {
    let out = ok(cluster, &["--output", "json", "runs", "list", "--job", job]);
    serde_json::from_str::<Value>(&out)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

async fn wait_state(cluster: &Cluster, job: &str, state: &str) -> Value {
    wait_for(
        &format!("{job} {state}"),
        Duration::from_secs(60),
        || async {
            run_json(cluster, job)
                .into_iter()
                .find(|r| r["state"] == state)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_transform_report_pass_results_with_the_shell_worker_and_a_retry_completes_the_cycle(
) {
    let cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("report-may-run");
    let _w = ShellWorker::start(&cluster, "etl");
    ok(
        &cluster,
        &[
            "job",
            "create",
            "extract",
            "--every",
            "1h",
            "--group",
            "etl",
            "--payload",
            r#"echo '{"rows": 42}'"#,
        ],
    );
    ok(
        &cluster,
        &[
            "job",
            "create",
            "transform",
            "--upstream",
            "extract",
            "--group",
            "etl",
            "--payload",
            r#"cat "$KAIROS_UPSTREAM_FILE""#,
        ],
    );
    let report = format!(
        r#"test -f {} && cat "$KAIROS_UPSTREAM_FILE""#,
        flag.display()
    );
    ok(
        &cluster,
        &[
            "job",
            "create",
            "report",
            "--upstream",
            "transform",
            "--group",
            "etl",
            "--payload",
            &report,
        ],
    );
    let refused = cluster.kairosctl(&["job", "update", "extract", "--upstream", "report"]);
    assert!(
        !refused.0
            && refused
                .1
                .contains("would close a cycle extract -> transform -> report -> extract"),
        "{refused:?}"
    );

    ok(&cluster, &["job", "trigger", "extract"]);
    let failed = wait_state(&cluster, "report", "failed").await;
    let t = wait_state(&cluster, "transform", "succeeded").await;
    let passed: Value = serde_json::from_str(t["result"].as_str().unwrap().trim()).unwrap();
    assert_eq!(passed["extract"]["rows"], 42, "{t}");
    // A failed report ends nothing downstream of it; its graph shows the chain.
    let graph = ok(&cluster, &["job", "graph", "report"]);
    assert!(
        graph.contains("transform [active, last run succeeded]"),
        "{graph}"
    );
    assert!(
        graph.contains("extract [active, last run succeeded]"),
        "{graph}"
    );
    assert!(
        graph.contains("report [active, last run failed]"),
        "{graph}"
    );

    std::fs::write(&flag, b"").unwrap();
    ok(
        &cluster,
        &["runs", "retry", failed["run_id"].as_str().unwrap()],
    );
    let done = wait_state(&cluster, "report", "succeeded").await;
    let got: Value = serde_json::from_str(done["result"].as_str().unwrap().trim()).unwrap();
    assert_eq!(got["transform"]["extract"]["rows"], 42, "{done}");
    assert_eq!(
        run_json(&cluster, "report").len(),
        1,
        "the retry is the same run"
    );
    let id = done["run_id"].as_str().unwrap();
    let got: Value =
        serde_json::from_str(&ok(&cluster, &["--output", "json", "runs", "get", id])).unwrap();
    assert_eq!(
        got[0]["upstream_runs"],
        serde_json::json!([t["run_id"]]),
        "{got}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_downstream_says_which_upstream_blocks_it_and_upstreams_in_use_are_not_deleted() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let _w = ShellWorker::start(&cluster, "g");
    ok(
        &cluster,
        &[
            "job",
            "create",
            "up",
            "--every",
            "1h",
            "--group",
            "g",
            "--payload",
            "exit 3",
        ],
    );
    ok(
        &cluster,
        &[
            "job",
            "create",
            "down",
            "--upstream",
            "up",
            "--group",
            "g",
            "--payload",
            "true",
        ],
    );
    ok(&cluster, &["job", "trigger", "up"]);
    wait_state(&cluster, "up", "failed").await;
    let state = wait_for("down blocked", Duration::from_secs(30), || async {
        let out = ok(&cluster, &["--output", "json", "job", "get", "down"]);
        let v: Value = serde_json::from_str(&out).ok()?;
        let s = v[0]["workflow_state"].as_str()?.to_string();
        s.starts_with("blocked").then_some(s)
    })
    .await;
    assert!(
        state.contains("upstream \"up\"") && state.contains("failed"),
        "{state}"
    );
    assert!(run_json(&cluster, "down").is_empty());
    let (deleted, why) = cluster.kairosctl(&["job", "delete", "up"]);
    assert!(
        !deleted && why.contains("is an upstream of \"down\""),
        "{why}"
    );
    let (bad, why) =
        cluster.kairosctl(&["job", "create", "x", "--upstream", "nope", "--group", "g"]);
    assert!(
        !bad && why.contains("upstream: job \"nope\" not found"),
        "{why}"
    );
}
