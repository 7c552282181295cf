//! A follower kept down while the others take enough writes to purge the
//! log past its index catches up by installing a snapshot, and its state
//! digest then matches the others' at the same index.

use std::time::Duration;

use kairos_tests::{create, every_job, wait_for, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_installs_a_snapshot_and_converges() {
    let mut cluster = Cluster::start(3, &["--snapshot-logs", "40", "--keep-logs", "5"]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("before", "g", 3_600_000))
        .await
        .unwrap();
    let down = cluster
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .unwrap();
    let nodes = cluster.wait_converged(leader, &[1, 2, 3]).await;
    let down_index = nodes.iter().find(|n| n.id == down).unwrap().applied_index;
    cluster.kill(down);

    // Write until the leader's log no longer holds the entries the follower
    // is missing (openraft postpones a purge while a replication uses the range).
    let mut created = 1;
    wait_for(
        "the leader to purge its log past the follower",
        Duration::from_secs(90),
        || {
            let batch: Vec<String> = (created..created + 20)
                .map(|i| format!("job-{i:04}"))
                .collect();
            created += 20;
            let (c, cluster) = (&c, &cluster);
            async move {
                for id in batch {
                    create(c, every_job(&id, "g", 3_600_000)).await.unwrap();
                }
                let first = cluster.metric(leader, "kairos_log_first_index")?;
                (first as u64 > down_index + 1).then_some(())
            }
        },
    )
    .await;

    cluster.start_node(down);
    let nodes = cluster.wait_converged(leader, &[1, 2, 3]).await;
    let d0 = &nodes[0].state_digest;
    assert!(
        nodes.iter().all(|n| &n.state_digest == d0),
        "digests differ after catch-up: {nodes:?}"
    );
    let snap = cluster.node(down).data.join("snapshot.bin");
    assert!(
        snap.exists(),
        "the follower holds the installed snapshot at {snap:?}"
    );
    let jobs = c.jobs(|mut j| async move {
        j.list_jobs(kairos_client::pb::ListJobsRequest {
            page_size: 1000,
            page_token: String::new(),
            ..Default::default()
        })
        .await
    });
    assert_eq!(jobs.await.unwrap().jobs.len(), created);
}
