//! A node whose disk falls below its reserve (`--disk-reserve-mb`) takes no
//! more writes and no leadership, without crashing, and comes back by
//! itself when space returns. The disk is a real one: a 160 MiB tmpfs
//! mounted under node 1's data directory (needs root, as CI is), filled
//! with a file by the test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kairos_tests::{create, every_job, job_ids, wait_for, Cluster};

/// A tmpfs mounted at a directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size_mb: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount(8) runs");
        assert!(
            out.status.success(),
            "this test mounts a tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_below_its_disk_reserve_stops_taking_writes_and_leadership_and_resumes_when_space_returns(
) {
    let mounts = std::sync::Mutex::new(Vec::new());
    let mut cluster = Cluster::start_each(3, &[], &|n| {
        if n.id == 1 {
            mounts.lock().unwrap().push(Tmpfs::mount(&n.data, 160));
        }
    });
    let _mounts = mounts.into_inner().unwrap();
    let c = cluster.client();
    cluster.wait_leader().await;
    create(&c, every_job("before", "disk", 3_600_000))
        .await
        .unwrap();

    // Fill node 1's disk to below the 64 MiB reserve.
    let data = cluster.node(1).data.clone();
    let free = kairos_server::disk::free_bytes(&data).unwrap();
    let filler = data.join("filler");
    let size = free.saturating_sub(16 << 20);
    std::fs::write(&filler, vec![0u8; size as usize]).unwrap();
    let reserve = (64u64 << 20) as f64;
    wait_for(
        "node 1 to read its low disk",
        Duration::from_secs(30),
        || async {
            let free = cluster.metric(1, "kairos_disk_free_bytes")?;
            (free < reserve).then_some(())
        },
    )
    .await;

    // It leads no more (it hands over, or is never elected), the others
    // take writes, and it neither crashes nor takes their entries.
    wait_for("another leader", Duration::from_secs(60), || async {
        let s = cluster.status_via(2).await?;
        (s.leader != 0 && s.leader != 1).then_some(())
    })
    .await;
    for i in 0..20 {
        create(&c, every_job(&format!("during-{i:02}"), "disk", 3_600_000))
            .await
            .unwrap();
    }
    assert_eq!(job_ids(&c, "during-").await.len(), 20);
    let leader_applied = cluster
        .metric(2, "kairos_raft_applied_index")
        .unwrap_or(0.0)
        .max(
            cluster
                .metric(3, "kairos_raft_applied_index")
                .unwrap_or(0.0),
        );
    let low_applied = cluster.metric(1, "kairos_raft_applied_index").unwrap();
    assert!(
        low_applied < leader_applied,
        "node 1 below its reserve took the entries: {low_applied} >= {leader_applied}"
    );
    assert!(!cluster.exited(1), "node 1 stopped on a low disk");

    // Space returns: node 1 catches up by itself.
    std::fs::remove_file(&filler).unwrap();
    wait_for("node 1 to catch up", Duration::from_secs(60), || async {
        let want = cluster.metric(2, "kairos_raft_applied_index")?;
        let got = cluster.metric(1, "kairos_raft_applied_index")?;
        (got >= want && cluster.metric(1, "kairos_disk_free_bytes")? >= reserve).then_some(())
    })
    .await;
    cluster.wait_converged(2, &[1, 2, 3]).await;
    assert!(!cluster.exited(1));
}
