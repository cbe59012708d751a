//! Attributes: getattr, setattr (mode, owner, size, times), and extended attributes.
//!
//! An `O_PATH` descriptor cannot be `fchmod`ed, `futimens`ed or asked for xattrs, so those go
//! through its /proc/self/fd entry (which reaches the same inode, whatever its name); owners
//! go through `fchownat(AT_EMPTY_PATH)`, which works on `O_PATH` descriptors and symlinks.
//! Where the kernel passes an open handle, its descriptor is used instead.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use farcache_engine::BackingFile;
use fuser::{FileAttr, FileHandle as Fh, INodeNo, TimeOrNow};

use crate::fs::{stale, timespec, Passthrough};
use crate::handles::FileHandle;
use crate::inode::Inode;
use crate::sys;

/// What a setattr asks to change.
pub(crate) struct SetAttr {
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) size: Option<u64>,
    pub(crate) atime: Option<TimeOrNow>,
    pub(crate) mtime: Option<TimeOrNow>,
    /// The caller may not keep set-id bits through a truncation (not root; see
    /// `sys::kill_suidgid`).
    pub(crate) kill_suidgid: bool,
}

/// The answer to getxattr/listxattr: the size needed (when asked with size 0) or the bytes.
pub(crate) enum XattrAnswer {
    Size(u32),
    Data(Vec<u8>),
}

/// Largest xattr value or list handled (the kernel's own limit, XATTR_SIZE_MAX).
const XATTR_MAX_BYTES: u32 = 64 * 1024;

impl Passthrough {
    pub(crate) fn do_getattr(&self, ino: INodeNo, fh: Option<Fh>) -> io::Result<FileAttr> {
        let inode = self.inode(ino)?;
        let st = match fh.and_then(|fh| self.files.get(fh.0)) {
            Some(h) => sys::fstat(h.backing.file().as_fd())?,
            None => sys::fstat(inode.fd()?.as_fd())?,
        };
        Ok(self.attr(inode.nodeid, &st))
    }

