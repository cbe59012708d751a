//! Operations on names: lookup, create, mknod, mkdir, symlink, link, unlink, rmdir, rename.
//!
//! Every one starts from the parent's `O_PATH` descriptor (`*at` calls), so a concurrent
//! rename of any directory above cannot redirect it. An operation that may remove a regular
//! file's last name tells the data path (`DataPath::forget`) once the backing file system has
//! done it, so no cached copy of the dead file's blocks can be read again.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use fuser::{FileAttr, INodeNo, Request};

use crate::fs::Passthrough;
use crate::handles::FileHandle;
use crate::inode::Inode;
use crate::sys;

/// A regular file that an unlink or rename may take the last name of.
struct Victim {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

/// Flags for opening a backing file on behalf of the application. The kernel already
/// positions writes (so no `O_APPEND`: `pwrite` with it ignores the offset), the backing
/// file is reached through /proc/self/fd (so no `O_NOFOLLOW`), direct backing reads are the
/// data path's business (so no `O_DIRECT`), and truncation goes through the data path (so no
/// `O_TRUNC`). Synchronous-write and non-blocking flags are kept.
pub(crate) fn backing_open_flags(flags: i32) -> i32 {
    let strip = libc::O_CREAT
        | libc::O_EXCL
        | libc::O_TRUNC
        | libc::O_APPEND
        | libc::O_DIRECT
        | libc::O_NOCTTY
        | libc::O_NOFOLLOW
        | libc::O_PATH
        | libc::O_TMPFILE
        | libc::O_DIRECTORY
        | libc::O_CLOEXEC;
    flags & !strip
}

impl Passthrough {
    pub(crate) fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> io::Result<(std::sync::Arc<Inode>, FileAttr)> {
        if self.union.is_some() {
            return self.u_lookup(parent, name);
        }
        let p = self.inode(parent)?;
        // The kernel resolves "." and ".." itself; refuse them rather than let ".." at the
        // root step out of the backing directory.
        if name == "." || name == ".." {
            return Err(sys::err(libc::EINVAL));
        }
        self.entry_of(&p, &sys::cname(name)?)
    }

