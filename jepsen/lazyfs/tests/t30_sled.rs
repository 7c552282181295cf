//! sled 0.34 (what the node stores in) on the lazy disk — the whole of issue
//! #47 in three tests. sled's `flush()` ends in `sync_file_range`, which no
//! FUSE request carries and no real disk treats as a durability point: a
//! node killed after `flush()` and then powered off loses the insert.
//! `fdatasync` of `db/db` after the flush keeps it. And sled never fsyncs a
//! directory: a fresh database, even dropped cleanly (its drop fsyncs
//! `db/db`), is gone whole after a power cut until someone fsyncs `db/`
//! and the directories above it.
//!
//! The node side runs in a child process (this test binary again, in
//! `CHILD_ENV` mode) that is SIGKILLed like a node: nothing is dropped, and
//! its flock on `db/db` goes away with it.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "KAIROS_LAZYFS_SLED_CHILD";
/// Starts the child's progress lines: libtest prints the test's name on the
/// same line before the test's own output.
const MARK: &str = "lazyfs-sled-child:";

/// Child mode: open sled in `dir` with no periodic flusher, say `opened`,
/// wait for a line, insert, `flush()`, say `flushed`, then wait to be killed.
fn child_main(dir: &str) {
    let db = sled::Config::new()
        .path(dir)
        .flush_every_ms(None)
        .open()
        .unwrap();
    println!("{MARK}opened");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    db.insert(b"job-1", b"scheduled").unwrap();
    db.flush().unwrap();
    println!("{MARK}flushed");
    loop {
        std::thread::park();
    }
}

/// The child process, SIGKILLed when the test ends however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long the child may take to open sled or to insert and flush.
const CHILD_STEP_MS: u64 = 60_000;

fn spawn_child(test: &str, dir: &Path) -> (Killed, Receiver<String>) {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = Killed(child);
    let out = BufReader::new(child.0.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

fn wait_line(out: &Receiver<String>, want: &str) {
    let deadline = Instant::now() + Duration::from_millis(CHILD_STEP_MS);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match out.recv_timeout(left) {
            Ok(line) if line.contains(&format!("{MARK}{want}")) => return,
            Ok(_) => {}
            Err(e) => panic!("the sled child did not say {want:?} ({e})"),
        }
    }
}

/// Runs the child against `db/` on a fresh mount with every directory entry
/// durable; `after_flush` runs before the child is SIGKILLed. Returns what
/// `job-1` reads after the power cut.
fn insert_flush_kill_power(test: &str, after_flush: impl FnOnce(&mut Mounted)) -> Option<Vec<u8>> {
    let mut m = Mounted::start();
    let (mut child, out) = spawn_child(test, &m.path("db"));
    wait_line(&out, "opened");
    for f in ["db/conf", "db/db"] {
        std::fs::File::open(m.path(f)).unwrap().sync_all().unwrap();
    }
    for d in ["db/blobs", "db", ""] {
        m.sync_dir(d);
    }
    assert_eq!(m.status().unsynced_namespace_ops, 0);
    child.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    wait_line(&out, "flushed");
    after_flush(&mut m);
    drop(child);
    m.power(false);
    let db = sled::open(m.path("db")).unwrap();
    let got = db.get(b"job-1").unwrap().map(|v| v.to_vec());
    drop(db);
    got
}

#[test]
fn sled_flush_alone_is_not_durable() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return child_main(&dir);
    }
    let got = insert_flush_kill_power("sled_flush_alone_is_not_durable", |m| {
        let s = m.status();
        assert_eq!(s.unsynced_files, 1, "flush() left db/db unsynced: {s:?}");
        assert!(s.unsynced_bytes > 0, "{s:?}");
    });
    assert_eq!(
        got, None,
        "the flushed insert did not survive the power cut"
    );
}

#[test]
fn sled_flush_then_fdatasync_of_db_survives_power() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        return child_main(&dir);
    }
    let got = insert_flush_kill_power("sled_flush_then_fdatasync_of_db_survives_power", |m| {
        std::fs::File::open(m.path("db/db"))
            .unwrap()
            .sync_data()
            .unwrap();
        assert_eq!(m.status().unsynced_files, 0);
    });
    assert_eq!(got.as_deref(), Some(&b"scheduled"[..]));
}

#[test]
fn a_fresh_sled_database_is_lost_whole_without_directory_fsyncs() {
    let mut m = Mounted::start();
    let db = sled::open(m.path("db")).unwrap();
    db.insert(b"job-1", b"scheduled").unwrap();
    db.flush().unwrap();
    drop(db);
    let s = m.status();
    assert_eq!(
        s.unsynced_files, 1,
        "only db/conf is unsynced; drop fsynced db/db: {s:?}"
    );
    assert!(
        s.unsynced_namespace_ops >= 4,
        "db/, conf, db, blobs/: {s:?}"
    );
    let r = m.power(false);
    assert!(r.inodes_dropped >= 4, "{r:?}");
    assert!(
        !m.path("db").exists(),
        "nothing sled wrote is reachable after the cut"
    );
}
