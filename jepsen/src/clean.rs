//! Teardown and reaping. Everything the harness creates (node processes,
//! network namespaces, bridge and veth links) is registered here so a single
//! synchronous `cleanup_registered` can undo it from normal exit, Ctrl-C, a
//! panic or the watchdog. `reap_stale` (the `clean` command, also run before
//! every run) removes leftovers of earlier runs whose harness is gone: node
//! processes carry `KAIROS_JEPSEN_RUN`/`KAIROS_JEPSEN_OWNER` in their
//! environment, and namespaces and links follow the `kj<runid>…` naming.
//! Lazy disks (`disk.rs`) are FUSE mounts of the source `kairos-lazyfs`:
//! their daemons are harness processes like the nodes, and a mount whose
//! daemon is gone (it answers ENOTCONN) is unmounted lazily.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::signal;

pub const ENV_RUN: &str = "KAIROS_JEPSEN_RUN";
pub const ENV_OWNER: &str = "KAIROS_JEPSEN_OWNER";
/// Every name the harness gives a namespace or link starts with this.
pub const NAME_PREFIX: &str = "kj";

#[derive(Default)]
struct Registry {
    /// (pid, start time) of node processes we started.
    pids: Vec<(u32, u64)>,
    netns: Vec<String>,
    links: Vec<String>,
    mounts: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    netns: Vec::new(),
    links: Vec::new(),
    mounts: Vec::new(),
});

/// The source of a lazy disk's mount in /proc/self/mounts (its type is `fuse`).
pub const LAZYFS_SOURCE: &str = "kairos-lazyfs";

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g)
}

pub fn register_pid(pid: u32) {
    if let Some(start) = signal::start_time(pid) {
        with(|r| r.pids.push((pid, start)));
    }
}

pub fn unregister_pid(pid: u32) {
    with(|r| r.pids.retain(|(p, _)| *p != pid));
}

pub fn register_netns(name: &str) {
    with(|r| r.netns.push(name.to_string()));
}

pub fn register_link(name: &str) {
    with(|r| r.links.push(name.to_string()));
}

pub fn register_mount(path: &Path) {
    with(|r| r.mounts.push(path.to_owned()));
}

pub fn unregister_mount(path: &Path) {
    with(|r| r.mounts.retain(|m| m != path));
}

/// (mount point, is a lazy disk) of every mount this process sees.
fn mounts() -> Vec<(PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (source, at, kind) = (f.next()?, f.next()?, f.next()?);
            let lazy = source == LAZYFS_SOURCE && kind.starts_with("fuse");
            Some((PathBuf::from(at.replace("\\040", " ")), lazy))
        })
        .collect()
}

/// Lazily unmounts `path` if something is mounted there (a dead FUSE mount
/// included); true if it unmounted.
pub fn unmount_if_mounted(path: &Path) -> bool {
    // Not canonicalize(path): a dead FUSE mount cannot be stat'ed.
    let path = match (
        path.parent().and_then(|p| p.canonicalize().ok()),
        path.file_name(),
    ) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => path.to_owned(),
    };
    if !mounts().iter().any(|(at, _)| *at == path) {
        return false;
    }
    // umount2(MNT_DETACH) as root; fusermount3 is the only way without it.
    rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH).is_ok()
        || quiet("fusermount3", &["-u", "-z", &path.to_string_lossy()])
}

/// Unmounts lazy disks whose daemon is gone. A daemon just killed
/// (`killed`) leaves a live-looking mount for a moment: wait up to 2 s for
/// the kernel to drop its connection.
fn reap_dead_disks(killed: bool) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut dead = dead_lazy_disks();
    while killed && dead.is_empty() && std::time::Instant::now() < deadline {
        if !mounts().iter().any(|(_, lazy)| *lazy) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        dead = dead_lazy_disks();
    }
    dead.into_iter()
        .filter(|m| unmount_if_mounted(m))
        .map(|m| format!("unmounted dead lazy disk {}", m.display()))
        .collect()
}

/// Lazy disks whose daemon is gone: their mount answers ENOTCONN.
fn dead_lazy_disks() -> Vec<PathBuf> {
    const ENOTCONN: i32 = 107;
    mounts()
        .into_iter()
        .filter(|(at, lazy)| {
            *lazy && std::fs::metadata(at).is_err_and(|e| e.raw_os_error() == Some(ENOTCONN))
        })
        .map(|(at, _)| at)
        .collect()
}

/// Runs a command quietly; true if it succeeded.
pub fn quiet(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Kills registered processes and deletes registered namespaces and links.
pub fn cleanup_registered() {
    let (pids, netns, links, disks) = with(|r| {
        (
            std::mem::take(&mut r.pids),
            std::mem::take(&mut r.netns),
            std::mem::take(&mut r.links),
            std::mem::take(&mut r.mounts),
        )
    });
    for (pid, start) in pids {
        signal::kill_identified(pid, start);
    }
    for m in disks {
        unmount_if_mounted(&m);
    }
    for ns in netns {
        quiet("ip", &["netns", "del", &ns]);
    }
    for l in links {
        quiet("ip", &["link", "del", &l]);
    }
}

/// Installs a panic hook that tears everything down and exits.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        eprintln!("kairos-jepsen: panic, tearing the cluster down");
        cleanup_registered();
        std::process::exit(101);
    }));
}

