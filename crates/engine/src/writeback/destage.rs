//! Destaging: the thread that writes dirty blocks back to the backing store, the rounds it
//! runs, `flush` (destage everything and wait) and recovery at start.
//!
//! A round through seq `S` (the log's [`farcache_tier::Log::plan`]): for each file, under its
//! `meta` lock (so no truncate runs meanwhile), the newest contents of its planned blocks,
//! sorted and merged into writes of up to `destage_write` bytes through the path underneath
//! (so lenders' copies are invalidated as for any write), then one `fdatasync` of the file;
//! once every file is synced, [`farcache_tier::Log::free_through`] `S`. A block cut or dropped
//! since the plan is skipped (it is no longer in the log); one rewritten since is written
//! with its newer contents (it stays dirty under its newer record). Any error stops the
//! round: nothing is freed, the data stays dirty, the error is counted and logged, and the
//! next round waits `retry_min`, doubling to `retry_max`.
//!
//! When: every `destage_interval` the thread asks the log what is due — the oldest batches
//! down to `low_watermark` once the used space reached `high_watermark`, every batch older
//! than `max_dirty_age` — and everything when the dirty bytes pass `max_dirty_bytes`, a
//! flush is waiting, or the mount has been idle (no read or write reached it) for
//! `idle_destage_after`. A write that pushes the tier past its high watermark wakes it.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farcache_tier::Log;

use super::name::{FileName, Located};
use super::{add, FileEntry, Shared, TierOpenError, B};
use crate::backing::BackingFile;
use crate::data_path::DataPath;

/// The destager's control block (under `Shared::ctl`).
#[derive(Debug, Default)]
pub(crate) struct Ctl {
    pub(crate) stop: bool,
    /// Flushes asked for, and the last one a round completed.
    flush_asked: u64,
    flush_done: u64,
    /// The log's seq the pending flushes need written back (`u64::MAX`: until clean).
    flush_target: u64,
    /// Rounds that failed since the last flush was asked for.
    failures_since_ask: u64,
    pub(crate) last_error: Option<String>,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    /// What recovery found, to destage first (the mount serves it meanwhile).
    pub(crate) recovered_through: Option<u64>,
    /// The destage round under way, if any ([`watch`]).
    pub(crate) round: Option<RoundUnderWay>,
}

/// A destage round under way: since when, the file it is writing back, and when [`watch`]
/// last reported it stalled.
#[derive(Debug)]
pub(crate) struct RoundUnderWay {
    pub(crate) since: Instant,
    pub(crate) file: String,
    pub(crate) warned: Option<Instant>,
}

#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error("the backing store refused the write-back: {0}")]
    Destage(String),
    #[error("timed out after {0:?} with {1} dirty bytes left")]
    Timeout(Duration, u64),
}

impl<D: DataPath> Shared<D> {
    /// Wake the destager, once per look it takes for work: a kick while one is pending
    /// costs an atomic swap. Measured: a durable writer past the high watermark kicked on
    /// every write, and each kick woke every waiter of the one condvar the destager and a
    /// waiting `farcache flush` shared — one wake-up of the flush's thread per write, on a
    /// two-CPU machine beside the write-back's own threads (BENCHMARKS.md, issue 12,
    /// session 28).
    pub(crate) fn kick(&self) {
        if !self.kicked.swap(true, Ordering::AcqRel) {
            // Under the lock: the destager either saw the flag before it waits, or waits
            // already and gets this notify.
            let _c = self.ctl.lock();
            self.cv.notify_one();
        }
    }

    /// Wake the flushes waiting for the destager's progress.
    fn progressed(&self) {
        self.done_cv.notify_all();
    }

    /// Wake the destager if the tier is past its high watermark.
    pub(crate) fn kick_if_over(&self) {
        if self.log.used_permille() >= u64::from(self.cfg.high_watermark) * 10 {
            self.kick();
        }
    }
}

/// Reads and writes that reached the mount's data path so far (the destager's own I/O is
/// not among them): when it stops moving, the mount is idle.
fn foreground<D: DataPath>(s: &Shared<D>) -> u64 {
    let c = &s.counters;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let below = s.inner.backing_counters().map_or(0, |b| b.reads_direct + b.reads_buffered);
    l(&c.writes)
        + l(&c.write_through_full)
        + l(&c.write_through_broken)
        + l(&c.write_through_unnamed)
        + l(&c.write_through_sequential)
        + l(&c.reads_from_tier)
        + below
}

