//! [`WritebackPath`]: the persistent write-back tier (issue 12, paper 003) as a [`DataPath`]
//! wrapped around another one — a [`crate::cached::CachedPath`] (lenders) or a
//! [`crate::DirectPath`] — so that the tier, the lenders and the disk are one stack behind
//! one seam. The log itself (medium, format, group commit, recovery) is `farcache-tier`.
//!
//! - **Writes** go to the tier as whole 4 KiB blocks (a partial block is read, from the tier
//!   if it is dirty there, else from the path underneath, and merged) and are acknowledged
//!   once the log says they are durable. A write that extends the file first extends the
//!   backing file's size (a metadata change, no data), so that its size is right for
//!   `stat` and for reads. Writes sharing a block are serialised (`ranges.rs`).
//! - **Reads** see the newest data: the blocks dirty in the tier come from the tier, the rest
//!   from the path underneath (page cache, lenders, disk as before). Nothing below answers
//!   for a dirty block.
//! - **fsync** costs nothing more for data in the tier; it reaches the disk only when this
//!   file had something written through since the last one (a full tier, a truncate).
//! - **Truncate** (`set_len`): the backing file first (and, unless the tier is `dram`, synced),
//!   then a trim record; recovery never replays a record past the new size, and never needs
//!   to redo the truncate (room for the trim is made before the backing changes). **Unlink**
//!   (`forget`): nothing is dropped yet — open handles still read the newest data. Once the
//!   kernel has forgotten the nameless file too (`discard`: no process has it open), its
//!   records are dropped, never written back: a short-lived file costs the disk nothing
//!   (paper 003's small-file gain). A crash before that writes them back to the unlinked
//!   inode, or finds it gone at restart. **Rename**: nothing; the
//!   name in the log finds the file by its handle. **fallocate** that changes contents: the
//!   file's dirty blocks are written back, synced and dropped (through that point) first.
//! - **A full tier** writes through: a write that touches no dirty block goes to the path
//!   underneath; one that does takes the reserve, and if even that is gone, the file's dirty
//!   blocks are written back first (bounded by that file's dirty bytes, never a wait for
//!   room). A broken medium does the same for every write.
//! - **Destage** (`destage.rs`): a thread writes dirty blocks back through the path
//!   underneath — so the lenders' index invalidates what it held of them, as for any write —
//!   sorted and merged, then fdatasyncs each file, and only then frees the log through that
//!   point. Starts at the high watermark, stops at the low one, also by age and past an
//!   absolute cap; an error keeps the data dirty and retries with back-off, loudly.
//! - **Recovery** (`open`): the log is scanned and the file of every record found (`name.rs`).
//!   Where the backing file system reports inode generations, the identities match the FUSE
//!   layer's, so the files are served from the tier at once and the destager writes them back
//!   first thing; otherwise everything is written back before the mount serves anything.
//! - A mark on the backing root (`marker.rs`: an extended attribute) says a tier may hold
//!   data the backing lacks: a mount without the tier refuses to start over it.
//! - **A union** (several backing branches, [`WritebackPath::open_union`]): files are keyed
//!   by their farcache id ([`FileId::union`]), which a move between branches keeps, named in
//!   the log by id (and found again by it: `name.rs`), every branch marked. A move
//!   ([`DataPath::copy_read_held`], [`DataPath::copy_read`]) takes the file's dirty blocks
//!   from here, not the disk — they
//!   are not written back first —, declares the copy before the switch
//!   ([`DataPath::moving`]: whichever copy a crash leaves, recovery finds it), and at the
//!   switch ([`DataPath::moved`]) the tier's own descriptor is made to refer to the copy, so
//!   destaging follows the file to its branch.
//!
//! - **Descriptors**: the tier writes back through a read-write descriptor of its own per
//!   file, held while in use and let go of (least recently used first) once the tier holds
//!   more than `tier.max_open_files`; it is opened again from the writer's file, or by the
//!   file's name (`name.rs`: its handle) to write it back — a file gone by then has its
//!   records dropped, one that cannot be opened now stays dirty and the round is retried.
//!   Files of a union, unlinked files and backings without working handles keep theirs.
//!
//! Locks, and what they are held across: the `files`/`keys` maps and the log's index only
//! for lookups (never across I/O). A write holds its blocks (`ranges.rs`: the ranges of its
//! file that writes in flight hold) across its partial-block read and its append to the log,
//! as a kernel holds a page lock across a read-modify-write: two writes sharing a block are
//! ordered, writes to other blocks (of the file or of others) do not wait. The log's commit
//! lock is the group commit itself (one leader writes and flushes for everyone queued). A
//! file's `meta` lock is held by the destager across that file's write-back and sync, so a
//! truncate or content-changing fallocate of the same file waits for it (bounded by that
//! file's dirty data); reads and writes never take it.

mod config;
mod destage;
pub mod marker;
pub mod name;
mod ranges;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use farcache_tier::{Append, AppendError, Entry, FileKey, Log, LogStats, Mode, Page, Recovered};
use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

pub use config::{TierCommit, TierConfig, TierMode, TEMPLATE};
pub use destage::FlushError;

use crate::backing::{BackingFile, BackingOptions};
use crate::data_path::{CopyRead, DataPath};
use crate::descriptors::DescriptorBudget;
use crate::identity::FileId;

const B: u64 = farcache_tier::PAGE_BYTES as u64;
/// Most requests below the tier one copy read makes (runs of blocks the tier
/// does not hold); past it, one request spans them all.
const COPY_RUNS: usize = 8;

/// A file the tier holds (or may hold) blocks of.
pub(crate) struct FileEntry {
    key: FileKey,
    /// The backing file's identity.
    id: FileId,
    /// Its name as declared in the log (changes once, when the file is unlinked).
    name: Mutex<Arc<[u8]>>,
    /// Read-write descriptor of the backing file (the tier's own), for merging partial
    /// blocks and for destaging — held while in use, let go of when idle and the tier holds
    /// more than its budget ([`Shared::rw`], [`Shared::let_go`]): a tier with many dirty
    /// files must not hold a descriptor for each (30,000 files ran the daemon out of them).
    /// Users hold a clone; only one nobody else holds (a strong count of 1) is let go of.
    rw: Mutex<Option<Arc<BackingFile>>>,
    /// Never let go of `rw`: it could not be opened again by the file's name (a file of a
    /// union, whose moves make it another inode; an unlinked file, which lives only while
    /// open; a backing where handles do not work).
    pinned: AtomicBool,
    /// When `rw` was last handed out (the tier's clock, [`Shared::tick`]): least recently
    /// used first.
    used: AtomicU64,
    /// The tier's descriptor budget ([`Shared::descriptors`]): one less held once this goes.
    descriptors: Arc<DescriptorBudget>,
    /// Serialises destaging this file with its truncates and fallocates.
    meta: Mutex<()>,
    /// Serialises extending the backing file's size (a smaller extension never undoes a
    /// larger one).
    size: Mutex<()>,
    /// Something of this file went to the backing store since its last fsync.
    unsynced: AtomicBool,
    /// The sequential run its writes are in (`tier.sequential_cutoff`).
    stream: Mutex<Stream>,
    /// The blocks writes in flight hold (`ranges.rs`).
    writing: ranges::Ranges,
}

impl FileEntry {
    /// The entry of file `key`, named `name`, written back through `rw` (counted in
    /// `held`); `unsynced`: its first fsync must reach the backing store.
    fn new(
        key: FileKey,
        name: Arc<[u8]>,
        rw: BackingFile,
        pinned: bool,
        descriptors: &Arc<DescriptorBudget>,
        unsynced: bool,
    ) -> FileEntry {
        descriptors.count(true);
        FileEntry {
            key,
            id: *rw.id(),
            name: Mutex::new(name),
            rw: Mutex::new(Some(Arc::new(rw))),
            pinned: AtomicBool::new(pinned),
            used: AtomicU64::new(0),
            descriptors: descriptors.clone(),
            meta: Mutex::new(()),
            size: Mutex::new(()),
            unsynced: AtomicBool::new(unsynced),
            stream: Mutex::new(Stream::default()),
            writing: ranges::Ranges::default(),
        }
    }

