//! A node whose wall clock runs 60 s fast (libfaketime) becomes leader
//! while clients keep writing to it. Until it has measured a quorum's
//! clocks it must not stamp its own time into commands: state-machine time
//! never goes back, so one such stamp would move it 60 s ahead for good
//! (and on-time fires would then be judged late). Every write it accepts,
//! and the state time afterwards, stays within seconds of the real time.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kairos_client::pb;
use kairos_tests::{create, wait_for, Cluster};

const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
const SKEW_MS: i64 = 60_000;
/// Far below the skew, far above scheduling and RPC delays.
const TOLERANCE_MS: i64 = 10_000;

fn real_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_millis() as i64
}

fn one_shot(id: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(30_000)),
        }),
        group: "clock".into(),
        ..Default::default()
    }
}

/// Writes to node 3 alone in a loop until `stop`; returns (created_at, next_fire_at, real time
/// after the answer) of each job created.
fn hammer(
    cluster: &Cluster,
    task: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(i64, i64, i64)>> {
    let c = cluster.client_of(3);
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            if let Ok(j) = create(&c, one_shot(&format!("w{task}-{i}"))).await {
                out.push((j.created_at_ms, j.next_fire_at_ms, real_now_ms()));
            }
        }
        out
    })
}

async fn leader_via_3(cluster: &Cluster) -> Option<u64> {
    let s = cluster.status_via(3).await?;
    Some(s.nodes.iter().find(|n| n.role == "leader")?.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_60s_fast_cannot_stamp_its_clock_into_the_state() {
    assert!(
        Path::new(FAKETIME_LIB).exists(),
        "\n\n*** libfaketime is not installed ({FAKETIME_LIB}); this test needs it: \
         apt-get install faketime (CI installs it) ***\n"
    );
    // Node 3 runs 60 s fast and times out first; nodes 1 and 2 wait long
    // before standing, so node 3 becomes leader (now or after a kill).
    let cluster = Cluster::start_each(3, &[], &|n| {
        if n.id == 3 {
            n.env = [
                ("LD_PRELOAD", FAKETIME_LIB),
                ("FAKETIME", "+60s"),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
                ("FAKETIME_NO_CACHE", "1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec();
        } else {
            n.args = ["--election-min-ms", "2000", "--election-max-ms", "3000"]
                .map(String::from)
                .to_vec();
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4).map(|t| hammer(&cluster, t, stop.clone())).collect();
    let first = cluster.wait_leader().await;
    let mut cluster = cluster;
    if first != 3 {
        cluster.kill(first);
    }
    wait_for("node 3 to lead", Duration::from_secs(60), || async {
        (leader_via_3(&cluster).await? == 3).then_some(())
    })
    .await;
    let accepted = Arc::new(Mutex::new(Vec::new()));
    // Keep writing through node 3's first seconds as leader.
    let c = cluster.client_of(3);
    wait_for(
        "writes accepted by node 3",
        Duration::from_secs(60),
        || async {
            let j = create(&c, one_shot(&format!("probe-{}", real_now_ms())))
                .await
                .ok()?;
            let mut a = accepted.lock().unwrap();
            a.push((j.created_at_ms, j.next_fire_at_ms, real_now_ms()));
            (a.len() >= 20).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut all = accepted.lock().unwrap().clone();
    for t in tasks {
        all.extend(t.await.expect("writer"));
    }
    assert!(!all.is_empty());
    for (created, next_fire, answered) in &all {
        assert!(
            *created <= answered + TOLERANCE_MS,
            "a write stamped {} ms ahead of real time (node 3 runs {SKEW_MS} ms fast)",
            created - answered
        );
        assert_eq!(next_fire - created, 30_000, "after 30s from state time");
    }
    // State time now (it is the max of every stamp applied so far).
    let last = create(&cluster.client(), one_shot("last")).await.unwrap();
    let ahead = last.created_at_ms - real_now_ms();
    assert!(
        ahead <= TOLERANCE_MS,
        "state-machine time is {ahead} ms ahead of real time"
    );
    assert!(
        cluster
            .metric(3, "kairos_cluster_time_offset_seconds")
            .unwrap_or(0.0)
            < -(SKEW_MS as f64) / 2000.0,
        "node 3 measured no offset: was it really 60 s fast?"
    );
}
