//! The inode table: FUSE node ids ↔ backing inodes.
//!
//! Each inode the kernel knows (from a lookup, create, mkdir, ... until it forgets it) holds an
//! `O_PATH` descriptor of its backing inode, as libfuse's passthrough_hp does. Every
//! operation then starts from that descriptor, never from a path, so:
//! - a rename anywhere (of the file, or of any directory above it) needs no bookkeeping: the
//!   descriptor still names the same inode;
//! - hard links are one inode: the table is keyed by the backing `(st_dev, st_ino)`, so every
//!   name of a file maps to one node id, and the kernel sees them as one inode;
//! - an unlinked file still open, or still known to the kernel, stays reachable;
//! - a backing inode number cannot be reused while we hold it: our descriptor keeps the inode
//!   alive, so `(dev, ino)` in the table always means the inode we opened.
//!
//! Node ids: the root is 1. Any other inode on the root's device gets its backing inode number
//! as node id (so `st_ino` and `d_ino` through the mount equal the backing ones); inodes on
//! other devices under the backing directory, and a backing inode numbered 1, get synthetic
//! ids from 2^63 up. The kernel's lookup counts decide when an entry goes: `forget` brings
//! the count to zero and closes the descriptor.
//!
//! Cost: one descriptor per known inode. The mount raises RLIMIT_NOFILE at start; the kernel
//! forgets inodes under memory pressure.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use farcache_engine::FileId;
use parking_lot::RwLock;

pub(crate) const ROOT_ID: u64 = 1;
const SYNTHETIC_BASE: u64 = 1 << 63;

/// One backing inode known to the kernel.
#[derive(Debug)]
pub(crate) struct Inode {
    pub(crate) nodeid: u64,
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing inode.
    fd: OwnedFd,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// `st_mode & S_IFMT`: a backing inode never changes type.
    pub(crate) fmt: u32,
    /// The data identity, set at the first open of a regular file (the generation ioctl
    /// needs a real open file).
    pub(crate) file_id: OnceLock<FileId>,
}

impl Inode {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
    pub(crate) fn is_dir(&self) -> bool {
        self.fmt == libc::S_IFDIR
    }
    pub(crate) fn is_symlink(&self) -> bool {
        self.fmt == libc::S_IFLNK
    }
    pub(crate) fn is_reg(&self) -> bool {
        self.fmt == libc::S_IFREG
    }
}

struct Entry {
    inode: Arc<Inode>,
    /// The kernel's lookup count. The root is pinned and never removed.
    nlookup: u64,
}

#[derive(Default)]
struct Maps {
    by_node: HashMap<u64, Entry>,
    by_key: HashMap<(u64, u64), u64>,
    next_synthetic: u64,
}

impl Maps {
    /// Enter a new inode under `nodeid` with `nlookup` lookups (the caller checked that
    /// neither its node id nor its (dev, ino) is known).
    fn insert(&mut self, key: (u64, u64), nodeid: u64, fd: OwnedFd, st: &libc::stat, nlookup: u64) -> Arc<Inode> {
        let inode = Arc::new(Inode {
            nodeid,
            fd,
            dev: st.st_dev,
            ino: st.st_ino,
            fmt: st.st_mode & libc::S_IFMT,
            file_id: OnceLock::new(),
        });
        self.by_key.insert(key, nodeid);
        self.by_node.insert(nodeid, Entry { inode: inode.clone(), nlookup });
        inode
    }
}

pub(crate) struct InodeTable {
    maps: RwLock<Maps>,
    root_dev: u64,
    root_ino: u64,
    max_inodes: usize,
}

impl InodeTable {
    /// A table holding the root, from its `O_PATH` descriptor and stat.
    pub(crate) fn new(root_fd: OwnedFd, st: &libc::stat, max_inodes: usize) -> InodeTable {
        let root = Arc::new(Inode {
            nodeid: ROOT_ID,
            fd: root_fd,
            dev: st.st_dev,
            ino: st.st_ino,
            fmt: st.st_mode & libc::S_IFMT,
            file_id: OnceLock::new(),
        });
        let mut maps = Maps { next_synthetic: SYNTHETIC_BASE, ..Maps::default() };
        maps.by_key.insert((st.st_dev, st.st_ino), ROOT_ID);
        maps.by_node.insert(ROOT_ID, Entry { inode: root, nlookup: 1 });
        InodeTable { maps: RwLock::new(maps), root_dev: st.st_dev, root_ino: st.st_ino, max_inodes }
    }

