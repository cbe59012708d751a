//! [`Log`]: the tier's log on a [`Medium`] (format and commit rule in `format.rs`).
//!
//! - **Appends and group commit.** A writer queues its [`Append`] (the blocks of one write,
//!   a trim, a drop) and tries the commit lock. Whoever holds it is the *leader*: it takes
//!   every queued append, packs them into shared batches at the ring's head (each append
//!   whole or not at all), writes them and updates the index; then it lets go of the commit
//!   lock and wakes the writer of the first append queued meanwhile to lead the next group,
//!   which takes the whole queue. If its group must be durable before it is acknowledged (an
//!   append that is not lazy, a commit, the lazy bound), it then flushes the medium — one
//!   flush at a time, under a flush lock of its own, so the next group is written while this
//!   one's flush runs — and a flush covers every page written before it began: a leader that
//!   finds its pages already covered by a flush that ended meanwhile flushes nothing. Each
//!   append's result goes into its writer's slot, waking that writer alone. The commit lock
//!   is held across the writes (the serialisation point of the log, by design) and the flush
//!   lock across a flush; the index lock is never held across I/O. Before session 35 the
//!   commit lock was held across the flush too, so a writer's append waited for the flush
//!   under way: an ssd tier took 3.5 writes per flush from 32 fdatasync'ing writers, now 6.7,
//!   and 1.12–1.20× the writes (BENCHMARKS.md, issue 12, session 35).
//! - **Space.** The ring frees from its tail only ([`Log::free_through`], once the caller
//!   has destaged and synced what it frees). An append that does not fit is refused with
//!   [`AppendError::Full`] — never waited for — and the caller writes through. The last
//!   `reserve` pages are kept for appends that must be logged (trims and drops, and writes
//!   to blocks that are dirty here, whose older record would otherwise win at recovery).
//! - **Reads** of dirty blocks take the record from the index, release the lock, read the
//!   page and then check that the record was not freed meanwhile (its space could have been
//!   reused) and that its checksum holds.
//! - **A failed medium** (a write or flush error) breaks the log: every later append is
//!   refused with [`AppendError::Broken`], so the caller writes through; what it had
//!   acknowledged stays readable and destageable.
//! - **Recovery** ([`Log::open`]) reads the superblocks, scans from the tail by the commit
//!   rule and rebuilds the index; the first batch that fails the rule ends the log.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::format::{data_crc, BatchHead, EntryHead, Kind, Superblock, MAX_ENTRIES, RING_START};
use crate::medium::{Medium, Mode};
use crate::page::{self, Page};
use crate::{FileKey, TierError, PAGE_BYTES};

const PB: u64 = PAGE_BYTES as u64;
/// Reads of a dirty block without a lock before [`Log::read_block`] takes the commit lock.
const OPTIMISTIC_READS: usize = 8;

/// Pages [`Log::read_blocks`] reads at once (256 KiB).
const READ_RUN_PAGES: usize = 64;

/// Most pages one leader writes before it flushes (bounds a group, and what recovery may
/// find written but never flushed after the log's end).
pub const MAX_GROUP_PAGES: u64 = 2048;

/// Unflushed pages of a lazy log after which the medium is asked to start writing them out
/// ([`Medium::start_writeback`]): 8 MiB.
const WRITEBACK_PAGES: u64 = 2048;

/// The longest a writer waits for its leader's wake-up before it looks again (a safety net:
/// every release of the commit lock wakes whoever is to go next; counted when it fires).
const WAIT_SAFETY_NET: Duration = Duration::from_millis(10);

/// What an item of a batch carries on a page of its own: a data entry's page (written from
/// where its append holds it) or a name's bytes (copied into a zero-padded page).
#[derive(Clone, Copy)]
enum Payload<'a> {
    Page(&'a Page),
    Bytes(&'a [u8]),
}

/// A page of a batch being written: held by an append, or made for the batch.
enum Paged<'a> {
    Held(&'a Page),
    Own(Box<Page>),
}

impl Paged<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Paged::Held(p) => &p.0,
            Paged::Own(p) => &p.0,
        }
    }
}

/// A batch of a group, encoded: its place in the ring, its header (and the page it is
/// encoded in), and its entries' pages in order.
struct Batch<'a> {
    at: u64,
    head: BatchHead,
    header: Box<Page>,
    pages: Vec<Paged<'a>>,
}

/// One thing an append records.
#[derive(Debug)]
pub enum Entry {
    /// Block `block` of `key`: `page`, of which the first `valid` bytes are file contents.
    Data { key: FileKey, block: u64, valid: u32, page: Box<Page> },
    /// The file's size became `size`: older records past it are gone (one that holds it is
    /// cut to it).
    Trim { key: FileKey, size: u64 },
    /// Every record of `key` up to seq `through` is gone (`u64::MAX`: every older one) — its
    /// blocks were written back and synced, or the file is gone.
    Drop { key: FileKey, through: u64 },
}

impl Entry {
    fn key(&self) -> FileKey {
        match self {
            Entry::Data { key, .. } | Entry::Trim { key, .. } | Entry::Drop { key, .. } => *key,
        }
    }
}

/// One append: durable as a whole once [`Log::append`] returns `Ok`.
#[derive(Debug, Default)]
pub struct Append {
    pub entries: Vec<Entry>,
    /// The names of the keys its entries use (declared with the first record of a key). An
    /// append of names only declares them anew (a key's newest name is the one recovery and
    /// later re-declarations use).
    pub names: Vec<(FileKey, Arc<[u8]>)>,
    /// May use the reserve (module docs).
    pub reserve: bool,
    /// May be acknowledged once written, before it is durable: a write no one asked to be
    /// synchronous. A log that commits lazily ([`Log::commit_lazily`]) flushes it with the
    /// next flush — a [`Log::commit`] (an fsync), an append that is not lazy, or its bound on
    /// unflushed pages; other logs flush it before it is acknowledged, as any append.
    pub lazy: bool,
}

impl Append {
    /// An append of nothing: a commit barrier ([`Log::commit`]).
    fn is_barrier(&self) -> bool {
        self.entries.is_empty() && self.names.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// No room: write through instead.
    #[error("the tier is full")]
    Full,
    /// The medium failed earlier: write through instead.
    #[error("the tier's medium failed: {0}")]
    Broken(String),
}

/// Where the newest record of a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    pub seq: u64,
    pub page: u64,
    pub valid: u32,
    pub crc: u32,
}

/// The records of one file a destage round writes back.
#[derive(Debug)]
pub struct FilePlan {
    pub key: FileKey,
    pub name: Arc<[u8]>,
    /// Ascending block numbers.
    pub blocks: Vec<(u64, Rec)>,
}

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    pub formatted: bool,
    pub batches: u64,
    pub records: u64,
    pub files: u64,
    /// A batch header was found after the end that failed the commit rule (a torn or
    /// unflushed append, never acknowledged): dropped.
    pub torn_tail: bool,
    pub scan_ms: u64,
}

