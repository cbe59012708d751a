//! `farcache balance`: move recently read files off the busiest branch, copying every block
//! lenders (or a tier) hold from there and only the rest from the busy disk.
//!
//! A move of one file (journal first: `journal.rs`):
//! 1. copy it to `.farcache-union/tmp/<id>` on the target branch: with `--source cache`
//!    each chunk's blocks lenders or a tier hold at once ([`DataPath::copy_read_held`]) and
//!    the rest from the disk when the copy owes the applications no wait (`yielding.rs`);
//!    with `--source disk` (the conventional baseline) everything from the disk; sync it;
//!    give it the file's mode, owner, times, extended attributes and its id record; sync;
//!    tell the data path (`DataPath::moving`: a write-back tier records that the file may
//!    become the copy, durably; the blocks it holds were copied from it);
//! 2. under the gate held exclusive (no write, truncate, metadata change or name operation
//!    anywhere in the mount for these few system calls, none of them a sync): check nothing
//!    changed the file since the copy began (the mount counts writes and metadata changes
//!    to the file being moved; a rename or a new hard link shows in its location) — if
//!    something did, drop the copy and start again, at most [`MAX_ATTEMPTS`] times; else
//!    rename the copy to the file's path on the target, make the inode's descriptor and
//!    every open handle's descriptors refer to the copy (`dup3` onto the same numbers:
//!    `BackingFile::replace_file`), and set the source aside (a rename into its branch's
//!    `.farcache-union/tmp/`, so no lookup finds it);
//! 3. sync the target directory, remove the source, sync, close the journal record.
//!
//! The file's node id, inode number and cache identity do not change, so cached blocks stay
//! valid and open handles go on, on the new copy. Hard-linked files are not moved.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farcache_engine::{BackingFile, BackingOptions, CopyRead, DataPath, FileId};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::journal::{self, Move};
use super::ops::split;
use super::yielding::{Side, Waited, YieldPolicy, Yielder};
use super::{load, IdRecord, Union};
use crate::handles::{FileHandle, Handles};
use crate::inode::{Inode, InodeTable};
use crate::sys;

/// Copies of one file started before a balance gives it up (each restarted after a write
/// to it during the copy).
pub const MAX_ATTEMPTS: u32 = 3;
/// Bytes read per copy request.
const COPY_CHUNK_BYTES: usize = 1 << 20;
/// Disk reads a copy queues while it owes the applications a wait (a few chunks: its cached
/// part runs ahead of its disk part by at most this much).
const MAX_QUEUED_READS: usize = 4;
/// Most files one balance moves.
pub const MAX_FILES: usize = 100_000;
/// Longest load-measuring window.
pub const MAX_WINDOW_MS: u64 = 3_000;
/// Why a second balance is refused.
const RUNNING: &str = "a balance is running on this mount (asked for, or a round of the automatic one); wait for it \
     (farcache balance shows its progress)";

/// What bounds one balance: files, bytes, and the copy's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    /// Bytes per second of copy, at most (0: as fast as the disks go).
    pub(crate) bytes_per_sec: u64,
}

/// Holds a balance's copying to its rate: after each chunk, waits until the bytes copied
/// so far are due (at most one chunk's worth of waiting at a time).
struct Pacer {
    bytes_per_sec: u64,
    start: Instant,
    bytes: u64,
}

impl Pacer {
    fn new(bytes_per_sec: u64) -> Pacer {
        Pacer { bytes_per_sec, start: Instant::now(), bytes: 0 }
    }

    fn copied(&mut self, n: u64) {
        self.bytes += n;
        if self.bytes_per_sec == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_sec as f64);
        let ahead = due.saturating_sub(self.start.elapsed());
        // A rate limit, not a wait for an event: the copy may not go faster than this.
        std::thread::sleep(ahead.min(Duration::from_secs(1)));
    }
}

/// Where one balance's copying time went (`BalanceStatus::read_cache_ms` and the others).
#[derive(Default)]
struct CopyTimes {
    read_cache: Duration,
    read_disk: Duration,
    write: Duration,
    sync: Duration,
    switch: Duration,
}

impl CopyTimes {
    /// Adds the time since `t0` to `slot`, and returns now (the next span's start).
    fn lap(slot: &mut Duration, t0: Instant) -> Instant {
        let now = Instant::now();
        *slot += now - t0;
        now
    }

    fn report(&self, s: &mut BalanceStatus) {
        let ms = |d: Duration| d.as_millis() as u64;
        s.read_cache_ms = ms(self.read_cache);
        s.read_disk_ms = ms(self.read_disk);
        s.write_ms = ms(self.write);
        s.sync_ms = ms(self.sync);
        s.switch_ms = ms(self.switch);
    }
}