    /// Its descriptor if the tier holds it now (a pinned entry's always).
    fn held_rw(&self) -> Option<Arc<BackingFile>> {
        self.rw.lock().clone()
    }
}

impl Drop for FileEntry {
    fn drop(&mut self) {
        if self.rw.get_mut().is_some() {
            self.descriptors.count(false);
        }
    }
}

/// A file's sequential run of writes: where the next write would continue it, and the
/// bytes written in it since the file was last synced.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stream {
    next: u64,
    run: u64,
}

impl Stream {
    /// Account a write of `len` bytes at `offset`; true if it continues a run that already
    /// holds at least `cutoff` bytes (0: never).
    fn wrote(&mut self, offset: u64, len: u64, cutoff: u64) -> bool {
        let before = if offset == self.next { self.run } else { 0 };
        self.next = offset + len;
        self.run = before.saturating_add(len);
        cutoff > 0 && before >= cutoff
    }

    /// The file was synced: a run starts again (a writer that syncs often keeps the tier).
    fn synced(&mut self) {
        self.run = 0;
    }
}

/// Counters of the write-back layer (names in docs/METRICS.md, `tier`).
#[derive(Debug, Default)]
pub struct TierCounters {
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub reads_from_tier: AtomicU64,
    pub reads_only_from_tier: AtomicU64,
    pub write_through_full: AtomicU64,
    pub write_through_broken: AtomicU64,
    pub write_through_unnamed: AtomicU64,
    pub write_through_sequential: AtomicU64,
    pub write_through_sequential_bytes: AtomicU64,
    pub file_flushes: AtomicU64,
    pub destage_rounds: AtomicU64,
    pub destage_batches_deep: AtomicU64,
    pub destaged_blocks: AtomicU64,
    pub destaged_bytes: AtomicU64,
    pub destage_errors: AtomicU64,
    pub destage_stalls: AtomicU64,
    pub fsyncs_absorbed: AtomicU64,
    pub discarded_files: AtomicU64,
    pub discarded_blocks: AtomicU64,
    pub commit_fallbacks: AtomicU64,
    pub reopens: AtomicU64,
    pub destage_fs_syncs: AtomicU64,
}

/// The tier as `farcache stats` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierStats {
    pub path: String,
    /// The log: mode, what a write survives, capacity, dirty bytes and records.
    #[serde(flatten)]
    pub log: LogStats,
    pub writes: u64,
    pub write_bytes: u64,
    pub reads_from_tier: u64,
    /// Reads the tier answered whole, without asking the path below.
    #[serde(default)]
    pub reads_only_from_tier: u64,
    pub write_through_full: u64,
    pub write_through_broken: u64,
    pub write_through_unnamed: u64,
    /// Writes that continued a sequential run of at least `sequential_cutoff` bytes without
    /// a sync and touched no dirty block: sent to the backing store as without a tier.
    #[serde(default)]
    pub write_through_sequential: u64,
    #[serde(default)]
    pub write_through_sequential_bytes: u64,
    pub file_flushes: u64,
    pub destage_rounds: u64,
    /// Batches of merged writes sent to the disk all at once because no application I/O
    /// had reached the mount for 10 ms (otherwise four at a time).
    #[serde(default)]
    pub destage_batches_deep: u64,
    pub destaged_blocks: u64,
    pub destaged_bytes: u64,
    pub destage_errors: u64,
    pub last_destage_error: Option<String>,
    /// Destage rounds that waited on the backing store for `tier.stall_warning` (a write or
    /// sync there that did not complete), each counted once.
    #[serde(default)]
    pub destage_stalls: u64,
    /// How long the destage round under way has run, in ms (0: none under way).
    #[serde(default)]
    pub destage_round_ms: u64,
    /// While the round under way is reported stalled: the file it is writing back.
    #[serde(default)]
    pub destage_stalled_on: Option<String>,
    pub fsyncs_absorbed: u64,
    /// Deleted files whose dirty blocks were dropped, never written to the backing store,
    /// and those blocks.
    #[serde(default)]
    pub discarded_files: u64,
    #[serde(default)]
    pub discarded_blocks: u64,
    /// Commits (fsync, O_DSYNC writes) the medium failed, answered by writing the file back
    /// and syncing it on the backing store instead.
    #[serde(default)]
    pub commit_fallbacks: u64,
    /// Descriptors of backing files the tier holds now (for merging partial writes and
    /// destaging), the most it keeps while idle (`tier.max_open_files`), and how often it
    /// opened a file again after letting go of it.
    #[serde(default)]
    pub open_files: u64,
    #[serde(default)]
    pub max_open_files: u64,
    #[serde(default)]
    pub reopens: u64,
    /// Syncs of the backing file system that made several written-back files durable at once
    /// (instead of a flush of each).
    #[serde(default)]
    pub destage_fs_syncs: u64,
    pub recovered: Recovered,
}

/// Why a tier could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TierOpenError {
    #[error(transparent)]
    Tier(#[from] farcache_tier::TierError),
    #[error("tier.path {path}: {problem}; fix: {fix}")]
    Config { path: String, problem: String, fix: String },
}

pub(crate) struct Shared<D: DataPath> {
    inner: D,
    log: Log,
    path: String,
    /// The backing directory (the first branch of a union).
    root: PathBuf,
    /// Every backing directory: the one, or a union's branches.
    roots: Vec<PathBuf>,
    /// A mount of several branches: files are named by their farcache id.
    union: Option<Arc<dyn crate::identity::UnionFiles>>,
    backing_opts: BackingOptions,
    files: Mutex<HashMap<FileId, Arc<FileEntry>>>,
    keys: Mutex<HashMap<FileKey, Arc<FileEntry>>>,
    /// Descriptors the entries hold (`FileEntry::rw`), the most kept while idle, and the
    /// clock of `FileEntry::used`.
    descriptors: Arc<DescriptorBudget>,
    /// The backing root, open for `open_by_handle_at` (reopening a file by its name).
    root_fd: Option<File>,
    /// Whether this backing's handles open its files again (learnt from the first file
    /// named with one): if not, entries are pinned.
    handles: std::sync::OnceLock<bool>,
    cfg: TierConfig,
    /// `cfg.sequential_cutoff` for an ssd tier, 0 for the others: memory takes a stream
    /// faster than the disk (BENCHMARKS.md, session 32).
    sequential_cutoff: u64,
    counters: TierCounters,
    ctl: Mutex<destage::Ctl>,
    /// The destager waits here for work (a kick, a flush asked for, `stop`).
    cv: Condvar,
    /// Flushes wait here for the destager's progress (a round done, an error, `stop`): a
    /// condvar of their own, so that kicking the destager does not wake them.
    done_cv: Condvar,
    /// A kick is pending: the destager has not yet looked for work since. While it is set,
    /// a kick costs one atomic swap and no wake-up (a writer past the high watermark kicks
    /// on every write).
    kicked: AtomicBool,
    /// The application I/O count last seen and since when it has not moved
    /// (`destage::quiet_for`).
    quiet: Mutex<(u64, std::time::Instant)>,
    recovered: Recovered,
    /// Set by `shutdown`: writes go through.
    closing: AtomicBool,
    /// An exclusive `flock` on the tier's path: one user at a time (a second mount, or
    /// `farcache tier recover` while a mount runs, is refused).
    _lock: File,
}

/// The write-back tier in front of `D` (module docs).
pub struct WritebackPath<D: DataPath> {
    shared: Arc<Shared<D>>,
    destager: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The stall watcher ([`destage::watch`]): stopped with the destager.
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The mode `cfg` asks for at `path`.
pub fn resolve_mode(cfg: &TierConfig) -> Result<Mode, TierOpenError> {
    Ok(match cfg.mode {
        TierMode::Auto => farcache_tier::detect(Path::new(&cfg.path))?,
        TierMode::Dram => Mode::Dram,
        TierMode::Ssd => Mode::Ssd,
        TierMode::Pmem => Mode::Pmem,
    })
}

impl<D: DataPath> WritebackPath<D> {
    /// Open (or make) the tier of `cfg` for the backing directory `root` in front of
    /// `inner`, recover what it holds into the backing files, and start destaging. Writes
    /// the backing root's marker. `root` must be canonical.
    pub fn open(inner: D, cfg: &TierConfig, root: &Path, backing_opts: BackingOptions) -> Result<Self, TierOpenError> {
        Self::open_waiting(inner, cfg, root, backing_opts, std::time::Duration::ZERO)
    }

