//! A mount of several backing directories (*branches*, mergerfs's word): one tree made of
//! theirs, every regular file on exactly one branch, directories on several.
//!
//! The rules (docs/SEMANTICS.md, "Several backing directories", says what applications see):
//! - **Lookup** searches the parent's branches in order; the first entry found wins (a
//!   directory found there is merged with the same directory on the later branches).
//! - **readdir** merges the parent's directories on every branch, first name wins.
//! - **New files** (create, mknod, symlink) go to one branch by `mount.create_policy`, among
//!   the branches where the parent directory exists; **mkdir** makes the directory on every
//!   branch where its parent exists, so files can be placed (and moved) anywhere below.
//! - **rename** of a file happens on its branch (the target directory is created there if
//!   missing), and the target name is removed from the other branches; a directory is
//!   renamed on every branch it is on. Not atomic across branches: a crash in between can
//!   leave a name on one branch only (never a file's data lost). RENAME_EXCHANGE between
//!   branches is EXDEV. **link** makes the new name on the file's branch (same rule).
//! - **statfs** sums the branches.
//!
//! Identity (`ids.rs`): each regular file carries a farcache id in an extended attribute,
//! assigned at create (or at its first lookup), never reused, unchanged when the file moves;
//! its inode number through the mount and its cache identity ([`FileId::union`]) derive
//! from it, so neither changes when `farcache balance` moves it (`balance.rs`), nor across
//! restarts. A move's crash safety is `journal.rs`; the busy measure is `load.rs`.
//!
//! The *gate*: a read-write lock that every name operation and every change of file data or
//! metadata holds shared, and the final switch of a move holds exclusive for a few system
//! calls, so that nothing writes to a file, or reaches it by its old name, while it changes
//! branch. Reads of data never take it.

pub(crate) mod auto;
pub(crate) mod balance;
mod ids;
mod journal;
pub(crate) mod load;
pub(crate) mod ops;
pub(crate) mod yielding;

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use serde::{Deserialize, Serialize};

use crate::config::CreatePolicy;
use crate::error::MountError;
use crate::sys;

pub use auto::{AutoBalancer, BalanceConfig, TEMPLATE as BALANCE_TEMPLATE};
pub use balance::{BalanceOptions, BalanceStatus, CopySource, UnionHandle};
pub(crate) use ids::IdRecord;

/// The directory at each branch's root that holds farcache's own state for the branch
/// (its id, the id high-water mark, the move journal, copies in progress). Hidden from the
/// mount.
pub(crate) const META_DIR: &str = ".farcache-union";

/// Recent accesses remembered (node ids of regular files), for `farcache balance`.
pub(crate) const HISTORY_SLOTS: usize = 4096;
/// Most entries a merged directory listing holds (a larger directory fails with EOVERFLOW).
pub(crate) const MAX_MERGED_ENTRIES: usize = 4 << 20;

/// One backing branch.
pub(crate) struct Branch {
    pub(crate) path: PathBuf,
    /// `O_PATH` descriptor of the branch's root directory.
    pub(crate) root: OwnedFd,
    /// `O_PATH` descriptor of its [`META_DIR`].
    pub(crate) meta: OwnedFd,
    pub(crate) dev: u64,
    /// Random, drawn when the branch first joined a union; stored in its [`META_DIR`].
    pub(crate) uuid: u64,
}

/// Counters of the union, for `farcache stats`.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) ids_assigned: AtomicU64,
    pub(crate) id_failures: AtomicU64,
    pub(crate) moves: AtomicU64,
    pub(crate) move_failures: AtomicU64,
    pub(crate) move_skips: AtomicU64,
    pub(crate) races: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) blocks_from_cache: AtomicU64,
    pub(crate) blocks_from_disk: AtomicU64,
    pub(crate) blocks_from_tier: AtomicU64,
    pub(crate) bytes_moved: AtomicU64,
    pub(crate) handles_switched: AtomicU64,
    pub(crate) journal_replayed: AtomicU64,
    pub(crate) auto_enabled: AtomicU64,
    pub(crate) auto_active: AtomicU64,
    pub(crate) auto_checks: AtomicU64,
    pub(crate) auto_rounds: AtomicU64,
    pub(crate) auto_moves: AtomicU64,
    pub(crate) auto_skips: AtomicU64,
    pub(crate) copy_yields: AtomicU64,
    pub(crate) copy_yield_bounded: AtomicU64,
    pub(crate) copy_yield_wait_ns: AtomicU64,
    pub(crate) copy_lender_yields: AtomicU64,
    pub(crate) copy_lender_yield_wait_ns: AtomicU64,
}

