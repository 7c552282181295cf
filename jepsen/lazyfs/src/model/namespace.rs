//! Directories: each keeps its live entries and its durable ones (as of its
//! last fsyncdir). Every namespace change (create, mknod, mkdir, symlink,
//! link, unlink, rmdir, rename) edits only the live entries of the
//! directories it touches; `fsyncdir` copies one directory's live entries
//! over its durable ones. Strict POSIX: fsync of a file says nothing about
//! the entries naming it.
//!
//! An inode lives while a live entry, a durable entry or an open handle
//! names it (`collect`): an unlinked file whose unlink is not durable yet
//! keeps its data for the power cut that brings it back.

use super::{data::FileData, Attr};
use super::{Body, Dir, Fs, FsError, FsResult, Ino, Inode, Kind, Owner, NAME_MAX, ROOT};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

/// One `readdir` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: Kind,
    /// `S_IFMT` bits of a special node; 0 otherwise.
    pub special_mode: u32,
    pub name: OsString,
}

fn check_name(name: &OsStr) -> FsResult<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(FsError::Invalid);
    }
    Ok(())
}

impl Fs {
    fn dir(&self, ino: Ino) -> FsResult<&Dir> {
        match &self.inode(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(FsError::NotDir),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> FsResult<&mut Dir> {
        match &mut self.inode_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            _ => Err(FsError::NotDir),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.inodes.get(&ino), Some(n) if matches!(n.body, Body::Dir(_)))
    }

    fn entry(&self, parent: Ino, name: &OsStr) -> FsResult<Ino> {
        self.dir(parent)?
            .live
            .get(name)
            .copied()
            .ok_or(FsError::NotFound)
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<Attr> {
        self.getattr(self.entry(parent, name)?)
    }

    /// The live entries, with `.` and `..` first.
    pub fn readdir(&self, ino: Ino) -> FsResult<Vec<DirEntry>> {
        let d = self.dir(ino)?;
        let dots = [(ino, "."), (d.parent, "..")].map(|(ino, n)| DirEntry {
            ino,
            kind: Kind::Dir,
            special_mode: 0,
            name: n.into(),
        });
        let rest = d.live.iter().filter_map(|(name, i)| {
            let a = self.getattr(*i).ok()?;
            Some(DirEntry {
                ino: *i,
                kind: a.kind,
                special_mode: a.special_mode,
                name: name.clone(),
            })
        });
        Ok(dots.into_iter().chain(rest).collect())
    }

    fn touch_dir(&mut self, parent: Ino) {
        if let Some(n) = self.inodes.get_mut(&parent) {
            n.mtime = SystemTime::now();
            n.ctime = n.mtime;
        }
    }

    fn add_entry(&mut self, parent: Ino, name: &OsStr, ino: Ino) -> FsResult<()> {
        let d = self.dir_mut(parent)?;
        d.live.insert(name.to_owned(), ino);
        d.unsynced_ops += 1;
        self.inode_mut(ino)?.live_links += 1;
        if let Body::Dir(child) = &mut self.inode_mut(ino)?.body {
            child.parent = parent;
        }
        self.touch_dir(parent);
        Ok(())
    }

    /// Removes a live entry; the caller runs [`Fs::collect`] on its inode.
    fn remove_entry(&mut self, parent: Ino, name: &OsStr) -> FsResult<Ino> {
        let d = self.dir_mut(parent)?;
        let ino = d.live.remove(name).ok_or(FsError::NotFound)?;
        d.unsynced_ops += 1;
        let node = self.inode_mut(ino)?;
        node.live_links = node.live_links.saturating_sub(1);
        node.ctime = SystemTime::now();
        self.touch_dir(parent);
        Ok(ino)
    }

    /// A new inode named `name` in `parent`.
    fn make(&mut self, parent: Ino, name: &OsStr, body: Body, owner: Owner) -> FsResult<Attr> {
        check_name(name)?;
        if self.dir(parent)?.live.contains_key(name) {
            return Err(FsError::Exists);
        }
        let node = Inode::new(body, owner);
        self.reserve(node.size())?;
        self.used_bytes += node.size();
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, node);
        self.add_entry(parent, name, ino)?;
        self.getattr(ino)
    }

    pub fn create(&mut self, parent: Ino, name: &OsStr, owner: Owner) -> FsResult<Attr> {
        self.make(parent, name, Body::File(FileData::default()), owner)
    }

    pub fn mkdir(&mut self, parent: Ino, name: &OsStr, owner: Owner) -> FsResult<Attr> {
        let dir = Dir {
            parent,
            ..Dir::default()
        };
        self.make(parent, name, Body::Dir(dir), owner)
    }

    /// A FIFO, socket or device node: `mode` holds its `S_IFMT` bits.
    pub fn mknod_special(
        &mut self,
        parent: Ino,
        name: &OsStr,
        owner: Owner,
        mode: u32,
        rdev: u32,
    ) -> FsResult<Attr> {
        self.make(parent, name, Body::Special { mode, rdev }, owner)
    }

    pub fn symlink(
        &mut self,
        parent: Ino,
        name: &OsStr,
        target: &[u8],
        owner: Owner,
    ) -> FsResult<Attr> {
        let owner = Owner {
            perm: 0o777,
            ..owner
        };
        self.make(parent, name, Body::Symlink(target.to_vec()), owner)
    }

    pub fn link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> FsResult<Attr> {
        check_name(name)?;
        self.refuse_if_full()?;
        if self.is_dir(ino) {
            return Err(FsError::NotPermitted);
        }
        self.inode(ino)?;
        if self.dir(parent)?.live.contains_key(name) {
            return Err(FsError::Exists);
        }
        self.add_entry(parent, name, ino)?;
        self.getattr(ino)
    }

    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> FsResult<()> {
        if self.is_dir(self.entry(parent, name)?) {
            return Err(FsError::IsDir);
        }
        let ino = self.remove_entry(parent, name)?;
        self.collect(ino);
        Ok(())
    }

    pub fn rmdir(&mut self, parent: Ino, name: &OsStr) -> FsResult<()> {
        if name == ".." {
            return Err(FsError::NotEmpty);
        }
        check_name(name)?;
        let ino = self.entry(parent, name)?;
        if !self.dir(ino)?.live.is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.remove_entry(parent, name)?;
        self.collect(ino);
        Ok(())
    }

    /// Moves `parent/name` to `new_parent/new_name`, replacing what is there
    /// (unless `no_replace`) when the kinds allow it.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        no_replace: bool,
    ) -> FsResult<()> {
        check_name(new_name)?;
        let src = self.entry(parent, name)?;
        let dst = self.dir(new_parent)?.live.get(new_name).copied();
        if dst == Some(src) {
            return Ok(());
        }
        if let Some(d) = dst {
            self.check_replace(src, d, no_replace)?;
        }
        if self.is_dir(src) && self.is_ancestor(src, new_parent) {
            return Err(FsError::Invalid);
        }
        if dst.is_some() {
            self.remove_entry(new_parent, new_name)?;
        }
        self.remove_entry(parent, name)?;
        self.add_entry(new_parent, new_name, src)?;
        if let Some(d) = dst {
            self.collect(d);
        }
        Ok(())
    }

