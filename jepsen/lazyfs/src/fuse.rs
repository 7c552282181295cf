//! The FUSE glue: each kernel request locks the model, calls the matching
//! operation and translates the answer. Nothing here decides semantics.
//!
//! Kernel caches must not outlive a power cut: every entry and attribute is
//! answered with a zero TTL and every file is opened with direct I/O (no
//! page cache, so a process started after `power` reads the durable state);
//! writeback caching is never asked for. `slow-disk` fsyncs sleep on a
//! thread of their own and reply from there, so other requests go on; past
//! [`SLOW_THREADS_MAX`] sleeping fsyncs, further ones sleep on the request
//! thread instead.

use crate::model::{self, Attr, Fallocate, Fs, FsError, Kind, Owner, SetAttr};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// Entries and attributes are never cached by the kernel.
const TTL: Duration = Duration::ZERO;
/// Bound on fsyncs sleeping on their own threads at once.
pub const SLOW_THREADS_MAX: usize = 64;

pub type Shared = Arc<Mutex<Fs>>;

pub fn lock(fs: &Shared) -> MutexGuard<'_, Fs> {
    fs.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct LazyFs {
    fs: Shared,
    /// fsyncs in their slow-disk delay now (told by `status`).
    sleeping: Arc<AtomicUsize>,
}

impl LazyFs {
    pub fn new(fs: Shared, sleeping: Arc<AtomicUsize>) -> LazyFs {
        LazyFs { fs, sleeping }
    }

    fn fs(&self) -> MutexGuard<'_, Fs> {
        lock(&self.fs)
    }

    /// Runs an fsync-like `op` after the slow-disk delay, replying from a
    /// thread of its own while the delay is on.
    fn synced(
        &self,
        reply: ReplyEmpty,
        op: impl FnOnce(&mut Fs) -> model::FsResult<()> + Send + 'static,
    ) {
        let ms = self.fs().faults().slow_disk_ms;
        if ms == 0 {
            return answer_empty(reply, op(&mut self.fs()));
        }
        let own_thread = self.sleeping.fetch_add(1, Ordering::SeqCst) < SLOW_THREADS_MAX;
        let (fs, sleeping) = (self.fs.clone(), self.sleeping.clone());
        let run = move || {
            std::thread::sleep(Duration::from_millis(ms));
            let r = op(&mut lock(&fs));
            sleeping.fetch_sub(1, Ordering::SeqCst);
            answer_empty(reply, r);
        };
        if !own_thread {
            return run();
        }
        let spawned = std::thread::Builder::new()
            .name("lazyfs-slow-fsync".into())
            .spawn(run);
        if spawned.is_err() {
            // No thread: the reply went down with the closure, and fuser
            // answers a dropped reply with EIO.
            self.sleeping.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

pub fn errno(e: FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ENOENT,
        FsError::Exists => Errno::EEXIST,
        FsError::NotDir => Errno::ENOTDIR,
        FsError::IsDir => Errno::EISDIR,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::NoSpace => Errno::ENOSPC,
        FsError::Io => Errno::EIO,
        FsError::Invalid => Errno::EINVAL,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::NotSupported => Errno::EOPNOTSUPP,
        FsError::BadHandle => Errno::EBADF,
        FsError::NotPermitted => Errno::EPERM,
    }
}

fn answer_empty(reply: ReplyEmpty, r: model::FsResult<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn answer_entry(reply: ReplyEntry, r: model::FsResult<Attr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn file_type(kind: Kind, special_mode: u32) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Special => match special_mode & libc::S_IFMT {
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFCHR => FileType::CharDevice,
            _ => FileType::BlockDevice,
        },
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind, a.special_mode),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: model::PAGE as u32,
        flags: 0,
    }
}

fn owner(req: &Request, mode: u32, umask: u32) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
        perm: (mode & !umask & 0o7777) as u16,
    }
}

fn time(t: Option<TimeOrNow>) -> Option<SystemTime> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    })
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        answer_entry(reply, self.fs().lookup(parent.0, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs().getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
        };
        match self.fs().setattr(ino.0, set) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs().readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let who = owner(req, mode, umask);
        let r = if mode & libc::S_IFMT == libc::S_IFREG {
            self.fs().create(parent.0, name, who)
        } else {
            let kind = mode & libc::S_IFMT;
            self.fs().mknod_special(parent.0, name, who, kind, rdev)
        };
        answer_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        answer_entry(
            reply,
            self.fs().mkdir(parent.0, name, owner(req, mode, umask)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.fs().unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer_empty(reply, self.fs().rmdir(parent.0, name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let who = owner(req, 0o777, 0);
        let target = target.as_os_str().as_bytes();
        answer_entry(reply, self.fs().symlink(parent.0, link_name, target, who));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        answer_empty(
            reply,
            self.fs()
                .rename(parent.0, name, newparent.0, newname, no_replace),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        answer_entry(reply, self.fs().link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut fs = self.fs();
        let made = fs
            .create(parent.0, name, owner(req, mode, umask))
            .and_then(|a| Ok((a, fs.open(a.ino)?)));
        match made {
            Ok((a, fh)) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs().read(ino.0, offset, size as usize) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs().write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is not a sync point: nothing becomes durable here.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        answer_empty(reply, self.fs().release(fh.0));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.synced(reply, move |fs| fs.fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs().getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs().readdir(ino.0) {
            Ok(v) => v,
            Err(e) => return reply.error(errno(e)),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let kind = file_type(e.kind, e.special_mode);
            if reply.add(INodeNo(e.ino), i as u64 + 1, kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.synced(reply, move |fs| fs.fsyncdir(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs().statfs();
        reply.statfs(
            s.blocks,
            s.free_blocks,
            s.free_blocks,
            s.files,
            s.free_files,
            s.block_size,
            model::NAME_MAX as u32,
            s.block_size,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // `default_permissions` has the kernel check modes; this only says
        // whether the inode exists.
        answer_empty(reply, self.fs().getattr(ino.0).map(|_| ()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mode = match mode {
            0 => Fallocate::Grow,
            libc::FALLOC_FL_KEEP_SIZE => Fallocate::KeepSize,
            _ => Fallocate::Other,
        };
        answer_empty(reply, self.fs().fallocate(ino.0, offset, length, mode));
    }
}
