//! The lazy disk as plain synchronous logic, with no FUSE in it: an
//! in-memory filesystem whose live view takes every change at once, and a
//! durable state that only fsync moves forward. A file's data becomes durable
//! when the file is fsynced (`data.rs`); a directory entry (create, mkdir,
//! unlink, rename, link, symlink) when its directory is fsynced
//! (`namespace.rs`). `power` (`power.rs`) turns the durable state back into
//! the live one. The faults (`disk-full`, `disk-error`) are answered here
//! too, so the FUSE glue only translates.
//!
//! Inode numbers are never reused: a process holding an inode a power cut
//! dropped gets `ENOENT`, never another file.

mod data;
mod namespace;
mod power;

pub use crate::protocol::PowerReport;
pub use data::PAGE;
pub use namespace::DirEntry;

use data::FileData;
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::time::SystemTime;

pub type Ino = u64;
pub const ROOT: Ino = 1;
/// Longest name in a directory (Linux's NAME_MAX).
pub const NAME_MAX: usize = 255;

/// What an operation failed with; the FUSE glue maps it to an errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on device")]
    NoSpace,
    #[error("input/output error")]
    Io,
    #[error("invalid argument")]
    Invalid,
    #[error("file name too long")]
    NameTooLong,
    #[error("operation not supported")]
    NotSupported,
    #[error("bad file handle")]
    BadHandle,
    #[error("operation not permitted")]
    NotPermitted,
}

pub type FsResult<T> = Result<T, FsError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device node: a name and a mode, no data.
    Special,
}

/// Who and what a new inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (and set-id/sticky bits), without the file type.
    pub perm: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// `st_mode`'s file type bits of a special node; 0 otherwise.
    pub special_mode: u32,
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// The attributes a `setattr` changes; `None` leaves one alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Dir {
    /// What lookups see.
    live: BTreeMap<OsString, Ino>,
    /// What survives a power cut: the entries as of the last fsyncdir.
    durable: BTreeMap<OsString, Ino>,
    /// Changes to `live` since the last fsyncdir.
    unsynced_ops: u64,
    /// The live parent, for `..`.
    parent: Ino,
}

#[derive(Debug, Clone)]
pub(crate) enum Body {
    File(FileData),
    Dir(Dir),
    Symlink(Vec<u8>),
    Special { mode: u32, rdev: u32 },
}

#[derive(Debug, Clone)]
pub(crate) struct Inode {
    body: Body,
    owner: Owner,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    /// Entries naming it in live directories.
    live_links: u32,
    /// Entries naming it in durable directory states.
    durable_links: u32,
    /// Open file handles.
    open: u32,
}

/// The injected faults, as the control socket sets them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    pub disk_full: bool,
    pub disk_error_pending: bool,
    pub slow_disk_ms: u64,
}

/// What `status` tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub unsynced_bytes: u64,
    pub unsynced_files: u64,
    pub unsynced_namespace_ops: u64,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub inodes: u64,
    pub pages: u64,
    pub powers: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub free_blocks: u64,
    pub files: u64,
    pub free_files: u64,
    pub block_size: u32,
}

pub struct Fs {
    inodes: BTreeMap<Ino, Inode>,
    next_ino: Ino,
    handles: HashMap<u64, Ino>,
    next_fh: u64,
    capacity_bytes: u64,
    /// Live file and symlink sizes, summed.
    used_bytes: u64,
    faults: Faults,
    rng: power::SplitMix,
    powers: u64,
}

impl Fs {
    /// An empty filesystem (a durable root owned by `root`) holding at most
    /// `capacity_bytes`; `seed` drives the torn-write lengths.
    pub fn new(capacity_bytes: u64, seed: u64, root: Owner) -> Fs {
        let mut inodes = BTreeMap::new();
        let mut dir = Inode::new(Body::Dir(Dir::default()), root);
        dir.live_links = 1;
        dir.durable_links = 1;
        if let Body::Dir(d) = &mut dir.body {
            d.parent = ROOT;
        }
        inodes.insert(ROOT, dir);
        Fs {
            inodes,
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            capacity_bytes,
            used_bytes: 0,
            faults: Faults::default(),
            rng: power::SplitMix(seed),
            powers: 0,
        }
    }

