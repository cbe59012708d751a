//! [`CachedPath`]: the data path with lenders' RAM in front of the disk (paper 000's DC
//! client, in user space).
//!
//! - Each read is routed by the [`Router`] the path was built with: paper 000's fixed
//!   threshold (reads of fewer than n = 32 blocks to the lenders, larger ones — a sequential
//!   stream's readahead — to the disk), or the adaptive rule, which sends each read where the
//!   measured costs say it finishes sooner (see `routing.rs`; every disk read and every fetch
//!   is timed for it).
//! - A read routed to the lenders asks the index; when every block it covers is on a lender,
//!   it is answered from there. When some are, it fetches those and reads from the disk one
//!   span, from the first block the lenders miss to the last (a *partial hit*; a block a
//!   lender fails to deliver joins the span), and assembles the answer. When none are, or the
//!   span is the whole read, it reads the whole-block range from the disk. Either way it sends
//!   the full blocks it read from the disk that no lender holds to their lenders in the
//!   background (a *fill*). A read routed to the disk goes straight there and fills nothing.
//!   A block whose fill (under the same key) is still on its way is not sent again
//!   ([`PendingFills`]).
//! - *Read-around*: a small read routed to the lenders that misses entirely reads the aligned
//!   window of `read_around` blocks that holds it and fills the lenders with all of it, so
//!   that the neighbours the kernel's readahead asks for on a later pass are on the lenders
//!   too. On a disk bound by operations (a cloud volume's IOPS cap, a seek) the wider read
//!   costs nothing more; on one bound by bytes, 16 KiB is still far below a stream's share.
//!   The adaptive rule times every fetch and every disk read, partial hits' included.
//! - Writes, truncates and fallocates go to the disk first; then the blocks they touched get
//!   new versions in the index (their old copies become unreachable; the other blocks of
//!   their chunks stay reachable, see `index.rs`) and the old copies are deleted in the
//!   background. Nothing waits on a lender.
//! - Whatever a lender does — no answer, a late answer, a wrong-length answer, a dead
//!   connection, leaving the set — the read falls back to the disk within `fetch_timeout`.
//! - [`CachedPath::stats`] is the operator's view: every counter of the engine, the remote
//!   tier and the disk, the index's size, the routing rule and the lender set.
//!
//! Only whole 4 KiB blocks are cached: a short block at the end of a file never is, so a file
//! that grows can never be answered with its old, shorter tail.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use crate::aligned::AlignedBuf;
use farcache_policy::route::Route;
use serde::{Deserialize, Serialize};

use crate::backing::BackingFile;
use crate::data_path::{CopyRead, DataPath};
use crate::identity::FileId;
use crate::index::{BlockIndex, BlockKey, FileIndex, Stamp, BLOCK_BYTES};
use crate::io::Meanwhile;
use crate::remote::Remote;
use crate::routing::{Decision, Router, RouterState, STREAM_PROBE_MIN_BYTES};
use crate::stats::{CacheStats, IndexStats, RoutingStats};

/// Blocks a copy ([`DataPath::copy_read_held`]) fetches from the lenders at a time (128 KiB: at
/// 1 Gbit/s about a millisecond of the link, the most an application's fetch waits behind
/// one).
pub const COPY_FETCH_BLOCKS: usize = 32;

/// Counters of the cache engine beyond the remote tier's own.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Reads answered wholly from lenders.
    pub remote_reads: AtomicU64,
    /// Reads the threshold rule sent to the disk because they were large (a sequential
    /// stream).
    pub sequential_bypasses: AtomicU64,
    /// Reads routed to the lenders that went wholly to the disk (nothing usable held, or
    /// the blocks missing spanned the whole read).
    pub disk_reads: AtomicU64,
    /// Reads routed to the lenders answered partly from lenders and partly from one disk
    /// read of the blocks they miss.
    pub partial_hits: AtomicU64,
    /// Of `partial_hits`: blocks served from lenders.
    pub partial_remote_blocks: AtomicU64,
    /// Of `partial_hits`: blocks read from the disk (the span from the first missing block to
    /// the last).
    pub partial_disk_blocks: AtomicU64,
    /// Of `partial_hits`: those whose disk read was in flight while the lenders were asked
    /// (the disk's part known before the fetch), on one thread.
    pub partial_overlapped: AtomicU64,
    /// Blocks sent to lenders after a disk read.
    pub fills: AtomicU64,
    /// Of `fills`: seeds, made only so that the routing's probes find blocks to measure the
    /// lenders on (`Decision::seed` in `routing.rs`; sent in batches, `outbox::SEED_WINDOW`).
    pub seed_fills: AtomicU64,
    /// Blocks read from the disk again while their fill (under the same key) was still on
    /// its way to the lender: not sent a second time.
    pub fills_pending_skipped: AtomicU64,
    /// Misses read with their read-around window (more blocks than asked, all filled).
    pub read_arounds: AtomicU64,
    /// Reads the adaptive rule routed to the lenders.
    pub adaptive_remote: AtomicU64,
    /// Reads the adaptive rule routed to the disk (probes included).
    pub adaptive_disk: AtomicU64,
    /// Of `adaptive_disk`: reads fetched from the lenders anyway, to measure them.
    pub adaptive_probes: AtomicU64,
    /// Opens that found a file changed behind the mount (its cached blocks were dropped).
    pub changed_behind: AtomicU64,
}