/// How long no application I/O has reached the mount, as far as the checks tell: since the
/// first check that saw the present count (so at most that long, and 0 when it just moved).
/// The destager checks at least every `destage_interval`, and before each batch it writes.
fn quiet_for<D: DataPath>(s: &Shared<D>) -> Duration {
    let now = foreground(s);
    let mut q = s.quiet.lock();
    if q.0 != now {
        *q = (now, Instant::now());
    }
    q.1.elapsed()
}

/// A batch is written all at once only when the mount has been quiet this long (module docs
/// of [`DESTAGE_IN_FLIGHT`]): an application between two of its requests is not idle.
const DEEP_AFTER_QUIET: Duration = Duration::from_millis(10);

/// The destager thread.
pub(crate) fn run<D: DataPath>(s: &Shared<D>) {
    quiet_for(s);
    loop {
        let flush_ticket = {
            let mut c = s.ctl.lock();
            if c.stop {
                return;
            }
            // A kick since the last look is work to look at now; else wait for one.
            if c.flush_asked == c.flush_done && !s.kicked.swap(false, Ordering::AcqRel) {
                s.cv.wait_for(&mut c, s.cfg.destage_interval.get());
                s.kicked.store(false, Ordering::Release);
            }
            if c.stop {
                return;
            }
            if c.retry_at.is_some_and(|t| Instant::now() < t) {
                // Backing off after an error; a flush waits for the retry too (bounded).
                let left = c.retry_at.map(|t| t.saturating_duration_since(Instant::now())).unwrap_or_default();
                s.cv.wait_for(&mut c, left);
                continue;
            }
            (c.flush_asked > c.flush_done).then_some((c.flush_asked, c.flush_target))
        };
        // Lazy writes are flushed at the latest commit_interval after the first of them (an
        // error breaks the log, which logs it; fsyncs then write back through the file).
        let _ = s.log.commit_if_older(s.cfg.commit_interval.get());
        let idle_after = s.cfg.idle_destage_after.get();
        // Every look updates the quiet clock the batches also read (even with idle destaging off).
        let quiet = quiet_for(s);
        let idle = !idle_after.is_zero() && quiet >= idle_after;
        let recovered = s.ctl.lock().recovered_through.take();
        let through = match (due(s, flush_ticket.is_some() || idle), recovered) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let Some(through) = through else {
            if let Some((t, _)) = flush_ticket {
                s.ctl.lock().flush_done = t;
                s.progressed();
            }
            continue;
        };
        match timed_round(s, through) {
            Ok(()) => {
                let mut c = s.ctl.lock();
                c.retry_at = None;
                c.retry_delay = Duration::ZERO;
                // A flush is done once what was written before it was asked for is: records a
                // writer adds meanwhile are the next flush's (chasing them, a flush beside a
                // steady writer never ended).
                if let Some((t, target)) = flush_ticket {
                    if through >= target || s.log.last_seq() <= through || s.log.is_clean() {
                        c.flush_done = t;
                    }
                }
            }
            Err(e) => {
                add(&s.counters.destage_errors, 1);
                let mut c = s.ctl.lock();
                if let Some(r) = recovered {
                    c.recovered_through.get_or_insert(r);
                }
                c.retry_delay = (c.retry_delay * 2).clamp(s.cfg.retry_min.get(), s.cfg.retry_max.get());
                c.retry_at = Some(Instant::now() + c.retry_delay);
                c.failures_since_ask += 1;
                tracing::error!(
                    "tier {}: destage failed, the data stays dirty in the tier and is retried in {:?}: {e}",
                    s.path,
                    c.retry_delay
                );
                c.last_error = Some(e);
            }
        }
        s.progressed();
    }
}

/// The seq a round should go through now, if any.
fn due<D: DataPath>(s: &Shared<D>, everything: bool) -> Option<u64> {
    let last = s.log.last_seq();
    s.log.first_seq()?;
    if everything || s.log.stats().dirty_bytes > s.cfg.max_dirty_bytes.bytes() {
        return Some(last);
    }
    let used = s.log.used_permille();
    let target = if used >= u64::from(s.cfg.high_watermark) * 10 { u64::from(s.cfg.low_watermark) * 10 } else { 1000 };
    s.log.due(target, s.cfg.max_dirty_age.get())
}

