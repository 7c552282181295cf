//! A real `kairos-lazyfs` daemon mounted in a temporary directory, driven
//! through its control socket. These tests need root and /dev/fuse: without
//! them they fail, saying so, rather than pass having checked nothing.

#![allow(dead_code)]

use kairos_lazyfs::control::Control;
use kairos_lazyfs::protocol::{PowerReport, Status};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_kairos-lazyfs");
pub const PAGE: usize = 4096;

/// Panics, with the reason, unless the tests can mount FUSE here.
pub fn require_fuse() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the kairos-lazyfs integration tests mount FUSE and must run as root (CI does)"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "no /dev/fuse: the kairos-lazyfs integration tests need FUSE (modprobe fuse; Debian's fuse3)"
    );
}

pub struct Mounted {
    pub mnt: PathBuf,
    pub sock: PathBuf,
    pub ctl: Control,
    log: PathBuf,
    child: Option<Child>,
    // Dropped last: after the daemon unmounted.
    _dir: tempfile::TempDir,
}

impl Mounted {
    pub fn start() -> Mounted {
        Mounted::with_args(&[])
    }

    pub fn with_args(extra: &[&str]) -> Mounted {
        require_fuse();
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let sock = dir.path().join("control.sock");
        let log = dir.path().join("lazyfs.log");
        let mut child = Command::new(BIN)
            .args(["mount", "--seed", "1", "--mountpoint"])
            .arg(&mnt)
            .arg("--control")
            .arg(&sock)
            .args(extra)
            .stdin(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let ctl = Control::wait_ready(&sock, Duration::from_secs(20), Some(&mut child))
            .unwrap_or_else(|e| {
                panic!(
                    "{e}; daemon said: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            });
        Mounted {
            mnt,
            sock,
            ctl,
            log,
            child: Some(child),
            _dir: dir,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn power(&mut self, tear: bool) -> PowerReport {
        self.ctl.power(tear).unwrap()
    }

    pub fn status(&mut self) -> Status {
        self.ctl.status().unwrap()
    }

    /// fsync of a directory: what makes its entries durable.
    pub fn sync_dir(&self, rel: &str) {
        File::open(self.path(rel)).unwrap().sync_all().unwrap();
    }

    /// SIGTERM, and the daemon's exit status and log.
    pub fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = child.wait().unwrap();
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// Is `path` a mount point now?
pub fn is_mounted(path: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let wanted = path.to_string_lossy().into_owned();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(wanted.as_str()))
}