    /// [`WritebackPath::open`], waiting up to `wait` for another process to let go of the
    /// tier (a daemon handing its mount over releases it when it exits).
    pub fn open_waiting(
        inner: D,
        cfg: &TierConfig,
        root: &Path,
        backing_opts: BackingOptions,
        wait: std::time::Duration,
    ) -> Result<Self, TierOpenError> {
        Self::open_in(inner, cfg, &[root.to_path_buf()], backing_opts, wait, None)
    }

    /// [`WritebackPath::open`] for a mount of several backing directories (`roots`, canonical,
    /// in the union's order): files are keyed and found again by their farcache id
    /// (`FileId::union`), which a move between branches does not change; a file without one
    /// is written through. `union` must have finished the moves a crash interrupted (its
    /// journal replayed) before this is called: recovery looks for the files where they are.
    /// Every branch is marked.
    pub fn open_union(
        inner: D,
        cfg: &TierConfig,
        roots: &[PathBuf],
        backing_opts: BackingOptions,
        union: Arc<dyn crate::identity::UnionFiles>,
    ) -> Result<Self, TierOpenError> {
        Self::open_in(inner, cfg, roots, backing_opts, std::time::Duration::ZERO, Some(union))
    }

    /// [`WritebackPath::open_union`], waiting up to `wait` for another process to let go of
    /// the tier (a daemon handing its mount over).
    pub fn open_union_waiting(
        inner: D,
        cfg: &TierConfig,
        roots: &[PathBuf],
        backing_opts: BackingOptions,
        union: Arc<dyn crate::identity::UnionFiles>,
        wait: std::time::Duration,
    ) -> Result<Self, TierOpenError> {
        Self::open_in(inner, cfg, roots, backing_opts, wait, Some(union))
    }

    fn open_in(
        inner: D,
        cfg: &TierConfig,
        roots: &[PathBuf],
        backing_opts: BackingOptions,
        wait: std::time::Duration,
        union: Option<Arc<dyn crate::identity::UnionFiles>>,
    ) -> Result<Self, TierOpenError> {
        let root = roots.first().ok_or_else(|| TierOpenError::Config {
            path: cfg.path.clone(),
            problem: "no backing directory".into(),
            fix: "name one".into(),
        })?;
        let mode = resolve_mode(cfg)?;
        let path = Path::new(&cfg.path);
        let size = match std::fs::metadata(path) {
            Ok(m) if m.is_file() && m.len() > 0 => m.len().max(cfg.size.bytes()),
            _ => cfg.size.bytes(),
        };
        // Lazily committed only where a flush costs a device's cache flush.
        let lazy = mode == Mode::Ssd && cfg.commit == TierCommit::Fsync;
        let medium = farcache_tier::medium::open_with(path, mode, size, lazy)?;
        let medium: Box<dyn farcache_tier::Medium> = match inner.io_engine() {
            Some(io) if medium.fd().is_some() => Box::new(EngineMedium { inner: medium, io }),
            _ => medium,
        };
        let lock = lock_tier(path, wait)?;
        // A union's tier belongs to its branches, in order.
        let root_s = roots.iter().map(|r| r.to_string_lossy().into_owned()).collect::<Vec<_>>().join(":");
        let (log, recovered) = Log::open(medium, mode, Some(&root_s))?;
        let log =
            if lazy { log.commit_lazily(cfg.max_unflushed.bytes() / farcache_tier::PAGE_BYTES as u64) } else { log };
        for r in roots {
            marker::write(r, &cfg.path).map_err(|e| TierOpenError::Config {
                path: cfg.path.clone(),
                problem: format!("cannot mark the backing directory ({}): {e}", marker::describe(r)),
                fix: "make the backing root writable".into(),
            })?;
        }
        tracing::info!(
            "write-back tier {} ({mode}: a write acknowledged by it {}), {} bytes; recovered {} records of {} files \
             in {} ms{}",
            cfg.path,
            log.durability(),
            log.capacity_bytes(),
            recovered.records,
            recovered.files,
            recovered.scan_ms,
            if recovered.torn_tail { "; a torn, never acknowledged tail was dropped" } else { "" }
        );
        if mode == Mode::Dram {
            tracing::warn!(
                "tier {} is in RAM (tmpfs): writes acknowledged by it survive the daemon, NOT a power cut or a reboot",
                cfg.path
            );
        }
        let shared = Arc::new(Shared {
            inner,
            log,
            path: cfg.path.clone(),
            root: root.to_path_buf(),
            roots: roots.to_vec(),
            union,
            backing_opts,
            files: Mutex::new(HashMap::new()),
            keys: Mutex::new(HashMap::new()),
            descriptors: Arc::new(DescriptorBudget::new(open_files_budget(cfg.max_open_files))),
            root_fd: name::open_root(root).ok(),
            handles: std::sync::OnceLock::new(),
            cfg: cfg.clone(),
            sequential_cutoff: if mode == Mode::Ssd { cfg.sequential_cutoff.bytes() } else { 0 },
            counters: TierCounters::default(),
            ctl: Mutex::new(destage::Ctl::default()),
            cv: Condvar::new(),
            done_cv: Condvar::new(),
            kicked: AtomicBool::new(false),
            quiet: Mutex::new((0, std::time::Instant::now())),
            recovered,
            closing: AtomicBool::new(false),
            _lock: lock,
        });
        if shared.recovered.records > 0 {
            destage::recover(&shared)?;
        }
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("farcache-destage".into())
            .spawn(move || destage::run(&s))
            .map_err(|e| TierOpenError::Config {
                path: cfg.path.clone(),
                problem: format!("cannot start the destage thread: {e}"),
                fix: "raise the process's thread limit".into(),
            })?;
        let s = shared.clone();
        let watcher =
            std::thread::Builder::new().name("farcache-destage-watch".into()).spawn(move || destage::watch(&s));
        let watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                let path = WritebackPath { shared, destager: Mutex::new(Some(handle)), watcher: Mutex::new(None) };
                drop(path); // stops the destager
                return Err(TierOpenError::Config {
                    path: cfg.path.clone(),
                    problem: format!("cannot start the destage watcher's thread: {e}"),
                    fix: "raise the process's thread limit".into(),
                });
            }
        };
        Ok(WritebackPath { shared, destager: Mutex::new(Some(handle)), watcher: Mutex::new(Some(watcher)) })
    }

    pub fn inner(&self) -> &D {
        &self.shared.inner
    }

    pub fn stats(&self) -> TierStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (destage_round_ms, destage_stalled_on) = destage::round_state(&self.shared);
        TierStats {
            path: self.shared.path.clone(),
            log: self.shared.log.stats(),
            writes: l(&c.writes),
            write_bytes: l(&c.write_bytes),
            reads_from_tier: l(&c.reads_from_tier),
            reads_only_from_tier: l(&c.reads_only_from_tier),
            write_through_full: l(&c.write_through_full),
            write_through_broken: l(&c.write_through_broken),
            write_through_unnamed: l(&c.write_through_unnamed),
            write_through_sequential: l(&c.write_through_sequential),
            write_through_sequential_bytes: l(&c.write_through_sequential_bytes),
            file_flushes: l(&c.file_flushes),
            destage_rounds: l(&c.destage_rounds),
            destage_batches_deep: l(&c.destage_batches_deep),
            destaged_blocks: l(&c.destaged_blocks),
            destaged_bytes: l(&c.destaged_bytes),
            destage_errors: l(&c.destage_errors),
            last_destage_error: self.shared.ctl.lock().last_error.clone(),
            destage_stalls: l(&c.destage_stalls),
            destage_round_ms,
            destage_stalled_on,
            fsyncs_absorbed: l(&c.fsyncs_absorbed),
            discarded_files: l(&c.discarded_files),
            discarded_blocks: l(&c.discarded_blocks),
            commit_fallbacks: l(&c.commit_fallbacks),
            open_files: self.shared.descriptors.held() as u64,
            max_open_files: self.shared.descriptors.budget() as u64,
            reopens: l(&c.reopens),
            destage_fs_syncs: l(&c.destage_fs_syncs),
            recovered: self.shared.recovered.clone(),
        }
    }

    /// Destage everything written before the call and wait (at most `timeout`), reporting
    /// progress through `progress` (dirty bytes left) about once a second. Writes that
    /// arrive meanwhile may stay dirty: a flush beside a steady writer ends.
    pub fn flush(&self, timeout: std::time::Duration, progress: &mut dyn FnMut(u64)) -> Result<(), FlushError> {
        self.flush_through(self.shared.log.last_seq(), timeout, progress)
    }

    /// Destage the records through seq `through` (a [`Self::last_seq`] taken earlier: what
    /// was acknowledged by then) and wait, as [`Self::flush`]. A caller that asks again after
    /// a timeout passes the same `through`, so its flush does not chase later writes.
    pub fn flush_through(
        &self,
        through: u64,
        timeout: std::time::Duration,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), FlushError> {
        destage::flush(&self.shared, Some(through), timeout, progress)
    }

    /// Seq of the newest committed record: every write acknowledged so far is at or below it.
    pub fn last_seq(&self) -> u64 {
        self.shared.log.last_seq()
    }

    /// Destage everything, stop the destager and, if the tier is clean, remove the backing
    /// root's marker (a clean unmount). Writes arriving meanwhile (a detached mount's users)
    /// go through. Returns whether the tier was left clean. Safe to call twice.
    pub fn shutdown(&self, timeout: std::time::Duration) -> bool {
        // From here on writes go through (files that are dirty here are written back first):
        // nothing new becomes dirty after the last flush, so a clean tier stays clean.
        self.shared.closing.store(true, Ordering::SeqCst);
        let r = destage::flush(&self.shared, None, timeout, &mut |left| {
            tracing::info!("tier: destaging before exit, {left} bytes left")
        });
        self.stop_destager(None);
        match r {
            Ok(()) if self.shared.log.is_clean() && !self.shared.log.is_broken() => {
                for r in &self.shared.roots {
                    if let Err(e) = marker::remove(r) {
                        tracing::warn!("tier: clean, but the marker of {} could not be removed: {e}", r.display());
                    }
                }
                tracing::info!("tier {}: everything destaged; the backing directory is complete", self.shared.path);
                true
            }
            Ok(()) => {
                tracing::error!(
                    "tier {}: its medium failed; the backing directory may lack writes it acknowledged before the \
                     failure was noticed: keep the tier file and run `farcache tier recover {} {}`",
                    self.shared.path,
                    self.shared.path,
                    self.shared.root.display()
                );
                false
            }
            Err(e) => {
                tracing::error!(
                    "tier {}: not everything could be destaged ({e}); the data stays in the tier: mount again \
                     with --tier {}, or run `farcache tier recover {} {}`",
                    self.shared.path,
                    self.shared.path,
                    self.shared.path,
                    self.shared.root.display()
                );
                false
            }
        }
    }
}

