//! Issue #11: client writes are idempotent by request id. A TriggerJob that
//! committed but whose response was lost (the leader is killed right after)
//! is retried with the same id on the new leader: it returns the first
//! response and the job has one triggered run, not two. A new id triggers again.

use std::time::Duration;

use kairos_client::{pb, REQUEST_ID_HEADER};
use kairos_tests::{create, every_job, wait_for, Cluster};

async fn trigger(addr: &str, job: &str, request_id: &str) -> Result<pb::Run, tonic::Status> {
    let mut c = pb::jobs_client::JobsClient::new(kairos_client::channel(addr)?);
    let mut req = tonic::Request::new(pb::JobRef { id: job.into() });
    req.metadata_mut()
        .insert(REQUEST_ID_HEADER, request_id.parse().unwrap());
    c.trigger_job(req).await.map(|r| r.into_inner())
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
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    cluster.wait_converged(survivor, &[1, 2, 3]).await;
    cluster.kill(leader);

    let retried = wait_for(
        "the retry to be served",
        Duration::from_secs(60),
        || async {
            for n in cluster.nodes.iter().filter(|n| n.id != leader) {
                if let Ok(r) = trigger(&n.addr, "nightly", "req-7f3a").await {
                    return Some(r);
                }
            }
            None
        },
    )
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