/// Where a move reads the file from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopySource {
    /// Every block lenders (or a tier) hold from there, the rest from the disk.
    #[default]
    Cache,
    /// Everything from the source disk (the conventional migration, for comparison).
    Disk,
}

/// What `farcache balance` asks.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalanceOptions {
    /// Plan only: which files would move where.
    pub dry_run: bool,
    pub source: CopySource,
    /// Files to move, at most.
    pub files: usize,
    /// The target branch (its path or its position, from 0); else the least busy.
    pub to: Option<String>,
    /// The branch to move from; else the busiest.
    pub from: Option<String>,
    /// How long the device load is measured before choosing.
    pub window_ms: u64,
}

impl Default for BalanceOptions {
    fn default() -> Self {
        BalanceOptions { dry_run: false, source: CopySource::Cache, files: 16, to: None, from: None, window_ms: 500 }
    }
}

/// One file a balance moves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFile {
    /// Relative to the mount's root.
    pub path: String,
    pub id: u64,
    pub bytes: u64,
    /// Its blocks lenders or the write-back tier hold.
    pub cached_blocks: u64,
}

/// A balance's plan and progress (`{"cmd":"balance_status"}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceStatus {
    /// Names this balance (random, drawn when it starts; 0 for a plan only): a status of
    /// another id means the daemon was replaced meanwhile (a crash, an upgrade).
    #[serde(default)]
    pub id: u64,
    pub running: bool,
    /// Started by the automatic balancer (`[balance]`), not asked for.
    #[serde(default)]
    pub automatic: bool,
    pub dry_run: bool,
    pub source: CopySource,
    pub from: String,
    pub to: String,
    /// Each branch's device busy time over the window, per mille.
    pub busy_permille: Vec<u32>,
    /// Recent accesses found on each branch.
    pub recent_accesses: Vec<u64>,
    pub planned: Vec<PlannedFile>,
    pub files_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub moved: u64,
    pub skipped: u64,
    pub failed: u64,
    pub races: u64,
    pub retries: u64,
    pub blocks_from_cache: u64,
    pub blocks_from_disk: u64,
    /// Of `blocks_from_cache`, those the write-back tier held (data the disk lacked).
    #[serde(default)]
    pub blocks_from_tier: u64,
    /// Waits before reading the source disk again, for the applications' I/O (`[balance]
    /// yield_to_foreground`), of them those that ran to their bound, and the time waited.
    #[serde(default)]
    pub yields: u64,
    #[serde(default)]
    pub yield_bounded: u64,
    #[serde(default)]
    pub yield_wait_ms: u64,
    /// Waits before fetching from the lenders again (the applications' lender reads share the
    /// link), and the time waited.
    #[serde(default)]
    pub lender_yields: u64,
    #[serde(default)]
    pub lender_yield_wait_ms: u64,
    /// Where the copy's time went (milliseconds, summed over files): taking what the lenders
    /// or the tier hold, reading the source disk, writing the copy, the syncs (journal record,
    /// copy, directories) and the switch under the gate. With the waits (`yield_wait_ms`,
    /// `lender_yield_wait_ms`, the rate limit's) they make `elapsed_ms`.
    #[serde(default)]
    pub read_cache_ms: u64,
    #[serde(default)]
    pub read_disk_ms: u64,
    #[serde(default)]
    pub write_ms: u64,
    #[serde(default)]
    pub sync_ms: u64,
    #[serde(default)]
    pub switch_ms: u64,
    pub elapsed_ms: u64,
    /// Why the balance stopped early, or the last file's failure.
    pub error: Option<String>,
}

/// The union as the control socket sees it: balance, and the counters.
#[derive(Clone)]
pub struct UnionHandle {
    pub(crate) u: Arc<Union>,
    pub(crate) inodes: Arc<InodeTable>,
    pub(crate) files: Arc<Handles<FileHandle>>,
    pub(crate) data: Arc<dyn DataPath>,
    pub(crate) opts: BackingOptions,
    status: Arc<Mutex<BalanceStatus>>,
    /// Copy at the idle I/O priority (`balance.idle_io_priority`).
    pub(crate) idle_io: Arc<AtomicBool>,
    /// How every balance's copy yields to the applications' I/O (`[balance]`).
    pub(crate) yielding: Arc<Mutex<YieldPolicy>>,
    /// Set when the daemon stops: a balance ends after the file in hand.
    pub(crate) cancel: Arc<AtomicBool>,
    /// Told of a moved file's new inode (a supervisor keeps it: `crate::Kept::Known`).
    pub(crate) keeper: crate::KeeperSlot,
}

