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
//! Cost: one descriptor per known inode, while the process may hold that many. Where it may
//! not (a root without CAP_SYS_RESOURCE, a container: the kernel keeps far more inodes known
//! than such a limit allows), the table is *frugal* (`let_go_of_idle`): it keeps each inode's
//! file handle (`name_to_handle_at`), holds descriptors for at most a budget of them, lets go
//! of the least recently used idle ones past it, and reopens an inode by its handle
//! (`open_by_handle_at`, which needs CAP_DAC_READ_SEARCH and refuses a freed or reused inode
//! with ESTALE) when it is used again. It never lets go of the root, of an inode on another
//! file system than the root's, or of one with no name left (only a descriptor keeps such an
//! inode). Once an inode's descriptor is let go of, its number could be reused by a new file:
//! a lookup that finds the number known compares handles, and a different one is a new inode.
//! A mount of several branches never lets go (a union's inodes move between branches).

use hashbrown::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use farcache_engine::descriptors::DescriptorBudget;
use farcache_engine::FileId;
use parking_lot::{Mutex, RwLock};

use crate::sys;

pub(crate) const ROOT_ID: u64 = 1;
const SYNTHETIC_BASE: u64 = 1 << 63;

/// An inode's backing descriptor, for the time of one operation.
pub(crate) struct InodeFd(Arc<OwnedFd>);

impl AsFd for InodeFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A file handle: `(handle_type, bytes)`.
type Handle = (i32, Box<[u8]>);

/// What a frugal table shares with its inodes.
struct Frugal {
    /// The root opened for reading: `open_by_handle_at` refuses `O_PATH` ones.
    mount_fd: OwnedFd,
    /// The root's device: only its inodes have handles the table can open.
    dev: u64,
    /// The descriptors held (of inodes that have a handle) against the budget, and the
    /// clock of last uses.
    descriptors: DescriptorBudget,
    /// Descriptors reopened by handle, and let go of, since start.
    reopened: AtomicU64,
    released: AtomicU64,
}

/// One backing inode known to the kernel.
pub(crate) struct Inode {
    pub(crate) nodeid: u64,
    /// `O_PATH | O_NOFOLLOW` descriptor of the backing inode while held.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Its file handle, where the table may let go of the descriptor.
    handle: Option<Handle>,
    frugal: Option<Arc<Frugal>>,
    /// The tick of its last use.
    used: AtomicU64,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// `st_mode & S_IFMT`: a backing inode never changes type.
    pub(crate) fmt: u32,
    /// The data identity, set at the first open of a regular file (the generation ioctl
    /// needs a real open file).
    pub(crate) file_id: OnceLock<FileId>,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode").field("nodeid", &self.nodeid).field("dev", &self.dev).field("ino", &self.ino).finish()
    }
}

impl Inode {
    fn new(nodeid: u64, fd: OwnedFd, st: &libc::stat, frugal: Option<&Arc<Frugal>>) -> Inode {
        // A handle only for an inode on the root's file system (handles are decoded there).
        let handle = frugal
            .filter(|f| f.dev == st.st_dev)
            .and_then(|_| sys::handle_of(fd.as_fd()).ok())
            .map(|(t, b)| (t, b.into_boxed_slice()));
        let frugal = frugal.filter(|_| handle.is_some()).cloned();
        if let Some(f) = &frugal {
            f.descriptors.count(true);
        }
        Inode {
            nodeid,
            fd: Mutex::new(Some(Arc::new(fd))),
            handle,
            used: AtomicU64::new(frugal.as_ref().map_or(0, |f| f.descriptors.now())),
            frugal,
            dev: st.st_dev,
            ino: st.st_ino,
            fmt: st.st_mode & libc::S_IFMT,
            file_id: OnceLock::new(),
        }
    }

