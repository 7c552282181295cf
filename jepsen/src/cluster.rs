//! The Kairos node processes: how each is launched (inside its namespace via
//! `ip netns exec`, or directly on loopback), with libfaketime preloaded from
//! the start when clock faults are wanted so its offset can be changed later
//! by rewriting a file, and how it is killed, paused, resumed and restarted
//! with the same data directory and flags. Logs append to one file per slot.
//!
//! A slot is a fixed place (namespace, addresses, directory); the node living
//! there can change. Slot `k` of `n` first hosts node `k + 1`, started with
//! `--peers`; the membership nemesis may retire it (the slot is vacant, its
//! data wiped) and start a fresh node `k + 1 + n`, then `k + 1 + 2n`, ...
//! with `--join`, so a node id is never reused and every id's slot is known.
//!
//! With lazy disks (`disk.rs`, for the power and disk nemeses) a slot's
//! `data/` is a `kairos-lazyfs` mount, made before the slot's first node
//! starts and unmounted at shutdown; the data directories the harness
//! creates or wipes there are made durable (fsync of `data/`) like an
//! operator's, and a power cut happens under the slots' lock, between a
//! kill and the restart, so no node runs on a disk losing its power.

use crate::clean;
use crate::disk::{self, Disk, DiskConfig};
use crate::signal::{self, Signal};
use anyhow::{Context, Result};
use kairos_lazyfs::control::{self as lazy, Control};
use kairos_lazyfs::protocol::{PowerReport, Status};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Highest node id the harness gives: `kairos certs init` writes certificates
/// for ids 1..=64 (its limit), and ids are never reused, so this bounds how
/// many fresh nodes a run can start.
pub const ID_MAX: u64 = 64;

#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The slot's first node id.
    pub id: u64,
    /// Public gRPC address, reachable from the harness.
    pub listen: String,
    /// Peer (Raft) address.
    pub peer: String,
    pub http: String,
    pub netns: Option<String>,
    /// Holds `data/<id>/`, `kairos.log` and `faketime` (and, with lazy
    /// disks, `lazyfs.log` and `lazyfs.sock`).
    pub dir: PathBuf,
}

