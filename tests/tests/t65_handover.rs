//! Issue #12: leadership handover. `cluster transfer-leader` makes a named
//! (or the most up-to-date) voter the leader, and refuses, naming why, the
//! leader itself, a non-member, a learner, a voter that does not answer and
//! a single-voter cluster; with five voters it works too; the peer `Elect` call is refused unless it comes
//! from the leader the target follows and the target's log is long enough.
//! Removing the leader hands leadership over first and leaves a working
//! cluster without it. A rolling restart of all three nodes with graceful
//! SIGTERMs while a 200 ms interval job runs: each stopped leader handed
//! over, every scheduled time appears exactly once, 200 ms apart, and all
//! voters' digests are equal. Refusals that need a fault (failpoints,
//! `KAIROS_FAILPOINT`): a membership change left in its joint configuration
//! (`crash-on-joint` on the leader, `leave-joint` on the rest), a target
//! that cannot catch up (`stall-log-after`), proposals that do not commit
//! (both followers stalled), and ABORTED when the target was asked but no
//! election followed (`ignore-elect`): the old leader leads on.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use kairos_client::pb::{self, cluster_client::ClusterClient};
use kairos_client::{channel, Client};
use kairos_proto::peer::{peer_client::PeerClient, ElectRequest, LocalStatusRequest};
use kairos_tests::{
    add_learner, applied_index, create, every_job, fires_on_without_gap, kairosctl_bin, rejoined,
    restart_with_failpoint, start_ticking, wait_for, Cluster,
};
use tonic::Code;

async fn transfer(c: &Client, id: u64) -> Result<pb::TransferLeaderResponse, tonic::Status> {
    let req = pb::TransferLeaderRequest { id };
    c.call(|ch| async move { ClusterClient::new(ch).transfer_leader(req).await })
        .await
}

fn refused(r: Result<pb::TransferLeaderResponse, tonic::Status>, why: &str) {
    let e = r.expect_err(why);
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(why), "expected {why:?}: {e:?}");
}

