//! Serving a FUSE connection another daemon started: the state that travels with the
//! `/dev/fuse` descriptors, and how the new daemon answers for what the kernel still holds.
//!
//! A live FUSE connection never sends INIT again, so the new daemon starts its session on
//! the handed-over descriptor without a handshake (`fuser::Session::from_initialized_fd`,
//! our patch in vendor/fuser) and checks that its settings are those the INIT reply
//! promised ([`INIT_KEYS`]). The kernel still names inodes by the node ids and files by the
//! handle numbers the earlier daemon gave out; neither needs that daemon's memory:
//!
//! - **node ids** are backing inode numbers on the root's device (`inode.rs`). A node id the
//!   new daemon does not know is opened by file handle (`open_by_handle_at` on the root's
//!   file system, needs `CAP_DAC_READ_SEARCH`): from the handle the earlier daemon recorded
//!   in [`HandoverState::nodes`] (an upgrade), else from a handle built from the inode
//!   number alone where the file system's handle is `FILEID_INO32_GEN` — ext2/3/4, whose
//!   generation 0 means "do not check" — (a crash). Whatever is opened is checked to be
//!   that inode number on the root's device before it is used. Where a handle cannot stand
//!   in for an inode on an upgrade — any synthetic node id (other devices under the backing
//!   directory, a union's directories: a lookup of its name would give out a new id), no
//!   handle, no privilege to open one — its descriptor travels instead ([`Handover::keep`]).
//!   After a crash such inodes answer ESTALE.
//! - **file and directory handles** are reopened on first use from the request's node id
//!   (and, for reads and writes, the open flags the request carries); handle numbers carry
//!   the daemon's incarnation (`handles.rs`), so new ones never collide with old ones.
//! - **inodes unlinked but still open**: only their descriptors keep them alive. On an
//!   upgrade the earlier daemon passes their `O_PATH` descriptors along ([`Handover::keep`]);
//!   under a supervisor, the daemon hands it each one as it loses its last name, so they
//!   survive a crash too (`cmd/supervise.rs` in the CLI).
//!
//! Nothing of the cache's index travels: the new daemon keys its blocks with a secret of its
//! own (`farcache_engine::index`), so it can never read a block the earlier one stored, and
//! starts cold — provably never stale.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::inode::{Inode, InodeTable};
use crate::sys;

/// The version of [`HandoverState`]'s format and of the takeover exchange. A daemon refuses
/// to hand over to, or take over from, another number.
pub const TAKEOVER_PROTOCOL: u32 = 1;

/// `[mount]` keys that shape the INIT reply (or the kernel's view of the mount) and so must
/// be equal in the daemon taking over.
/// (`xattrs` too: a kernel told ENOSYS for xattrs never asks again on that connection.)
pub const INIT_KEYS: [&str; 6] =
    ["max_write", "max_background", "readdirplus", "allow_other", "writeback_cache", "xattrs"];

/// The file system's handle type for "32-bit inode number, 32-bit generation" (ext2/3/4).
const FILEID_INO32_GEN: i32 = 1;

/// What a daemon hands to the next one besides the descriptors.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HandoverState {
    pub protocol: u32,
    /// `st_dev` of the mounted FUSE file system (the new daemon checks the mount is there).
    pub dev: u64,
    /// The handing-over daemon's incarnation; the next one uses this + 1.
    pub incarnation: u32,
    /// The next synthetic node id the earlier daemon would have given out.
    pub next_synthetic: u64,
    /// Every inode the kernel knows, with its lookup count and file handle.
    pub nodes: Vec<NodeState>,
    /// Node ids of the inodes whose `O_PATH` descriptors are in [`Handover::keep`], in order.
    pub keep_nodes: Vec<u64>,
    /// How many worker descriptors follow the main one.
    pub workers: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeState {
    pub nodeid: u64,
    pub nlookup: u64,
    /// The backing inode: whatever a handle opens must be this one.
    pub dev: u64,
    pub ino: u64,
    pub handle_type: i32,
    /// The file handle, in hex.
    pub handle: String,
}