/// [`round`], with the round under way in [`Ctl::round`] for [`watch`] to see, and the end of
/// a reported stall logged.
fn timed_round<D: DataPath>(s: &Shared<D>, through: u64) -> Result<(), String> {
    s.ctl.lock().round = Some(RoundUnderWay { since: Instant::now(), file: String::new(), warned: None });
    let r = round(s, through);
    let ended = s.ctl.lock().round.take();
    if let Some(RoundUnderWay { since, warned: Some(_), .. }) = ended {
        tracing::warn!(
            "tier {}: the write-back stalled on the backing store moves again: the round ended after {:.1?} ({})",
            s.path,
            since.elapsed(),
            if r.is_ok() { "written back" } else { "failed, retried" }
        );
    }
    r
}

/// The stall watcher's thread: reports a destage round that has waited on the backing store
/// for `tier.stall_warning` — a write or a sync that does not complete (a hung disk, a dead
/// network file system) — counts it once, and reports it again every `stall_warning` while it
/// lasts. It only watches: nothing is given up, the data stays dirty in the tier. Looks once
/// a second at most; exits on `stop`.
pub(crate) fn watch<D: DataPath>(s: &Shared<D>) {
    let limit = s.cfg.stall_warning.get();
    let mut c = s.ctl.lock();
    loop {
        if c.stop {
            return;
        }
        s.done_cv.wait_for(&mut c, limit.min(Duration::from_secs(1)));
        if c.stop {
            return;
        }
        let Some(r) = c.round.as_mut() else { continue };
        let waited = r.since.elapsed();
        if waited < limit || r.warned.is_some_and(|w| w.elapsed() < limit) {
            continue;
        }
        if r.warned.is_none() {
            add(&s.counters.destage_stalls, 1);
        }
        r.warned = Some(Instant::now());
        let file = if r.file.is_empty() { "planning".to_string() } else { format!("writing back {}", r.file) };
        parking_lot::MutexGuard::unlocked(&mut c, || {
            tracing::error!(
                "tier {}: the write-back has waited {:.0?} on the backing store ({file}): a write or sync there does \
                 not complete — check the backing disk or network file system. Nothing is lost: the data stays dirty \
                 in the tier and reads see it; once the tier is full, writes go to the backing store and wait for \
                 it too",
                s.path,
                waited
            )
        });
    }
}

/// The round under way as `farcache stats` shows it: how long it has run (ms, 0: none),
/// and the file it waits on once [`watch`] reported it stalled.
pub(crate) fn round_state<D: DataPath>(s: &Shared<D>) -> (u64, Option<String>) {
    let c = s.ctl.lock();
    match &c.round {
        Some(r) => (
            (r.since.elapsed().as_millis() as u64).max(1),
            r.warned.map(|_| if r.file.is_empty() { "planning".to_string() } else { r.file.clone() }),
        ),
        None => (0, None),
    }
}

/// One round through `through` (module docs).
fn round<D: DataPath>(s: &Shared<D>, through: u64) -> Result<(), String> {
    add(&s.counters.destage_rounds, 1);
    let mut batch = SyncBatch::open(s).map_err(|e| format!("cannot open the backing root to sync it: {e}"))?;
    for plan in s.log.plan(through) {
        if let Some(r) = s.ctl.lock().round.as_mut() {
            r.file = describe(&plan.name);
        }
        let fe = s.keys.lock().get(&plan.key).cloned();
        let Some(fe) = fe else {
            if !s.log.has_dirty(plan.key) {
                continue; // a deleted file's, dropped since the plan (`discard`)
            }
            return Err(format!(
                "file key {} has {} dirty blocks but no open entry (name {})",
                plan.key.0,
                plan.blocks.len(),
                String::from_utf8_lossy(&plan.name)
            ));
        };
        let _m = fe.meta.lock();
        let written = write_back_unsynced(s, &fe, Some(&plan.blocks.iter().map(|(b, _)| *b).collect::<Vec<_>>()))
            .map_err(|e| format!("{}: {e}", describe(&plan.name)))?;
        if let Some((rw, n)) = written {
            batch.add(rw, n, n * B).map_err(|e| format!("{}: {e}", describe(&plan.name)))?;
        }
        if batch.full() {
            if let Some(r) = s.ctl.lock().round.as_mut() {
                r.file = format!("syncing {} files written back", batch.files);
            }
            let next = SyncBatch::open(s).map_err(|e| format!("cannot open the backing root to sync it: {e}"))?;
            std::mem::replace(&mut batch, next).sync(s).map_err(|e| format!("syncing the backing store: {e}"))?;
        }
    }
    if let Some(r) = s.ctl.lock().round.as_mut() {
        r.file = format!("syncing {} files written back", batch.files);
    }
    batch.sync(s).map_err(|e| format!("syncing the backing store: {e}"))?;
    match s.log.free_through(through) {
        // No room to declare again the names of files with newer records: go through
        // everything, which needs none.
        Err(farcache_tier::AppendError::Full) if through < s.log.last_seq() => round(s, s.log.last_seq()),
        r => {
            r.map_err(|e| e.to_string())?;
            forget_clean(s);
            Ok(())
        }
    }
}