/// `kairosctl --output json ARGS` against the cluster; its stdout.
fn kairosctl_json(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = Command::new(kairosctl_bin())
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["--output", "json"])
        .args(args)
        .output()
        .expect("run kairosctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kairosctl {args:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A direct peer `Elect` call to node `to`, claiming to come from node `from`.
async fn elect(cluster: &Cluster, to: u64, from: u64, min: u64) -> tonic::Status {
    // A node just started (a learner added a moment ago) may not listen
    // yet: its refusal is what is asked for, not a failed connection.
    wait_for(
        &format!("node {to} answering an election request"),
        Duration::from_secs(60),
        || async {
            let mut peer = PeerClient::new(channel(&cluster.node(to).peer).unwrap());
            let mut req = tonic::Request::new(ElectRequest {
                min_last_log_index: min,
            });
            req.metadata_mut()
                .insert("x-kairos-node", from.to_string().parse().unwrap());
            let e = peer
                .elect(req)
                .await
                .expect_err("a refused election request");
            (e.code() != Code::Unavailable).then_some(e)
        },
    )
    .await
}

fn log_of(cluster: &Cluster, id: u64) -> String {
    std::fs::read_to_string(cluster.node(id).data.with_extension("log")).unwrap_or_default()
}

async fn leader_is(cluster: &Cluster, id: u64) {
    let c = cluster.client();
    wait_for(
        &format!("node {id} leading"),
        Duration::from_secs(30),
        || async {
            let s = c.status().await.ok()?;
            (s.leader == id && s.nodes.iter().any(|n| n.id == id && n.role == "leader"))
                .then_some(())
        },
    )
    .await;
}

/// Waits until node `id` follows `leader`, as it reports itself.
async fn follows(cluster: &Cluster, id: u64, leader: u64) {
    wait_for(
        &format!("node {id} to follow node {leader}"),
        Duration::from_secs(30),
        || async {
            let mut peer = PeerClient::new(channel(&cluster.node(id).peer).ok()?);
            let s = peer
                .local_status(LocalStatusRequest::default())
                .await
                .ok()?
                .into_inner();
            (s.leader == leader).then_some(())
        },
    )
    .await;
}

/// Waits until every node of `ids` follows the same leader in the same term; returns it.
async fn stable_leader(cluster: &Cluster, ids: &[u64]) -> u64 {
    wait_for(
        "one leader all agree on",
        Duration::from_secs(30),
        || async {
            let mut seen = BTreeSet::new();
            for id in ids {
                let mut peer = PeerClient::new(channel(&cluster.node(*id).peer).ok()?);
                let s = peer
                    .local_status(LocalStatusRequest::default())
                    .await
                    .ok()?
                    .into_inner();
                seen.insert((s.leader, s.term));
            }
            let (leader, _) = *seen.first()?;
            (seen.len() == 1 && leader != 0).then_some(leader)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_to_a_named_voter_and_refusals() {
    let mut cluster = Cluster::start(3, &[]);
    // Under load a second election can follow the first: pick the target
    // only once every node follows the same leader in the same term.
    let leader = stable_leader(&cluster, &[1, 2, 3]).await;
    let c = cluster.client();
    let target = (1..=3).find(|id| *id != leader).unwrap();
    let third = (1..=3).find(|id| *id != leader && *id != target).unwrap();

    let r = transfer(&c, target).await.unwrap();
    assert_eq!((r.leader, r.previous), (target, leader));
    leader_is(&cluster, target).await;

    refused(transfer(&c, target).await, "already the leader");
    refused(transfer(&c, 9).await, "not a member");
    let peer4 = cluster.add_joining_node(4);
    add_learner(&c, 4, &peer4).await.unwrap();
    refused(transfer(&c, 4).await, "learner");

    // The peer call behind it: only from the followed leader, only to a
    // voter, only with the whole log. Node `third` must have heard of the
    // new leader first: while it still follows the old one, this request
    // is from its leader and would start an election.
    follows(&cluster, third, target).await;
    let e = elect(&cluster, third, leader, 0).await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("follows"), "{e:?}");
    let e = elect(&cluster, third, target, u64::MAX).await;
    assert!(e.message().contains("log ends at"), "{e:?}");
    let e = elect(&cluster, 4, target, 0).await;
    assert!(e.message().contains("not a voter"), "{e:?}");

    cluster.kill(third);
    refused(transfer(&c, third).await, "did not answer");
    leader_is(&cluster, target).await;

    // No id: the voter that answers takes over, whatever its lag.
    let v = kairosctl_json(&cluster, &["cluster", "transfer-leader"]);
    assert_eq!(v["previous"], target, "{v}");
    assert_eq!(v["leader"], leader, "{v}");
    leader_is(&cluster, leader).await;
}

/// With five voters the leader and the target are no majority: the leader
/// first lets the other followers' leases run out (heartbeats off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_in_a_five_voter_cluster() {
    let cluster = Cluster::start(5, &[]);
    // As above: a second startup election must not race the first transfer.
    let leader = stable_leader(&cluster, &[1, 2, 3, 4, 5]).await;
    let c = cluster.client();
    for target in (1..=5).filter(|id| *id != leader).take(2) {
        let r = transfer(&c, target).await.unwrap();
        assert_eq!(r.leader, target, "{r:?}");
        leader_is(&cluster, target).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_voter_has_no_one_to_hand_over_to() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    refused(transfer(&cluster.client(), 0).await, "only voter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_hands_over_and_leaves_a_working_cluster() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = start_ticking(&cluster).await;

    let v = kairosctl_json(&cluster, &["cluster", "remove", &leader.to_string()]);
    let rest: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    assert_eq!(v["voters"], serde_json::json!(rest), "{v}");
    assert!(
        log_of(&cluster, leader).contains("handed leadership over to be removed"),
        "the leader handed over before its removal"
    );
    cluster.kill(leader);

    let s = cluster.client().status().await.unwrap();
    let voters: BTreeSet<u64> = s.nodes.iter().filter(|n| n.voter).map(|n| n.id).collect();
    assert_eq!(voters, rest.iter().copied().collect());
    fires_on_without_gap(&cluster, &c, &rest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_with_graceful_stops_fires_every_occurrence_once() {
    let mut cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = start_ticking(&cluster).await;

    let mut left: BTreeSet<u64> = (1..=3).collect();
    let mut handed_over = 0;
    while !left.is_empty() {
        // The current leader first, while it has not been restarted yet.
        let s = c.status().await.unwrap();
        let id = Some(s.leader)
            .filter(|l| left.contains(l))
            .unwrap_or_else(|| *left.first().unwrap());
        left.remove(&id);
        let applied = s.nodes.iter().map(|n| n.applied_index).max().unwrap();
        let status = cluster.terminate(id, Duration::from_secs(20));
        assert!(
            status.is_some_and(|s| s.success()),
            "node {id} stopped: {status:?}"
        );
        if id == s.leader {
            assert!(
                log_of(&cluster, id).contains("stopping: handed leadership over"),
                "leader {id} handed over before stopping"
            );
            handed_over += 1;
        }
        cluster.start_node(id);
        rejoined(&cluster, id, applied).await;
    }
    assert!(handed_over >= 1, "no leader was stopped");

    fires_on_without_gap(&cluster, &c, &[1, 2, 3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_is_refused_while_a_membership_change_is_in_progress() {
    // No leader here finishes a change cut in its joint configuration.
    let mut cluster = Cluster::start_each(3, &[], &|n| {
        n.env
            .push(("KAIROS_FAILPOINT".into(), "leave-joint".into()))
    });
    let first = stable_leader(&cluster, &[1, 2, 3]).await;
    let c = cluster.client();
    // A leader that dies the moment it applies a joint configuration:
    // restart a follower with that failpoint and hand leadership to it.
    let doomed = (1..=3).find(|id| *id != first).unwrap();
    restart_with_failpoint(&mut cluster, doomed, "leave-joint,crash-on-joint").await;
    transfer(&c, doomed).await.unwrap();
    leader_is(&cluster, doomed).await;

    let peer4 = cluster.add_joining_node(4);
    add_learner(&c, 4, &peer4).await.unwrap();
    // Promoting 4 goes through a joint configuration, and its leader dies
    // there; the answer (lost, or refused by the next leader) does not matter.
    let _ = c
        .call(|ch| async move { ClusterClient::new(ch).promote(pb::NodeRef { id: 4 }).await })
        .await;
    let next = wait_for(
        "a new leader with the change in progress",
        Duration::from_secs(30),
        || async {
            let s = c.status().await.ok()?;
            (s.membership_changing && s.leader != 0 && s.leader != doomed).then_some(s.leader)
        },
    )
    .await;
    let target = (1..=3).find(|id| *id != doomed && *id != next).unwrap();
    refused(
        transfer(&c, target).await,
        "a membership change is in progress",
    );
    leader_is(&cluster, next).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_to_a_voter_that_cannot_catch_up_is_refused() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = stable_leader(&cluster, &[1, 2, 3]).await;
    let c = cluster.client();
    // The target answers status but takes no entry past what it has now.
    let target = (1..=3).find(|id| *id != leader).unwrap();
    let stall = applied_index(&cluster).await;
    restart_with_failpoint(&mut cluster, target, &format!("stall-log-after={stall}")).await;
    // Committed by the leader and the third node; the target stays behind.
    create(&c, every_job("slow", "g", 60_000)).await.unwrap();

    refused(
        transfer(&c, target).await,
        &format!("node {target} has not caught up"),
    );
    // Nothing moved; the gate is open again.
    leader_is(&cluster, leader).await;
    create(&c, every_job("after", "g", 60_000)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_is_refused_while_proposals_do_not_commit() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = stable_leader(&cluster, &[1, 2, 3]).await;
    let c = cluster.client();
    // Both followers stop taking entries: nothing commits from now on,
    // while both still answer status.
    let stall = applied_index(&cluster).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &followers {
        restart_with_failpoint(&mut cluster, *id, &format!("stall-log-after={stall}")).await;
    }
    let pending = {
        let c = c.clone();
        tokio::spawn(async move { create(&c, every_job("stuck", "g", 60_000)).await })
    };
    // The write is appended on the leader and waits for a quorum.
    wait_for("a proposal in flight", Duration::from_secs(30), || async {
        let last = cluster.metric(leader, "kairos_raft_last_log_index")?;
        let applied = cluster.metric(leader, "kairos_raft_applied_index")?;
        (last > applied).then_some(())
    })
    .await;
    refused(
        transfer(&c, followers[0]).await,
        "proposals in flight did not commit",
    );
    pending.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_election_does_not_happen_is_aborted() {
    // Every node answers the leader's Elect request without campaigning.
    let cluster = Cluster::start_each(3, &[], &|n| {
        n.env
            .push(("KAIROS_FAILPOINT".into(), "ignore-elect".into()))
    });
    let leader = stable_leader(&cluster, &[1, 2, 3]).await;
    let c = cluster.client();
    let target = (1..=3).find(|id| *id != leader).unwrap();
    let e = transfer(&c, target)
        .await
        .expect_err("no election happened");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    assert!(
        e.message().contains(&format!(
            "node {target} was asked to take over, but no new leader was seen"
        )),
        "{e:?}"
    );
    // The old leader leads on, with heartbeats and writes.
    leader_is(&cluster, leader).await;
    create(&c, every_job("after", "g", 60_000)).await.unwrap();
    assert_eq!(stable_leader(&cluster, &[1, 2, 3]).await, leader);
}
