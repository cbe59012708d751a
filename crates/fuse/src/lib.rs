//! The FUSE layer of `farcache mount`: a passthrough of a backing directory whose file data
//! goes through a [`farcache_engine::DataPath`]. It is the only place where errors become
//! errno values (mountpoint-s3's `fuse.rs` plays the same part).
//!
//! Entry points: [`Mount::new`] checks the directories and the FUSE device, mounts, and
//! returns once the kernel has finished the FUSE handshake (the mount is live);
//! [`Mount::run`] serves requests on `threads` worker threads until the file system is
//! unmounted — by [`Unmounter::unmount`] (from a signal handler thread), by
//! `fusermount3 -u`, or by `umount`.
//!
//! Code map:
//! - `inode.rs`: node ids ↔ backing inodes, one `O_PATH` descriptor each (rename- and
//!   hard-link-safe; see its docs).
//! - `handles.rs`: open file and directory handles, bounded.
//! - `fs.rs`: shared state and the `fuser::Filesystem` glue (errno conversion).
//! - `ops_entry.rs`, `ops_attr.rs`, `ops_file.rs`, `ops_dir.rs`: the operations.
//! - `journal.rs`, `ops_once.rs`: the intent journal, by which an operation on names that a
//!   dead daemon carried out and the kernel resent answers as it did the first time.
//! - `sys.rs`: the system calls.
//! - `takeover.rs`: serving a connection another daemon started ([`Mount::adopt`]); what
//!   travels with the descriptors and how the kernel's node ids and handles are resolved.
//! - `config.rs`: `[mount]`.
//!
//! Permissions: the mount uses `default_permissions`, so the kernel checks every access
//! against the attributes we report (mode, owner, group) before asking us; the daemon then
//! acts with its own credentials. Run as root with `allow_other`, it serves every user, and
//! gives the inodes it creates to the calling user.

mod config;
mod error;
mod fs;
mod handles;
mod inode;
mod journal;
mod kernel_passthrough;
mod ops_attr;
mod ops_count;
mod ops_dir;
mod ops_entry;
mod ops_file;
mod ops_once;
mod readahead;
mod sys;
pub mod takeover;
mod transport;
pub mod union;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use farcache_engine::DataPath;
use fuser::{MountOption, SessionACL};

pub use config::{
    split_branches, Backing, CreatePolicy, FuseUring, MountConfig, MAX_FUSE_URING_QUEUE_DEPTH, MAX_THREADS, TEMPLATE,
};
pub use error::MountError;
pub use kernel_passthrough::{KernelPassthrough, PassthroughCounts};
pub use ops_count::OpCounts;
pub use readahead::ReadAhead;
pub use takeover::{Handover, HandoverState, INIT_KEYS, TAKEOVER_PROTOCOL};
pub use transport::{kernel_enable_uring, Transport, TransportStats, ENABLE_URING_PARAM};

/// The state and the kept descriptors a stopped session leaves.
type Left = (HandoverState, Vec<OwnedFd>);

/// Where the file system leaves its state for the next daemon when the session is stopped
/// for a handover (filled in `destroy`, after every worker thread is done).
#[derive(Clone, Default)]
pub(crate) struct HandoverSlot {
    armed: Arc<AtomicBool>,
    taken: Arc<parking_lot::Mutex<Option<Left>>>,
}

impl HandoverSlot {
    fn fill(&self, inodes: &inode::InodeTable, incarnation: u32) {
        if self.armed.load(Ordering::SeqCst) {
            *self.taken.lock() = Some(takeover::snapshot(inodes, incarnation));
        }
    }
}

