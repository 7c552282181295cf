//! What survives `power` through the real mount: fsynced data in a durable
//! entry, and nothing else — not unsynced writes, not data "synced" by
//! sync_file_range, not a file whose directory was never fsynced; a torn
//! write keeps a prefix; and no kernel cache shows the lost data afterwards.

mod common;
use common::*;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;

/// `rel` created and its directory entry made durable; data not synced.
fn durable_file(m: &Mounted, rel: &str) -> File {
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(m.path(rel))
        .unwrap();
    m.sync_dir("");
    f
}

#[test]
fn sync_data_makes_a_write_survive_power() {
    let mut m = Mounted::start();
    let mut f = durable_file(&m, "log");
    f.write_all(b"committed").unwrap();
    f.sync_data().unwrap();
    drop(f);
    let r = m.power(false);
    assert_eq!(std::fs::read(m.path("log")).unwrap(), b"committed");
    assert_eq!((r.files, r.bytes, r.namespace_ops), (0, 0, 0), "{r:?}");
}

#[test]
fn a_write_without_sync_is_lost_even_by_a_reader_holding_the_file_open() {
    let mut m = Mounted::start();
    let mut f = durable_file(&m, "log");
    f.write_all(b"synced;").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"not synced").unwrap();
    assert_eq!(std::fs::read(m.path("log")).unwrap(), b"synced;not synced");
    let s = m.status();
    assert_eq!((s.unsynced_files, s.unsynced_bytes), (1, 10));
    let r = m.power(false);
    assert_eq!((r.files, r.bytes), (1, 10), "{r:?}");
    assert_eq!(std::fs::read(m.path("log")).unwrap(), b"synced;");
    // The descriptor opened before the cut reads the durable bytes too:
    // direct I/O, no page cache.
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, b"synced;");
    assert_eq!(
        f.metadata().unwrap().len(),
        7,
        "attributes are not cached either"
    );
}

#[test]
fn sync_file_range_does_not_make_data_survive() {
    let mut m = Mounted::start();
    let mut f = durable_file(&m, "db");
    f.write_all(&[7u8; 3 * PAGE]).unwrap();
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a valid open descriptor; the call reads nothing from memory.
    let rc = unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 3 * PAGE as i64, flags) };
    assert_eq!(
        rc,
        0,
        "sync_file_range: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(
        m.status().unsynced_bytes,
        3 * PAGE as u64,
        "it changed nothing"
    );
    m.power(false);
    assert_eq!(
        std::fs::read(m.path("db")).unwrap(),
        b"",
        "only fsync/fdatasync are durable"
    );
}

#[test]
fn a_new_file_fsynced_without_its_directory_is_gone_after_power() {
    let mut m = Mounted::start();
    std::fs::create_dir(m.path("d")).unwrap();
    m.sync_dir("");
    let mut f = File::create(m.path("d/new")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    std::fs::rename(m.path("d/new"), m.path("d/renamed")).unwrap();
    let r = m.power(false);
    assert_eq!(r.inodes_dropped, 1, "{r:?}");
    assert!(
        m.path("d").is_dir(),
        "the directory's own entry was durable"
    );
    let err = std::fs::metadata(m.path("d/new")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(!m.path("d/renamed").exists());
    let mut f = File::create(m.path("d/new")).unwrap();
    f.write_all(b"again").unwrap();
    f.sync_all().unwrap();
    m.sync_dir("d");
    m.power(false);
    assert_eq!(std::fs::read(m.path("d/new")).unwrap(), b"again");
}

#[test]
fn a_torn_power_cut_keeps_a_prefix_of_the_last_page_written() {
    let mut m = Mounted::start();
    let mut f = durable_file(&m, "wal");
    f.write_all(b"head").unwrap();
    f.sync_data().unwrap();
    f.write_all(&[b'x'; 2 * PAGE - 4]).unwrap();
    drop(f);
    let r = m.power(true);
    assert_eq!(r.torn_files, 1, "{r:?}");
    assert!((1..PAGE as u64).contains(&r.torn_bytes), "{r:?}");
    let back = std::fs::read(m.path("wal")).unwrap();
    assert_eq!(back.len(), PAGE + r.torn_bytes as usize);
    assert_eq!(&back[..4], b"head");
    assert!(
        back[4..PAGE].iter().all(|b| *b == 0),
        "the first unsynced page was lost"
    );
    assert!(
        back[PAGE..].iter().all(|b| *b == b'x'),
        "the torn prefix of the last one stayed"
    );
}

#[test]
fn the_daemon_unmounts_on_sigterm() {
    let mut m = Mounted::start();
    assert!(is_mounted(&m.mnt));
    std::fs::write(m.path("f"), b"x").unwrap();
    let (status, log) = m.stop();
    assert!(status.success(), "{status}: {log}");
    assert!(!is_mounted(&m.mnt), "{log}");
    assert!(log.contains("SIGTERM; unmounting"), "{log}");
    assert!(
        !m.path("f").exists(),
        "the mountpoint is the empty directory again"
    );
}