/// Drop the entries of files that hold nothing dirty any more and that no request is using
/// (only the two maps hold them): their descriptors close, and the entries of files a long
/// run wrote once do not pile up. A later write makes a new entry (and declares a new key).
fn forget_clean<D: DataPath>(s: &Shared<D>) {
    let mut files = s.files.lock();
    let gone: Vec<crate::identity::FileId> = files
        .iter()
        .filter(|(_, fe)| std::sync::Arc::strong_count(fe) == 2 && !s.log.has_dirty(fe.key))
        .map(|(id, _)| *id)
        .collect();
    for id in gone {
        if let Some(fe) = files.remove(&id) {
            s.keys.lock().remove(&fe.key);
        }
    }
}

fn describe(name: &[u8]) -> String {
    match FileName::decode(name) {
        Some(n) if !n.path.is_empty() => n.path,
        Some(n) => format!("inode {}", n.ino),
        None => "a file".into(),
    }
}

/// Merged writes of one file a destage round has in flight at once while the applications
/// are using the mount: a batch is written in groups of this many. A batch also holds up to
/// this many `tier.destage_write`s' worth of bytes, and at most [`DESTAGE_BATCH_RUNS`] runs
/// (scattered single blocks). At most two batches exist per file's write-back, one being
/// written and one being filled: the memory a round holds.
///
/// Measured (BENCHMARKS.md, issue 12, session 28): a durable writer's p99 beside a flush on
/// two vCPUs was 93–124 µs with groups of 4, 87–109 µs with groups of 2, and 169–308 µs
/// with a whole batch at once (the I/O engine's queue depth, 32) — which wrote scattered
/// blocks back 1.4× as fast. So a whole batch goes at once only once no application I/O
/// has reached the mount for [`DEEP_AFTER_QUIET`]: faster when the mount is idle.
const DESTAGE_IN_FLIGHT: usize = 4;
/// Runs of one batch, at most.
const DESTAGE_BATCH_RUNS: usize = 256;

/// The merged runs of one batch, in one block-aligned buffer (each run starts on a block
/// boundary of it, so that whole-block runs can be written `O_DIRECT` from where they lie).
struct Batch {
    buf: crate::aligned::AlignedBuf,
    /// (first block, where in `buf`, bytes)
    runs: Vec<(u64, usize, usize)>,
}

impl Batch {
    fn new(capacity: usize) -> Batch {
        Batch { buf: crate::aligned::AlignedBuf::with_capacity(capacity, B as usize), runs: Vec::new() }
    }

    /// Whether block `b` extends the last run: right after it, which ends on a whole block,
    /// and still within `max` bytes.
    fn extends(&self, b: u64, max: usize) -> bool {
        self.runs.last().is_some_and(|&(start, _, len)| {
            (len as u64).is_multiple_of(B) && start + len as u64 / B == b && len + B as usize <= max
        })
    }

    /// Whether a new run of up to `most` bytes fits.
    fn has_room(&self, most: usize) -> bool {
        self.runs.len() < DESTAGE_BATCH_RUNS
            && self.buf.filled().next_multiple_of(B as usize) + most <= self.buf.capacity()
    }

    /// A new run at block `b` (the caller checked [`Batch::has_room`]).
    fn start_run(&mut self, b: u64) {
        const ZEROS: [u8; B as usize] = [0; B as usize];
        let pad = self.buf.filled().next_multiple_of(B as usize) - self.buf.filled();
        self.buf.extend_from_slice(&ZEROS[..pad]);
        self.runs.push((b, self.buf.filled(), 0));
    }

    fn append(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        self.runs.last_mut().expect("a run was started").2 += data.len();
    }

    /// The runs as writes: (offset in the file, bytes).
    fn writes(&self) -> Vec<(u64, &[u8])> {
        let all = self.buf.as_ref();
        self.runs.iter().map(|&(b, at, len)| (b * B, &all[at..at + len])).collect()
    }
}