/// What `farcache stats` shows of a union (`union` in the stats document).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UnionStats {
    pub branches: Vec<String>,
    pub create_policy: String,
    /// Farcache ids given to files (at create, or at the first lookup of an older file).
    pub ids_assigned: u64,
    /// Files that could not be given an id (served with a per-run identity; never moved).
    pub id_failures: u64,
    /// Files moved to another branch.
    pub moves: u64,
    /// Moves given up (an error; the file stays where it was, whole).
    pub move_failures: u64,
    /// Files a balance passed over (hard-linked, not a regular file, already there...).
    pub move_skips: u64,
    /// Copies found stale at the switch (the file was written, truncated or renamed during
    /// the copy).
    pub races: u64,
    /// Copies started again after a race.
    pub retries: u64,
    /// Blocks of moved files copied from lenders' RAM (or a tier) rather than the disk.
    pub blocks_from_cache: u64,
    /// Blocks of moved files read from the source disk.
    pub blocks_from_disk: u64,
    /// Of `blocks_from_cache`, those the write-back tier held (dirty there: the disk lacked
    /// them).
    pub blocks_from_tier: u64,
    pub bytes_moved: u64,
    /// Open handles switched to a moved file's new copy.
    pub handles_switched: u64,
    /// Moves found in progress at start (a crash) and resolved.
    pub journal_replayed: u64,
    /// The automatic balancer runs (`[balance] enabled`).
    pub auto_enabled: bool,
    /// It is between a start and a stop (rounds go on while the load stays uneven).
    pub auto_active: bool,
    /// Intervals whose load it read.
    pub auto_checks: u64,
    /// Rounds it ran, and the files they moved (also counted in `moves`).
    pub auto_rounds: u64,
    pub auto_moves: u64,
    /// Rounds not started because a balance asked for was running.
    pub auto_skips: u64,
    /// Each branch's busy per mille over its last interval.
    pub auto_busy_permille: Vec<u32>,
    /// Per branch, milliseconds the daemon's reads and writes of files there took (summed
    /// over threads): the daemon's own load measure, which sees a throttled device's waits.
    pub branch_busy_ms: Vec<u64>,
    /// Waits of copies before reading the source disk again, for the applications' I/O on
    /// their branches (`[balance] yield_to_foreground`), of them those that ran to their bound
    /// (the foreground never paused), and the time waited in all.
    pub copy_yields: u64,
    pub copy_yield_bounded: u64,
    pub copy_yield_wait_ms: u64,
    /// Waits of copies before fetching from the lenders again, and the time waited.
    #[serde(default)]
    pub copy_lender_yields: u64,
    #[serde(default)]
    pub copy_lender_yield_wait_ms: u64,
}

/// A bounded, lock-free ring of recently accessed node ids (two atomic operations per
/// record; collisions between writers only lose an entry).
pub(crate) struct History {
    slots: Vec<AtomicU64>,
    next: AtomicUsize,
}

impl History {
    fn new() -> History {
        History { slots: (0..HISTORY_SLOTS).map(|_| AtomicU64::new(0)).collect(), next: AtomicUsize::new(0) }
    }

