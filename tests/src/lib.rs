//! Test harness for end-to-end tests: a cluster of real `kairos` processes
//! on free loopback ports with temporary data directories. Nodes can be
//! SIGKILLed and restarted from their data. Helpers wait on conditions,
//! never on fixed sleeps.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kairos_client::{pb, Client, Security};

pub mod lazydisk;

/// The `kairos` binary next to this test executable, built on first use:
/// `cargo nextest run` builds test targets but not a plain binary of another
/// package, so a stale or missing binary would be tested otherwise.
pub fn kairos_bin() -> PathBuf {
    static PINNED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    workspace_bin("KAIROS_BIN", "kairos-server", "kairos", &PINNED)
}

/// The `kairosctl` binary, built on first use like [`kairos_bin`].
pub fn kairosctl_bin() -> PathBuf {
    static PINNED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    workspace_bin("KAIROSCTL_BIN", "kairos-client", "kairosctl", &PINNED)
}

/// Builds `bin` once per test process and returns a private hard link to
/// it: another test process's `cargo build` may replace `target/<profile>/<bin>`
/// while this one starts nodes, but never the inode this link holds.
fn workspace_bin(
    env: &str,
    package: &str,
    bin: &str,
    pinned: &std::sync::OnceLock<PathBuf>,
) -> PathBuf {
    if let Ok(p) = std::env::var(env) {
        return PathBuf::from(p);
    }
    pinned
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current exe");
            let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
            build_bin(dir, package, bin);
            let links = dir.join("test-bins");
            std::fs::create_dir_all(&links).expect("test-bins dir");
            remove_dead_links(&links);
            let link = links.join(format!("{bin}-{}", std::process::id()));
            let _ = std::fs::remove_file(&link);
            std::fs::hard_link(dir.join(bin), &link)
                .or_else(|_| std::fs::copy(dir.join(bin), &link).map(|_| ()))
                .expect("pin the binary");
            link
        })
        .clone()
}

/// Links of test processes that are gone (`<bin>-<pid>` with no such pid).
fn remove_dead_links(links: &std::path::Path) {
    for e in std::fs::read_dir(links).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .rsplit_once('-')
            .and_then(|(_, p)| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The `kairos` binary of the previous release (the commit in
/// `deploy/PREVIOUS_RELEASE`), as `.ci/previous-release` builds it into
/// `<target>/previous-release/`, or `KAIROS_PREVIOUS_BIN`. Panics, saying
/// how to build it, when it is missing: an upgrade test never passes without it.
pub fn previous_release_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KAIROS_PREVIOUS_BIN") {
        return PathBuf::from(p);
    }
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/PREVIOUS_RELEASE");
    let commit = std::fs::read_to_string(file).expect("deploy/PREVIOUS_RELEASE");
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/previous-release/
    let target = exe.ancestors().nth(3).expect("target dir");
    let bin = target
        .join("previous-release")
        .join(format!("kairos-{}", commit.trim()));
    assert!(
        bin.exists(),
        "the previous release's binary {} is missing: build it with `.ci/previous-release` \
         (same CARGO_TARGET_DIR as the tests), or point KAIROS_PREVIOUS_BIN at one",
        bin.display()
    );
    bin
}

fn build_bin(dir: &std::path::Path, package: &str, bin: &str) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", package, "--bin", bin]);
    if profile == "release" {
        cmd.arg("--release");
    }
    // The variables cargo sets for this test's own package: build scripts
    // that watch them (ring watches CARGO_MANIFEST_DIR) would rebuild.
    for (k, _) in std::env::vars() {
        let own = [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ];
        if k.starts_with("CARGO_PKG_") || own.contains(&k.as_str()) {
            cmd.env_remove(k);
        }
    }
    let status = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build");
    assert!(status.success(), "building the {bin} binary failed");
}

