//! Fan-out and routing through real workers: a sharded job delivers one run
//! per shard index, a broadcast job one run per connected worker of its
//! group (each on a different worker), a label-routed job only reaches
//! workers with the label, and `Runs.RetryRun` re-runs a failed run.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::Client;
use kairos_tests::{create, wait_for, Cluster};

/// (worker, run id, shard, shard count) for every task a worker ran.
type Seen = Arc<Mutex<Vec<(String, String, u32, u32)>>>;

fn spawn_worker(cluster: &Cluster, group: &str, id: &str, label: Option<(&str, &str)>, seen: Seen) {
    let mut w = Worker::connect(cluster.endpoints(), group)
        .capacity(8)
        .id(id);
    if let Some((k, v)) = label {
        w = w.label(k, v);
    }
    let me = id.to_string();
    tokio::spawn(w.run(move |t: Task| {
        let (seen, me) = (seen.clone(), me.clone());
        async move {
            // Held briefly so all runs of one occurrence are in flight together.
            tokio::time::sleep(Duration::from_millis(300)).await;
            seen.lock()
                .unwrap()
                .push((me, t.run_id.clone(), t.shard, t.shard_count));
            Outcome::Success(format!("shard {}", t.shard).into_bytes())
        }
    }));
}

fn once(id: &str, group: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(200)),
        }),
        group: group.into(),
        ..Default::default()
    }
}

async fn succeeded(c: &Client, job: &str, n: usize) -> Vec<pb::Run> {
    wait_for(
        &format!("{n} succeeded runs of {job}"),
        Duration::from_secs(60),
        || async {
            let runs = c.list_runs(job, 1000).await.ok()?;
            let ok = runs
                .iter()
                .filter(|r| r.state == pb::RunState::Succeeded as i32)
                .count();
            (ok >= n).then_some(runs)
        },
    )
    .await
}

async fn wait_workers(cluster: &Cluster, group: &str, n: f64) {
    let gauge = format!("kairos_workers{{group=\"{group}\"}}");
    wait_for(
        &format!("{n} workers in {group}"),
        Duration::from_secs(60),
        || async { (cluster.metric(1, &gauge)? == n).then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_and_broadcast_deliver_one_run_per_shard_and_per_worker() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let seen: Seen = Arc::default();
    for id in ["b1", "b2", "b3"] {
        spawn_worker(&cluster, "fan", id, None, seen.clone());
    }
    wait_workers(&cluster, "fan", 3.0).await;
    create(
        &c,
        pb::JobSpec {
            shards: Some(4),
            ..once("sharded", "fan")
        },
    )
    .await
    .unwrap();
    let runs = succeeded(&c, "sharded", 4).await;
    assert_eq!(runs.len(), 4, "{runs:?}");
    let shards: Vec<(u32, u32)> = runs.iter().map(|r| (r.shard, r.shard_count)).collect();
    assert_eq!(shards, [(0, 4), (1, 4), (2, 4), (3, 4)]);
    let base = &runs[0].run_id;
    assert_eq!(runs[3].run_id, format!("{base}/s3"));
    let tasks: BTreeSet<(u32, u32)> = seen.lock().unwrap().iter().map(|s| (s.2, s.3)).collect();
    assert_eq!(tasks, [(0, 4), (1, 4), (2, 4), (3, 4)].into());

    create(
        &c,
        pb::JobSpec {
            broadcast: true,
            ..once("everyone", "fan")
        },
    )
    .await
    .unwrap();
    let runs = succeeded(&c, "everyone", 3).await;
    assert_eq!(runs.len(), 3, "one run per connected worker: {runs:?}");
    let workers: BTreeSet<&str> = runs.iter().map(|r| r.worker.as_str()).collect();
    assert_eq!(workers, ["b1", "b2", "b3"].into(), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_routing_reaches_only_matching_workers() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let seen: Seen = Arc::default();
    spawn_worker(&cluster, "lab", "eu-1", Some(("zone", "eu")), seen.clone());
    spawn_worker(&cluster, "lab", "us-1", Some(("zone", "us")), seen.clone());
    wait_workers(&cluster, "lab", 2.0).await;
    let spec = pb::JobSpec {
        route: pb::RoutePolicy::Label as i32,
        labels: [("zone".to_string(), "eu".to_string())].into(),
        shards: Some(6),
        ..once("eu-only", "lab")
    };
    create(&c, spec).await.unwrap();
    let runs = succeeded(&c, "eu-only", 6).await;
    assert!(runs.iter().all(|r| r.worker == "eu-1"), "{runs:?}");
    assert!(seen.lock().unwrap().iter().all(|s| s.0 == "eu-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_run_re_runs_a_failed_run_as_its_next_attempt() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let w = Worker::connect(cluster.endpoints(), "again").id("w");
    tokio::spawn(w.run(|t: Task| async move {
        if t.attempt == 1 {
            Outcome::Failure {
                error: "no".into(),
                retryable: false,
            }
        } else {
            Outcome::Success(b"yes".to_vec())
        }
    }));
    create(&c, once("redo", "again")).await.unwrap();
    let failed = wait_for("the run to fail", Duration::from_secs(60), || async {
        let r = c.list_runs("redo", 1).await.ok()?.into_iter().next()?;
        (r.state == pb::RunState::Failed as i32).then_some(r)
    })
    .await;
    let retried = c.retry_run(&failed.run_id).await.unwrap();
    assert_eq!(retried.attempt, 2, "{retried:?}");
    let done = succeeded(&c, "redo", 1).await.remove(0);
    assert_eq!(
        (done.attempt, done.result.as_slice()),
        (2, b"yes".as_slice())
    );
    let err = c.retry_run("redo@1").await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::NotFound, "run redo@1 not found")
    );
    let err = c.retry_run("redo@x").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("run_id: expected"), "{err:?}");
}