    pub fn faults(&self) -> Faults {
        self.faults
    }

    pub fn set_disk_full(&mut self, on: bool) {
        self.faults.disk_full = on;
    }

    /// The next file fsync fails with EIO and makes nothing durable.
    pub fn fail_next_fsync(&mut self) {
        self.faults.disk_error_pending = true;
    }

    pub fn set_slow_disk_ms(&mut self, ms: u64) {
        self.faults.slow_disk_ms = ms;
    }

    /// Every fault off.
    pub fn heal(&mut self) {
        self.faults = Faults::default();
    }

    fn inode(&self, ino: Ino) -> FsResult<&Inode> {
        self.inodes.get(&ino).ok_or(FsError::NotFound)
    }

    fn inode_mut(&mut self, ino: Ino) -> FsResult<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(FsError::NotFound)
    }

    fn file_mut(&mut self, ino: Ino) -> FsResult<&mut FileData> {
        match &mut self.inode_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(FsError::IsDir),
            _ => Err(FsError::Invalid),
        }
    }

    fn refuse_if_full(&self) -> FsResult<()> {
        if self.faults.disk_full {
            Err(FsError::NoSpace)
        } else {
            Ok(())
        }
    }

    /// Room for `grow` more bytes, or ENOSPC.
    fn reserve(&self, grow: u64) -> FsResult<()> {
        self.refuse_if_full()?;
        if self.used_bytes.saturating_add(grow) > self.capacity_bytes {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let node = self.inode(ino)?;
        let (kind, size, special_mode, rdev) = match &node.body {
            Body::File(f) => (Kind::File, f.size(), 0, 0),
            Body::Dir(d) => (Kind::Dir, d.live.len() as u64, 0, 0),
            Body::Symlink(t) => (Kind::Symlink, t.len() as u64, 0, 0),
            Body::Special { mode, rdev } => (Kind::Special, 0, *mode, *rdev),
        };
        let nlink = match &node.body {
            Body::Dir(d) => 2 + self.subdirs(d),
            _ => node.live_links,
        };
        Ok(Attr {
            ino,
            kind,
            size,
            perm: node.owner.perm,
            nlink,
            uid: node.owner.uid,
            gid: node.owner.gid,
            special_mode,
            rdev,
            atime: node.atime,
            mtime: node.mtime,
            ctime: node.ctime,
        })
    }

    fn subdirs(&self, d: &Dir) -> u32 {
        let is_dir =
            |i: &Ino| matches!(self.inodes.get(i), Some(n) if matches!(n.body, Body::Dir(_)));
        d.live.values().filter(|i| is_dir(i)).count() as u32
    }

    pub fn setattr(&mut self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        if let Some(size) = set.size {
            let old = self.file_mut(ino)?.size();
            if size > old {
                self.reserve(size - old)?;
            }
            self.file_mut(ino)?.truncate(size);
            self.used_bytes = (self.used_bytes + size).saturating_sub(old);
        }
        let now = SystemTime::now();
        let node = self.inode_mut(ino)?;
        node.owner.perm = set.perm.unwrap_or(node.owner.perm);
        node.owner.uid = set.uid.unwrap_or(node.owner.uid);
        node.owner.gid = set.gid.unwrap_or(node.owner.gid);
        node.atime = set.atime.unwrap_or(node.atime);
        node.mtime = set
            .mtime
            .unwrap_or(if set.size.is_some() { now } else { node.mtime });
        node.ctime = now;
        self.getattr(ino)
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        match &self.inode(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(FsError::Invalid),
        }
    }

    /// Opens inode `ino`; the handle keeps it alive after an unlink.
    pub fn open(&mut self, ino: Ino) -> FsResult<u64> {
        self.inode_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    pub fn release(&mut self, fh: u64) -> FsResult<()> {
        let ino = self.handles.remove(&fh).ok_or(FsError::BadHandle)?;
        if let Some(node) = self.inodes.get_mut(&ino) {
            node.open = node.open.saturating_sub(1);
            self.collect(ino);
        }
        Ok(())
    }

    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        match &self.inode(ino)?.body {
            Body::File(f) => Ok(f.read(offset, len)),
            Body::Dir(_) => Err(FsError::IsDir),
            _ => Err(FsError::Invalid),
        }
    }

    pub fn write(&mut self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<u32> {
        let old = self.file_mut(ino)?.size();
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::Invalid)?;
        self.reserve(end.saturating_sub(old))?;
        let f = self.file_mut(ino)?;
        f.write(offset, data);
        let grown = f.size() - old;
        self.used_bytes += grown;
        let node = self.inode_mut(ino)?;
        node.mtime = SystemTime::now();
        node.ctime = node.mtime;
        Ok(data.len() as u32)
    }

    /// `fallocate` mode 0 (grow the file, zeros) or with `keep_size`
    /// (reserve only: nothing to do in memory). Punching holes is refused.
    pub fn fallocate(&mut self, ino: Ino, offset: u64, len: u64, mode: Fallocate) -> FsResult<()> {
        let old = self.file_mut(ino)?.size();
        let end = offset.checked_add(len).ok_or(FsError::Invalid)?;
        match mode {
            Fallocate::Other => return Err(FsError::NotSupported),
            Fallocate::KeepSize => return self.reserve(end.saturating_sub(old)),
            Fallocate::Grow => self.reserve(end.saturating_sub(old))?,
        }
        if end > old {
            self.file_mut(ino)?.truncate(end);
            self.used_bytes += end - old;
        }
        Ok(())
    }

    /// fsync or fdatasync of a file: its data and size become durable (not
    /// its directory entry). A pending disk error fails it instead.
    pub fn fsync(&mut self, ino: Ino) -> FsResult<()> {
        self.inode(ino)?;
        if std::mem::take(&mut self.faults.disk_error_pending) {
            return Err(FsError::Io);
        }
        if let Body::File(f) = &mut self.inode_mut(ino)?.body {
            f.sync();
        }
        Ok(())
    }

    pub fn statfs(&self) -> Statfs {
        let block = PAGE as u64;
        let free = if self.faults.disk_full {
            0
        } else {
            self.capacity_bytes.saturating_sub(self.used_bytes) / block
        };
        Statfs {
            blocks: self.capacity_bytes / block,
            free_blocks: free,
            files: 1 << 32,
            free_files: (1u64 << 32).saturating_sub(self.inodes.len() as u64),
            block_size: PAGE as u32,
        }
    }

    pub fn usage(&self) -> Usage {
        let mut u = Usage {
            used_bytes: self.used_bytes,
            capacity_bytes: self.capacity_bytes,
            inodes: self.inodes.len() as u64,
            powers: self.powers,
            ..Usage::default()
        };
        for node in self.inodes.values() {
            match &node.body {
                Body::File(f) => {
                    u.pages += f.pages() as u64;
                    if f.is_dirty() {
                        u.unsynced_files += 1;
                        u.unsynced_bytes += f.unsynced_bytes();
                    }
                }
                Body::Dir(d) => u.unsynced_namespace_ops += d.unsynced_ops,
                _ => {}
            }
        }
        u
    }
}

/// What an `fallocate` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallocate {
    Grow,
    KeepSize,
    Other,
}

impl Inode {
    fn new(body: Body, owner: Owner) -> Inode {
        let now = SystemTime::now();
        Inode {
            body,
            owner,
            atime: now,
            mtime: now,
            ctime: now,
            live_links: 0,
            durable_links: 0,
            open: 0,
        }
    }

    fn size(&self) -> u64 {
        match &self.body {
            Body::File(f) => f.size(),
            Body::Symlink(t) => t.len() as u64,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests;