/// A free loopback port below Linux's ephemeral range (32768–60999): a port
/// taken from that range can be handed to some outgoing connection's local
/// end before the node binds it ("address in use" at start).
///
/// Test binaries run as separate processes at once (nextest), and a port is
/// only bound by its node some time after it is handed out, or stands unbound
/// while a test has its node stopped. So a bind check alone lets two processes
/// take the same port (CI saw a node die with "address in use" at start). Each
/// port handed out is therefore claimed across processes: an exclusive lock on
/// `$TMPDIR/kairos-test-ports/<port>`, held until this process exits (the
/// kernel drops it then, so a killed test leaves no stale claim).
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static HELD: std::sync::Mutex<Vec<(u16, std::fs::File)>> = std::sync::Mutex::new(Vec::new());
    const LOW: u64 = 10_000;
    const SPAN: u64 = 22_000;
    let claims = std::env::temp_dir().join("kairos-test-ports");
    std::fs::create_dir_all(&claims).expect("create the port claim directory");
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let start = h.finish();
    for i in 0..SPAN {
        let port = (LOW + (start + i) % SPAN) as u16;
        if held.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let claim = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(claims.join(port.to_string()))
            .expect("open a port claim file");
        if claim.try_lock().is_ok() && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            held.push((port, claim));
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

pub struct NodeProc {
    pub id: u64,
    /// Started with `--join` (waits to be added) instead of `--peers`.
    pub joining: bool,
    pub addr: String,
    /// The peer (Raft) listener.
    pub peer: String,
    pub http: String,
    pub data: PathBuf,
    /// Environment and flags for this node only (set before it starts).
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// The `kairos` binary this node runs (None: this tree's, [`kairos_bin`]).
    pub bin: Option<PathBuf>,
    child: Option<Child>,
}

pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    peers: String,
    extra: Vec<String>,
    /// What clients of this cluster present: its CA (TLS) and admin token.
    pub security: Security,
    /// Where `kairos certs init` wrote this cluster's certificates (TLS clusters).
    pub tls_dir: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

/// The first admin's secret in clusters from [`Cluster::start_secure`].
pub const ADMIN_SECRET: &str = "kairos-test-admin-secret-0123456789";

/// Runs `kairos certs init --nodes n --out dir`.
pub fn certs_init(dir: &std::path::Path, n: u64) {
    let out = Command::new(kairos_bin())
        .args(["certs", "init", "--nodes", &n.to_string(), "--out"])
        .arg(dir)
        .output()
        .expect("run kairos certs init");
    assert!(
        out.status.success(),
        "certs init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// Starts `n` nodes; `extra` flags go to every `kairos serve`.
    pub fn start(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, false, false, &|_| {})
    }

    /// Starts `n` nodes after `setup` adjusted each (its own env and flags).
    pub fn start_each(n: u64, extra: &[&str], setup: &dyn Fn(&mut NodeProc)) -> Cluster {
        Self::start_with(n, extra, false, false, setup)
    }

    /// Starts `n` nodes with TLS on both listeners (`--tls-dir`, certificates
    /// from `kairos certs init`); clients trust the generated CA.
    pub fn start_tls(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, true, false, &|_| {})
    }

    /// TLS and tokens: every node gets `--auth-token-file` with the same
    /// secret, which becomes the first admin; clients present it.
    pub fn start_secure(n: u64, extra: &[&str]) -> Cluster {
        Self::start_with(n, extra, true, true, &|_| {})
    }

    fn start_with(
        n: u64,
        extra: &[&str],
        tls: bool,
        tokens: bool,
        setup: &dyn Fn(&mut NodeProc),
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut security = Security::default();
        let tls_dir = tls.then(|| {
            let certs = dir.path().join("certs");
            certs_init(&certs, n);
            extra.extend(["--tls-dir".to_string(), certs.display().to_string()]);
            security.ca_pem = Some(std::fs::read(certs.join("ca.crt")).expect("ca.crt"));
            certs
        });
        if tokens {
            let secret = ADMIN_SECRET.to_string();
            let file = dir.path().join("admin.token");
            std::fs::write(&file, format!("{secret}\n")).expect("token file");
            extra.extend(["--auth-token-file".to_string(), file.display().to_string()]);
            security.token = Some(secret);
        }
        let nodes: Vec<NodeProc> = (1..=n)
            .map(|id| NodeProc {
                id,
                joining: false,
                addr: format!("127.0.0.1:{}", free_port()),
                peer: format!("127.0.0.1:{}", free_port()),
                http: format!("127.0.0.1:{}", free_port()),
                data: dir.path().join(format!("node{id}")),
                env: Vec::new(),
                args: Vec::new(),
                bin: None,
                child: None,
            })
            .collect();
        let peers = nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = nodes;
        nodes.iter_mut().for_each(setup);
        let mut c = Cluster {
            nodes,
            peers,
            extra,
            security,
            tls_dir,
            _dir: dir,
        };
        for id in 1..=n {
            c.start_node(id);
        }
        c
    }

    /// Adds node `id` on fresh ports, started with `--join` (empty, waiting
    /// to be added as a learner), and returns its peer address.
    pub fn add_joining_node(&mut self, id: u64) -> String {
        let data = self._dir.path().join(format!("node{id}"));
        self.nodes.push(NodeProc {
            id,
            joining: true,
            addr: format!("127.0.0.1:{}", free_port()),
            peer: format!("127.0.0.1:{}", free_port()),
            http: format!("127.0.0.1:{}", free_port()),
            data,
            env: Vec::new(),
            args: Vec::new(),
            bin: None,
            child: None,
        });
        self.start_node(id);
        self.node(id).peer.clone()
    }

    pub fn start_node(&mut self, id: u64) {
        let endpoints = self.endpoints().join(",");
        let peers = self.peers.clone();
        let extra = self.extra.clone();
        let n = self.node_mut(id);
        let (flag, value) = if n.joining {
            ("--join", endpoints)
        } else {
            ("--peers", peers)
        };
        std::fs::create_dir_all(&n.data).expect("data dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.data.with_extension("log"))
            .expect("log");
        let child = Command::new(n.bin.clone().unwrap_or_else(kairos_bin))
            .args([
                "serve",
                "--id",
                &id.to_string(),
                "--listen",
                &n.addr,
                "--peer-listen",
                &n.peer,
                "--http",
                &n.http,
                flag,
                &value,
            ])
            .arg("--data-dir")
            .arg(&n.data)
            .args(&extra)
            .args(&n.args)
            .envs(n.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn kairos (is the binary built? cargo build -p kairos-server)");
        n.child = Some(child);
    }

    /// SIGTERM, then waits up to `timeout` for the process to exit; returns
    /// its exit status (None if it did not exit in time: it is then killed).
    pub fn terminate(&mut self, id: u64, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.node_mut(id).child.take()?;
        if matches!(c.try_wait(), Ok(None)) {
            let pid = rustix::process::Pid::from_child(&c);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// Has node `id`'s process exited (crashed) on its own?
    pub fn exited(&mut self, id: u64) -> bool {
        let c = self.node_mut(id).child.as_mut();
        c.is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Node `id`'s process id, while this cluster runs it.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.node(id).child.as_ref().map(Child::id)
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.node_mut(id).child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn node_mut(&mut self, id: u64) -> &mut NodeProc {
        self.nodes.iter_mut().find(|n| n.id == id).expect("node id")
    }

    pub fn node(&self, id: u64) -> &NodeProc {
        self.nodes.iter().find(|n| n.id == id).expect("node id")
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    pub fn client(&self) -> Client {
        Client::new(self.endpoints())
            .with_retry_for(Duration::from_secs(30))
            .with_security(self.security.clone())
    }

    /// A client talking only to node `id`.
    pub fn client_of(&self, id: u64) -> Client {
        Client::new([self.node(id).addr.clone()])
            .with_retry_for(Duration::from_secs(1))
            .with_security(self.security.clone())
    }

    /// Runs `kairosctl` against this cluster's endpoints: whether it
    /// succeeded, and its stdout followed by its stderr.
    pub fn kairosctl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(kairosctl_bin())
            .arg("--endpoints")
            .arg(self.endpoints().join(","))
            .args(args)
            .output()
            .expect("run kairosctl");
        outcome(&out)
    }

    /// Runs `kairosctl --output json ARGS`, expects success and parses its output.
    pub fn kairosctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let (ok, out) = self.kairosctl(&all);
        assert!(ok, "kairosctl {args:?}: {out}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// Runs `kairosctl ARGS` and expects a refusal that says `why`.
    pub fn kairosctl_refused(&self, args: &[&str], why: &str) {
        let (ok, out) = self.kairosctl(args);
        assert!(!ok && out.contains(why), "kairosctl {args:?}: {out}");
    }

    /// Waits until a leader is elected and every live node reports it; returns its id.
    pub async fn wait_leader(&self) -> u64 {
        let c = self.client();
        wait_for("a leader", Duration::from_secs(60), || async {
            let s = c.status().await.ok()?;
            let leader = s.nodes.iter().find(|n| n.role == "leader")?;
            Some(leader.id)
        })
        .await
    }

    /// Cluster status as seen through node `via`.
    pub async fn status_via(&self, via: u64) -> Option<pb::StatusResponse> {
        self.client_of(via).status().await.ok()
    }

    /// Waits until node `via` reports `format` as the cluster's active log
    /// format (a fresh cluster activates this release's within a second or
    /// so of electing a leader).
    pub async fn wait_log_format(&self, via: u64, format: u32) {
        wait_for(
            "the log format to become active",
            Duration::from_secs(30),
            || async { (self.status_via(via).await?.log_format == format).then_some(()) },
        )
        .await;
    }

    /// Waits until every listed node reports a digest of one and the same
    /// index (`digest_index`: a status answers with an older digest while a
    /// fresh one takes longer than its bound, and jobs may go on firing),
    /// and returns the statuses: their digests are comparable.
    pub async fn wait_converged(&self, via: u64, ids: &[u64]) -> Vec<pb::NodeStatus> {
        wait_for("replicas to converge", Duration::from_secs(60), || async {
            let s = self.status_via(via).await?;
            let nodes: Vec<pb::NodeStatus> = s
                .nodes
                .into_iter()
                .filter(|n| ids.contains(&n.id))
                .collect();
            let first = nodes.first()?.digest_index;
            let same = nodes.len() == ids.len()
                && nodes.iter().all(|n| {
                    n.digest_index == first && n.role != "unreachable" && !n.state_digest.is_empty()
                });
            same.then_some(nodes)
        })
        .await
    }

    /// Cluster status through node `via` once each node's digest is of the
    /// index it reports applied.
    pub async fn status_digested(&self, via: u64) -> pb::StatusResponse {
        wait_for("fresh state digests", Duration::from_secs(60), || async {
            let s = self.status_via(via).await?;
            s.nodes.iter().all(digested).then_some(s)
        })
        .await
    }

    /// Reads a gauge from a node's /metrics.
    pub fn metric(&self, id: u64, name: &str) -> Option<f64> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.node(id).http).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The failing test's evidence: each node's last log lines.
            for n in &mut self.nodes {
                let log = std::fs::read_to_string(n.data.with_extension("log")).unwrap_or_default();
                // Backtrace frames left out, so the error above them shows.
                let frame = |l: &&str| {
                    let t = l.trim_start();
                    t.starts_with("at ")
                        || t.split_once(": ")
                            .is_some_and(|(n, _)| n.parse::<u32>().is_ok())
                };
                let tail: Vec<&str> = log.lines().filter(|l| !frame(l)).rev().take(40).collect();
                eprintln!(
                    "--- node {} log (last 40 lines, backtrace frames left out) ---",
                    n.id
                );
                eprintln!("(process: {})", process_state(n.child.as_mut()));
                tail.iter().rev().for_each(|l| eprintln!("{l}"));
            }
        }
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// What a node's process is doing, for a failing test's evidence: exited
/// (with its status), or its /proc state letter and name.
fn process_state(child: Option<&mut Child>) -> String {
    let Some(c) = child else {
        return "not running (killed by the test)".into();
    };
    match c.try_wait() {
        Ok(Some(status)) => format!("exited: {status}"),
        Ok(None) => {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", c.id())).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .map(|(_, r)| r.trim().to_string())
                .unwrap_or_default();
            format!(
                "pid {} alive, /proc stat: {}; threads: {}",
                c.id(),
                state.chars().take(60).collect::<String>(),
                thread_waits(c.id())
            )
        }
        Err(e) => format!("unknown: {e}"),
    }
}

/// Each thread of `pid` as `name:wchan` (where in the kernel it sleeps:
/// `futex_wait_queue` is a lock or condvar, `do_epoll_wait` an idle runtime).
fn thread_waits(pid: u32) -> String {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let t = e.path();
        let read = |f: &str| {
            std::fs::read_to_string(t.join(f))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        out.push(format!("{}:{}", read("comm"), read("wchan")));
    }
    out.join(" ")
}

/// A finished command's outcome: whether it succeeded, and its stdout
/// followed by its stderr.
pub fn outcome(out: &std::process::Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Polls `f` until it returns Some, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn every_job(id: &str, group: &str, every_ms: u64) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::EveryMs(every_ms)),
        }),
        group: group.into(),
        ..Default::default()
    }
}

/// A one-shot job due 100 ms after it is created.
pub fn once_job(id: &str, group: &str) -> pb::JobSpec {
    pb::JobSpec {
        id: id.into(),
        schedule: Some(pb::Schedule {
            kind: Some(pb::schedule::Kind::AfterMs(100)),
        }),
        group: group.into(),
        ..Default::default()
    }
}

pub async fn create(c: &Client, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
    let req = pb::CreateJobRequest { spec: Some(spec) };
    c.jobs(|mut j| {
        let r = req.clone();
        async move { j.create_job(r).await }
    })
    .await
}

/// Every job id starting with `prefix`, paging on until the token is empty.
pub async fn job_ids(c: &Client, prefix: &str) -> std::collections::BTreeSet<String> {
    let (mut out, mut token) = (std::collections::BTreeSet::new(), String::new());
    loop {
        let req = pb::ListJobsRequest {
            page_size: 1000,
            page_token: token.clone(),
            id_prefix: prefix.into(),
            ..Default::default()
        };
        let page = c.list_jobs(req).await.expect("list jobs");
        out.extend(page.jobs.into_iter().map(|j| j.spec.unwrap_or_default().id));
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

/// Job `id` as the cluster reads it; panics naming the id if it cannot.
pub async fn get_job(c: &Client, id: &str) -> pb::Job {
    let r = pb::JobRef { id: id.into() };
    c.jobs(|mut j| {
        let r = r.clone();
        async move { j.get_job(r).await }
    })
    .await
    .unwrap_or_else(|e| panic!("get {id}: {e}"))
}

/// Job `id`'s revision history as (revision, action, by), oldest first;
/// panics naming the id if it cannot be read, or if a revision has no time.
pub async fn job_history(c: &Client, id: &str) -> Vec<(u64, String, String)> {
    let r = pb::JobRef { id: id.into() };
    let h = c
        .jobs(|mut j| {
            let r = r.clone();
            async move { j.job_history(r).await }
        })
        .await
        .unwrap_or_else(|e| panic!("history of {id}: {e}"));
    assert!(h.revisions.iter().all(|r| r.at_ms > 0), "{h:?}");
    (h.revisions.into_iter())
        .map(|r| (r.revision, r.action, r.by))
        .collect()
}

/// Checks a fixed-rate job's run history: each scheduled time once, consecutive ones exactly `every_ms` apart.
pub fn assert_no_gap_no_double(runs: &[pb::Run], every_ms: i64) {
    assert!(!runs.is_empty(), "no runs at all");
    for w in runs.windows(2) {
        let d = w[1].scheduled_at_ms - w[0].scheduled_at_ms;
        assert_eq!(
            d, every_ms,
            "runs {} and {} are {d} ms apart (gap or double)",
            w[0].run_id, w[1].run_id
        );
    }
    for r in runs {
        assert!(
            r.fired_at_ms >= r.scheduled_at_ms,
            "run {} fired at {} before its time",
            r.run_id,
            r.fired_at_ms
        );
    }
}

/// The interval of the "tick" job of [`start_ticking`].
pub const TICK_MS: i64 = 200;

/// Creates the 200 ms job "tick" and waits for its first 5 fires.
pub async fn start_ticking(cluster: &Cluster) -> Client {
    let c = cluster.client();
    create(&c, every_job("tick", "g", TICK_MS as u64))
        .await
        .unwrap();
    wait_for("5 fires", Duration::from_secs(60), || async {
        (c.list_runs("tick", 1000).await.ok()?.len() >= 5).then_some(())
    })
    .await;
    c
}

/// Waits for 5 more fires, pauses "tick" and checks its history (each time
/// once, 200 ms apart) and that voters `ids` have equal digests.
pub async fn fires_on_without_gap(cluster: &Cluster, c: &Client, ids: &[u64]) {
    let before = c.list_runs("tick", 100_000).await.unwrap().len();
    wait_for("5 more fires", Duration::from_secs(60), || async {
        (c.list_runs("tick", 100_000).await.ok()?.len() >= before + 5).then_some(())
    })
    .await;
    let r = pb::PauseJobRequest {
        id: "tick".into(),
        ..Default::default()
    };
    c.jobs(|mut j| {
        let r = r.clone();
        async move { j.pause_job(r).await }
    })
    .await
    .unwrap();
    assert_no_gap_no_double(&c.list_runs("tick", 100_000).await.unwrap(), TICK_MS);
    let via = cluster.wait_leader().await;
    let nodes = cluster.wait_converged(via, ids).await;
    let d = &nodes[0].state_digest;
    assert!(
        !d.is_empty() && nodes.iter().all(|n| &n.state_digest == d),
        "digests differ at the same index: {nodes:?}"
    );
}

/// Whether `n`'s state digest is of the index it reports applied.
pub fn digested(n: &pb::NodeStatus) -> bool {
    !n.state_digest.is_empty() && n.digest_index == n.applied_index
}

/// Waits until node `id` follows a leader and has applied at least `index`.
pub async fn rejoined(cluster: &Cluster, id: u64, index: u64) {
    wait_for(
        &format!("node {id} to rejoin"),
        Duration::from_secs(60),
        || async {
            let s = cluster.status_via(id).await?;
            let n = s.nodes.iter().find(|n| n.id == id)?;
            (s.leader != 0 && n.role == "follower" && n.applied_index >= index).then_some(())
        },
    )
    .await;
}

/// Restarts node `id` (a follower) gracefully with failpoints `spec`, and
/// waits until it has caught up again.
pub async fn restart_with_failpoint(cluster: &mut Cluster, id: u64, spec: &str) {
    let applied = cluster.client().status().await.unwrap().nodes;
    let applied = applied.iter().map(|n| n.applied_index).max().unwrap();
    cluster.terminate(id, Duration::from_secs(20));
    let env = &mut cluster.node_mut(id).env;
    env.retain(|(k, _)| k != "KAIROS_FAILPOINT");
    env.push(("KAIROS_FAILPOINT".into(), spec.into()));
    cluster.start_node(id);
    rejoined(cluster, id, applied).await;
}

/// The highest index any node applied.
pub async fn applied_index(cluster: &Cluster) -> u64 {
    let s = cluster.client().status().await.unwrap();
    s.nodes.iter().map(|n| n.applied_index).max().unwrap()
}

/// `cluster add-learner ID PEER_ADDR` through client `c`.
pub async fn add_learner(
    c: &Client,
    id: u64,
    peer_addr: &str,
) -> Result<pb::MembershipResponse, tonic::Status> {
    let req = pb::AddLearnerRequest {
        id,
        peer_addr: peer_addr.into(),
    };
    c.call(|ch| {
        let req = req.clone();
        async move {
            pb::cluster_client::ClusterClient::new(ch)
                .add_learner(req)
                .await
        }
    })
    .await
}

/// A `kairosctl worker --group GROUP --exec shell` process against
/// `cluster`, killed when dropped.
pub struct ShellWorker(Child);

impl ShellWorker {
    pub fn start(cluster: &Cluster, group: &str) -> ShellWorker {
        let endpoints = cluster.endpoints().join(",");
        let child = Command::new(kairosctl_bin())
            .args([
                "--endpoints",
                &endpoints,
                "worker",
                "--group",
                group,
                "--exec",
                "shell",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn kairosctl worker");
        ShellWorker(child)
    }
}

impl Drop for ShellWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Opens a raw worker stream to `addr` and sends `hello` first; the sender
/// carries the worker's next messages (drop it to end the stream).
pub async fn worker_session(
    addr: &str,
    hello: pb::Hello,
) -> Result<
    (
        tokio::sync::mpsc::Sender<pb::WorkerMessage>,
        tonic::Streaming<pb::ServerMessage>,
    ),
    tonic::Status,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(pb::WorkerMessage {
        msg: Some(pb::worker_message::Msg::Hello(hello)),
    })
    .await
    .expect("the stream's sender is held here");
    let mut client = pb::workers_client::WorkersClient::new(kairos_client::channel(addr)?)
        .max_encoding_message_size(8 << 20);
    let inbound = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, inbound))
}
