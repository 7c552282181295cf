//! Issue #11: client writes are idempotent by request id. A TriggerJob that
//! committed but whose response was lost (the leader is killed right after)
//! is retried with the same id on the new leader: it returns the first
//! response and the job has one triggered run, not two. A new id triggers again.
//! A create retried the same way (from log format 4 its id is kept in the job
//! it made, not in the request-id table) answers with the job, whole.

use std::time::Duration;

use kairos_client::{pb, REQUEST_ID_HEADER};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{create, every_job, wait_for, Cluster};
use tonic::Code;

async fn create_with_id(
    addr: &str,
    spec: &pb::JobSpec,
    request_id: &str,
) -> Result<pb::Job, tonic::Status> {
    let mut c = pb::jobs_client::JobsClient::new(kairos_client::channel(addr)?);
    let mut req = tonic::Request::new(pb::CreateJobRequest {
        spec: Some(spec.clone()),
    });
    req.metadata_mut()
        .insert(REQUEST_ID_HEADER, request_id.parse().unwrap());
    c.create_job(req).await.map(|r| r.into_inner())
}

async fn trigger(addr: &str, job: &str, request_id: &str) -> Result<pb::Run, tonic::Status> {
    let mut c = pb::jobs_client::JobsClient::new(kairos_client::channel(addr)?);
    let mut req = tonic::Request::new(pb::JobRef { id: job.into() });
    req.metadata_mut()
        .insert(REQUEST_ID_HEADER, request_id.parse().unwrap());
    c.trigger_job(req).await.map(|r| r.into_inner())
}

/// Kills `leader` once the others have what it committed (so its answer is
/// "lost"), then makes `call` on the others until one answers.
async fn kill_and_retry<T, F, Fut>(cluster: &mut Cluster, leader: u64, call: F) -> T
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    cluster.wait_converged(survivor, &[1, 2, 3]).await;
    cluster.kill(leader);
    let cluster = &*cluster;
    wait_for(
        "the retry to be served",
        Duration::from_secs(60),
        || async {
            for n in cluster.nodes.iter().filter(|n| n.id != leader) {
                if let Ok(r) = call(n.addr.clone()).await {
                    return Some(r);
                }
            }
            None
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_retried_after_a_lost_response_acts_once() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    // Hourly: the only runs are the triggered ones.
    create(&c, every_job("nightly", "none", 3_600_000))
        .await
        .unwrap();

    let first = trigger(&cluster.node(leader).addr, "nightly", "req-7f3a")
        .await
        .unwrap();
    // The response "never arrived": the leader dies right after the commit.
    let retried = kill_and_retry(&mut cluster, leader, |addr| async move {
        trigger(&addr, "nightly", "req-7f3a").await
    })
    .await;
    assert_eq!(retried.run_id, first.run_id, "the retry got another run");
    let runs = c.list_runs("nightly", 100).await.unwrap();
    assert_eq!(runs.len(), 1, "one trigger, one run: {runs:?}");

    // A new request id is a new trigger.
    let alive = cluster.nodes.iter().find(|n| n.id != leader).unwrap();
    let second = wait_for("a second trigger", Duration::from_secs(30), || async {
        trigger(&alive.addr, "nightly", "req-9c1d").await.ok()
    })
    .await;
    assert_ne!(second.run_id, first.run_id);
    assert_eq!(c.list_runs("nightly", 100).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_after_a_lost_response_answers_with_the_job_it_made() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    cluster.wait_log_format(leader, LOG_FORMAT).await;
    let mut spec = every_job("invoice-42", "none", 3_600_000);
    spec.job_labels.insert("team".into(), "billing".into());

    let first = create_with_id(&cluster.node(leader).addr, &spec, "req-c0de")
        .await
        .unwrap();
    let retried = kill_and_retry(&mut cluster, leader, |addr| {
        let spec = spec.clone();
        async move { create_with_id(&addr, &spec, "req-c0de").await }
    })
    .await;
    // The job it made, labels included, not a refusal and not a second job.
    assert_eq!(
        (retried.revision, retried.created_at_ms),
        (first.revision, first.created_at_ms)
    );
    let labels = retried.spec.map(|s| s.job_labels).unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("billing"));

    // Another request for the same job id is refused as before.
    let alive = cluster.nodes.iter().find(|n| n.id != leader).unwrap();
    let e = wait_for(
        "a second create's answer",
        Duration::from_secs(30),
        || async {
            match create_with_id(&alive.addr, &spec, "req-beef").await {
                Err(e) if e.code() == Code::AlreadyExists => Some(e),
                _ => None,
            }
        },
    )
    .await;
    assert!(e.message().contains("invoice-42"), "{e:?}");
}
