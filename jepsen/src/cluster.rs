//! The Kairos node processes: how each is launched (inside its namespace via
//! `ip netns exec`, or directly on loopback), with libfaketime preloaded from
//! the start when clock faults are wanted so its offset can be changed later
//! by rewriting a file, and how it is killed, paused, resumed and restarted
//! with the same data directory and flags. Logs append to one file per node.

use crate::clean;
use crate::signal::{self, Signal};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub id: u64,
    /// Public gRPC address, reachable from the harness.
    pub listen: String,
    /// Peer (Raft) address.
    pub peer: String,
    pub http: String,
    pub netns: Option<String>,
    /// Holds `data/`, `kairos.log` and `faketime`.
    pub dir: PathBuf,
}

impl NodeSpec {
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kairos.log")
    }
    pub fn faketime_path(&self) -> PathBuf {
        self.dir.join("faketime")
    }
}

pub struct Cluster {
    pub bin: PathBuf,
    pub run_id: String,
    pub nodes: Vec<NodeSpec>,
    pub faketime: bool,
    /// Appended to every `kairos serve` command line.
    pub extra_args: Vec<String>,
    /// What clients present ([`Cluster::secure`] fills it in).
    pub security: crate::client::Security,
    procs: Mutex<Vec<Option<Child>>>,
}

impl Cluster {
    pub fn new(
        bin: PathBuf,
        run_id: String,
        nodes: Vec<NodeSpec>,
        faketime: bool,
    ) -> Result<Cluster> {
        for n in &nodes {
            std::fs::create_dir_all(n.data_dir())
                .with_context(|| format!("create {}", n.data_dir().display()))?;
            if faketime {
                write_offset(&n.faketime_path(), 0)?;
            }
        }
        let procs = Mutex::new(nodes.iter().map(|_| None).collect());
        Ok(Cluster {
            bin,
            run_id,
            nodes,
            faketime,
            extra_args: Vec::new(),
            security: Default::default(),
            procs,
        })
    }

    fn peers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn command(&self, n: &NodeSpec) -> Command {
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
                &n.id.to_string(),
                "--listen",
                &n.listen,
                "--peer-listen",
                &n.peer,
                "--http",
                &n.http,
            ])
            .arg("--data-dir")
            .arg(n.data_dir())
            .args(["--peers", &self.peers()])
            // Namespaced nodes of a plain run listen on non-loopback addresses.
            .args((n.netns.is_some() && self.security.token.is_none()).then_some("--insecure"))
            .args(&self.extra_args);
        c.env(clean::ENV_RUN, &self.run_id)
            .env(clean::ENV_OWNER, std::process::id().to_string());
        if self.faketime {
            c.env("LD_PRELOAD", FAKETIME_LIB)
                .env("FAKETIME_TIMESTAMP_FILE", n.faketime_path())
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        c
    }

    /// Turns on TLS and tokens: `kairos certs init` into `dir` (naming
    /// every node's host), an admin token file, and the flags that use them.
    pub fn secure(&mut self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let certs = dir.join("certs");
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            "certs",
            "init",
            "--nodes",
            &self.nodes.len().to_string(),
            "--out",
        ])
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

    /// Starts (or restarts) node `idx`.
    pub fn start(&self, idx: usize) -> Result<()> {
        let n = &self.nodes[idx];
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(n.log_path())?;
        writeln!(log, "=== kairos-jepsen: starting node {} ===", n.id)?;
        let child = self
            .command(n)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", self.bin.display()))?;
        clean::register_pid(child.id());
        let mut procs = self.lock();
        if let Some(mut old) = procs[idx].take() {
            reap(&mut old);
        }
        procs[idx] = Some(child);
        Ok(())
    }

    pub fn start_all(&self) -> Result<()> {
        (0..self.nodes.len()).try_for_each(|i| self.start(i))
    }

    /// SIGKILL node `idx` and wait for it.
    pub fn kill(&self, idx: usize) {
        if let Some(mut c) = self.lock()[idx].take() {
            reap(&mut c);
        }
    }

    /// Sends `sig` (STOP, CONT) to node `idx`'s process, if it is still ours.
    pub fn signal(&self, idx: usize, sig: Signal) -> bool {
        match self.lock()[idx].as_mut() {
            Some(c) => signal::child(c, sig),
            None => false,
        }
    }

    /// Is node `idx`'s process alive (possibly paused)?
    pub fn running(&self, idx: usize) -> bool {
        let mut procs = self.lock();
        match procs[idx].as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sets node `idx`'s clock offset; takes effect on its next clock read.
    pub fn set_clock_offset(&self, idx: usize, offset_s: i64) -> Result<()> {
        write_offset(&self.nodes[idx].faketime_path(), offset_s)
    }

    /// Resumes and kills every node.
    pub fn shutdown(&self) {
        for i in 0..self.nodes.len() {
            self.signal(i, Signal::CONT);
            self.kill(i);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Child>>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
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