/// The copy being written: its writes and its sync go through the backing store's I/O
/// engine ([`DataPath::io_engine`]), like every other backing I/O of the mount — the engine's
/// bound on what is in flight covers them, and `farcache stats` counts them under
/// `backing.io`. A data path without an engine (tests) gets one of its own.
struct CopyOut {
    file: std::fs::File,
    io: Arc<farcache_engine::IoEngine>,
}

impl CopyOut {
    fn new(file: std::fs::File, data: &dyn DataPath) -> CopyOut {
        CopyOut { file, io: data.io_engine().unwrap_or_default() }
    }

    fn write_all_at(&self, data: &[u8], at: u64) -> io::Result<()> {
        self.io.write_all(self.file.as_fd(), at, data)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.io.fsync(self.file.as_fd(), false)
    }
}

impl AsFd for CopyOut {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// How one file's move ended.
enum Outcome {
    Moved,
    Skipped(&'static str),
}

impl UnionHandle {
    pub(crate) fn new(
        u: Arc<Union>,
        inodes: Arc<InodeTable>,
        files: Arc<Handles<FileHandle>>,
        data: Arc<dyn DataPath>,
        opts: BackingOptions,
        keeper: crate::KeeperSlot,
    ) -> UnionHandle {
        UnionHandle {
            u,
            inodes,
            files,
            data,
            opts,
            status: Arc::default(),
            idle_io: Arc::default(),
            yielding: Arc::new(Mutex::new(super::BalanceConfig::default().yield_policy())),
            cancel: Arc::default(),
            keeper,
        }
    }