/// A live FUSE connection on its way from one daemon to the next.
pub struct Handover {
    /// The connection's main `/dev/fuse` descriptor.
    pub fuse: OwnedFd,
    /// Clones of it (`FUSE_DEV_IOC_CLONE`) the worker threads read from.
    pub workers: Vec<OwnedFd>,
    /// `O_PATH` descriptors of inodes a file handle cannot stand in for: no name left, no
    /// handle, on another file system than the backing root's, or a daemon without the
    /// privilege to open handles (see [`HandoverState::keep_nodes`]).
    pub keep: Vec<OwnedFd>,
    pub state: HandoverState,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("workers", &self.workers.len())
            .field("keep", &self.keep.len())
            .field("nodes", &self.state.nodes.len())
            .finish()
    }
}

impl Handover {
    /// Every descriptor in the order [`Handover::from_fds`] expects: main, workers, keep.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        std::iter::once(self.fuse.as_fd())
            .chain(self.workers.iter().map(|f| f.as_fd()))
            .chain(self.keep.iter().map(|f| f.as_fd()))
            .collect()
    }

    /// Rebuild from received descriptors (main, workers, keep) and the state; refuses a
    /// count that does not match the state.
    pub fn from_fds(state: HandoverState, fds: Vec<OwnedFd>) -> io::Result<Handover> {
        if state.protocol != TAKEOVER_PROTOCOL {
            return Err(io::Error::other(format!(
                "takeover state of protocol {} (this daemon speaks {TAKEOVER_PROTOCOL})",
                state.protocol
            )));
        }
        let want = 1 + state.workers + state.keep_nodes.len();
        if fds.len() != want {
            return Err(io::Error::other(format!("takeover: {} descriptors received, {want} expected", fds.len())));
        }
        let mut it = fds.into_iter();
        let fuse = it.next().expect("counted");
        let workers = it.by_ref().take(state.workers).collect();
        let keep = it.collect();
        Ok(Handover { fuse, workers, keep, state })
    }

    /// Copies of the descriptors, the same state: to keep (a supervisor, or the handing-over
    /// daemon until the new one confirms) while the original goes to another process.
    pub fn try_clone(&self) -> io::Result<Handover> {
        Ok(Handover {
            fuse: sys::dup(self.fuse.as_fd())?,
            workers: self.workers.iter().map(|f| sys::dup(f.as_fd())).collect::<io::Result<_>>()?,
            keep: self.keep.iter().map(|f| sys::dup(f.as_fd())).collect::<io::Result<_>>()?,
            state: self.state.clone(),
        })
    }
}

/// A recorded file handle: `(type, bytes, lookups)`.
/// A recorded file handle: type, bytes, lookups, and the backing `(dev, ino)` it must open.
struct Recorded {
    handle_type: i32,
    handle: Vec<u8>,
    nlookup: u64,
    dev: u64,
    ino: u64,
}

/// How an adopted session resolves node ids it has not seen.
pub(crate) struct Resolver {
    /// Handles recorded by the earlier daemon, by node id.
    recorded: Mutex<HashMap<u64, Recorded>>,
    /// Node ids may be opened from a handle built from the number alone.
    constructible: bool,
    /// The backing root opened for reading: `open_by_handle_at` refuses `O_PATH` ones.
    mount_fd: Option<OwnedFd>,
}

impl Resolver {
    /// `union`: a mount of several branches, whose node ids are farcache ids and synthetic
    /// ones, never inode numbers: none is resolved from a number alone.
    pub(crate) fn new(state: &HandoverState, root: BorrowedFd<'_>, union: bool) -> Resolver {
        let recorded = state
            .nodes
            .iter()
            .filter(|n| n.handle_type >= 0 && !n.handle.is_empty())
            .filter_map(|n| {
                let handle = unhex(&n.handle)?;
                Some((
                    n.nodeid,
                    Recorded { handle_type: n.handle_type, handle, nlookup: n.nlookup, dev: n.dev, ino: n.ino },
                ))
            })
            .collect();
        // Only where the root's own handle has the ino32+generation form.
        let constructible = !union && matches!(sys::handle_of(root), Ok((FILEID_INO32_GEN, b)) if b.len() == 8);
        let mount_fd = sys::openat(root, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| tracing::warn!("takeover: cannot open the backing root to resolve file handles: {e}"))
            .ok();
        Resolver { recorded: Mutex::new(recorded), constructible, mount_fd }
    }

