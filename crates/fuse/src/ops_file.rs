//! Open files: open, read, write, fallocate. Every byte goes through the data path
//! (`farcache_engine::DataPath`); this file only finds the handle and checks access.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use farcache_engine::Bytes;
use fuser::{FileHandle as Fh, INodeNo};

use crate::fs::Passthrough;
use crate::handles::{FileHandle, NO_BRANCH};
use crate::ops_entry::backing_open_flags;
use crate::sys;

impl Passthrough {
    /// `kill_suidgid`: the caller may not keep set-id bits through a truncation (not root;
    /// see `sys::kill_suidgid`).
    pub(crate) fn do_open(&self, ino: INodeNo, flags: i32, kill_suidgid: bool) -> io::Result<u64> {
        let inode = self.inode(ino)?;
        // A union: no switch of this file between the reopen and the handle's entry (and a
        // truncation counts as a write).
        let _g = self.union.as_ref().map(|u| {
            u.history.record(inode.nodeid);
            let id = inode.file_id.get().and_then(|f| f.union_id()).unwrap_or(0);
            u.write_guard(if flags & libc::O_TRUNC != 0 { id } else { 0 })
        });
        let fd = sys::reopen(inode.fd()?.as_fd(), backing_open_flags(flags))?;
        let branch = self.union.as_ref().map_or(NO_BRANCH, |u| u.branch_of(fd.as_fd()));
        let backing = self.backing(&inode, File::from(fd), flags)?;
        // With atomic O_TRUNC negotiated the kernel leaves truncation on open to us.
        if flags & libc::O_TRUNC != 0 {
            self.truncate(&inode, Some(&backing), 0)?;
            if kill_suidgid {
                sys::kill_suidgid(backing.file().as_fd(), false)?;
            }
        }
        self.files.insert(FileHandle::on(backing, branch))
    }

    pub(crate) fn do_read(&self, ino: INodeNo, fh: Fh, offset: u64, size: u32, flags: i32) -> io::Result<Bytes> {
        let h = self.file(ino, fh, Some(flags))?;
        if !h.backing.readable() {
            return Err(sys::err(libc::EBADF));
        }
        let Some(u) = &self.union else { return self.data.read(&h.backing, offset, size as usize) };
        u.history.record(ino.0);
        let _io = u.foreground_io(h.branch.load(std::sync::atomic::Ordering::Relaxed));
        self.data.read(&h.backing, offset, size as usize)
    }

    /// `kill_suidgid`: the kernel asked for the file's set-id bits to go (the write's
    /// `FUSE_WRITE_KILL_SUIDGID`, under `FUSE_HANDLE_KILLPRIV_V2`).
    pub(crate) fn do_write(
        &self,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        data: &[u8],
        flags: i32,
        kill_suidgid: bool,
    ) -> io::Result<u32> {
        let h = self.file(ino, fh, Some(flags))?;
        if !h.backing.writable() {
            return Err(sys::err(libc::EBADF));
        }
        if (!self.xattrs || self.handle_killpriv) && !self.data.backing_is_complete() {
            // The kernel does not ask about capabilities (xattrs answered ENOSYS, or
            // FUSE_HANDLE_KILLPRIV_V2). A write that reaches the backing file has its file
            // system drop them (as for any writer); one a write-back tier holds would drop
            // them only at destage, so it is done here, at once.
            sys::drop_capabilities(h.backing.file().as_fd());
        }
        if kill_suidgid {
            sys::kill_suidgid(h.backing.file().as_fd(), false)?;
        }
        let n = match &self.union {
            None => self.data.write(&h.backing, offset, data)?,
            Some(u) => {
                let _w = u.write_guard(h.backing.id().union_id().unwrap_or(0));
                let _io = u.foreground_io(h.branch.load(std::sync::atomic::Ordering::Relaxed));
                self.data.write(&h.backing, offset, data)?
            }
        };
        if flags & libc::O_DSYNC != 0 {
            // O_SYNC and O_DSYNC (and RWF_DSYNC: the kernel's write flags carry it) include
            // this bit: the write is durable before it is acknowledged.
            self.data.sync_writes(&h.backing)?;
        }
        Ok(u32::try_from(n).expect("a FUSE write is at most max_write bytes"))
    }

    pub(crate) fn do_fallocate(&self, ino: INodeNo, fh: Fh, offset: u64, length: u64, mode: i32) -> io::Result<()> {
        let h = self.file(ino, fh, None)?;
        if !h.backing.writable() {
            return Err(sys::err(libc::EBADF));
        }
        let _w = self.union.as_ref().map(|u| u.write_guard(h.backing.id().union_id().unwrap_or(0)));
        self.data.fallocate(&h.backing, mode, offset, length)
    }
}
