//! Open file and directory handles: the `fh` numbers the kernel passes back on every read,
//! write, readdir, ... of an open file. Bounded: past `max` open handles, opens fail with
//! ENFILE instead of growing without limit.
//!
//! Handle numbers carry the daemon's *incarnation* in their top bits (`incarnation << 40`):
//! after a takeover or a restart the kernel still uses the numbers the previous daemon gave
//! out, and the new one never hands out one of those. It reopens such a handle on first use
//! ([`Handles::insert_at`], from the request's node id and open flags).

use hashbrown::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use farcache_engine::BackingFile;
use parking_lot::Mutex;

use crate::inode::Inode;

/// An open regular file (or fifo, or device: anything opened through `open`/`create`).
pub(crate) struct FileHandle {
    pub(crate) backing: BackingFile,
    /// A union's branch the file is on ([`NO_BRANCH`] otherwise), for the time the daemon
    /// spends on each branch's I/O (`crate::union::load`); changed by a move.
    pub(crate) branch: std::sync::atomic::AtomicUsize,
}

/// [`FileHandle::branch`] of a file outside a union.
pub(crate) const NO_BRANCH: usize = usize::MAX;

impl FileHandle {
    pub(crate) fn new(backing: BackingFile) -> FileHandle {
        FileHandle::on(backing, NO_BRANCH)
    }
    pub(crate) fn on(backing: BackingFile, branch: usize) -> FileHandle {
        FileHandle { backing, branch: std::sync::atomic::AtomicUsize::new(branch) }
    }
}

/// An open directory: a real descriptor whose offset `readdir` seeks. The mutex serialises
/// seek+getdents pairs (the kernel does not read one directory handle concurrently, but a
/// buggy or hostile caller must not be able to interleave them).
pub(crate) struct DirHandle {
    pub(crate) inode: Arc<Inode>,
    pub(crate) fd: Mutex<OwnedFd>,
    /// A union mount's merged listing, made when the kernel reads from the start.
    pub(crate) merged: Mutex<Option<Arc<Vec<crate::union::ops::Merged>>>>,
}

pub(crate) struct Handles<T> {
    map: Mutex<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
    max: usize,
}

/// Bits of a handle number below the incarnation.
pub(crate) const INCARNATION_SHIFT: u32 = 40;

impl<T> Handles<T> {
    pub(crate) fn new(max: usize, incarnation: u32) -> Handles<T> {
        let base = (u64::from(incarnation) & 0xff_ffff) << INCARNATION_SHIFT;
        Handles { map: Mutex::new(HashMap::new()), next: AtomicU64::new(base + 1), max }
    }

    /// Register `h` under a number the kernel already uses (a handle of an earlier daemon,
    /// reopened); if another thread was first, its handle is kept and returned.
    pub(crate) fn insert_at(&self, fh: u64, h: T) -> std::io::Result<Arc<T>> {
        let mut m = self.map.lock();
        if let Some(e) = m.get(&fh) {
            return Ok(e.clone());
        }
        if m.len() >= self.max {
            return Err(std::io::Error::from_raw_os_error(libc::ENFILE));
        }
        let h = Arc::new(h);
        m.insert(fh, h.clone());
        Ok(h)
    }

    pub(crate) fn insert(&self, h: T) -> std::io::Result<u64> {
        let mut m = self.map.lock();
        if m.len() >= self.max {
            return Err(std::io::Error::from_raw_os_error(libc::ENFILE));
        }
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        m.insert(fh, Arc::new(h));
        Ok(fh)
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Arc<T>> {
        self.map.lock().get(&fh).cloned()
    }

    pub(crate) fn remove(&self, fh: u64) -> Option<Arc<T>> {
        self.map.lock().remove(&fh)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// The handles `f` picks (a walk of every handle: not for the data path).
    pub(crate) fn matching(&self, f: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        self.map.lock().values().filter(|h| f(h)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_carry_the_incarnation_and_old_ones_can_be_taken_again() {
        let h: Handles<u32> = Handles::new(3, 5);
        let a = h.insert(1).unwrap();
        assert_eq!(a >> INCARNATION_SHIFT, 5, "a new handle names its daemon's incarnation");
        // A handle of incarnation 4 the kernel still uses, reopened: kept under its number.
        let old = (4 << INCARNATION_SHIFT) | 9;
        assert_eq!(*h.insert_at(old, 2).unwrap(), 2);
        assert_eq!(*h.insert_at(old, 3).unwrap(), 2, "the first reopening wins");
        assert_eq!(h.len(), 2);
        h.insert(4).unwrap();
        assert_eq!(h.insert_at((4 << INCARNATION_SHIFT) | 10, 5).unwrap_err().raw_os_error(), Some(libc::ENFILE));
    }
}