    /// Before the mount is handed to another daemon: no move may be under way in this one
    /// (the next one finishes interrupted moves from the journal as it starts, and takes
    /// the files' descriptors as they are). Stops every balance after the file in hand —
    /// also those started later — and waits for that file, at most `wait`. False if a
    /// move still runs then.
    pub fn quiesce(&self, wait: Duration) -> bool {
        self.cancel.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        loop {
            if !self.status.lock().running && self.u.moving.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if t0.elapsed() >= wait {
                return false;
            }
            // Polling a flag the balance thread clears when its file is done (bounded above).
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Balances may run again (a handover that did not happen).
    pub fn resume(&self) {
        self.cancel.store(false, Ordering::SeqCst);
    }

    /// Which live file of the union a descriptor is (for a write-back tier opened after the
    /// mount: a daemon taking the mount over).
    pub fn files(&self) -> Arc<dyn farcache_engine::UnionFiles> {
        Arc::new(super::Files(self.u.clone()))
    }

    /// The union's counters.
    pub fn stats(&self) -> super::UnionStats {
        self.u.stats()
    }

    /// The plan and progress of the last balance.
    pub fn status(&self) -> BalanceStatus {
        self.status.lock().clone()
    }

    fn branch_arg(&self, s: &str) -> Result<usize, String> {
        if let Ok(i) = s.parse::<usize>() {
            if i < self.u.branches.len() {
                return Ok(i);
            }
        }
        let p = std::fs::canonicalize(s).unwrap_or_else(|_| PathBuf::from(s));
        self.u.branches.iter().position(|b| b.path == p).ok_or_else(|| {
            let all: Vec<String> = self.u.branches.iter().map(|b| b.path.display().to_string()).collect();
            format!(
                "{s} is not a branch of this mount; its branches are {} (or their positions from 0)",
                all.join(", ")
            )
        })
    }

    /// Plan a balance (measuring the load for `window_ms`); unless `dry_run`, start moving
    /// in the background. Answers the plan. One balance at a time.
    pub fn start(&self, o: BalanceOptions) -> Result<BalanceStatus, String> {
        if self.status.lock().running {
            return Err(RUNNING.into());
        }
        if o.files == 0 || o.files > MAX_FILES {
            return Err(format!("--files must be 1 to {MAX_FILES}"));
        }
        let from_arg = o.from.as_deref().map(|s| self.branch_arg(s)).transpose()?;
        let to_arg = o.to.as_deref().map(|s| self.branch_arg(s)).transpose()?;
        let window = Duration::from_millis(o.window_ms.min(MAX_WINDOW_MS));
        let before = load::ticks_now(&self.u.branches, &self.u.busy_ns);
        let t = Instant::now();
        // A measurement window, not a wait for an event: the load is what happens meanwhile.
        std::thread::sleep(window);
        let busy = load::busy_between(&before, &load::ticks_now(&self.u.branches, &self.u.busy_ns), t.elapsed());
        let limits = Limits { files: o.files, bytes: u64::MAX, bytes_per_sec: 0 };
        let (st, from, to) = self.plan(o.dry_run, o.source, limits, from_arg, to_arg, busy, false)?;
        if o.dry_run || st.planned.is_empty() {
            let mut s = self.status.lock();
            if s.running {
                return Err(RUNNING.into());
            }
            *s = st.clone();
            return Ok(st);
        }
        if !self.claim(&st) {
            return Err(RUNNING.into());
        }
        let st = self.status();
        let h = self.clone();
        let source = o.source;
        if let Err(e) = std::thread::Builder::new().name("farcache-balance".into()).spawn(move || {
            if h.idle_io.load(Ordering::Relaxed) {
                if let Err(e) = sys::set_idle_io_priority() {
                    tracing::warn!("balance: the idle I/O priority could not be set ({e}); copying at the default");
                }
            }
            h.run(from, to, source, limits);
        }) {
            self.status.lock().running = false;
            return Err(format!("cannot start the balance thread: {e}"));
        }
        Ok(BalanceStatus { running: true, ..st })
    }

    /// Make `st` the running balance, unless one runs. Whether it did.
    pub(crate) fn claim(&self, st: &BalanceStatus) -> bool {
        let mut s = self.status.lock();
        if s.running {
            return false;
        }
        *s = BalanceStatus { running: true, id: super::random_u64().max(1), ..st.clone() };
        true
    }

    /// The plan of a balance given each branch's busy per mille: the source (`from`, else
    /// the busiest), the target (`to`, else the least busy other one) and the files — the
    /// most recently used ones on the source with one name, those with the most blocks on
    /// lenders first, within `limits`. `automatic`: for the automatic balancer. Plans the
    /// automatic balancer and `farcache balance` alike. With the source and target.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan(
        &self,
        dry_run: bool,
        source: CopySource,
        limits: Limits,
        from_arg: Option<usize>,
        to_arg: Option<usize>,
        busy: Vec<u32>,
        automatic: bool,
    ) -> Result<(BalanceStatus, usize, usize), String> {
        let n = self.u.branches.len();
        // Recent files, with their branch.
        let mut recent: Vec<(Arc<Inode>, u64, usize, PathBuf)> = Vec::new();
        let mut accesses = vec![0u64; n];
        for nodeid in self.u.history.recent() {
            let Some(inode) = self.inodes.get(nodeid) else { continue };
            let Some(id) = inode.file_id.get().and_then(FileId::union_id) else { continue };
            let Ok((b, rel)) = inode.fd().and_then(|fd| self.u.locate(fd.as_fd())) else { continue };
            accesses[b] += 1;
            recent.push((inode, id, b, rel));
        }
        let from = from_arg
            .unwrap_or_else(|| (0..n).max_by_key(|&b| (busy[b], accesses[b], std::cmp::Reverse(b))).unwrap_or(0));
        let free = |b: usize| {
            sys::fstatvfs(self.u.branches[b].root.as_fd()).map(|s| s.f_bavail as u128 * s.f_frsize as u128).unwrap_or(0)
        };
        let to = match to_arg {
            Some(t) => t,
            None => (0..n)
                .filter(|&b| b != from)
                .min_by_key(|&b| (busy[b], std::cmp::Reverse(free(b)), b))
                .ok_or("a balance needs two branches")?,
        };
        if from == to {
            return Err("the source and target branch are the same".into());
        }
        let mut cands: Vec<(PlannedFile, usize)> = Vec::new();
        for (rank, (inode, id, b, rel)) in recent.iter().enumerate() {
            if *b != from {
                continue;
            }
            let Ok(st) = inode.fd().and_then(|fd| sys::fstat(fd.as_fd())) else { continue };
            if st.st_nlink != 1 {
                continue;
            }
            let cached_blocks = self.data.cached_blocks(&FileId::union(*id));
            let path = rel.display().to_string();
            cands.push((PlannedFile { path, id: *id, bytes: st.st_size as u64, cached_blocks }, rank));
        }
        // Files whose blocks lenders hold first (most first), then the most recent.
        cands.sort_by_key(|(f, rank)| (std::cmp::Reverse(f.cached_blocks), *rank));
        let mut planned: Vec<PlannedFile> = Vec::new();
        let mut bytes = 0u64;
        for (f, _) in cands {
            if planned.len() >= limits.files {
                break;
            }
            if bytes.saturating_add(f.bytes) > limits.bytes {
                continue;
            }
            bytes += f.bytes;
            planned.push(f);
        }
        let st = BalanceStatus {
            running: false,
            automatic,
            dry_run,
            source,
            from: self.u.branches[from].path.display().to_string(),
            to: self.u.branches[to].path.display().to_string(),
            busy_permille: busy,
            recent_accesses: accesses,
            bytes_total: planned.iter().map(|f| f.bytes).sum(),
            planned,
            ..BalanceStatus::default()
        };
        Ok((st, from, to))
    }

    /// Move the planned files (the balance [`claim`](Self::claim)ed) on this thread, at most
    /// `limits.bytes_per_sec`; its final status.
    pub(crate) fn run(&self, from: usize, to: usize, source: CopySource, limits: Limits) -> BalanceStatus {
        let t = Instant::now();
        let planned = self.status.lock().planned.clone();
        let mut pacer = Pacer::new(limits.bytes_per_sec);
        let mut yielder = Yielder::new(*self.yielding.lock());
        let mut times = CopyTimes::default();
        for f in planned {
            if self.cancel.load(Ordering::Relaxed) {
                self.status.lock().error = Some("stopped: the mount is going away".into());
                break;
            }
            let r = match self.inodes.get(f.id) {
                Some(inode) => self.move_file(&inode, f.id, (from, to), source, (&mut pacer, &mut yielder, &mut times)),
                None => Ok(Outcome::Skipped("no longer known to the kernel")),
            };
            let mut s = self.status.lock();
            s.files_done += 1;
            s.bytes_done += f.bytes;
            match r {
                Ok(Outcome::Moved) => s.moved += 1,
                Ok(Outcome::Skipped(why)) => {
                    s.skipped += 1;
                    self.u.counters.move_skips.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("balance: {} not moved: {why}", f.path);
                }
                Err(e) => {
                    s.failed += 1;
                    self.u.counters.move_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("balance: moving {} failed: {e}", f.path);
                    s.error = Some(format!("{}: {e}", f.path));
                }
            }
            times.report(&mut s);
            s.elapsed_ms = t.elapsed().as_millis() as u64;
        }
        let mut s = self.status.lock();
        s.elapsed_ms = t.elapsed().as_millis() as u64;
        s.running = false;
        tracing::info!(
            "balance{} done: {} moved, {} skipped, {} failed in {} ms ({} blocks from cache ({} of them from the \
             write-back tier), {} from disk, {} races; yielded to the foreground {} times before the disk for {} ms \
             ({} to the bound), {} before the lenders for {} ms; ms reading from the cache {}, from the disk {}, \
             writing {}, syncing {}, switching {})",
            if s.automatic { " (automatic)" } else { "" },
            s.moved,
            s.skipped,
            s.failed,
            s.elapsed_ms,
            s.blocks_from_cache,
            s.blocks_from_tier,
            s.blocks_from_disk,
            s.races,
            s.yields,
            s.yield_wait_ms,
            s.yield_bounded,
            s.lender_yields,
            s.lender_yield_wait_ms,
            s.read_cache_ms,
            s.read_disk_ms,
            s.write_ms,
            s.sync_ms,
            s.switch_ms
        );
        s.clone()
    }

    fn count(&self, f: impl FnOnce(&mut BalanceStatus)) {
        f(&mut self.status.lock());
    }

    /// Move the file `inode` (farcache id `id`) from branch `from` to `to`.
    fn move_file(
        &self,
        inode: &Arc<Inode>,
        id: u64,
        (from, to): (usize, usize),
        source: CopySource,
        (pacer, yielder, times): (&mut Pacer, &mut Yielder, &mut CopyTimes),
    ) -> io::Result<Outcome> {
        let u = &*self.u;
        let (b, _) = u.locate(inode.fd()?.as_fd())?;
        if b != from {
            return Ok(Outcome::Skipped("no longer on the source branch"));
        }
        let st = sys::fstat(inode.fd()?.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 1 {
            return Ok(Outcome::Skipped("not a regular file with one name"));
        }
        u.moving.store(id, Ordering::SeqCst);
        let r = (|| {
            for attempt in 0..MAX_ATTEMPTS {
                if attempt > 0 {
                    u.counters.retries.fetch_add(1, Ordering::Relaxed);
                    self.count(|s| s.retries += 1);
                }
                match self.attempt(inode, id, (from, to), source, (&mut *pacer, &mut *yielder, &mut *times))? {
                    Some(o) => return Ok(o),
                    None => {
                        u.counters.races.fetch_add(1, Ordering::Relaxed);
                        self.count(|s| s.races += 1);
                    }
                }
            }
            Ok(Outcome::Skipped("written to during every copy"))
        })();
        u.moving.store(0, Ordering::SeqCst);
        if let Ok(td) = journal::tmp_dir(u, to) {
            let _ = sys::unlinkat(td.as_fd(), &journal::tmp_name(id), 0);
        }
        journal::end(u, to, id)?;
        r
    }

    /// Before a copy from `from` to `to` uses `side` again: give way to the applications' I/O
    /// on either branch for what its last use of `side` owes them (bounded; `yielding.rs`),
    /// counted.
    fn yield_to_foreground(&self, yielder: &mut Yielder, side: Side, from: usize, to: usize) {
        let u = &*self.u;
        let (d, bounded) = match yielder.give_way(side, || u.foreground.busy(&[from, to])) {
            Waited::No => return,
            Waited::Yielded(d) => (d, false),
            Waited::Bounded(d) => (d, true),
        };
        let (yields, bounded_all, waited) = yielder.totals(side);
        match side {
            Side::Disk => {
                u.counters.copy_yields.fetch_add(1, Ordering::Relaxed);
                u.counters.copy_yield_bounded.fetch_add(bounded as u64, Ordering::Relaxed);
                u.counters.copy_yield_wait_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
                self.count(|s| {
                    s.yields = yields;
                    s.yield_bounded = bounded_all;
                    s.yield_wait_ms = waited.as_millis() as u64;
                });
            }
            Side::Lenders => {
                u.counters.copy_lender_yields.fetch_add(1, Ordering::Relaxed);
                u.counters.copy_lender_yield_wait_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
                self.count(|s| {
                    s.lender_yields = yields;
                    s.lender_yield_wait_ms = waited.as_millis() as u64;
                });
            }
        }
    }

    /// Copy `n` bytes at `at` of `src` from the disk (blocks a write-back tier holds dirty
    /// from the tier) to `out`; the applications are owed a wait after it.
    fn copy_from_disk(
        &self,
        src: &BackingFile,
        out: &CopyOut,
        (at, n): (u64, usize),
        yielder: &mut Yielder,
        times: &mut CopyTimes,
    ) -> io::Result<()> {
        let c0 = Instant::now();
        let r = self.data.copy_read(src, at, n)?;
        let w0 = CopyTimes::lap(&mut times.read_disk, c0);
        out.write_all_at(&r.data, at)?;
        CopyTimes::lap(&mut times.write, w0);
        yielder.used(Side::Disk, r.disk_time);
        self.count_blocks(&r);
        Ok(())
    }

    /// Where a copy read's blocks came from, in the mount's counters and the status.
    fn count_blocks(&self, r: &CopyRead) {
        let c = &self.u.counters;
        c.blocks_from_cache.fetch_add(r.cache_blocks, Ordering::Relaxed);
        c.blocks_from_disk.fetch_add(r.disk_blocks, Ordering::Relaxed);
        c.blocks_from_tier.fetch_add(r.tier_blocks, Ordering::Relaxed);
        self.count(|s| {
            s.blocks_from_cache += r.cache_blocks;
            s.blocks_from_disk += r.disk_blocks;
            s.blocks_from_tier += r.tier_blocks;
        });
    }

    /// One copy and switch; `None` when the file changed during the copy.
    fn attempt(
        &self,
        inode: &Arc<Inode>,
        id: u64,
        (from, to): (usize, usize),
        source: CopySource,
        (pacer, yielder, times): (&mut Pacer, &mut Yielder, &mut CopyTimes),
    ) -> io::Result<Option<Outcome>> {
        let u = &*self.u;
        let fid = FileId::union(id);
        let w0 = u.moving_writes.load(Ordering::SeqCst);
        let (b, rel) = u.locate(inode.fd()?.as_fd())?;
        if b != from {
            return Ok(Some(Outcome::Skipped("no longer on the source branch")));
        }
        let (parent_rel, name) = split(&rel)?;
        // The record first, at each attempt: a rename since the last one moved the file.
        let m = Move { id, from: u.branches[from].uuid, to: u.branches[to].uuid, rel: rel.clone() };
        let t0 = Instant::now();
        journal::begin(u, to, &m)?;
        CopyTimes::lap(&mut times.sync, t0);
        u.fault("before-copy");
        // The copy.
        let td = journal::tmp_dir(u, to)?;
        let tmp = journal::tmp_name(id);
        let _ = sys::unlinkat(td.as_fd(), &tmp, 0);
        let out = CopyOut::new(
            std::fs::File::from(sys::openat(
                td.as_fd(),
                &tmp,
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
            )?),
            &*self.data,
        );
        let src = std::fs::File::from(sys::reopen(inode.fd()?.as_fd(), libc::O_RDONLY)?);
        let size = src.metadata()?.len();
        let src = BackingFile::new(fid, src, libc::O_RDONLY, &self.opts);
        let mut off = 0u64;
        let mut mid_copy_fault = true;
        // Spans still to read from the disk (offset, length), oldest first: a chunk's
        // cached part is copied at once, its disk part when the disk is the copy's again
        // (`yielding.rs`), at most MAX_QUEUED_READS of them waiting.
        let mut queued: VecDeque<(u64, usize)> = VecDeque::new();
        while off < size {
            let len = ((size - off) as usize).min(COPY_CHUNK_BYTES);
            if source == CopySource::Cache {
                self.yield_to_foreground(yielder, Side::Lenders, from, to);
                let c0 = Instant::now();
                let r = self.data.copy_read_held(&src, off, len)?;
                let w0 = CopyTimes::lap(&mut times.read_cache, c0);
                if r.cache_blocks > r.tier_blocks {
                    yielder.used(Side::Lenders, w0 - c0);
                }
                if r.data.is_empty() && r.missing.is_empty() {
                    break; // shrank: the check below sees it
                }
                out.write_all_at(&r.data, off)?;
                CopyTimes::lap(&mut times.write, w0);
                self.count_blocks(&r);
                queued.extend(r.missing);
            } else {
                queued.push_back((off, len));
            }
            off += len as u64;
            pacer.copied(len as u64);
            // The disk's part: each read once the copy owes the applications no wait (or
            // they are idle); in turn, waiting, when too many are queued.
            while let Some(&(at, n)) = queued.front() {
                let busy = || u.foreground.busy(&[from, to]);
                if queued.len() <= MAX_QUEUED_READS && !yielder.may_use(Side::Disk, busy) {
                    break;
                }
                self.yield_to_foreground(yielder, Side::Disk, from, to);
                queued.pop_front();
                self.copy_from_disk(&src, &out, (at, n), yielder, times)?;
            }
            if mid_copy_fault && off * 2 >= size {
                mid_copy_fault = false;
                u.fault("mid-copy");
            }
        }
        while let Some((at, n)) = queued.pop_front() {
            self.yield_to_foreground(yielder, Side::Disk, from, to);
            self.copy_from_disk(&src, &out, (at, n), yielder, times)?;
        }
        // The copy's metadata and id record before the switch: a change of the file's
        // metadata since counts as a write to it (the gate's guard), and fails the check.
        let sst = sys::fstat(inode.fd()?.as_fd())?;
        copy_metadata(u, inode.fd()?.as_fd(), &out.file, &sst)?;
        let ost = sys::fstat(out.as_fd())?;
        IdRecord { id, branch: u.branches[to].uuid, ino: ost.st_ino }.write(out.as_fd(), &u.xattr)?;
        let t0 = Instant::now();
        out.sync_all()?;
        let out = out.file;
        // A write-back tier holding data of the file records that the file may become the
        // copy (durably, before the switch): whichever copy a crash leaves, it finds it.
        self.data.moving(&fid, &out)?;
        CopyTimes::lap(&mut times.sync, t0);
        u.fault("after-copy");
        let dst_dir = u.ensure_path(to, from, &parent_rel)?;
        let dst_dir_rd = sys::reopen(dst_dir.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        let src_dir = u.walk(from, &parent_rel)?;
        let aside_dir = journal::tmp_dir(u, from)?;
        let aside = journal::aside_name(id);
        // The switch: no fsync under the gate, only renames and descriptor swaps.
        let t_switch = Instant::now();
        let g = u.gate.write();
        let unchanged = u.moving_writes.load(Ordering::SeqCst) == w0
            && u.locate(inode.fd()?.as_fd()).ok().as_ref() == Some(&(from, rel.clone()))
            && sys::fstat(inode.fd()?.as_fd()).is_ok_and(|s| {
                s.st_nlink == 1
                    && s.st_size as u64 == off
                    && off == size
                    && (s.st_dev, s.st_ino) == (sst.st_dev, sst.st_ino)
            });
        if !unchanged {
            drop(g);
            let _ = sys::unlinkat(td.as_fd(), &tmp, 0);
            return Ok(None);
        }
        match sys::renameat2(td.as_fd(), &tmp, dst_dir.as_fd(), &name, libc::RENAME_NOREPLACE) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                drop(g);
                let _ = sys::unlinkat(td.as_fd(), &tmp, 0);
                return Ok(Some(Outcome::Skipped("its name exists on the target branch")));
            }
            Err(e) => return Err(e),
        }
        u.fault("after-switch");
        // Everything that can fail before anything is switched: new descriptors for the
        // inode and for each open handle (same access and status flags).
        let prepared = (|| {
            let new_path = sys::openat(dst_dir.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
            let mut handles = Vec::new();
            for h in self.files.matching(|h| h.backing.id() == &fid) {
                // SAFETY: plain fcntl on a descriptor the handle owns.
                let fl = unsafe { libc::fcntl(h.backing.file().as_raw_fd(), libc::F_GETFL) };
                if fl < 0 {
                    return Err(io::Error::last_os_error());
                }
                let keep = libc::O_ACCMODE | libc::O_SYNC | libc::O_DSYNC | libc::O_NONBLOCK | libc::O_NOATIME;
                let f = std::fs::File::from(sys::reopen(new_path.as_fd(), fl & keep)?);
                handles.push((h, f));
            }
            Ok::<_, io::Error>((new_path, handles))
        })();
        let (new_path, handles) = match prepared {
            Ok(p) => p,
            Err(e) => {
                // Undo the rename: the source is still the file.
                let _ = sys::renameat2(dst_dir.as_fd(), &name, td.as_fd(), &tmp, 0);
                drop(g);
                let _ = sys::unlinkat(td.as_fd(), &tmp, 0);
                return Err(e);
            }
        };
        dup_onto(new_path.as_fd(), inode.fd()?.as_fd())?;
        for (h, f) in &handles {
            h.backing.replace_file(f)?;
            h.branch.store(to, Ordering::Relaxed);
        }
        u.counters.handles_switched.fetch_add(handles.len() as u64, Ordering::Relaxed);
        self.data.moved(&fid, &out);
        // The source leaves its name (set aside on its own file system, atomically), so no
        // lookup after the gate can find it; it is removed once the target is durable.
        match sys::statat(src_dir.as_fd(), &name) {
            Ok(s) if (s.st_dev, s.st_ino) == (sst.st_dev, sst.st_ino) => {
                sys::renameat2(src_dir.as_fd(), &name, aside_dir.as_fd(), &aside, 0)?
            }
            _ => tracing::warn!("balance: the source of {} changed name during the switch", rel.display()),
        }
        drop(g);
        let t0 = CopyTimes::lap(&mut times.switch, t_switch);
        // A supervisor keeps the inode from now on (until here it kept the source: a crash
        // in between is the journal's, whose replay decides which copy is the file).
        self.keeper.tell(crate::Kept::Known { nodeid: inode.nodeid, fd: inode.fd()?.as_fd() });
        sys::fsync_fd(dst_dir_rd.as_fd(), false)?;
        u.fault("before-remove");
        match sys::unlinkat(aside_dir.as_fd(), &aside, 0) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        sys::fsync_fd(aside_dir.as_fd(), false)?;
        let src_dir_rd = sys::reopen(src_dir.as_fd(), libc::O_RDONLY | libc::O_DIRECTORY)?;
        sys::fsync_fd(src_dir_rd.as_fd(), false)?;
        CopyTimes::lap(&mut times.sync, t0);
        u.counters.moves.fetch_add(1, Ordering::Relaxed);
        u.counters.bytes_moved.fetch_add(size, Ordering::Relaxed);
        tracing::debug!("balance: moved {} ({} bytes) to {}", rel.display(), size, u.branches[to].path.display());
        Ok(Some(Outcome::Moved))
    }
}

/// Give `out` the mode, owner, times and extended attributes (the id record excepted) of
/// the file `src` (stat `st`).
fn copy_metadata(u: &Union, src: BorrowedFd<'_>, out: &std::fs::File, st: &libc::stat) -> io::Result<()> {
    sys::fchown(out.as_fd(), st.st_uid, st.st_gid)?;
    sys::fchmod(out.as_fd(), st.st_mode & 0o7777)?;
    let mut names = vec![0u8; 64 * 1024];
    let n = sys::listxattr(src, &mut names)?;
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let c = std::ffi::CString::new(name).map_err(|_| sys::err(libc::EINVAL))?;
        if u.is_id_xattr(&c) {
            continue;
        }
        let mut v = vec![0u8; 64 * 1024];
        match sys::getxattr(src, &c, &mut v) {
            Ok(len) => sys::setxattr(out.as_fd(), &c, &v[..len], 0)?,
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    let times = [
        libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
        libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
    ];
    sys::utimens(out.as_fd(), &times, true, false)
}

/// Make descriptor number `to` refer to what `from` refers to (atomically; `to` stays open,
/// so everyone holding it reaches the new file from the next system call on).
fn dup_onto(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: both are open descriptors of this process; dup3 replaces `to` atomically.
    if unsafe { libc::dup3(from.as_raw_fd(), to.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_with_defaults_and_refuse_unknown_fields() {
        let o: BalanceOptions = serde_json::from_str(r#"{"dry_run":true,"source":"disk"}"#).unwrap();
        assert!(o.dry_run);
        assert_eq!(o.source, CopySource::Disk);
        assert_eq!(o.files, 16);
        assert!(serde_json::from_str::<BalanceOptions>(r#"{"filez":3}"#).is_err());
    }
}