    pub(crate) fn record(&self, nodeid: u64) {
        // Repeated reads of one file take one slot, not the whole ring.
        let last = (self.next.load(Ordering::Relaxed) + HISTORY_SLOTS - 1) % HISTORY_SLOTS;
        if self.slots[last].load(Ordering::Relaxed) == nodeid {
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % HISTORY_SLOTS;
        self.slots[i].store(nodeid, Ordering::Relaxed);
    }

    /// Distinct node ids, most recent first.
    pub(crate) fn recent(&self) -> Vec<u64> {
        let end = self.next.load(Ordering::Relaxed);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for k in 0..HISTORY_SLOTS {
            let i = (end + HISTORY_SLOTS * 2 - 1 - k) % HISTORY_SLOTS;
            let n = self.slots[i].load(Ordering::Relaxed);
            if n != 0 && seen.insert(n) {
                out.push(n);
            }
        }
        out
    }
}

/// The union's shared state (one per mount).
pub(crate) struct Union {
    pub(crate) branches: Vec<Branch>,
    pub(crate) policy: CreatePolicy,
    /// The extended attribute ids live in: `trusted.farcache.id` as root, else
    /// `user.farcache.id`.
    pub(crate) xattr: CString,
    ids: ids::IdAlloc,
    /// Serialises the assignment of ids to files found without one.
    assign: Mutex<()>,
    pub(crate) gate: RwLock<()>,
    /// The farcache id of the file being moved (0: none) and the writes to it counted
    /// since (`WriteGuard`).
    pub(crate) moving: AtomicU64,
    pub(crate) moving_writes: AtomicU64,
    pub(crate) history: History,
    pub(crate) counters: Counters,
    pub(crate) load: load::LoadSampler,
    /// Test-only fault point (`FARCACHE_FAULT=balance:STEP`): the daemon aborts there.
    pub(crate) fault: Option<String>,
    /// Per branch: nanoseconds the daemon spent in reads and writes of files there (the
    /// daemon's own load measure: it sees a throttled device's waits, which the device's
    /// io_ticks do not).
    pub(crate) busy_ns: Vec<AtomicU64>,
    /// Per branch: the applications' reads and writes in flight, for the copy to yield to.
    pub(crate) foreground: yielding::Foreground,
    /// The automatic balancer's last reading (busy per mille of each branch).
    pub(crate) auto_busy: Mutex<Vec<u32>>,
    /// The moves a crash interrupted, finished at start: where each left its file.
    pub(crate) replayed: Vec<journal::Settled>,
}

/// An application's I/O on a branch, in flight while this lives ([`Union::foreground_io`]).
pub(crate) struct ForegroundIo<'a> {
    u: &'a Union,
    b: usize,
    t: std::time::Instant,
}

impl Drop for ForegroundIo<'_> {
    fn drop(&mut self) {
        let now = std::time::Instant::now();
        if let Some(c) = self.u.busy_ns.get(self.b) {
            c.fetch_add(now.duration_since(self.t).as_nanos() as u64, Ordering::Relaxed);
        }
        self.u.foreground.end(self.b, now);
    }
}

/// A union opened ahead of its mount ([`crate::Mount::with_union`]): its branches checked,
/// the moves a crash interrupted finished. What a write-back tier needs of it before the
/// mount serves: which file of it a descriptor is ([`OpenUnion::files`]).
pub struct OpenUnion {
    pub(crate) u: Arc<Union>,
    pub(crate) canon: Vec<PathBuf>,
}

impl OpenUnion {
    /// Check and open `branches` (two or more backing directories, each its own file
    /// system), finishing the moves a crash interrupted.
    pub fn open(branches: &[PathBuf], cfg: &crate::MountConfig) -> Result<OpenUnion, MountError> {
        let canon = crate::canonical_branches(branches)?;
        let u = Arc::new(Union::open(&canon, cfg.create_policy)?);
        Ok(OpenUnion { u, canon })
    }

    /// The branches, canonical, in order.
    pub fn branches(&self) -> &[PathBuf] {
        &self.canon
    }

    /// Which live file of the union a descriptor is (for the write-back tier).
    pub fn files(&self) -> Arc<dyn farcache_engine::UnionFiles> {
        Arc::new(Files(self.u.clone()))
    }
}

/// [`farcache_engine::UnionFiles`] of a union.
pub(crate) struct Files(pub(crate) Arc<Union>);

impl farcache_engine::UnionFiles for Files {
    fn live_id(&self, file: &std::fs::File) -> Option<u64> {
        let u = &self.0;
        let st = sys::fstat(file.as_fd()).ok()?;
        if st.st_nlink == 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        let b = u.branches.iter().position(|b| b.dev == st.st_dev)?;
        let r = IdRecord::read(file.as_fd(), &u.xattr)?;
        if r.branch != u.branches[b].uuid || r.ino != st.st_ino {
            return None;
        }
        // A copy in progress or a source set aside lives in the branch's own directory.
        let (at, rel) = u.locate(file.as_fd()).ok()?;
        (at == b && !rel.starts_with(META_DIR)).then_some(r.id)
    }
}

