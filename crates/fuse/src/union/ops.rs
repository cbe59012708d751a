//! The name operations of a mount of several branches (the rules are in `mod.rs`). Each
//! holds the gate shared for its whole length; the single-branch operations in `ops_*.rs`
//! hand over to these at their first line when the mount is a union.

use std::collections::HashSet;
use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use farcache_engine::FileId;
use fuser::{FileAttr, FileHandle as Fh, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus, Request};

use super::{IdRecord, Union, MAX_MERGED_ENTRIES};
use crate::fs::Passthrough;
use crate::handles::{DirHandle, FileHandle};
use crate::inode::{Inode, ROOT_ID};
use crate::ops_entry::backing_open_flags;
use crate::sys;

/// One entry of a merged directory listing.
#[derive(Clone, Debug)]
pub(crate) struct Merged {
    pub(crate) name: Vec<u8>,
    pub(crate) kind: FileType,
    pub(crate) ino: u64,
}

/// What `u_make` makes.
pub(crate) enum Make<'a> {
    Node { mode: u32, rdev: u32 },
    Symlink(&'a CStr),
    Dir(u32),
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

fn missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT))
}

/// A regular file that an operation may take the last name of: its descriptor and id.
struct Victim {
    fd: OwnedFd,
    st: libc::stat,
    id: Option<u64>,
}

impl Passthrough {
    pub(crate) fn un(&self) -> &Union {
        self.union.as_deref().expect("a union mount")
    }

    /// The directory `dir` on every branch it exists on, in branch order (`O_PATH`).
    pub(crate) fn branch_dirs(&self, dir: &Inode) -> io::Result<Vec<(usize, OwnedFd)>> {
        let u = self.un();
        if !dir.is_dir() {
            return Err(sys::err(libc::ENOTDIR));
        }
        let (b0, rel) = if dir.nodeid == ROOT_ID { (0, PathBuf::new()) } else { u.locate(dir.fd()?.as_fd())? };
        let mut out = Vec::with_capacity(u.branches.len());
        for b in 0..u.branches.len() {
            let fd = if b == b0 {
                sys::dup(dir.fd()?.as_fd())?
            } else {
                match u.walk(b, &rel) {
                    Ok(fd) => fd,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => continue,
                    Err(e) => return Err(e),
                }
            };
            out.push((b, fd));
        }
        Ok(out)
    }

