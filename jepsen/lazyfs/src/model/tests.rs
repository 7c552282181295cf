//! The model's promises, each through the public operations only.

use super::*;
use std::ffi::OsStr;

const ME: Owner = Owner {
    uid: 0,
    gid: 0,
    perm: 0o644,
};

fn fs() -> Fs {
    Fs::new(1 << 20, 7, Owner { perm: 0o755, ..ME })
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// `name` in `parent` with `bytes`, its entry durable, its data not.
fn durable_entry(fs: &mut Fs, parent: Ino, name: &str, bytes: &[u8]) -> Ino {
    let ino = fs.create(parent, n(name), ME).unwrap().ino;
    fs.fsyncdir(parent).unwrap();
    fs.write(ino, 0, bytes).unwrap();
    ino
}

fn content(fs: &Fs, parent: Ino, name: &str) -> Option<Vec<u8>> {
    let ino = fs.lookup(parent, n(name)).ok()?.ino;
    Some(fs.read(ino, 0, 1 << 20).unwrap())
}

#[test]
fn an_unsynced_write_is_dropped_by_power() {
    let mut fs = fs();
    let ino = durable_entry(&mut fs, ROOT, "log", b"first");
    fs.fsync(ino).unwrap();
    fs.write(ino, 5, b" second").unwrap();
    assert_eq!(content(&fs, ROOT, "log").unwrap(), b"first second");
    let r = fs.power(false);
    assert_eq!(content(&fs, ROOT, "log").unwrap(), b"first");
    assert_eq!((r.files, r.bytes, r.namespace_ops), (1, 7, 0));
    assert_eq!(fs.usage().unsynced_bytes, 0);
}

#[test]
fn fsynced_data_in_a_durable_entry_survives_power() {
    let mut fs = fs();
    let ino = durable_entry(&mut fs, ROOT, "log", b"kept");
    fs.fsync(ino).unwrap();
    let r = fs.power(true);
    assert_eq!(content(&fs, ROOT, "log").unwrap(), b"kept");
    assert_eq!(r, PowerReport::default(), "nothing to drop or tear");
}

#[test]
fn a_durable_entry_whose_data_was_never_fsynced_comes_back_empty() {
    let mut fs = fs();
    durable_entry(&mut fs, ROOT, "log", b"lost");
    fs.power(false);
    assert_eq!(content(&fs, ROOT, "log").unwrap(), b"");
}

#[test]
fn fsync_of_a_new_file_without_fsyncdir_loses_the_file() {
    let mut fs = fs();
    let ino = fs.create(ROOT, n("new"), ME).unwrap().ino;
    fs.write(ino, 0, b"data").unwrap();
    fs.fsync(ino).unwrap();
    let r = fs.power(false);
    assert_eq!(fs.lookup(ROOT, n("new")), Err(FsError::NotFound));
    assert_eq!(fs.getattr(ino), Err(FsError::NotFound), "its inode is gone");
    assert_eq!(
        (r.files, r.bytes, r.namespace_ops, r.inodes_dropped),
        (1, 4, 1, 1)
    );
    let again = fs.create(ROOT, n("new"), ME).unwrap().ino;
    assert!(again > ino, "inode numbers are never reused");
}

#[test]
fn a_new_file_in_a_new_directory_needs_both_directories_fsynced() {
    let mut fs = fs();
    let d = fs.mkdir(ROOT, n("d"), ME).unwrap().ino;
    let f = durable_entry(&mut fs, d, "f", b"x");
    fs.fsync(f).unwrap();
    fs.power(false);
    assert_eq!(fs.lookup(ROOT, n("d")), Err(FsError::NotFound));
    let d = fs.mkdir(ROOT, n("d"), ME).unwrap().ino;
    let f = durable_entry(&mut fs, d, "f", b"x");
    fs.fsync(f).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    fs.power(false);
    let d = fs.lookup(ROOT, n("d")).unwrap().ino;
    assert_eq!(content(&fs, d, "f").unwrap(), b"x");
}

#[test]
fn a_rename_is_durable_only_after_its_parent_is_fsynced() {
    let mut fs = fs();
    let ino = durable_entry(&mut fs, ROOT, "tmp", b"v2");
    fs.fsync(ino).unwrap();
    fs.rename(ROOT, n("tmp"), ROOT, n("final"), false).unwrap();
    assert!(content(&fs, ROOT, "tmp").is_none());
    let r = fs.power(false);
    assert_eq!(r.namespace_ops, 2, "one removed and one added entry");
    assert!(
        content(&fs, ROOT, "final").is_none(),
        "the rename was undone"
    );
    assert_eq!(content(&fs, ROOT, "tmp").unwrap(), b"v2");
    fs.rename(ROOT, n("tmp"), ROOT, n("final"), false).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    fs.power(false);
    assert!(content(&fs, ROOT, "tmp").is_none());
    assert_eq!(content(&fs, ROOT, "final").unwrap(), b"v2");
}

#[test]
fn a_rename_across_directories_follows_each_parents_fsync() {
    let mut fs = fs();
    let a = fs.mkdir(ROOT, n("a"), ME).unwrap().ino;
    let b = fs.mkdir(ROOT, n("b"), ME).unwrap().ino;
    fs.fsyncdir(ROOT).unwrap();
    let f = durable_entry(&mut fs, a, "f", b"z");
    fs.fsync(f).unwrap();
    fs.rename(a, n("f"), b, n("f"), false).unwrap();
    fs.fsyncdir(b).unwrap();
    fs.power(false);
    assert_eq!(
        content(&fs, a, "f").unwrap(),
        b"z",
        "a's removal was not durable"
    );
    assert_eq!(content(&fs, b, "f").unwrap(), b"z", "b's addition was");
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
}

#[test]
fn an_unsynced_unlink_is_undone_even_after_the_handle_closed() {
    let mut fs = fs();
    let ino = durable_entry(&mut fs, ROOT, "f", b"abc");
    fs.fsync(ino).unwrap();
    let fh = fs.open(ino).unwrap();
    fs.unlink(ROOT, n("f")).unwrap();
    assert_eq!(
        fs.read(ino, 0, 10).unwrap(),
        b"abc",
        "open handles still read"
    );
    fs.release(fh).unwrap();
    assert!(content(&fs, ROOT, "f").is_none());
    fs.power(false);
    assert_eq!(content(&fs, ROOT, "f").unwrap(), b"abc");
    fs.unlink(ROOT, n("f")).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    assert_eq!(
        fs.getattr(ino),
        Err(FsError::NotFound),
        "freed once durable"
    );
    assert_eq!(fs.usage().used_bytes, 0);
}

#[test]
fn tear_keeps_a_seeded_prefix_of_the_last_page_written() {
    let torn = |seed| {
        let mut fs = Fs::new(1 << 20, seed, ME);
        let ino = durable_entry(&mut fs, ROOT, "log", b"head");
        fs.fsync(ino).unwrap();
        fs.write(ino, 4, &[b'x'; 3 * PAGE - 4]).unwrap();
        let r = fs.power(true);
        let back = content(&fs, ROOT, "log").unwrap();
        assert_eq!(r.torn_files, 1);
        assert!((1..PAGE as u64).contains(&r.torn_bytes), "{r:?}");
        assert_eq!(r.bytes + r.torn_bytes, 3 * PAGE as u64 - 4);
        assert_eq!(&back[..4], b"head");
        let page = 2 * PAGE;
        assert!(
            back[4..page].iter().all(|b| *b == 0),
            "earlier pages dropped"
        );
        assert_eq!(back.len(), page + r.torn_bytes as usize);
        assert!(back[page..].iter().all(|b| *b == b'x'));
        r.torn_bytes
    };
    assert_eq!(torn(3), torn(3), "same seed, same tear");
    assert!((1..20).any(|s| torn(s) != torn(3)));
}

#[test]
fn disk_full_refuses_growth_but_unlink_read_and_fsync_work() {
    let mut fs = fs();
    let ino = durable_entry(&mut fs, ROOT, "f", b"abc");
    fs.set_disk_full(true);
    assert_eq!(fs.write(ino, 0, b"x"), Err(FsError::NoSpace));
    assert_eq!(
        fs.create(ROOT, n("g"), ME).map(|_| ()),
        Err(FsError::NoSpace)
    );
    assert_eq!(
        fs.mkdir(ROOT, n("d"), ME).map(|_| ()),
        Err(FsError::NoSpace)
    );
    let grow = SetAttr {
        size: Some(10),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, grow).map(|_| ()), Err(FsError::NoSpace));
    assert_eq!(
        fs.fallocate(ino, 0, 10, Fallocate::Grow),
        Err(FsError::NoSpace)
    );
    assert_eq!(fs.statfs().free_blocks, 0);
    let shrink = SetAttr {
        size: Some(1),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(ino, shrink).unwrap().size, 1);
    assert_eq!(fs.read(ino, 0, 10).unwrap(), b"a");
    fs.fsync(ino).unwrap();
    fs.unlink(ROOT, n("f")).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    fs.heal();
    assert!(fs.statfs().free_blocks > 0);
    fs.create(ROOT, n("g"), ME).unwrap();
}

