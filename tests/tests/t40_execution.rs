//! Execution through real workers (the worker SDK over gRPC): success,
//! retries with backoff, final failure after max_attempts, and an attempt
//! that outlives its deadline being timed out and retried on another worker.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_client::pb;
use kairos_client::worker::{Outcome, Task, Worker};
use kairos_tests::{create, wait_for, Cluster};

fn once(id: &str, group: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        group: group.into(),
        max_attempts: 3,
        backoff_ms: 100,
        ..Default::default()
    }
}

async fn final_run(c: &kairos_client::Client, job: &str) -> pb::Run {
    wait_for(
        &format!("job {job} to finish"),
        Duration::from_secs(60),
        || async {
            let runs = c.list_runs(job, 10).await.ok()?;
            let r = runs.into_iter().next()?;
            let terminal = [
                pb::RunState::Succeeded,
                pb::RunState::Failed,
                pb::RunState::TimedOut,
            ];
            terminal.iter().any(|s| *s as i32 == r.state).then_some(r)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_until_success_and_fails_after_max_attempts() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let worker = Worker::connect(cluster.endpoints(), "flaky")
        .capacity(4)
        .id("w-flaky");
    let handle = tokio::spawn(worker.run(move |t: Task| {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            if t.job == "twice" && t.attempt < 3 || t.job == "always" {
                Outcome::Failure {
                    error: format!("boom on attempt {}", t.attempt),
                    retryable: true,
                }
            } else {
                Outcome::Success(b"ok".to_vec())
            }
        }
    }));
    create(&c, once("twice", "flaky")).await.unwrap();
    create(&c, once("always", "flaky")).await.unwrap();
    let twice = final_run(&c, "twice").await;
    assert_eq!(
        (twice.state, twice.attempt),
        (pb::RunState::Succeeded as i32, 3),
        "{twice:?}"
    );
    assert_eq!(twice.result, b"ok");
    let always = final_run(&c, "always").await;
    assert_eq!(
        (always.state, always.attempt),
        (pb::RunState::Failed as i32, 3),
        "{always:?}"
    );
    assert!(always.error.contains("boom on attempt 3"), "{always:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    handle.abort();

    // The node's metrics saw it: two fires of group "flaky" (first attempts
    // only), their lateness, six hand-offs to the worker, applies.
    let m = |name: &str| cluster.metric(1, name).unwrap_or(-1.0);
    assert_eq!(m("kairos_fires_total{group=\"flaky\"}"), 2.0);
    assert_eq!(m("kairos_fire_lateness_seconds_count"), 2.0);
    assert_eq!(m("kairos_dispatch_latency_seconds_count"), 6.0);
    let finished = |outcome: &str| {
        m(&format!(
            "kairos_runs_finished_total{{group=\"flaky\",outcome=\"{outcome}\"}}"
        ))
    };
    assert_eq!((finished("succeeded"), finished("failed")), (1.0, 1.0));
    assert!(m("kairos_apply_seconds_count") >= 1.0);
    // Applying six attempts' fires and finishes took some CPU (-1: absent).
    assert!(m("kairos_apply_cpu_seconds_total") > 0.0);
    assert!(m("kairos_state_flush_cpu_seconds_total") >= 0.0);
    assert_eq!(m("kairos_raft_is_leader"), 1.0);
    assert!(m("kairos_raft_applied_index") >= 1.0);
}

/// A worker that holds attempt 1 of every run far past its deadline and
/// answers later attempts at once, noting which attempts it saw.
fn spawn_lease_worker(
    cluster: &Cluster,
    id: &'static str,
    seen: Arc<Mutex<Vec<(&'static str, u32)>>>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let w = Worker::connect(cluster.endpoints(), "lease")
        .capacity(1)
        .id(id);
    tokio::spawn(w.run(move |t: Task| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((id, t.attempt));
            if t.attempt == 1 {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Outcome::Success(format!("attempt {} on {id}", t.attempt).into_bytes())
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_deadline_times_out_and_is_retried_on_another_worker() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    // Both workers are free before the job fires, so the retry has a choice
    // and the dispatcher must steer it away from the worker that timed out.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let workers = [
        spawn_lease_worker(&cluster, "w-a", seen.clone()),
        spawn_lease_worker(&cluster, "w-b", seen.clone()),
    ];
    wait_for(
        "both workers to be registered",
        Duration::from_secs(60),
        || async { (cluster.metric(1, "kairos_workers{group=\"lease\"}")? == 2.0).then_some(()) },
    )
    .await;
    let spec = pb::JobSpec {
        timeout_ms: 2000,
        max_attempts: 2,
        ..once("lease-job", "lease")
    };
    create(&c, spec).await.unwrap();
    let run = final_run(&c, "lease-job").await;
    assert_eq!(
        (run.state, run.attempt),
        (pb::RunState::Succeeded as i32, 2),
        "{run:?}"
    );
    let seen = seen.lock().unwrap().clone();
    let first = seen.iter().find(|(_, a)| *a == 1).expect("attempt 1 ran").0;
    let second = if first == "w-a" { "w-b" } else { "w-a" };
    assert_eq!(
        seen,
        [(first, 1), (second, 2)],
        "retry went back to the timed-out worker"
    );
    assert_eq!(run.worker, second, "{run:?}");
    assert_eq!(run.result, format!("attempt 2 on {second}").into_bytes());
    for w in workers {
        w.abort();
    }
}
