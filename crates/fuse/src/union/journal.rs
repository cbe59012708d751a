//! The journal of moves in progress: one small file per move, `.farcache-union/journal/<id>`
//! on the target branch, written (and synced) before the copy starts and removed once the
//! source is gone. Its text: `farcache-move 1`, then `id`, `from` and `to` (branch ids, hex)
//! and `rel` (the file's path relative to the branch roots, hex-encoded bytes).
//!
//! The copy is made as `.farcache-union/tmp/<id>` on the target and becomes the file only by
//! a rename after it was synced with its id record, so replay at start decides by what
//! exists, never by how far the move got:
//! - the target branch has, at `rel`, a file whose id record is `id` on that branch and that
//!   inode: the switch happened, the copy is whole and the truth (writes may have reached it
//!   since) — the source at `rel` is removed if its record names `id`;
//! - otherwise the switch did not happen: the source is the file (put back at `rel` if it was
//!   set aside — `tmp/<id>.source` on its branch — and the target's rename was lost to a
//!   power cut), the temporary copy goes.
//!
//! Either way each file exists exactly once afterwards, with the contents it had when the
//! daemon stopped. Leftover temporary copies without a record are removed too.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{IdRecord, Union};
use crate::sys;

/// A move in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) id: u64,
    pub(crate) from: u64,
    pub(crate) to: u64,
    pub(crate) rel: PathBuf,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

impl Move {
    fn encode(&self) -> String {
        format!(
            "farcache-move 1\nid {}\nfrom {:016x}\nto {:016x}\nrel {}\n",
            self.id,
            self.from,
            self.to,
            hex(self.rel.as_os_str().as_bytes())
        )
    }

    fn decode(s: &str) -> Option<Move> {
        let mut l = s.lines();
        if l.next()? != "farcache-move 1" {
            return None;
        }
        let mut field = |k: &str| l.next()?.strip_prefix(k)?.strip_prefix(' ').map(str::to_string);
        let id = field("id")?.parse().ok()?;
        let from = u64::from_str_radix(&field("from")?, 16).ok()?;
        let to = u64::from_str_radix(&field("to")?, 16).ok()?;
        let rel: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(unhex(&field("rel")?)?);
        let rel = PathBuf::from(rel);
        Some(Move { id, from, to, rel })
    }
}