/// Write `blocks` of `fe` (all its dirty blocks with `None`) back through the path below,
/// merged, then fdatasync the file. The caller holds `fe.meta`.
///
/// A pipeline of two: this thread reads the blocks from the tier, merges them into runs and
/// the runs into batches ([`Batch`]); a file of more than one batch has them written by a
/// helper thread, started for the file and fed through a rendezvous queue, while the next is
/// read. A batch goes down as one [`DataPath::write_many`]: the I/O engine submits its runs
/// together, so the disk gets a queue. Before (session 28), each run was handed to one of four
/// helper threads and written alone: scattered blocks cost a hand-off and a ring wait each —
/// 45,711 context switches of the destage threads in 5 s of a flush beside a durable writer,
/// whose p99 the write-back's CPU then raised 4× on two vCPUs (BENCHMARKS.md, issue 12).
///
/// Through the tier's descriptor of the file, opened again by its name if the tier let go of
/// it (held until the write-back ends). A file that is gone (deleted, its inode freed) has its
/// records dropped instead; one that cannot be opened now (out of descriptors, say) fails the
/// write-back: its data stays dirty, and the round is retried.
pub(crate) fn write_back_file<D: DataPath>(s: &Shared<D>, fe: &FileEntry, blocks: Option<&[u64]>) -> io::Result<()> {
    if let Some((rw, n)) = write_back_unsynced(s, fe, blocks)? {
        s.inner.fsync(&rw, true)?;
        add(&s.counters.destaged_blocks, n);
    }
    Ok(())
}

/// [`write_back_file`] without its sync: the descriptor it wrote through (held, so that its
/// sync reports what the kernel's write-back of these pages meets) and the blocks written;
/// `None` if it wrote nothing (nothing left, or the file is gone).
pub(crate) fn write_back_unsynced<D: DataPath>(
    s: &Shared<D>,
    fe: &FileEntry,
    blocks: Option<&[u64]>,
) -> io::Result<Option<(std::sync::Arc<BackingFile>, u64)>> {
    let Some(rw_held) = s.rw(fe, None)? else {
        tracing::warn!(
            "tier: file key {} was deleted before its dirty blocks were written back; they are dropped",
            fe.key.0
        );
        s.drop_deleted(fe);
        return Ok(None);
    };
    let rw: &BackingFile = &rw_held;
    let mut list: Vec<u64> = match blocks {
        Some(b) => b.to_vec(),
        None => s.log.dirty_in(fe.key, 0, u64::MAX).into_iter().map(|(b, _)| b).collect(),
    };
    list.sort_unstable();
    let max = s.cfg.destage_write.bytes() as usize;
    // No bigger than the file's dirty blocks need (one pad after a partial last block).
    let capacity = (DESTAGE_IN_FLIGHT * max).min((list.len() + 1) * B as usize);
    let total = list.len();
    let write = |batch: &Batch| -> io::Result<()> {
        let writes = batch.writes();
        // A quiet mount: all of it at once (the engine's queue depth bounds it).
        let idle = quiet_for(s) >= DEEP_AFTER_QUIET;
        let group = if idle { writes.len().max(1) } else { DESTAGE_IN_FLIGHT };
        if idle {
            add(&s.counters.destage_batches_deep, 1);
        }
        for w in writes.chunks(group) {
            s.inner.write_many(rw, w)?;
        }
        add(&s.counters.destaged_bytes, writes.iter().map(|(_, d)| d.len() as u64).sum());
        Ok(())
    };
    let n = std::thread::scope(|sc| -> io::Result<u64> {
        let mut writer = Writer::new(sc, &write);
        let mut batch = Batch::new(capacity);
        let mut n = 0u64;
        // Newest contents now (gone if cut or dropped since the plan), read in runs.
        // Reads of the tier as the writes below: a few at a time beside applications (the
        // tier's own commits share its device), all at once on a quiet mount.
        let depth = || if quiet_for(s) >= DEEP_AFTER_QUIET { usize::MAX } else { DESTAGE_IN_FLIGHT };
        s.log.read_blocks(fe.key, &list, depth, |b, data| {
            if !batch.extends(b, max) {
                // A run starting here grows to `max` at most, and to the blocks left (at most
                // those not read yet).
                let most = max.min((total - n as usize) * B as usize);
                if !batch.has_room(most) {
                    debug_assert!(!batch.runs.is_empty(), "an empty batch holds any run");
                    if writer.failed() {
                        return false; // the round fails anyway: read no further
                    }
                    let next = writer.spare().unwrap_or_else(|| Batch::new(capacity));
                    writer.push(std::mem::replace(&mut batch, next));
                }
                batch.start_run(b);
            }
            batch.append(data);
            n += 1;
            true
        })?;
        if !batch.runs.is_empty() {
            writer.push(batch);
        }
        writer.finish().map(|()| n)
    })?;
    Ok((n > 0).then_some((rw_held, n)))
}