/// A tier seen from the mount's control socket and exit path, whatever it wraps.
pub trait TierControl: Send + Sync {
    fn stats(&self) -> TierStats;
    /// [`WritebackPath::flush_through`].
    fn flush_through(
        &self,
        through: u64,
        timeout: std::time::Duration,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), FlushError>;
    /// [`WritebackPath::last_seq`].
    fn last_seq(&self) -> u64;
    fn shutdown(&self, timeout: std::time::Duration) -> bool;
    /// Stop destaging, leaving everything dirty in the tier, for a daemon that handed its
    /// mount over and exits: the new one takes the tier (and its lock) once this process is
    /// gone. Waits for the destage round under way (no backing write of it left in flight).
    fn release(&self);
}

impl<D: DataPath> TierControl for WritebackPath<D> {
    fn stats(&self) -> TierStats {
        WritebackPath::stats(self)
    }
    fn flush_through(
        &self,
        through: u64,
        timeout: std::time::Duration,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), FlushError> {
        WritebackPath::flush_through(self, through, timeout, progress)
    }
    fn last_seq(&self) -> u64 {
        WritebackPath::last_seq(self)
    }
    fn shutdown(&self, timeout: std::time::Duration) -> bool {
        WritebackPath::shutdown(self, timeout)
    }
    fn release(&self) {
        self.stop_destager(Some(RELEASE_WAIT));
    }
}

/// How long [`TierControl::release`] waits for the destage round under way (a stalled
/// backing must not keep a daemon that handed its mount over from exiting: the next one
/// waits for the tier longer than this).
pub const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl<D: DataPath> WritebackPath<D> {
    /// Stop the destager once its round under way ends, waiting for that at most `wait`
    /// (`None`: as long as it takes). Past `wait` the thread is left to the process's exit:
    /// what it was writing is in the tier still, and the next daemon writes it again, as
    /// after a crash.
    fn stop_destager(&self, wait: Option<std::time::Duration>) {
        self.shared.ctl.lock().stop = true;
        self.shared.cv.notify_all();
        self.shared.done_cv.notify_all();
        if let Some(w) = self.watcher.lock().take() {
            let _ = w.join(); // it waits on nothing but `done_cv`, just notified
        }
        let Some(h) = self.destager.lock().take() else { return };
        let Some(wait) = wait else {
            let _ = h.join();
            return;
        };
        let deadline = std::time::Instant::now() + wait;
        while !h.is_finished() {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    "tier {}: the destage round under way did not end within {wait:?} (a stalled backing?); exiting \
                     without it — the next daemon writes it back again",
                    self.shared.path
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let _ = h.join();
    }

    /// [`DataPath::copy_read`] and [`DataPath::copy_read_held`]: the tier's dirty blocks
    /// over what `below` reads of the rest (`held`: blocks destaged meanwhile left missing).
    fn copy_over(
        &self,
        file: &BackingFile,
        offset: u64,
        len: usize,
        held: bool,
        below: &dyn Fn(u64, usize) -> io::Result<CopyRead>,
    ) -> io::Result<CopyRead> {
        let s = &self.shared;
        let fe = s.files.lock().get(file.id()).cloned();
        let Some(fe) = fe.filter(|_| len > 0) else { return below(offset, len) };
        let (first, last) = (offset / B, (offset + len as u64 - 1) / B);
        let dirty: HashMap<u64, farcache_tier::Rec> = s.log.dirty_in(fe.key, first, last).into_iter().collect();
        if dirty.is_empty() {
            return below(offset, len);
        }
        // The file's size now (the tier extends it with every write past its end).
        let size = file.file().metadata()?.len();
        let want = (size.saturating_sub(offset)).min(len as u64) as usize;
        let mut out = BytesMut::zeroed(want);
        let mut r = CopyRead::default();
        // Runs of blocks the tier does not hold, as (first, last) block numbers.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for b in first..=last {
            if b * B >= offset + want as u64 {
                break;
            }
            if dirty.contains_key(&b) {
                continue;
            }
            match runs.last_mut() {
                Some((_, l)) if *l + 1 == b => *l = b,
                _ => runs.push((b, b)),
            }
        }
        if runs.len() > COPY_RUNS {
            let (a, z) = (runs[0].0, runs[runs.len() - 1].1);
            runs = vec![(a, z)];
        }
        for (a, z) in runs {
            let at = a * B;
            let n = (((z - a + 1) * B).min(offset + want as u64 - at)) as usize;
            let got = below(at, n)?;
            let o = (at - offset) as usize;
            let m = got.data.len().min(want - o);
            out[o..o + m].copy_from_slice(&got.data[..m]);
            r.cache_blocks += got.cache_blocks;
            r.disk_blocks += got.disk_blocks;
            r.disk_time += got.disk_time;
            r.missing.extend(got.missing);
        }
        // The tier's blocks last: its records are the newest data (one destaged meanwhile
        // was read from below, with the same contents).
        let mut from_tier = 0u64;
        for b in dirty.keys() {
            let Some((page, valid)) = s.log.read_block(fe.key, *b)? else {
                // Destaged since: the disk has it now.
                let at = b * B;
                if at >= offset + want as u64 {
                    continue;
                }
                let n = (B.min(offset + want as u64 - at)) as usize;
                if held {
                    r.missing.push((at, n));
                    continue;
                }
                let t0 = std::time::Instant::now();
                let got = s.inner.read(file, at, n)?;
                r.disk_time += t0.elapsed();
                let o = (at - offset) as usize;
                out[o..o + got.len()].copy_from_slice(&got);
                r.disk_blocks += 1;
                continue;
            };
            let (bs, be) = (b * B, b * B + u64::from(valid));
            let (lo, hi) = (bs.max(offset), be.min(offset + want as u64));
            if lo < hi {
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&page.0[(lo - bs) as usize..(hi - bs) as usize]);
            }
            from_tier += 1;
        }
        r.tier_blocks = from_tier;
        r.cache_blocks += from_tier;
        r.data = out.freeze();
        Ok(r)
    }
}