/// What a [`Keeper`] is told.
pub enum Kept<'a> {
    /// An inode the kernel knows lost its last name; `fd` is its `O_PATH` descriptor (copy it
    /// to keep the inode, and so its number, alive).
    Unlinked { nodeid: u64, fd: std::os::fd::BorrowedFd<'a> },
    /// A mount of several branches: the kernel learned node `nodeid`, or (after a move) its
    /// inode is now `fd`. Its node id cannot be resolved from the branches after a crash
    /// (`crate::union`), so `fd` is to be kept (replacing what was kept for the node) until
    /// [`Kept::Forgotten`].
    Known { nodeid: u64, fd: std::os::fd::BorrowedFd<'a> },
    /// The kernel forgot the node: whatever was kept for it may go.
    Forgotten { nodeid: u64 },
}

/// Called on FUSE worker threads; must not block for long.
pub type Keeper = Box<dyn Fn(Kept<'_>) + Send + Sync>;

#[derive(Clone, Default)]
pub(crate) struct KeeperSlot(Arc<parking_lot::RwLock<Option<Keeper>>>);

impl KeeperSlot {
    pub(crate) fn is_set(&self) -> bool {
        self.0.read().is_some()
    }
    pub(crate) fn tell(&self, k: Kept<'_>) {
        if let Some(f) = self.0.read().as_ref() {
            f(k);
        }
    }
}

/// The intent journal at `path` (`journal.rs`), or `None` with a warning that says what is lost.
fn open_journal(path: &Path, conn: u64, fresh: bool) -> Option<Arc<journal::Journal>> {
    journal::Journal::open(path, conn, fresh)
        .map(Arc::new)
        .map_err(|e| {
            tracing::warn!(
                "the intent journal {} cannot be opened ({e}): after a crash, a rename, unlink or create the dead                  daemon had done may be answered with an error. Make its directory writable (it is the control                  socket's) or choose another with --control-socket",
                path.display()
            )
        })
        .ok()
}

/// Raise this process's limit on open descriptors towards `want` (as far as the hard limit,
/// or, as root, `fs.nr_open` allow); the limit now in force. For a supervisor, which holds a
/// descriptor per inode it keeps (`Kept`).
pub fn raise_descriptor_limit(want: u64) -> u64 {
    sys::raise_nofile(want)
}

/// `branches`, checked to be existing directories, canonical.
pub(crate) fn canonical_branches(branches: &[PathBuf]) -> Result<Vec<PathBuf>, MountError> {
    let mut canon = Vec::with_capacity(branches.len());
    let fix = "create it, or leave it out of the branches (DIR1:DIR2 on the command line, or mount.backing)";
    for b in branches {
        canon.push(check_dir(b, MountError::BackingMissing, MountError::BackingNotDir).map_err(|e| match e {
            MountError::BackingMissing(p) => {
                MountError::Branch { path: p, problem: "does not exist".into(), fix: fix.into() }
            }
            MountError::BackingNotDir(p) => {
                MountError::Branch { path: p, problem: "is not a directory".into(), fix: fix.into() }
            }
            e => e,
        })?);
    }
    Ok(canon)
}

/// A live mount. Dropping it without [`Mount::run`] unmounts.
pub struct Mount {
    session: fuser::Session<fs::Passthrough>,
    mountpoint: PathBuf,
    /// `st_dev` of the mounted file system: unmount only what is still ours.
    dev: u64,
    /// Copies of the connection's descriptors (main, then the workers'), for a handover.
    fuse: OwnedFd,
    workers: Vec<OwnedFd>,
    stopper: fuser::SessionStopper,
    slot: HandoverSlot,
    keeper: KeeperSlot,
    /// Descriptors received with a handover, kept open while this session runs.
    _kept: Vec<OwnedFd>,
    /// This daemon's incarnation (0 for the one that mounted; +1 at each takeover).
    incarnation: u32,
    /// Several backing branches: what `farcache balance` and the stats reach.
    union: Option<union::UnionHandle>,
    /// How requests reach this daemon (read loops or FUSE-over-io_uring), for the stats.
    transport: Transport,
    /// The largest request the kernel can send on this connection (see
    /// [`Mount::prefault_request_buffers`]).
    max_request: usize,
    /// `mount.read_ahead`, set once the connection serves.
    read_ahead: Arc<ReadAhead>,
}

/// How [`Mount::run`] ended.
#[derive(Debug)]
pub enum Ended {
    /// The file system was unmounted.
    Unmounted,
    /// Stopped by [`MountHandle::stop_for_handover`]: every request read was answered, the
    /// connection is live and its descriptors and state are here, for the next daemon.
    HandedOver(Handover),
}

/// Stops a [`Mount`] for a handover, from another thread (the control socket's).
#[derive(Clone)]
pub struct MountHandle {
    stopper: fuser::SessionStopper,
    unmounter: Arc<parking_lot::Mutex<fuser::SessionUnmounter>>,
    slot: HandoverSlot,
    union: Option<union::UnionHandle>,
}

/// Longest wait for a union's move in progress before a handover ([`MountHandle::quiesce`]).
pub const QUIESCE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

impl MountHandle {
    /// Before [`Self::stop_for_handover`]: a mount of several branches stops moving files
    /// (the move in hand finishes, at most [`QUIESCE_WAIT`]); an error if one still runs
    /// (then the handover must not happen: call [`Self::resume`]).
    pub fn quiesce(&self) -> io::Result<()> {
        match &self.union {
            Some(u) if !u.quiesce(QUIESCE_WAIT) => Err(io::Error::other(format!(
                "a move of a file between branches (farcache balance) did not finish within {QUIESCE_WAIT:?}"
            ))),
            _ => Ok(()),
        }
    }

    /// Moves may start again: the handover [`Self::quiesce`] prepared did not happen.
    pub fn resume(&self) {
        if let Some(u) = &self.union {
            u.resume();
        }
    }

    /// Stop reading requests at a clean point: each worker thread finishes the request in
    /// hand; [`Mount::run`] then returns [`Ended::HandedOver`]. The mount stays mounted
    /// (requests wait in the kernel for the next reader). Returns at once.
    pub fn stop_for_handover(&self) {
        self.unmounter.lock().disarm();
        self.slot.armed.store(true, Ordering::SeqCst);
        self.stopper.stop();
    }
}

/// Unmounts a [`Mount`] from another thread (a signal handler's).
pub struct Unmounter {
    /// fuser's own handle: unmounting through it also tells the session not to unmount
    /// again by path when it ends (fuser 0.18.0 would otherwise try, see `run`). A session
    /// taken over from another daemon has none: it unmounts by path.
    inner: fuser::SessionUnmounter,
    mountpoint: PathBuf,
    dev: u64,
}

/// What [`Unmounter::unmount`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmounted {
    /// Gone; [`Mount::run`] returns shortly.
    Done,
    /// The mount was busy (open files, a working directory inside): it was detached from
    /// the directory tree at once, and [`Mount::run`] returns when its last user lets go.
    Detached,
    /// It was no longer mounted here (unmounted by someone else).
    NotMounted,
}

/// What every new mount needs of the process, checked and set once: /proc, /dev/fuse, a way
/// to mount (root, or fusermount3), umask 0 (the kernel applies the caller's umask before
/// asking us) and a descriptor limit for the inodes and handles the config allows. Whether
/// the process is root.
fn prepare_daemon(cfg: &MountConfig) -> Result<bool, MountError> {
    if !Path::new("/proc/self/fd").is_dir() {
        return Err(MountError::NoProc);
    }
    let root = sys::is_root();
    if !root && find_in_path("fusermount3").is_none() {
        return Err(MountError::FusermountMissing);
    }
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(MountError::NoDevFuse)?;
    if root && find_in_path("fusermount3").is_none() {
        tracing::warn!("fusermount3 not found: mounting directly as root, but `fusermount3 -u` will not be available");
    }
    sys::set_umask(0);
    raise_descriptors_for(cfg);
    Ok(root)
}

/// Raise the open-descriptor limit for `cfg` (an inode the kernel knows holds one descriptor,
/// an open file up to three). A root without CAP_SYS_RESOURCE (a container) cannot raise the
/// hard limit. The limit in force. The mount does it; a daemon calls it first, before the
/// tiers it builds size their own share of the limit.
pub fn raise_descriptors_for(cfg: &MountConfig) -> u64 {
    let want = cfg.max_inodes.saturating_add(cfg.max_open_handles.saturating_mul(3)).saturating_add(1024);
    let nofile = sys::raise_nofile(want);
    tracing::debug!("open descriptor limit {nofile}");
    nofile
}

/// Fit the inode table to the descriptor limit in force: where the limit is below
/// `mount.max_inodes`, hold descriptors for at most a quarter of it and reopen the other
/// inodes by file handle (`inode.rs`); where that cannot be done (a mount of several
/// branches, no CAP_DAC_READ_SEARCH, a file system without handles), warn: past the limit,
/// the kernel's lookups and creates get EMFILE ("Too many open files") from the daemon.
fn fit_descriptors(inodes: &inode::InodeTable, cfg: &MountConfig, union: bool) {
    let nofile = farcache_engine::descriptors::limit();
    if nofile >= cfg.max_inodes {
        return;
    }
    let budget = farcache_engine::descriptors::share_of(nofile);
    let why_not = if union {
        "a mount of several branches holds every descriptor".to_string()
    } else {
        match inodes.let_go_of_idle(budget) {
            Ok(()) => {
                tracing::info!(
                    "the daemon may hold {nofile} open descriptors (RLIMIT_NOFILE, below mount.max_inodes = {}): it \
                     holds them for at most {budget} of the files and directories the kernel keeps known and reopens \
                     the others by file handle. Raising the hard limit (LimitNOFILE=1048576, as \
                     etc/systemd/farcache-mount@.service sets) saves those reopens",
                    cfg.max_inodes
                );
                return;
            }
            Err(e) => format!("file handles do not work here ({e}; they need CAP_DAC_READ_SEARCH)"),
        }
    };
    tracing::warn!(
        "the daemon may hold {nofile} open descriptors (RLIMIT_NOFILE; raising the hard limit needs \
         CAP_SYS_RESOURCE) and {why_not}: one per file or directory the kernel keeps known, so past about \
         {nofile} of them creates and lookups fail with 'Too many open files'. Raise the hard limit \
         (LimitNOFILE=1048576, as etc/systemd/farcache-mount@.service sets; `ulimit -Hn` before starting), or \
         lower mount.max_inodes ({}) to what it allows",
        cfg.max_inodes
    );
}

impl Mount {
    /// Check everything that can be checked, then mount `backing` on `mountpoint`.
    ///
    /// Side effects on the process, which is expected to be the mount daemon: the umask
    /// becomes 0 (the kernel applies the caller's umask before asking us) and the
    /// open-descriptor limit is raised (each inode the kernel knows holds a descriptor).
    pub fn new(
        backing: &Path,
        mountpoint: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
        journal: &Path,
    ) -> Result<Mount, MountError> {
        cfg.validate()?;
        let backing = check_dir(backing, MountError::BackingMissing, MountError::BackingNotDir)?;
        let mountpoint = check_dir(mountpoint, MountError::MountpointMissing, MountError::MountpointNotDir)?;
        if mountpoint != backing && mountpoint.starts_with(&backing) {
            return Err(MountError::MountpointInsideBacking { mountpoint, backing });
        }
        let root = prepare_daemon(cfg)?;

        // The backing root is opened before mounting, so even a mount on top of the backing
        // directory itself reaches the files underneath.
        let mut fs = fs::Passthrough::new(&backing, cfg, data, 0)
            .map_err(|source| MountError::BackingOpen { path: backing.clone(), source })?;
        fit_descriptors(&fs.inodes, cfg, false);
        // A new connection: its request numbers start again, so the journal starts empty.
        fs.journal = open_journal(journal, 0, true);
        let journal = fs.journal.clone();
        let slot = fs.handover.clone();
        let keeper = fs.keeper.clone();
        let why_not = transport::plan(cfg)?;
        let fc = fuser_config(&backing, cfg, root, why_not.is_none());
        let (ops, inodes) = (fs.ops.clone(), fs.inodes.clone());
        let kernel_passthrough = fs.kernel_passthrough.clone();
        let session = fuser::Session::new(fs, &mountpoint, &fc)
            .map_err(|source| MountError::Mount { mountpoint: mountpoint.clone(), source })?;
        let transport = Transport::negotiated(cfg, why_not, session.uring_stats())?
            .with_ops(ops)
            .with_inodes(inodes)
            .with_kernel_passthrough(kernel_passthrough);
        // Not stat(2): that would ask the file system, which serves nothing before `run`.
        let dev = mounted_dev(&mountpoint).ok_or_else(|| MountError::Mount {
            mountpoint: mountpoint.clone(),
            source: io::Error::other("mounted, but not found in /proc/self/mountinfo"),
        })?;
        if let Some(j) = &journal {
            j.set_conn(dev);
        }
        tracing::info!(
            "mounted {} on {}: {} threads, backing reads {}, requests by {}",
            backing.display(),
            mountpoint.display(),
            cfg.threads,
            if cfg.direct_io_backing { "direct (O_DIRECT where supported)" } else { "buffered" },
            transport.describe()
        );
        let mut m = Mount::serve(session, mountpoint, dev, cfg, Vec::new(), (slot, keeper), Vec::new(), 0)?;
        m.transport = transport;
        Ok(m)
    }

    /// Check everything that can be checked, then mount the union of `branches` (two or more
    /// backing directories, each its own file system; `crate::union` has the rules) on
    /// `mountpoint`. One branch is [`Mount::new`]. Moves a crash interrupted are finished
    /// first. Side effects as [`Mount::new`]. `journal`: the intent journal (`journal.rs`).
    pub fn with_branches(
        branches: &[PathBuf],
        mountpoint: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
        journal: &Path,
    ) -> Result<Mount, MountError> {
        match branches {
            [] => return Err(MountError::BackingMissing(PathBuf::new())),
            [one] => return Mount::new(one, mountpoint, cfg, data, journal),
            _ => {}
        }
        cfg.validate()?;
        let opened = union::OpenUnion::open(branches, cfg)?;
        Mount::with_union(opened, mountpoint, cfg, data, journal)
    }

    /// [`Mount::with_branches`] of a union opened already ([`union::OpenUnion::open`]: a
    /// write-back tier in front of it had to find its files after the union's journal was
    /// replayed, before the mount serves).
    pub fn with_union(
        opened: union::OpenUnion,
        mountpoint: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
        journal: &Path,
    ) -> Result<Mount, MountError> {
        cfg.validate()?;
        if cfg.kernel_passthrough {
            // A move replaces the file under its open handles, which passthrough would keep
            // writing to the old copy.
            return Err(MountError::UnionUnsupported { what: "mount.kernel_passthrough" });
        }
        let union::OpenUnion { u, canon } = opened;
        let mountpoint = check_dir(mountpoint, MountError::MountpointMissing, MountError::MountpointNotDir)?;
        if let Some(b) = canon.iter().find(|b| mountpoint != **b && mountpoint.starts_with(b)) {
            return Err(MountError::MountpointInsideBacking { mountpoint, backing: b.clone() });
        }
        let root = prepare_daemon(cfg)?;
        let mut fs = fs::Passthrough::new(&canon[0], cfg, data.clone(), 0)
            .map_err(|source| MountError::BackingOpen { path: canon[0].clone(), source })?;
        fs.union = Some(u.clone());
        fit_descriptors(&fs.inodes, cfg, true);
        // A new connection: its request numbers start again, so the journal starts empty.
        fs.journal = open_journal(journal, 0, true);
        let journal = fs.journal.clone();
        let handle =
            union::UnionHandle::new(u, fs.inodes.clone(), fs.files.clone(), data, fs.backing_opts, fs.keeper.clone());
        let slot = fs.handover.clone();
        let keeper = fs.keeper.clone();
        let joined: Vec<String> = canon.iter().map(|b| b.display().to_string()).collect();
        let why_not = transport::plan(cfg)?;
        let fc = fuser_config(Path::new(&joined.join(":")), cfg, root, why_not.is_none());
        let (ops, inodes) = (fs.ops.clone(), fs.inodes.clone());
        let session = fuser::Session::new(fs, &mountpoint, &fc)
            .map_err(|source| MountError::Mount { mountpoint: mountpoint.clone(), source })?;
        let transport = Transport::negotiated(cfg, why_not, session.uring_stats())?.with_ops(ops).with_inodes(inodes);
        let dev = mounted_dev(&mountpoint).ok_or_else(|| MountError::Mount {
            mountpoint: mountpoint.clone(),
            source: io::Error::other("mounted, but not found in /proc/self/mountinfo"),
        })?;
        if let Some(j) = &journal {
            j.set_conn(dev);
        }
        tracing::info!(
            "mounted {} branches ({}) on {}: {} threads, new files placed by {:?}",
            canon.len(),
            joined.join(", "),
            mountpoint.display(),
            cfg.threads,
            cfg.create_policy
        );
        tracing::info!("requests by {}", transport.describe());
        let mut m = Mount::serve(session, mountpoint, dev, cfg, Vec::new(), (slot, keeper), Vec::new(), 0)?;
        m.union = Some(handle);
        m.transport = transport;
        Ok(m)
    }

    /// A mount of several branches: balance and union counters.
    pub fn union(&self) -> Option<union::UnionHandle> {
        self.union.clone()
    }

    /// Serve a connection another daemon mounted and initialized, handed over with its
    /// state (`farcache mount --takeover`, or a restart by the supervisor). With `resend`,
    /// the kernel is asked to queue again every request the earlier daemon had read and
    /// not answered (it died). `mountpoint` must be canonical already (resolving it now
    /// would ask the file system, which nobody serves). Checks the mount is still there;
    /// the caller has checked
    /// that `cfg` agrees with the earlier daemon's on [`INIT_KEYS`].
    ///
    /// `branches`: the backing directory, or a union's branches (as the earlier daemon had
    /// them: the CLI checks they are the same). A union is opened as [`Mount::with_branches`]
    /// opens it — moves a crash interrupted are finished — before anything is served; its
    /// files' node ids (farcache ids) and the synthetic ones of its other inodes are resolved
    /// only from the descriptors handed over (`takeover.rs`).
    ///
    /// `opened`: the union opened already ([`union::OpenUnion::open`], with the same
    /// branches), for a write-back tier that had to find its files before the mount serves.
    #[allow(clippy::too_many_arguments)]
    pub fn adopt(
        branches: &[PathBuf],
        mountpoint: &Path,
        cfg: &MountConfig,
        data: Arc<dyn DataPath>,
        h: Handover,
        resend: bool,
        journal: &Path,
        opened: Option<union::OpenUnion>,
    ) -> Result<Mount, MountError> {
        cfg.validate()?;
        if cfg.kernel_passthrough {
            return Err(MountError::KernelPassthrough {
                problem: "a connection handed to another daemon cannot serve files in passthrough (the backing ids \
                          of the files open through the earlier daemon are not known to the next)"
                    .into(),
                fix: "set mount.kernel_passthrough = false to use --supervise or --takeover".into(),
            });
        }
        if branches.is_empty() {
            return Err(MountError::BackingMissing(PathBuf::new()));
        }
        let mut canon = Vec::with_capacity(branches.len());
        for b in branches {
            canon.push(check_dir(b, MountError::BackingMissing, MountError::BackingNotDir)?);
        }
        let backing = canon[0].clone();
        // Not canonicalize(2): the last component is the mount, which nobody serves now.
        let mountpoint = mountpoint.to_path_buf();
        let dev = mounted_dev(&mountpoint).filter(|d| *d == h.state.dev).ok_or_else(|| MountError::Mount {
            mountpoint: mountpoint.clone(),
            source: io::Error::other("the handed-over FUSE connection is no longer mounted there"),
        })?;
        close_files_on(&mountpoint);
        let root = sys::is_root();
        sys::set_umask(0);
        raise_descriptors_for(cfg);
        let incarnation = h.state.incarnation.wrapping_add(1) & 0xff_ffff;
        let u = match (opened, canon.len()) {
            (Some(o), _) => Some(o.u),
            (None, 1) => None,
            (None, _) => Some(Arc::new(union::Union::open(&canon, cfg.create_policy)?)),
        };
        let mut fs = fs::Passthrough::new(&backing, cfg, data.clone(), incarnation)
            .map_err(|source| MountError::BackingOpen { path: backing.clone(), source })?;
        fit_descriptors(&fs.inodes, cfg, u.is_some());
        let root_inode = fs.inodes.get(inode::ROOT_ID).expect("the root is always there");
        let root_fd = root_inode.fd().map_err(|source| MountError::BackingOpen { path: backing.clone(), source })?;
        fs.resolver = Some(takeover::Resolver::new(&h.state, root_fd.as_fd(), u.is_some()));
        fs.inodes.reserve_synthetic(h.state.next_synthetic.max(inode::InodeTable::synthetic_start(incarnation)));
        takeover::adopt_kept(&fs.inodes, &h.state, &h.keep, u.as_deref());
        let handle = u.map(|u| {
            fs.union = Some(u.clone());
            union::UnionHandle::new(u, fs.inodes.clone(), fs.files.clone(), data, fs.backing_opts, fs.keeper.clone())
        });
        let backing = PathBuf::from(canon.iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(":"));
        // Before the kernel resends anything: the records the earlier daemon left decide
        // how a resent operation on names is answered.
        fs.journal = open_journal(journal, h.state.dev, false);
        let slot = (fs.handover.clone(), fs.keeper.clone());
        // Read loops always: a connection that used rings is never handed over (the CLI
        // refuses it, and so does the running daemon).
        let fc = fuser_config(&backing, cfg, root, false);
        let acl = fc.acl;
        let main = sys::dup(h.fuse.as_fd())
            .map_err(|source| MountError::Session { mountpoint: mountpoint.clone(), source })?;
        let (ops, inodes) = (fs.ops.clone(), fs.inodes.clone());
        let session = fuser::Session::from_initialized_fd(fs, main, acl, fc);
        if resend {
            if let Err(e) = sys::notify_resend(h.fuse.as_fd()) {
                tracing::warn!(
                    "the kernel refused FUSE_NOTIFY_RESEND ({e}; Linux 6.9+ has it): requests the earlier daemon had \
                     read and not answered will not be answered"
                );
            }
        }
        tracing::info!(
            "took over the FUSE connection of {} on {} (incarnation {incarnation}, {} inodes known to the kernel{})",
            backing.display(),
            mountpoint.display(),
            h.state.nodes.len(),
            if resend { ", unanswered requests resent" } else { "" }
        );
        let mut m = Mount::serve(session, mountpoint, dev, cfg, h.workers, slot, h.keep, incarnation)?;
        m.transport = Transport::read_loops(cfg, "a taken-over connection is served by read loops")
            .with_ops(ops)
            .with_inodes(inodes);
        m.union = handle;
        Ok(m)
    }

    #[allow(clippy::too_many_arguments)] // one private constructor for both entry points
    /// Give the session its worker descriptors (those handed over, then new clones) and a
    /// stopper, keeping copies of all for a later handover.
    fn serve(
        mut session: fuser::Session<fs::Passthrough>,
        mountpoint: PathBuf,
        dev: u64,
        cfg: &MountConfig,
        mut workers: Vec<OwnedFd>,
        (slot, keeper): (HandoverSlot, KeeperSlot),
        kept: Vec<OwnedFd>,
        incarnation: u32,
    ) -> Result<Mount, MountError> {
        let err = |source| MountError::Session { mountpoint: mountpoint.clone(), source };
        let fuse = sys::dup(session.as_fd()).map_err(err)?;
        let want = (cfg.threads as usize).saturating_sub(1);
        workers.truncate(want);
        while workers.len() < want {
            workers.push(sys::clone_fuse_fd(fuse.as_fd()).map_err(err)?);
        }
        let given = workers.iter().map(|w| sys::dup(w.as_fd())).collect::<io::Result<Vec<_>>>().map_err(err)?;
        session.set_worker_fds(given);
        let stopper = session.stopper().map_err(err)?;
        Ok(Mount {
            session,
            mountpoint,
            dev,
            fuse,
            workers,
            stopper,
            slot,
            keeper,
            _kept: kept,
            incarnation,
            union: None,
            transport: Transport::read_loops(cfg, ""),
            max_request: max_request(cfg),
            read_ahead: ReadAhead::new(dev, cfg.read_ahead.bytes()),
        })
    }

    /// Never unmount when this process ends (a supervisor restarts the daemon on the live
    /// connection); [`Unmounter::unmount`] still unmounts.
    pub fn keep_mounted_on_drop(&mut self) {
        self.session.unmount_callable().disarm();
    }

    /// Fault in (and lock, as root) each serving thread's request buffer, as much of it as
    /// the largest request can fill, before the thread reads its first request: for a
    /// daemon whose death the mount survives (`--supervise`). The kernel copies a request
    /// into the daemon's buffer as part of `read(2)`; where a page of that buffer is not
    /// present yet, it faults it in, and that fails when a SIGKILL is pending — the kernel
    /// then ends the request with `EIO` to the application (`fuse_dev_do_read`) instead of
    /// leaving it for the next daemon to answer. The buffers are fresh in each daemon, and
    /// the first write request a thread reads is the first to reach past its first page, so
    /// a SIGKILL in that instant was an `EIO` for an application's write. Costs
    /// `threads` × (`max_write` + 4 KiB) of memory (32 MiB by default) from the start.
    pub fn prefault_request_buffers(&mut self) {
        self.session.prefault_read_buffers(self.max_request);
    }

    /// Be told of inodes the kernel knows that lose their last name, and of their forgetting
    /// (a supervisor keeps them alive across a crash: `cmd/supervise.rs`).
    pub fn set_keeper(&self, k: Keeper) {
        *self.keeper.0.write() = Some(k);
        // A union's file whose interrupted move this daemon settled at start is served from
        // the copy replay kept, which the keeper may not hold (it held the other).
        if let Some(h) = &self.union {
            for (id, _, _) in &h.u.replayed {
                if let Some(i) = h.inodes.get(*id) {
                    if let Ok(fd) = i.fd() {
                        self.keeper.tell(Kept::Known { nodeid: *id, fd: fd.as_fd() });
                    }
                }
            }
        }
    }

    /// A handle that stops the session for a handover.
    pub fn handle(&mut self) -> MountHandle {
        MountHandle {
            stopper: self.stopper.clone(),
            unmounter: Arc::new(parking_lot::Mutex::new(self.session.unmount_callable())),
            slot: self.slot.clone(),
            union: self.union.clone(),
        }
    }

    /// Copies of the connection's descriptors and the state so far (no inodes: what a
    /// supervisor keeps, to restart a daemon that dies). `incarnation` is this daemon's.
    pub fn deposit(&self) -> io::Result<Handover> {
        Ok(Handover {
            fuse: sys::dup(self.fuse.as_fd())?,
            workers: self.workers.iter().map(|w| sys::dup(w.as_fd())).collect::<io::Result<_>>()?,
            keep: Vec::new(),
            state: HandoverState {
                protocol: TAKEOVER_PROTOCOL,
                dev: self.dev,
                incarnation: self.incarnation,
                workers: self.workers.len(),
                next_synthetic: 1 << 63,
                ..HandoverState::default()
            },
        })
    }
}

/// The largest request the kernel sends on a connection of `cfg`: a write of `max_write`, or a
/// `setxattr` of the largest value (64 KiB), with its headers and a name (within 4 KiB).
pub(crate) fn max_request(cfg: &MountConfig) -> usize {
    const XATTR_SIZE_MAX: usize = 64 * 1024;
    (cfg.max_write.bytes() as usize).max(XATTR_SIZE_MAX) + 4096
}

fn fuser_config(backing: &Path, cfg: &MountConfig, root: bool, rings: bool) -> fuser::Config {
    let mut fc = fuser::Config::default();
    fc.mount_options = vec![
        MountOption::FSName(format!("farcache:{}", backing.display())),
        MountOption::Subtype("farcache".into()),
        MountOption::DefaultPermissions,
    ];
    if cfg.allow_other && root {
        fc.acl = SessionACL::All;
    }
    fc.n_threads = Some(cfg.threads as usize);
    fc.clone_fd = true;
    if rings {
        fc.uring = Some(fuser::UringConfig { queue_depth: cfg.fuse_uring_queue_depth as usize });
    }
    fc
}

impl Mount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// How requests reach this daemon; its counters move while the mount serves.
    pub fn transport(&self) -> Transport {
        self.transport.clone().with_read_ahead(self.read_ahead.clone())
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter { inner: self.session.unmount_callable(), mountpoint: self.mountpoint.clone(), dev: self.dev }
    }

    /// Serve requests until the file system is unmounted.
    ///
    /// Known fuser 0.18.0 issue: when someone else unmounts (`fusermount3 -u`), the session's
    /// teardown still calls umount(2) on the mount point (its is-still-mounted check is
    /// inverted; fixed upstream in fuser PR #703, not yet released). That fails with EINVAL
    /// and logs a harmless warning — unless a new file system was mounted on the same path
    /// in the microseconds in between. Restart scripts should wait for the old daemon to exit
    /// before mounting again. Unmounting through [`Unmounter`] avoids it.
    pub fn run(self) -> Result<Ended, MountError> {
        let mountpoint = self.mountpoint.clone();
        let Mount { session, fuse, workers, slot, dev, read_ahead, .. } = self;
        read_ahead.apply_if_wanted();
        match session.run() {
            Ok(()) if slot.armed.load(Ordering::SeqCst) => {
                let (mut state, keep) = slot.taken.lock().take().unwrap_or_default();
                state.dev = dev;
                state.workers = workers.len();
                tracing::info!("stopped serving {} for a handover", mountpoint.display());
                return Ok(Ended::HandedOver(Handover { fuse, workers, keep, state }));
            }
            Ok(()) => {}
            // The kernel tore the connection down: a detached mount whose last user left (seen
            // as ECONNABORTED on Linux 6.18 on some of the cloned device fds), or someone wrote
            // to /sys/fs/fuse/connections/N/abort. Either way the file system is gone and
            // nothing is lost (writes go through to the backing store), so it is an end.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
                tracing::info!(
                    "the kernel closed the FUSE connection on {} (connection aborted)",
                    mountpoint.display()
                );
            }
            Err(source) => return Err(MountError::Session { mountpoint, source }),
        }
        tracing::info!("unmounted {}", mountpoint.display());
        Ok(Ended::Unmounted)
    }
}

