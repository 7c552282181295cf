//! Issue #12: backup and restore. `kairosctl snapshot save` streams a fresh
//! point-in-time snapshot from the leader of cluster A; `kairos snapshot
//! inspect` verifies it. A truncated copy and one with a flipped byte are
//! refused by a new cluster B and write nothing; the good file restores A's
//! jobs, runs and timers into B, the restored interval job fires on in B
//! with no gap or double, B's voters agree, and a second restore is refused.
//! Offline (`kairos restore`), the same file prepares the data directories
//! of cluster C before it starts (damaged copies and non-empty directories
//! are refused and leave nothing behind), and C fires on from the backup.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kairos_client::{pb, Client};
use kairos_server::core::command::LOG_FORMAT;
use kairos_tests::{
    assert_no_gap_no_double, create, every_job, job_history, kairos_bin, outcome, wait_for, Cluster,
};

/// `kairos restore --from FILE --data-dir DIR`: (success, output).
fn kairos_restore(file: &Path, data_dir: &Path) -> (bool, String) {
    let out = Command::new(kairos_bin())
        .arg("restore")
        .arg("--from")
        .arg(file)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("run kairos restore");
    outcome(&out)
}

async fn job_ids(c: &Client) -> Vec<String> {
    let r = c
        .jobs(|mut j| async move { j.list_jobs(pb::ListJobsRequest::default()).await })
        .await
        .unwrap();
    r.jobs
        .into_iter()
        .map(|j| j.spec.unwrap_or_default().id)
        .collect()
}

fn damaged_copies(good: &Path, dir: &Path) -> [(std::path::PathBuf, &'static str); 2] {
    let bytes = std::fs::read(good).unwrap();
    let truncated = dir.join("truncated.snap");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let flipped = dir.join("flipped.snap");
    let mut b = bytes.clone();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&flipped, b).unwrap();
    [(truncated, "truncated"), (flipped, "flipped byte")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_into_a_new_cluster_and_damaged_ones_are_refused() {
    let a = Cluster::start(3, &[]);
    let leader = a.wait_leader().await;
    // Jobs whose records imply their create's revision (log format 5).
    a.wait_log_format(leader, LOG_FORMAT).await;
    let ca = a.client();
    create(&ca, every_job("tick", "none", 200)).await.unwrap();
    create(&ca, every_job("hourly", "none", 3_600_000))
        .await
        .unwrap();
    wait_for("some fires in A", Duration::from_secs(30), || async {
        (ca.list_runs("tick", 1000).await.ok()?.len() >= 10).then_some(())
    })
    .await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.snap");
    let (ok, text) = a.kairosctl(&["snapshot", "save", file.to_str().unwrap()]);
    assert!(ok, "{text}");
    let in_backup = ca.list_runs("tick", 100_000).await.unwrap().len();
    let inspect = Command::new(kairos_bin())
        .args(["snapshot", "inspect"])
        .arg(&file)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "{report}");
    assert!(
        report.contains("jobs") && report.contains("sha256"),
        "{report}"
    );
    drop(a);

    let b = Cluster::start(3, &[]);
    b.wait_leader().await;
    let cb = b.client();
    for (bad, what) in damaged_copies(&file, dir.path()) {
        let (ok, text) = b.kairosctl(&["snapshot", "restore", bad.to_str().unwrap()]);
        assert!(!ok, "{what} copy was restored: {text}");
        assert!(text.contains("backup file"), "{what}: {text}");
        assert!(job_ids(&cb).await.is_empty(), "{what} copy wrote something");
    }

    let (ok, text) = b.kairosctl(&["snapshot", "restore", file.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert_eq!(
        job_ids(&cb).await,
        vec!["hourly".to_string(), "tick".to_string()]
    );
    assert_eq!(
        job_history(&cb, "hourly").await,
        vec![(1, "create".to_string(), String::new())]
    );
    let restored = cb.list_runs("tick", 100_000).await.unwrap().len();
    assert!(restored >= 10, "runs of the backup: {restored}");
    wait_for("tick to fire on in B", Duration::from_secs(30), || async {
        let n = cb.list_runs("tick", 100_000).await.ok()?.len();
        (n >= restored + 10).then_some(())
    })
    .await;
    // Misfire fire-all: the occurrences missed between backup and restore fire late, in order.
    let runs = cb.list_runs("tick", 100_000).await.unwrap();
    assert_no_gap_no_double(&runs, 200);
    assert!(runs.len() >= in_backup);

    let via = b.wait_leader().await;
    let nodes = b.wait_converged(via, &[1, 2, 3]).await;
    assert!(
        nodes
            .iter()
            .all(|n| n.state_digest == nodes[0].state_digest),
        "{nodes:?}"
    );
    let (ok, text) = b.kairosctl(&["snapshot", "restore", file.to_str().unwrap()]);
    assert!(!ok && text.contains("already holds jobs"), "{text}");
    drop(b);

    // Offline into cluster C: damaged files write nothing.
    let scratch = dir.path().join("scratch");
    for (bad, what) in damaged_copies(&file, dir.path()) {
        let (ok, text) = kairos_restore(&bad, &scratch);
        assert!(!ok && text.contains("backup file"), "{what}: {text}");
        assert!(!scratch.exists(), "{what} copy left a data directory");
    }
    let c = Cluster::start_each(3, &[], &|n| {
        let (ok, text) = kairos_restore(&file, &n.data);
        assert!(ok && text.contains("records restored"), "{text}");
        let (ok, text) = kairos_restore(&file, &n.data);
        assert!(!ok && text.contains("not empty"), "{text}");
    });
    c.wait_leader().await;
    let cc = c.client();
    assert_eq!(
        job_ids(&cc).await,
        vec!["hourly".to_string(), "tick".to_string()]
    );
    let restored = cc.list_runs("tick", 100_000).await.unwrap().len();
    assert!(restored >= 10, "runs of the backup: {restored}");
    wait_for("tick to fire on in C", Duration::from_secs(30), || async {
        let n = cc.list_runs("tick", 100_000).await.ok()?.len();
        (n >= restored + 10).then_some(())
    })
    .await;
    assert_no_gap_no_double(&cc.list_runs("tick", 100_000).await.unwrap(), 200);
    let via = c.wait_leader().await;
    let nodes = c.wait_converged(via, &[1, 2, 3]).await;
    assert!(
        nodes
            .iter()
            .all(|n| n.state_digest == nodes[0].state_digest),
        "{nodes:?}"
    );
    drop(c);

    // Cluster D with node 3 left empty: node 1 does not bootstrap a cluster
    // whose fresh members hold different state.
    let d = Cluster::start_each(3, &[], &|n| {
        if n.id != 3 {
            let (ok, text) = kairos_restore(&file, &n.data);
            assert!(ok, "{text}");
        }
    });
    let log = d.node(1).data.with_extension("log");
    wait_for(
        "node 1 to refuse bootstrapping",
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            async move { text.contains("hold different state").then_some(()) }
        },
    )
    .await;
    let s = d.client_of(1).status().await.unwrap();
    assert_eq!(s.leader, 0, "a leader was elected: {s:?}");
}