/// The log's counters and state, for `farcache stats` and `farcache tier status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogStats {
    pub mode: String,
    pub durability: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub dirty_bytes: u64,
    pub dirty_blocks: u64,
    pub files: u64,
    pub batches: u64,
    pub appends: u64,
    pub groups: u64,
    pub refused_full: u64,
    pub broken: Option<String>,
    pub freed_batches: u64,
    /// Writers' waits for the group commit that ran their whole safety net (10 ms) instead of
    /// ending on a wake-up: the commit lock held that long, or a lost wake-up.
    pub wait_timeouts: u64,
    /// Flushes of the medium by appends (group commits), and of them those a
    /// [`Log::commit`] asked for (fsyncs, O_DSYNC writes, the age bound).
    #[serde(default)]
    pub flushes: u64,
    #[serde(default)]
    pub commits: u64,
    /// Lazy appends written and acknowledged, not yet flushed.
    #[serde(default)]
    pub unflushed_bytes: u64,
    /// Whether lazy appends are acknowledged before their flush ([`Log::commit_lazily`]).
    #[serde(default)]
    pub lazy: bool,
}

#[derive(Clone, Copy, Debug)]
struct BatchPos {
    seq: u64,
    page: u64,
    pages: u64,
    prev: u32,
    at: Instant,
}

/// The ring's write side; lives under the commit lock.
#[derive(Clone, Debug)]
struct Ring {
    head: u64,
    next_seq: u64,
    last_crc: u32,
    batches: VecDeque<BatchPos>,
    sb_gen: u64,
}

#[derive(Default)]
struct FileState {
    name: Option<Arc<[u8]>>,
    /// The seq of the batch that declared the name (recovery needs one at or after the tail).
    declared: Option<u64>,
    blocks: BTreeMap<u64, Rec>,
}

#[derive(Default)]
struct Index {
    files: HashMap<FileKey, FileState>,
    dirty: u64,
}

impl Index {
    fn apply(&mut self, seq: u64, e: &EntryHead, page: u64, name: Option<&[u8]>) {
        match e.kind {
            Kind::Data => {
                let f = self.files.entry(e.key).or_default();
                let rec = Rec { seq, page, valid: e.aux.min(PB) as u32, crc: e.data_crc };
                if f.blocks.insert(e.block, rec).is_none() {
                    self.dirty += 1;
                }
            }
            Kind::Name => {
                let f = self.files.entry(e.key).or_default();
                f.name = name.map(Arc::from);
                f.declared = Some(seq);
            }
            Kind::Trim => {
                if let Some(f) = self.files.get_mut(&e.key) {
                    let size = e.aux;
                    let keep = size.div_ceil(PB);
                    let gone = f.blocks.split_off(&keep);
                    self.dirty -= gone.len() as u64;
                    if !size.is_multiple_of(PB) {
                        if let Some(r) = f.blocks.get_mut(&(size / PB)) {
                            r.valid = r.valid.min((size % PB) as u32);
                        }
                    }
                }
            }
            Kind::Drop => {
                let Some(f) = self.files.get_mut(&e.key) else { return };
                let before = f.blocks.len();
                f.blocks.retain(|_, r| r.seq > e.aux);
                self.dirty -= (before - f.blocks.len()) as u64;
                if f.blocks.is_empty() {
                    // Its name goes too: a later record of the key declares it again.
                    self.files.remove(&e.key);
                }
            }
        }
    }
}

struct Pending {
    append: Append,
    /// Where its leader puts the result, and wakes this append's writer (and no other).
    slot: Arc<Slot>,
}

/// One queued append's meeting point with its leader: the result, or a call to lead the next
/// group. A leader wakes exactly the writers whose appends it committed, and one writer to
/// lead what queued meanwhile — not every waiting writer, as one condition variable for all
/// did: with 32 writers each commit woke the 31 others to find out whose turn it was, on two
/// CPUs (BENCHMARKS.md, issue 12, session 30).
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<(), AppendError>>,
    /// The last leader found this append first in the queue: try the commit lock.
    lead: bool,
    /// A leader took this append (its result comes once the group is written, and flushed
    /// if it must be); cleared if the leader deferred it to the next group.
    taken: bool,
}

/// The commit lock held by anyone but a leader in [`Log::append`] (a reader, the destager, a
/// statistic): when let go, it wakes the writer of the first queued append to lead, as a
/// leader does — a writer that found the lock held waits for exactly that.
struct RingGuard<'a> {
    log: &'a Log,
    ring: Option<parking_lot::MutexGuard<'a, Ring>>,
}

impl std::ops::Deref for RingGuard<'_> {
    type Target = Ring;
    fn deref(&self) -> &Ring {
        self.ring.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for RingGuard<'_> {
    fn deref_mut(&mut self) -> &mut Ring {
        self.ring.as_mut().expect("held until dropped")
    }
}

impl Drop for RingGuard<'_> {
    fn drop(&mut self) {
        drop(self.ring.take());
        self.log.wake_next_leader();
    }
}

impl Slot {
    fn publish(&self, r: Result<(), AppendError>) {
        self.state.lock().result = Some(r);
        self.cv.notify_one();
    }

    fn take(&self) -> Option<Result<(), AppendError>> {
        self.state.lock().result.take()
    }
}

#[derive(Default)]
struct Counters {
    appends: AtomicU64,
    groups: AtomicU64,
    refused_full: AtomicU64,
    freed_batches: AtomicU64,
    wait_timeouts: AtomicU64,
    flushes: AtomicU64,
    commits: AtomicU64,
}

/// The log (module docs).
pub struct Log {
    medium: Box<dyn Medium>,
    mode: Mode,
    log_id: u64,
    session: u64,
    backing: String,
    /// One past the last ring page.
    end: u64,
    reserve: u64,
    commit: Mutex<Ring>,
    pending: Mutex<Vec<Pending>>,
    index: Mutex<Index>,
    /// The first seq that counts: a record below it was freed and its page may be reused.
    tail_seq: AtomicU64,
    broken: Mutex<Option<String>>,
    is_broken: AtomicBool,
    counters: Counters,
    /// Lazy appends are acknowledged unflushed, up to this many pages ([`Log::commit_lazily`]);
    /// 0: every append is flushed before it is acknowledged.
    lazy_pages: u64,
    /// Pages the ring has had written so far (counted under the commit lock, once written),
    /// and the most of them a completed flush covered: the difference is what a power cut
    /// could take. Both only grow. `written` is counted before the results of the group that
    /// wrote the pages are published, so a [`Log::commit`] that finds them equal finds every
    /// acknowledged append durable.
    written: AtomicU64,
    flushed: AtomicU64,
    /// When the oldest page not yet flushed was written (`None`: everything flushed).
    unflushed_since: Mutex<Option<Instant>>,
    /// Held across a group's flush ([`Log::finish`]), outside the commit lock: one flush at a
    /// time, while the next leader writes its group.
    flush_lock: Mutex<()>,
}