    /// The kernel dropped `n` lookups of a node this daemon never resolved: its recorded
    /// handle goes once the count the earlier daemon left reaches zero.
    pub(crate) fn forget(&self, nodeid: u64, n: u64) {
        let mut r = self.recorded.lock();
        if let Some(e) = r.get_mut(&nodeid) {
            e.nlookup = e.nlookup.saturating_sub(n);
            if e.nlookup == 0 {
                r.remove(&nodeid);
            }
        }
    }

    /// Open node `nodeid` of the earlier daemon and enter it in `table`; ESTALE if it cannot
    /// be resolved (or resolves to anything but that inode).
    pub(crate) fn resolve(&self, table: &InodeTable, nodeid: u64) -> io::Result<Arc<Inode>> {
        let root = self.mount_fd.as_ref().ok_or_else(|| sys::err(libc::ESTALE))?.as_fd();
        let recorded = self.recorded.lock().remove(&nodeid);
        // What the opened inode must be: the recorded one, or for a number alone, that
        // number on the root's device. A handle of another file system, decoded by the
        // root's, could name any of its inodes: never trusted without this check.
        let (fd, nlookup, want) = match recorded {
            Some(r) => {
                let fd = sys::open_handle(root, r.handle_type, &r.handle, libc::O_PATH | libc::O_NOFOLLOW)
                    .map_err(|_| sys::err(libc::ESTALE))?;
                (fd, r.nlookup, (r.dev, r.ino))
            }
            None if self.constructible && table.is_direct(nodeid) => {
                let ino = u32::try_from(nodeid).map_err(|_| sys::err(libc::ESTALE))?;
                let mut h = [0u8; 8];
                h[..4].copy_from_slice(&ino.to_ne_bytes());
                // Generation 0: ext4 then skips its generation check (the number is all we have).
                let fd = sys::open_handle(root, FILEID_INO32_GEN, &h, libc::O_PATH | libc::O_NOFOLLOW)
                    .map_err(|_| sys::err(libc::ESTALE))?;
                (fd, 1, (table.root_dev(), nodeid))
            }
            None => return Err(sys::err(libc::ESTALE)),
        };
        let st = sys::fstat(fd.as_fd())?;
        if (st.st_dev, st.st_ino) != want {
            tracing::debug!("takeover: node {nodeid}'s handle opened another inode; stale");
            return Err(sys::err(libc::ESTALE));
        }
        tracing::debug!("takeover: resolved node {nodeid} by file handle");
        table.insert_resolved(nodeid, fd, &st, nlookup)
    }
}

