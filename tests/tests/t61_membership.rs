//! Issue #12: membership at runtime, while a 200 ms interval job fires.
//! A dead node is replaced by a fresh node 4 (`kairosctl cluster replace`,
//! run twice: the second run finds every step done); the cluster grows to 5
//! and shrinks back to 3, the leader's own node included. Unsafe changes are
//! refused with the reason named. Afterwards every scheduled time appears
//! exactly once, 200 ms apart, and all voters' digests are equal. A change
//! cut between its two steps by crashes is finished by the next leader.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use kairos_client::pb::{self, cluster_client::ClusterClient};
use kairos_client::Client;
use kairos_tests::{
    add_learner, assert_no_gap_no_double, create, every_job, kairosctl_bin, wait_for, Cluster,
};
use tonic::Code;

async fn members(c: &Client) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let s = c.status().await.expect("status");
    let voters = s.nodes.iter().filter(|n| n.voter).map(|n| n.id).collect();
    let learners = s.nodes.iter().filter(|n| !n.voter).map(|n| n.id).collect();
    (voters, learners)
}

async fn promote(c: &Client, id: u64) -> Result<pb::MembershipResponse, tonic::Status> {
    c.call(|ch| async move { ClusterClient::new(ch).promote(pb::NodeRef { id }).await })
        .await
}

async fn remove(c: &Client, id: u64) -> Result<pb::MembershipResponse, tonic::Status> {
    c.call(|ch| async move { ClusterClient::new(ch).remove_node(pb::NodeRef { id }).await })
        .await
}

