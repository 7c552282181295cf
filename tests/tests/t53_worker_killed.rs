//! A worker dies mid-run (its task is dropped: no finish, no heartbeat).
//! Its attempt keeps its lease for `LEASE_MS` without a heartbeat, then it
//! is expired through the log and retried on another worker, which succeeds.

use std::time::{Duration, Instant};

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_server::leader::dispatch::LEASE_MS;
use kairos_tests::{create, wait_for, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_s_run_is_retried_elsewhere_after_the_lease() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let doomed = Worker::connect(cluster.endpoints(), "die").id("doomed");
    let doomed = tokio::spawn(doomed.run(|_t: Task| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Outcome::Success(Vec::new())
    }));
    let spec = pb::JobSpec {
        id: "orphan".into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        group: "die".into(),
        // A deadline far away: only the missing heartbeat can end the attempt.
        timeout_ms: 600_000,
        max_attempts: 2,
        backoff_ms: 100,
        ..Default::default()
    };
    create(&c, spec).await.unwrap();
    let run_of = || async { c.list_runs("orphan", 1).await.ok()?.into_iter().next() };
    wait_for(
        "attempt 1 on the doomed worker",
        Duration::from_secs(60),
        || async {
            let r = run_of().await?;
            (r.worker == "doomed" && r.state == pb::RunState::Running as i32).then_some(())
        },
    )
    .await;
    let survivor = Worker::connect(cluster.endpoints(), "die").id("survivor");
    let survivor = tokio::spawn(survivor.run(|t: Task| async move {
        Outcome::Success(format!("attempt {}", t.attempt).into_bytes())
    }));
    wait_for(
        "the survivor to register",
        Duration::from_secs(60),
        || async { (cluster.metric(1, "kairos_workers{group=\"die\"}")? == 2.0).then_some(()) },
    )
    .await;
    doomed.abort();
    let killed = Instant::now();
    let run = wait_for(
        "the run to succeed elsewhere",
        Duration::from_secs(60),
        || async {
            let r = run_of().await?;
            (r.state == pb::RunState::Succeeded as i32).then_some(r)
        },
    )
    .await;
    assert_eq!(
        (run.attempt, run.worker.as_str()),
        (2, "survivor"),
        "{run:?}"
    );
    assert_eq!(run.result, b"attempt 2");
    // The last heartbeat came at most 1 s before the kill, so the lease
    // cannot have run out sooner than LEASE_MS - 1 s after it.
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_millis(LEASE_MS as u64 - 1000),
        "retried after only {waited:?}"
    );
    survivor.abort();
}
