//! Applied state is held in memory for a flush window and the log is what
//! makes it durable. With a window longer than the test, kill -9 every node
//! of a 3-node cluster while a 200 ms interval job fires and jobs were just
//! created: each node restarts from a store that lacks that state, applies
//! the log again from its persisted index, and afterwards every job is
//! there, every occurrence fired exactly once (no gap, no double, none
//! lost), and the digests are equal.

use std::time::Duration;

use kairos_client::pb;
use kairos_tests::{
    create, every_job, fires_on_without_gap, job_ids, start_ticking, wait_for, Cluster,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_every_node_before_the_flush_and_the_log_brings_the_state_back() {
    let mut cluster = Cluster::start(3, &["--flush-ms", "60000"]);
    cluster.wait_leader().await;
    let c = start_ticking(&cluster).await;
    for i in 0..20 {
        create(&c, every_job(&format!("slow-{i}"), "g", 3_600_000))
            .await
            .unwrap();
    }
    // Nothing of it is in any store yet (no status call ran meanwhile: a
    // digest flushes first).
    for id in [1, 2, 3] {
        let held = wait_for("the node's metrics", Duration::from_secs(30), || async {
            cluster.metric(id, "kairos_state_unflushed_keys")
        })
        .await;
        assert!(held > 20.0, "node {id} holds {held} unflushed keys");
    }
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    for id in [1, 2, 3] {
        cluster.start_node(id);
    }
    cluster.wait_leader().await;
    let c = cluster.client();
    let ids = wait_for("the jobs back", Duration::from_secs(60), || async {
        let req = pb::ListJobsRequest {
            page_size: 100,
            ..Default::default()
        };
        let page = c.list_jobs(req).await.ok()?;
        let ids: Vec<String> = page
            .jobs
            .into_iter()
            .filter_map(|j| Some(j.spec?.id))
            .collect();
        (ids.len() == 21).then_some(ids)
    })
    .await;
    assert!(ids.iter().any(|id| id == "slow-19"), "{ids:?}");
    // Fires on from where it was, each time once, and equal digests.
    fires_on_without_gap(&cluster, &c, &[1, 2, 3]).await;
}

/// A node SIGKILLed halfway through writing a flush larger than one sled
/// batch (the `crash-mid-flush` failpoint, on its clean stop's final flush)
/// finds the flush's redo record at open and writes it again: it rejoins,
/// and its digest equals the others' at the same index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_halfway_through_a_large_flush_writes_it_again_at_open() {
    let mut cluster = Cluster::start_each(3, &["--flush-ms", "60000"], &|n| {
        if n.id == 3 {
            n.env
                .push(("KAIROS_FAILPOINT".into(), "crash-mid-flush".into()));
        }
    });
    cluster.wait_leader().await;
    let c = start_ticking(&cluster).await;
    // A create writes two keys (its job and its wheel entry; log format 5).
    const JOBS: usize = 2_600;
    let specs = (0..JOBS)
        .map(|i| every_job(&format!("slow-{i}"), "g", 3_600_000))
        .collect();
    for r in c.create_jobs(specs, 64).await {
        r.unwrap();
    }
    // More than one sled batch (4,096 keys) held by node 3, none of it
    // flushed (no status call ran meanwhile: a digest flushes first).
    wait_for(
        "node 3 to hold a large window",
        Duration::from_secs(60),
        || async {
            let held = cluster.metric(3, "kairos_state_unflushed_keys")?;
            (held > 4_096.0).then_some(())
        },
    )
    .await;
    cluster.terminate(3, Duration::from_secs(30));
    let path = cluster.node(3).data.with_extension("log");
    let log = || std::fs::read_to_string(&path).unwrap();
    assert!(
        log().contains("failpoint: SIGKILL after it wrote half of a flush's pairs"),
        "node 3 crashed in its flush: {}",
        log()
    );
    cluster.node_mut(3).env.clear();
    cluster.start_node(3);
    wait_for(
        "node 3 to write the flush again",
        Duration::from_secs(60),
        || async {
            log()
                .contains("a flush of the applied state was interrupted; wrote it again")
                .then_some(())
        },
    )
    .await;
    fires_on_without_gap(&cluster, &c, &[1, 2, 3]).await;
    assert_eq!(job_ids(&c, "slow-").await.len(), JOBS);
}

/// Everything a node proposes shares log entries while one is in flight
/// (`node::combine_entries`): with 300 jobs firing every 200 ms while more
/// are created, the leader sends entries that carry several proposals, and
/// still every create is answered with its own job, "tick" fires each time
/// once, and the replicas' digests are equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proposals_share_entries_and_each_keeps_its_own_outcome() {
    let cluster = Cluster::start(3, &[]);
    let c = start_ticking(&cluster).await;
    let specs = |from: usize| {
        (from..from + 150)
            .map(|i| every_job(&format!("busy-{i}"), "g", 200))
            .collect()
    };
    for r in c.create_jobs(specs(0), 64).await {
        r.unwrap();
    }
    // Creates racing the fires: each answer is its own job.
    let made = c.create_jobs(specs(150), 64).await;
    for (i, r) in made.into_iter().enumerate() {
        let spec = r.unwrap().spec.unwrap();
        assert_eq!(spec.id, format!("busy-{}", 150 + i));
    }
    let leader = cluster.wait_leader().await;
    let shared = wait_for("a shared entry", Duration::from_secs(60), || async {
        let n = cluster.metric(leader, "kairos_shared_entries_total")?;
        (n > 0.0).then_some(n)
    })
    .await;
    let proposals = cluster
        .metric(leader, "kairos_shared_proposals_total")
        .unwrap();
    assert!(
        proposals >= 2.0 * shared,
        "{proposals} proposals in {shared} entries"
    );
    assert_eq!(job_ids(&c, "busy-").await.len(), 300);
    fires_on_without_gap(&cluster, &c, &[1, 2, 3]).await;
}