/// `kairosctl cluster replace OLD NEW PEER` against the cluster.
fn kairosctl_replace(cluster: &Cluster, old: u64, new: u64, peer: &str) -> String {
    let out = Command::new(kairosctl_bin())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args([
            "cluster",
            "replace",
            &old.to_string(),
            &new.to_string(),
            peer,
        ])
        .output()
        .expect("run kairosctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kairosctl cluster replace failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Waits until the membership settles on `voters` and they all agree.
async fn settle(cluster: &Cluster, c: &Client, voters: &[u64]) {
    let want: BTreeSet<u64> = voters.iter().copied().collect();
    wait_for(
        &format!("voters {want:?}"),
        Duration::from_secs(60),
        || async {
            let s = c.status().await.ok()?;
            let (v, l) = members(c).await;
            (v == want && l.is_empty() && !s.membership_changing).then_some(())
        },
    )
    .await;
    let via = cluster.wait_leader().await;
    let nodes = cluster.wait_converged(via, voters).await;
    let digest = &nodes[0].state_digest;
    assert!(
        nodes.iter().all(|n| &n.state_digest == digest),
        "digests differ: {nodes:?}"
    );
}

/// Waits until learner `id` has caught up with the leader.
async fn caught_up(c: &Client, id: u64) {
    wait_for(
        &format!("node {id} to catch up"),
        Duration::from_secs(60),
        || async {
            let s = c.status().await.ok()?;
            let n = s.nodes.iter().find(|n| n.id == id)?;
            (n.applied_index > 0 && n.lag < 100 && n.role != "unreachable").then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_grow_and_shrink_while_a_job_fires() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("tick", "none", 200)).await.unwrap();

    // A follower's disk dies: node 4 replaces it.
    let dead = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(dead);
    let peer4 = cluster.add_joining_node(4);
    // Unsafe while node `dead` is down: removing another voter leaves 1 of 2 answering.
    let other = (1..=3).find(|id| *id != leader && *id != dead).unwrap();
    let e = remove(&c, other).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("answer"), "{e:?}");
    let e = promote(&c, 4).await.unwrap_err();
    assert!(e.message().contains("not a learner"), "{e:?}");

    let log = kairosctl_replace(&cluster, dead, 4, &peer4);
    assert!(
        log.contains("promoting node 4") && log.contains(&format!("removing node {dead}")),
        "{log}"
    );
    let c = cluster.client();
    settle(&cluster, &c, &[leader, other, 4]).await;
    // Resumed (or repeated): every step is found done.
    let again = kairosctl_replace(&cluster, dead, 4, &peer4);
    assert!(
        again.contains("already a member") && again.contains("not a member"),
        "{again}"
    );

    // Grow to 5.
    for id in [5, 6] {
        let peer = cluster.add_joining_node(id);
        let c = cluster.client();
        add_learner(&c, id, &peer).await.unwrap();
        caught_up(&c, id).await;
        promote(&c, id).await.unwrap();
    }
    // Clients from here on know the new nodes' addresses too.
    let c = cluster.client();
    settle(&cluster, &c, &[leader, other, 4, 5, 6]).await;

    // Shrink to 3, the leader's node first.
    let leader_now = cluster.wait_leader().await;
    remove(&c, leader_now).await.unwrap();
    let rest: Vec<u64> = [leader, other, 4, 5, 6]
        .into_iter()
        .filter(|id| *id != leader_now)
        .collect();
    settle(&cluster, &c, &rest).await;
    let drop_one = rest[0];
    remove(&c, drop_one).await.unwrap();
    cluster.kill(drop_one);
    cluster.kill(leader_now);
    let three: Vec<u64> = rest[1..].to_vec();
    settle(&cluster, &c, &three).await;

    // The job fired through all of it: each time once, 200 ms apart.
    let before = c.list_runs("tick", 100_000).await.unwrap().len();
    wait_for(
        "fires after the changes",
        Duration::from_secs(30),
        || async {
            let n = c.list_runs("tick", 100_000).await.ok()?.len();
            (n >= before + 5).then_some(())
        },
    )
    .await;
    let runs = c.list_runs("tick", 100_000).await.unwrap();
    assert_no_gap_no_double(&runs, 200);

    // Down to one voter: the last one cannot be removed.
    let mut left = three;
    while left.len() > 1 {
        let id = left.remove(0);
        remove(&c, id).await.unwrap();
        cluster.kill(id);
        settle(&cluster, &c, &left).await;
    }
    let e = remove(&c, left[0]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("last voter"), "{e:?}");
}

/// Promoting node 4 while every old voter runs with the `crash-on-joint`
/// failpoint: a node SIGKILLs itself the moment it applies the joint
/// configuration, so the leader dies between the change's two steps (and
/// each later leader too, as it applies the entry). Crashed nodes restart
/// from their data without the failpoint; the leader that finally survives
/// must finish the change on its own, with no fire lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_the_two_steps_of_a_change() {
    let mut cluster = Cluster::start_each(3, &[], &|n| {
        n.env
            .push(("KAIROS_FAILPOINT".into(), "crash-on-joint".into()));
    });
    cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("tick", "none", 200)).await.unwrap();
    let peer4 = cluster.add_joining_node(4);
    add_learner(&c, 4, &peer4).await.unwrap();
    caught_up(&c, 4).await;

    // The call itself may fail or be answered by a later leader: its outcome
    // is whatever the cluster ends with, checked below.
    let promoting = tokio::spawn({
        let c = c.clone();
        async move { promote(&c, 4).await }
    });
    wait_for(
        "the leader to crash mid-change",
        Duration::from_secs(60),
        || {
            let crashed = (1..=3).any(|id| cluster.exited(id));
            async move { crashed.then_some(()) }
        },
    )
    .await;

    let c = cluster.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    // Every old voter applies the joint entry once, so each crashes once.
    let mut restarted = BTreeSet::new();
    loop {
        for id in 1..=3 {
            if cluster.exited(id) {
                assert!(restarted.insert(id), "node {id} crashed twice");
                cluster.node_mut(id).env.clear();
                cluster.start_node(id);
            }
        }
        if restarted.len() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every old voter crashed at the joint entry (restarted: {restarted:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = promoting.await;
    settle(&cluster, &c, &[1, 2, 3, 4]).await;

    // Another change is accepted now: the interrupted one is not "in progress".
    remove(&c, 4).await.unwrap();
    settle(&cluster, &c, &[1, 2, 3]).await;

    let before = c.list_runs("tick", 100_000).await.unwrap().len();
    wait_for(
        "fires after the changes",
        Duration::from_secs(30),
        || async {
            let n = c.list_runs("tick", 100_000).await.ok()?.len();
            (n >= before + 5).then_some(())
        },
    )
    .await;
    assert_no_gap_no_double(&c.list_runs("tick", 100_000).await.unwrap(), 200);
}
