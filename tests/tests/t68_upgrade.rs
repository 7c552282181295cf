//! Rolling upgrade between two real binaries: the previous release (the
//! commit in `deploy/PREVIOUS_RELEASE`, built by `.ci/previous-release`)
//! and this tree's. A 3-node cluster of the previous release runs a 200 ms
//! interval job; each node in turn is stopped gracefully and started with
//! the new binary on the same data directory. Every scheduled time fires
//! exactly once, 200 ms apart, the digests agree, what the previous release
//! wrote in its own newest format (a job's labels, bounds and pause note:
//! log entries and record tails) reads back whole, and the cluster's active
//! log format rises only once every member reads the new one. Going back to
//! the previous release after that is refused loudly by the old binary
//! (it stops applying at the first newer entry, naming both formats) and a
//! learner of the previous release is not added. The SDK's batch create
//! still works against the previous release (one call per job).

use std::time::Duration;

use kairos_client::{pb, Client};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{
    add_learner, create, every_job, fires_on_without_gap, get_job, previous_release_bin, rejoined,
    start_ticking, wait_for, Cluster,
};
use tonic::Code;

/// The newest log format the previous release (`deploy/PREVIOUS_RELEASE`)
/// reads, as it reports it. Update with that file.
const PREVIOUS_READS: u32 = 3;

fn log_of(cluster: &Cluster, id: u64) -> String {
    std::fs::read_to_string(cluster.node(id).data.with_extension("log")).unwrap_or_default()
}

/// Gracefully stops node `id` and starts it again with `bin` (None: this
/// tree's) on the same data directory, then waits until it has caught up.
async fn restart_with(cluster: &mut Cluster, id: u64, bin: Option<std::path::PathBuf>) {
    let s = cluster.client().status().await.unwrap();
    let applied = s.nodes.iter().map(|n| n.applied_index).max().unwrap();
    let status = cluster.terminate(id, Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "node {id} stopped: {status:?}"
    );
    cluster.node_mut(id).bin = bin;
    cluster.start_node(id);
    rejoined(cluster, id, applied).await;
}

/// The cluster's active log format and what each node reads, asked of node `via`.
async fn formats(cluster: &Cluster, via: u64) -> Option<(u32, Vec<(u64, u32)>)> {
    let s = cluster.status_via(via).await?;
    let reads = s.nodes.iter().map(|n| (n.id, n.log_format_max)).collect();
    Some((s.log_format, reads))
}

/// A job with a label and a run limit: the previous release's newest log
/// format (3), an extension entry and a record tail of its own.
fn labelled(id: &str) -> pb::JobSpec {
    let mut spec = every_job(id, "g", 60_000);
    spec.job_labels.insert("team".into(), "pay".into());
    spec.max_runs = Some(1000);
    spec
}

/// A job with jitter: only this release's log format (4) carries it.
fn jittered(id: &str) -> pb::JobSpec {
    let mut spec = every_job(id, "g", 60_000);
    spec.jitter_ms = Some(5_000);
    spec
}

/// Pauses `id` with a note (log format 3).
async fn pause_noted(c: &Client, id: &str) {
    let r = pb::PauseJobRequest {
        id: id.into(),
        note: format!("{id} paused"),
    };
    c.jobs(|mut j| {
        let r = r.clone();
        async move { j.pause_job(r).await }
    })
    .await
    .unwrap_or_else(|e| panic!("pause {id}: {e}"));
}