/// The state to hand over: every inode the kernel knows, with its file handle; the
/// descriptors of those without a name, to keep them alive.
pub(crate) fn snapshot(table: &InodeTable, incarnation: u32) -> (HandoverState, Vec<OwnedFd>) {
    let (nodes, next_synthetic) = table.snapshot();
    let mut state =
        HandoverState { protocol: TAKEOVER_PROTOCOL, incarnation, next_synthetic, ..HandoverState::default() };
    let mut keep = Vec::new();
    // The next daemon opens handles only with CAP_DAC_READ_SEARCH (root, here).
    let handles_work = sys::is_root();
    for (inode, nlookup) in nodes {
        // One the table let go of is not reopened: its stored handle names it, and it had a
        // name when let go of (nothing to keep).
        let fd = inode.held_fd();
        let handle = match (inode.handle(), &fd) {
            (Some((t, h)), _) => Some((t, h.to_vec())),
            (None, Some(fd)) => sys::handle_of(fd.as_fd())
                .map_err(|e| tracing::debug!("takeover: no file handle for node {}: {e}", inode.nodeid))
                .ok(),
            (None, None) => None,
        };
        let (handle_type, handle_hex) = match &handle {
            Some((t, h)) => (*t, h.iter().map(|b| format!("{b:02x}")).collect()),
            None => (-1, String::new()),
        };
        state.nodes.push(NodeState {
            nodeid: inode.nodeid,
            nlookup,
            dev: inode.dev,
            ino: inode.ino,
            handle_type,
            handle: handle_hex,
        });
        // The descriptor itself travels where a handle cannot stand in for it: no name left
        // (only a descriptor keeps the inode), no handle, another file system under the
        // backing directory (the next daemon opens handles on the root's), no privilege, or
        // a synthetic node id (a union's directories): a handle resolves such a node only
        // when the kernel names it by its id, and a lookup of its name before that would
        // find nothing in the next daemon's table and give out a new id — the kernel would
        // see the inode's number change. Kept, it is entered at start (`adopt_kept`) under
        // the key a lookup finds.
        let Some(fd) = fd else { continue };
        let unlinked = sys::fstat(fd.as_fd()).map(|st| st.st_nlink == 0).unwrap_or(false);
        let root_fs = inode.dev == table.root_dev();
        let synthetic = InodeTable::is_synthetic(inode.nodeid);
        if unlinked || handle.is_none() || !root_fs || !handles_work || synthetic {
            if let Ok(fd) = sys::dup(fd.as_fd()) {
                state.keep_nodes.push(inode.nodeid);
                keep.push(fd);
            }
        }
    }
    (state, keep)
}

/// Lookups assumed for a kept inode whose count died with a crashed daemon: never forgotten
/// by partial counts (its number must stay unusable while the kernel might ask for it).
const UNKNOWN_LOOKUPS: u64 = u64::MAX / 2;