    pub(crate) fn do_setattr(&self, ino: INodeNo, fh: Option<Fh>, set: &SetAttr) -> io::Result<FileAttr> {
        let inode = self.inode(ino)?;
        let _w =
            self.union.as_ref().map(|u| u.write_guard(inode.file_id.get().and_then(|f| f.union_id()).unwrap_or(0)));
        let handle: Option<std::sync::Arc<FileHandle>> = fh.and_then(|fh| self.files.get(fh.0));
        if let Some(mode) = set.mode {
            let mode = mode & 0o7777;
            match &handle {
                Some(h) => sys::fchmod(h.backing.file().as_fd(), mode)?,
                None if inode.is_symlink() => return Err(sys::err(libc::EOPNOTSUPP)),
                None => sys::fchmod_path(inode.fd()?.as_fd(), mode)?,
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            sys::fchown(inode.fd()?.as_fd(), set.uid.unwrap_or(u32::MAX), set.gid.unwrap_or(u32::MAX))?;
        }
        if let Some(size) = set.size {
            self.truncate(&inode, handle.as_ref().map(|h| &h.backing), size)?;
            if set.kill_suidgid && set.mode.is_none() {
                match &handle {
                    Some(h) => sys::kill_suidgid(h.backing.file().as_fd(), false)?,
                    None => sys::kill_suidgid(inode.fd()?.as_fd(), true)?,
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec(set.atime), timespec(set.mtime)];
            match &handle {
                Some(h) => sys::utimens(h.backing.file().as_fd(), &times, true, false)?,
                None => sys::utimens(inode.fd()?.as_fd(), &times, false, inode.is_symlink())?,
            }
        }
        let st = match &handle {
            Some(h) => sys::fstat(h.backing.file().as_fd())?,
            None => sys::fstat(inode.fd()?.as_fd())?,
        };
        Ok(self.attr(inode.nodeid, &st))
    }

    /// Set the size of `inode`'s data, through the data path (so cached blocks past the new
    /// end die with it). Uses `open` when it was opened for writing, else a short-lived
    /// write descriptor (truncate(2) by path, or `open(O_RDONLY | O_TRUNC)`).
    pub(crate) fn truncate(&self, inode: &Inode, open: Option<&BackingFile>, size: u64) -> io::Result<()> {
        if inode.is_dir() {
            return Err(sys::err(libc::EISDIR));
        }
        if !inode.is_reg() {
            return Err(sys::err(libc::EINVAL));
        }
        if let Some(b) = open.filter(|b| b.writable()) {
            return self.data.set_len(b, size);
        }
        let fd = sys::reopen(inode.fd()?.as_fd(), libc::O_WRONLY)?;
        let b = self.backing(inode, File::from(fd), libc::O_WRONLY)?;
        self.data.set_len(&b, size)
    }

    fn xattr_inode(&self, ino: INodeNo) -> io::Result<std::sync::Arc<Inode>> {
        let inode = self.inodes.get(ino.0).ok_or_else(stale)?;
        // There is no race-free way to reach a symlink's own xattrs from an O_PATH
        // descriptor (the /proc entry would follow it); user xattrs on symlinks are not
        // allowed anyway.
        if inode.is_symlink() {
            return Err(sys::err(libc::EOPNOTSUPP));
        }
        Ok(inode)
    }

    pub(crate) fn do_getxattr(&self, ino: INodeNo, name: &OsStr, size: u32) -> io::Result<XattrAnswer> {
        let inode = self.xattr_inode(ino)?;
        if self.u_xattr_hidden(name) {
            return Err(sys::err(libc::ENODATA));
        }
        let c = sys::cname(name)?;
        if size == 0 {
            return Ok(XattrAnswer::Size(sys::getxattr(inode.fd()?.as_fd(), &c, &mut [])? as u32));
        }
        let mut buf = vec![0u8; size.min(XATTR_MAX_BYTES) as usize];
        let n = sys::getxattr(inode.fd()?.as_fd(), &c, &mut buf)?;
        buf.truncate(n);
        Ok(XattrAnswer::Data(buf))
    }

    pub(crate) fn do_listxattr(&self, ino: INodeNo, size: u32) -> io::Result<XattrAnswer> {
        let inode = self.xattr_inode(ino)?;
        if self.union.is_some() {
            // Without the id attribute: read the whole list to know its size.
            let n = sys::listxattr(inode.fd()?.as_fd(), &mut [])?;
            let mut buf = vec![0u8; n.min(XATTR_MAX_BYTES as usize)];
            let n = sys::listxattr(inode.fd()?.as_fd(), &mut buf)?;
            let list = self.u_filter_xattrs(&buf[..n]);
            return match size {
                0 => Ok(XattrAnswer::Size(list.len() as u32)),
                s if (s as usize) < list.len() => Err(sys::err(libc::ERANGE)),
                _ => Ok(XattrAnswer::Data(list)),
            };
        }
        if size == 0 {
            return Ok(XattrAnswer::Size(sys::listxattr(inode.fd()?.as_fd(), &mut [])? as u32));
        }
        let mut buf = vec![0u8; size.min(XATTR_MAX_BYTES) as usize];
        let n = sys::listxattr(inode.fd()?.as_fd(), &mut buf)?;
        buf.truncate(n);
        Ok(XattrAnswer::Data(buf))
    }

    pub(crate) fn do_setxattr(&self, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
        let inode = self.xattr_inode(ino)?;
        if self.u_xattr_hidden(name) {
            return Err(sys::err(libc::EPERM));
        }
        let _w =
            self.union.as_ref().map(|u| u.write_guard(inode.file_id.get().and_then(|f| f.union_id()).unwrap_or(0)));
        sys::setxattr(inode.fd()?.as_fd(), &sys::cname(name)?, value, flags)
    }

    pub(crate) fn do_removexattr(&self, ino: INodeNo, name: &OsStr) -> io::Result<()> {
        let inode = self.xattr_inode(ino)?;
        if self.u_xattr_hidden(name) {
            return Err(sys::err(libc::EPERM));
        }
        let _w =
            self.union.as_ref().map(|u| u.write_guard(inode.file_id.get().and_then(|f| f.union_id()).unwrap_or(0)));
        sys::removexattr(inode.fd()?.as_fd(), &sys::cname(name)?)
    }
}
