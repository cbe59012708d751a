//! Open file and directory handles: the `fh` numbers the kernel passes back on every read,
//! write, readdir, ... of an open file. Bounded: past `max` open handles, opens fail with
//! ENFILE instead of growing without limit.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use farcache_engine::BackingFile;
use parking_lot::Mutex;

use crate::inode::Inode;

/// An open regular file (or fifo, or device: anything opened through `open`/`create`).
pub(crate) struct FileHandle {
    pub(crate) backing: BackingFile,
}

/// An open directory: a real descriptor whose offset `readdir` seeks. The mutex serialises
/// seek+getdents pairs (the kernel does not read one directory handle concurrently, but a
/// buggy or hostile caller must not be able to interleave them).
pub(crate) struct DirHandle {
    pub(crate) inode: Arc<Inode>,
    pub(crate) fd: Mutex<OwnedFd>,
}

pub(crate) struct Handles<T> {
    map: Mutex<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
    max: usize,
}

impl<T> Handles<T> {
    pub(crate) fn new(max: usize) -> Handles<T> {
        Handles { map: Mutex::new(HashMap::new()), next: AtomicU64::new(1), max }
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
}