/// Enter the kept inodes in `table` under their node ids. In a mount of several branches
/// (`union`) a regular file's node id is its farcache id: it is entered under that id's key
/// and data identity, as a lookup would, and where a move of it was interrupted (a crash;
/// the journal's replay at start decided which copy is the file) the descriptor kept for
/// it, which may be the other copy, gives way to the file replay left.
pub(crate) fn adopt_kept(
    table: &InodeTable,
    state: &HandoverState,
    keep: &[OwnedFd],
    union: Option<&crate::union::Union>,
) {
    let counts: HashMap<u64, u64> = state.nodes.iter().map(|n| (n.nodeid, n.nlookup)).collect();
    for (nodeid, fd) in state.keep_nodes.iter().zip(keep) {
        let nlookup = counts.get(nodeid).copied().unwrap_or(UNKNOWN_LOOKUPS);
        let res = sys::dup(fd.as_fd()).and_then(|fd| {
            let st = sys::fstat(fd.as_fd())?;
            let union_file = union.is_some()
                && st.st_mode & libc::S_IFMT == libc::S_IFREG
                && *nodeid != crate::inode::ROOT_ID
                && !InodeTable::is_synthetic(*nodeid);
            let Some(u) = union.filter(|_| union_file) else {
                return table.insert_resolved(*nodeid, fd, &st, nlookup);
            };
            let fd = match u.replayed_file(*nodeid) {
                Some(settled) => {
                    tracing::info!("takeover: node {nodeid}'s interrupted move was settled; serving the file it left");
                    settled
                }
                None => fd,
            };
            let mut key = sys::fstat(fd.as_fd())?;
            key.st_dev = farcache_engine::identity::UNION_DEV;
            key.st_ino = *nodeid;
            let inode = table.insert_resolved(*nodeid, fd, &key, nlookup)?;
            let _ = inode.file_id.get_or_init(|| farcache_engine::FileId::union(*nodeid));
            Ok(inode)
        });
        if let Err(e) = res {
            tracing::warn!("takeover: a kept inode (node {nodeid}) could not be entered: {e}");
        }
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 2 * sys::MAX_HANDLE_BYTES {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open_path(p: &std::path::Path) -> (OwnedFd, libc::stat) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let fd = sys::openat(crate::fs::unsafe_at_fdcwd(), &c, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = sys::fstat(fd.as_fd()).unwrap();
        (fd, st)
    }

    /// An inode with no name left travels as a descriptor (a handle could not reopen it),
    /// and the next table holds it under its node id with its lookup count.
    #[test]
    fn unlinked_inodes_travel_as_descriptors() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("gone"), b"still here").unwrap();
        let (rfd, rst) = open_path(d.path());
        let old = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        let (fd, st) = open_path(&d.path().join("gone"));
        let node = old.lookup(fd, &st).unwrap().nodeid;
        std::fs::remove_file(d.path().join("gone")).unwrap();
        let (state, keep) = snapshot(&old, 0);
        assert_eq!((state.keep_nodes.clone(), keep.len()), (vec![node], 1));
        let new = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        adopt_kept(&new, &state, &keep, None);
        let got = new.get(node).expect("kept under its node id");
        assert_eq!(got.ino, st.st_ino);
        assert!(new.forget(node, 1), "one lookup, as the old table counted");
    }

    /// A node under a synthetic id (a union's directory) travels as a descriptor even where a
    /// handle could stand in for it: the next table holds it at start, so a lookup of its
    /// name, before the kernel names it by its id, finds that id rather than giving out a new
    /// one (the kernel would see the directory's inode number change).
    #[test]
    fn synthetic_nodes_travel_as_descriptors_and_keep_their_id_for_a_lookup() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        let (rfd, rst) = open_path(d.path());
        let old = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        let (fd, st) = open_path(&d.path().join("dir"));
        let (dir, _) = old.lookup_as(fd, &st, None).unwrap();
        assert!(InodeTable::is_synthetic(dir.nodeid));
        let (state, keep) = snapshot(&old, 0);
        assert_eq!((state.keep_nodes.clone(), keep.len()), (vec![dir.nodeid], 1));
        let new = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        new.reserve_synthetic(InodeTable::synthetic_start(1));
        adopt_kept(&new, &state, &keep, None);
        let (fd, st) = open_path(&d.path().join("dir"));
        let (again, fresh) = new.lookup_as(fd, &st, None).unwrap();
        assert_eq!((again.nodeid, fresh), (dir.nodeid, false), "the lookup found the kept node");
    }

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        assert_eq!(unhex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }

    /// The two ways a node id is resolved without the earlier daemon's table: a recorded
    /// handle, and (on ext4, as root) one built from the inode number with generation 0.
    #[test]
    fn node_ids_resolve_by_recorded_and_constructed_handles() {
        if !sys::is_root() {
            eprintln!("skipped: open_by_handle_at needs CAP_DAC_READ_SEARCH");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"x").unwrap();
        std::fs::write(d.path().join("b"), b"y").unwrap();
        let (rfd, rst) = open_path(d.path());
        let old = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        let (fa, sa) = open_path(&d.path().join("a"));
        let a = old.lookup(fa, &sa).unwrap();
        old.lookup(open_path(&d.path().join("a")).0, &sa).unwrap();
        let (state, keep) = snapshot(&old, 3);
        assert!(keep.is_empty());
        assert_eq!(state.nodes.len(), 1);
        assert_eq!(state.nodes[0].nlookup, 2);

        let new = InodeTable::new(sys::dup(rfd.as_fd()).unwrap(), &rst, 100);
        let r = Resolver::new(&state, rfd.as_fd(), false);
        let got = r.resolve(&new, a.nodeid).unwrap();
        assert_eq!((got.dev, got.ino), (sa.st_dev, sa.st_ino));
        // Never seen by the old table: only a constructed handle can find it.
        let (_, sb) = open_path(&d.path().join("b"));
        match r.resolve(&new, sb.st_ino) {
            Ok(i) => {
                assert!(r.constructible);
                assert_eq!(i.ino, sb.st_ino);
            }
            Err(e) => {
                assert!(!r.constructible, "constructible, yet: {e}");
                assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
            }
        }
        // A number that is no inode of the file system is stale, never another file.
        let e = r.resolve(&new, 0xffff_fff0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    }
}