/// Held by a change of a file's data or metadata: the gate shared, and on release the write
/// counted if the file is being moved.
pub(crate) struct WriteGuard<'a> {
    u: &'a Union,
    id: u64,
    _g: RwLockReadGuard<'a, ()>,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        if self.id != 0 && self.u.moving.load(Ordering::SeqCst) == self.id {
            self.u.moving_writes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn branch_err(path: &Path, problem: impl Into<String>, fix: impl Into<String>) -> MountError {
    MountError::Branch { path: path.to_path_buf(), problem: problem.into(), fix: fix.into() }
}

impl Union {
    /// Check and open `paths` (canonical, existing directories, two or more), set up each
    /// branch's [`META_DIR`], and finish the moves a crash interrupted.
    pub(crate) fn open(paths: &[PathBuf], policy: CreatePolicy) -> Result<Union, MountError> {
        let xattr = if sys::is_root() { c"trusted.farcache.id" } else { c"user.farcache.id" };
        let mut branches: Vec<Branch> = Vec::with_capacity(paths.len());
        for p in paths {
            if let Some(b) = branches.iter().find(|b| &b.path == p) {
                return Err(branch_err(p, "is listed twice", format!("name each branch once ({})", b.path.display())));
            }
            if let Some(b) = branches.iter().find(|b| p.starts_with(&b.path) || b.path.starts_with(p)) {
                return Err(branch_err(
                    p,
                    format!("is inside branch {} (or contains it): its files would be seen twice", b.path.display()),
                    "use branches that do not nest",
                ));
            }
            let c = sys::cname(p.as_os_str()).map_err(|source| MountError::BackingOpen { path: p.clone(), source })?;
            let root = sys::openat(crate::fs::unsafe_at_fdcwd(), &c, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|source| MountError::BackingOpen { path: p.clone(), source })?;
            let st = sys::fstat(root.as_fd()).map_err(|source| MountError::BackingOpen { path: p.clone(), source })?;
            if let Some(b) = branches.iter().find(|b| b.dev == st.st_dev) {
                return Err(branch_err(
                    p,
                    format!(
                        "is on the same file system as branch {} (device {}:{})",
                        b.path.display(),
                        libc::major(st.st_dev),
                        libc::minor(st.st_dev)
                    ),
                    "give each branch a file system (disk) of its own — a union balances load between disks — \
                     or mount the one directory alone",
                ));
            }
            let io_err = |what: &str, e: io::Error| {
                branch_err(p, format!("{what}: {e}"), "make the branch writable by the mount daemon")
            };
            let meta = ensure_dir(root.as_fd(), META_DIR).map_err(|e| io_err("could not make .farcache-union", e))?;
            probe_xattr(meta.as_fd(), xattr).map_err(|e| {
                branch_err(
                    p,
                    format!(
                        "has a file system without extended attributes (setting {} failed: {e})",
                        xattr.to_string_lossy()
                    ),
                    "farcache keeps each file's id in one: use ext4, xfs, btrfs or tmpfs",
                )
            })?;
            for sub in ["journal", "tmp"] {
                ensure_dir(meta.as_fd(), sub).map_err(|e| io_err("could not make .farcache-union", e))?;
            }
            let uuid =
                ids::branch_uuid(meta.as_fd()).map_err(|e| io_err("could not read or write its branch id", e))?;
            if let Some(b) = branches.iter().find(|b| b.uuid == uuid) {
                return Err(branch_err(
                    p,
                    format!("has the same branch id as {} (one was copied from the other)", b.path.display()),
                    format!("remove {}/{META_DIR}/branch from the copy", p.display()),
                ));
            }
            branches.push(Branch { path: p.clone(), root, meta, dev: st.st_dev, uuid });
        }
        let ids = ids::IdAlloc::open(&branches).map_err(|e| {
            branch_err(
                &branches[0].path,
                format!("could not keep the id high-water mark: {e}"),
                "make the branches writable",
            )
        })?;
        let busy_ns = (0..branches.len()).map(|_| AtomicU64::new(0)).collect();
        let foreground = yielding::Foreground::new(branches.len());
        let fault = std::env::var("FARCACHE_FAULT").ok().filter(|f| f.starts_with("balance:"));
        let mut u = Union {
            branches,
            policy,
            xattr: xattr.to_owned(),
            ids,
            assign: Mutex::new(()),
            gate: RwLock::new(()),
            moving: AtomicU64::new(0),
            moving_writes: AtomicU64::new(0),
            history: History::new(),
            counters: Counters::default(),
            load: load::LoadSampler::default(),
            fault,
            foreground,
            busy_ns,
            auto_busy: Mutex::new(Vec::new()),
            replayed: Vec::new(),
        };
        let replayed = journal::replay(&u).map_err(|e| {
            branch_err(
                &u.branches[0].path,
                format!("could not finish the moves a crash interrupted: {e}"),
                "check the branches are all mounted and writable, then mount again",
            )
        })?;
        u.counters.journal_replayed.store(replayed.len() as u64, Ordering::Relaxed);
        u.replayed = replayed;
        Ok(u)
    }

