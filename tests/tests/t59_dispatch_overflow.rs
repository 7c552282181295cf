//! The leader's dispatch queue is a window over the replicated active-runs
//! table. A group with no worker collects more ready runs than the queue
//! holds (`--queue-max 5`); when a worker connects, the leader pages the
//! overflow back in from disk as the queue drains, and every run is
//! dispatched exactly once, by the same leader (no election, same term).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_tests::{create, wait_for, Cluster};

const QUEUE_MAX: usize = 5;
const RUNS: usize = 23;

fn one_shot(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(50)),
        }),
        group: "ovf".into(),
        timeout_ms: 60_000,
        ..Default::default()
    }
}

async fn term_of(cluster: &Cluster) -> u64 {
    let s = cluster.client().status().await.expect("status");
    s.nodes
        .iter()
        .find(|n| n.role == "leader")
        .expect("a leader")
        .term
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_beyond_the_queue_cap_are_paged_in_and_each_dispatched_once() {
    let cluster = Cluster::start(3, &["--queue-max", &QUEUE_MAX.to_string()]);
    let leader = cluster.wait_leader().await;
    let term = term_of(&cluster).await;
    let c = cluster.client();
    let jobs: Vec<String> = (0..RUNS).map(|i| format!("ovf-{i:02}")).collect();
    for j in &jobs {
        create(&c, one_shot(j)).await.unwrap();
    }
    // Every run fired and waits for a worker; the queue holds only the window.
    wait_for("all runs pending", Duration::from_secs(60), || async {
        for j in &jobs {
            let r = c.list_runs(j, 1).await.ok()?.into_iter().next()?;
            (r.state == pb::RunState::Pending as i32).then_some(())?;
        }
        Some(())
    })
    .await;
    let depth = cluster.metric(leader, "kairos_queue_depth{group=\"ovf\"}");
    assert_eq!(
        depth,
        Some(QUEUE_MAX as f64),
        "queue depth beyond the window"
    );

    let seen: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let log = seen.clone();
    let worker = Worker::connect(cluster.endpoints(), "ovf")
        .id("late")
        .capacity(2);
    let worker = tokio::spawn(worker.run(move |t: Task| {
        *log.lock().unwrap().entry(t.run_id).or_default() += 1;
        async move { Outcome::Success(Vec::new()) }
    }));
    wait_for("every run to succeed", Duration::from_secs(60), || async {
        let mut done = 0;
        for j in &jobs {
            let r = c.list_runs(j, 1).await.ok()?.into_iter().next()?;
            if r.state == pb::RunState::Succeeded as i32 {
                assert_eq!(r.attempt, 1, "{r:?} needed a retry");
                done += 1;
            }
        }
        (done == RUNS).then_some(())
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), RUNS, "runs handed to the worker: {seen:?}");
    assert!(seen.values().all(|n| *n == 1), "a run twice: {seen:?}");
    assert_eq!(term_of(&cluster).await, term, "an election happened");
    assert_eq!(cluster.wait_leader().await, leader);
    worker.abort();
}