impl<D: DataPath> Drop for WritebackPath<D> {
    fn drop(&mut self) {
        self.stop_destager(None);
    }
}

impl<D: DataPath> Shared<D> {
    /// The entry of `file`, made on its first write through the tier; `None` if the tier
    /// cannot name or reopen it (its writes then go through).
    fn entry(&self, file: &BackingFile) -> Option<Arc<FileEntry>> {
        if let Some(e) = self.files.lock().get(file.id()) {
            return Some(e.clone());
        }
        // On a union only a file with a farcache id: its records must outlive a move.
        let union_id = file.id().union_id();
        if self.union.is_some() && union_id.is_none() {
            return None;
        }
        let rw = match reopen_rw(file.file()) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!("tier: cannot reopen {:?} read-write ({e}); its writes go through", file.id());
                return None;
            }
        };
        let name = match union_id.filter(|_| self.union.is_some()) {
            Some(id) => name::FileName::of_union(&self.roots, &rw, id),
            None => name::FileName::of(&self.root, &rw, file.id()),
        };
        if name.handle_type.is_none() && name.path.is_empty() {
            return None;
        }
        // Only destaging writes through `rw`: with direct reads on, its aligned merged runs go
        // direct too. The data is in the tier until the fdatasync; a second copy in the
        // backing file's page cache would only cost the copy, the memory (the daemon's cgroup
        // pays for it, and its dirty limit throttled write-back) and a flush later
        // (BENCHMARKS.md, "Session 22: destage").
        let pinned = self.pinned_by(&name);
        let rw = self.own_rw(*file.id(), rw);
        // Unsynced: the first fsync after the tier met the file goes to the backing store:
        // the file itself (a new inode, its size) becomes durable there, which recovery needs
        // to find it after a power cut. Later ones cost nothing.
        let fe =
            FileEntry::new(FileKey(farcache_tier_key()), Arc::from(name.encode()), rw, pinned, &self.descriptors, true);
        fe.used.store(self.descriptors.now(), Ordering::Relaxed);
        let fe = Arc::new(fe);
        let fe = {
            let mut files = self.files.lock();
            let fe = files.entry(*file.id()).or_insert(fe).clone();
            self.keys.lock().insert(fe.key, fe.clone());
            fe
        };
        self.let_go();
        Some(fe)
    }

    /// The tier's own descriptor `rw` of the file `id` as it writes back through it.
    fn own_rw(&self, id: FileId, rw: File) -> BackingFile {
        BackingFile::new(
            id,
            rw,
            libc::O_RDWR,
            &BackingOptions { direct_writes: self.backing_opts.direct_io, ..self.backing_opts },
        )
    }

    /// Whether the entry of a file named `name` must keep its descriptor: a file of a union
    /// (a move between branches makes it another inode, which the tier follows through its
    /// own descriptor, `DataPath::moved`: kept simple, such entries are never let go of), an
    /// unlinked file (it lives only while open), or a backing where this name's handle does
    /// not open the file again (a path alone does not follow a rename).
    fn pinned_by(&self, name: &name::FileName) -> bool {
        if self.union.is_some() || name.unlinked || name.handle_type.is_none() {
            return true;
        }
        let Some(root_fd) = &self.root_fd else { return true };
        if let Some(&ok) = self.handles.get() {
            return !ok;
        }
        match name.handle_opens(root_fd) {
            Some(ok) => {
                if !ok {
                    tracing::warn!(
                        "tier {}: file handles do not open the backing files again (the mount needs \
                         CAP_DAC_READ_SEARCH, and a file system that exports handles): the tier keeps a descriptor \
                         per file it holds data of, whatever tier.max_open_files says",
                        self.path
                    );
                }
                !*self.handles.get_or_init(|| ok)
            }
            None => true,
        }
    }

    /// `fe`'s descriptor, opened again if the tier let go of it: from `from` (the caller's
    /// open file, the same one) if given, else by the file's name (its handle; or its path,
    /// checked against inode and generation). `Ok(None)`: the file is gone (deleted, its
    /// inode freed). The caller holds the returned clone while it uses it: it is not let go
    /// of meanwhile.
    fn rw(&self, fe: &FileEntry, from: Option<&File>) -> io::Result<Option<Arc<BackingFile>>> {
        fe.used.store(self.descriptors.now(), Ordering::Relaxed);
        if let Some(rw) = fe.held_rw() {
            return Ok(Some(rw));
        }
        let f = match from {
            Some(f) => reopen_rw(f)?,
            None => match self.reopen_by_name(fe)? {
                Some(f) => f,
                None => return Ok(None),
            },
        };
        let rw = {
            let mut g = fe.rw.lock();
            match g.as_ref() {
                Some(rw) => rw.clone(), // another thread opened it meanwhile: ours closes
                None => {
                    let rw = Arc::new(self.own_rw(fe.id, f));
                    *g = Some(rw.clone());
                    fe.descriptors.count(true);
                    add(&self.counters.reopens, 1);
                    rw
                }
            }
        };
        self.let_go();
        Ok(Some(rw))
    }

    /// [`Shared::rw`] for the write path, from the caller's open `file` (`fe`'s).
    fn rw_of(&self, fe: &FileEntry, file: &BackingFile) -> io::Result<Arc<BackingFile>> {
        self.rw(fe, Some(file.file()))?.ok_or_else(|| io::Error::other("the tier's file is gone"))
    }

    /// Open `fe`'s file again by its name (`Ok(None)`: gone). The file found must be `fe`'s
    /// inode: never another file's data.
    fn reopen_by_name(&self, fe: &FileEntry) -> io::Result<Option<File>> {
        use std::os::unix::fs::MetadataExt;
        let raw = fe.name.lock().clone();
        let name = name::FileName::decode(&raw)
            .ok_or_else(|| io::Error::other(format!("file key {} has an unreadable name", fe.key.0)))?;
        let root_fd = self.root_fd.as_ref().ok_or_else(|| io::Error::other("the backing root could not be opened"))?;
        let f = match name.reopen(&self.root, root_fd) {
            name::Located::Found(f) => f,
            name::Located::Gone => return Ok(None),
            name::Located::Lost(why) => return Err(io::Error::other(format!("cannot open the file again: {why}"))),
        };
        let md = f.metadata()?;
        if md.ino() != fe.id.ino || md.dev() != fe.id.dev {
            return Err(io::Error::other(format!(
                "opened again by its name, inode {} is not the tier's file (inode {})",
                md.ino(),
                fe.id.ino
            )));
        }
        Ok(Some(f))
    }

    /// Past the budget: let go of the descriptors of the entries used least recently, down to
    /// three quarters of it (a scan of the entries per quarter of the budget reopened), never
    /// of a pinned one nor of one in use (a write's merge or extension, a destage).
    fn let_go(&self) {
        let idle = || {
            let keys = self.keys.lock();
            let idle = keys.values().filter(|fe| !fe.pinned.load(Ordering::Relaxed));
            idle.map(|fe| (fe.used.load(Ordering::Relaxed), fe.clone())).collect()
        };
        self.descriptors.let_go(idle, |fe: &Arc<FileEntry>| {
            let mut g = fe.rw.lock();
            // Pinned since (`forget`), or in use: kept.
            if !fe.pinned.load(Ordering::Relaxed) && g.as_ref().is_some_and(|rw| Arc::strong_count(rw) == 1) {
                *g = None;
                fe.descriptors.count(false);
            }
        });
    }

    /// Keep `fe`'s descriptor from now on (the file was unlinked: it can be opened again only
    /// while someone has it open), opening it again if the tier had let go of it.
    fn pin(&self, fe: &FileEntry) {
        fe.pinned.store(true, Ordering::Relaxed);
        if let Err(e) = self.rw(fe, None) {
            tracing::debug!("tier: cannot open unlinked file key {} again to keep it ({e})", fe.key.0);
        }
    }

    /// `fe`'s file is gone (deleted, its inode freed: `rw` found nothing): its records are
    /// dropped, never written back, as `discard` drops a deleted file's. The caller holds
    /// `fe.meta`.
    pub(crate) fn drop_deleted(&self, fe: &FileEntry) {
        let blocks = self.log.dirty_in(fe.key, 0, u64::MAX).len() as u64;
        if blocks == 0 {
            return;
        }
        let through = self.log.last_seq();
        let drop = Entry::Drop { key: fe.key, through };
        if let Err(e) = self.log.append(Append { entries: vec![drop], names: Vec::new(), reserve: true, lazy: false }) {
            tracing::debug!("tier: dropping deleted file key {} in memory only ({e})", fe.key.0);
            self.log.apply_unlogged(&Entry::Drop { key: fe.key, through });
        }
        add(&self.counters.discarded_files, 1);
        add(&self.counters.discarded_blocks, blocks);
    }

    /// Write `data` at `offset` straight to the path underneath (counted by the caller).
    fn write_through(&self, file: &BackingFile, fe: Option<&FileEntry>, offset: u64, data: &[u8]) -> io::Result<usize> {
        if let Some(fe) = fe {
            fe.unsynced.store(true, Ordering::Relaxed);
        }
        self.inner.write(file, offset, data)
    }

    /// The file's dirty blocks written back and synced, then dropped from the tier (logged,
    /// or — if the log cannot take it — unlogged, loudly).
    fn flush_file(&self, fe: &FileEntry) -> io::Result<()> {
        self.make_meta_room();
        let _m = fe.meta.lock();
        add(&self.counters.file_flushes, 1);
        // Every record of the file up to here is written back (with its newest contents);
        // records a concurrent write adds after this point stay.
        let through = self.log.last_seq();
        destage::write_back_file(self, fe, None)?;
        let drop = Entry::Drop { key: fe.key, through };
        if let Err(e) = self.log.append(Append { entries: vec![drop], names: Vec::new(), reserve: true, lazy: false }) {
            tracing::error!(
                "tier: cannot log that file key {} was written back ({e}); dropped in memory only: until the \
                 tier is next written back whole, a crash could replay its older records over newer data",
                fe.key.0
            );
            self.log.apply_unlogged(&Entry::Drop { key: fe.key, through });
        }
        Ok(())
    }

    /// Make every write the tier acknowledged durable in it (an fsync of `fe`, or an
    /// O_SYNC/O_DSYNC write to it): a flush of the log if lazy writes wait for one. If the
    /// medium fails it, `fe`'s dirty blocks are written back and synced instead (the log is
    /// broken from then on, and later writes go through), so the caller's data is durable
    /// all the same; only a failure of that is an error.
    fn commit(&self, fe: &FileEntry) -> io::Result<()> {
        match self.log.commit() {
            Ok(()) => Ok(()),
            Err(e) => {
                add(&self.counters.commit_fallbacks, 1);
                tracing::error!(
                    "tier {}: cannot make its writes durable ({e}); writing file key {} back to the backing store \
                     and syncing it there instead",
                    self.path,
                    fe.key.0
                );
                // Written back and synced there (`write_back_file` syncs before the drop).
                self.flush_file(fe)
            }
        }
    }

    /// Before a truncate or a file write-back changes the backing file: make sure the trim
    /// or drop that follows fits in the log, waiting (bounded) for a destage round if not.
    /// Never called holding a file's `meta` (the destager takes it).
    fn make_meta_room(&self) {
        if !self.log.meta_room() {
            let _ = destage::flush(self, Some(self.log.last_seq()), std::time::Duration::from_secs(30), &mut |_| {});
        }
    }

    /// Block `b` of the file as it is below the tier (for merging a partial write), read
    /// through the tier's descriptor `rw` (the caller's may be write-only).
    fn read_below(&self, rw: &BackingFile, b: u64) -> io::Result<Bytes> {
        self.inner.read(rw, b * B, B as usize)
    }
}