fn journal_dir(u: &Union, b: usize) -> io::Result<std::os::fd::OwnedFd> {
    sys::openat(u.branches[b].meta.as_fd(), c"journal", libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

pub(crate) fn tmp_dir(u: &Union, b: usize) -> io::Result<std::os::fd::OwnedFd> {
    sys::openat(u.branches[b].meta.as_fd(), c"tmp", libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

pub(crate) fn tmp_name(id: u64) -> CString {
    CString::new(id.to_string()).expect("no NUL")
}

/// The name a moved file's source is set aside under in its branch's `tmp/` until the
/// target is durable.
pub(crate) fn aside_name(id: u64) -> CString {
    CString::new(format!("{id}.source")).expect("no NUL")
}

/// Record `m` on its target branch `to`, durably.
pub(crate) fn begin(u: &Union, to: usize, m: &Move) -> io::Result<()> {
    let d = journal_dir(u, to)?;
    super::ids::write_synced(d.as_fd(), &m.id.to_string(), &m.encode())
}

/// The move of `id` is over (done or given up).
pub(crate) fn end(u: &Union, to: usize, id: u64) -> io::Result<()> {
    let d = journal_dir(u, to)?;
    match sys::unlinkat(d.as_fd(), &tmp_name(id), 0) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    sys::fsync_fd(d.as_fd(), false)
}

/// The file at `rel` on branch `b`: its `O_PATH` descriptor and stat, if it exists.
fn file_at(
    u: &Union,
    b: usize,
    rel: &Path,
) -> io::Result<Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd, CString)>> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { return Ok(None) };
    let dir = match u.walk(b, parent) {
        Ok(d) => d,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let c = sys::cname(name)?;
    match sys::openat(dir.as_fd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0) {
        Ok(fd) => Ok(Some((dir, fd, c))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn record_is(u: &Union, fd: BorrowedFd<'_>, id: u64, b: usize) -> io::Result<bool> {
    let st = sys::fstat(fd)?;
    Ok(IdRecord::read(fd, &u.xattr).is_some_and(|r| r.id == id && r.branch == u.branches[b].uuid && r.ino == st.st_ino))
}

/// Where a replayed move left its file: its id, branch and path relative to the branch.
pub(crate) type Settled = (u64, usize, PathBuf);

/// Finish every move a crash interrupted (see the module doc); returns where each one left
/// its file (a daemon restarted on a live connection points the file's node there).
pub(crate) fn replay(u: &Union) -> io::Result<Vec<Settled>> {
    let mut n = Vec::new();
    for t in 0..u.branches.len() {
        let jd = journal_dir(u, t)?;
        let names = list(jd.as_fd())?;
        for name in names {
            if name.to_bytes().ends_with(b".tmp") {
                let _ = sys::unlinkat(jd.as_fd(), &name, 0);
                continue;
            }
            let text = {
                let fd = sys::openat(jd.as_fd(), &name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
                let mut s = String::new();
                io::Read::read_to_string(&mut io::Read::take(std::fs::File::from(fd), 64 * 1024), &mut s)?;
                s
            };
            let Some(m) = Move::decode(&text) else {
                return Err(io::Error::other(format!(
                    "{}/.farcache-union/journal/{} is not a move record",
                    u.branches[t].path.display(),
                    name.to_string_lossy()
                )));
            };
            let Some(from) = u.branches.iter().position(|b| b.uuid == m.from) else {
                return Err(io::Error::other(format!(
                    "a move of {} from a branch that is not part of this mount (id {:016x}) is unfinished: mount \
                     with that branch too",
                    m.rel.display(),
                    m.from
                )));
            };
            let switched = match file_at(u, t, &m.rel)? {
                Some((_, fd, _)) => record_is(u, fd.as_fd(), m.id, t)?,
                None => false,
            };
            if switched {
                if let Some((dir, fd, c)) = file_at(u, from, &m.rel)? {
                    if record_is(u, fd.as_fd(), m.id, from)? {
                        sys::unlinkat(dir.as_fd(), &c, 0)?;
                        let dirfd = sys::reopen(dir.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
                        sys::fsync_fd(dirfd.as_fd(), false)?;
                    }
                }
            }
            if !switched {
                // The source set aside while the target's rename was lost (a power cut can
                // keep one file system's change and not the other's): it is the file.
                restore_aside(u, &m, from)?;
            }
            let td = tmp_dir(u, t)?;
            match sys::unlinkat(td.as_fd(), &tmp_name(m.id), 0) {
                Ok(()) => sys::fsync_fd(td.as_fd(), false)?,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            tracing::info!(
                "finished an interrupted move of {} ({}): the copy on {} {}",
                m.rel.display(),
                m.id,
                u.branches[t].path.display(),
                if switched { "is the file; the source was removed" } else { "was discarded; the source stays" }
            );
            end(u, t, m.id)?;
            n.push((m.id, if switched { t } else { from }, m.rel.clone()));
        }
    }
    // Copies and set-aside sources without a record (the record is written first, removed
    // last): nothing refers to them any more. Only after every branch's records, which may
    // need a source set aside on another branch.
    for t in 0..u.branches.len() {
        let td = tmp_dir(u, t)?;
        for name in list(td.as_fd())? {
            let _ = sys::unlinkat(td.as_fd(), &name, 0);
        }
    }
    Ok(n)
}

/// Put the source of move `m` set aside on branch `from` back at its path, if it is there
/// and the path is free.
fn restore_aside(u: &Union, m: &Move, from: usize) -> io::Result<()> {
    let ad = tmp_dir(u, from)?;
    let aside = aside_name(m.id);
    let Ok(fd) = sys::openat(ad.as_fd(), &aside, libc::O_PATH | libc::O_NOFOLLOW, 0) else { return Ok(()) };
    if !record_is(u, fd.as_fd(), m.id, from)? || file_at(u, from, &m.rel)?.is_some() {
        return Ok(());
    }
    let (parent, name) = super::ops::split(&m.rel)?;
    let dir = u.walk(from, &parent)?;
    sys::renameat2(ad.as_fd(), &aside, dir.as_fd(), &name, libc::RENAME_NOREPLACE)?;
    let dirfd = sys::reopen(dir.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
    sys::fsync_fd(dirfd.as_fd(), false)?;
    tracing::warn!("put the source of an interrupted move of {} back", m.rel.display());
    Ok(())
}

/// The names in `dir` (an open directory), "." and ".." left out.
fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    sys::lseek(dir, 0, libc::SEEK_SET)?;
    let mut buf = vec![0u8; 8192];
    let mut out = Vec::new();
    loop {
        let n = sys::getdents(dir, &mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        for e in sys::parse_dirents(&buf[..n]) {
            if e.name != b"." && e.name != b".." {
                out.push(CString::new(e.name).map_err(|_| sys::err(libc::EINVAL))?);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_with_any_path_bytes() {
        let rel: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(b"a dir/with\nnewline/\xff".to_vec());
        let rel = PathBuf::from(rel);
        let m = Move { id: 42, from: 0xdead, to: 0xbeef, rel };
        assert_eq!(Move::decode(&m.encode()), Some(m));
        assert_eq!(Move::decode("farcache-move 2\n"), None);
    }
}