    /// The regular file whose id is `id`, as a crash's replay left it (`None` if no move of
    /// it was interrupted, or it is not there): an `O_PATH` descriptor.
    pub(crate) fn replayed_file(&self, id: u64) -> Option<OwnedFd> {
        let (_, b, rel) = self.replayed.iter().find(|(i, _, _)| *i == id)?;
        let (parent, name) = ops::split(rel).ok()?;
        let dir = self.walk(*b, &parent).ok()?;
        let fd = sys::openat(dir.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        let r = IdRecord::read(fd.as_fd(), &self.xattr)?;
        (r.id == id && r.branch == self.branches[*b].uuid && r.ino == st.st_ino).then_some(fd)
    }

    pub(crate) fn stats(&self) -> UnionStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        UnionStats {
            branches: self.branches.iter().map(|b| b.path.display().to_string()).collect(),
            create_policy: format!("{:?}", self.policy),
            ids_assigned: l(&c.ids_assigned),
            id_failures: l(&c.id_failures),
            moves: l(&c.moves),
            move_failures: l(&c.move_failures),
            move_skips: l(&c.move_skips),
            races: l(&c.races),
            retries: l(&c.retries),
            blocks_from_cache: l(&c.blocks_from_cache),
            blocks_from_disk: l(&c.blocks_from_disk),
            blocks_from_tier: l(&c.blocks_from_tier),
            bytes_moved: l(&c.bytes_moved),
            handles_switched: l(&c.handles_switched),
            journal_replayed: l(&c.journal_replayed),
            auto_enabled: l(&c.auto_enabled) != 0,
            auto_active: l(&c.auto_active) != 0,
            auto_checks: l(&c.auto_checks),
            auto_rounds: l(&c.auto_rounds),
            auto_moves: l(&c.auto_moves),
            auto_skips: l(&c.auto_skips),
            auto_busy_permille: self.auto_busy.lock().clone(),
            branch_busy_ms: self.busy_ns.iter().map(|c| c.load(Ordering::Relaxed) / 1_000_000).collect(),
            copy_yields: l(&c.copy_yields),
            copy_yield_bounded: l(&c.copy_yield_bounded),
            copy_yield_wait_ms: l(&c.copy_yield_wait_ns) / 1_000_000,
            copy_lender_yields: l(&c.copy_lender_yields),
            copy_lender_yield_wait_ms: l(&c.copy_lender_yield_wait_ns) / 1_000_000,
        }
    }

