//! Process and disk measurements from Linux `/proc`: CPU time from
//! `/proc/PID/stat` (utime + stime, in clock ticks assumed to be 100 Hz, the
//! Linux default), resident and peak memory from `/proc/PID/status` (VmRSS,
//! VmHWM), and on-disk bytes of a directory tree (allocated blocks, as `du`).

use std::path::Path;
use std::time::Instant;

/// Clock ticks per second of /proc/PID/stat (USER_HZ; 100 on Linux).
pub const TICKS_PER_S: f64 = 100.0;
/// Most directory entries visited by [`dir_bytes`].
const DU_MAX_ENTRIES: usize = 1_000_000;
/// Deepest directory level visited by [`dir_bytes`].
const DU_MAX_DEPTH: usize = 16;

#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub at: Instant,
    pub cpu_ticks: u64,
    pub rss_bytes: u64,
    pub hwm_bytes: u64,
}

/// One reading of `pid`'s CPU time and memory, or None when it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': f[0] is field 3 (state), so utime (14) is f[11], stime (15) f[12].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(ProcSample {
        at: Instant::now(),
        cpu_ticks: utime + stime,
        rss_bytes: status_kb(&status, "VmRSS:")? * 1024,
        hwm_bytes: status_kb(&status, "VmHWM:").unwrap_or(0) * 1024,
    })
}

fn status_kb(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// Average CPU use between two samples, in percent of one core.
pub fn cpu_percent(a: &ProcSample, b: &ProcSample) -> f64 {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    let ticks = b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64;
    100.0 * ticks / TICKS_PER_S / secs
}

/// Bytes allocated on disk under `root` (512-byte blocks, like `du`).
pub fn dir_bytes(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > DU_MAX_ENTRIES {
                return total;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() && depth < DU_MAX_DEPTH {
                stack.push((e.path(), depth + 1));
            } else if md.is_file() {
                total += md.blocks() * 512;
            }
        }
    }
    total
}