/// What `labelled` and `pause_noted` wrote, read back.
async fn assert_labelled_and_paused(c: &Client, id: &str) {
    let job = get_job(c, id).await;
    let spec = job.spec.clone().unwrap();
    assert_eq!(
        (
            spec.job_labels.get("team").map(String::as_str),
            spec.max_runs
        ),
        (Some("pay"), Some(1000)),
        "{job:?}"
    );
    assert_eq!(job.pause_note, format!("{id} paused"), "{job:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_the_previous_release_fires_every_occurrence_once() {
    let old = previous_release_bin();
    let mut cluster = Cluster::start_each(3, &[], &|n| n.bin = Some(old.clone()));
    cluster.wait_leader().await;
    let c = start_ticking(&cluster).await;
    // Written by the previous release in its newest format.
    create(&c, labelled("before")).await.unwrap();
    pause_noted(&c, "before").await;
    // The SDK's batch create falls back to one CreateJob per job on a
    // leader that does not know CreateJobs.
    let specs = vec![
        every_job("old-0", "g", 60_000),
        every_job("old-1", "g", 60_000),
    ];
    let made = c.create_job_batch(specs).await.unwrap();
    let ids: Vec<_> = made
        .iter()
        .map(|r| r.as_ref().unwrap().spec.as_ref().unwrap().id.clone())
        .collect();
    assert_eq!(ids, ["old-0", "old-1"]);
    assert_eq!(get_job(&c, "old-1").await.revision, 1);

    // The leader first, as an operator would not know better; then the rest.
    let first = c.status().await.unwrap().leader;
    let order: Vec<u64> = std::iter::once(first)
        .chain((1..=3).filter(|id| *id != first))
        .collect();
    for (i, id) in order.iter().enumerate() {
        restart_with(&mut cluster, *id, None).await;
        if i < 2 {
            // Mixed: the new nodes report what they read, the old ones
            // theirs, and the old format stays active.
            let (active, reads) = formats(&cluster, *id).await.unwrap();
            assert_eq!(active, PREVIOUS_READS, "{reads:?}");
            for (n, r) in &reads {
                let want = if order[..=i].contains(n) {
                    LOG_FORMAT
                } else {
                    PREVIOUS_READS
                };
                assert_eq!(*r, want, "node {n} reads: {reads:?}");
            }
            if i == 0 {
                // Written at the old format by whichever binary leads,
                // applied by both.
                create(&c, labelled("mixed")).await.unwrap();
                pause_noted(&c, "mixed").await;
            }
        }
    }
    cluster.wait_log_format(first, LOG_FORMAT).await;
    for id in ["before", "mixed"] {
        assert_labelled_and_paused(&c, id).await;
    }
    let job = create(&c, jittered("jittered")).await.unwrap();
    assert_eq!(job.spec.unwrap().jitter_ms, Some(5_000));
    fires_on_without_gap(&cluster, &c, &[1, 2, 3]).await;
    let s = c.status().await.unwrap();
    assert!(s.nodes.iter().all(|n| n.refusal.is_empty()), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_member_runs_the_previous_release_a_new_leader_refuses_what_it_could_not_read() {
    let old = previous_release_bin();
    let mut cluster = Cluster::start_each(3, &[], &|n| {
        if n.id == 3 {
            n.bin = Some(old.clone());
        }
    });
    let mut leader = cluster.wait_leader().await;
    if leader == 3 {
        // The old node leads: stop it until a new one does.
        cluster.terminate(3, Duration::from_secs(20));
        leader = cluster.wait_leader().await;
        cluster.start_node(3);
    }
    // Both binaries read format 3: the leader activates it within a second
    // or so of the cluster forming; the refusal below is against it.
    cluster.wait_log_format(leader, PREVIOUS_READS).await;
    let c = cluster.client_of(leader);
    let e = create(&c, jittered("jittered"))
        .await
        .expect_err("node 3 could not read it");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Jitter is log format 4's.
    let want =
        format!("needs log format 4, but the cluster's active log format is {PREVIOUS_READS}");
    assert!(e.message().contains(&want), "{e:?}");
    // Nothing was written, and what the old format has is still taken.
    let plain = create(&c, every_job("jittered", "g", 60_000))
        .await
        .unwrap();
    assert_eq!(plain.spec.unwrap().jitter_ms, None);
    create(&c, labelled("labelled")).await.unwrap();
    pause_noted(&c, "labelled").await;
    assert_labelled_and_paused(&c, "labelled").await;
    let s = c.status().await.unwrap();
    assert_eq!(s.log_format, PREVIOUS_READS, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_activation_the_previous_release_refuses_newer_entries_loudly() {
    let old = previous_release_bin();
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    cluster.wait_log_format(leader, LOG_FORMAT).await;

    // A learner of the previous release is not added.
    let peer4 = cluster.add_joining_node(4);
    cluster.terminate(4, Duration::from_secs(10));
    cluster.node_mut(4).bin = Some(old.clone());
    cluster.start_node(4);
    let e = add_learner(&cluster.client(), 4, &peer4)
        .await
        .expect_err("a learner of the previous release is refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let want = format!(
        "reads log formats up to {PREVIOUS_READS}, but the cluster's active log format is {LOG_FORMAT}"
    );
    assert!(e.message().contains(&want), "{e:?}");
    // Nor a node that does not answer (nothing listens there now).
    cluster.terminate(4, Duration::from_secs(10));
    let e = add_learner(&cluster.client(), 5, &peer4)
        .await
        .expect_err("a node that does not answer is refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("node 5 at"), "{e:?}");
    assert!(e.message().contains("did not answer within"), "{e:?}");
    let s = cluster.client().status().await.unwrap();
    assert!(s.nodes.iter().all(|n| n.id <= 3), "nothing added: {s:?}");

    // A follower taken back to the previous release: it stops at the
    // first newer entry, naming both formats, and applies nothing of it.
    let back = (1..=3).find(|id| *id != leader).unwrap();
    cluster.terminate(back, Duration::from_secs(20));
    cluster.node_mut(back).bin = Some(old);
    cluster.start_node(back);
    let c = start_ticking(&cluster).await;
    let want =
        format!("has format version {LOG_FORMAT}, newer than this binary's {PREVIOUS_READS}");
    wait_for(
        "the old binary to refuse a newer entry",
        Duration::from_secs(30),
        || async { log_of(&cluster, back).contains(&want).then_some(()) },
    )
    .await;
    let rest: Vec<u64> = (1..=3).filter(|id| *id != back).collect();
    fires_on_without_gap(&cluster, &c, &rest).await;
    let s = cluster.status_via(leader).await.unwrap();
    let behind = s.nodes.iter().find(|n| n.id == back).unwrap();
    let ahead = s.nodes.iter().find(|n| n.id == leader).unwrap();
    assert!(
        behind.applied_index < ahead.applied_index,
        "node {back} applied nothing past the refused entry: {s:?}"
    );
}