/// A group written to the medium whose appends wait for a flush before they are acknowledged
/// ([`Log::finish`]): the pages it must cover, and each append's result so far.
struct FlushJob {
    target: u64,
    out: Vec<(Arc<Slot>, Result<(), AppendError>)>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").field("mode", &self.mode).field("log_id", &self.log_id).finish_non_exhaustive()
    }
}

/// What a write acknowledged by a lazily committing log survives (`farcache stats`, the log).
pub const LAZY_DURABILITY: &str = "survives the daemon at once and a power cut once synced: fsync, fdatasync, an \
     O_SYNC/O_DSYNC write, or tier.commit_interval later (commit = \"fsync\")";

/// Pages only trims and drops may use: a truncate or unlink changes the backing file first and
/// must then be able to log it.
pub const META_PAGES: u64 = 8;

/// Pages kept for appends that must be logged: a 32nd of the ring, at least one largest
/// write (1 MiB and its headers) where the ring allows.
fn reserve_pages(ring: u64) -> u64 {
    (ring / 32).max(264.min(ring / 4))
}

/// Where a batch of `size` pages goes with the head at `head` and the oldest live batch at
/// `tail` (`None`: nothing live), in a ring of pages `RING_START..end`.
fn place(head: u64, tail: Option<u64>, size: u64, end: u64) -> Option<u64> {
    match tail {
        None if head + size <= end => Some(head),
        None if RING_START + size <= end => Some(RING_START),
        None => None,
        Some(t) if head > t => {
            if head + size <= end {
                Some(head)
            } else if RING_START + size <= t {
                Some(RING_START)
            } else {
                None
            }
        }
        Some(t) if head < t && head + size <= t => Some(head),
        Some(_) => None,
    }
}

/// Where the next batch goes, and the oldest live batch: what placing needs (a copy is an
/// undo point).
#[derive(Clone, Copy, Debug)]
struct Cursor {
    head: u64,
    tail: Option<u64>,
}

impl Cursor {
    /// Place a batch of `size` pages; its first page, or `None` (nothing changed) if it does
    /// not fit.
    fn place(&mut self, size: u64, end: u64) -> Option<u64> {
        let at = place(self.head, self.tail, size, end)?;
        self.tail.get_or_insert(at);
        self.head = at + size;
        Some(at)
    }

    /// Pages between the oldest live batch and the head.
    fn used(&self, ring_pages: u64) -> u64 {
        match self.tail {
            None => 0,
            Some(t) if self.head > t => self.head - t,
            Some(t) => ring_pages - (t - self.head),
        }
    }
}

impl Ring {
    fn tail(&self) -> Option<u64> {
        self.batches.front().map(|b| b.page)
    }
    /// Pages between the oldest live batch and the head (waste at a wrap included).
    fn used(&self, end: u64) -> u64 {
        let ring = end - RING_START;
        match self.tail() {
            None => 0,
            Some(t) if self.head > t => self.head - t,
            Some(t) => ring - (t - self.head),
        }
    }
}

