//! A full or failing disk under a running node, on the harness' faulty
//! filesystem (`kairos-lazyfs`, a real FUSE mount at node 1's data
//! directory; needs root and /dev/fuse, as CI has):
//!
//! - `ENOSPC` in the middle of writes: node 1 (with `--disk-reserve-mb 0`,
//!   so the reserve monitor never steps in first) fails a store write or
//!   sync, restarts in place (same process id, no exit), waits for space
//!   without spinning, and catches up on its own once the disk has room;
//! - `EIO` from a sync: node 1 exits with status 74 saying why; after a
//!   power cut of its disk (whatever the failed sync did not make durable
//!   is gone) it is started again, recovers from its log and catches up.
//!
//! In both, every write the cluster acknowledged is on node 1 afterwards,
//! and the three replicas' state digests agree.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use kairos_tests::lazydisk::LazyDisk;
use kairos_tests::{create, every_job, job_ids, wait_for, Cluster};

const JOBS: usize = 10;

fn log_of(data: &Path) -> String {
    std::fs::read_to_string(data.with_extension("log")).unwrap_or_default()
}

/// A 3-node cluster whose node 1 keeps its data on a lazy disk.
fn cluster_with_lazy_node1(node1_args: &[&str]) -> (Cluster, LazyDisk) {
    let disk = Mutex::new(None);
    let cluster = Cluster::start_each(3, &[], &|n| {
        if n.id == 1 {
            *disk.lock().unwrap() = Some(LazyDisk::mount(&n.data, 1_024));
            n.args.extend(node1_args.iter().map(|a| a.to_string()));
        }
    });
    let disk = disk.into_inner().unwrap().expect("node 1's disk");
    (cluster, disk)
}

/// Creates `JOBS` jobs named `prefix-NN`, retrying each until the cluster
/// acknowledges it (a leader change may refuse one on the way).
async fn create_acked(cluster: &Cluster, prefix: &str) {
    let c = cluster.client();
    for i in 0..JOBS {
        let id = format!("{prefix}-{i:02}");
        wait_for(
            &format!("{id} acknowledged"),
            Duration::from_secs(60),
            || async {
                match create(&c, every_job(&id, "disk", 3_600_000)).await {
                    Ok(_) => Some(()),
                    Err(s) if s.code() == tonic::Code::AlreadyExists => Some(()),
                    Err(_) => None,
                }
            },
        )
        .await;
    }
}

/// Node 1 holds every job of `prefixes` and the replicas agree.
async fn node1_caught_up(cluster: &Cluster, prefixes: &[&str]) {
    let on1 = cluster.client_of(1);
    for p in prefixes {
        wait_for(
            &format!("node 1 to hold the {p} jobs"),
            Duration::from_secs(60),
            || async { (job_ids(&on1, &format!("{p}-")).await.len() == JOBS).then_some(()) },
        )
        .await;
    }
    let nodes = cluster.wait_converged(2, &[1, 2, 3]).await;
    let digests: std::collections::BTreeSet<_> =
        nodes.iter().map(|n| n.state_digest.clone()).collect();
    assert_eq!(digests.len(), 1, "replicas differ: {nodes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enospc_mid_write_restarts_the_node_in_place_and_it_catches_up_when_space_returns() {
    let (mut cluster, mut disk) = cluster_with_lazy_node1(&["--disk-reserve-mb", "0"]);
    cluster.wait_leader().await;
    create_acked(&cluster, "before").await;
    let pid = cluster.pid(1).expect("node 1 runs");
    let data = cluster.node(1).data.clone();

    disk.ctl().disk_full(true).unwrap();
    // The others go on taking writes; node 1's next write or sync fails.
    create_acked(&cluster, "during").await;
    wait_for(
        "node 1 to restart in place and wait for space",
        Duration::from_secs(60),
        || async {
            let log = log_of(&data);
            (log.contains("restarting in place") && log.contains("waiting for space")).then_some(())
        },
    )
    .await;
    assert!(!cluster.exited(1), "node 1 exited: {}", log_of(&data));
    assert_eq!(
        cluster.pid(1),
        Some(pid),
        "a restart in place keeps the pid"
    );

    disk.ctl().disk_full(false).unwrap();
    node1_caught_up(&cluster, &["before", "during"]).await;
    let log = log_of(&data);
    assert_eq!(
        log.matches("restarting in place").count(),
        1,
        "one restart, no loop:\n{log}"
    );
    assert!(log.contains("disk space is back"), "{log}");
    assert!(!cluster.exited(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eio_from_a_sync_stops_the_node_with_status_74_and_a_restart_recovers_from_its_log() {
    let (mut cluster, mut disk) = cluster_with_lazy_node1(&[]);
    cluster.wait_leader().await;
    create_acked(&cluster, "before").await;
    let data = cluster.node(1).data.clone();

    disk.ctl().disk_error().unwrap();
    create_acked(&cluster, "during").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !cluster.exited(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 did not stop after EIO:\n{}",
            log_of(&data)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = cluster.terminate(1, Duration::from_secs(5)).unwrap();
    assert_eq!(status.code(), Some(74), "{}", log_of(&data));
    let log = log_of(&data);
    assert!(
        log.contains("exiting with status 74") && log.contains("Input/output error"),
        "the reason is said:\n{log}"
    );

    // What the failed sync did not make durable may be gone: cut the power.
    disk.ctl().power(false).unwrap();
    create_acked(&cluster, "while-down").await;
    cluster.start_node(1);
    node1_caught_up(&cluster, &["before", "during", "while-down"]).await;
    assert!(!cluster.exited(1), "{}", log_of(&data));
}