#[test]
fn capacity_is_enforced_and_reported_by_statfs() {
    let mut fs = Fs::new(4 * PAGE as u64, 1, ME);
    let ino = fs.create(ROOT, n("f"), ME).unwrap().ino;
    fs.write(ino, 0, &[1; 3 * PAGE]).unwrap();
    assert_eq!(fs.statfs().free_blocks, 1);
    assert_eq!(
        fs.write(ino, 3 * PAGE as u64, &[1; PAGE + 1]),
        Err(FsError::NoSpace)
    );
    fs.write(ino, 0, &[2; 3 * PAGE]).unwrap();
    assert_eq!(fs.statfs().blocks, 4);
}

#[test]
fn disk_error_fails_exactly_one_fsync_and_makes_nothing_durable() {
    let mut fs = fs();
    let a = durable_entry(&mut fs, ROOT, "a", b"1");
    let b = durable_entry(&mut fs, ROOT, "b", b"2");
    fs.fail_next_fsync();
    assert!(fs.faults().disk_error_pending);
    assert_eq!(fs.fsync(a), Err(FsError::Io));
    assert!(!fs.faults().disk_error_pending);
    fs.fsync(b).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    assert_eq!(fs.usage().unsynced_files, 1, "a is still unsynced");
    fs.power(false);
    assert_eq!(
        content(&fs, ROOT, "a").unwrap(),
        b"",
        "the failed fsync kept nothing"
    );
    assert_eq!(content(&fs, ROOT, "b").unwrap(), b"2");
}