impl Log {
    /// Open the log on `medium` (recovering what it holds), or make a new one if the medium
    /// is blank (its first two pages are zeros). `backing`: the backing directory the tier
    /// must belong to (`None`: any, for inspection). Writes nothing unless it formats (it
    /// flushes what it found).
    pub fn open(medium: Box<dyn Medium>, mode: Mode, backing: Option<&str>) -> Result<(Log, Recovered), TierError> {
        let t0 = Instant::now();
        let pages = medium.len() / PB;
        if pages < RING_START + 16 {
            return Err(TierError::Config {
                path: backing.unwrap_or("").into(),
                problem: format!("the tier's medium holds {pages} pages, fewer than {}", RING_START + 16),
                fix: "give a tier-size of at least 1MiB".into(),
            });
        }
        let mut sbs = page::zeroed(2);
        medium.read_at(0, page::bytes_mut(&mut sbs)).map_err(|e| TierError::io("reading the superblocks", e))?;
        let a = Superblock::decode(&sbs[0].0);
        let b = Superblock::decode(&sbs[1].0);
        let sb = match (a, b) {
            (Ok(a), Ok(b)) => Some(if a.generation >= b.generation { a } else { b }),
            (Ok(s), Err(_)) | (Err(_), Ok(s)) => Some(s),
            (Err(false), Err(false)) if page::bytes(&sbs).iter().all(|&x| x == 0) => None,
            _ => return Err(TierError::Config {
                path: backing.unwrap_or("").into(),
                problem:
                    "the tier's medium holds something that is not a farcache tier (or both superblocks are damaged)"
                        .into(),
                fix: "name a new file, or wipe its first 8 KiB if its contents are not needed".into(),
            }),
        };
        let mut rec = Recovered::default();
        let sb = match sb {
            Some(sb) => {
                if let Some(want) = backing {
                    if sb.backing != want {
                        return Err(TierError::Config {
                            path: want.into(),
                            problem: format!("the tier belongs to the backing directory {:?}, not to {want:?}", sb.backing),
                            fix: format!("mount {:?} with this tier (or run `farcache tier recover` for it), or give another tier path", sb.backing),
                        });
                    }
                }
                if sb.pages > pages {
                    return Err(TierError::Config {
                        path: sb.backing.clone(),
                        problem: format!("the tier was made with {} pages but the medium now holds {pages}", sb.pages),
                        fix: "give the tier-size it was made with".into(),
                    });
                }
                sb
            }
            None => {
                rec.formatted = true;
                if mode == Mode::Ssd {
                    // Write every page once before use: a preallocated file's extents are
                    // "unwritten", and the first write to each turns it into data — a journal
                    // commit in every fdatasync of the first lap (PostgreSQL zero-fills its WAL
                    // segments for the same reason). Before the superblock: a crash here leaves
                    // a blank medium, formatted again next time.
                    let chunk = page::zeroed(256);
                    let mut at = 0;
                    while at < pages {
                        let n = (pages - at).min(chunk.len() as u64) as usize;
                        medium
                            .write_at(at * PB, page::bytes(&chunk[..n]))
                            .map_err(|e| TierError::io("writing the new tier's pages once", e))?;
                        at += n as u64;
                    }
                    medium.flush().map_err(|e| TierError::io("flushing the new tier's pages", e))?;
                }
                let sb = Superblock {
                    pages,
                    log_id: crate::random_u64(),
                    generation: 1,
                    tail_seq: 1,
                    tail_page: RING_START,
                    tail_prev: 0,
                    backing: backing.unwrap_or("").to_string(),
                };
                let mut p = Page::zeroed();
                sb.encode(&mut p.0);
                // Copy `generation % 2`: the next superblock goes to the other copy.
                medium.write_at(PB, &p.0).map_err(|e| TierError::io("writing the superblock", e))?;
                medium.flush().map_err(|e| TierError::io("flushing the superblock", e))?;
                sb
            }
        };
        let end = sb.pages;
        let log = Log {
            medium,
            mode,
            log_id: sb.log_id,
            session: crate::random_u64(),
            backing: sb.backing.clone(),
            end,
            reserve: reserve_pages(end - RING_START),
            commit: Mutex::new(Ring {
                head: sb.tail_page,
                next_seq: sb.tail_seq,
                last_crc: sb.tail_prev,
                batches: VecDeque::new(),
                sb_gen: sb.generation,
            }),
            pending: Mutex::new(Vec::new()),
            index: Mutex::new(Index::default()),
            tail_seq: AtomicU64::new(sb.tail_seq),
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            counters: Counters::default(),
            lazy_pages: 0,
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            unflushed_since: Mutex::new(None),
            flush_lock: Mutex::new(()),
        };
        log.scan(&mut rec)?;
        if rec.batches > 0 {
            // What the scan found may never have been flushed (a lazy log's daemon died, or
            // handed the tier over, before its commit): flushed now, so that a commit that
            // finds nothing unflushed (an fsync after the restart) means it is durable.
            log.medium.flush().map_err(|e| TierError::io("flushing the recovered log", e))?;
        }
        {
            let ix = log.index.lock();
            rec.records = ix.dirty;
            rec.files = ix.files.len() as u64;
        }
        rec.scan_ms = t0.elapsed().as_millis() as u64;
        Ok((log, rec))
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn backing(&self) -> &str {
        &self.backing
    }
    pub fn capacity_bytes(&self) -> u64 {
        (self.end - RING_START) * PB
    }

    /// Acknowledge lazy appends once written, flushing them with the next flush, and at the
    /// latest once `max_pages` pages are unflushed (at least one largest group). Only where
    /// a flush costs something (`ssd`); see [`Append::lazy`].
    pub fn commit_lazily(mut self, max_pages: u64) -> Self {
        self.lazy_pages = max_pages.max(MAX_GROUP_PAGES);
        self
    }

    /// Make every append acknowledged so far durable (an fsync): a flush if any is not yet
    /// (a group of its own, or riding on a leader's), else nothing.
    pub fn commit(&self) -> Result<(), AppendError> {
        if self.unflushed_pages() == 0 {
            return Ok(());
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        self.append(Append::default())
    }

    /// [`Log::commit`] if what is unflushed was first written at least `age` ago (the
    /// destager's bound on how long a lazy append stays unflushed).
    pub fn commit_if_older(&self, age: Duration) -> Result<(), AppendError> {
        if self.unflushed_pages() == 0 {
            return Ok(());
        }
        let since = *self.unflushed_since.lock();
        if since.is_some_and(|t| t.elapsed() >= age) {
            return self.commit();
        }
        Ok(())
    }

    /// What an append this log acknowledges survives (`farcache stats`, the start-up log).
    pub fn durability(&self) -> &'static str {
        if self.lazy_pages > 0 {
            LAZY_DURABILITY
        } else {
            self.mode.durability()
        }
    }

    /// Bytes written and acknowledged but not yet flushed (lazy appends).
    pub fn unflushed_bytes(&self) -> u64 {
        self.unflushed_pages() * PB
    }

    /// Pages written and not yet covered by a completed flush.
    fn unflushed_pages(&self) -> u64 {
        // `flushed` first: a flush completing between the two loads only makes this larger.
        let flushed = self.flushed.load(Ordering::Acquire);
        self.written.load(Ordering::Acquire).saturating_sub(flushed)
    }

    /// Append durably, or refuse at once (never waits for space). See the module docs.
    pub fn append(&self, a: Append) -> Result<(), AppendError> {
        if let Some(b) = self.broken.lock().clone() {
            return Err(AppendError::Broken(b));
        }
        self.counters.appends.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::default());
        self.pending.lock().push(Pending { append: a, slot: slot.clone() });
        loop {
            if let Some(mut ring) = self.commit.try_lock() {
                if let Some(r) = slot.take() {
                    drop(ring);
                    self.wake_next_leader();
                    return r;
                }
                let group: Vec<Pending> = std::mem::take(&mut *self.pending.lock());
                for p in &group {
                    p.slot.state.lock().taken = true;
                }
                let job = self.lead(&mut ring, group);
                // The next leader writes its group while this one's flush runs.
                drop(ring);
                self.wake_next_leader();
                if let Some(job) = job {
                    self.finish(job);
                }
                // Ours was in the group, unless it was deferred to the next one.
                if let Some(r) = slot.take() {
                    return r;
                }
                continue;
            }
            // A leader is writing (or took our append and is flushing it): wait for it to
            // publish our result, or for a call to lead the next group. Both are set under
            // the slot's lock, which we hold from the check to the wait, so neither can be
            // missed; the timeout is a safety net only.
            let mut st = slot.state.lock();
            if let Some(r) = st.result.take() {
                return r;
            }
            if !std::mem::take(&mut st.lead)
                && (st.taken || self.commit.is_locked())
                && slot.cv.wait_for(&mut st, WAIT_SAFETY_NET).timed_out()
            {
                self.counters.wait_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(r) = st.result.take() {
                return r;
            }
            st.lead = false;
        }
    }

    /// Several appends as one group (as concurrent writers would make one), for the crash
    /// checker: each result in order.
    #[cfg(test)]
    pub(crate) fn append_group(&self, appends: Vec<Append>) -> Vec<Result<(), AppendError>> {
        let slots: Vec<Arc<Slot>> = appends
            .into_iter()
            .map(|a| {
                let slot = Arc::new(Slot::default());
                self.pending.lock().push(Pending { append: a, slot: slot.clone() });
                slot
            })
            .collect();
        let mut ring = self.ring();
        let group: Vec<Pending> = std::mem::take(&mut *self.pending.lock());
        if let Some(job) = self.lead(&mut ring, group) {
            self.finish(job);
        }
        slots.iter().map(|s| s.take().expect("led")).collect()
    }

    /// The commit lock, for anything but leading a group ([`RingGuard`]).
    fn ring(&self) -> RingGuard<'_> {
        RingGuard { log: self, ring: Some(self.commit.lock()) }
    }

    /// After the commit lock was released: if appends queued meanwhile (or were deferred),
    /// wake the writer of the first to lead them.
    fn wake_next_leader(&self) {
        let q = self.pending.lock();
        if let Some(p) = q.first() {
            p.slot.state.lock().lead = true;
            p.slot.cv.notify_one();
        }
    }