/// Files a destage round writes back before one sync makes them durable, and their bytes.
/// One `syncfs` per batch instead of an `fdatasync` per file: on ext4 each of those is a
/// journal commit and a cache flush, and postmark's 30,000 small files through a tier wrote
/// 2.7 times the passthrough's bytes to the disk, at 6.7 times its write requests
/// (BENCHMARKS.md, session 36). Bounded, so that what a round leaves unsynced in the
/// backing's page cache (the daemon's memory) stays small.
const SYNC_BATCH_FILES: usize = 512;
const SYNC_BATCH_BYTES: u64 = 64 << 20;

/// The files of a round written back since the last sync ([`SYNC_BATCH_FILES`]).
struct SyncBatch {
    /// Each backing root, opened before any of the batch's writes (its `syncfs` reports a
    /// write-back error of any file on that file system since then), and whether a file of
    /// the batch is on it.
    roots: Vec<(u64, std::fs::File, bool)>,
    /// The first file's descriptor (a batch of one is synced by its own `fdatasync`), and
    /// those of files on no root's file system (one mounted inside the backing directory):
    /// held until synced. The others need none: a root's `syncfs` covers them.
    first: Option<std::sync::Arc<BackingFile>>,
    foreign: Vec<std::sync::Arc<BackingFile>>,
    files: usize,
    blocks: u64,
    bytes: u64,
}

impl SyncBatch {
    fn open<D: DataPath>(s: &Shared<D>) -> io::Result<SyncBatch> {
        use std::os::unix::fs::MetadataExt;
        let roots = s
            .roots
            .iter()
            .map(|r| {
                let f = super::name::open_root(r)?;
                Ok((f.metadata()?.dev(), f, false))
            })
            .collect::<io::Result<_>>()?;
        Ok(SyncBatch { roots, first: None, foreign: Vec::new(), files: 0, blocks: 0, bytes: 0 })
    }

    /// `blocks` blocks (`bytes` bytes) of the file `rw` written back.
    fn add(&mut self, rw: std::sync::Arc<BackingFile>, blocks: u64, bytes: u64) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let dev = rw.file().metadata()?.dev();
        match self.roots.iter_mut().find(|(d, _, _)| *d == dev) {
            Some(r) => r.2 = true,
            None => self.foreign.push(rw.clone()),
        }
        self.first.get_or_insert(rw);
        self.files += 1;
        self.blocks += blocks;
        self.bytes += bytes;
        Ok(())
    }

    fn full(&self) -> bool {
        self.files >= SYNC_BATCH_FILES || self.bytes >= SYNC_BATCH_BYTES
    }

    /// Make the batch durable: one file by its own `fdatasync`; several by a `syncfs` of each
    /// backing file system they are on, and an `fdatasync` of each file on none.
    fn sync<D: DataPath>(self, s: &Shared<D>) -> io::Result<()> {
        match (self.files, &self.first) {
            (0, _) | (_, None) => return Ok(()),
            (1, Some(rw)) => s.inner.fsync(rw, true)?,
            _ => {
                for rw in &self.foreign {
                    s.inner.fsync(rw, true)?;
                }
                for (_, root, _) in self.roots.iter().filter(|r| r.2) {
                    s.inner.sync_fs(root)?;
                }
                add(&s.counters.destage_fs_syncs, 1);
            }
        }
        add(&s.counters.destaged_blocks, self.blocks);
        Ok(())
    }
}

/// The helper thread of one file's write-back ([`write_back_file`]). A file of one batch
/// writes it on the caller's thread and starts none.
struct Writer<'scope, 'env, W: Fn(&Batch) -> io::Result<()> + Sync> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    write: &'env W,
    /// The first batch, held back until a second one shows that a helper is worth starting.
    first: Option<Batch>,
    queue: Option<std::sync::mpsc::SyncSender<Batch>>,
    /// Batches the helper has written, emptied, for the reader to fill again.
    spares: std::sync::Arc<parking_lot::Mutex<Vec<Batch>>>,
    helper: Option<std::thread::ScopedJoinHandle<'scope, ()>>,
    /// The first error the helper met; it then skips the rest.
    error: std::sync::Arc<parking_lot::Mutex<Option<io::Error>>>,
}

