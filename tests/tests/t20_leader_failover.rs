//! Kill -9 the leader of a 3-node cluster while a 200 ms interval job runs:
//! a new leader keeps firing, every occurrence fires exactly once (no gap,
//! no double), and the killed node restarts from disk with a state digest
//! equal to the others' at the same applied index.

use std::time::Duration;

use kairos_client::pb;
use kairos_tests::{assert_no_gap_no_double, create, every_job, wait_for, Cluster};

const EVERY_MS: i64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_firing_without_gap_or_double() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("tick", "g", EVERY_MS as u64))
        .await
        .unwrap();
    wait_for("10 fires", Duration::from_secs(60), || async {
        (c.list_runs("tick", 1000).await.ok()?.len() >= 10).then_some(())
    })
    .await;

    cluster.kill(leader);
    let survivor = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .unwrap();
    let new_leader = wait_for("a new leader", Duration::from_secs(60), || async {
        let s = cluster.status_via(survivor).await?;
        s.nodes
            .iter()
            .find(|n| n.role == "leader" && n.id != leader)
            .map(|n| n.id)
    })
    .await;
    let before = c.list_runs("tick", 100_000).await.unwrap().len();
    wait_for(
        "fires by the new leader",
        Duration::from_secs(60),
        || async { (c.list_runs("tick", 100_000).await.ok()?.len() >= before + 10).then_some(()) },
    )
    .await;

    cluster.start_node(leader);
    let r = pb::JobRef { id: "tick".into() };
    c.jobs(|mut j| {
        let r = r.clone();
        async move {
            j.pause_job(pb::PauseJobRequest {
                id: r.id,
                ..Default::default()
            })
            .await
        }
    })
    .await
    .unwrap();
    let runs = c.list_runs("tick", 100_000).await.unwrap();
    assert_no_gap_no_double(&runs, EVERY_MS);
    assert!(
        runs.iter().any(|r| r.fired_at_ms > 0),
        "runs carry their fire time"
    );

    let nodes = cluster.wait_converged(new_leader, &[1, 2, 3]).await;
    let digests: Vec<&str> = nodes.iter().map(|n| n.state_digest.as_str()).collect();
    assert!(
        digests.iter().all(|d| *d == digests[0] && !d.is_empty()),
        "digests differ at the same index: {nodes:?}"
    );
    // The restarted node's own local history agrees with the leader's.
    let local = c
        .list_runs_local(&cluster.node(leader).addr, "tick", 100_000)
        .await
        .unwrap();
    assert_eq!(local.len(), runs.len());
}

/// A worker is told each attempt's fire time and shard count. The leader
/// that fired it hands them on from the fire itself; a new leader, which
/// rebuilt its queues from the active-run table, reads them back from the
/// run record. Either way the worker gets what the run record says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_the_fire_time_from_the_fire_and_after_a_leader_change_from_the_record() {
    use std::sync::{Arc, Mutex};

    use kairos_client::worker::{Outcome, Task, Worker};
    use kairos_tests::once_job;

    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    // No worker of group "late" yet: the run waits, pending, in the table.
    create(&c, once_job("before", "late")).await.unwrap();
    let pending = |id: &'static str| {
        let c = c.clone();
        async move {
            let runs = c.list_runs(id, 10).await.ok()?;
            runs.into_iter()
                .find(|r| r.state == pb::RunState::Pending as i32)
        }
    };
    let before = wait_for("a pending run of before", Duration::from_secs(60), || {
        pending("before")
    })
    .await;

    cluster.kill(leader);
    let survivor = cluster.nodes.iter().map(|n| n.id).find(|id| *id != leader);
    let survivor = survivor.unwrap();
    wait_for("a new leader", Duration::from_secs(60), || async {
        let s = cluster.status_via(survivor).await?;
        s.nodes
            .iter()
            .any(|n| n.role == "leader" && n.id != leader)
            .then_some(())
    })
    .await;

    let seen: Arc<Mutex<Vec<Task>>> = Arc::default();
    let record = seen.clone();
    let worker = Worker::connect(cluster.endpoints(), "late").id("late-1");
    let worker = tokio::spawn(worker.run(move |t: Task| {
        record.lock().unwrap().push(t);
        async { Outcome::Success(Vec::new()) }
    }));
    create(&c, once_job("after", "late")).await.unwrap();
    let tasks = wait_for("both runs handed out", Duration::from_secs(60), || async {
        let t = seen.lock().unwrap().clone();
        let jobs = |j: &str| t.iter().any(|t| t.job == j);
        (jobs("before") && jobs("after")).then_some(t)
    })
    .await;
    worker.abort();

    let after = c.list_runs("after", 10).await.unwrap();
    for run in [&before, &after[0]] {
        let task = tasks.iter().find(|t| t.run_id == run.run_id).unwrap();
        assert!(run.fired_at_ms >= run.scheduled_at_ms, "{run:?}");
        assert_eq!(
            (task.fired_at_ms, task.shard_count),
            (run.fired_at_ms, 1),
            "what {} was told against its record",
            run.run_id
        );
    }
}