    fn check_replace(&self, src: Ino, dst: Ino, no_replace: bool) -> FsResult<()> {
        if no_replace {
            return Err(FsError::Exists);
        }
        match (self.is_dir(src), self.is_dir(dst)) {
            (true, false) => Err(FsError::NotDir),
            (false, true) => Err(FsError::IsDir),
            (true, true) if !self.dir(dst)?.live.is_empty() => Err(FsError::NotEmpty),
            _ => Ok(()),
        }
    }

    /// Is `dir` `ino` or one of its live ancestors?
    fn is_ancestor(&self, dir: Ino, mut ino: Ino) -> bool {
        for _ in 0..=self.inodes.len() {
            if ino == dir {
                return true;
            }
            match self.dir(ino) {
                Ok(d) if ino != ROOT => ino = d.parent,
                _ => return false,
            }
        }
        false
    }

    /// fsyncdir: the directory's live entries become its durable ones.
    pub fn fsyncdir(&mut self, ino: Ino) -> FsResult<()> {
        let d = self.dir_mut(ino)?;
        let live = d.live.clone();
        let old = std::mem::replace(&mut d.durable, live);
        d.unsynced_ops = 0;
        let new: Vec<Ino> = self.dir(ino)?.durable.values().copied().collect();
        for i in new {
            if let Some(n) = self.inodes.get_mut(&i) {
                n.durable_links += 1;
            }
        }
        for i in old.into_values() {
            if let Some(n) = self.inodes.get_mut(&i) {
                n.durable_links = n.durable_links.saturating_sub(1);
            }
            self.collect(i);
        }
        Ok(())
    }

    /// Frees `ino` (and what only it kept) once nothing names it.
    pub(super) fn collect(&mut self, ino: Ino) {
        let mut work = vec![ino];
        while let Some(i) = work.pop() {
            let unused = |n: &Inode| n.live_links == 0 && n.durable_links == 0 && n.open == 0;
            if i == ROOT || !self.inodes.get(&i).is_some_and(unused) {
                continue;
            }
            let Some(node) = self.inodes.remove(&i) else {
                continue;
            };
            self.used_bytes = self.used_bytes.saturating_sub(node.size());
            let Body::Dir(d) = node.body else { continue };
            for (c, durable) in d
                .durable
                .into_values()
                .map(|c| (c, true))
                .chain(d.live.into_values().map(|c| (c, false)))
            {
                if let Some(n) = self.inodes.get_mut(&c) {
                    if durable {
                        n.durable_links = n.durable_links.saturating_sub(1);
                    } else {
                        n.live_links = n.live_links.saturating_sub(1);
                    }
                    work.push(c);
                }
            }
        }
    }
}
