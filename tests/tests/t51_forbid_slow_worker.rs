//! Overlap `forbid` with a worker slower than the schedule: occurrences that
//! fall while a run is active are recorded `skipped` with a note, and the
//! job never has two runs executing at once — checked on the worker side
//! (concurrent handler calls) and on the run records (intervals never overlap).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_tests::{create, every_job, wait_for, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbid_skips_occurrences_while_a_slow_run_is_active() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let (now, max) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (n, m) = (now.clone(), max.clone());
    // Capacity 4: the worker would take overlapping runs if it were given them.
    let worker = Worker::connect(cluster.endpoints(), "slow")
        .capacity(4)
        .id("slow-1");
    let worker = tokio::spawn(worker.run(move |_t: Task| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            let running = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(running, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(1000)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            Outcome::Success(b"done".to_vec())
        }
    }));
    let spec = pb::JobSpec {
        overlap: pb::OverlapPolicy::Forbid as i32,
        ..every_job("forbid", "slow", 300)
    };
    create(&c, spec).await.unwrap();
    let state = |r: &pb::Run, s: pb::RunState| r.state == s as i32;
    let runs = wait_for(
        "3 succeeded runs and some skipped",
        Duration::from_secs(60),
        || async {
            let runs = c.list_runs("forbid", 1000).await.ok()?;
            let done = runs
                .iter()
                .filter(|r| state(r, pb::RunState::Succeeded))
                .count();
            let skipped = runs
                .iter()
                .filter(|r| state(r, pb::RunState::Skipped))
                .count();
            (done >= 3 && skipped >= 3).then_some(runs)
        },
    )
    .await;
    assert_eq!(
        max.load(Ordering::SeqCst),
        1,
        "two runs of a forbid job executed at once"
    );
    for r in runs.iter().filter(|r| state(r, pb::RunState::Skipped)) {
        assert!(r.note.contains("overlap forbid"), "{r:?}");
        assert!(
            r.worker.is_empty(),
            "a skipped occurrence never reached a worker: {r:?}"
        );
    }
    // Run records: each executed run lies between its fire and its finish
    // (cluster time); consecutive ones must not overlap.
    let mut done: Vec<&pb::Run> = runs
        .iter()
        .filter(|r| state(r, pb::RunState::Succeeded))
        .collect();
    done.sort_by_key(|r| r.fired_at_ms);
    for w in done.windows(2) {
        assert!(
            w[1].fired_at_ms >= w[0].finished_at_ms,
            "{} started before {} finished",
            w[1].run_id,
            w[0].run_id
        );
    }
    worker.abort();
}