    /// The backing inode's `O_PATH` descriptor, reopened by its handle if the table let go of
    /// it; ESTALE if the inode is gone.
    pub(crate) fn fd(&self) -> std::io::Result<InodeFd> {
        let mut g = self.fd.lock();
        if let Some(fd) = &*g {
            if let Some(f) = &self.frugal {
                self.used.store(f.descriptors.now(), Ordering::Relaxed);
            }
            return Ok(InodeFd(fd.clone()));
        }
        let (Some(f), Some((t, h))) = (&self.frugal, &self.handle) else {
            return Err(sys::err(libc::ESTALE));
        };
        let fd = sys::open_handle(f.mount_fd.as_fd(), *t, h, libc::O_PATH | libc::O_NOFOLLOW)?;
        // A handle of this inode opens this inode or nothing; checked anyway (never serve
        // another file's data).
        let st = sys::fstat(fd.as_fd())?;
        if (st.st_dev, st.st_ino) != (self.dev, self.ino) {
            tracing::warn!("node {}'s file handle opened another inode; stale", self.nodeid);
            return Err(sys::err(libc::ESTALE));
        }
        let fd = Arc::new(fd);
        *g = Some(fd.clone());
        f.descriptors.count(true);
        f.reopened.fetch_add(1, Ordering::Relaxed);
        self.used.store(f.descriptors.now(), Ordering::Relaxed);
        Ok(InodeFd(fd))
    }

    /// The descriptor if the table holds it now (never reopened).
    pub(crate) fn held_fd(&self) -> Option<InodeFd> {
        self.fd.lock().clone().map(InodeFd)
    }

    /// Whether the backing inode has no name left: no links, or (the table let go of its
    /// descriptor) its handle opens nothing — the inode was freed.
    pub(crate) fn is_nameless(&self) -> bool {
        match self.fd() {
            Ok(fd) => sys::fstat(fd.as_fd()).is_ok_and(|st| st.st_nlink == 0),
            Err(e) => e.raw_os_error() == Some(libc::ESTALE),
        }
    }

    /// The inode's file handle, if the table keeps one.
    pub(crate) fn handle(&self) -> Option<(i32, &[u8])> {
        self.handle.as_ref().map(|(t, h)| (*t, &h[..]))
    }

