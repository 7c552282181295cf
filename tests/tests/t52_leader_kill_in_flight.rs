//! The leader is SIGKILLed while workers are executing runs (3 s each, longer than a new leader takes to start).
//! Every run still reaches a terminal state, and no two different attempts
//! of one run ever execute at the same time: the new leader leases the
//! attempts that were in flight and retries only after a lease ran out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{now_ms, Outcome, Task, Worker};
use kairos_tests::{create, every_job, wait_for, Cluster};

/// What a worker saw: (run id, attempt, worker, started, ended), worker clock.
type Receipt = (String, u32, String, i64, i64);
type Receipts = Arc<Mutex<Vec<Receipt>>>;

fn spawn_worker(cluster: &Cluster, id: &str, receipts: Receipts) -> tokio::task::JoinHandle<()> {
    let w = Worker::connect(cluster.endpoints(), "inflight")
        .capacity(4)
        .id(id);
    let me = id.to_string();
    tokio::spawn(async move {
        let _ = w
            .run(move |t: Task| {
                let (receipts, me) = (receipts.clone(), me.clone());
                async move {
                    let start = now_ms();
                    tokio::time::sleep(Duration::from_millis(3000)).await;
                    let row = (t.run_id, t.attempt, me, start, now_ms());
                    receipts.lock().unwrap().push(row);
                    Outcome::Success(b"ok".to_vec())
                }
            })
            .await;
    })
}

fn is_terminal(r: &pb::Run) -> bool {
    [
        pb::RunState::Succeeded,
        pb::RunState::Failed,
        pb::RunState::TimedOut,
        pb::RunState::Skipped,
        pb::RunState::Cancelled,
    ]
    .iter()
    .any(|s| *s as i32 == r.state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_in_flight_survive_a_leader_kill_without_concurrent_attempts() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let receipts: Receipts = Arc::default();
    let workers = [
        spawn_worker(&cluster, "w1", receipts.clone()),
        spawn_worker(&cluster, "w2", receipts.clone()),
    ];
    let spec = pb::JobSpec {
        max_attempts: 5,
        timeout_ms: 20_000,
        backoff_ms: 100,
        ..every_job("inflight", "inflight", 400)
    };
    create(&c, spec).await.unwrap();
    wait_for(
        "runs executing on workers",
        Duration::from_secs(60),
        || async {
            let runs = c.list_runs("inflight", 1000).await.ok()?;
            let running = runs
                .iter()
                .filter(|r| r.state == pb::RunState::Running as i32)
                .count();
            (running >= 2 && !receipts.lock().unwrap().is_empty()).then_some(())
        },
    )
    .await;
    cluster.kill(leader);
    let new_leader = cluster.wait_leader().await;
    assert_ne!(new_leader, leader);
    let before = receipts.lock().unwrap().len();
    wait_for(
        "runs to complete under the new leader",
        Duration::from_secs(60),
        || async { (receipts.lock().unwrap().len() >= before + 4).then_some(()) },
    )
    .await;
    let req = pb::JobRef {
        id: "inflight".into(),
    };
    c.jobs(|mut j| {
        let r = req.clone();
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
    let runs = wait_for(
        "every run to be terminal",
        Duration::from_secs(90),
        || async {
            let runs = c.list_runs("inflight", 10_000).await.ok()?;
            runs.iter().all(is_terminal).then_some(runs)
        },
    )
    .await;
    assert!(runs
        .iter()
        .any(|r| r.state == pb::RunState::Succeeded as i32));
    check_no_concurrent_attempts(&receipts.lock().unwrap());
    for w in workers {
        w.abort();
    }
}

/// For each run, attempts ordered by start: a later attempt never starts
/// before an earlier (different) attempt ended.
fn check_no_concurrent_attempts(receipts: &[Receipt]) {
    let mut by_run: BTreeMap<&str, Vec<&Receipt>> = BTreeMap::new();
    for r in receipts {
        by_run.entry(&r.0).or_default().push(r);
    }
    for (run, mut rs) in by_run {
        rs.sort_by_key(|r| r.3);
        for (i, a) in rs.iter().enumerate() {
            for b in &rs[i + 1..] {
                assert!(
                    a.1 == b.1 || b.3 >= a.4,
                    "run {run}: attempt {} on {} started at {} while attempt {} on {} ran until {}",
                    b.1,
                    b.2,
                    b.3,
                    a.1,
                    a.2,
                    a.4
                );
            }
        }
    }
}