impl<'scope, 'env, W: Fn(&Batch) -> io::Result<()> + Sync> Writer<'scope, 'env, W> {
    fn new(scope: &'scope std::thread::Scope<'scope, 'env>, write: &'env W) -> Self {
        Writer {
            scope,
            write,
            first: None,
            queue: None,
            spares: Default::default(),
            helper: None,
            error: Default::default(),
        }
    }

    fn failed(&self) -> bool {
        self.error.lock().is_some()
    }

    fn spare(&self) -> Option<Batch> {
        self.spares.lock().pop()
    }

    fn push(&mut self, batch: Batch) {
        if self.queue.is_none() {
            if self.first.is_none() {
                self.first = Some(batch);
                return;
            }
            self.start();
        }
        let q = self.queue.as_ref().expect("started");
        if let Some(first) = self.first.take() {
            let _ = q.send(first);
        }
        let _ = q.send(batch); // waits for the helper to be free: the memory bound
    }

    fn start(&mut self) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(0);
        let (error, spares, write) = (self.error.clone(), self.spares.clone(), self.write);
        self.helper = Some(self.scope.spawn(move || {
            while let Ok(mut batch) = rx.recv() {
                if error.lock().is_some() {
                    continue; // drain: the round fails anyway
                }
                if let Err(e) = write(&batch) {
                    error.lock().get_or_insert(e);
                }
                batch.runs.clear();
                batch.buf.clear();
                spares.lock().push(batch);
            }
        }));
        self.queue = Some(tx);
    }

    /// Every batch written (or the first error).
    fn finish(mut self) -> io::Result<()> {
        if let Some(first) = self.first.take() {
            (self.write)(&first)?;
        }
        drop(self.queue.take());
        if let Some(h) = self.helper.take() {
            if h.join().is_err() {
                self.error.lock().get_or_insert(io::Error::other("destage writer panicked"));
            }
        }
        match self.error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Destage the log through seq `through` and wait (module docs of `super`); with `None`, also
/// what is written meanwhile, until the tier is clean (a shutdown, whose later writes go
/// through).
pub(crate) fn flush<D: DataPath>(
    s: &Shared<D>,
    through: Option<u64>,
    timeout: Duration,
    progress: &mut dyn FnMut(u64),
) -> Result<(), FlushError> {
    let t0 = Instant::now();
    let ticket = {
        let mut c = s.ctl.lock();
        let target = through.unwrap_or(u64::MAX);
        // One target serves every pending flush: the furthest one asked for.
        c.flush_target = if c.flush_asked > c.flush_done { c.flush_target.max(target) } else { target };
        c.flush_asked += 1;
        c.failures_since_ask = 0;
        c.retry_at = None; // an operator asking: try now
        c.flush_asked
    };
    s.kick();
    let mut last_report = Instant::now();
    loop {
        let mut c = s.ctl.lock();
        if c.flush_done >= ticket {
            return Ok(());
        }
        if c.failures_since_ask > 0 {
            return Err(FlushError::Destage(c.last_error.clone().unwrap_or_default()));
        }
        if c.stop {
            return Err(FlushError::Destage("the destager stopped".into()));
        }
        if t0.elapsed() >= timeout {
            return Err(FlushError::Timeout(timeout, s.log.stats().dirty_bytes));
        }
        s.done_cv.wait_for(&mut c, Duration::from_millis(200));
        drop(c);
        if last_report.elapsed() >= Duration::from_secs(1) {
            progress(s.log.stats().dirty_bytes);
            last_report = Instant::now();
        }
    }
}

/// At start: find the file of every key with records. Where every such file has a
/// file-system inode generation, its identity here is the one the FUSE layer will compute, so
/// the files are registered and served from the tier at once, and the destager writes them
/// back first thing. Otherwise (a backing file system without generations) everything is
/// written back before the mount serves anything.
pub(crate) fn recover<D: DataPath>(s: &Shared<D>) -> Result<(), TierOpenError> {
    let t0 = Instant::now();
    let err = |problem: String, fix: &str| TierOpenError::Config { path: s.path.clone(), problem, fix: fix.into() };
    let root_fd = super::name::open_root(&s.root).map_err(|e| {
        err(format!("cannot open the backing root {}: {e}", s.root.display()), "check the backing directory")
    })?;
    let roots = match s.union.is_some() {
        true => s
            .roots
            .iter()
            .map(|r| {
                super::name::Root::open(r).map_err(|e| {
                    err(format!("cannot open the backing branch {}: {e}", r.display()), "check the backing directories")
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        false => Vec::new(),
    };
    let through = s.log.last_seq();
    let ids = crate::identity::Identities::new();
    for plan in s.log.plan(through) {
        let Some(name) = FileName::decode(&plan.name) else {
            return Err(err(
                format!("file key {} has {} dirty blocks but an unreadable name", plan.key.0, plan.blocks.len()),
                "keep the tier file and report this as a bug",
            ));
        };
        // A union's file by its farcache id, wherever the union's moves left it.
        let located = match (&s.union, name.union_id) {
            (Some(u), Some(_)) => name.locate_union(&roots, u.as_ref()),
            (None, None) => name.locate(&s.root, &root_fd),
            (Some(_), None) | (None, Some(_)) => {
                return Err(err(
                    format!(
                        "{} dirty blocks of {} were written through a mount {} several backing directories",
                        plan.blocks.len(),
                        describe(&plan.name),
                        if name.union_id.is_some() { "of" } else { "without" }
                    ),
                    "mount the backing directories the tier was used with (farcache tier status shows them)",
                ))
            }
        };
        match located {
            Located::Found(f) => {
                let id = match name.union_id {
                    Some(u) => crate::identity::FileId::union(u),
                    None => {
                        ids.identify(&f).map_err(|e| err(format!("{}: {e}", name.path), "check the backing file"))?
                    }
                };
                // The size the records imply (a power cut may have lost the extension that
                // came with them): the mount serves the file at once, and the kernel reads
                // no further than its size.
                let end = plan.blocks.iter().map(|(b, r)| b * B + u64::from(r.valid)).max().unwrap_or(0);
                if f.metadata().map(|m| m.len() < end).unwrap_or(false) {
                    f.set_len(end).map_err(|e| {
                        err(format!("{}: cannot restore its size: {e}", name.path), "check the backing file")
                    })?;
                }
                let rw = BackingFile::new(id, f, libc::O_RDWR, &s.backing_opts);
                let pinned = s.pinned_by(&name);
                let fe =
                    std::sync::Arc::new(FileEntry::new(plan.key, plan.name.clone(), rw, pinned, &s.descriptors, false));
                s.keys.lock().insert(plan.key, fe);
                // Thousands of dirty files: no more descriptors than the budget meanwhile.
                s.let_go();
            }
            Located::Gone => {
                tracing::warn!(
                    "tier: {} was deleted after its last {} writes reached the tier; they are dropped",
                    describe(&plan.name),
                    plan.blocks.len()
                );
                drop_key(&s.log, plan.key);
            }
            Located::Lost(why) => {
                return Err(err(
                    format!("{} dirty blocks of a file cannot be found: {why}", plan.blocks.len()),
                    "run the mount (or `farcache tier recover`) as root, which finds files by handle even after a \
                     rename, or move the file back to its recorded path",
                ));
            }
        }
    }
    let entries: Vec<std::sync::Arc<FileEntry>> = s.keys.lock().values().cloned().collect();
    let stable = entries.iter().all(|fe| matches!(fe.id.generation, crate::identity::Generation::Fs(_)));
    if stable {
        let mut files = s.files.lock();
        for fe in entries {
            files.insert(fe.id, fe);
        }
        s.ctl.lock().recovered_through = Some(through);
        tracing::info!(
            "tier {}: {} records of {} files recovered and served from the tier; writing them back now ({} ms)",
            s.path,
            s.log.stats().dirty_blocks,
            files.len(),
            t0.elapsed().as_millis()
        );
        return Ok(());
    }
    let r = round(s, through).map_err(|e| {
        err(
            format!("recovery could not write the tier's records back: {e}"),
            "free space or fix the backing store, then mount again (nothing was lost: the records stay in the tier)",
        )
    });
    s.keys.lock().clear();
    r?;
    let n = s.counters.destaged_blocks.load(Ordering::Relaxed);
    tracing::info!("tier {}: recovered {n} blocks into the backing files in {} ms", s.path, t0.elapsed().as_millis());
    Ok(())
}

fn drop_key(log: &Log, key: farcache_tier::FileKey) {
    let e = || farcache_tier::Entry::Drop { key, through: u64::MAX };
    if log.append(farcache_tier::Append { entries: vec![e()], names: Vec::new(), reserve: true, lazy: false }).is_err()
    {
        log.apply_unlogged(&e());
    }
}