/// True if `pid` is a running (not zombie) kairos-jepsen process.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) state ...": comm may contain spaces, so split at the last ')'.
    // Any owner: the kairos-jepsen binary, or a test process driving a
    // cluster through the library.
    let Some((_, tail)) = stat.rsplit_once(')') else {
        return false;
    };
    let state = tail.split_whitespace().next().unwrap_or("Z");
    state != "Z" && state != "X"
}

/// Where runs claim their id before making anything (namespaces, links,
/// processes), so a concurrent run's reap never takes them for leftovers.
fn claims_dir() -> std::path::PathBuf {
    std::env::temp_dir().join("kairos-jepsen-runs")
}

/// Marks run `id` as owned by this process until [`release_run`] (or
/// until this process is gone).
pub fn claim_run(id: &str) {
    let dir = claims_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(id), std::process::id().to_string());
}

pub fn release_run(id: &str) {
    let _ = std::fs::remove_file(claims_dir().join(id));
}

/// Runs claimed by a live process; claims of dead ones are removed.
fn claimed_runs() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(claims_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let owner = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok());
        match owner {
            Some(pid) if alive(pid) => out.push(e.file_name().to_string_lossy().into_owned()),
            _ => {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    out
}

/// Run ids whose harness is still alive (its own run included).
fn live_runs() -> Vec<String> {
    let mut out = claimed_runs();
    for (pid, _, env) in harness_processes() {
        if let Some(owner) = env_var(&env, ENV_OWNER).and_then(|o| o.parse::<u32>().ok()) {
            if alive(owner) && owner != pid {
                if let Some(run) = env_var(&env, ENV_RUN) {
                    out.push(run);
                }
            }
        }
    }
    out
}

/// (pid, start time, environ) of every process started by some harness run.
fn harness_processes() -> Vec<(u32, u64, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Start time first: the environ read after it belongs to that process or a later one,
        // and a later one fails the start-time check before it is signalled.
        let Some(start) = signal::start_time(pid) else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        let env = String::from_utf8_lossy(&env).replace('\0', "\n");
        if env.lines().any(|l| l.starts_with(ENV_RUN)) {
            out.push((pid, start, env));
        }
    }
    out
}

fn env_var(env: &str, name: &str) -> Option<String> {
    env.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
        .map(str::to_string)
}

/// Is `name` one of ours (`kj` + 4 run-id chars + a suffix) and not of a live run?
pub fn is_stale_name(name: &str, live: &[String]) -> bool {
    let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
        return false;
    };
    if rest.len() < 6 || !rest.is_char_boundary(4) {
        return false;
    }
    let (run, suffix) = rest.split_at(4);
    let run_ok = run
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let suffix_ok = matches!(suffix.as_bytes()[0], b'n' | b'h' | b'v' | b'b')
        && suffix[1..].chars().all(|c| c.is_ascii_alphanumeric());
    run_ok && suffix_ok && !live.iter().any(|l| l == run)
}

/// Removes leftovers of dead runs; returns a line per thing removed.
pub fn reap_stale() -> Vec<String> {
    let mut done = Vec::new();
    for (pid, start, env) in harness_processes() {
        let owner = env_var(&env, ENV_OWNER).and_then(|o| o.parse::<u32>().ok());
        if owner.is_some_and(|o| alive(o) && o != pid) {
            continue;
        }
        if signal::kill_identified(pid, start) {
            done.push(format!("killed stale node process {pid}"));
        }
    }
    let killed = !done.is_empty();
    done.extend(reap_dead_disks(killed));
    let list = |args: &[&str]| -> String {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    // Listed first, judged after: a run claims its id before it makes a
    // namespace or link, so anything listed here that belongs to a live run
    // is in `live`.
    let netns = list(&["netns", "list"]);
    let links = list(&["-o", "link", "show"]);
    let live = live_runs();
    for line in netns.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if is_stale_name(name, &live) && quiet("ip", &["netns", "del", name]) {
            done.push(format!("deleted namespace {name}"));
        }
    }
    for line in links.lines() {
        // "12: kjab12br: <...>" or "13: kjab12h1@if2: <...>"
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if is_stale_name(name, &live) && quiet("ip", &["link", "del", name]) {
            done.push(format!("deleted link {name}"));
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_stale() {
        let live = vec!["ab12".to_string()];
        assert!(is_stale_name("kjzz99n1", &live));
        assert!(is_stale_name("kjzz99br", &live));
        assert!(is_stale_name("kjzz99h3", &live));
        assert!(!is_stale_name("kjab12n1", &live), "live run");
        assert!(!is_stale_name("docker0", &live));
        assert!(!is_stale_name("kjZZ99n1", &live));
        assert!(!is_stale_name("kjzz99x1", &live));
        assert!(!is_stale_name("kj", &live));
    }

    #[test]
    fn env_var_is_parsed_from_environ() {
        let env = "PATH=/bin\nKAIROS_JEPSEN_RUN=ab12\nKAIROS_JEPSEN_OWNER=42\n";
        assert_eq!(env_var(env, ENV_RUN).as_deref(), Some("ab12"));
        assert_eq!(env_var(env, ENV_OWNER).as_deref(), Some("42"));
        assert_eq!(env_var(env, "NOPE"), None);
    }
}
