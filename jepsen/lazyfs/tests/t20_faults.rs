//! The injected faults through the real mount: a full disk refuses growth
//! with ENOSPC but lets unlink, read and fsync through; a disk error fails
//! exactly one fsync with EIO; a slow disk delays fsync without holding up
//! other requests; `heal` undoes them; bad commands and mounts fail loudly.

mod common;
use common::*;
use kairos_lazyfs::control::ControlError;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn is_enospc(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOSPC) && e.kind() == ErrorKind::StorageFull
}

#[test]
fn disk_full_gives_enospc_and_unlink_still_works() {
    let mut m = Mounted::start();
    let mut f = File::create(m.path("a")).unwrap();
    f.write_all(b"before").unwrap();
    assert!(m.ctl.disk_full(true).unwrap().disk_full);
    let e = f.write_all(b"more").unwrap_err();
    assert!(is_enospc(&e), "{e:?}");
    let e = File::create(m.path("b")).unwrap_err();
    assert!(is_enospc(&e), "{e:?}");
    let e = std::fs::create_dir(m.path("d")).unwrap_err();
    assert!(is_enospc(&e), "{e:?}");
    let e = f.set_len(1 << 20).unwrap_err();
    assert!(is_enospc(&e), "{e:?}");
    assert_eq!(rustix::fs::statvfs(&m.mnt).unwrap().f_bavail, 0);
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"before");
    f.sync_all().unwrap();
    std::fs::remove_file(m.path("a")).unwrap();
    m.ctl.disk_full(false).unwrap();
    File::create(m.path("b")).unwrap().write_all(b"ok").unwrap();
    assert!(rustix::fs::statvfs(&m.mnt).unwrap().f_bavail > 0);
}

#[test]
fn the_size_limit_is_a_real_enospc_and_statfs_reports_it() {
    let m = Mounted::with_args(&["--size-mb", "1"]);
    let st = rustix::fs::statvfs(&m.mnt).unwrap();
    assert_eq!(st.f_blocks * st.f_frsize, 1 << 20);
    let mut f = File::create(m.path("big")).unwrap();
    let e = f.write_all(&vec![1u8; 2 << 20]).unwrap_err();
    assert!(is_enospc(&e), "{e:?}");
}

#[test]
fn disk_error_fails_exactly_one_sync_data_with_eio() {
    let mut m = Mounted::start();
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(m.path("a"))
        .unwrap();
    m.sync_dir("");
    f.write_all(b"data").unwrap();
    assert!(m.ctl.disk_error().unwrap().disk_error_pending);
    let e = f.sync_data().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e:?}");
    let s = m.status();
    assert!(!s.disk_error_pending);
    assert_eq!(s.unsynced_bytes, 4, "the failed fsync made nothing durable");
    f.sync_data().unwrap();
    assert_eq!(m.status().unsynced_bytes, 0);
}

#[test]
fn slow_disk_delays_fsync_but_not_other_requests() {
    const SLOW_MS: u64 = 1_500;
    let mut m = Mounted::start();
    std::fs::write(m.path("other"), b"x").unwrap();
    let f = File::create(m.path("slow")).unwrap();
    assert_eq!(m.ctl.slow_disk(SLOW_MS).unwrap().slow_disk_ms, SLOW_MS);
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let start = Instant::now();
    let syncer = std::thread::spawn(move || {
        f.sync_data().unwrap();
        flag.store(true, Ordering::SeqCst);
        start.elapsed()
    });
    let deadline = Instant::now() + Duration::from_millis(SLOW_MS);
    while m.status().fsyncs_sleeping == 0 {
        assert!(
            Instant::now() < deadline,
            "the fsync never reached the daemon"
        );
        std::thread::yield_now();
    }
    assert_eq!(std::fs::read(m.path("other")).unwrap(), b"x");
    std::fs::write(m.path("another"), b"y").unwrap();
    assert!(
        !done.load(Ordering::SeqCst),
        "the fsync was still sleeping while we read and wrote"
    );
    let took = syncer.join().unwrap();
    assert!(took >= Duration::from_millis(SLOW_MS), "{took:?}");
    let s = m.ctl.heal().unwrap();
    assert_eq!((s.slow_disk_ms, s.fsyncs_sleeping), (0, 0));
}

#[test]
fn heal_turns_every_fault_off() {
    let mut m = Mounted::start();
    m.ctl.disk_full(true).unwrap();
    m.ctl.disk_error().unwrap();
    m.ctl.slow_disk(100).unwrap();
    let s = m.ctl.heal().unwrap();
    assert!(
        !s.disk_full && !s.disk_error_pending && s.slow_disk_ms == 0,
        "{s:?}"
    );
    let mut f = File::create(m.path("a")).unwrap();
    f.write_all(b"1").unwrap();
    f.sync_data().unwrap();
}

#[test]
fn unknown_commands_are_refused_with_the_reason() {
    let mut m = Mounted::start();
    let mut raw = UnixStream::connect(&m.sock).unwrap();
    raw.write_all(b"format c:\nslow-disk soon\nstatus\n")
        .unwrap();
    let mut lines = BufReader::new(raw).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["ok"], false);
    assert!(
        first["error"]
            .as_str()
            .unwrap()
            .contains("unknown command \"format c:\""),
        "{first}"
    );
    let second: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(
        second["error"].as_str().unwrap().contains("not a number"),
        "{second}"
    );
    let third: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(third["ok"], true);
    let e = m.ctl.slow_disk(10_000_000).unwrap_err();
    assert!(matches!(e, ControlError::Refused { .. }), "{e}");
}

#[test]
fn a_mount_that_cannot_be_made_exits_non_zero_saying_why() {
    require_fuse();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let out = Command::new(BIN)
        .args(["mount", "--mountpoint"])
        .arg(&missing)
        .arg("--control")
        .arg(dir.path().join("c.sock"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mountpoint") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("c.sock").exists(),
        "no control socket for a failed mount"
    );
}