impl Unmounter {
    /// Unmount; if the mount is busy, detach it (lazy unmount).
    pub fn unmount(&mut self) -> io::Result<Unmounted> {
        // Only what is still ours: the top-most mount on the mount point must be this one.
        if mounted_dev(&self.mountpoint) != Some(self.dev) {
            return Ok(Unmounted::NotMounted);
        }
        match self.inner.unmount() {
            // A taken-over session has no record of the mount in fuser: unmount by path.
            Ok(()) if mounted_dev(&self.mountpoint) == Some(self.dev) => self.unmount_by_path(),
            Ok(()) => Ok(Unmounted::Done),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                let c = CString::new(self.mountpoint.as_os_str().as_bytes()).map_err(|_| sys::err(libc::EINVAL))?;
                // SAFETY: plain syscall with a NUL-terminated path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
                    Ok(Unmounted::Detached)
                } else {
                    Err(io::Error::last_os_error())
                }
            }
            Err(e) => Err(e),
        }
    }
}

impl Unmounter {
    fn unmount_by_path(&self) -> io::Result<Unmounted> {
        let c = CString::new(self.mountpoint.as_os_str().as_bytes()).map_err(|_| sys::err(libc::EINVAL))?;
        if !sys::is_root() {
            let st = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mountpoint).status()?;
            return if st.success() {
                Ok(Unmounted::Done)
            } else {
                Err(io::Error::other(format!("fusermount3 -u: {st}")))
            };
        }
        // SAFETY: plain syscalls with a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            return Ok(Unmounted::Done);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        // SAFETY: as above.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
            Ok(Unmounted::Detached)
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Close every descriptor this process holds on the mount at `mountpoint` (inherited from
/// whoever started it, e.g. a shell with a file open on the mount): at exit, closing one
/// sends FLUSH to the mount's daemon — this process — which no longer answers, and the exit
/// would hang until the connection is aborted. Found by mount id in /proc/self/fdinfo:
/// fstat(2) could ask the file system, which nobody serves at this point.
fn close_files_on(mountpoint: &Path) {
    let Some(mnt_id) = mount_id(mountpoint) else { return };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    for fd in fds.into_iter().filter(|fd| *fd > 2) {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        let on_mount = info
            .lines()
            .find_map(|l| l.strip_prefix("mnt_id:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|id| id == mnt_id);
        if on_mount {
            tracing::warn!("closing descriptor {fd}, inherited and open on the mount this daemon serves");
            // SAFETY: a descriptor on our own mount that nothing in this process uses.
            unsafe { libc::close(fd) };
        }
    }
}

/// The mount id (first field of /proc/self/mountinfo) of the top-most mount on `mountpoint`.
fn mount_id(mountpoint: &Path) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    info.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let id = f.next()?.parse().ok()?;
            (unescape_mountinfo(f.nth(3)?) == want).then_some(id)
        })
        .next_back()
}

/// The canonical path of an existing directory, or the right error.
fn check_dir(
    p: &Path,
    missing: fn(PathBuf) -> MountError,
    not_dir: fn(PathBuf) -> MountError,
) -> Result<PathBuf, MountError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(p.canonicalize().map_err(|_| missing(p.to_path_buf()))?),
        Ok(_) => Err(not_dir(p.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(missing(p.to_path_buf())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(MountError::Mount {
            mountpoint: p.to_path_buf(),
            source: io::Error::other(format!(
                "{}: a dead FUSE mount is still there (its daemon died); run `fusermount3 -u {}` first",
                e,
                p.display()
            )),
        }),
        Err(e) => Err(MountError::Mount { mountpoint: p.to_path_buf(), source: e }),
    }
}

/// The device (`st_dev`) of the top-most mount on `mountpoint`, from /proc/self/mountinfo
/// (which, unlike stat(2), does not ask the mounted file system).
pub fn mounted_dev(mountpoint: &Path) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        // id parent major:minor root mount-point options ... - fstype source super-options
        let mut f = line.split(' ');
        let (Some(_), Some(_), Some(dev), Some(_), Some(mp)) = (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        if unescape_mountinfo(mp) == want {
            let (maj, min) = dev.split_once(':')?;
            found = Some(libc::makedev(maj.parse().ok()?, min.parse().ok()?));
        }
    }
    found
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn find_in_path(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a supervised daemon faults in per thread covers the largest request the kernel
    /// can copy into the buffer: a write of `max_write` after its two headers (40 + 40
    /// bytes), a setxattr of the largest value (64 KiB) after its headers and a name.
    #[test]
    fn the_prefaulted_request_buffer_holds_the_largest_request() {
        for kib in [4, 64, 128, 1024] {
            let cfg = MountConfig { max_write: farcache_config::ByteSize::kib(kib), ..MountConfig::default() };
            let n = max_request(&cfg);
            assert!(n >= 80 + kib as usize * 1024, "a write of {kib} KiB");
            assert!(n >= 40 + 24 + 256 + 64 * 1024, "a setxattr of 64 KiB, max_write {kib} KiB");
        }
    }

    #[test]
    fn mountinfo_escapes_are_undone_and_the_root_is_found() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b\134c"), b"/tmp/a b\\c");
        assert_eq!(unescape_mountinfo(r"/x\04"), b"/x\\04");
        assert!(mounted_dev(Path::new("/")).is_some());
        assert_eq!(mounted_dev(Path::new("/no/such/mount/point")), None);
    }
}