/// A tier medium on a device (`ssd`) whose many-page reads go down through the mount's I/O
/// engine, in flight together up to its queue depth: the destager reads a file's dirty blocks
/// a run at a time, and blocks written at random lie on pages far apart. Measured (session 29,
/// BENCHMARKS.md): one `O_DIRECT` `pread` after another made the flush of 512 MiB written at
/// random 4 KiB take 8.7-10.2 s on the virtual disk. Everything else goes to the medium.
struct EngineMedium {
    inner: Box<dyn farcache_tier::Medium>,
    io: Arc<crate::IoEngine>,
}

impl farcache_tier::Medium for EngineMedium {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, data)
    }
    fn write_vectored_at(&self, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        self.inner.write_vectored_at(offset, bufs)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn start_writeback(&self) {
        self.inner.start_writeback()
    }
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.fd()
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let Some(fd) = self.inner.fd() else { return self.inner.read_many(reads) };
        let mut ops: Vec<crate::io::Op<'_>> = reads
            .iter_mut()
            .map(|(offset, buf)| {
                // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the kernel writes only
                // initialised bytes into it.
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<std::mem::MaybeUninit<u8>>(), buf.len())
                };
                crate::io::Op::Read { fd, offset: *offset, buf }
            })
            .collect();
        let done = self.io.run(&mut ops);
        drop(ops);
        for ((offset, buf), r) in reads.iter_mut().zip(done) {
            if r? < buf.len() {
                // Short (the tier file is never read past its end): read it again plainly.
                self.inner.read_at(*offset, buf)?;
            }
        }
        Ok(())
    }
}