    /// An application's read or write on branch `b` starts: counted in flight (the copy of
    /// a move yields to it) until the guard drops, and its time added to the branch's busy
    /// time then.
    pub(crate) fn foreground_io(&self, b: usize) -> ForegroundIo<'_> {
        self.foreground.begin(b);
        ForegroundIo { u: self, b, t: std::time::Instant::now() }
    }

    /// The branch the open file `fd` is on (by device; [`crate::handles::NO_BRANCH`] if none).
    pub(crate) fn branch_of(&self, fd: BorrowedFd<'_>) -> usize {
        let dev = sys::fstat(fd).map(|s| s.st_dev).unwrap_or(0);
        self.branches.iter().position(|b| b.dev == dev).unwrap_or(crate::handles::NO_BRANCH)
    }

    /// The gate, shared, for a change to the file `id` (0: not a union file).
    pub(crate) fn write_guard(&self, id: u64) -> WriteGuard<'_> {
        WriteGuard { u: self, id, _g: self.gate.read() }
    }

    /// Kill the daemon here (SIGKILL: no handler, no unwinding, no flush — as the kernel's
    /// OOM killer or `kill -9` would) if the test-only fault point `step` is set.
    pub(crate) fn fault(&self, step: &str) {
        if self.fault.as_deref().and_then(|f| f.strip_prefix("balance:")) == Some(step) {
            tracing::error!("FARCACHE_FAULT=balance:{step}: killing the daemon (test fault point)");
            // SAFETY: a signal to this process; SIGKILL cannot be caught.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            std::process::abort();
        }
    }

    /// Which branch the inode `fd` refers to is on, and its path relative to the branch root
    /// (empty for a root). Fails with ENOENT for an inode without a name.
    pub(crate) fn locate(&self, fd: BorrowedFd<'_>) -> io::Result<(usize, PathBuf)> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let st = sys::fstat(fd)?;
        if st.st_nlink == 0 && st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(sys::err(libc::ENOENT));
        }
        let by_dev = self.branches.iter().position(|b| b.dev == st.st_dev);
        let b = by_dev
            .filter(|&i| link.starts_with(&self.branches[i].path))
            .or_else(|| self.branches.iter().position(|b| link.starts_with(&b.path)))
            .ok_or_else(|| sys::err(libc::ENOENT))?;
        let rel = link.strip_prefix(&self.branches[b].path).map_err(|_| sys::err(libc::ENOENT))?.to_path_buf();
        if rel.as_os_str().as_bytes().ends_with(b" (deleted)") {
            return Err(sys::err(libc::ENOENT));
        }
        Ok((b, rel))
    }

    /// The directory `rel` on branch `b` (`O_PATH`), walked one component at a time without
    /// following symlinks, so nothing on a branch can lead out of it.
    pub(crate) fn walk(&self, b: usize, rel: &Path) -> io::Result<OwnedFd> {
        let mut cur = sys::openat(self.branches[b].root.as_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, 0)?;
        for comp in rel.components() {
            let std::path::Component::Normal(name) = comp else { continue };
            cur = sys::openat(cur.as_fd(), &sys::cname(name)?, libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY, 0)?;
        }
        Ok(cur)
    }

    /// The directory `rel` on branch `to`, made where missing with the mode, owner and group
    /// of the same directories on branch `from` (each new one synced into its parent).
    pub(crate) fn ensure_path(&self, to: usize, from: usize, rel: &Path) -> io::Result<OwnedFd> {
        let mut cur = sys::openat(self.branches[to].root.as_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, 0)?;
        let mut model = sys::openat(self.branches[from].root.as_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, 0)?;
        for comp in rel.components() {
            let std::path::Component::Normal(name) = comp else { continue };
            let c = sys::cname(name)?;
            let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY;
            model = sys::openat(model.as_fd(), &c, flags, 0)?;
            let next = match sys::openat(cur.as_fd(), &c, flags, 0) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let st = sys::fstat(model.as_fd())?;
                    match sys::mkdirat(cur.as_fd(), &c, st.st_mode & 0o7777) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        Err(e) => return Err(e),
                    }
                    let fd = sys::openat(cur.as_fd(), &c, flags, 0)?;
                    sys::fchown(fd.as_fd(), st.st_uid, st.st_gid)?;
                    sys::fchmod_path(fd.as_fd(), st.st_mode & 0o7777)?;
                    // Durable before anything is moved below it (a move syncs only the
                    // file's own directory).
                    let parent = sys::reopen(cur.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
                    sys::fsync_fd(parent.as_fd(), false)?;
                    fd
                }
                Err(e) => return Err(e),
            };
            cur = next;
        }
        Ok(cur)
    }

    /// The farcache id of the regular file `fd` (an `O_PATH` descriptor with stat `st`) on
    /// branch `b`: its recorded one if the record is its own (same branch, same inode), else
    /// a new one, recorded now. `None` when none can be recorded (counted; the file is then
    /// served with a per-run identity and never moved).
    pub(crate) fn identify(&self, fd: BorrowedFd<'_>, st: &libc::stat, b: usize) -> Option<u64> {
        let own = |r: &IdRecord| r.branch == self.branches[b].uuid && r.ino == st.st_ino;
        if let Some(r) = IdRecord::read(fd, &self.xattr).filter(own) {
            return Some(r.id);
        }
        let _one = self.assign.lock();
        if let Some(r) = IdRecord::read(fd, &self.xattr).filter(own) {
            return Some(r.id);
        }
        match self.ids.next(&self.branches).and_then(|id| {
            IdRecord { id, branch: self.branches[b].uuid, ino: st.st_ino }.write(fd, &self.xattr)?;
            Ok(id)
        }) {
            Ok(id) => {
                self.counters.ids_assigned.fetch_add(1, Ordering::Relaxed);
                Some(id)
            }
            Err(e) => {
                self.counters.id_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("no farcache id for a file on {}: {e}", self.branches[b].path.display());
                None
            }
        }
    }

    /// A fresh id (for a file being created).
    pub(crate) fn new_id(&self) -> io::Result<u64> {
        let id = self.ids.next(&self.branches)?;
        self.counters.ids_assigned.fetch_add(1, Ordering::Relaxed);
        Ok(id)
    }

    /// Which of `candidates` (branch indexes where the parent directory exists, in order)
    /// a new file goes to.
    pub(crate) fn place(&self, candidates: &[usize]) -> Option<usize> {
        let free = |b: usize| {
            sys::fstatvfs(self.branches[b].root.as_fd()).map(|s| s.f_bavail as u128 * s.f_frsize as u128).unwrap_or(0)
        };
        match self.policy {
            CreatePolicy::First => candidates.first().copied(),
            CreatePolicy::MostFree => candidates.iter().copied().max_by_key(|&b| (free(b), std::cmp::Reverse(b))),
            CreatePolicy::LeastBusy => {
                let busy = self.load.busy(&self.branches, &self.busy_ns);
                candidates.iter().copied().min_by_key(|&b| (busy[b], std::cmp::Reverse(free(b)), b))
            }
        }
    }

    /// The branches' sizes added up (in the first branch's fragment size).
    pub(crate) fn statfs(&self) -> io::Result<libc::statvfs> {
        let mut out = sys::fstatvfs(self.branches[0].root.as_fd())?;
        let frsize = out.f_frsize.max(1) as u128;
        let (mut blocks, mut bfree, mut bavail) = (0u128, 0u128, 0u128);
        let (mut files, mut ffree) = (0u64, 0u64);
        for b in &self.branches {
            let s = sys::fstatvfs(b.root.as_fd())?;
            let f = s.f_frsize.max(1) as u128;
            blocks += s.f_blocks as u128 * f;
            bfree += s.f_bfree as u128 * f;
            bavail += s.f_bavail as u128 * f;
            files = files.saturating_add(s.f_files);
            ffree = ffree.saturating_add(s.f_ffree);
            out.f_namemax = out.f_namemax.min(s.f_namemax);
        }
        out.f_blocks = (blocks / frsize).min(u64::MAX as u128) as u64;
        out.f_bfree = (bfree / frsize).min(u64::MAX as u128) as u64;
        out.f_bavail = (bavail / frsize).min(u64::MAX as u128) as u64;
        out.f_files = files;
        out.f_ffree = ffree;
        Ok(out)
    }

    /// Whether `name` in the directory `parent_rel` is farcache's own (hidden from the mount).
    pub(crate) fn hidden(parent_is_root: bool, name: &OsStr) -> bool {
        parent_is_root && name.as_bytes() == META_DIR.as_bytes()
    }

    /// Whether `name` is the id attribute (hidden from applications, never theirs to set).
    pub(crate) fn is_id_xattr(&self, name: &CStr) -> bool {
        name == self.xattr.as_c_str()
    }
}

/// `dir/name`, a directory, made if missing; its `O_PATH` descriptor.
fn ensure_dir(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let c = CString::new(name).expect("no NUL");
    match sys::mkdirat(dir, &c, 0o700) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    sys::openat(dir, &c, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
}

/// Set and remove a probe attribute on `dir`.
fn probe_xattr(dir: BorrowedFd<'_>, xattr: &CStr) -> io::Result<()> {
    sys::setxattr(dir, xattr, b"probe", 0)?;
    sys::removexattr(dir, xattr)
}

/// A random u64 from the kernel.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    assert_eq!(n, 8, "getrandom");
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_recent_distinct_ids_newest_first_and_is_bounded() {
        let h = History::new();
        for n in [5, 5, 5, 6, 5, 7] {
            h.record(n);
        }
        assert_eq!(h.recent(), vec![7, 5, 6]);
        for n in 1..=(HISTORY_SLOTS as u64 * 2) {
            h.record(100 + n);
        }
        let r = h.recent();
        assert_eq!(r.len(), HISTORY_SLOTS);
        assert_eq!(r[0], 100 + HISTORY_SLOTS as u64 * 2);
        assert!(!r.contains(&7), "the oldest fell out");
    }
}
