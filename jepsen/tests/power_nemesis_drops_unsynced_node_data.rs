//! The power nemesis against a running two-slot cluster on real lazy disks
//! (kairos-lazyfs daemons, FUSE mounts): each node writes one file it
//! fsyncs (with its directory) and one it does not; after the nemesis' power
//! cuts and the restart at heal, the synced file is intact, the unsynced one
//! held only what the restarted node wrote again, and the history's event
//! says what each disk lost.
//!
//! The nodes are a shell stand-in for `kairos serve` (they take its command
//! line and only write those two files): what is under test is the nemesis,
//! the cluster's disks and the filesystem, all real. Needs root, /dev/fuse
//! and the kairos-lazyfs binary (built by any workspace build); without them
//! it fails, saying which is missing.

use kairos_jepsen::client::{self, Node, Security};
use kairos_jepsen::clock::Clock;
use kairos_jepsen::cluster::{Cluster, NodeSpec};
use kairos_jepsen::disk::DiskConfig;
use kairos_jepsen::event::{Event, Phase};
use kairos_jepsen::generator::{Fault, PlannedFault, PowerScope, Target};
use kairos_jepsen::nemesis::Nemesis;
use kairos_jepsen::recorder::Recorder;
use rand::SeedableRng;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODE: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = --data-dir ]; then dir=$2; fi
  shift
done
if [ ! -e "$dir/durable" ]; then
  echo kept > "$dir/durable"
  sync "$dir/durable" "$dir"
fi
echo boot >> "$dir/boots"
exec sleep 600
"#;

fn lazyfs_bin() -> PathBuf {
    let bin = match std::env::var_os(kairos_jepsen::disk::ENV_BIN) {
        Some(b) => PathBuf::from(b),
        // target/debug/deps/<this test> -> target/debug/kairos-lazyfs
        None => std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .with_file_name("kairos-lazyfs"),
    };
    assert!(
        bin.is_file(),
        "{} missing: build it first (cargo build -p kairos-lazyfs)",
        bin.display()
    );
    bin
}

fn require_fuse() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test mounts FUSE and must run as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test needs /dev/fuse (FUSE)"
    );
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn cluster(dir: &Path) -> Cluster {
    let node = dir.join("node.sh");
    std::fs::write(&node, NODE).unwrap();
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o755)).unwrap();
    let specs = (1..=2u64)
        .map(|id| NodeSpec::fake(id, &dir.join(format!("n{id}"))))
        .collect();
    let disks = DiskConfig {
        bin: lazyfs_bin(),
        seed: 5,
        size_mb: 64,
    };
    Cluster::with_disks(node, "test".into(), specs, false, Some(disks)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cuts_drop_what_the_nodes_did_not_sync() {
    require_fuse();
    let dir = std::env::temp_dir().join(format!("kj-power-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = Arc::new(cluster(&dir));
    cluster.start_all().unwrap();
    for i in 0..2 {
        let boots = cluster.nodes[i].data_dir(i as u64 + 1).join("boots");
        wait_for("each node booted", || read(&boots) == "boot\n");
        let s = cluster.disk_status(i).unwrap();
        assert_eq!(
            (s.unsynced_bytes, s.unsynced_files),
            (5, 1),
            "only boots is unsynced: {s:?}"
        );
    }

    let nodes = (0..2)
        .map(|i| {
            let addr = cluster.nodes[i].listen.clone();
            Node::new(
                i,
                i as u64 + 1,
                addr.clone(),
                client::channel(&addr, &Security::default()).unwrap(),
            )
        })
        .collect();
    let rec = Recorder::create(&dir.join("history.jsonl"), Clock::new()).unwrap();
    let rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut nemesis = Nemesis::new(cluster.clone(), None, Arc::new(nodes), rec.clone(), rng);
    let plan = [
        Fault::Power {
            scope: PowerScope::One(Target::Node(0)),
            tear: false,
        },
        Fault::Power {
            scope: PowerScope::All,
            tear: true,
        },
    ]
    .map(|fault| PlannedFault {
        at_ms: 0,
        hold_ms: 0,
        fault,
    });
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    // The second cut finds slot 0 rebooted once more: wait for that between them.
    nemesis
        .run_plan(
            plan[..1].to_vec(),
            tokio::time::Instant::now(),
            stop_rx.clone(),
        )
        .await;
    let boots0 = cluster.nodes[0].data_dir(1).join("boots");
    wait_for("node 1 rebooted after the first cut", || {
        read(&boots0) == "boot\n"
    });
    nemesis
        .run_plan(plan[1..].to_vec(), tokio::time::Instant::now(), stop_rx)
        .await;
    rec.sync().await;

    for i in 0..2 {
        let data = cluster.nodes[i].data_dir(i as u64 + 1);
        wait_for("the nodes rebooted", || {
            read(&data.join("boots")) == "boot\n"
        });
        assert_eq!(
            read(&data.join("durable")),
            "kept\n",
            "synced data survived"
        );
        assert_eq!(cluster.disk_status(i).unwrap().powers, [2, 1][i]);
    }

    let events: Vec<_> = read(&dir.join("history.jsonl"))
        .lines()
        .filter_map(|l| match serde_json::from_str(l).unwrap() {
            Event::Nemesis(n) if n.phase == Phase::Start => Some(n),
            _ => None,
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["power-node", "power-all-torn"], "{events:?}");
    assert_eq!(events[0].fault, "power");
    assert_eq!(events[0].nodes, [1]);
    assert_eq!(events[1].nodes, [1, 2]);
    let lost = "1 files, 5 bytes, 1 namespace ops, 1 inodes dropped";
    assert!(
        events[0].detail.contains(&format!("node 1: {lost}")),
        "{}",
        events[0].detail
    );
    for id in [1, 2] {
        assert!(
            events[1].detail.contains(&format!("node {id}: {lost}")),
            "{}",
            events[1].detail
        );
    }
    cluster.shutdown();
    assert!(
        !kairos_jepsen::clean::unmount_if_mounted(&cluster.nodes[0].disk_root()),
        "unmounted by shutdown"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