    /// The first entry `name` of `dirs` (in branch order): branch, `O_PATH` descriptor, stat.
    pub(crate) fn u_find(
        &self,
        dirs: &[(usize, OwnedFd)],
        name: &CStr,
    ) -> io::Result<Option<(usize, OwnedFd, libc::stat)>> {
        for (b, d) in dirs {
            match sys::openat(d.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => {
                    let st = sys::fstat(fd.as_fd())?;
                    return Ok(Some((*b, fd, st)));
                }
                Err(e) if missing(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Count one kernel reference to the inode `fd` (stat `st`) on branch `b`: a regular
    /// file under its farcache id, anything else under its backing inode.
    fn u_enter(&self, b: usize, fd: OwnedFd, st: &libc::stat) -> io::Result<(Arc<Inode>, FileAttr)> {
        let u = self.un();
        let id = if is_reg(st) { u.identify(fd.as_fd(), st, b) } else { None };
        let inode = match id {
            Some(id) => self.enter_id(fd, st, id)?,
            None => self.u_enter_as(fd, st, None)?,
        };
        Ok((inode.clone(), self.attr(inode.nodeid, st)))
    }

    /// Enter the regular file `fd` under farcache id `id` (node id and data identity).
    fn enter_id(&self, fd: OwnedFd, st: &libc::stat, id: u64) -> io::Result<Arc<Inode>> {
        let mut key = *st;
        key.st_dev = farcache_engine::identity::UNION_DEV;
        key.st_ino = id;
        let inode = self.u_enter_as(fd, &key, Some(id))?;
        let _ = inode.file_id.get_or_init(|| FileId::union(id));
        Ok(inode)
    }

    /// [`crate::inode::InodeTable::lookup_as`]; a node new to the kernel is also told to
    /// the keeper (a supervisor), before the kernel hears of it: after a crash a union's node
    /// ids (farcache ids, synthetic ones) cannot be resolved from the branches, only from the
    /// descriptors the supervisor kept.
    fn u_enter_as(&self, fd: OwnedFd, key: &libc::stat, nodeid: Option<u64>) -> io::Result<Arc<Inode>> {
        let (inode, new) = self.inodes.lookup_as(fd, key, nodeid)?;
        if new {
            self.keeper.tell(crate::Kept::Known { nodeid: inode.nodeid, fd: inode.fd()?.as_fd() });
        }
        Ok(inode)
    }

    /// Look `name` up in `parent` (the gate held by the caller).
    pub(crate) fn u_entry(&self, parent: &Inode, name: &CStr) -> io::Result<(Arc<Inode>, FileAttr)> {
        self.u_entry_in(parent, &self.branch_dirs(parent)?, name)
    }

    /// [`Self::u_entry`] with the parent's per-branch directories known (`dirs`).
    fn u_entry_in(&self, parent: &Inode, dirs: &[(usize, OwnedFd)], name: &CStr) -> io::Result<(Arc<Inode>, FileAttr)> {
        if Union::hidden(parent.nodeid == ROOT_ID, OsStr::from_bytes(name.to_bytes())) {
            return Err(sys::err(libc::ENOENT));
        }
        match self.u_find(dirs, name)? {
            Some((b, fd, st)) => self.u_enter(b, fd, &st),
            None => Err(sys::err(libc::ENOENT)),
        }
    }

    /// Which inode `parent/name` is in the merged tree (the intent journal's identities).
    pub(crate) fn u_ident(&self, parent: &Inode, name: &CStr) -> Option<crate::journal::Ident> {
        let _g = self.un().gate.read();
        let dirs = self.branch_dirs(parent).ok()?;
        let (_, fd, _) = self.u_find(&dirs, name).ok()??;
        sys::ident_at(fd.as_fd(), c"").ok()
    }

    /// A name a dead daemon made for a request the kernel resent (`ops_once.rs`): given to
    /// the caller on every branch it is on, and looked up as the first answer would have.
    pub(crate) fn u_adopt_new(&self, req: &Request, parent: &Inode, name: &CStr) -> io::Result<FileAttr> {
        let _g = self.un().gate.read();
        let dirs = self.branch_dirs(parent)?;
        for (_, d) in &dirs {
            match sys::openat(d.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => self.give_to_caller(req, parent, fd.as_fd())?,
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.u_entry_in(parent, &dirs, name)?.1)
    }

    /// A resent rename whose first execution died (`ops_once.rs`): if `newparent/newname`
    /// names the regular file `source` on some branch, the rename of the file happened; the
    /// target name is then removed from the other branches, as the first execution would
    /// have. Whether it happened.
    pub(crate) fn u_finish_rename(&self, newparent: INodeNo, newname: &OsStr, source: crate::journal::Ident) -> bool {
        let _g = self.un().gate.read();
        let (Ok(np), Ok(nc)) = (self.inode(newparent), sys::cname(newname)) else { return false };
        let Ok(dirs) = self.branch_dirs(&np) else { return false };
        let is_source = |d: BorrowedFd<'_>| sys::ident_at(d, &nc).ok() == Some(source);
        let Some(at) = dirs.iter().position(|(_, d)| is_source(d.as_fd())) else { return false };
        if sys::statat(dirs[at].1.as_fd(), &nc).map_or(true, |st| !is_reg(&st)) {
            return false;
        }
        for (i, (_, d)) in dirs.iter().enumerate() {
            if i == at {
                continue;
            }
            match sys::statat(d.as_fd(), &nc) {
                Ok(st) if is_dir(&st) => {
                    let _ = sys::unlinkat(d.as_fd(), &nc, libc::AT_REMOVEDIR);
                }
                Ok(_) => {
                    let victim = self.u_victim(d.as_fd(), &nc);
                    if sys::unlinkat(d.as_fd(), &nc, 0).is_ok() {
                        self.u_bury(victim);
                    }
                }
                Err(_) => {}
            }
        }
        true
    }

    /// [`Self::u_entry`] with the gate taken here.
    pub(crate) fn u_entry_gated(&self, parent: &Inode, name: &CStr) -> io::Result<(Arc<Inode>, FileAttr)> {
        let _g = self.un().gate.read();
        self.u_entry(parent, name)
    }

    pub(crate) fn u_lookup(&self, parent: INodeNo, name: &OsStr) -> io::Result<(Arc<Inode>, FileAttr)> {
        let _g = self.un().gate.read();
        let p = self.inode(parent)?;
        if name == "." || name == ".." {
            return Err(sys::err(libc::EINVAL));
        }
        self.u_entry(&p, &sys::cname(name)?)
    }

    /// Refuse farcache's own names.
    fn own_name(parent: &Inode, name: &OsStr) -> io::Result<()> {
        if Union::hidden(parent.nodeid == ROOT_ID, name) {
            return Err(sys::err(libc::EPERM));
        }
        Ok(())
    }

    pub(crate) fn u_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(FileAttr, u64)> {
        let u = self.un();
        let _g = u.gate.read();
        let p = self.inode(parent)?;
        Self::own_name(&p, name)?;
        let c = sys::cname(name)?;
        let dirs = self.branch_dirs(&p)?;
        let oflags = backing_open_flags(flags) | libc::O_NOFOLLOW;
        if let Some((b, fd, st)) = self.u_find(&dirs, &c)? {
            if flags & libc::O_EXCL != 0 {
                return Err(sys::err(libc::EEXIST));
            }
            if is_dir(&st) {
                return Err(sys::err(libc::EISDIR));
            }
            let (inode, _) = self.u_enter(b, fd, &st)?;
            let res = (|| {
                let fd = sys::reopen(inode.fd()?.as_fd(), backing_open_flags(flags))?;
                let backing = self.backing(&inode, File::from(fd), flags)?;
                let branch = b;
                if flags & libc::O_TRUNC != 0 {
                    self.truncate(&inode, Some(&backing), 0)?;
                    note_write(u, backing.id());
                }
                self.files.insert(FileHandle::on(backing, branch))
            })();
            return match res {
                Ok(fh) => Ok((self.attr(inode.nodeid, &sys::fstat(inode.fd()?.as_fd())?), fh)),
                Err(e) => {
                    self.inodes.forget(inode.nodeid, 1);
                    Err(e)
                }
            };
        }
        let cands: Vec<usize> = dirs.iter().map(|(b, _)| *b).collect();
        let b = u.place(&cands).ok_or_else(|| sys::err(libc::ENOENT))?;
        let d = &dirs.iter().find(|(x, _)| *x == b).expect("placed among the candidates").1;
        let fd = sys::openat(d.as_fd(), &c, oflags | libc::O_CREAT | libc::O_EXCL, mode & !libc::S_IFMT)?;
        let made = (|| {
            self.give_to_caller(req, &p, fd.as_fd())?;
            let st = sys::fstat(fd.as_fd())?;
            let id = match u.new_id().and_then(|id| {
                IdRecord { id, branch: u.branches[b].uuid, ino: st.st_ino }.write(fd.as_fd(), &u.xattr)?;
                Ok(id)
            }) {
                Ok(id) => Some(id),
                Err(e) => {
                    u.counters.id_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("no farcache id for a new file on {}: {e}", u.branches[b].path.display());
                    None
                }
            };
            let path_fd = sys::reopen(fd.as_fd(), libc::O_PATH)?;
            let inode = match id {
                Some(id) => self.enter_id(path_fd, &st, id)?,
                None => self.u_enter_as(path_fd, &st, None)?,
            };
            Ok(inode)
        })();
        let inode = match made {
            Ok(i) => i,
            Err(e) => {
                let _ = sys::unlinkat(d.as_fd(), &c, 0);
                return Err(e);
            }
        };
        let res = (|| {
            let backing = self.backing(&inode, File::from(fd), flags)?;
            self.files.insert(FileHandle::on(backing, b))
        })();
        match res {
            Ok(fh) => Ok((self.attr(inode.nodeid, &sys::fstat(inode.fd()?.as_fd())?), fh)),
            Err(e) => {
                self.inodes.forget(inode.nodeid, 1);
                Err(e)
            }
        }
    }

    /// mknod, symlink (on one branch, by the create policy) and mkdir (on every branch
    /// where the parent is).
    pub(crate) fn u_make(&self, req: &Request, parent: INodeNo, name: &OsStr, what: Make<'_>) -> io::Result<FileAttr> {
        let u = self.un();
        let _g = u.gate.read();
        let p = self.inode(parent)?;
        Self::own_name(&p, name)?;
        let c = sys::cname(name)?;
        let dirs = self.branch_dirs(&p)?;
        if self.u_find(&dirs, &c)?.is_some() {
            return Err(sys::err(libc::EEXIST));
        }
        let make = |d: BorrowedFd<'_>| match &what {
            Make::Node { mode, rdev } => sys::mknodat(d, &c, *mode, u64::from(*rdev)),
            Make::Symlink(t) => sys::symlinkat(t, d, &c),
            Make::Dir(mode) => sys::mkdirat(d, &c, *mode),
        };
        let targets: Vec<&(usize, OwnedFd)> = match what {
            Make::Dir(_) => dirs.iter().collect(),
            _ => {
                let cands: Vec<usize> = dirs.iter().map(|(b, _)| *b).collect();
                let b = u.place(&cands).ok_or_else(|| sys::err(libc::ENOENT))?;
                dirs.iter().filter(|(x, _)| *x == b).collect()
            }
        };
        let mut made: Vec<&(usize, OwnedFd)> = Vec::new();
        for t in targets {
            match make(t.1.as_fd()) {
                Ok(()) => made.push(t),
                // The first branch decides; a later one that cannot is left without it.
                Err(e) if made.is_empty() => return Err(e),
                Err(e) => tracing::warn!("mkdir on branch {} failed: {e}", u.branches[t.0].path.display()),
            }
        }
        let res = (|| {
            for (_, d) in &made {
                let fd = sys::openat(d.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
                self.give_to_caller(req, &p, fd.as_fd())?;
            }
            Ok(self.u_entry(&p, &c)?.1)
        })();
        if res.is_err() {
            let flag = if matches!(what, Make::Dir(_)) { libc::AT_REMOVEDIR } else { 0 };
            for (_, d) in &made {
                let _ = sys::unlinkat(d.as_fd(), &c, flag);
            }
        }
        res
    }

    pub(crate) fn u_link(&self, ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> io::Result<FileAttr> {
        let u = self.un();
        let _g = u.gate.read();
        let inode = self.inode(ino)?;
        let p = self.inode(newparent)?;
        Self::own_name(&p, newname)?;
        let c = sys::cname(newname)?;
        let dirs = self.branch_dirs(&p)?;
        if self.u_find(&dirs, &c)?.is_some() {
            return Err(sys::err(libc::EEXIST));
        }
        let (b, _) = u.locate(inode.fd()?.as_fd())?;
        let d = self.dir_on(&p, &dirs, b)?;
        sys::link_proc(inode.fd()?.as_fd(), d.as_fd(), &c)?;
        Ok(self.u_entry(&p, &c)?.1)
    }

    /// The directory `dir` (whose per-branch descriptors are `dirs`) on branch `b`, made
    /// there (like the branch it was found on first) if missing.
    fn dir_on(&self, dir: &Inode, dirs: &[(usize, OwnedFd)], b: usize) -> io::Result<OwnedFd> {
        if let Some((_, d)) = dirs.iter().find(|(x, _)| *x == b) {
            return sys::dup(d.as_fd());
        }
        let (b0, rel) =
            if dir.nodeid == ROOT_ID { (0, PathBuf::new()) } else { self.un().locate(dir.fd()?.as_fd())? };
        self.un().ensure_path(b, b0, &rel)
    }

    fn u_victim(&self, dir: BorrowedFd<'_>, name: &CStr) -> Option<Victim> {
        let fd = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        if !is_reg(&st) {
            return None;
        }
        let u = self.un();
        let own =
            |r: &IdRecord| r.ino == st.st_ino && u.branches.iter().any(|b| b.uuid == r.branch && b.dev == st.st_dev);
        let id = IdRecord::read(fd.as_fd(), &u.xattr).filter(own).map(|r| r.id);
        Some(Victim { fd, st, id })
    }

    /// After an operation: a victim without a name left takes its cached blocks with it.
    fn u_bury(&self, v: Option<Victim>) {
        let Some(v) = v else { return };
        if !sys::fstat(v.fd.as_fd()).is_ok_and(|st| st.st_nlink == 0) {
            return;
        }
        let id = match v.id {
            Some(id) => Some(FileId::union(id)),
            None => self.identity_of_unlinked(v.st.st_dev, v.st.st_ino, v.fd.as_fd()),
        };
        if let Some(id) = id {
            self.data.forget(&id);
        }
    }

    pub(crate) fn u_unlink(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        let _g = self.un().gate.read();
        let p = self.inode(parent)?;
        Self::own_name(&p, name)?;
        let c = sys::cname(name)?;
        let mut found = false;
        for (_, d) in self.branch_dirs(&p)? {
            let st = match sys::statat(d.as_fd(), &c) {
                Ok(st) => st,
                Err(e) if missing(&e) => continue,
                Err(e) => return Err(e),
            };
            if is_dir(&st) {
                if !found {
                    return Err(sys::err(libc::EISDIR));
                }
                continue;
            }
            let v = self.u_victim(d.as_fd(), &c);
            sys::unlinkat(d.as_fd(), &c, 0)?;
            found = true;
            self.u_bury(v);
        }
        if !found {
            return Err(sys::err(libc::ENOENT));
        }
        Ok(())
    }

    pub(crate) fn u_rmdir(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        let _g = self.un().gate.read();
        let p = self.inode(parent)?;
        Self::own_name(&p, name)?;
        let c = sys::cname(name)?;
        let mut with: Vec<OwnedFd> = Vec::new();
        for (_, d) in self.branch_dirs(&p)? {
            match sys::statat(d.as_fd(), &c) {
                Ok(st) if is_dir(&st) => {
                    let fd = sys::openat(d.as_fd(), &c, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
                    if !is_empty(fd.as_fd())? {
                        return Err(sys::err(libc::ENOTEMPTY));
                    }
                    with.push(d);
                }
                Ok(_) if with.is_empty() => return Err(sys::err(libc::ENOTDIR)),
                Ok(_) => {}
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if with.is_empty() {
            return Err(sys::err(libc::ENOENT));
        }
        for d in with {
            sys::unlinkat(d.as_fd(), &c, libc::AT_REMOVEDIR)?;
        }
        Ok(())
    }

    pub(crate) fn u_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        let _g = self.un().gate.read();
        let p = self.inode(parent)?;
        let np = self.inode(newparent)?;
        Self::own_name(&p, name)?;
        Self::own_name(&np, newname)?;
        let (c, nc) = (sys::cname(name)?, sys::cname(newname)?);
        let pdirs = self.branch_dirs(&p)?;
        let npdirs = self.branch_dirs(&np)?;
        let stat_in = |dirs: &[(usize, OwnedFd)], n: &CStr| -> io::Result<Vec<(usize, libc::stat)>> {
            let mut v = Vec::new();
            for (b, d) in dirs {
                match sys::statat(d.as_fd(), n) {
                    Ok(st) => v.push((*b, st)),
                    Err(e) if missing(&e) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(v)
        };
        let src = stat_in(&pdirs, &c)?;
        let Some(&(sb, sst)) = src.first() else { return Err(sys::err(libc::ENOENT)) };
        let dst = stat_in(&npdirs, &nc)?;
        if flags & libc::RENAME_NOREPLACE != 0 && !dst.is_empty() {
            return Err(sys::err(libc::EEXIST));
        }
        fn dir_of(dirs: &[(usize, OwnedFd)], b: usize) -> Option<BorrowedFd<'_>> {
            dirs.iter().find(|(x, _)| *x == b).map(|(_, d)| d.as_fd())
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            // Only within one branch, each name there alone.
            if src.len() != 1 || dst.len() != 1 || dst[0].0 != sb {
                return Err(sys::err(libc::EXDEV));
            }
            let (d, nd) = (dir_of(&pdirs, sb).expect("found there"), dir_of(&npdirs, sb).expect("found there"));
            return sys::renameat2(d, &c, nd, &nc, flags);
        }
        if let Some(&(_, dst_st)) = dst.first() {
            if (sst.st_dev, sst.st_ino) == (dst_st.st_dev, dst_st.st_ino) {
                return Ok(()); // two names of one file: nothing to do (POSIX)
            }
            match (is_dir(&sst), is_dir(&dst_st)) {
                (true, false) => return Err(sys::err(libc::ENOTDIR)),
                (false, true) => return Err(sys::err(libc::EISDIR)),
                (true, true) => {
                    for (b, st) in &dst {
                        if is_dir(st) {
                            let d = dir_of(&npdirs, *b).expect("found there");
                            let fd = sys::openat(d, &nc, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
                            if !is_empty(fd.as_fd())? {
                                return Err(sys::err(libc::ENOTEMPTY));
                            }
                        }
                    }
                }
                (false, false) => {}
            }
        }
        // Every entry of the source's kind moves (a file is on one branch; a directory on
        // several).
        let srcs: Vec<usize> = src.iter().filter(|(_, st)| is_dir(st) == is_dir(&sst)).map(|(b, _)| *b).collect();
        for &b in &srcs {
            let d = dir_of(&pdirs, b).expect("found there");
            let nd = self.dir_on(&np, &npdirs, b)?;
            let victim = self.u_victim(nd.as_fd(), &nc);
            sys::renameat2(d, &c, nd.as_fd(), &nc, flags)?;
            self.u_bury(victim);
        }
        if !is_dir(&sst) {
            crate::ops_once::fault::die_at(crate::journal::Op::Rename, crate::ops_once::fault::Point::Between);
        }
        // The target name on the branches the source was not on would shadow or duplicate it.
        for (b, st) in dst.iter().filter(|(b, _)| !srcs.contains(b)) {
            let nd = dir_of(&npdirs, *b).expect("found there");
            if is_dir(st) {
                let _ = sys::unlinkat(nd, &nc, libc::AT_REMOVEDIR);
            } else {
                let victim = self.u_victim(nd, &nc);
                if sys::unlinkat(nd, &nc, 0).is_ok() {
                    self.u_bury(victim);
                }
            }
        }
        Ok(())
    }

    /// The merged listing of `dir`: ".", "..", then every branch's names, first one wins.
    fn u_list(&self, dir: &Inode) -> io::Result<Vec<Merged>> {
        let u = self.un();
        let dot = |n: &[u8], ino| Merged { name: n.to_vec(), kind: FileType::Directory, ino };
        let mut out = vec![dot(b".", dir.nodeid), dot(b"..", ROOT_ID)];
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut buf = vec![0u8; 16 * 1024];
        for (b, d) in self.branch_dirs(dir)? {
            let fd = sys::reopen(d.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
            loop {
                let n = sys::getdents(fd.as_fd(), &mut buf)?;
                if n == 0 {
                    break;
                }
                for e in sys::parse_dirents(&buf[..n]) {
                    if e.name == b"."
                        || e.name == b".."
                        || Union::hidden(dir.nodeid == ROOT_ID, OsStr::from_bytes(e.name))
                    {
                        continue;
                    }
                    if !seen.insert(e.name.to_vec()) {
                        continue;
                    }
                    if out.len() >= MAX_MERGED_ENTRIES {
                        return Err(sys::err(libc::EOVERFLOW));
                    }
                    let cname = std::ffi::CString::new(e.name).map_err(|_| sys::err(libc::EINVAL))?;
                    let kind = match crate::ops_dir::dtype_kind(e.dtype) {
                        Some(k) => k,
                        None => match sys::statat(fd.as_fd(), &cname) {
                            Ok(st) => crate::fs::kind(st.st_mode),
                            Err(_) => continue,
                        },
                    };
                    let br = &u.branches[b];
                    let ino = match kind {
                        FileType::RegularFile => IdRecord::read_at(fd.as_fd(), &cname, &u.xattr)
                            .filter(|r| r.branch == br.uuid && r.ino == e.ino)
                            .map(|r| r.id),
                        _ => None,
                    }
                    .or_else(|| self.inodes.find(br.dev, e.ino).map(|i| i.nodeid))
                    .unwrap_or(e.ino);
                    out.push(Merged { name: e.name.to_vec(), kind, ino });
                }
            }
        }
        Ok(out)
    }

    /// The listing of the handle, made afresh when the kernel reads from the start.
    fn listing(&self, d: &DirHandle, offset: u64) -> io::Result<Arc<Vec<Merged>>> {
        let mut m = d.merged.lock();
        if offset == 0 || m.is_none() {
            *m = Some(Arc::new(self.u_list(&d.inode)?));
        }
        Ok(m.as_ref().expect("made above").clone())
    }

    pub(crate) fn u_readdir(&self, ino: INodeNo, fh: Fh, offset: u64, reply: &mut ReplyDirectory) -> io::Result<()> {
        let d = self.dir(ino, fh)?;
        let list = self.listing(&d, offset)?;
        for (i, e) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), (i + 1) as u64, e.kind, OsStr::from_bytes(&e.name)) {
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn u_readdirplus(
        &self,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> io::Result<()> {
        let d = self.dir(ino, fh)?;
        let list = self.listing(&d, offset)?;
        let _g = self.un().gate.read();
        let dirs = self.branch_dirs(&d.inode)?;
        for (i, e) in list.iter().enumerate().skip(offset as usize) {
            let name = OsStr::from_bytes(&e.name);
            let off = (i + 1) as u64;
            if e.name == b"." || e.name == b".." {
                let attr = crate::ops_dir::dir_placeholder(e.ino);
                if reply.add(INodeNo(e.ino), off, name, &self.entry_ttl, &attr, Generation(0)) {
                    break;
                }
                continue;
            }
            let c = std::ffi::CString::new(e.name.clone()).map_err(|_| sys::err(libc::EINVAL))?;
            let (inode, attr) = match self.u_entry_in(&d.inode, &dirs, &c) {
                Ok(x) => x,
                Err(err) if missing(&err) => continue, // gone since
                Err(err) => return Err(err),
            };
            if reply.add(INodeNo(inode.nodeid), off, name, &self.entry_ttl, &attr, Generation(0)) {
                self.inodes.forget(inode.nodeid, 1);
                break;
            }
        }
        Ok(())
    }

    /// fsync of a directory: its directories on every branch (a file made or renamed in it
    /// went to one of them).
    pub(crate) fn u_fsyncdir(&self, ino: INodeNo, fh: Fh, datasync: bool) -> io::Result<()> {
        let d = self.dir(ino, fh)?;
        for (_, fd) in self.branch_dirs(&d.inode)? {
            let rd = sys::reopen(fd.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
            sys::fsync_fd(rd.as_fd(), datasync)?;
        }
        Ok(())
    }

    /// The id attribute is farcache's: hidden, and not the application's to set.
    pub(crate) fn u_xattr_hidden(&self, name: &OsStr) -> bool {
        self.union.as_ref().is_some_and(|u| name.as_bytes() == u.xattr.as_bytes())
    }

    /// A list of attribute names without the id attribute.
    pub(crate) fn u_filter_xattrs(&self, list: &[u8]) -> Vec<u8> {
        let Some(u) = &self.union else { return list.to_vec() };
        let own = u.xattr.as_bytes();
        let mut out = Vec::with_capacity(list.len());
        for n in list.split(|b| *b == 0).filter(|n| !n.is_empty() && *n != own) {
            out.extend_from_slice(n);
            out.push(0);
        }
        out
    }
}

/// A change to the file `id` while it may be moving (under the gate already held).
pub(crate) fn note_write(u: &Union, id: &FileId) {
    if let Some(id) = id.union_id() {
        if u.moving.load(Ordering::SeqCst) == id {
            u.moving_writes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Whether the open directory `fd` has no entry but "." and "..".
fn is_empty(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut buf = vec![0u8; 4096];
    loop {
        let n = sys::getdents(fd, &mut buf)?;
        if n == 0 {
            return Ok(true);
        }
        if sys::parse_dirents(&buf[..n]).any(|e| e.name != b"." && e.name != b"..") {
            return Ok(false);
        }
    }
}

/// `rel`'s parent and name, for a file (never the root).
pub(crate) fn split(rel: &Path) -> io::Result<(PathBuf, std::ffi::CString)> {
    let name = rel.file_name().ok_or_else(|| sys::err(libc::EINVAL))?;
    Ok((rel.parent().map(Path::to_path_buf).unwrap_or_default(), sys::cname(name)?))
}