    /// The items an append records, in order: the names it must declare, then its entries.
    fn items<'a>(a: &'a Append, names: &[FileKey]) -> Vec<(EntryHead, Option<Payload<'a>>)> {
        let mut items = Vec::with_capacity(names.len() + a.entries.len());
        for (k, n) in &a.names {
            if names.contains(k) {
                let len = n.len().min(PAGE_BYTES);
                items.push((
                    EntryHead { kind: Kind::Name, data_crc: 0, key: *k, block: 0, aux: len as u64 },
                    Some(Payload::Bytes(&n[..len])),
                ));
            }
        }
        for e in &a.entries {
            items.push(match e {
                Entry::Data { key, block, valid, page } => (
                    EntryHead { kind: Kind::Data, data_crc: 0, key: *key, block: *block, aux: u64::from(*valid) },
                    Some(Payload::Page(page)),
                ),
                Entry::Trim { key, size } => {
                    (EntryHead { kind: Kind::Trim, data_crc: 0, key: *key, block: 0, aux: *size }, None)
                }
                Entry::Drop { key, through } => {
                    (EntryHead { kind: Kind::Drop, data_crc: 0, key: *key, block: 0, aux: *through }, None)
                }
            });
        }
        items
    }

    /// Write a group of appends (as leader), flush once, index them, publish the results.
    ///
    /// The appends of a group share batches: their items are packed in order into batches of
    /// up to [`MAX_ENTRIES`] entries (a 4 KiB write costs its data page and a share of a
    /// header, not a header of its own). Each append goes in whole or not at all: a first
    /// pass decides by sizes alone (a cursor over the ring, copied to undo an append that does
    /// not fit), a second builds exactly the batches the first placed.
    /// Write a group (as leader, commit lock held): its batches are on the medium and in the
    /// index when this returns. A group that must be durable before it is acknowledged comes
    /// back as a [`FlushJob`] for the caller to [`Log::finish`] — after letting go of the
    /// commit lock, so that the next group is written while this one's flush runs; the rest
    /// are acknowledged here.
    fn lead(&self, ring: &mut Ring, group: Vec<Pending>) -> Option<FlushJob> {
        self.counters.groups.fetch_add(1, Ordering::Relaxed);
        let ring_pages = self.end - RING_START;
        let mut out: Vec<(Arc<Slot>, Result<(), AppendError>)> = Vec::with_capacity(group.len());
        let mut declared: std::collections::HashSet<FileKey> = {
            let ix = self.index.lock();
            group
                .iter()
                .flat_map(|p| p.append.names.iter().map(|(k, _)| *k))
                .filter(|k| ix.files.get(k).is_some_and(|f| f.declared.is_some()))
                .collect()
        };
        let mut named_here = std::collections::HashSet::new();
        let start = Cursor { head: ring.head, tail: ring.tail() };
        // Pass 1: which appends go in.
        let mut cur = start;
        let mut open = (0usize, 0u64); // entries and data pages of the batch being filled
        let mut accepted: Vec<(Pending, Vec<FileKey>)> = Vec::new();
        let mut deferred = Vec::new();
        // Whether the group must end in a flush: an append that is not lazy, or a barrier.
        let mut durable = self.lazy_pages == 0;
        for p in group {
            if let Some(b) = self.broken.lock().clone() {
                out.push((p.slot.clone(), Err(AppendError::Broken(b))));
                continue;
            }
            if p.append.is_barrier() {
                durable = true;
                out.push((p.slot.clone(), Ok(())));
                continue;
            }
            // Names first (each key once per group, only if not declared yet); an append of
            // names only declares (or renames) unconditionally.
            let used_keys: std::collections::HashSet<FileKey> = p.append.entries.iter().map(Entry::key).collect();
            let force = p.append.entries.is_empty();
            let names: Vec<FileKey> = p
                .append
                .names
                .iter()
                .map(|(k, _)| *k)
                .filter(|k| force || (used_keys.contains(k) && !declared.contains(k) && !named_here.contains(k)))
                .collect();
            let shape: Vec<bool> = Self::items(&p.append, &names).iter().map(|i| i.1.is_some()).collect();
            let saved = (cur, open);
            let mut fits = true;
            for has_page in &shape {
                if open.0 == MAX_ENTRIES {
                    if cur.place(1 + open.1, self.end).is_none() {
                        fits = false;
                        break;
                    }
                    open = (0, 0);
                }
                open.0 += 1;
                open.1 += u64::from(*has_page);
            }
            // The batch being filled must still fit once closed.
            let mut trial = cur;
            if fits && open.0 > 0 && trial.place(1 + open.1, self.end).is_none() {
                fits = false;
            }
            let written = trial.used(ring_pages) - start.used(ring_pages);
            if fits && !accepted.is_empty() && written > MAX_GROUP_PAGES {
                (cur, open) = saved;
                deferred.push(p);
                continue;
            }
            // Trims and drops may use the whole ring; other appends with the reserve leave
            // META_PAGES for them; the rest leave the reserve.
            let meta_only = !p.append.entries.is_empty()
                && p.append.entries.iter().all(|e| !matches!(e, Entry::Data { .. }))
                && p.append.names.is_empty();
            let keep = if meta_only {
                0
            } else if p.append.reserve {
                META_PAGES.min(self.reserve)
            } else {
                self.reserve
            };
            if !fits || trial.used(ring_pages) + keep > ring_pages {
                (cur, open) = saved;
                self.counters.refused_full.fetch_add(1, Ordering::Relaxed);
                out.push((p.slot.clone(), Err(AppendError::Full)));
                continue;
            }
            named_here.extend(names.iter().copied());
            for e in &p.append.entries {
                if let Entry::Drop { key, .. } = e {
                    // A drop may forget the name: a later record of the key declares it again.
                    declared.remove(key);
                    named_here.remove(key);
                }
            }
            durable |= !p.append.lazy;
            out.push((p.slot.clone(), Ok(())));
            accepted.push((p, names));
        }
        if !deferred.is_empty() {
            // Too much for one group: back to the front of the queue for the next leader.
            for p in &deferred {
                p.slot.state.lock().taken = false;
            }
            let mut q = self.pending.lock();
            deferred.append(&mut q);
            *q = deferred;
        }
        // Pass 2: the batches pass 1 placed, encoded.
        let mut cur = start;
        let (mut seq, mut prev) = (ring.next_seq, ring.last_crc);
        let mut batches: Vec<Batch<'_>> = Vec::new();
        let mut open: Vec<(EntryHead, Option<Payload<'_>>)> = Vec::new();
        let mut close = |open: &mut Vec<_>, cur: &mut Cursor| {
            let n = open.iter().filter(|i: &&(EntryHead, Option<Payload>)| i.1.is_some()).count();
            let at = cur.place(1 + n as u64, self.end).expect("pass 1 placed this batch");
            let mut header = Page::zeroed();
            let mut pages = Vec::with_capacity(n);
            let mut h = BatchHead {
                log_id: self.log_id,
                seq,
                prev,
                session: self.session,
                entries: Vec::with_capacity(open.len()),
            };
            for (e, data) in open.drain(..) {
                let mut e = e;
                if let Some(data) = data {
                    // A data entry's page is written from where the append holds it (no
                    // copy); a name is copied into a page of its own, zero-padded.
                    let page = match data {
                        Payload::Page(p) => Paged::Held(p),
                        Payload::Bytes(b) => Paged::Own(Page::copied(b)),
                    };
                    e.data_crc = data_crc(page.bytes());
                    pages.push(page);
                }
                h.entries.push(e);
            }
            prev = h.encode(&mut header.0);
            seq += 1;
            batches.push(Batch { at, head: h, header, pages });
        };
        for (p, names) in &accepted {
            for item in Self::items(&p.append, names) {
                if open.len() == MAX_ENTRIES {
                    close(&mut open, &mut cur);
                }
                open.push(item);
            }
        }
        if !open.is_empty() {
            close(&mut open, &mut cur);
        }
        // Write (the flush is the caller's, [`Log::finish`]).
        let mut io_err = None;
        for b in &batches {
            let bufs: Vec<&[u8]> = std::iter::once(&b.header.0[..]).chain(b.pages.iter().map(Paged::bytes)).collect();
            if let Err(e) = self.medium.write_vectored_at(b.at * PB, &bufs) {
                io_err = Some(format!("writing {} pages at page {}: {e}", bufs.len(), b.at));
                break;
            }
        }
        if let Some(msg) = io_err {
            self.break_log(&msg);
            for (slot, res) in out {
                slot.publish(res.and(Err(AppendError::Broken(msg.clone()))));
            }
            return None;
        }
        let written: u64 = batches.iter().map(|b| 1 + b.pages.len() as u64).sum();
        let unflushed_before = self.unflushed_pages();
        let unflushed = unflushed_before + written;
        let flush = unflushed > 0 && (durable || unflushed > self.lazy_pages);
        {
            let mut ix = self.index.lock();
            for b in &batches {
                let mut d = 0;
                for e in &b.head.entries {
                    let (pg, name) = if e.kind.has_page() {
                        d += 1;
                        (b.at + d as u64, Some(&b.pages[d - 1].bytes()[..(e.aux as usize).min(PAGE_BYTES)]))
                    } else {
                        (0, None)
                    };
                    ix.apply(b.head.seq, e, pg, if e.kind == Kind::Name { name } else { None });
                }
            }
        }
        let now = Instant::now();
        let mut last = ring.last_crc;
        for b in &batches {
            let pages = 1 + b.pages.len() as u64;
            ring.batches.push_back(BatchPos { seq: b.head.seq, page: b.at, pages, prev: b.head.prev, at: now });
            ring.head = b.at + pages;
            last = BatchHead::crc_of(&b.header.0);
        }
        ring.next_seq = seq;
        ring.last_crc = last;
        // Before the results: a commit that finds nothing unflushed finds what they
        // acknowledge durable.
        let target = self.written.fetch_add(written, Ordering::AcqRel) + written;
        if flush {
            return Some(FlushJob { target, out });
        }
        if written > 0 {
            self.unflushed_since.lock().get_or_insert(now);
            // Every WRITEBACK_PAGES unflushed, the medium starts writing them out, so that the
            // flush at a commit or at the bound finds little left.
            if unflushed / WRITEBACK_PAGES > unflushed_before / WRITEBACK_PAGES {
                self.medium.start_writeback();
            }
        }
        for (slot, res) in out {
            slot.publish(res);
        }
        None
    }

    /// A written group's flush, then its results: one flush at a time (`flush_lock`), none at
    /// all if a flush that began after the group was written has completed meanwhile. Once
    /// a flush failed nothing written before it is known to be durable (the kernel may have
    /// dropped the pages it could not write), so every later group is refused (`Broken`).
    fn finish(&self, job: FlushJob) {
        let res = {
            let _f = self.flush_lock.lock();
            if self.flushed.load(Ordering::Acquire) >= job.target {
                Ok(())
            } else if let Some(b) = self.broken.lock().clone() {
                Err(b)
            } else {
                // Every page counted here was written before the flush starts.
                let covers = self.written.load(Ordering::Acquire);
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                match self.medium.flush() {
                    Ok(()) => {
                        self.flushed.fetch_max(covers, Ordering::AcqRel);
                        let mut since = self.unflushed_since.lock();
                        if self.written.load(Ordering::Acquire) <= covers {
                            *since = None;
                        }
                        Ok(())
                    }
                    Err(e) => {
                        let msg = format!("flushing: {e}");
                        self.break_log(&msg);
                        Err(msg)
                    }
                }
            }
        };
        for (slot, r) in job.out {
            slot.publish(match &res {
                Ok(()) => r,
                Err(msg) => r.and(Err(AppendError::Broken(msg.clone()))),
            });
        }
    }

    /// The medium failed a write or a flush: the log takes no more appends.
    fn break_log(&self, msg: &str) {
        tracing::error!("tier log: {msg}; the tier takes no more writes (they go through to the backing store), what it holds stays readable and is destaged");
        let mut b = self.broken.lock();
        if b.is_none() {
            *b = Some(msg.to_string());
        }
        self.is_broken.store(true, Ordering::Relaxed);
    }

    /// The newest record of each dirty block of `key` in `first..=last`.
    pub fn dirty_in(&self, key: FileKey, first: u64, last: u64) -> Vec<(u64, Rec)> {
        let ix = self.index.lock();
        match ix.files.get(&key) {
            Some(f) => f.blocks.range(first..=last).map(|(b, r)| (*b, *r)).collect(),
            None => Vec::new(),
        }
    }

    /// Whether `key` has any dirty block.
    pub fn has_dirty(&self, key: FileKey) -> bool {
        self.index.lock().files.get(&key).is_some_and(|f| !f.blocks.is_empty())
    }

    /// The newest contents of dirty block `block` of `key`: the page (bytes past `valid` are
    /// zeros) and `valid`, or `None` if the block is not dirty (any more).
    pub fn read_block(&self, key: FileKey, block: u64) -> std::io::Result<Option<(Box<Page>, u32)>> {
        // Optimistic reads first: no lock held across the medium's read.
        for _ in 0..OPTIMISTIC_READS {
            let rec = {
                let ix = self.index.lock();
                match ix.files.get(&key).and_then(|f| f.blocks.get(&block)) {
                    Some(r) => *r,
                    None => return Ok(None),
                }
            };
            let mut p = Page::zeroed();
            self.medium.read_at(rec.page * PB, &mut p.0)?;
            if self.tail_seq.load(Ordering::Acquire) > rec.seq {
                continue; // freed (and maybe reused) while we read: look again
            }
            if data_crc(&p.0) != rec.crc {
                let still = self.index.lock().files.get(&key).and_then(|f| f.blocks.get(&block)).copied();
                if still != Some(rec) {
                    continue; // trimmed or rewritten meanwhile
                }
                return Err(std::io::Error::other(format!(
                    "tier: the record of block {block} of file key {} at page {} fails its checksum (the medium is damaged)",
                    key.0, rec.page
                )));
            }
            p.0[rec.valid as usize..].fill(0);
            return Ok(Some((p, rec.valid)));
        }
        // A block rewritten (or its page freed) under every attempt — writers hammering it on
        // a loaded machine (measured: eight threads rewriting slices of the same blocks, the
        // destager freeing every 5 ms, made eight attempts fail in a row). Read it once more
        // holding the commit lock: no batch is written and no page freed or reused while it is
        // held (every append and `free_through` takes it), so this read cannot lose the race.
        // Bounded: one read of one page while appends wait.
        self.read_block_locked(key, block)
    }

    /// [`Log::read_block`] for many blocks of `key` (ascending): each block still dirty, in
    /// order, as `(block, its valid bytes)` to `f`, which returns whether to go on; a block
    /// no longer dirty is skipped. Records on consecutive pages of the medium (where a file
    /// written in order lands) are read together, up to [`READ_RUN_PAGES`] pages in one read
    /// into one buffer, and the index is looked up once per [`READ_RUN_PAGES`] blocks: no page
    /// allocated and no read per block, as [`Log::read_block`] costs; the runs of those
    /// blocks are read together ([`Medium::read_many`]: in flight at once on a device). A
    /// record freed, or failing its checksum, by the time its run was read is read again
    /// alone by [`Log::read_block`], which settles the race or reports the damage.
    /// `depth()`, asked before each chunk, bounds the reads handed to the medium at once
    /// (the destager's fewer while applications use the mount).
    pub fn read_blocks(
        &self,
        key: FileKey,
        blocks: &[u64],
        depth: impl Fn() -> usize,
        mut f: impl FnMut(u64, &[u8]) -> bool,
    ) -> std::io::Result<()> {
        let mut scratch = page::zeroed(READ_RUN_PAGES.min(blocks.len()));
        // The chunk's blocks still dirty, and their records in runs of consecutive pages:
        // page k of `scratch` holds the k-th of them.
        let mut recs: Vec<(u64, Rec)> = Vec::with_capacity(scratch.len());
        let mut runs: Vec<(u64, usize)> = Vec::new(); // (first page, pages)
        for chunk in blocks.chunks(READ_RUN_PAGES) {
            recs.clear();
            if let Some(file) = self.index.lock().files.get(&key) {
                recs.extend(chunk.iter().filter_map(|b| Some((*b, *file.blocks.get(b)?))));
            }
            runs.clear();
            for (_, r) in &recs {
                match runs.last_mut() {
                    Some((first, n)) if *first + *n as u64 == r.page => *n += 1,
                    _ => runs.push((r.page, 1)),
                }
            }
            let mut reads = Vec::with_capacity(runs.len());
            let mut rest = &mut page::bytes_mut(&mut scratch)[..];
            for &(first, n) in &runs {
                let (buf, after) = std::mem::take(&mut rest).split_at_mut(n * PAGE_BYTES);
                reads.push((first * PB, buf));
                rest = after;
            }
            for group in reads.chunks_mut(depth().max(1)) {
                self.medium.read_many(group)?;
            }
            drop(reads);
            // As in `read_block`: a record freed while we read may hold another's bytes.
            let tail = self.tail_seq.load(Ordering::Acquire);
            for (p, &(b, rec)) in scratch.iter().zip(&recs) {
                let go = if tail <= rec.seq && data_crc(&p.0) == rec.crc {
                    f(b, &p.0[..rec.valid as usize])
                } else {
                    match self.read_block(key, b)? {
                        Some((p, valid)) => f(b, &p.0[..valid as usize]),
                        None => true,
                    }
                };
                if !go {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// [`Log::read_block`] under the commit lock: cannot race a rewrite or a free.
    fn read_block_locked(&self, key: FileKey, block: u64) -> std::io::Result<Option<(Box<Page>, u32)>> {
        let _ring = self.ring();
        let rec = match self.index.lock().files.get(&key).and_then(|f| f.blocks.get(&block)) {
            Some(r) => *r,
            None => return Ok(None),
        };
        let mut p = Page::zeroed();
        self.medium.read_at(rec.page * PB, &mut p.0)?;
        if data_crc(&p.0) != rec.crc {
            return Err(std::io::Error::other(format!(
                "tier: the record of block {block} of file key {} at page {} fails its checksum (the medium is damaged)",
                key.0, rec.page
            )));
        }
        p.0[rec.valid as usize..].fill(0);
        Ok(Some((p, rec.valid)))
    }

    /// Seq of the newest committed batch (0: none ever).
    pub fn last_seq(&self) -> u64 {
        self.ring().next_seq - 1
    }

    /// Apply a trim or drop to the index without logging it — only when the log cannot take
    /// it (broken, or full to its reserve) and the caller has written the blocks concerned
    /// back and synced them. A restart would replay the records it hides, so the caller must
    /// tell the operator (the write-back layer refuses to recover such a tier silently).
    pub fn apply_unlogged(&self, e: &Entry) {
        let head = match e {
            Entry::Trim { key, size } => EntryHead { kind: Kind::Trim, data_crc: 0, key: *key, block: 0, aux: *size },
            Entry::Drop { key, through } => {
                EntryHead { kind: Kind::Drop, data_crc: 0, key: *key, block: 0, aux: *through }
            }
            Entry::Data { .. } => return,
        };
        self.index.lock().apply(u64::MAX, &head, 0, None);
    }

    /// Whether a trim or drop appended now fits (with room to spare for a few more). Check
    /// before changing the backing file: if not, destage first.
    pub fn meta_room(&self) -> bool {
        let ring = self.ring();
        let ring_pages = self.end - RING_START;
        ring.used(self.end) + META_PAGES.min(self.reserve).max(2) <= ring_pages
            && place(ring.head, ring.tail(), 1, self.end).is_some()
    }

    /// Seq of the oldest live batch, if any.
    pub fn first_seq(&self) -> Option<u64> {
        self.ring().batches.front().map(|b| b.seq)
    }

    /// Used pages as a fraction of the ring, in permille.
    pub fn used_permille(&self) -> u64 {
        let ring = self.ring();
        ring.used(self.end) * 1000 / (self.end - RING_START)
    }

    /// The smallest seq through which freeing brings the used space to `target_permille` or
    /// below, and the seq of the newest batch older than `max_age` — the larger of the two,
    /// or `None` if neither asks for anything.
    pub fn due(&self, target_permille: u64, max_age: Duration) -> Option<u64> {
        let ring = self.ring();
        let ring_pages = self.end - RING_START;
        let target = ring_pages * target_permille / 1000;
        let mut by_space = None;
        if ring.used(self.end) > target {
            // Freeing through batch i moves the tail to batch i + 1 (or empties the ring).
            let mut it = ring.batches.iter().peekable();
            while let Some(b) = it.next() {
                let tail = it.peek().map(|n| n.page);
                if (Cursor { head: ring.head, tail }).used(ring_pages) <= target {
                    by_space = Some(b.seq);
                    break;
                }
            }
        }
        let by_age = ring.batches.iter().take_while(|b| b.at.elapsed() >= max_age).last().map(|b| b.seq);
        by_space.max(by_age)
    }

    /// What a destage round through `seq` writes back: every dirty block whose newest record
    /// is at or below `seq`, by file, ascending.
    pub fn plan(&self, seq: u64) -> Vec<FilePlan> {
        let ix = self.index.lock();
        let mut out: Vec<FilePlan> = ix
            .files
            .iter()
            .filter_map(|(k, f)| {
                let blocks: Vec<(u64, Rec)> =
                    f.blocks.iter().filter(|(_, r)| r.seq <= seq).map(|(b, r)| (*b, *r)).collect();
                (!blocks.is_empty()).then(|| FilePlan {
                    key: *k,
                    name: f.name.clone().unwrap_or_else(|| Arc::from(&b""[..])),
                    blocks,
                })
            })
            .collect();
        out.sort_by_key(|p| p.key);
        out
    }

    /// Free every batch through `seq`. The caller guarantees that every block whose newest
    /// record is at or below `seq` is written back to the backing store and synced (the
    /// plan of `seq`, destaged). Names still needed are declared again first; then the
    /// superblock moves the tail and is flushed. Returns the pages freed. `Full` if there is
    /// no room to declare those names again: then free through [`Log::last_seq`] (after
    /// destaging everything), which needs none.
    pub fn free_through(&self, seq: u64) -> Result<u64, AppendError> {
        let mut ring = self.ring();
        if ring.batches.front().is_none_or(|b| b.seq > seq) {
            return Ok(0);
        }
        // Keys with records above `seq` whose name was declared at or below it.
        let redeclare: Vec<(FileKey, Arc<[u8]>)> = {
            let ix = self.index.lock();
            ix.files
                .iter()
                .filter(|(_, f)| f.declared.is_some_and(|d| d <= seq) && f.blocks.values().any(|r| r.seq > seq))
                .filter_map(|(k, f)| f.name.clone().map(|n| (*k, n)))
                .collect()
        };
        for chunk in redeclare.chunks(MAX_ENTRIES) {
            let names: Vec<(FileKey, Arc<[u8]>)> = chunk.to_vec();
            // A name-only append: entries none, so force the names with a marker key set.
            if let Some(Err(e)) = self.lead_names(&mut ring, names) {
                return Err(e);
            }
        }
        let mut r = ring.clone();
        let mut freed = 0;
        let mut n = 0;
        while r.batches.front().is_some_and(|b| b.seq <= seq) {
            let b = r.batches.pop_front().expect("checked");
            freed += b.pages;
            n += 1;
        }
        let (tail_seq, tail_page, tail_prev) = match r.batches.front() {
            Some(b) => (b.seq, b.page, b.prev),
            None => (r.next_seq, r.head, r.last_crc),
        };
        let gen = r.sb_gen + 1;
        let sb = Superblock {
            pages: self.end,
            log_id: self.log_id,
            generation: gen,
            tail_seq,
            tail_page,
            tail_prev,
            backing: self.backing.clone(),
        };
        let mut p = Page::zeroed();
        sb.encode(&mut p.0);
        // Lazy appends first: a record freed here may be superseded by one of them (the plan
        // leaves a block whose newest record is newer), which must not be lost with it — the
        // superblock must never be durable before the batches after its tail.
        // Every page written so far (no leader writes while we hold the commit lock).
        let covers = self.written.load(Ordering::Acquire);
        let flushed_first = if self.unflushed_pages() > 0 {
            self.counters.flushes.fetch_add(1, Ordering::Relaxed);
            self.medium.flush()
        } else {
            Ok(())
        };
        let res =
            flushed_first.and_then(|()| self.medium.write_at((gen % 2) * PB, &p.0)).and_then(|()| self.medium.flush());
        if let Err(e) = res {
            let msg = format!("writing the superblock: {e}");
            self.break_log(&msg);
            return Err(AppendError::Broken(msg));
        }
        r.sb_gen = gen;
        // The flush covered every lazy append too.
        self.flushed.fetch_max(covers, Ordering::AcqRel);
        *self.unflushed_since.lock() = None;
        // Readers of a freed record see the new tail before its page can be reused (the
        // next leader writes only after taking the commit lock we hold).
        self.tail_seq.store(tail_seq, Ordering::Release);
        {
            let mut ix = self.index.lock();
            let mut empty = Vec::new();
            for (k, f) in ix.files.iter_mut() {
                f.blocks.retain(|_, r| r.seq > seq);
                if f.blocks.is_empty() && f.declared.is_none_or(|d| d <= seq) {
                    empty.push(*k);
                }
            }
            for k in empty {
                ix.files.remove(&k);
            }
            ix.dirty = ix.files.values().map(|f| f.blocks.len() as u64).sum();
        }
        *ring = r;
        drop(ring); // wakes the next leader (RingGuard)
        self.counters.freed_batches.fetch_add(n, Ordering::Relaxed);
        Ok(freed)
    }

    /// Declare `names` again in a batch of their own (as leader, commit lock held).
    fn lead_names(&self, ring: &mut Ring, names: Vec<(FileKey, Arc<[u8]>)>) -> Option<Result<(), AppendError>> {
        // Mark them undeclared so that `lead` writes them.
        {
            let mut ix = self.index.lock();
            for (k, _) in &names {
                if let Some(f) = ix.files.get_mut(k) {
                    f.declared = None;
                }
            }
        }
        let slot = Arc::new(Slot::default());
        let append = Append { entries: Vec::new(), names, reserve: true, lazy: false };
        if let Some(job) = self.lead(ring, vec![Pending { append, slot: slot.clone() }]) {
            self.finish(job);
        }
        slot.take()
    }

    pub fn stats(&self) -> LogStats {
        let used = self.ring().used(self.end);
        let batches = self.ring().batches.len() as u64;
        let (dirty, files) = {
            let ix = self.index.lock();
            (ix.dirty, ix.files.len() as u64)
        };
        LogStats {
            mode: self.mode.to_string(),
            durability: self.durability().to_string(),
            capacity_bytes: self.capacity_bytes(),
            used_bytes: used * PB,
            dirty_bytes: dirty * PB,
            dirty_blocks: dirty,
            files,
            batches,
            appends: self.counters.appends.load(Ordering::Relaxed),
            groups: self.counters.groups.load(Ordering::Relaxed),
            refused_full: self.counters.refused_full.load(Ordering::Relaxed),
            broken: self.broken.lock().clone(),
            freed_batches: self.counters.freed_batches.load(Ordering::Relaxed),
            wait_timeouts: self.counters.wait_timeouts.load(Ordering::Relaxed),
            flushes: self.counters.flushes.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
            unflushed_bytes: self.unflushed_bytes(),
            lazy: self.lazy_pages > 0,
        }
    }

    /// Whether nothing is dirty.
    pub fn is_clean(&self) -> bool {
        self.index.lock().dirty == 0
    }

    /// Whether the medium failed (appends are refused).
    pub fn is_broken(&self) -> bool {
        self.is_broken.load(Ordering::Relaxed)
    }
}

mod scan;

#[cfg(test)]
mod tests;