/// Take the tier's exclusive lock, or say who holds it.
/// An exclusive `flock` on the tier at `path`, waiting up to `wait` (polled every 2 ms) for
/// the process holding it to let go.
fn lock_tier(path: &Path, wait: std::time::Duration) -> Result<File, TierOpenError> {
    let f = File::open(path).map_err(|e| TierOpenError::Config {
        path: path.display().to_string(),
        problem: format!("cannot open it to lock it: {e}"),
        fix: "check the path".into(),
    })?;
    let deadline = std::time::Instant::now() + wait;
    // SAFETY: flock on a descriptor we own.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if std::time::Instant::now() >= deadline {
            return Err(TierOpenError::Config {
                path: path.display().to_string(),
                problem: if wait.is_zero() {
                    "another process uses this tier (a running mount, or `farcache tier recover`)".into()
                } else {
                    format!("the process holding this tier did not let go of it within {wait:?}")
                },
                fix: "stop it first (a running mount: `farcache flush MOUNTPOINT` destages it), or give another tier \
                      path"
                    .into(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(f)
}

/// Whether a process holds the tier at `path` (for `farcache tier status`).
pub fn tier_in_use(path: &Path) -> bool {
    let Ok(f) = File::open(path) else { return false };
    // SAFETY: flock on a descriptor we own; a shared lock taken is released at close.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
}

/// A fresh random file key.
fn farcache_tier_key() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let r = if n == 8 { u64::from_ne_bytes(b) } else { 0 };
    r ^ NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The most descriptors of backing files the tier keeps while idle: `configured`, or (0) a
/// quarter of the process's descriptor limit (its soft limit now), from 64 to 65,536 — the
/// mount's inode table and everything else share the rest.
fn open_files_budget(configured: u64) -> usize {
    if configured > 0 {
        return configured.min(1 << 20) as usize;
    }
    crate::descriptors::share_of(crate::descriptors::limit())
}

fn reopen_rw(f: &File) -> io::Result<File> {
    std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

impl<D: DataPath> DataPath for WritebackPath<D> {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        let s = &self.shared;
        if len == 0 {
            return s.inner.read(file, offset, len);
        }
        let Some(fe) = s.files.lock().get(file.id()).cloned() else { return s.inner.read(file, offset, len) };
        let (first, last) = (offset / B, (offset + len as u64 - 1) / B);
        let dirty = s.log.dirty_in(fe.key, first, last);
        if dirty.is_empty() {
            return s.inner.read(file, offset, len);
        }
        add(&s.counters.reads_from_tier, 1);
        // Every block of the range dirty here, each valid up to where the range needs it: the
        // path below has nothing to add (a block destaged meanwhile is read from it below).
        let end = offset + len as u64;
        let covered = dirty.len() as u64 == last - first + 1
            && dirty.iter().all(|(b, r)| b * B + u64::from(r.valid) >= end.min((b + 1) * B));
        let mut out = if covered {
            add(&s.counters.reads_only_from_tier, 1);
            BytesMut::with_capacity(len)
        } else {
            BytesMut::from(&s.inner.read(file, offset, len)?[..])
        };
        // Block `b`'s newest bytes over the range.
        let mut overlay = |b: u64, data: &[u8]| {
            let (bs, be) = (b * B, b * B + data.len() as u64);
            let (lo, hi) = (bs.max(offset), be.min(offset + len as u64));
            if lo < hi {
                let (at, to) = ((lo - offset) as usize, (hi - offset) as usize);
                if out.len() < to {
                    out.resize(to, 0);
                }
                out[at..to].copy_from_slice(&data[(lo - bs) as usize..(hi - bs) as usize]);
            }
        };
        let blocks: Vec<u64> = dirty.iter().map(|(b, _)| *b).collect();
        // Blocks destaged (or cut) since we looked: the path below has them now.
        let mut gone = Vec::new();
        let mut next = 0;
        s.log.read_blocks(
            fe.key,
            &blocks,
            || usize::MAX,
            |b, data| {
                while blocks[next] != b {
                    gone.push(blocks[next]);
                    next += 1;
                }
                next += 1;
                overlay(b, data);
                true
            },
        )?;
        gone.extend_from_slice(&blocks[next..]);
        for b in gone {
            overlay(b, &s.inner.read(file, b * B, B as usize)?);
        }
        Ok(out.freeze())
    }

    fn after_reply(&self) {
        self.shared.inner.after_reply();
    }

    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        let s = &self.shared;
        if data.is_empty() {
            return s.inner.write(file, offset, data);
        }
        let Some(fe) = s.entry(file) else {
            add(&s.counters.write_through_unnamed, 1);
            return s.inner.write(file, offset, data);
        };
        let closing = s.closing.load(Ordering::SeqCst);
        if (s.log.is_broken() || closing) && !s.log.has_dirty(fe.key) {
            add(&s.counters.write_through_broken, 1);
            return s.write_through(file, Some(&fe), offset, data);
        }
        let end = offset + data.len() as u64;
        let streaming =
            s.sequential_cutoff > 0 && fe.stream.lock().wrote(offset, data.len() as u64, s.sequential_cutoff);
        let (first, last) = (offset / B, (end - 1) / B);
        let _g = fe.writing.hold(first, last);
        let dirty: HashMap<u64, farcache_tier::Rec> = s.log.dirty_in(fe.key, first, last).into_iter().collect();
        if streaming && dirty.is_empty() {
            // A long unsynced stream: the disk takes it as well as the tier would, and the
            // tier would have to write it there again. No older record of these blocks can
            // win at recovery (none is dirty, and the held range keeps it so).
            add(&s.counters.write_through_sequential, 1);
            add(&s.counters.write_through_sequential_bytes, data.len() as u64);
            return s.write_through(file, Some(&fe), offset, data);
        }
        // The size first: stat and reads see it; recovery restores it from the records.
        {
            let _size = fe.size.lock();
            if end > file.file().metadata()?.len() {
                s.inner.set_len(&*s.rw_of(&fe, file)?, end)?;
            }
        }
        let mut entries = Vec::with_capacity((last - first + 1) as usize);
        for b in first..=last {
            let bs = b * B;
            let (lo, hi) = (offset.max(bs) - bs, end.min(bs + B) - bs);
            let src = &data[(bs + lo - offset) as usize..(bs + hi - offset) as usize];
            if lo == 0 && hi == B {
                // A whole block: the new bytes are all of it.
                entries.push(Entry::Data { key: fe.key, block: b, valid: B as u32, page: Page::copied(src) });
                continue;
            }
            // Part of a block: merged with what it held (dirty in the tier, or below).
            let merged = if dirty.contains_key(&b) { s.log.read_block(fe.key, b)? } else { None };
            let (mut page, valid) = match merged {
                Some((p, v)) => (p, hi.max(u64::from(v))),
                None => {
                    let r = s.read_below(&*s.rw_of(&fe, file)?, b)?;
                    (Page::copied(&r), hi.max(r.len() as u64))
                }
            };
            page.0[lo as usize..hi as usize].copy_from_slice(src);
            entries.push(Entry::Data { key: fe.key, block: b, valid: valid as u32, page });
        }
        let name = fe.name.lock().clone();
        // Lazy (the log flushes it with the next commit) unless the log commits every write.
        let append = Append { entries, names: vec![(fe.key, name)], reserve: !dirty.is_empty(), lazy: true };
        let r =
            if closing { Err(AppendError::Broken("the mount is shutting down".into())) } else { s.log.append(append) };
        match r {
            Ok(()) => {
                add(&s.counters.writes, 1);
                add(&s.counters.write_bytes, data.len() as u64);
                s.kick_if_over();
                Ok(data.len())
            }
            Err(e) => {
                let broken = matches!(e, AppendError::Broken(_));
                add(if broken { &s.counters.write_through_broken } else { &s.counters.write_through_full }, 1);
                s.kick();
                if !dirty.is_empty() {
                    // Its older record would win at recovery: write the file back first.
                    s.flush_file(&fe)?;
                }
                s.write_through(file, Some(&fe), offset, data)
            }
        }
    }

    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        let s = &self.shared;
        let Some(fe) = s.files.lock().get(file.id()).cloned() else { return s.inner.set_len(file, size) };
        if s.log.has_dirty(fe.key) {
            s.make_meta_room();
        }
        let _m = fe.meta.lock();
        s.inner.set_len(file, size)?;
        fe.unsynced.store(true, Ordering::Relaxed);
        if s.log.has_dirty(fe.key) {
            // The cut must be durable on the backing before the trim record is: recovery
            // drops the records past it and never truncates again.
            if s.log.mode() != Mode::Dram {
                s.inner.fsync(file, true)?;
            }
            let e = Entry::Trim { key: fe.key, size };
            if let Err(err) = s.log.append(Append { entries: vec![e], names: Vec::new(), reserve: true, lazy: false }) {
                tracing::error!("tier: cannot log a truncate of file key {} ({err}); applied in memory only", fe.key.0);
                s.log.apply_unlogged(&Entry::Trim { key: fe.key, size });
            }
        }
        Ok(())
    }

    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        let s = &self.shared;
        let changes = mode
            & (libc::FALLOC_FL_PUNCH_HOLE
                | libc::FALLOC_FL_ZERO_RANGE
                | libc::FALLOC_FL_COLLAPSE_RANGE
                | libc::FALLOC_FL_INSERT_RANGE)
            != 0;
        if let Some(fe) = s.files.lock().get(file.id()).cloned() {
            fe.unsynced.store(true, Ordering::Relaxed);
            if changes && s.log.has_dirty(fe.key) {
                s.flush_file(&fe)?;
            }
        }
        s.inner.fallocate(file, mode, offset, len)
    }

    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        let s = &self.shared;
        let fe = s.files.lock().get(file.id()).cloned();
        if let Some(fe) = &fe {
            fe.stream.lock().synced();
            s.commit(fe)?;
        }
        match fe {
            Some(fe) if !fe.unsynced.swap(false, Ordering::Relaxed) => {
                // Everything written since the last sync is durable in the tier already.
                add(&s.counters.fsyncs_absorbed, 1);
                Ok(())
            }
            _ => s.inner.fsync(file, datasync),
        }
    }

    fn sync_writes(&self, file: &BackingFile) -> io::Result<()> {
        let s = &self.shared;
        let fe = s.files.lock().get(file.id()).cloned();
        match fe {
            Some(fe) => {
                fe.stream.lock().synced();
                s.commit(&fe)
            }
            None => Ok(()),
        }
    }

    fn forget(&self, id: &FileId) {
        let s = &self.shared;
        // Handles still open may read (and write) the file until they close, and must see
        // its newest data: its records stay, and are written back to the unlinked inode like
        // any others (a restart finds the inode gone and drops them). The entry goes once
        // nothing of it is dirty.
        let fe = s.files.lock().get(id).cloned();
        if let Some(fe) = fe {
            // Its name says so from now on, so that recovery drops its records instead of
            // looking for it (the path would find nothing, or another file).
            let renamed = name::FileName::decode(&fe.name.lock()).map(|n| name::FileName { unlinked: true, ..n });
            if let Some(n) = renamed {
                let n: Arc<[u8]> = Arc::from(n.encode());
                *fe.name.lock() = n.clone();
                if s.log.has_dirty(fe.key) {
                    let a = Append { entries: Vec::new(), names: vec![(fe.key, n)], reserve: true, lazy: false };
                    if let Err(e) = s.log.append(a) {
                        tracing::warn!("tier: cannot log that file key {} was unlinked ({e})", fe.key.0);
                    }
                }
            }
            // Open handles may still write it, and its dirty blocks are written back to it:
            // its descriptor stays, as it can be opened again only while someone has it open.
            s.pin(&fe);
        }
        s.inner.forget(id);
    }

    fn backing_is_complete(&self) -> bool {
        false
    }
    fn discard(&self, id: &FileId) {
        let s = &self.shared;
        let fe = s.files.lock().get(id).cloned();
        // Only a file with no name left, whatever the caller thinks: dropping a live file's
        // data would lose acknowledged writes.
        // Its descriptor (kept since it was unlinked, `forget`; or opened again by its handle,
        // which finds no freed inode: gone, nameless).
        let nameless = |fe: &FileEntry| {
            use std::os::unix::fs::MetadataExt;
            match s.rw(fe, None) {
                Ok(Some(rw)) => rw.file().metadata().is_ok_and(|m| m.nlink() == 0),
                Ok(None) => true,
                Err(_) => false,
            }
        };
        if let Some(fe) = fe.filter(|fe| nameless(fe)) {
            // Serialised with a destage round of this file (it holds `meta` while it writes
            // back); every record up to here goes, and no write can add one (nothing has the
            // file open).
            let _m = fe.meta.lock();
            let blocks = s.log.dirty_in(fe.key, 0, u64::MAX).len() as u64;
            if blocks > 0 {
                let through = s.log.last_seq();
                let drop = Entry::Drop { key: fe.key, through };
                if let Err(e) =
                    s.log.append(Append { entries: vec![drop], names: Vec::new(), reserve: true, lazy: false })
                {
                    // Unlogged, a crash replays them to the unlinked inode (or finds it gone):
                    // harmless either way.
                    tracing::debug!("tier: dropping deleted file key {} in memory only ({e})", fe.key.0);
                    s.log.apply_unlogged(&Entry::Drop { key: fe.key, through });
                }
                add(&s.counters.discarded_files, 1);
                add(&s.counters.discarded_blocks, blocks);
            }
            drop(_m);
            // Its entry goes now, and with it the write-back descriptor: a run that creates
            // and deletes many files would otherwise hold one per file until the next round
            // (the daemon's descriptors ran out under postmark; BENCHMARKS.md, session 35).
            s.files.lock().remove(id);
            s.keys.lock().remove(&fe.key);
        }
        s.inner.discard(id);
    }

    fn opened(&self, file: &BackingFile) {
        self.shared.inner.opened(file);
    }

    /// Every block dirty here comes from the tier (the disk lacks it), the rest from the disk
    /// below, one request per run of blocks the tier does not hold (at most [`COPY_RUNS`],
    /// then one request spanning them).
    fn copy_read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        let inner = &self.shared.inner;
        self.copy_over(file, offset, len, false, &|at, n| inner.copy_read(file, at, n))
    }

    /// The tier's dirty blocks over what the path below holds (its lenders): the spans it
    /// lacks, and blocks destaged meanwhile, are left missing.
    fn copy_read_held(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        let inner = &self.shared.inner;
        self.copy_over(file, offset, len, true, &|at, n| inner.copy_read_held(file, at, n))
    }

    fn cached_blocks(&self, id: &FileId) -> u64 {
        let s = &self.shared;
        let dirty = s.files.lock().get(id).map_or(0, |fe| s.log.dirty_in(fe.key, 0, u64::MAX).len() as u64);
        dirty + s.inner.cached_blocks(id)
    }

    fn moving(&self, id: &FileId, copy: &File) -> io::Result<()> {
        let s = &self.shared;
        let fe = s.files.lock().get(id).cloned();
        let Some(fe) = fe.filter(|fe| s.log.has_dirty(fe.key)) else { return s.inner.moving(id, copy) };
        let Some(u) = id.union_id().filter(|_| s.union.is_some()) else {
            return Err(io::Error::other("the write-back tier moves only files of a union"));
        };
        // The file as it is now, and the copy it is about to become (at the same path, on
        // the target branch, once switched): recovery finds it as whichever of the two the
        // move's journal keeps.
        // A union's entries are pinned: their descriptor is always held.
        let Some(rw) = fe.held_rw() else {
            return Err(io::Error::other("the write-back tier holds no descriptor of the file it moves"));
        };
        let now = name::FileName::of_union(&s.roots, rw.file(), u);
        let to = name::FileName { path: now.path.clone(), ..name::FileName::of_union(&s.roots, copy, u) };
        let mut both = name::FileName { moving_to: Some(Box::new(to)), ..now };
        // A name is one page of the log: long paths go first (the handles find the file).
        if both.encode().len() > farcache_tier::PAGE_BYTES {
            if let Some(t) = both.moving_to.as_mut() {
                t.path.clear();
            }
        }
        if both.encode().len() > farcache_tier::PAGE_BYTES {
            both.path.clear();
        }
        let a =
            Append { entries: Vec::new(), names: vec![(fe.key, Arc::from(both.encode()))], reserve: true, lazy: false };
        s.log.append(a).map_err(|e| io::Error::other(format!("the write-back tier cannot record the move: {e}")))?;
        s.inner.moving(id, copy)
    }

    fn moved(&self, id: &FileId, file: &File) {
        let s = &self.shared;
        if let (Some(fe), Some(u)) = (s.files.lock().get(id).cloned(), id.union_id()) {
            // Destaging goes to the new copy from here on (the same descriptor number, so a
            // round under way writes its remaining blocks there: the copy already holds
            // them, as every record of the file up to the switch was copied from here).
            // A union's entries are pinned: their descriptor is always held.
            let replaced = match fe.held_rw() {
                Some(rw) => rw.replace_file(file).map(|()| rw),
                None => Err(io::Error::other("the tier holds no descriptor of it")),
            };
            match replaced {
                Ok(rw) => {
                    let n = name::FileName::of_union(&s.roots, rw.file(), u);
                    *fe.name.lock() = Arc::from(n.encode());
                }
                Err(e) => {
                    // Cannot happen short of running out of descriptors; loudly, since the
                    // file's later write-back would go to the old copy.
                    tracing::error!("tier: cannot follow file {u} to its new branch: {e}");
                }
            }
        }
        s.inner.moved(id, file);
    }

    fn backing_counters(&self) -> Option<crate::BackingCountersSnapshot> {
        self.shared.inner.backing_counters()
    }

    fn io_engine(&self) -> Option<Arc<crate::IoEngine>> {
        self.shared.inner.io_engine()
    }
}

#[cfg(test)]
mod tests;