impl NodeSpec {
    /// Node `id`'s data directory: each node living in the slot has its own.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join("data").join(id.to_string())
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kairos.log")
    }
    pub fn faketime_path(&self) -> PathBuf {
        self.dir.join("faketime")
    }
    /// A loopback slot for tests whose "node" is a stand-in that listens on
    /// nothing: fixed ports `1000 + id`, `1100 + id`, `1200 + id`.
    pub fn fake(id: u64, dir: &Path) -> NodeSpec {
        NodeSpec {
            id,
            listen: format!("127.0.0.1:{}", 1_000 + id),
            peer: format!("127.0.0.1:{}", 1_200 + id),
            http: format!("127.0.0.1:{}", 1_100 + id),
            netns: None,
            dir: dir.to_path_buf(),
        }
    }

    /// Where the slot's lazy disk is mounted: what holds `<id>/`.
    pub fn disk_root(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// Who lives in a slot now.
struct Slot {
    /// The latest node id given to the slot.
    id: u64,
    /// Its node was removed from the cluster and not replaced yet.
    vacant: bool,
    /// Started with `--join` (added at runtime) rather than `--peers`.
    joined: bool,
    child: Option<Child>,
    /// The slot's lazy disk, if the run has them.
    disk: Option<Disk>,
}

pub struct Cluster {
    pub bin: PathBuf,
    pub run_id: String,
    pub nodes: Vec<NodeSpec>,
    pub faketime: bool,
    /// Appended to every `kairos serve` command line.
    pub extra_args: Vec<String>,
    /// Extra environment for every `kairos serve` (e.g. `KAIROS_FAILPOINT`).
    pub env: Vec<(String, String)>,
    /// What clients present ([`Cluster::secure`] fills it in).
    pub security: crate::client::Security,
    slots: Mutex<Vec<Slot>>,
}

impl Cluster {
    pub fn new(
        bin: PathBuf,
        run_id: String,
        nodes: Vec<NodeSpec>,
        faketime: bool,
    ) -> Result<Cluster> {
        Cluster::with_disks(bin, run_id, nodes, faketime, None)
    }

    /// Like [`Cluster::new`]; with `disks`, each slot's `data/` is a lazy
    /// disk, mounted here. A disk that cannot be mounted fails the call.
    pub fn with_disks(
        bin: PathBuf,
        run_id: String,
        nodes: Vec<NodeSpec>,
        faketime: bool,
        disks: Option<DiskConfig>,
    ) -> Result<Cluster> {
        let mut mounted = Vec::new();
        for (idx, n) in nodes.iter().enumerate() {
            std::fs::create_dir_all(&n.dir)
                .with_context(|| format!("create {}", n.dir.display()))?;
            if let Some(cfg) = &disks {
                mounted.push(Disk::mount(cfg, &n.dir, idx, &run_id)?);
            }
            create_data_dir(n, n.id, disks.is_some())?;
            if faketime {
                write_offset(&n.faketime_path(), 0)?;
            }
        }
        let mut mounted = mounted.into_iter();
        let slots = nodes
            .iter()
            .map(|n| Slot {
                id: n.id,
                vacant: false,
                joined: false,
                child: None,
                disk: mounted.next(),
            })
            .collect();
        Ok(Cluster {
            bin,
            run_id,
            nodes,
            faketime,
            extra_args: Vec::new(),
            env: Vec::new(),
            security: Default::default(),
            slots: Mutex::new(slots),
        })
    }

    /// The bootstrap voters: every slot's first node.
    fn peers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Public addresses of the other slots, for `--join`.
    fn others(&self, n: &NodeSpec) -> String {
        self.nodes
            .iter()
            .filter(|o| o.listen != n.listen)
            .map(|o| o.listen.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn command(&self, n: &NodeSpec, id: u64, joined: bool) -> Command {
        let mut c = match &n.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        c.arg("serve")
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                &n.listen,
                "--peer-listen",
                &n.peer,
                "--http",
                &n.http,
            ])
            .arg("--data-dir")
            .arg(n.data_dir(id));
        if joined {
            c.args(["--join", &self.others(n)]);
        } else {
            c.args(["--peers", &self.peers()]);
        }
        // Namespaced nodes of a plain run listen on non-loopback addresses.
        c.args((n.netns.is_some() && self.security.token.is_none()).then_some("--insecure"))
            .args(&self.extra_args);
        c.env(clean::ENV_RUN, &self.run_id)
            .env(clean::ENV_OWNER, std::process::id().to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if self.faketime {
            c.env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME_TIMESTAMP_FILE", n.faketime_path())
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        c
    }

    /// Turns on TLS and tokens: `kairos certs init` into `dir` (certificates
    /// for every id up to [`ID_MAX`], naming every slot's host), an admin
    /// token file, and the flags that use them.
    pub fn secure(&mut self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let certs = dir.join("certs");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["certs", "init", "--nodes", &ID_MAX.to_string(), "--out"])
            .arg(&certs);
        for n in &self.nodes {
            let host = n
                .listen
                .rsplit_once(':')
                .map_or(n.listen.as_str(), |(h, _)| h);
            cmd.args(["--host", host]);
        }
        let out = cmd.output().context("run kairos certs init")?;
        anyhow::ensure!(
            out.status.success(),
            "kairos certs init: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = format!("jepsen-admin-{}-{}", self.run_id, std::process::id());
        let token_file = dir.join("admin.token");
        std::fs::write(&token_file, format!("{token}\n"))?;
        self.extra_args.extend([
            "--tls-dir".to_string(),
            certs.display().to_string(),
            "--auth-token-file".to_string(),
            token_file.display().to_string(),
        ]);
        self.security = crate::client::Security {
            ca_pem: Some(std::fs::read(certs.join("ca.crt"))?),
            token: Some(token),
        };
        Ok(())
    }

    /// Starts (or restarts) the node living in slot `idx`.
    pub fn start(&self, idx: usize) -> Result<()> {
        let mut slots = self.lock();
        anyhow::ensure!(!slots[idx].vacant, "slot {idx} is vacant");
        self.spawn(idx, &mut slots[idx])
    }

    fn spawn(&self, idx: usize, slot: &mut Slot) -> Result<()> {
        let n = &self.nodes[idx];
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.log_path())?;
        writeln!(log, "=== kairos-jepsen: starting node {} ===", slot.id)?;
        let child = self
            .command(n, slot.id, slot.joined)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", self.bin.display()))?;
        clean::register_pid(child.id());
        if let Some(mut old) = slot.child.take() {
            reap(&mut old);
        }
        slot.child = Some(child);
        Ok(())
    }

    pub fn start_all(&self) -> Result<()> {
        (0..self.nodes.len()).try_for_each(|i| self.start(i))
    }

    /// Starts slot `idx`'s node if it is not running (and the slot is not
    /// vacant); true if it started it.
    pub fn restart_if_down(&self, idx: usize) -> Result<bool> {
        let mut slots = self.lock();
        let slot = &mut slots[idx];
        if slot.vacant
            || slot
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
        {
            return Ok(false);
        }
        self.spawn(idx, slot).map(|()| true)
    }

    /// The id of the node living in slot `idx`; `None` while it is vacant.
    pub fn id(&self, idx: usize) -> Option<u64> {
        let slots = self.lock();
        (!slots[idx].vacant).then_some(slots[idx].id)
    }

    /// Stops slot `idx`'s node for good (it was removed from the cluster)
    /// and wipes its data: the slot is vacant. Returns the retired id.
    pub fn retire(&self, idx: usize) -> Result<u64> {
        let mut slots = self.lock();
        let slot = &mut slots[idx];
        if let Some(mut c) = slot.child.take() {
            reap(&mut c);
        }
        slot.vacant = true;
        let dir = self.nodes[idx].data_dir(slot.id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("wipe {}", dir.display()))?;
            if slot.disk.is_some() {
                disk::sync_dir(&self.nodes[idx].disk_root())?;
            }
        }
        Ok(slot.id)
    }

    /// The id a fresh node in slot `idx` would get; `None` past [`ID_MAX`].
    pub fn next_id(&self, idx: usize) -> Option<u64> {
        let id = self.lock()[idx].id + self.nodes.len() as u64;
        (id <= ID_MAX).then_some(id)
    }

    /// Starts a fresh node, with the slot's next id, empty data and
    /// `--join`, in vacant slot `idx`. Returns its id.
    pub fn start_fresh(&self, idx: usize) -> Result<u64> {
        let id = self.next_id(idx).with_context(|| {
            format!("slot {idx} has no id left (ids go up to {ID_MAX}, never reused)")
        })?;
        let mut slots = self.lock();
        let slot = &mut slots[idx];
        anyhow::ensure!(slot.vacant, "slot {idx} is not vacant");
        create_data_dir(&self.nodes[idx], id, slot.disk.is_some())?;
        slot.id = id;
        slot.joined = true;
        slot.vacant = false;
        self.spawn(idx, slot)?;
        Ok(id)
    }

    /// SIGKILL node `idx` and wait for it.
    pub fn kill(&self, idx: usize) {
        if let Some(mut c) = self.lock()[idx].child.take() {
            reap(&mut c);
        }
    }

    /// Sends `sig` (STOP, CONT) to node `idx`'s process, if it is still ours.
    pub fn signal(&self, idx: usize, sig: Signal) -> bool {
        match self.lock()[idx].child.as_mut() {
            Some(c) => signal::child(c, sig),
            None => false,
        }
    }

    /// Sets node `idx`'s clock offset; takes effect on its next clock read.
    pub fn set_clock_offset(&self, idx: usize, offset_s: i64) -> Result<()> {
        write_offset(&self.nodes[idx].faketime_path(), offset_s)
    }

    /// Resumes and kills every node, then unmounts the lazy disks.
    pub fn shutdown(&self) {
        for i in 0..self.nodes.len() {
            self.signal(i, Signal::CONT);
            self.kill(i);
        }
        for slot in self.lock().iter_mut() {
            if let Some(mut d) = slot.disk.take() {
                d.stop();
            }
        }
    }

    /// Whether the slots' data live on lazy disks.
    pub fn has_disks(&self) -> bool {
        self.lock().iter().any(|s| s.disk.is_some())
    }

    /// Runs `f` on slot `idx`'s lazy disk control.
    pub fn disk<R>(
        &self,
        idx: usize,
        f: impl FnOnce(&mut Control) -> lazy::Result<R>,
    ) -> Result<R> {
        let mut slots = self.lock();
        let disk = slots[idx]
            .disk
            .as_mut()
            .context("the nodes do not run on lazy disks (no power/disk nemesis asked for)")?;
        Ok(f(disk.ctl())?)
    }

    pub fn disk_status(&self, idx: usize) -> Result<Status> {
        self.disk(idx, |c| c.status())
    }

    /// SIGKILLs the nodes of slots `idxs`, waits until they are dead, and
    /// cuts their disks' power, all under the slots' lock (nothing restarts
    /// a node in between). Returns each slot's node id (if any) and report.
    pub fn kill_and_power(
        &self,
        idxs: &[usize],
        tear: bool,
    ) -> Result<Vec<(Option<u64>, PowerReport)>> {
        let mut slots = self.lock();
        anyhow::ensure!(
            idxs.iter().all(|i| slots[*i].disk.is_some()),
            "the nodes do not run on lazy disks (no power/disk nemesis asked for)"
        );
        for &i in idxs {
            if let Some(mut c) = slots[i].child.take() {
                reap(&mut c);
            }
        }
        let mut out = Vec::new();
        for &i in idxs {
            let slot = &mut slots[i];
            let id = (!slot.vacant).then_some(slot.id);
            let report = slot
                .disk
                .as_mut()
                .expect("checked above")
                .ctl()
                .power(tear)?;
            out.push((id, report));
        }
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The last lines of node `idx`'s log, for error messages.
    pub fn log_tail(&self, idx: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(self.nodes[idx].log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Creates node `id`'s data directory in slot `n`; on a lazy disk, fsyncs
/// it and the disk's root so the entry survives a power cut.
fn create_data_dir(n: &NodeSpec, id: u64, lazy: bool) -> Result<()> {
    let dir = n.data_dir(id);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    if lazy {
        disk::sync_dir(&dir)?;
        disk::sync_dir(&n.disk_root())?;
    }
    Ok(())
}

fn reap(c: &mut Child) {
    signal::child(c, Signal::CONT);
    let _ = c.kill();
    let _ = c.wait();
    clean::unregister_pid(c.id());
}

/// Writes a libfaketime offset ("+5s") atomically: a reader never sees a
/// half-written file.
pub fn write_offset(path: &Path, offset_s: i64) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{offset_s:+}s\n"))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three loopback slots whose "kairos" is `echo`: each start writes its
    /// command line into the slot's log.
    fn echo_cluster(dir: &Path) -> Cluster {
        let specs = (1..=3u64)
            .map(|id| NodeSpec::fake(id, &dir.join(format!("n{id}"))))
            .collect();
        Cluster::new(PathBuf::from("/bin/echo"), "test".into(), specs, false).unwrap()
    }

    /// Waits (up to 10 s) until slot `idx`'s log holds `text`: `echo` has run.
    fn wait_log(c: &Cluster, idx: usize, text: &str) -> String {
        for _ in 0..1_000 {
            let log = std::fs::read_to_string(c.nodes[idx].log_path()).unwrap_or_default();
            if log.contains(text) {
                return log;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("slot {idx}'s log never showed {text:?}");
    }

    #[test]
    fn a_slot_hosts_fresh_ids_never_reused_and_wipes_retired_data() {
        let dir = std::env::temp_dir().join(format!("kj-slots-{}", std::process::id()));
        let c = echo_cluster(&dir);
        c.start(1).unwrap();
        let log = wait_log(&c, 1, "--id 2 ");
        let peers = "--peers 1=127.0.0.1:1201,2=127.0.0.1:1202,3=127.0.0.1:1203";
        assert!(log.contains(peers), "{log}");
        assert_eq!((c.id(1), c.next_id(1)), (Some(2), Some(5)));
        assert!(c.start_fresh(1).is_err(), "slot 1 is not vacant");
        std::fs::write(c.nodes[1].data_dir(2).join("db"), b"x").unwrap();

        assert_eq!(c.retire(1).unwrap(), 2);
        assert!(!c.nodes[1].data_dir(2).exists(), "retired data wiped");
        assert_eq!(c.id(1), None);
        assert!(
            !c.restart_if_down(1).unwrap(),
            "a vacant slot starts nothing"
        );
        assert!(c.start(1).is_err());

        assert_eq!(c.start_fresh(1).unwrap(), 5);
        assert_eq!(c.id(1), Some(5));
        assert!(c.nodes[1].data_dir(5).exists());
        let log = wait_log(&c, 1, "--id 5 ");
        assert!(
            log.contains("--join 127.0.0.1:1001,127.0.0.1:1003"),
            "{log}"
        );

        let mut ids = vec![5];
        while c.next_id(1).is_some() {
            c.retire(1).unwrap();
            ids.push(c.start_fresh(1).unwrap());
        }
        assert_eq!(ids.last(), Some(&62));
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 3));
        c.retire(1).unwrap();
        assert!(c.start_fresh(1).is_err(), "ids stop at {ID_MAX}");
        drop(c);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn offsets_are_signed_seconds() {
        let dir = std::env::temp_dir().join(format!("kj-offset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("faketime");
        write_offset(&p, 0).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "+0s\n");
        write_offset(&p, -7).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "-7s\n");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