    pub(crate) fn do_mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> io::Result<FileAttr> {
        if self.union.is_some() {
            return self.u_make(req, parent, name, crate::union::ops::Make::Node { mode, rdev });
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        sys::mknodat(p.fd()?.as_fd(), &c, mode, u64::from(rdev))?;
        self.finish_new(req, &p, &c)
    }

    pub(crate) fn do_mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32) -> io::Result<FileAttr> {
        if self.union.is_some() {
            return self.u_make(req, parent, name, crate::union::ops::Make::Dir(mode));
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        sys::mkdirat(p.fd()?.as_fd(), &c, mode)?;
        self.finish_new(req, &p, &c)
    }

    pub(crate) fn do_symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
    ) -> io::Result<FileAttr> {
        if self.union.is_some() {
            let t = sys::cname(target.as_os_str())?;
            return self.u_make(req, parent, name, crate::union::ops::Make::Symlink(&t));
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        let t = sys::cname(target.as_os_str())?;
        sys::symlinkat(&t, p.fd()?.as_fd(), &c)?;
        self.finish_new(req, &p, &c)
    }

    /// After creating `parent/name`: give it to the caller and count the kernel's reference.
    /// If that fails the new name is removed again, so a failed call leaves nothing behind.
    pub(crate) fn finish_new(&self, req: &Request, parent: &Inode, name: &std::ffi::CStr) -> io::Result<FileAttr> {
        let res = (|| {
            let fd = sys::openat(parent.fd()?.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            self.give_to_caller(req, parent, fd.as_fd())?;
            let st = sys::fstat(fd.as_fd())?;
            let inode = self.inodes.lookup(fd, &st)?;
            Ok(self.attr(inode.nodeid, &st))
        })();
        if res.is_err() {
            let is_dir = sys::statat(parent.fd()?.as_fd(), name).map(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR);
            let flag = if is_dir.unwrap_or(false) { libc::AT_REMOVEDIR } else { 0 };
            let _ = sys::unlinkat(parent.fd()?.as_fd(), name, flag);
        }
        res
    }

    pub(crate) fn do_link(&self, ino: INodeNo, newparent: INodeNo, newname: &OsStr) -> io::Result<FileAttr> {
        if self.union.is_some() {
            return self.u_link(ino, newparent, newname);
        }
        let inode = self.inode(ino)?;
        let p = self.inode(newparent)?;
        let c = sys::cname(newname)?;
        sys::link_proc(inode.fd()?.as_fd(), p.fd()?.as_fd(), &c)?;
        Ok(self.entry_of(&p, &c)?.1)
    }

    pub(crate) fn do_unlink(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        if self.union.is_some() {
            return self.u_unlink(parent, name);
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        let victim = self.victim(&p, &c);
        let known = self.known_target(&p, &c);
        sys::unlinkat(p.fd()?.as_fd(), &c, 0)?;
        self.bury(victim);
        self.keep_if_nameless(known);
        Ok(())
    }

    pub(crate) fn do_rmdir(&self, parent: INodeNo, name: &OsStr) -> io::Result<()> {
        if self.union.is_some() {
            return self.u_rmdir(parent, name);
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        let known = self.known_target(&p, &c);
        sys::unlinkat(p.fd()?.as_fd(), &c, libc::AT_REMOVEDIR)?;
        self.keep_if_nameless(known);
        Ok(())
    }

    pub(crate) fn do_rename(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        if self.union.is_some() {
            return self.u_rename(parent, name, newparent, newname, flags);
        }
        let p = self.inode(parent)?;
        let np = self.inode(newparent)?;
        let (c, nc) = (sys::cname(name)?, sys::cname(newname)?);
        // An exchange or a no-replace rename removes no name.
        let replaces = flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) == 0;
        let victim = if replaces { self.victim(&np, &nc) } else { None };
        let known = if replaces { self.known_target(&np, &nc) } else { None };
        sys::renameat2(p.fd()?.as_fd(), &c, np.fd()?.as_fd(), &nc, flags)?;
        self.bury(victim);
        self.keep_if_nameless(known);
        Ok(())
    }

    pub(crate) fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        made: bool,
    ) -> io::Result<(FileAttr, u64)> {
        if self.union.is_some() {
            return self.u_create(req, parent, name, mode, flags);
        }
        let p = self.inode(parent)?;
        let c = sys::cname(name)?;
        let oflags = backing_open_flags(flags) | libc::O_NOFOLLOW;
        let mode = mode & !libc::S_IFMT;
        // Create exclusively first, so that we know whether this call made the file: only
        // then does it become the caller's. Without O_EXCL an existing name (made behind the
        // mount's back) is opened instead — or, with `made`, one an earlier daemon created
        // for this very request (`ops_once.rs`), which is then this call's.
        let (fd, created) = match sys::openat(p.fd()?.as_fd(), &c, oflags | libc::O_CREAT | libc::O_EXCL, mode) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => {
                (sys::openat(p.fd()?.as_fd(), &c, oflags, 0)?, made)
            }
            Err(e) => return Err(e),
        };
        if created {
            if let Err(e) = self.give_to_caller(req, &p, fd.as_fd()) {
                let _ = sys::unlinkat(p.fd()?.as_fd(), &c, 0);
                return Err(e);
            }
        }
        let path_fd = sys::reopen(fd.as_fd(), libc::O_PATH)?;
        let st = sys::fstat(fd.as_fd())?;
        let inode = self.inodes.lookup(path_fd, &st)?;
        let res = (|| {
            let backing = self.backing(&inode, File::from(fd), flags)?;
            if flags & libc::O_TRUNC != 0 && !created {
                self.truncate(&inode, Some(&backing), 0)?;
            }
            self.files.insert(FileHandle::new(backing))
        })();
        match res {
            Ok(fh) => Ok((self.attr(inode.nodeid, &sys::fstat(inode.fd()?.as_fd())?), fh)),
            Err(e) => {
                // The kernel will not learn of this inode: drop the reference counted above.
                self.inodes.forget(inode.nodeid, 1);
                Err(e)
            }
        }
    }

    /// The regular file `dir/name`, before an operation that may take its last name.
    fn victim(&self, dir: &Inode, name: &std::ffi::CStr) -> Option<Victim> {
        let fd = sys::openat(dir.fd().ok()?.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(Victim { fd, dev: st.st_dev, ino: st.st_ino })
    }

    /// The inode `dir/name` if the kernel knows it (before an operation that may take its
    /// last name), and only when someone listens (a supervisor keeps such inodes alive).
    fn known_target(&self, dir: &Inode, name: &std::ffi::CStr) -> Option<std::sync::Arc<Inode>> {
        if !self.keeper.is_set() {
            return None;
        }
        let fd = sys::openat(dir.fd().ok()?.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        self.inodes.find(st.st_dev, st.st_ino)
    }

    /// After the operation: an inode the kernel knows that has no name left is handed to
    /// the keeper, so that its inode number is not reused while the kernel may still ask
    /// for it by that number (after a crash, node ids are resolved by number).
    fn keep_if_nameless(&self, known: Option<std::sync::Arc<Inode>>) {
        let Some(i) = known else { return };
        let Ok(fd) = i.fd() else { return };
        if sys::fstat(fd.as_fd()).is_ok_and(|st| st.st_nlink == 0) {
            self.keeper.tell(crate::Kept::Unlinked { nodeid: i.nodeid, fd: fd.as_fd() });
        }
    }

    /// After the operation: if the victim has no name left, its data identity is dead.
    fn bury(&self, victim: Option<Victim>) {
        let Some(v) = victim else { return };
        match sys::fstat(v.fd.as_fd()) {
            Ok(st) if st.st_nlink == 0 => {
                if let Some(id) = self.identity_of_unlinked(v.dev, v.ino, v.fd.as_fd()) {
                    self.data.forget(&id);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_keep_access_and_sync_but_drop_what_the_kernel_or_data_path_owns() {
        let f = backing_open_flags(libc::O_RDWR | libc::O_APPEND | libc::O_TRUNC | libc::O_DSYNC | libc::O_DIRECT);
        assert_eq!(f & libc::O_ACCMODE, libc::O_RDWR);
        assert_ne!(f & libc::O_DSYNC, 0);
        assert_eq!(f & (libc::O_APPEND | libc::O_TRUNC | libc::O_DIRECT), 0);
    }
}
