//! The daemon: mounts the model at the mountpoint (before anything else, so
//! a failed mount is an error and never a plain directory), serves the
//! control socket, and on SIGTERM or SIGINT unmounts and exits. The mount is
//! made in the caller's mount namespace, so `ip netns exec` children started
//! after it see it; `allow_other` and `default_permissions` let any process
//! (root in a namespace included) use it under normal mode checks.
//!
//! The signals are blocked in every thread and taken with `sigtimedwait` on
//! the main thread, which also notices the session ending on its own (an
//! unmount from outside, e.g. `kairos-jepsen clean`).

use crate::fuse::{lock, LazyFs, Shared};
use crate::model::{Fs, Owner};
use crate::protocol::{error_line, ok_line, Command, Status};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest command line read from the control socket.
const LINE_MAX: u64 = 1_024;
/// How long a clean unmount may take to end the session before we exit anyway.
const UNMOUNT_WAIT_MS: u64 = 5_000;

#[derive(Debug, Clone)]
pub struct Config {
    pub mountpoint: PathBuf,
    pub control: PathBuf,
    pub seed: u64,
    pub size_mb: u64,
}

fn context(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Mounts, serves until SIGTERM/SIGINT or an unmount from outside, then
/// unmounts. Errors say what failed (a mount that could not be made above all).
pub fn run(cfg: &Config) -> io::Result<()> {
    let signals = block_signals()?;
    let sleeping = Arc::new(AtomicUsize::new(0));
    let (fs, session) = mount_model(cfg, sleeping.clone())?;
    let listener = bind(&cfg.control)?;
    let served = Served { fs, sleeping };
    std::thread::Builder::new()
        .name("lazyfs-control".into())
        .spawn(move || serve(listener, served))?;
    eprintln!(
        "kairos-lazyfs: mounted {} ({} MiB, seed {}), control {}",
        cfg.mountpoint.display(),
        cfg.size_mb,
        cfg.seed,
        cfg.control.display()
    );
    let why = wait_for_end(&signals, &session);
    eprintln!(
        "kairos-lazyfs: {why}; unmounting {}",
        cfg.mountpoint.display()
    );
    let _ = std::fs::remove_file(&cfg.control);
    unmount(&cfg.mountpoint, session)
}

/// What the control socket acts on.
#[derive(Clone)]
pub struct Served {
    pub fs: Shared,
    /// fsyncs in their slow-disk delay (the FUSE side counts them).
    pub sleeping: Arc<AtomicUsize>,
}

fn mount_model(
    cfg: &Config,
    sleeping: Arc<AtomicUsize>,
) -> io::Result<(Shared, fuser::BackgroundSession)> {
    if !Path::new("/dev/fuse").exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no /dev/fuse: this kernel or container has no FUSE (modprobe fuse, or run where FUSE is available)",
        ));
    }
    let meta = std::fs::metadata(&cfg.mountpoint)
        .map_err(context(format!("mountpoint {}", cfg.mountpoint.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "mountpoint {} is not a directory",
            cfg.mountpoint.display()
        )));
    }
    let root = Owner {
        uid: meta.uid(),
        gid: meta.gid(),
        perm: (meta.mode() & 0o7777) as u16,
    };
    let capacity = cfg
        .size_mb
        .checked_mul(1 << 20)
        .ok_or_else(|| io::Error::other("--size-mb is too large"))?;
    let fs: Shared = Arc::new(Mutex::new(Fs::new(capacity, cfg.seed, root)));
    let mut options = fuser::Config::default();
    options.mount_options = vec![
        fuser::MountOption::FSName("kairos-lazyfs".into()),
        fuser::MountOption::Subtype("kairos-lazyfs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    options.acl = fuser::SessionACL::All;
    options.n_threads = Some(2);
    let session = fuser::Session::new(LazyFs::new(fs.clone(), sleeping), &cfg.mountpoint, &options)
        .map_err(context(format!(
            "mount FUSE at {} (as root by mount(2), else through fusermount3)",
            cfg.mountpoint.display()
        )))?;
    Ok((fs, session.spawn()?))
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(context(format!(
                "remove stale control socket {}",
                path.display()
            ))(e))
        }
        _ => {}
    }
    UnixListener::bind(path).map_err(context(format!("bind control socket {}", path.display())))
}

