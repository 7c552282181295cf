//! A follower kept down while the others take enough writes to purge the
//! log past its index catches up by installing a snapshot, and its state
//! digest then matches the others' at the same index. Snapshot builds and
//! state digests as slow as a large state's (failpoints) are spaced out,
//! and a cluster status does not wait for them.

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

/// A node builds its next snapshot no sooner than four times the last
/// build's duration after it ended (`raft::snapshots`), however many
/// entries wait below ten times `--snapshot-logs`: with every build slowed
/// by two seconds (`slow-snapshot`), the second build ends at least ten
/// seconds after the first (eight of spacing, two of building).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_builds_are_spaced_by_their_duration() {
    let cluster = Cluster::start_each(1, &["--snapshot-logs", "10"], &|n| {
        n.env
            .push(("KAIROS_FAILPOINT".into(), "slow-snapshot=2000".into()));
    });
    let node = cluster.wait_leader().await;
    let c = cluster.client();
    let builds = || cluster.metric(node, "kairos_snapshot_build_seconds_count");
    let create_n = |prefix: &'static str, n: usize| {
        let c = &c;
        async move {
            for i in 0..n {
                create(c, every_job(&format!("{prefix}-{i:03}"), "g", 3_600_000))
                    .await
                    .unwrap();
            }
        }
    };
    // Past `--snapshot-logs`, and this node has built nothing yet: due now.
    create_n("first", 15).await;
    wait_for("the first snapshot build", Duration::from_secs(60), || {
        let n = builds().unwrap_or(0.0);
        async move { (n >= 1.0).then_some(()) }
    })
    .await;
    let first_seen = std::time::Instant::now();
    // Enough entries for the next build, far below the cap of ten times as many.
    create_n("second", 30).await;
    let before_second = std::cell::Cell::new(std::time::Instant::now());
    wait_for("the second snapshot build", Duration::from_secs(90), || {
        let n = builds().unwrap_or(0.0);
        if n < 2.0 {
            before_second.set(std::time::Instant::now());
        }
        async move { (n >= 2.0).then_some(()) }
    })
    .await;
    // The first build ended before `first_seen`, the second after
    // `before_second`; allow half the spacing for a slow poll.
    let apart = before_second.get().duration_since(first_seen);
    assert!(
        apart >= Duration::from_secs(5),
        "the second build ended {apart:?} after the first was seen; spacing wants 10 s"
    );
    assert_eq!(builds(), Some(2.0), "one build per spacing");
}

/// A member whose state takes longer to hash than a status may wait
/// (`slow-digest`, as ten million timers would) is still reported as it
/// is: reachable, at its applied index, with the newest digest it has and
/// that digest's index. A status that waited for the hash would time the
/// member out as unreachable whenever a fresh hash was due. Once the
/// background hash ends, statuses give the fresh digest, equal to the
/// others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_does_not_wait_for_a_slow_digest() {
    let cluster = Cluster::start_each(3, &[], &|n| {
        if n.id == 3 {
            n.env
                .push(("KAIROS_FAILPOINT".into(), "slow-digest=3000".into()));
        }
    });
    let leader = cluster.wait_leader().await;
    // Node 1 bootstrapped comparing the fresh members' digests: a slow one
    // is waited for, not taken for a different state.
    let log = std::fs::read_to_string(cluster.node(1).data.with_extension("log")).unwrap();
    assert!(!log.contains("hold different state"), "{log}");
    let via = if leader == 3 { 1 } else { leader };
    let c = cluster.client();
    create(&c, every_job("first", "g", 3_600_000))
        .await
        .unwrap();
    let first = cluster.wait_converged(via, &[1, 2, 3]).await[0].digest_index;

    // Node 3 applies a new entry; its fresh digest takes 3 s each time,
    // and a digest as costly is reused for four times that.
    create(&c, every_job("second", "g", 3_600_000))
        .await
        .unwrap();
    let stale_answers = std::cell::Cell::new(0);
    wait_for(
        "node 3's digest of the new entry",
        Duration::from_secs(90),
        || async {
            let s = cluster.status_via(via).await?;
            let n3 = s.nodes.iter().find(|n| n.id == 3)?.clone();
            assert!(
                matches!(n3.role.as_str(), "leader" | "follower"),
                "a member hashing its state is reachable: {s:?}"
            );
            assert!(n3.digest_index <= n3.applied_index, "{n3:?}");
            if n3.applied_index > first && n3.digest_index < n3.applied_index {
                assert!(!n3.state_digest.is_empty(), "{n3:?}");
                stale_answers.set(stale_answers.get() + 1);
            }
            (n3.applied_index > first && kairos_tests::digested(&n3)).then_some(())
        },
    )
    .await;
    assert!(
        stale_answers.get() > 0,
        "the first status after node 3 applied the entry came before a 3 s hash of it"
    );
    let nodes = cluster.wait_converged(via, &[1, 2, 3]).await;
    let d = &nodes[0].state_digest;
    assert!(
        nodes.iter().all(|n| &n.state_digest == d),
        "digests differ at the same index: {nodes:?}"
    );
}
