//! The data directory's disk: how much room is left, what the node does
//! when it runs out, and how it comes back.
//!
//! - A [`Monitor`] reads `statvfs` of the data directory every second into
//!   `kairos_disk_free_bytes`. Below the reserve (`--disk-reserve-mb`) the
//!   disk is *low*: client writes are refused with `UNAVAILABLE` naming the
//!   directory and its free bytes, a leader hands its leadership to another
//!   voter, and the node neither appends what peers send nor starts or
//!   joins elections, so nothing more is written. Above the reserve again,
//!   all of that resumes by itself.
//! - A write that fails anyway with `ENOSPC` (the disk filled between two
//!   reads) fails the durable sync, which is fatal to the store
//!   (`store::durable`): the process restarts in place ([`restart_in_place`]:
//!   the same binary and arguments, the same pid), and at start waits for
//!   the reserve ([`wait_for_space`]) before opening the store, so it does
//!   not crash-loop; then it recovers from its log like any restart.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default of `--disk-reserve-mb`.
pub const RESERVE_MB_DEFAULT: u64 = 64;
/// How often the monitor reads the free space.
pub const POLL: Duration = Duration::from_secs(1);
/// Environment variable a restarted-in-place process finds (the count).
const RESTARTS_ENV: &str = "KAIROS_DISK_RESTARTS";

/// Bytes free to an unprivileged writer in `dir`'s filesystem.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Space [`wait_for_space`] wants even with `--disk-reserve-mb 0`: opening
/// the store writes, and a store that fails on a full disk restarts the
/// node in place, which must not spin on a disk with nothing free.
pub const OPEN_FLOOR_BYTES: u64 = 1 << 20;

/// Blocks until `dir` has at least `reserve` bytes free (and at least
/// [`OPEN_FLOOR_BYTES`]), saying so every ten seconds while it waits.
/// Called before the store is opened.
pub fn wait_for_space(dir: &Path, reserve: u64) -> std::io::Result<()> {
    let reserve = reserve.max(OPEN_FLOOR_BYTES);
    let mut said = None::<std::time::Instant>;
    loop {
        let free = free_bytes(dir)?;
        if free >= reserve {
            if said.is_some() {
                tracing::info!(free, "disk space is back; opening the store");
            }
            return Ok(());
        }
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            let why = format!(
                "disk full: {} has {free} bytes free, below the reserve of {reserve} \
                 (--disk-reserve-mb); waiting for space before opening the store",
                dir.display()
            );
            tracing::warn!("{why}");
            eprintln!("kairos: {why}");
            said = Some(std::time::Instant::now());
        }
        std::thread::sleep(POLL);
    }
}

/// Replaces this process with a fresh run of the same binary and
/// arguments (environment kept, pid kept): what a full disk does to a
/// node after its store failed. Returns only if the exec failed, after
/// saying why.
pub fn restart_in_place() {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kairos: cannot restart in place: no executable path: {e}");
            return;
        }
    };
    let restarts: u64 = std::env::var(RESTARTS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(RESTARTS_ENV, (restarts + 1).to_string())
        .exec();
    eprintln!("kairos: cannot restart in place: {err}");
}

/// Whether the data directory's disk is below its reserve, as last read.
#[derive(Clone)]
pub struct Monitor {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    reserve: u64,
    low: AtomicBool,
    free: AtomicU64,
}

/// What a write refused for a low disk is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Low {
    pub dir: PathBuf,
    pub free: u64,
    pub reserve: u64,
}

impl std::fmt::Display for Low {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "disk full on this node: {} has {} bytes free, below the reserve of {} \
             (--disk-reserve-mb); writes resume when space returns",
            self.dir.display(),
            self.free,
            self.reserve
        )
    }
}

impl Monitor {
    pub fn new(dir: PathBuf, reserve: u64) -> Monitor {
        Monitor {
            inner: Arc::new(Inner {
                dir,
                reserve,
                low: AtomicBool::new(false),
                free: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// `Err` while the disk is below its reserve.
    pub fn check(&self) -> Result<(), Low> {
        if !self.inner.low.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(Low {
            dir: self.inner.dir.clone(),
            free: self.inner.free.load(Ordering::Relaxed),
            reserve: self.inner.reserve,
        })
    }

    pub fn is_low(&self) -> bool {
        self.inner.low.load(Ordering::Acquire)
    }

    /// Records a reading; returns the new state when it changed.
    pub fn observe(&self, free: u64) -> Option<bool> {
        self.inner.free.store(free, Ordering::Relaxed);
        let low = free < self.inner.reserve;
        let was = self.inner.low.swap(low, Ordering::AcqRel);
        (was != low).then_some(low)
    }

    /// Reads the disk once: the free bytes, and the new state if it changed.
    pub fn poll(&self) -> std::io::Result<(u64, Option<bool>)> {
        let free = free_bytes(&self.inner.dir)?;
        Ok((free, self.observe(free)))
    }

    pub fn reserve(&self) -> u64 {
        self.inner.reserve
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_below_the_reserve_and_back_above_it() {
        let m = Monitor::new(PathBuf::from("/data"), 100);
        assert!(m.check().is_ok());
        assert_eq!(m.observe(500), None, "not low, unchanged");
        assert_eq!(m.observe(99), Some(true));
        let low = m.check().unwrap_err();
        assert_eq!(low.free, 99);
        let said = low.to_string();
        assert!(
            said.contains("/data") && said.contains("99 bytes free"),
            "{said}"
        );
        assert_eq!(m.observe(10), None, "still low");
        assert_eq!(m.check().unwrap_err().free, 10);
        assert_eq!(m.observe(100), Some(false), "at the reserve is enough");
        assert!(m.check().is_ok());
    }

    #[test]
    fn a_real_directory_has_free_bytes_and_waiting_for_none_returns() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        wait_for_space(dir.path(), 0).unwrap();
        let m = Monitor::new(dir.path().to_path_buf(), 0);
        let (read, changed) = m.poll().unwrap();
        assert!(read > 0);
        assert_eq!(changed, None);
    }
}