    /// Let go of the descriptor if nothing uses it and the inode keeps a name (only a
    /// descriptor keeps a nameless one); true if it did.
    fn release(&self) -> bool {
        let Some(f) = &self.frugal else { return false };
        let mut g = self.fd.lock();
        let Some(fd) = &*g else { return false };
        if Arc::strong_count(fd) > 1 || !sys::fstat(fd.as_fd()).is_ok_and(|st| st.st_nlink > 0) {
            return false;
        }
        *g = None;
        f.descriptors.count(false);
        f.released.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn is_held(&self) -> bool {
        self.fd.lock().is_some()
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

impl Drop for Inode {
    fn drop(&mut self) {
        if let (Some(f), Some(_)) = (&self.frugal, &*self.fd.get_mut()) {
            f.descriptors.count(false);
        }
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
    fn insert(
        &mut self,
        key: (u64, u64),
        nodeid: u64,
        fd: OwnedFd,
        st: &libc::stat,
        nlookup: u64,
        frugal: Option<&Arc<Frugal>>,
    ) -> Arc<Inode> {
        let inode = Arc::new(Inode::new(nodeid, fd, st, frugal));
        self.by_key.insert(key, nodeid);
        self.by_node.insert(nodeid, Entry { inode: inode.clone(), nlookup });
        inode
    }

    /// The node known under `key`, if it is still that inode: one whose descriptor the
    /// table let go of may have been freed and its number reused by the inode `fd` is (a
    /// different handle), and then the key is the new inode's.
    fn known(&mut self, key: (u64, u64), fd: BorrowedFd<'_>) -> Option<u64> {
        let n = *self.by_key.get(&key)?;
        let e = self.by_node.get(&n).expect("by_key and by_node agree");
        let Some((t, h)) = e.inode.handle() else { return Some(n) };
        if e.inode.is_held() {
            return Some(n);
        }
        match sys::handle_of(fd) {
            Ok((t2, h2)) if t2 != t || h2 != h => {
                tracing::debug!("inode {key:?} was reused: node {n} is stale");
                self.by_key.remove(&key);
                None
            }
            _ => Some(n),
        }
    }
}

/// What a frugal table has done: descriptors held, its budget, reopened and let go of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DescriptorStats {
    pub(crate) held: u64,
    pub(crate) budget: u64,
    pub(crate) reopened: u64,
    pub(crate) released: u64,
}

pub(crate) struct InodeTable {
    maps: RwLock<Maps>,
    root_dev: u64,
    root_ino: u64,
    max_inodes: usize,
    frugal: OnceLock<Arc<Frugal>>,
}

impl InodeTable {
    /// A table holding the root, from its `O_PATH` descriptor and stat.
    pub(crate) fn new(root_fd: OwnedFd, st: &libc::stat, max_inodes: usize) -> InodeTable {
        let root = Arc::new(Inode::new(ROOT_ID, root_fd, st, None));
        let mut maps = Maps { next_synthetic: SYNTHETIC_BASE, ..Maps::default() };
        maps.by_key.insert((st.st_dev, st.st_ino), ROOT_ID);
        maps.by_node.insert(ROOT_ID, Entry { inode: root, nlookup: 1 });
        InodeTable {
            maps: RwLock::new(maps),
            root_dev: st.st_dev,
            root_ino: st.st_ino,
            max_inodes,
            frugal: OnceLock::new(),
        }
    }

    /// Hold descriptors for at most `budget` inodes entered from now on, reopening the others
    /// by file handle. Refused (with why) where handles do not work: no CAP_DAC_READ_SEARCH,
    /// or a file system that gives none.
    pub(crate) fn let_go_of_idle(&self, budget: usize) -> std::io::Result<()> {
        let root = self.get(ROOT_ID).expect("the root is always there");
        let root_fd = root.fd()?;
        let mount_fd = sys::openat(root_fd.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let (t, h) = sys::handle_of(root_fd.as_fd())?;
        let again = sys::open_handle(mount_fd.as_fd(), t, &h, libc::O_PATH)?;
        let st = sys::fstat(again.as_fd())?;
        if (st.st_dev, st.st_ino) != (self.root_dev, self.root_ino) {
            return Err(std::io::Error::other("the root's file handle opens another inode"));
        }
        let f = Frugal {
            mount_fd,
            dev: self.root_dev,
            descriptors: DescriptorBudget::new(budget),
            reopened: AtomicU64::new(0),
            released: AtomicU64::new(0),
        };
        self.frugal.set(Arc::new(f)).map_err(|_| std::io::Error::other("already frugal"))
    }

    /// Descriptors held and let go of, if the table is frugal.
    pub(crate) fn descriptor_stats(&self) -> Option<DescriptorStats> {
        self.frugal.get().map(|f| DescriptorStats {
            held: f.descriptors.held() as u64,
            budget: f.descriptors.budget() as u64,
            reopened: f.reopened.load(Ordering::Relaxed),
            released: f.released.load(Ordering::Relaxed),
        })
    }

    /// Past the budget, let go of the least recently used idle descriptors
    /// (`DescriptorBudget::let_go`).
    fn sweep(&self) {
        let Some(f) = self.frugal.get() else { return };
        let idle = || {
            let m = self.maps.read();
            let frugal = m.by_node.values().filter(|e| e.inode.frugal.is_some());
            frugal.map(|e| (e.inode.used.load(Ordering::Relaxed), e.inode.clone())).collect()
        };
        f.descriptors.let_go(idle, |inode: &Arc<Inode>| {
            inode.release();
        });
    }

    pub(crate) fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        self.sweep();
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
        self.sweep();
        let key = (st.st_dev, st.st_ino);
        let mut m = self.maps.write();
        if let Some(n) = m.known(key, fd.as_fd()) {
            let e = m.by_node.get_mut(&n).expect("by_key and by_node agree");
            e.nlookup += 1;
            return Ok(e.inode.clone());
        }
        if m.by_node.len() >= self.max_inodes {
            return Err(std::io::Error::from_raw_os_error(libc::ENFILE));
        }
        // A direct node id still known for a freed inode whose number this one reuses: a
        // synthetic one instead.
        let nodeid = match self.direct_nodeid(st.st_dev, st.st_ino).filter(|n| !m.by_node.contains_key(n)) {
            Some(n) => n,
            None => {
                let n = m.next_synthetic;
                m.next_synthetic += 1;
                n
            }
        };
        debug_assert!(!m.by_node.contains_key(&nodeid), "node id {nodeid} in use");
        Ok(m.insert(key, nodeid, fd, st, 1, self.frugal.get()))
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
        self.sweep();
        let key = (st.st_dev, st.st_ino);
        let mut m = self.maps.write();
        if let Some(n) = m.known(key, fd.as_fd()) {
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
        Ok((m.insert(key, nodeid, fd, st, 1, self.frugal.get()), true))
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
            let key = (e.inode.dev, e.inode.ino);
            if m.by_key.get(&key) == Some(&nodeid) {
                m.by_key.remove(&key);
            }
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
        Ok(m.insert(key, nodeid, fd, st, nlookup.max(1), self.frugal.get()))
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

    /// A frugal table (root here: file handles need CAP_DAC_READ_SEARCH) holds at most its
    /// budget of descriptors whatever the number of inodes, reopens each by handle to the
    /// same inode, never lets go of a nameless one, and tells a reused inode number from
    /// the inode it was.
    #[test]
    fn a_frugal_table_holds_its_budget_and_reopens_the_same_inodes() {
        if !sys::is_root() {
            eprintln!("skipped: file handles need root (CAP_DAC_READ_SEARCH)");
            return;
        }
        let d = std::env::temp_dir().join(format!("farcache-inode-frugal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (rfd, rst) = open_path(&d);
        let t = InodeTable::new(rfd, &rst, 1000);
        t.let_go_of_idle(8).expect("file handles work here, as root on ext4");
        let mut inodes = Vec::new();
        for i in 0..100 {
            let p = d.join(format!("f{i}"));
            std::fs::write(&p, format!("file {i}")).unwrap();
            let (fd, st) = open_path(&p);
            let inode = t.lookup(fd, &st).unwrap();
            assert!(t.descriptor_stats().unwrap().held <= 9, "{:?} after {i} lookups", t.descriptor_stats());
            inodes.push((inode, st.st_ino));
        }
        let before = t.descriptor_stats().unwrap();
        assert!(before.released >= 90, "{before:?}");
        // Every inode reopens (or still holds) its own file.
        for (i, (inode, ino)) in inodes.iter().enumerate() {
            let _ = t.get(inode.nodeid).unwrap();
            let fd = inode.fd().unwrap();
            assert_eq!(sys::fstat(fd.as_fd()).unwrap().st_ino, *ino);
            let data =
                std::fs::read_to_string(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())))
                    .unwrap();
            assert_eq!(data, format!("file {i}"));
        }
        assert!(t.descriptor_stats().unwrap().reopened >= 90);
        // A nameless inode is never let go of (only its descriptor keeps it).
        let (gone, _) = &inodes[99];
        std::fs::remove_file(d.join("f99")).unwrap();
        let held = gone.fd().unwrap();
        drop(held);
        for (inode, _) in &inodes[..50] {
            let _ = t.get(inode.nodeid);
            let _ = inode.fd().unwrap();
        }
        assert!(gone.is_held(), "the nameless inode's descriptor was let go of");
        // A number known for an inode whose descriptor was let go of, met again with another
        // inode (its number reused): a new node, never the old one.
        let (old, old_ino) = &inodes[0];
        assert!(old.release() || !old.is_held());
        let (other, mut other_st) = open_path(&d.join("f1"));
        other_st.st_ino = *old_ino;
        let new = t.lookup(other, &other_st).unwrap();
        assert_ne!(new.nodeid, old.nodeid, "a reused number was taken for the inode it was");
        assert!(InodeTable::is_synthetic(new.nodeid));
        // The same inode met again keeps its node.
        let (again, st) = open_path(&d.join("f2"));
        let (n2, _) = &inodes[2];
        assert!(n2.release() || !n2.is_held());
        assert_eq!(t.lookup(again, &st).unwrap().nodeid, n2.nodeid);
        // The old node, forgotten, leaves the new one's key alone.
        t.forget(old.nodeid, 1);
        assert_eq!(t.find(other_st.st_dev, other_st.st_ino).unwrap().nodeid, new.nodeid);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
