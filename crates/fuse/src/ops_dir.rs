//! Directories: opendir, readdir, readdirplus.
//!
//! A directory handle is a real descriptor of the backing directory. Each readdir seeks it to
//! the kernel's offset — the `d_off` cookie of the last entry the kernel took, which the
//! backing file system guarantees to be a valid position even while the directory changes —
//! and reads entries until the reply is full. An entry that does not fit is read again by the
//! next call, so none is lost or doubled. Every call is bounded by the reply size.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::time::UNIX_EPOCH;

use fuser::{FileAttr, FileHandle as Fh, FileType, Generation, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use parking_lot::Mutex;

use crate::fs::Passthrough;
use crate::handles::DirHandle;
use crate::sys::{self, Dirent};

/// Bytes of backing directory entries read per `getdents64`: a little more than one FUSE
/// readdir reply (the kernel asks for one page), and room for the longest name.
const GETDENTS_BYTES: usize = 8 * 1024;
const _: () = assert!(GETDENTS_BYTES >= 2 * (19 + 256));

pub(crate) fn dtype_kind(d: u8) -> Option<FileType> {
    Some(match d {
        libc::DT_DIR => FileType::Directory,
        libc::DT_REG => FileType::RegularFile,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => return None,
    })
}

impl Passthrough {
    pub(crate) fn do_opendir(&self, ino: INodeNo) -> io::Result<u64> {
        let inode = self.inode(ino)?;
        let fd = sys::openat(inode.fd()?.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        self.dirs.insert(DirHandle { inode, fd: Mutex::new(fd), merged: Mutex::new(None) })
    }

    /// Feed the entries from `offset` on to `add` until it reports the reply full (true) or
    /// the directory ends.
    fn each_entry(
        &self,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        mut add: impl FnMut(&DirHandle, &Dirent<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let d = self.dir(ino, fh)?;
        let fd = d.fd.lock();
        let off = i64::try_from(offset).map_err(|_| sys::err(libc::EINVAL))?;
        sys::lseek(fd.as_fd(), off, libc::SEEK_SET)?;
        let mut buf = vec![0u8; GETDENTS_BYTES];
        loop {
            let n = sys::getdents(fd.as_fd(), &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            for e in sys::parse_dirents(&buf[..n]) {
                if add(&d, &e)? {
                    return Ok(());
                }
            }
        }
    }

    pub(crate) fn do_readdir(&self, ino: INodeNo, fh: Fh, offset: u64, reply: &mut ReplyDirectory) -> io::Result<()> {
        if self.union.is_some() {
            return self.u_readdir(ino, fh, offset, reply);
        }
        self.each_entry(ino, fh, offset, |d, e| {
            let kind = match dtype_kind(e.dtype) {
                Some(k) => k,
                // DT_UNKNOWN: some file systems do not fill d_type; ask.
                None => match name_cstr(e.name).and_then(|c| sys::statat(d.inode.fd()?.as_fd(), &c)) {
                    Ok(st) => crate::fs::kind(st.st_mode),
                    Err(_) => return Ok(false), // gone since: skip it
                },
            };
            let ino = if e.name == b"." { d.inode.nodeid } else { self.inodes.dirent_ino(e.ino) };
            Ok(reply.add(INodeNo(ino), e.next_off, kind, OsStr::from_bytes(e.name)))
        })
    }

    pub(crate) fn do_readdirplus(
        &self,
        ino: INodeNo,
        fh: Fh,
        offset: u64,
        reply: &mut ReplyDirectoryPlus,
    ) -> io::Result<()> {
        if self.union.is_some() {
            return self.u_readdirplus(ino, fh, offset, reply);
        }
        self.each_entry(ino, fh, offset, |d, e| {
            let name = OsStr::from_bytes(e.name);
            if e.name == b"." || e.name == b".." {
                // The kernel takes no reference for these; their attributes are not used.
                let ino = if e.name == b"." { d.inode.nodeid } else { self.inodes.dirent_ino(e.ino) };
                let attr = dir_placeholder(ino);
                return Ok(reply.add(INodeNo(ino), e.next_off, name, &self.entry_ttl, &attr, Generation(0)));
            }
            let (inode, attr) = match name_cstr(e.name).and_then(|c| self.entry_of(&d.inode, &c)) {
                Ok(x) => x,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(false), // gone since
                Err(err) => return Err(err),
            };
            let full = reply.add(INodeNo(inode.nodeid), e.next_off, name, &self.entry_ttl, &attr, Generation(0));
            if full {
                // Not sent: the kernel will not count this lookup.
                self.inodes.forget(inode.nodeid, 1);
            }
            Ok(full)
        })
    }
}

fn name_cstr(name: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name).map_err(|_| sys::err(libc::EINVAL))
}

/// Attributes for "." and ".." in a readdirplus reply, which the kernel ignores.
pub(crate) fn dir_placeholder(ino: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::Directory,
        perm: 0o755,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
