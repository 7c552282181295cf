//! A node's data directory on `kairos-lazyfs` (jepsen/lazyfs): a real FUSE
//! filesystem that can fill up (`ENOSPC`), fail the next fsync (`EIO`), and
//! lose on a power cut whatever no fsync covered. Needs root and /dev/fuse.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub use kairos_lazyfs::control::{Control, Mount};

/// The `kairos-lazyfs` binary, built on first use like [`crate::kairos_bin`].
pub fn lazyfs_bin() -> PathBuf {
    static PINNED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    crate::workspace_bin(
        "KAIROS_LAZYFS_BIN",
        "kairos-lazyfs",
        "kairos-lazyfs",
        &PINNED,
    )
}

/// A mounted lazy disk; unmounted (its daemon stopped) when dropped.
pub struct LazyDisk {
    pub mountpoint: PathBuf,
    daemon: Child,
    ctl: Control,
}

impl LazyDisk {
    /// Mounts a disk of `size_mb` at `dir` (created if missing); its daemon's
    /// control socket and log go beside `dir`.
    pub fn mount(dir: &Path, size_mb: u64) -> LazyDisk {
        assert!(
            rustix::process::geteuid().is_root() && Path::new("/dev/fuse").exists(),
            "this test mounts a FUSE filesystem: it needs root and /dev/fuse"
        );
        std::fs::create_dir_all(dir).expect("mountpoint");
        let mount = Mount {
            bin: &lazyfs_bin(),
            mountpoint: dir,
            control: &dir.with_extension("lazyfs.sock"),
            seed: 0,
            size_mb,
            log: &dir.with_extension("lazyfs.log"),
        };
        let (daemon, ctl) = mount
            .start(&[], Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}"));
        LazyDisk {
            mountpoint: dir.to_path_buf(),
            daemon,
            ctl,
        }
    }

    pub fn ctl(&mut self) -> &mut Control {
        &mut self.ctl
    }
}

impl Drop for LazyDisk {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.daemon);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.daemon.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.daemon.try_wait(), Ok(None)) {
            let _ = self.daemon.kill();
            let _ = self.daemon.wait();
        }
        // A daemon killed before it unmounted leaves a dead mount behind.
        let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
    }
}
