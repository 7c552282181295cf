//! Data lifecycle on a real 3-node cluster: a job created with
//! `kairosctl job create --keep-runs 3 --keep-for 1h` ends with its three
//! newest finished runs, on every node; the 2048 runs of a deleted job are
//! removed by the leader's housekeeping (in bounded steps) on every node,
//! whose digests stay equal; a data directory of a newer format is
//! refused at start, both versions named, and left as it was; and a node
//! runs with transparent huge pages off, so what it touches is what is
//! resident.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_client::worker::{Outcome, Task, Worker};
use kairos_client::{pb, Client};
use kairos_server::core::keys::STATE_VERSION;
use kairos_tests::{create, every_job, get_job, kairos_bin, wait_for, Cluster};

async fn trigger(c: &Client, id: &str) {
    let r = pb::JobRef { id: id.into() };
    c.jobs(|mut j| {
        let r = r.clone();
        async move { j.trigger_job(r).await }
    })
    .await
    .unwrap_or_else(|e| panic!("trigger {id}: {e}"));
}

/// Waits until every node's own state lists exactly `want` runs of `job`,
/// each finished; returns the first node's list.
async fn runs_on_every_node(cluster: &Cluster, job: &str, want: usize) -> Vec<pb::Run> {
    let c = cluster.client();
    let what = format!("{want} finished runs of {job} on every node");
    wait_for(&what, Duration::from_secs(60), || async {
        let mut first = None;
        for n in &cluster.nodes {
            let runs = c.list_runs_local(&n.addr, job, want + 10).await.ok()?;
            let finished = runs.iter().all(|r| {
                let done = [pb::RunState::Succeeded, pb::RunState::Cancelled];
                done.iter().any(|s| *s as i32 == r.state)
            });
            if runs.len() != want || !finished {
                return None;
            }
            first.get_or_insert(runs);
        }
        first
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_limits_hold_and_a_deleted_jobs_runs_go_on_every_node() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_leader().await;
    let c = cluster.client();
    let worker = Worker::connect(cluster.endpoints(), "g")
        .capacity(8)
        .id("w-keep");
    let handle = tokio::spawn(worker.run(|_t: Task| async { Outcome::Success(b"ok".to_vec()) }));

    // Limits through kairosctl: set on create, shown by get, checked.
    let create_args = [
        "job",
        "create",
        "keep3",
        "--every",
        "100ms",
        "--group",
        "g",
        "--keep-runs",
        "3",
        "--keep-for",
        "1h",
    ];
    let (ok, out) = cluster.kairosctl(&create_args);
    assert!(ok && out.contains("3 runs/1h"), "{out}");
    let (ok, out) = cluster.kairosctl(&["--output", "json", "job", "get", "keep3"]);
    assert!(ok, "{out}");
    let got: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (&got[0]["keep_runs"], &got[0]["keep_for_ms"]),
        (&serde_json::json!(3), &serde_json::json!(3_600_000)),
        "{out}"
    );
    let too_many = [
        "job",
        "create",
        "bad",
        "--every",
        "1s",
        "--group",
        "g",
        "--keep-runs",
        "100001",
    ];
    let (ok, out) = cluster.kairosctl(&too_many);
    assert!(!ok, "{out}");
    assert!(
        out.contains("keep_runs: must be between 1 and 100000, got 100001"),
        "{out}"
    );

    // Ten occurrences at least, then stop it: three finished runs stay.
    let created = get_job(&c, "keep3").await.created_at_ms;
    wait_for(
        "keep3 to run ten times",
        Duration::from_secs(60),
        || async {
            let runs = c.list_runs("keep3", 10).await.ok()?;
            runs.first()
                .filter(|r| r.scheduled_at_ms >= created + 1000)
                .map(|_| ())
        },
    )
    .await;
    let (ok, out) = cluster.kairosctl(&["job", "pause", "keep3"]);
    assert!(ok, "{out}");
    let kept = runs_on_every_node(&cluster, "keep3", 3).await;
    let ok = pb::RunState::Succeeded as i32;
    assert!(kept.iter().all(|r| r.state == ok), "{kept:?}");
    assert!(kept
        .windows(2)
        .all(|w| w[1].scheduled_at_ms - w[0].scheduled_at_ms == 100));

    // 2048 runs of a job no worker serves, then the job is deleted: its
    // cancelled runs are removed by housekeeping (1024 per entry).
    let mut doomed = every_job("doomed", "nobody", 3_600_000);
    doomed.shards = Some(1024);
    create(&c, doomed).await.unwrap();
    for n in [1024, 2048] {
        trigger(&c, "doomed").await;
        wait_for("the triggered shards", Duration::from_secs(60), || async {
            let runs = c.list_runs("doomed", 3000).await.ok()?;
            (runs.len() == n).then_some(())
        })
        .await;
    }
    let (ok, out) = cluster.kairosctl(&["job", "delete", "doomed"]);
    assert!(ok, "{out}");
    runs_on_every_node(&cluster, "doomed", 0).await;
    assert_eq!(runs_on_every_node(&cluster, "keep3", 3).await, kept);

    let nodes = cluster.wait_converged(leader, &[1, 2, 3]).await;
    let d0 = &nodes[0].state_digest;
    assert!(
        !d0.is_empty() && nodes.iter().all(|n| &n.state_digest == d0),
        "digests differ at the same index: {nodes:?}"
    );
    handle.abort();
}

/// Starts `kairos serve` on node `id`'s ports and data directory and
/// returns its exit status and stderr once it exits (it must, within 60 s).
fn serve_until_exit(cluster: &Cluster, id: u64) -> (std::process::ExitStatus, String) {
    let n = cluster.node(id);
    let peers = format!("{id}={}", n.peer);
    let log = n.data.with_extension("refused.log");
    let mut child = Command::new(kairos_bin())
        .args(["serve", "--id", &id.to_string(), "--listen", &n.addr])
        .args([
            "--peer-listen",
            &n.peer,
            "--http",
            &n.http,
            "--peers",
            &peers,
        ])
        .arg("--data-dir")
        .arg(&n.data)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn kairos");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kairos serve did not exit on a refused data directory");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

fn set_format(data: &Path, version: u32) {
    std::fs::write(data.join("format"), format!("{version}\n")).expect("format file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_a_newer_format_is_refused_naming_both_versions() {
    let mut cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    create(&cluster.client(), every_job("kept", "g", 60_000))
        .await
        .unwrap();
    let status = cluster.terminate(1, Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    let data = cluster.node(1).data.clone();
    let recorded = std::fs::read_to_string(data.join("format")).expect("format file");
    assert_eq!(recorded, format!("{STATE_VERSION}\n"));
    let newer = STATE_VERSION + 1;
    set_format(&data, newer);
    let (status, stderr) = serve_until_exit(&cluster, 1);
    assert!(!status.success(), "{status:?}: {stderr}");
    let want = format!("has format version {newer}, newer than this binary's {STATE_VERSION}");
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(data.join("format")).unwrap(),
        format!("{newer}\n"),
        "a refused directory is left as it was"
    );

    // Nothing else was touched: with its own version back, it serves its job.
    set_format(&data, STATE_VERSION);
    cluster.start_node(1);
    cluster.wait_leader().await;
    let job = get_job(&cluster.client(), "kept").await;
    assert_eq!(job.spec.map(|s| s.id), Some("kept".to_string()));
}

/// The value of `field` (e.g. `THP_enabled:`) in a `/proc` file of `pid`.
fn proc_field(pid: u32, file: &str, field: &str) -> String {
    let path = format!("/proc/{pid}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let line = text.lines().find_map(|l| l.strip_prefix(field));
    line.unwrap_or_else(|| panic!("{path} has no {field} line:\n{text}"))
        .trim()
        .to_string()
}

/// mimalloc asks for huge pages on its arenas unless built with `no_thp`,
/// and the kernel may give them unasked where THP is `always`: either way
/// each 2 MiB region touched is resident whole (72 MB for an idle node
/// instead of 20, BENCHMARKS.md). The node turns THP off for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_with_transparent_huge_pages_off() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    create(&c, every_job("thp", "thp", 100))
        .await
        .expect("create");
    let pid = cluster.pid(1).expect("node 1 runs");
    assert_eq!(proc_field(pid, "status", "THP_enabled:"), "0");
    assert_eq!(proc_field(pid, "smaps_rollup", "AnonHugePages:"), "0 kB");
}
