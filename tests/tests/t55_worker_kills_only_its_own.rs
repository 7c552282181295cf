//! Issue #9: the ready worker (`kairosctl worker`) stops a run by signalling
//! the run's own process group and nothing else. A run past its deadline
//! ends timed-out and is retried; its command and the command's children are
//! gone afterwards; a sentinel process outside the worker's groups, the
//! cluster's nodes and the worker itself all survive. The same holds for the
//! HTTP executor's timeout and for a worker stopped with SIGTERM mid-run.
//! Real processes throughout: `kairos` nodes, the `kairosctl` binary, `sh`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kairos_client::{pb, Client};
use kairos_tests::{create, kairosctl_bin, wait_for, Cluster};

/// A process the worker must never touch: its own process group, started by the test.
struct Sentinel(Child);

impl Sentinel {
    fn start() -> Sentinel {
        use std::os::unix::process::CommandExt;
        let child = Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .expect("spawn sentinel");
        Sentinel(child)
    }

    fn assert_alive(&mut self) {
        assert!(
            matches!(self.0.try_wait(), Ok(None)),
            "the sentinel process (pid {}) was killed",
            self.0.id()
        );
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `kairosctl worker` process; killed (SIGKILL) on drop if still running.
struct WorkerProc(Child);

impl WorkerProc {
    fn start(endpoints: &[String], args: &[&str]) -> WorkerProc {
        let child = Command::new(kairosctl_bin())
            .arg("--endpoints")
            .arg(endpoints.join(","))
            .arg("worker")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn kairosctl worker");
        WorkerProc(child)
    }

    fn assert_alive(&mut self) {
        assert!(
            matches!(self.0.try_wait(), Ok(None)),
            "the worker process died"
        );
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Is `pid` a live (not zombie) process?
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

/// The pids a payload wrote to `file`, one per line.
fn pids_in(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits until every pid is gone (a killed background child is reaped by
/// init shortly after its group is killed).
async fn wait_gone(pids: &[u32]) {
    assert!(!pids.is_empty(), "the payload recorded no pids");
    wait_for(
        &format!("processes {pids:?} to be gone"),
        Duration::from_secs(20),
        || async { pids.iter().all(|p| !alive(*p)).then_some(()) },
    )
    .await;
}

fn job(id: &str, group: &str, payload: String, timeout_ms: u64, attempts: u32) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        group: group.into(),
        payload: payload.into_bytes(),
        timeout_ms,
        max_attempts: attempts,
        backoff_ms: 100,
        ..Default::default()
    }
}

/// Waits for the job's (only) run to reach `state` at `attempt`.
async fn run_reaches(c: &Client, job: &str, state: pb::RunState, attempt: u32) -> pb::Run {
    wait_for(
        &format!("run of {job} to be {state:?} at attempt {attempt}"),
        Duration::from_secs(90),
        || async {
            let r = c.list_runs(job, 1).await.ok()?.into_iter().next()?;
            (r.state == state as i32 && r.attempt == attempt).then_some(r)
        },
    )
    .await
}

/// A payload that records its shell's pid and its background child's pid,
/// then waits (on the child and in the foreground) far longer than any timeout.
fn forking_payload(dir: &Path, name: &str, prelude: &str) -> String {
    let file = dir.join(format!("{name}-$KAIROS_ATTEMPT.pids"));
    let file = file.display();
    format!("{prelude}echo $$ > {file}; sleep 120 & echo $! >> {file}; sleep 120")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_run_past_its_deadline_takes_only_its_own_processes() {
    let cluster = Cluster::start(3, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let mut sentinel = Sentinel::start();
    let mut worker = WorkerProc::start(
        &cluster.endpoints(),
        &["--group", "ex", "--exec", "shell", "--kill-grace", "1s"],
    );

    // Exits on SIGTERM, with a child of its own.
    create(
        &c,
        job(
            "polite",
            "ex",
            forking_payload(dir.path(), "polite", ""),
            1_000,
            2,
        ),
    )
    .await
    .unwrap();
    // Ignores SIGTERM (and so do its children): needs the SIGKILL after the grace.
    let stubborn = forking_payload(dir.path(), "stubborn", "trap '' TERM; ");
    create(&c, job("stubborn", "ex", stubborn, 1_000, 2))
        .await
        .unwrap();

    for (name, how) in [
        ("polite", "exited on SIGTERM"),
        ("stubborn", "got SIGKILL after 1000 ms"),
    ] {
        let r = run_reaches(&c, name, pb::RunState::TimedOut, 2).await;
        assert!(
            r.error.contains("timed out at the run deadline") && r.error.contains(how),
            "{name}: the outcome should say how the group was stopped ({how}), got {:?}",
            r.error
        );
        for attempt in 1..=2 {
            wait_gone(&pids_in(&dir.path().join(format!("{name}-{attempt}.pids")))).await;
        }
    }
    sentinel.assert_alive();
    worker.assert_alive();
    let s = c.status().await.expect("the cluster still answers");
    assert_eq!(
        s.nodes.iter().filter(|n| n.role != "unreachable").count(),
        3,
        "every node is still up: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_run_past_its_deadline_is_timed_out_and_kills_nothing() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let mut sentinel = Sentinel::start();
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", silent.local_addr().unwrap());
    let mut worker = WorkerProc::start(
        &cluster.endpoints(),
        &["--group", "web", "--exec", "http", "--url", &url],
    );
    create(&c, job("hook", "web", "{}".into(), 1_000, 2))
        .await
        .unwrap();
    let r = run_reaches(&c, "hook", pb::RunState::TimedOut, 2).await;
    assert!(
        r.error.contains("timed out at the run deadline"),
        "{:?}",
        r.error
    );
    sentinel.assert_alive();
    worker.assert_alive();
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_with_sigterm_releases_its_runs_and_kills_only_its_children() {
    let cluster = Cluster::start(1, &[]);
    cluster.wait_leader().await;
    let c = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let mut sentinel = Sentinel::start();
    let worker = WorkerProc::start(
        &cluster.endpoints(),
        &[
            "--group",
            "long",
            "--exec",
            "shell",
            "--kill-grace",
            "1s",
            "--drain-timeout",
            "1s",
        ],
    );
    create(
        &c,
        job(
            "long",
            "long",
            forking_payload(dir.path(), "long", ""),
            600_000,
            3,
        ),
    )
    .await
    .unwrap();
    let pid_file = dir.path().join("long-1.pids");
    let pids = wait_for("the run to start", Duration::from_secs(60), || async {
        let p = pids_in(&pid_file);
        (p.len() == 2).then_some(p)
    })
    .await;

    let worker_pid = rustix::process::Pid::from_child(&worker.0);
    rustix::process::kill_process(worker_pid, rustix::process::Signal::TERM).unwrap();

    // The worker drains (1 s), stops the run, reports it released and exits cleanly.
    let worker = std::sync::Mutex::new(worker);
    let status = wait_for("the worker to exit", Duration::from_secs(60), || {
        let exited = worker.lock().unwrap().0.try_wait().ok().flatten();
        async move { exited }
    })
    .await;
    assert!(status.success(), "worker exit status {status:?}");
    wait_gone(&pids).await;
    sentinel.assert_alive();
    // Released for a retry: attempt 1 ended as a retryable failure, not
    // timed out, and the run waits for its next attempt (no worker is left).
    let r = wait_for(
        "the run to be released",
        Duration::from_secs(30),
        || async {
            let r = c.list_runs("long", 1).await.ok()?.into_iter().next()?;
            r.error
                .contains("released: the worker was stopped")
                .then_some(r)
        },
    )
    .await;
    // (RetryWait is shown as pending on the wire.)
    assert_eq!(r.state, pb::RunState::Pending as i32, "{r:?}");
}