/// A point-in-time copy of [`EngineCounters`], field for field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCountersSnapshot {
    pub remote_reads: u64,
    pub sequential_bypasses: u64,
    pub disk_reads: u64,
    #[serde(default)]
    pub partial_hits: u64,
    #[serde(default)]
    pub partial_remote_blocks: u64,
    #[serde(default)]
    pub partial_disk_blocks: u64,
    #[serde(default)]
    pub partial_overlapped: u64,
    pub fills: u64,
    #[serde(default)]
    pub seed_fills: u64,
    #[serde(default)]
    pub fills_pending_skipped: u64,
    #[serde(default)]
    pub read_arounds: u64,
    pub adaptive_remote: u64,
    pub adaptive_disk: u64,
    pub adaptive_probes: u64,
    pub changed_behind: u64,
}

impl EngineCounters {
    pub fn snapshot(&self) -> EngineCountersSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EngineCountersSnapshot {
            remote_reads: l(&self.remote_reads),
            sequential_bypasses: l(&self.sequential_bypasses),
            disk_reads: l(&self.disk_reads),
            partial_hits: l(&self.partial_hits),
            partial_remote_blocks: l(&self.partial_remote_blocks),
            partial_disk_blocks: l(&self.partial_disk_blocks),
            partial_overlapped: l(&self.partial_overlapped),
            fills: l(&self.fills),
            seed_fills: l(&self.seed_fills),
            fills_pending_skipped: l(&self.fills_pending_skipped),
            read_arounds: l(&self.read_arounds),
            adaptive_remote: l(&self.adaptive_remote),
            adaptive_disk: l(&self.adaptive_disk),
            adaptive_probes: l(&self.adaptive_probes),
            changed_behind: l(&self.changed_behind),
        }
    }
}

/// Lenders' RAM in front of `disk`.
pub struct CachedPath<D: DataPath> {
    disk: D,
    remote: Remote,
    index: Arc<BlockIndex>,
    routing: RouterState,
    counters: EngineCounters,
    /// Read-around window in blocks (0 or 1: off).
    read_around: u64,
    /// Keys whose fill is on its way to a lender.
    pending: Arc<PendingFills>,
}

/// Shards of [`PendingFills`] (each with its own lock).
const PENDING_SHARDS: usize = 16;

/// The keys of the fills on their way to lenders: a block read from the disk again before
/// its fill landed (a read-around window read twice, a hot block missed by several readers
/// at once) is not sent again. A key leaves the set when its fill is settled — stored,
/// failed or dropped — through the [`PendingFill`] its completion holds, which is dropped
/// on every one of those paths. Bounded by the fills in flight (`max_pending_puts`).
#[derive(Default)]
struct PendingFills {
    shards: [parking_lot::Mutex<hashbrown::HashSet<BlockKey>>; PENDING_SHARDS],
}

impl PendingFills {
    fn shard(&self, key: &BlockKey) -> &parking_lot::Mutex<hashbrown::HashSet<BlockKey>> {
        let h =
            crate::index::mix(key.block ^ (key.file as u64) ^ ((key.file >> 64) as u64).rotate_left(32) ^ key.version);
        &self.shards[h as usize % PENDING_SHARDS]
    }