fn serve(listener: UnixListener, served: Served) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let fs = served.clone();
        let _ = std::thread::Builder::new()
            .name("lazyfs-conn".into())
            .spawn(move || {
                let _ = converse(conn, &fs);
            });
    }
}

/// Answers each command line of one connection until it closes.
fn converse(conn: UnixStream, fs: &Served) -> io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        let n = (&mut reader).take(LINE_MAX).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if !line.ends_with('\n') && n as u64 == LINE_MAX {
            error_line(&format!("command longer than {LINE_MAX} bytes"))
        } else {
            match Command::parse(&line) {
                Ok(c) => execute(c, fs),
                Err(e) => error_line(&e),
            }
        };
        out.write_all(format!("{reply}\n").as_bytes())?;
    }
}

/// One command against the model, as a reply line.
pub fn execute(c: Command, served: &Served) -> String {
    let mut fs = lock(&served.fs);
    match c {
        Command::Power { tear } => return ok_line(&fs.power(tear)),
        Command::DiskFull(on) => fs.set_disk_full(on),
        Command::DiskError => fs.fail_next_fsync(),
        Command::SlowDisk { ms } => fs.set_slow_disk_ms(ms),
        Command::Heal => fs.heal(),
        Command::Status => {}
    }
    let sleeping = served.sleeping.load(Ordering::SeqCst) as u64;
    ok_line(&status(&fs, sleeping))
}

pub fn status(fs: &Fs, fsyncs_sleeping: u64) -> Status {
    let u = fs.usage();
    let f = fs.faults();
    Status {
        unsynced_bytes: u.unsynced_bytes,
        unsynced_files: u.unsynced_files,
        unsynced_namespace_ops: u.unsynced_namespace_ops,
        used_bytes: u.used_bytes,
        capacity_bytes: u.capacity_bytes,
        inodes: u.inodes,
        pages: u.pages,
        powers: u.powers,
        disk_full: f.disk_full,
        disk_error_pending: f.disk_error_pending,
        slow_disk_ms: f.slow_disk_ms,
        fsyncs_sleeping,
    }
}

/// SIGTERM and SIGINT blocked here and in every thread started after.
fn block_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: plain libc calls on a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

fn wait_for_end(signals: &libc::sigset_t, session: &fuser::BackgroundSession) -> String {
    let tick = libc::timespec {
        tv_sec: 0,
        tv_nsec: 200_000_000,
    };
    loop {
        // SAFETY: the set and timespec outlive the call; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(signals, std::ptr::null_mut(), &tick) };
        match sig {
            libc::SIGTERM => return "SIGTERM".into(),
            libc::SIGINT => return "SIGINT".into(),
            _ if session.guard.is_finished() => {
                return "the session ended (unmounted from outside?)".into()
            }
            _ => {}
        }
    }
}

/// Unmounts; a mount still in use (a process holding a file) is detached
/// lazily, and the process exits without waiting for its users.
fn unmount(mountpoint: &Path, session: fuser::BackgroundSession) -> io::Result<()> {
    if session.guard.is_finished() {
        return Ok(());
    }
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::other("mountpoint holds a NUL byte"))?;
    // SAFETY: a valid C string; umount2 reads it only.
    if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(context(format!("unmount {}", mountpoint.display()))(
                io::Error::last_os_error(),
            ));
        }
        eprintln!(
            "kairos-lazyfs: {} was busy ({err}); detached it",
            mountpoint.display()
        );
        std::mem::forget(session);
        return Ok(());
    }
    let start = Instant::now();
    while !session.guard.is_finished() && start.elapsed() < Duration::from_millis(UNMOUNT_WAIT_MS) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if session.guard.is_finished() {
        drop(session);
    } else {
        std::mem::forget(session);
    }
    Ok(())
}