    pub(crate) fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.maps.read().by_node.get(&nodeid).map(|e| e.inode.clone())
    }

    /// The inode known for backing `(dev, ino)`, if any.
    pub(crate) fn find(&self, dev: u64, ino: u64) -> Option<Arc<Inode>> {
        let m = self.maps.read();
        m.by_key.get(&(dev, ino)).and_then(|n| m.by_node.get(n)).map(|e| e.inode.clone())
    }

    /// Count one lookup of the inode `fd` (an `O_PATH` descriptor with stat `st`) refers to:
    /// the known entry if there is one (and `fd` is closed), else a new entry. Fails with
    /// ENFILE when the table is full.
    pub(crate) fn lookup(&self, fd: OwnedFd, st: &libc::stat) -> std::io::Result<Arc<Inode>> {
        let key = (st.st_dev, st.st_ino);
        let mut m = self.maps.write();
        if let Some(&n) = m.by_key.get(&key) {
            let e = m.by_node.get_mut(&n).expect("by_key and by_node agree");
            e.nlookup += 1;
            return Ok(e.inode.clone());
        }
        if m.by_node.len() >= self.max_inodes {
            return Err(std::io::Error::from_raw_os_error(libc::ENFILE));
        }
        let nodeid = match self.direct_nodeid(st.st_dev, st.st_ino) {
            Some(n) => n,
            None => {
                let n = m.next_synthetic;
                m.next_synthetic += 1;
                n
            }
        };
        debug_assert!(!m.by_node.contains_key(&nodeid), "node id {nodeid} in use");
        Ok(m.insert(key, nodeid, fd, st, 1))
    }

    /// [`Self::lookup`] with the node id chosen by the caller (a union file's farcache id,
    /// whose key `(st.st_dev, st.st_ino)` the caller made from it), or a synthetic one
    /// (`None`). With whether the entry is new (the kernel did not know the node).
    pub(crate) fn lookup_as(
        &self,
        fd: OwnedFd,
        st: &libc::stat,
        nodeid: Option<u64>,
    ) -> std::io::Result<(Arc<Inode>, bool)> {
        let key = (st.st_dev, st.st_ino);
        let mut m = self.maps.write();
        if let Some(&n) = m.by_key.get(&key) {
            let e = m.by_node.get_mut(&n).expect("by_key and by_node agree");
            e.nlookup += 1;
            return Ok((e.inode.clone(), false));
        }
        if m.by_node.len() >= self.max_inodes {
            return Err(std::io::Error::from_raw_os_error(libc::ENFILE));
        }
        let nodeid = match nodeid {
            Some(n) if !m.by_node.contains_key(&n) => n,
            Some(n) => {
                tracing::warn!("node id {n} is in use by another inode");
                return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
            }
            None => {
                let n = m.next_synthetic;
                m.next_synthetic += 1;
                n
            }
        };
        Ok((m.insert(key, nodeid, fd, st, 1), true))
    }

    /// The kernel dropped `n` lookups of `nodeid`; true when that was the last.
    pub(crate) fn forget(&self, nodeid: u64, n: u64) -> bool {
        if nodeid == ROOT_ID {
            return false;
        }
        let mut m = self.maps.write();
        let Some(e) = m.by_node.get_mut(&nodeid) else {
            tracing::debug!("forget of unknown node {nodeid}");
            return false;
        };
        e.nlookup = e.nlookup.saturating_sub(n);
        if e.nlookup == 0 {
            let e = m.by_node.remove(&nodeid).expect("present");
            m.by_key.remove(&(e.inode.dev, e.inode.ino));
            return true;
        }
        false
    }

    /// The node id a directory entry with backing inode number `ino` (on the root's device)
    /// has or would get — for `d_ino` in readdir, without a lookup.
    pub(crate) fn dirent_ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino {
            return ROOT_ID;
        }
        match self.direct_nodeid(self.root_dev, ino) {
            Some(n) => n,
            None => self.maps.read().by_key.get(&(self.root_dev, ino)).copied().unwrap_or(ino),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.maps.read().by_node.len()
    }

    /// Add an inode resolved without a lookup (after a takeover, for a node id the kernel
    /// knows from the previous daemon) under `nodeid`, with `nlookup` lookups; the known
    /// entry if another thread was first. `fd` must be an `O_PATH` descriptor with stat `st`.
    pub(crate) fn insert_resolved(
        &self,
        nodeid: u64,
        fd: OwnedFd,
        st: &libc::stat,
        nlookup: u64,
    ) -> std::io::Result<Arc<Inode>> {
        let key = (st.st_dev, st.st_ino);
        let mut m = self.maps.write();
        if let Some(e) = m.by_node.get(&nodeid) {
            return Ok(e.inode.clone());
        }
        if m.by_key.contains_key(&key) || m.by_node.len() >= self.max_inodes {
            // Known under another node id (cannot happen for direct ids), or full.
            return Err(std::io::Error::from_raw_os_error(libc::ESTALE));
        }
        if nodeid >= m.next_synthetic {
            m.next_synthetic = nodeid + 1;
        }
        Ok(m.insert(key, nodeid, fd, st, nlookup.max(1)))
    }

    /// Every entry but the root: `(inode, lookups)`, and the next synthetic node id.
    pub(crate) fn snapshot(&self) -> (Vec<(Arc<Inode>, u64)>, u64) {
        let m = self.maps.read();
        let nodes =
            m.by_node.values().filter(|e| e.inode.nodeid != ROOT_ID).map(|e| (e.inode.clone(), e.nlookup)).collect();
        (nodes, m.next_synthetic)
    }

    /// Synthetic node ids from `next` on (the previous daemon gave out those below).
    pub(crate) fn reserve_synthetic(&self, next: u64) {
        let mut m = self.maps.write();
        m.next_synthetic = m.next_synthetic.max(next);
    }

    /// Where a daemon of incarnation `incarnation` starts giving out synthetic node ids: each
    /// incarnation has 2^38 of its own, so a daemon restarted after a crash never gives out
    /// a number an earlier one gave to an inode the kernel may still know (one whose
    /// descriptor nobody kept for the new daemon).
    pub(crate) fn synthetic_start(incarnation: u32) -> u64 {
        SYNTHETIC_BASE + (u64::from(incarnation & 0xff_ffff) << 38)
    }

    /// Whether `nodeid` is a synthetic node id (given out by this table, not derived).
    pub(crate) fn is_synthetic(nodeid: u64) -> bool {
        nodeid >= SYNTHETIC_BASE
    }

    /// The node id a backing inode on the root's device has, if it is a direct one.
    pub(crate) fn is_direct(&self, nodeid: u64) -> bool {
        nodeid != ROOT_ID && nodeid < SYNTHETIC_BASE && nodeid != 0 && nodeid != self.root_ino
    }

    pub(crate) fn root_dev(&self) -> u64 {
        self.root_dev
    }

    fn direct_nodeid(&self, dev: u64, ino: u64) -> Option<u64> {
        if (dev, ino) == (self.root_dev, self.root_ino) {
            return Some(ROOT_ID);
        }
        (dev == self.root_dev && ino != ROOT_ID && ino < SYNTHETIC_BASE && ino != 0).then_some(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_path(p: &std::path::Path) -> (OwnedFd, libc::stat) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let fd = crate::sys::openat(
            // SAFETY: AT_FDCWD is a valid "descriptor" for *at calls.
            unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
            &c,
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
        .unwrap();
        let st = crate::sys::fstat(fd.as_fd()).unwrap();
        (fd, st)
    }

    #[test]
    fn hard_links_share_a_node_and_forget_counts_lookups() {
        let d = std::env::temp_dir().join(format!("farcache-inode-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a"), b"x").unwrap();
        std::fs::hard_link(d.join("a"), d.join("b")).unwrap();
        let (rfd, rst) = open_path(&d);
        let t = InodeTable::new(rfd, &rst, 100);
        let (fa, sa) = open_path(&d.join("a"));
        let (fb, sb) = open_path(&d.join("b"));
        let a = t.lookup(fa, &sa).unwrap();
        let b = t.lookup(fb, &sb).unwrap();
        assert_eq!(a.nodeid, b.nodeid);
        assert_eq!(a.nodeid, sa.st_ino, "same-device inodes keep their inode number");
        assert_eq!(t.len(), 2);
        t.forget(a.nodeid, 1);
        assert!(t.get(a.nodeid).is_some(), "one lookup left");
        t.forget(a.nodeid, 1);
        assert!(t.get(a.nodeid).is_none());
        assert!(t.find(sa.st_dev, sa.st_ino).is_none());
        t.forget(ROOT_ID, 100);
        assert!(t.get(ROOT_ID).is_some(), "the root is pinned");
        assert_eq!(t.dirent_ino(rst.st_ino), ROOT_ID);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn each_incarnation_has_synthetic_ids_of_its_own() {
        assert_eq!(InodeTable::synthetic_start(0), SYNTHETIC_BASE);
        let last = InodeTable::synthetic_start(0xff_ffff);
        assert!(last > InodeTable::synthetic_start(0xff_fffe) && last.checked_add(1 << 38).is_some());
        assert!(InodeTable::is_synthetic(InodeTable::synthetic_start(7)));
    }

    #[test]
    fn a_full_table_refuses_new_inodes_but_counts_known_ones() {
        let d = std::env::temp_dir().join(format!("farcache-inode-full-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a"), b"x").unwrap();
        std::fs::write(d.join("b"), b"x").unwrap();
        let (rfd, rst) = open_path(&d);
        let t = InodeTable::new(rfd, &rst, 2);
        let (fa, sa) = open_path(&d.join("a"));
        t.lookup(fa, &sa).unwrap();
        let (fb, sb) = open_path(&d.join("b"));
        assert_eq!(t.lookup(fb, &sb).unwrap_err().raw_os_error(), Some(libc::ENFILE));
        let (fa2, sa2) = open_path(&d.join("a"));
        assert!(t.lookup(fa2, &sa2).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
