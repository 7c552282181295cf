//! A local Kairos cluster of child processes for the benchmarks: three
//! (`--nodes`) `kairos serve` nodes from the release binary on free loopback ports, each
//! with a temporary data directory. Nodes can be stopped (SIGTERM, the
//! graceful path) or SIGKILLed, and restarted, one at a time. Everything is killed and removed when the cluster is dropped
//! (also while unwinding from a panic) and on Ctrl-C/SIGTERM through
//! [`install_signal_cleanup`].

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Voters in a local cluster unless `--nodes` says otherwise.
pub const NODES: u64 = 3;
/// Most voters a node accepts in `--peers`.
pub const NODES_MAX: u64 = 9;
/// How long a fresh cluster may take to elect a leader and become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);
const LOG_TAIL_BYTES: u64 = 4096;
const METRICS_MAX_BYTES: u64 = 1 << 20;

struct NodeProc {
    grpc: String,
    peer: String,
    http: String,
    dir: PathBuf,
    child: Option<Child>,
}

struct Inner {
    bin: PathBuf,
    root: PathBuf,
    peers: String,
    extra: Vec<String>,
    nodes: Vec<NodeProc>,
    keep: bool,
    cleaned: bool,
}

/// Clusters alive in this process, for the signal handler.
static LIVE: Mutex<Vec<Weak<Mutex<Inner>>>> = Mutex::new(Vec::new());
static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct LocalCluster {
    inner: Arc<Mutex<Inner>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Free loopback ports, all bound at once so they are distinct.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

impl Inner {
    fn node(&mut self, id: u64) -> anyhow::Result<&mut NodeProc> {
        let n = self.nodes.len();
        self.nodes
            .get_mut((id as usize).wrapping_sub(1))
            .with_context(|| format!("node {id}: no such node (1..={n})"))
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let (bin, peers, extra) = (self.bin.clone(), self.peers.clone(), self.extra.clone());
        let log_path = self.root.join(format!("node{id}.log"));
        let n = self.node(id)?;
        anyhow::ensure!(n.child.is_none(), "node {id} is already running");
        std::fs::create_dir_all(&n.dir)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let child = Command::new(&bin)
            .args(["serve", "--id", &id.to_string(), "--listen", &n.grpc])
            .args(["--peer-listen", &n.peer])
            .args(["--http", &n.http])
            .arg("--data-dir")
            .arg(&n.dir)
            .args(["--peers", &peers])
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} (build it with `cargo build --release -p kairos-server`, or pass --bin)", bin.display()))?;
        n.child = Some(child);
        Ok(())
    }

    fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        if let Some(mut c) = self.node(id)?.child.take() {
            c.kill()?; // SIGKILL
            c.wait()?;
        }
        Ok(())
    }

    /// Sends SIGTERM to node `id` if it runs.
    fn terminate(&mut self, id: u64) -> anyhow::Result<()> {
        if let Some(c) = &self.node(id)?.child {
            let pid = rustix::process::Pid::from_child(c);
            rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        }
        Ok(())
    }

    /// Node `id`'s exit status once it has exited (the process is reaped).
    fn reap(&mut self, id: u64) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let n = self.node(id)?;
        let Some(c) = n.child.as_mut() else {
            bail!("node {id} is not running");
        };
        let status = c.try_wait()?;
        if status.is_some() {
            n.child = None;
        }
        Ok(status)
    }

    fn cleanup(&mut self) {
        if self.cleaned {
            return;
        }
        self.cleaned = true;
        for id in 1..=self.nodes.len() as u64 {
            let _ = self.kill(id);
        }
        if self.keep {
            eprintln!("kept cluster data and logs in {}", self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Kills and removes every live local cluster on Ctrl-C or SIGTERM, then exits 130.
pub fn install_signal_cleanup() {
    tokio::spawn(async {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        eprintln!("interrupted: stopping local cluster nodes");
        for w in lock(&LIVE).iter() {
            if let Some(inner) = w.upgrade() {
                lock(&inner).cleanup();
            }
        }
        std::process::exit(130);
    });
}

impl LocalCluster {
    /// Starts `n` nodes from `bin` and waits until the cluster is ready.
    pub async fn start(bin: &Path, n: u64, extra: Vec<String>, keep: bool) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1..=NODES_MAX).contains(&n),
            "--nodes: 1 to {NODES_MAX}, got {n}"
        );
        anyhow::ensure!(
            bin.is_file(),
            "--bin {}: not found (build it with `cargo build --release -p kairos-server`)",
            bin.display()
        );
        let ports = free_ports(3 * n as usize)?;
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("kairos-bench-{}-{seq}", std::process::id()));
        let nodes: Vec<NodeProc> = (0..n as usize)
            .map(|i| NodeProc {
                grpc: format!("127.0.0.1:{}", ports[3 * i]),
                http: format!("127.0.0.1:{}", ports[3 * i + 1]),
                peer: format!("127.0.0.1:{}", ports[3 * i + 2]),
                dir: root.join(format!("node{}", i + 1)),
                child: None,
            })
            .collect();
        let peers = (nodes.iter().enumerate())
            .map(|(i, n)| format!("{}={}", i + 1, n.peer))
            .collect::<Vec<_>>()
            .join(",");
        let inner = Inner {
            bin: bin.to_path_buf(),
            root,
            peers,
            extra,
            nodes,
            keep,
            cleaned: false,
        };
        let c = LocalCluster {
            inner: Arc::new(Mutex::new(inner)),
        };
        lock(&LIVE).push(Arc::downgrade(&c.inner));
        for id in 1..=n {
            lock(&c.inner).spawn(id)?;
        }
        c.wait_ready(READY_TIMEOUT).await?;
        Ok(c)
    }

    /// Number of nodes (ids 1..=size).
    pub fn size(&self) -> u64 {
        lock(&self.inner).nodes.len() as u64
    }

    pub fn endpoints(&self) -> Vec<String> {
        lock(&self.inner)
            .nodes
            .iter()
            .map(|n| n.grpc.clone())
            .collect()
    }

    pub fn endpoint(&self, id: u64) -> anyhow::Result<String> {
        Ok(lock(&self.inner).node(id)?.grpc.clone())
    }

    pub fn http(&self, id: u64) -> anyhow::Result<String> {
        Ok(lock(&self.inner).node(id)?.http.clone())
    }

    pub fn data_dir(&self, id: u64) -> anyhow::Result<PathBuf> {
        Ok(lock(&self.inner).node(id)?.dir.clone())
    }

    /// Process id of node `id` while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        let mut g = lock(&self.inner);
        g.node(id).ok()?.child.as_ref().map(|c| c.id())
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&self, id: u64) -> anyhow::Result<()> {
        lock(&self.inner).kill(id)
    }

    /// SIGTERM to node `id`, then waits until it exits with status 0 (its
    /// graceful stop); SIGKILL and an error after `timeout`. Returns how long it took.
    pub async fn terminate(&self, id: u64, timeout: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        lock(&self.inner).terminate(id)?;
        loop {
            if let Some(status) = lock(&self.inner).reap(id)? {
                anyhow::ensure!(
                    status.success(),
                    "node {id} exited with {status} after SIGTERM"
                );
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                self.kill(id)?;
                bail!("node {id} did not stop within {timeout:?} of SIGTERM; killed");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts node `id` again on its ports and data directory.
    pub fn restart(&self, id: u64) -> anyhow::Result<()> {
        lock(&self.inner).spawn(id)
    }

    /// The last bytes of node `id`'s log, for error messages.
    pub fn log_tail(&self, id: u64) -> String {
        let path = lock(&self.inner).root.join(format!("node{id}.log"));
        let Ok(text) = std::fs::read(&path) else {
            return String::new();
        };
        let from = text.len().saturating_sub(LOG_TAIL_BYTES as usize);
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    /// Fails with the node's log tail if any started node has exited.
    pub fn check_alive(&self) -> anyhow::Result<()> {
        let mut g = lock(&self.inner);
        let mut dead = None;
        for (i, n) in g.nodes.iter_mut().enumerate() {
            if let Some(Ok(Some(st))) = n.child.as_mut().map(|c| c.try_wait()) {
                dead = Some((i as u64 + 1, st));
                n.child = None;
            }
        }
        drop(g);
        if let Some((id, st)) = dead {
            bail!("node {id} exited ({st}); log tail:\n{}", self.log_tail(id));
        }
        Ok(())
    }

    /// Waits until every running node answers /readyz 200 and a leader is known.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        let client = Client::new(self.endpoints()).with_retry_for(Duration::from_millis(500));
        loop {
            self.check_alive()?;
            let mut ready = true;
            for id in 1..=self.size() {
                if self.pid(id).is_some() {
                    ready &= http_status(&self.http(id)?, "/readyz").await == Some(200);
                }
            }
            if ready {
                if let Ok(s) = client.status().await {
                    if s.leader != 0 {
                        return Ok(s.leader);
                    }
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "cluster not ready after {timeout:?}; node 1 log tail:\n{}",
                    self.log_tail(1)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until node `id` answers /readyz 200 and Cluster.Status through it names a leader.
    pub async fn wait_serving(&self, id: u64, timeout: Duration) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let (http, grpc) = (self.http(id)?, self.endpoint(id)?);
        let client = Client::new([grpc]).with_retry_for(Duration::from_millis(200));
        loop {
            self.check_alive()?;
            // Ready (a leader known, the log applied up to where it was),
            // and a client read answered through this node. Not `Status`:
            // it takes a digest of the whole state on every node, which
            // with a million timers alone takes seconds.
            if http_status(&http, "/readyz").await == Some(200) && answers_reads(&client).await {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                bail!(
                    "node {id} not serving after {timeout:?}; log tail:\n{}",
                    self.log_tail(id)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn shutdown(&self) {
        lock(&self.inner).cleanup();
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The value of metric `name` (a line `name value`) in `GET /metrics` on `addr`.
pub async fn http_metric(addr: &str, name: &str) -> Option<f64> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut body = Vec::new();
        s.take(METRICS_MAX_BYTES)
            .read_to_end(&mut body)
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&body);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    tokio::time::timeout(HTTP_TIMEOUT, get).await.ok()?
}

/// Status code of `GET path` on `addr` (HTTP/1.1), or None when unreachable.
pub async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::with_capacity(64);
        let mut chunk = [0u8; 64];
        while buf.len() < 12 {
            let n = s.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let line = String::from_utf8_lossy(&buf);
        line.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(HTTP_TIMEOUT, get).await.ok()?
}

/// Whether a one-job page of `ListJobs` is answered through `client`'s node.
async fn answers_reads(client: &Client) -> bool {
    let req = kairos_client::pb::ListJobsRequest {
        page_size: 1,
        ..Default::default()
    };
    client.list_jobs(req).await.is_ok()
}
