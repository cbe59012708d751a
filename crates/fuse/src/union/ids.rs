//! Farcache ids: a file's identity of its own, kept with the file.
//!
//! The record, in an extended attribute (`trusted.farcache.id` as root, else
//! `user.farcache.id`), is 32 bytes: `FCID`, a format version (1, u32 LE), then as u64 LE the
//! id, the id of the branch it was written on and the inode number it was written for. A
//! record counts only on that branch and inode: a copy made behind the mount's back (`cp -a`,
//! a restore from a backup, a move between disks by hand) carries the attribute but not the
//! inode, and gets an id of its own at its first lookup, so two files never share one.
//!
//! Ids are never reused: each branch's `.farcache-union/ids` holds a high-water mark, raised
//! by [`CHUNK`] (written to every branch, synced) before any id below it is handed out; a
//! restart continues from the highest mark found. Ids start at [`FIRST_ID`] and stay below
//! 2^62, apart from the synthetic node ids (from 2^63) of the inode table.

use std::ffi::CStr;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use parking_lot::Mutex;

use super::Branch;
use crate::sys;

/// Ids reserved per write of the high-water mark.
pub(crate) const CHUNK: u64 = 4096;
/// The first id (node ids 0 and 1 are FUSE's: none and the root).
pub(crate) const FIRST_ID: u64 = 2;
/// Ids stay below this.
pub(crate) const ID_LIMIT: u64 = 1 << 62;
const RECORD_BYTES: usize = 32;
const MAGIC: &[u8; 4] = b"FCID";
const VERSION: u32 = 1;

/// A file's id record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdRecord {
    pub(crate) id: u64,
    pub(crate) branch: u64,
    pub(crate) ino: u64,
}

impl IdRecord {
    pub(crate) fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.branch.to_le_bytes());
        b[24..32].copy_from_slice(&self.ino.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<IdRecord> {
        if b.len() != RECORD_BYTES || &b[..4] != MAGIC || b[4..8] != VERSION.to_le_bytes() {
            return None;
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        let r = IdRecord { id: u(8..16), branch: u(16..24), ino: u(24..32) };
        (FIRST_ID..ID_LIMIT).contains(&r.id).then_some(r)
    }

    /// The record of the file `fd` refers to (any descriptor, `O_PATH` included).
    pub(crate) fn read(fd: BorrowedFd<'_>, xattr: &CStr) -> Option<IdRecord> {
        let mut buf = [0u8; RECORD_BYTES + 1];
        let n = sys::getxattr(fd, xattr, &mut buf).ok()?;
        IdRecord::decode(&buf[..n])
    }

    /// The record of `dir/name`, without following a symlink (for readdir's `d_ino`).
    pub(crate) fn read_at(dir: BorrowedFd<'_>, name: &CStr, xattr: &CStr) -> Option<IdRecord> {
        let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        p.extend_from_slice(name.to_bytes());
        let p = std::ffi::CString::new(p).ok()?;
        let mut buf = [0u8; RECORD_BYTES + 1];
        // SAFETY: NUL-terminated strings; the kernel writes at most buf.len() bytes.
        let n = unsafe { libc::lgetxattr(p.as_ptr(), xattr.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return None;
        }
        IdRecord::decode(&buf[..n as usize])
    }

    pub(crate) fn write(&self, fd: BorrowedFd<'_>, xattr: &CStr) -> io::Result<()> {
        sys::setxattr(fd, xattr, &self.encode(), 0)
    }
}

/// The branch's id, from its `.farcache-union/branch` (drawn and written on first use).
pub(crate) fn branch_uuid(meta: BorrowedFd<'_>) -> io::Result<u64> {
    match read_small(meta, c"branch")? {
        Some(s) => u64::from_str_radix(s.trim(), 16).map_err(|_| io::Error::other("`branch` is not a hex number")),
        None => {
            let id = super::random_u64() | 1;
            write_synced(meta, "branch", &format!("{id:016x}\n"))?;
            Ok(id)
        }
    }
}

/// Hands out ids, keeping the high-water mark on every branch.
pub(crate) struct IdAlloc {
    /// (next id, the mark: ids below it may be handed out).
    state: Mutex<(u64, u64)>,
}

impl IdAlloc {
    pub(crate) fn open(branches: &[Branch]) -> io::Result<IdAlloc> {
        let mut mark = FIRST_ID;
        for b in branches {
            if let Some(s) = read_small(b.meta.as_fd(), c"ids")? {
                let m: u64 = s.trim().parse().map_err(|_| io::Error::other("`ids` is not a number"))?;
                mark = mark.max(m);
            }
        }
        // Everything below the mark may have been handed out before: start above it.
        Ok(IdAlloc { state: Mutex::new((mark, mark)) })
    }

    pub(crate) fn next(&self, branches: &[Branch]) -> io::Result<u64> {
        let mut s = self.state.lock();
        if s.0 >= s.1 {
            let mark = s.1 + CHUNK;
            if mark >= ID_LIMIT {
                return Err(io::Error::other("farcache ids exhausted"));
            }
            for b in branches {
                write_synced(b.meta.as_fd(), "ids", &format!("{mark}\n"))?;
            }
            s.1 = mark;
        }
        let id = s.0;
        s.0 += 1;
        Ok(id)
    }
}

/// A small file of `dir`, or `None` if there is none.
fn read_small(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<String>> {
    match sys::openat(dir, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
        Ok(fd) => {
            let mut s = String::new();
            io::Read::read_to_string(&mut std::fs::File::from(fd).take_limited(), &mut s)?;
            Ok(Some(s))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

trait TakeLimited: Sized {
    fn take_limited(self) -> io::Take<Self>;
}
impl TakeLimited for std::fs::File {
    fn take_limited(self) -> io::Take<Self> {
        io::Read::take(self, 4096)
    }
}

/// Replace `dir/name` with `text`, durably (a temporary file synced, renamed, the directory
/// synced).
pub(crate) fn write_synced(dir: BorrowedFd<'_>, name: &str, text: &str) -> io::Result<()> {
    let tmp = std::ffi::CString::new(format!("{name}.tmp")).expect("no NUL");
    let fin = std::ffi::CString::new(name).expect("no NUL");
    let dirfd = sys::reopen(dir, libc::O_RDONLY | libc::O_DIRECTORY)?;
    let fd =
        sys::openat(dirfd.as_fd(), &tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW, 0o600)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    sys::renameat2(dirfd.as_fd(), &tmp, dirfd.as_fd(), &fin, 0)?;
    sys::fsync_fd(dirfd.as_fd(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_no_record() {
        let r = IdRecord { id: 77, branch: 0xabc, ino: 12 };
        assert_eq!(IdRecord::decode(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[0] = b'X';
        assert_eq!(IdRecord::decode(&bad), None);
        assert_eq!(IdRecord::decode(&r.encode()[..31]), None);
        let zero = IdRecord { id: 0, ..r };
        assert_eq!(IdRecord::decode(&zero.encode()), None, "id 0 is never given");
    }
}