#[test]
fn namespace_refusals_leave_state_untouched() {
    let mut fs = fs();
    let d = fs.mkdir(ROOT, n("d"), ME).unwrap().ino;
    fs.create(d, n("f"), ME).unwrap();
    let before = fs.usage();
    assert_eq!(fs.rmdir(ROOT, n("d")), Err(FsError::NotEmpty));
    assert_eq!(fs.unlink(ROOT, n("d")), Err(FsError::IsDir));
    assert_eq!(
        fs.rename(ROOT, n("d"), d, n("x"), false),
        Err(FsError::Invalid)
    );
    assert_eq!(fs.create(d, n("f"), ME).map(|_| ()), Err(FsError::Exists));
    assert_eq!(
        fs.link(d, ROOT, n("l")).map(|_| ()),
        Err(FsError::NotPermitted)
    );
    let long = "x".repeat(NAME_MAX + 1);
    assert_eq!(
        fs.create(ROOT, n(&long), ME).map(|_| ()),
        Err(FsError::NameTooLong)
    );
    assert_eq!(fs.usage(), before);
    let names: Vec<_> = fs.readdir(d).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, [".", "..", "f"]);
}

#[test]
fn status_counts_what_a_power_cut_would_drop() {
    let mut fs = fs();
    let a = durable_entry(&mut fs, ROOT, "a", &[0; 10]);
    fs.create(ROOT, n("b"), ME).unwrap();
    fs.symlink(ROOT, n("s"), b"a", ME).unwrap();
    let u = fs.usage();
    assert_eq!(
        (u.unsynced_bytes, u.unsynced_files, u.unsynced_namespace_ops),
        (10, 1, 2)
    );
    fs.fsync(a).unwrap();
    fs.fsyncdir(ROOT).unwrap();
    let u = fs.usage();
    assert_eq!(
        (u.unsynced_bytes, u.unsynced_files, u.unsynced_namespace_ops),
        (0, 0, 0)
    );
    let s = fs.lookup(ROOT, n("s")).unwrap().ino;
    assert_eq!(fs.readlink(s).unwrap(), b"a");
    assert_eq!(fs.usage().used_bytes, 11);
}