    /// Claim `key` for a fill: `None` if one is already on its way.
    fn claim(self: &Arc<Self>, key: BlockKey) -> Option<PendingFill> {
        self.shard(&key).lock().insert(key).then(|| PendingFill { set: self.clone(), key })
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

/// A claimed fill: its key leaves [`PendingFills`] when this is dropped.
struct PendingFill {
    set: Arc<PendingFills>,
    key: BlockKey,
}

impl Drop for PendingFill {
    fn drop(&mut self) {
        self.set.shard(&self.key).lock().remove(&self.key);
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The smallest and largest of `positions`, or `None` if there are none.
fn span_of(positions: impl Iterator<Item = usize>) -> Option<(usize, usize)> {
    positions.fold(None, |s, i| Some(s.map_or((i, i), |(lo, hi): (usize, usize)| (lo.min(i), hi.max(i)))))
}

impl<D: DataPath> CachedPath<D> {
    /// Lenders reached through `remote` in front of `disk`, reads routed by `router`
    /// (a [`farcache_policy::route::Threshold`], a [`farcache_policy::route::Adaptive`], or
    /// a [`Router`]).
    pub fn new(disk: D, remote: Remote, router: impl Into<Router>) -> CachedPath<D> {
        CachedPath {
            disk,
            remote,
            index: Arc::new(BlockIndex::new()),
            routing: RouterState::new(router.into()),
            counters: EngineCounters::default(),
            read_around: 0,
            pending: Arc::default(),
        }
    }

    /// Read and fill an aligned window of `blocks` blocks around small misses (0: off).
    pub fn with_read_around(mut self, blocks: u64) -> CachedPath<D> {
        self.read_around = blocks;
        self
    }

    /// The blocks a miss of blocks `first..=last` reads from the disk: the aligned
    /// read-around window that holds them when it is larger, else just them.
    fn read_window(&self, first: u64, last: u64) -> (u64, u64) {
        let w = self.read_around;
        if w <= 1 || last - first + 1 >= w || first / w != last / w {
            return (first, last);
        }
        let lo = first / w * w;
        (lo, lo + w - 1)
    }

    pub fn disk(&self) -> &D {
        &self.disk
    }
    pub fn remote(&self) -> &Remote {
        &self.remote
    }
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// Fills on their way to lenders now, by key (a gauge; the remote tier's `puts_in_flight`
    /// is the operator's).
    pub fn fills_pending(&self) -> usize {
        self.pending.len()
    }

    /// Everything an operator may want to see, as one serializable document. Walks the
    /// index (see [`BlockIndex::memory_bytes`]): for stats, not for the data path.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            remote: self.remote.stats(),
            engine: self.counters.snapshot(),
            index: IndexStats::new(self.index.memory_bytes(), self.index.remote_blocks()),
            routing: RoutingStats {
                mode: self.routing.mode().to_string(),
                threshold_bytes: self.routing.threshold_bytes(),
                read_around_bytes: if self.read_around > 1 { self.read_around * BLOCK_BYTES } else { 0 },
                adaptive: self.routing.estimates(),
            },
            lenders: self.remote.lenders(),
            backing: self.disk.backing_counters().unwrap_or_default(),
            tier: None,
        }
    }

    /// Run `change` (which changes bytes `offset..offset + len` of `file` on the disk), then
    /// give what it touched new versions and record the file's new change stamp, so that the
    /// next open knows the change was the mount's own. Runs the bookkeeping also when the
    /// change failed part-way.
    fn changing<T>(
        &self,
        file: &BackingFile,
        offset: u64,
        len: u64,
        change: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        self.changing_ranges(file, &[(offset, len)], change)
    }

    /// [`Self::changing`] of several ranges `(offset, len)` changed at once.
    fn changing_ranges<T>(
        &self,
        file: &BackingFile,
        ranges: &[(u64, u64)],
        change: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let f = self.index.file(file.id());
        self.index.begin_change(&f);
        let r = change();
        for &(offset, len) in ranges.iter().filter(|(_, len)| *len > 0) {
            let last = offset.saturating_add(len - 1) / BLOCK_BYTES;
            let gone = self.index.invalidate(&f, offset / BLOCK_BYTES, last);
            self.routing.retired(gone.len() as u64);
            self.remote.del_async(gone);
        }
        self.index.end_change(&f, || Stamp::of(file.file()));
        r
    }

    /// A disk read, timed for the adaptive rule.
    fn disk_read(&self, file: &BackingFile, offset: u64, len: usize, sequential: bool) -> io::Result<Bytes> {
        self.disk_read_while(file, offset, len, sequential, false, &mut Meanwhile::none())
    }

    /// [`Self::disk_read`], of a read-around window when `widened` ([`RouterState::widen`]): the
    /// rule then learns what a read of the window's size costs, and takes no vote from it
    /// (only reads as asked say what serving a read from the disk costs). With `meanwhile`
    /// pending, it runs while the disk read is in flight ([`DataPath::read_while`]), and the
    /// read takes no part in the rule's measurements: its time is the longer of the two.
    fn disk_read_while(
        &self,
        file: &BackingFile,
        offset: u64,
        len: usize,
        sequential: bool,
        widened: bool,
        meanwhile: &mut Meanwhile<'_>,
    ) -> io::Result<Bytes> {
        if meanwhile.pending() {
            let data = self.disk.read_while(file, offset, len, meanwhile)?;
            meanwhile.run();
            return Ok(data);
        }
        if !self.routing.measures() {
            return self.disk.read(file, offset, len);
        }
        let stream = self.routing.stream_begin(sequential, false);
        // Timed by the disk's path (its own latency's clock reads), not again here.
        let (data, time) = self.disk.read_timed(file, offset, len)?;
        if !data.is_empty() {
            let got = data.len() as u64;
            if widened {
                self.routing.disk_read_widened(got, time);
            } else {
                self.routing.disk_read_timed(got, sequential, time);
            }
            if stream.is_some() {
                self.routing.stream_read(stream, got, Some(time.took()));
            }
        }
        Ok(data)
    }

    /// This path's name for [`PROBE_AFTER_REPLY`]: its address (a path is not moved while
    /// reads run on it; one dropped and another made at its address could at worst run the
    /// other's due probe, which its rule then claims or refuses as its own).
    fn identity(&self) -> usize {
        self as *const Self as usize
    }

    /// Run the stream probe a read of this path left on this thread ([`PROBE_AFTER_REPLY`]),
    /// if any.
    fn probe_left_on_this_thread(&self) {
        if let Some((owner, d)) = PROBE_AFTER_REPLY.get() {
            if owner == self.identity() {
                PROBE_AFTER_REPLY.set(None);
                self.probe_stream_seeds(&d);
            }
        }
    }

    /// A stream probe: fetch the last stream seeds the lenders still hold back from them, at
    /// least [`STREAM_PROBE_MIN_BYTES`] at once, and time it (the data is dropped). It runs
    /// after the read it was offered on is answered — from the disk, as decided — when the
    /// caller says so ([`DataPath::after_reply`]), else at the next read. One per probe interval
    /// like any probe, counted in `adaptive_probes`; seeds the lenders lost are forgotten
    /// (by the index and by the rule, whose streams then seed again).
    fn probe_stream_seeds(&self, d: &Decision) {
        let mut keys = Vec::new();
        let mut files = Vec::new();
        // Per seed fetched: its blocks' range in `keys`.
        let mut fetched_seeds = Vec::new();
        let mut lost = Vec::new();
        for seed @ (id, first, last) in self.routing.stream_seeds().into_iter().rev() {
            // Held first: `file` would make an entry for a file the index forgot (deleted).
            let held = self.index.holds_all(&id, first, last).then(|| self.index.file(&id)).and_then(|f| {
                let k = (first..=last).map(|b| self.index.lookup(&f, b)).collect::<Option<Vec<BlockKey>>>()?;
                Some((f, k))
            });
            match held {
                Some((f, k)) => {
                    fetched_seeds.push((seed, keys.len()..keys.len() + k.len()));
                    files.extend(std::iter::repeat_n(f, k.len()));
                    keys.extend(k);
                }
                None => lost.push(seed),
            }
            if keys.len() as u64 * BLOCK_BYTES >= STREAM_PROBE_MIN_BYTES {
                break;
            }
        }
        let bytes = keys.len() as u64 * BLOCK_BYTES;
        if bytes < STREAM_PROBE_MIN_BYTES || !self.routing.claim_remote_probe(d) {
            self.routing.stream_seeds_lost(&lost);
            return;
        }
        add(&self.counters.adaptive_probes, 1);
        let stream = self.routing.stream_probe_begin();
        let t = Instant::now();
        let fetched = self.remote.fetch(&keys, BLOCK_BYTES as usize);
        let took = t.elapsed();
        let whole = !fetched.failed && fetched.values.iter().all(Option::is_some);
        self.routing.stream_read(stream, bytes, whole.then_some(took));
        if fetched.failed {
            self.routing.remote_failed(took);
        }
        for ((k, f), v) in keys.iter().zip(&files).zip(&fetched.values) {
            if v.is_none() {
                self.index.mark_missing(f, *k);
            }
        }
        // A seed with a block the lenders did not give is lost like its blocks (the index
        // forgot them above).
        lost.extend(
            fetched_seeds
                .into_iter()
                .filter(|(_, r)| fetched.values[r.clone()].iter().any(Option::is_none))
                .map(|(s, _)| s),
        );
        self.routing.stream_seeds_lost(&lost);
    }

    /// Read the whole blocks covering `offset..offset + len` (`len > 0`) from the disk —
    /// or, with `around`, its read-around window — answer the range, and fill the lenders
    /// with the whole blocks read.
    fn read_and_fill(
        &self,
        file: &BackingFile,
        f: &Arc<FileIndex>,
        offset: u64,
        len: usize,
        sequential: bool,
        around: bool,
    ) -> io::Result<Bytes> {
        self.read_and_fill_while(file, f, offset, len, sequential, around, false, &mut Meanwhile::none())
    }

    /// A read the rule sent to the lenders that they hold none of: [`Self::read_and_fill`]
    /// with its read-around window, timed for the adaptive rule when it is a random one (what
    /// the lenders' route costs on a miss, `RouterState::lender_miss`).
    fn lender_miss(
        &self,
        file: &BackingFile,
        f: &Arc<FileIndex>,
        offset: u64,
        len: usize,
        d: &Decision,
    ) -> io::Result<Bytes> {
        let t = Instant::now();
        let r = self.read_and_fill(file, f, offset, len, d.sequential, true);
        if d.adaptive && !d.sequential && r.is_ok() {
            self.routing.lender_miss(t.elapsed());
        }
        r
    }

    /// [`Self::read_and_fill`], running `meanwhile` while the disk read is in flight; the
    /// fills are `seed`s ([`Decision::seed`]) or not.
    #[allow(clippy::too_many_arguments)]
    fn read_and_fill_while(
        &self,
        file: &BackingFile,
        f: &Arc<FileIndex>,
        offset: u64,
        len: usize,
        sequential: bool,
        around: bool,
        seed: bool,
        meanwhile: &mut Meanwhile<'_>,
    ) -> io::Result<Bytes> {
        let first = offset / BLOCK_BYTES;
        let last = (offset + len as u64 - 1) / BLOCK_BYTES;
        let window = if around { self.read_window(first, last) } else { (first, last) };
        // All but the control reads read the whole window (see `READ_AROUND_CONTROL_EVERY`).
        let widened = window != (first, last) && self.routing.widen();
        let (first, last) = if widened { window } else { (first, last) };
        if widened {
            add(&self.counters.read_arounds, 1);
        }
        // Tickets before the disk read: a write landing after this point voids them.
        let tickets: Vec<_> = (first..=last).map(|b| self.index.fill_start(f, b)).collect();
        let start = first * BLOCK_BYTES;
        let data = self.disk_read_while(
            file,
            start,
            ((last - first + 1) * BLOCK_BYTES) as usize,
            sequential,
            widened,
            meanwhile,
        )?;
        let mut fills = Vec::with_capacity(tickets.len());
        for t in tickets {
            let from = ((t.key.block - first) * BLOCK_BYTES) as usize;
            if data.len() < from + BLOCK_BYTES as usize {
                break; // end of file: never cache a short block
            }
            if self.index.lookup(f, t.key.block).is_some() {
                continue; // already there (under this key, or carried under an older one)
            }
            let Some(claim) = self.pending.claim(t.key) else {
                add(&self.counters.fills_pending_skipped, 1);
                continue; // on its way already
            };
            fills.push((t, claim, from));
        }
        let share = fills_share_read_buffer(data.len(), fills.len());
        let filled = fills.len() as u64;
        for (t, claim, from) in fills {
            let range = from..from + BLOCK_BYTES as usize;
            let block = if share { data.slice(range) } else { crate::aligned::pooled_copy(&data[range]) };
            let (index, fi) = (self.index.clone(), f.clone());
            add(&self.counters.fills, 1);
            if seed {
                add(&self.counters.seed_fills, 1);
            }
            // `claim` goes with the completion: released when the lender has the block (after
            // the index knows it), or when the fill fails or is dropped (the completion is
            // dropped uncalled).
            self.remote.put_async(t.key, block, seed, move || {
                index.fill_done(&fi, t);
                drop(claim);
            });
        }
        self.routing.filled(filled);
        let skip = (offset - start) as usize;
        Ok(if data.len() <= skip { Bytes::new() } else { data.slice(skip..data.len().min(skip + len)) })
    }
}

thread_local! {
    /// A stream probe a read on this thread found due, left for after the read's answer
    /// ([`DataPath::after_reply`]): the [`CachedPath`] it belongs to (`identity`) and the read's
    /// decision. At most one per thread: a read finds any left before it and runs it first.
    static PROBE_AFTER_REPLY: std::cell::Cell<Option<(usize, Decision)>> = const { std::cell::Cell::new(None) };
}

/// Whether the fills of `fills` blocks of a disk read of `read_bytes` send slices of its
/// buffer rather than copies. Each fill takes a copy of its block in a 4 KiB slot of the
/// shared pool (`aligned::pooled_copy`), so that the read's buffer goes with its answer —
/// unless that buffer is one of the pool's own (a direct read of 64 KiB or more) and the
/// fills are at least half of it: then its slices hold at most twice the bytes they send,
/// and copying a stream's every block would cost a memcpy per byte filled.
fn fills_share_read_buffer(read_bytes: usize, fills: usize) -> bool {
    read_bytes >= crate::aligned::READ_POOL_MIN && 2 * fills * BLOCK_BYTES as usize >= read_bytes
}

impl<D: DataPath> DataPath for CachedPath<D> {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        // A probe an earlier read on this thread left, whose caller never said it answered.
        self.probe_left_on_this_thread();
        let mut d = self.routing.decide(file.id(), offset, len as u64);
        let (first, last) = (offset / BLOCK_BYTES, (offset + len as u64 - 1) / BLOCK_BYTES);
        if d.may_probe_remote {
            // The lenders are due a measurement: this read is it if they hold all of it; a
            // stream's is the last stream seeds fetched back (see `probe_stream_seeds`).
            if d.sequential {
                // Measured once this read is answered (`after_reply`), not on its way.
                PROBE_AFTER_REPLY.set(Some((self.identity(), d)));
            } else if self.index.holds_all(file.id(), first, last) && self.routing.claim_remote_probe(&d) {
                (d.route, d.probe) = (Route::Remote, true);
            }
        }
        if d.adaptive {
            let routed_remote = d.chosen() == Route::Remote;
            add(if routed_remote { &self.counters.adaptive_remote } else { &self.counters.adaptive_disk }, 1);
        }
        if d.route == Route::Disk {
            if !d.adaptive {
                add(&self.counters.sequential_bypasses, 1);
            } else if !d.sequential && !d.probe && self.routing.held_sample() {
                // What a share of this read's kind would find on the lenders (see
                // `RouterState::lenders_held`).
                self.routing.lenders_held(self.index.holds_all(file.id(), first, last));
            }
            if d.fill {
                let f = self.index.file(file.id());
                let none = &mut Meanwhile::none();
                return self.read_and_fill_while(file, &f, offset, len, d.sequential, true, d.seed, none);
            }
            return self.disk_read(file, offset, len, d.sequential);
        }
        let f = self.index.file(file.id());
        let keys: Vec<Option<BlockKey>> = (first..=last).map(|b| self.index.lookup(&f, b)).collect();
        let held = keys.iter().filter(|k| k.is_some()).count();
        if d.adaptive && !d.sequential && !d.probe {
            self.routing.lenders_held(held == keys.len());
        }
        if held == 0 || (d.probe && held < keys.len()) {
            if d.probe {
                // A probe with nothing (or not everything) to measure goes where the rule sent it.
                return self.disk_read(file, offset, len, d.sequential);
            }
            add(&self.counters.disk_reads, 1);
            return self.lender_miss(file, &f, offset, len, &d);
        }
        if d.probe {
            add(&self.counters.adaptive_probes, 1);
        }
        // The blocks the disk must give: one span, from the first block the lenders do not
        // hold to the last (one disk read however the held blocks are scattered; a held block
        // inside it is read from the disk too, not fetched).
        let span = span_of(keys.iter().enumerate().filter(|(_, k)| k.is_none()).map(|(i, _)| i));
        if span == Some((0, keys.len() - 1)) {
            // Nothing usable from the lenders: the whole range from the disk.
            add(&self.counters.disk_reads, 1);
            return self.lender_miss(file, &f, offset, len, &d);
        }
        let wanted: Vec<usize> =
            (0..keys.len()).filter(|i| !span.is_some_and(|(lo, hi)| (lo..=hi).contains(i))).collect();
        let asked: Vec<BlockKey> = wanted.iter().map(|&i| keys[i].expect("held outside the span")).collect();
        let stream = self.routing.stream_begin(d.sequential, true);
        // With the disk's span known already, its read goes out first and the fetch runs
        // while it is in flight: one thread waits for both at once (issue 11, item 3).
        let mut fetch_and_time = None;
        let mut early: Option<(usize, usize, Bytes)> = None;
        if let Some((lo, hi)) = span {
            let mut fetch = || {
                let t = Instant::now();
                fetch_and_time = Some((self.remote.fetch(&asked, BLOCK_BYTES as usize), t.elapsed()));
            };
            let span_bytes = ((hi - lo + 1) as u64 * BLOCK_BYTES) as usize;
            let at = (first + lo as u64) * BLOCK_BYTES;
            let mut m = Meanwhile::new(&mut fetch);
            early =
                Some((lo, hi, self.read_and_fill_while(file, &f, at, span_bytes, d.sequential, false, false, &mut m)?));
            add(&self.counters.partial_overlapped, 1);
        }
        let (fetched, took) = fetch_and_time.unwrap_or_else(|| {
            let t = Instant::now();
            (self.remote.fetch(&asked, BLOCK_BYTES as usize), t.elapsed())
        });
        let stream_took = (fetched.asked > 0 && !fetched.failed).then_some(took);
        self.routing.stream_read(stream, fetched.asked as u64 * BLOCK_BYTES, stream_took);
        if self.routing.measures() {
            if fetched.asked > 0 {
                self.routing.remote_fetch(fetched.asked as u64 * BLOCK_BYTES, took);
            }
            if fetched.failed {
                self.routing.remote_failed(took);
            }
        }
        let mut values: Vec<Option<Bytes>> = vec![None; keys.len()];
        let mut missed = Vec::new();
        for ((&i, k), v) in wanted.iter().zip(&asked).zip(fetched.values) {
            match v {
                Some(v) => values[i] = Some(v),
                None => {
                    // Forget what the lenders no longer have, so it is read (and refilled) now.
                    self.index.mark_missing(&f, *k);
                    missed.push(i);
                }
            }
        }
        let skip = (offset - first * BLOCK_BYTES) as usize;
        if early.is_none() && missed.is_empty() {
            add(&self.counters.remote_reads, 1);
            if values.len() == 1 {
                let v = values.pop().flatten().expect("every block fetched");
                return Ok(v.slice(skip..skip + len));
            }
            // From the pool of read buffers (a large one), like a disk read's.
            let mut buf = AlignedBuf::with_capacity(values.len() * BLOCK_BYTES as usize, 16);
            for v in values.into_iter().flatten() {
                buf.extend_from_slice(&v);
            }
            return Ok(Bytes::from_owner(buf).slice(skip..skip + len));
        }
        if early.is_none() && span_of(missed.iter().copied()) == Some((0, keys.len() - 1)) {
            // The lenders lost the first and the last block: the whole range from the disk.
            add(&self.counters.disk_reads, 1);
            return self.read_and_fill(file, &f, offset, len, d.sequential, true);
        }
        // A partial hit: the lenders' blocks, the span read beside the fetch, and one more
        // disk read on each side of it for the blocks the lenders lost (the span they make).
        let mut parts: Vec<(usize, usize, Bytes)> = Vec::new();
        let sides = match &early {
            Some((lo, hi, _)) => {
                [span_of(missed.iter().copied().filter(|i| i < lo)), span_of(missed.iter().copied().filter(|i| i > hi))]
            }
            None => [span_of(missed.iter().copied()), None],
        };
        for (lo, hi) in sides.into_iter().flatten() {
            let at = (first + lo as u64) * BLOCK_BYTES;
            let bytes = ((hi - lo + 1) as u64 * BLOCK_BYTES) as usize;
            parts.push((lo, hi, self.read_and_fill(file, &f, at, bytes, d.sequential, false)?));
        }
        parts.extend(early);
        let from_disk: usize = parts.iter().map(|(lo, hi, _)| hi - lo + 1).sum();
        if from_disk == keys.len() {
            // The lenders lost every block they were asked for: the disk's read after all.
            add(&self.counters.disk_reads, 1);
        } else {
            add(&self.counters.partial_hits, 1);
            add(&self.counters.partial_remote_blocks, (keys.len() - from_disk) as u64);
            add(&self.counters.partial_disk_blocks, from_disk as u64);
        }
        let mut buf = AlignedBuf::with_capacity(keys.len() * BLOCK_BYTES as usize, 16);
        let b = BLOCK_BYTES as usize;
        for (i, v) in values.iter().enumerate() {
            let Some((lo, _, data)) = parts.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&i)) else {
                buf.extend_from_slice(v.as_ref().expect("a block no disk read covers was fetched"));
                continue;
            };
            let from = (i - lo) * b;
            let to = data.len().min(from + b);
            if to <= from {
                break; // the file ends before this block: so does the answer
            }
            buf.extend_from_slice(&data[from..to]);
            if to - from < b {
                break; // the file ends inside this block
            }
        }
        let buf = Bytes::from_owner(buf);
        Ok(if buf.len() <= skip { Bytes::new() } else { buf.slice(skip..buf.len().min(skip + len)) })
    }

    fn after_reply(&self) {
        self.probe_left_on_this_thread();
        self.disk.after_reply();
    }

    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        self.changing(file, offset, data.len() as u64, || self.disk.write(file, offset, data))
    }

    fn write_many(&self, file: &BackingFile, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let ranges: Vec<(u64, u64)> = writes.iter().map(|(o, d)| (*o, d.len() as u64)).collect();
        self.changing_ranges(file, &ranges, || self.disk.write_many(file, writes))
    }

    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        // Everything from the block holding the new end on may have changed.
        self.changing(file, size / BLOCK_BYTES * BLOCK_BYTES, u64::MAX / 2, || self.disk.set_len(file, size))
    }

    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        // Collapse and insert range shift everything after `offset`.
        let shifts = mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0;
        self.changing(file, offset, if shifts { u64::MAX / 2 } else { len }, || {
            self.disk.fallocate(file, mode, offset, len)
        })
    }

    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        self.disk.fsync(file, datasync)
    }

    fn sync_fs(&self, fs: &std::fs::File) -> io::Result<()> {
        self.disk.sync_fs(fs)
    }

    fn opened(&self, file: &BackingFile) {
        // A file whose stamp cannot be read is left as it is: its next change through the
        // mount still invalidates what it touched.
        let gone = self.index.revalidate(file.id(), || Stamp::of(file.file()));
        if !gone.is_empty() {
            add(&self.counters.changed_behind, 1);
            tracing::info!(file = ?file.id(), "changed behind the mount since it was last open: {} cached blocks dropped", gone.len());
        }
        self.remote.del_async(gone);
        if file.writable() {
            // Its changes' stamp is taken when it closes, not after each write.
            file.count_as_writer(|| self.index.writer_opened(file.id()));
        }
        self.disk.opened(file);
    }

    fn forget(&self, id: &FileId) {
        let gone = self.index.forget(id);
        self.remote.del_async(gone);
        self.disk.forget(id);
    }

    fn discard(&self, id: &FileId) {
        self.disk.discard(id);
    }

    fn backing_counters(&self) -> Option<crate::BackingCountersSnapshot> {
        self.disk.backing_counters()
    }

    fn io_engine(&self) -> Option<Arc<crate::IoEngine>> {
        self.disk.io_engine()
    }

    /// The disk's part of a copy: from the disk below, not through the lenders, never filled.
    fn copy_read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        self.disk.copy_read(file, offset, len)
    }

    /// The lenders' part of a copy: every block they give outside the span of those they do
    /// not (one span, from the first block they lack to the last: read later in one disk
    /// request, by [`DataPath::copy_read`]), never the disk.
    fn copy_read_held(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        if len == 0 {
            return Ok(CopyRead::default());
        }
        debug_assert!(offset.is_multiple_of(BLOCK_BYTES));
        let first = offset / BLOCK_BYTES;
        let last = (offset + len as u64 - 1) / BLOCK_BYTES;
        let f = self.index.file(file.id());
        let keys: Vec<Option<BlockKey>> = (first..=last).map(|b| self.index.lookup(&f, b)).collect();
        // The blocks between the first and the last one no lender holds come from the disk
        // anyway, in the one request for the span: asking lenders for them too would only add
        // their round trip (measured: with a lender holding a few scattered blocks of each
        // file, the copy from cache took 1.7× the disk's time). Lenders are asked for the rest.
        let nokey = (keys.iter().position(Option::is_none), keys.iter().rposition(Option::is_none));
        let inside = |i: usize| matches!(nokey, (Some(a), Some(b)) if (a..=b).contains(&i));
        let asked: Vec<(usize, BlockKey)> =
            keys.iter().enumerate().filter(|(i, _)| !inside(*i)).filter_map(|(i, k)| k.map(|k| (i, k))).collect();
        let mut got: Vec<Option<Bytes>> = vec![None; keys.len()];
        // In pieces, one after the other: the applications' fetches share the link with the
        // copy's, and one that arrives behind a piece waits for the rest of it. Measured with
        // `bench paper --experiment migrate` (one reader, 1 Gbit/s): a copy fetching 1 MiB at
        // a time took the link for 8 ms a chunk, and the reader's lender reads queued behind
        // it (BENCHMARKS.md, issue 14, session 20).
        for piece in asked.chunks(COPY_FETCH_BLOCKS) {
            let want: Vec<BlockKey> = piece.iter().map(|(_, k)| *k).collect();
            let fetched = self.remote.fetch(&want, BLOCK_BYTES as usize);
            let mut vals = fetched.values.into_iter();
            for (i, k) in piece {
                match vals.next().flatten() {
                    Some(v) => got[*i] = Some(v),
                    None => self.index.mark_missing(&f, *k),
                }
            }
        }
        // The blocks no lender gave are left to one disk request spanning them all (the
        // lenders' blocks between them read again and dropped), never filled: a copy must not
        // push the cache's working set out. One request, not one per run of missing blocks: a
        // busy disk's cost is per request (a seek; an IOPS limit), and a file lenders hold in
        // part has many short holes — measured with `bench paper --experiment migrate`, a
        // request per hole made copying from the cache slower than from the disk.
        let span = match (got.iter().position(Option::is_none), got.iter().rposition(Option::is_none)) {
            (Some(a), Some(b)) => Some((a, b)),
            _ => None,
        };
        let mut out = BytesMut::zeroed(keys.len() * BLOCK_BYTES as usize);
        let mut cache_blocks = 0u64;
        for (i, g) in got.iter().enumerate() {
            if let (Some(v), false) = (g, span.is_some_and(|(a, b)| (a..=b).contains(&i))) {
                let o = i * BLOCK_BYTES as usize;
                out[o..o + v.len()].copy_from_slice(v);
                cache_blocks += 1;
            }
        }
        out.truncate(len);
        let missing = span
            .map(|(a, b)| {
                let at = (first + a as u64) * BLOCK_BYTES;
                let end = ((first + b as u64 + 1) * BLOCK_BYTES).min(offset + len as u64);
                vec![(at, (end - at) as usize)]
            })
            .unwrap_or_default();
        Ok(CopyRead { data: out.freeze(), cache_blocks, missing, ..CopyRead::default() })
    }

    fn cached_blocks(&self, id: &FileId) -> u64 {
        self.index.file_remote_blocks(id)
    }

    fn moved(&self, id: &FileId, file: &std::fs::File) {
        self.index.restamp(id, || Stamp::of(file));
        self.disk.moved(id, file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_copy_their_blocks_unless_they_are_most_of_a_pooled_read() {
        // A small read's buffer is the allocator's: always copied, so it is freed with its answer.
        assert!(!fills_share_read_buffer(8192, 2));
        assert!(!fills_share_read_buffer(60 << 10, 15));
        // A pooled read (64 KiB and up): sliced when the fills are at least half of it.
        assert!(fills_share_read_buffer(64 << 10, 8));
        assert!(!fills_share_read_buffer(64 << 10, 7));
        assert!(fills_share_read_buffer(1 << 20, 256));
        assert!(!fills_share_read_buffer(1 << 20, 1), "one block must not hold a 1 MiB buffer");
    }
}
