//! A slot's lazy disk: a `kairos-lazyfs` daemon (jepsen/lazyfs) mounted at
//! the slot's `data/` directory, so everything its nodes store lives on a
//! filesystem that forgets what no fsync covered when the power nemesis
//! says so. One daemon per slot, started before the slot's first node and
//! stopped (unmounted) after its last; the daemon runs in the harness' own
//! mount namespace, so nodes started later through `ip netns exec` see the
//! mount. The node's log and faketime file stay on the real disk beside it.
//!
//! A mount that cannot be made fails the run with the daemon's own words:
//! never a silent fallback to a plain directory.

use crate::clean;
use anyhow::{bail, Context, Result};
use kairos_lazyfs::control::{Control, Mount};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Overrides where the `kairos-lazyfs` binary is looked for.
pub const ENV_BIN: &str = "KAIROS_LAZYFS_BIN";
/// How long a daemon may take to mount and answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon may take to unmount after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Capacity of each disk (what statfs reports); the data lives in memory.
pub const SIZE_MB: u64 = 8_192;

/// How the run's disks are made.
#[derive(Debug, Clone)]
pub struct DiskConfig {
    pub bin: PathBuf,
    /// Slot `k`'s torn-write lengths are seeded with `seed + k`.
    pub seed: u64,
    pub size_mb: u64,
}

impl DiskConfig {
    /// Disks for a run of `nemeses`: `Some` when one of them needs them.
    /// The binary is `$KAIROS_LAZYFS_BIN`, else `kairos-lazyfs` beside the
    /// `kairos` binary (one `cargo build` target directory).
    pub fn for_run(nemeses: &[String], kairos_bin: &Path, seed: u64) -> Result<Option<DiskConfig>> {
        if !nemeses
            .iter()
            .any(|f| crate::run::FUSE_FAMILIES.contains(&f.as_str()))
        {
            return Ok(None);
        }
        let bin = match std::env::var_os(ENV_BIN) {
            Some(b) => PathBuf::from(b),
            None => kairos_bin.with_file_name("kairos-lazyfs"),
        };
        if !bin.is_file() {
            bail!(
                "the power/disk nemeses need {} (cargo build -p kairos-lazyfs, or set {ENV_BIN})",
                bin.display()
            );
        }
        Ok(Some(DiskConfig {
            bin,
            seed,
            size_mb: SIZE_MB,
        }))
    }
}

pub struct Disk {
    pub mountpoint: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    ctl: Control,
}

impl Disk {
    /// Mounts slot `idx`'s disk at `slot_dir/data` and waits until its
    /// daemon answers; the daemon's log is `slot_dir/lazyfs.log`.
    pub fn mount(cfg: &DiskConfig, slot_dir: &Path, idx: usize, run_id: &str) -> Result<Disk> {
        let mountpoint = slot_dir.join("data");
        std::fs::create_dir_all(&mountpoint)
            .with_context(|| format!("create {}", mountpoint.display()))?;
        let log = slot_dir.join("lazyfs.log");
        let mount = Mount {
            bin: &cfg.bin,
            mountpoint: &mountpoint,
            control: &slot_dir.join("lazyfs.sock"),
            seed: cfg.seed.wrapping_add(idx as u64),
            size_mb: cfg.size_mb,
            log: &log,
        };
        let env = [
            (clean::ENV_RUN, run_id.to_string()),
            (clean::ENV_OWNER, std::process::id().to_string()),
        ];
        clean::register_mount(&mountpoint);
        match mount.start(&env, READY_TIMEOUT) {
            Ok((child, ctl)) => {
                clean::register_pid(child.id());
                Ok(Disk {
                    mountpoint,
                    log,
                    child: Some(child),
                    ctl,
                })
            }
            Err(e) => {
                clean::unmount_if_mounted(&mountpoint);
                clean::unregister_mount(&mountpoint);
                bail!("slot {idx}: {e}")
            }
        }
    }

    pub fn ctl(&mut self) -> &mut Control {
        &mut self.ctl
    }

    /// SIGTERM (the daemon unmounts), then SIGKILL and a lazy unmount if it
    /// does not exit in time. Safe to repeat.
    pub fn stop(&mut self) {
        Stopper(self.child.take(), self.mountpoint.clone()).stop();
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A daemon process and its mountpoint, to end.
struct Stopper(Option<Child>, PathBuf);

impl Stopper {
    fn stop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        crate::signal::child(&mut child, crate::signal::Signal::TERM);
        let start = Instant::now();
        while matches!(child.try_wait(), Ok(None)) && start.elapsed() < STOP_TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        clean::unregister_pid(child.id());
        clean::unmount_if_mounted(&self.1);
        clean::unregister_mount(&self.1);
    }
}

/// fsync of a directory: makes its entries durable on a lazy disk (the
/// harness, as the operator, makes the data directories it creates or
/// wipes durable; what a node does inside them is the node's business).
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync directory {}", dir.display()))
}
