//! The borrower's index of what its lenders hold: "is this block remote, and under which
//! key?" answered from local memory, without a round trip (paper 000's "management area").
//!
//! # The invariant
//! A block's key is (file key, block, version). **Every key a lookup can return names exactly
//! one content: the bytes the block holds on the disk now.** Put as a rule for writes: a write
//! to block `b` moves `b` to a version never used for `b` before, so that no copy of `b`
//! stored under an older version — on any lender, in or out of the current lender set,
//! deleted or not — can be named by a lookup again. Only blocks that were *not* written may
//! stay reachable under an older version. Keys are never reused for other contents, which is
//! what makes a change of the lender set (a copy left on a lender that no longer owns the key
//! is asked for again when the set changes back) and replay of an old sealed copy
//! (`seal.rs` binds the version into the associated data) harmless.
//!
//! # Layout
//! Blocks are grouped in chunks of [`CHUNK_BLOCKS`] (64 blocks = 256 KiB). A chunk has a
//! *current version* and a bitmap of the blocks the lenders hold under it. A chunk that was
//! written while it held blocks may also have a *carried set*: one older version and a bitmap
//! of the blocks still valid under it (held under that version, and not written since). Bits
//! only ever leave a carried set; a block is never in both bitmaps of its chunk.
//!
//! - **lookup** of block `x`: its bit in the current bitmap gives key (x, current); else its
//!   bit in the carried set gives (x, carried version); else a miss.
//! - **write** (or truncate, fallocate) of blocks `W` of a chunk, *after* the disk changed:
//!   the chunk gets a new current version from the file's counter, which only grows, with an
//!   empty bitmap. The copies of `W` under the old current and the carried version are
//!   unreachable now (and deleted, best effort). Of the two older sets that remain — (old
//!   current, its bits minus `W`) and (old carried, its bits minus `W`) — the larger becomes
//!   the carried set (the newer on a tie) and the other's blocks are dropped (and deleted):
//!   misses, refilled under the new version.
//! - **fill**: [`BlockIndex::fill_start`] takes a ticket under the current version *before*
//!   the disk read; [`BlockIndex::fill_done`] sets the block's current bit only if the chunk's
//!   current version is still the ticket's (no write touched the chunk since; conservative:
//!   a write to another block of the chunk also voids it), and takes the block out of the
//!   carried set (the same bytes are now named under the current version).
//!
//! Why no stale copy can be named:
//! - a copy stored before a write to `b` is under a version `v` older than the write; after
//!   the write `b` is in no bitmap of version `v` (it is cleared from the current bitmap,
//!   which gets a new version, and from the carried set, which only loses bits), and versions
//!   only grow, so no lookup returns (b, v) again — whether or not the DEL reached a lender;
//! - a block not written keeps its bytes, so its older key names them still;
//! - a fill that raced a write (its ticket taken before the write finished) may store under
//!   its ticket's key bytes read before or after the write; its bit is not set (the chunk's
//!   version changed), and (b, ticket version) is unreachable by the first point;
//! - a chunk dropped and created again gets a version never used before in this file; when
//!   the counter would wrap, the file gets a new file key (and forgets everything);
//! - a change behind the mount's back ([`BlockIndex::revalidate`]) and a truncate drop every
//!   affected block from both bitmaps.
//!
//! # Budget
//! A chunk is a 16-byte entry in an open-addressing table (plus a control byte and the
//! table's slack); a carried set is another 16-byte entry in a second table, which only
//! chunks written while they held blocks have. Dense caching costs 74–152 KiB per GiB cached
//! remotely when nothing was written (budget: 256 KiB per GiB; the paper's prototype needed
//! 8 MiB), and at most as much again for the carried table: 288 KiB per GiB when every
//! chunk was written and carries (both measured by the tests below, at the tables' worst
//! load).
//!
//! File keys are a keyed hash of the file's identity with a secret drawn per mount run, so a
//! restarted mount, or another borrower of the same tenant, can never name this run's blocks.

use hashbrown::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::identity::FileId;

/// Blocks per chunk: one `u64` bitmap.
pub const CHUNK_BLOCKS: u64 = 64;
/// Bytes per block.
pub const BLOCK_BYTES: u64 = 4096;
/// Shards of the file table (each with its own lock).
const FILE_SHARDS: usize = 16;

/// The wire key of a block: opaque file key, block number, version (its chunk's current
/// version, or the older one the chunk keeps for blocks not written since).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub file: u128,
    pub block: u64,
    pub version: u64,
}

/// An entry of a chunk table: the current version of a chunk and the blocks held under it,
/// or (in the carried table) an older version and the blocks still valid under it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Chunk {
    /// Bit i: block `no * 64 + i` is held by its lender under `version`.
    bits: u64,
    /// Which chunk of the file.
    no: u32,
    version: u32,
}
const _: () = assert!(std::mem::size_of::<Chunk>() == 16);

/// The chunks of one file: an open-addressing table of 16-byte entries keyed by chunk number.
#[derive(Default)]
struct Chunks(hashbrown::HashTable<Chunk>);

#[inline]
fn chunk_hash(no: u32) -> u64 {
    mix(no as u64)
}

/// A cheap full-avalanche mix (MurmurHash3 fmix64); chunk numbers are not adversarial.
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

impl Chunks {
    fn get(&self, no: u32) -> Option<&Chunk> {
        self.0.find(chunk_hash(no), |c| c.no == no)
    }
    fn get_mut(&mut self, no: u32) -> Option<&mut Chunk> {
        self.0.find_mut(chunk_hash(no), |c| c.no == no)
    }
    fn insert(&mut self, c: Chunk) {
        self.0.insert_unique(chunk_hash(c.no), c, |x| chunk_hash(x.no));
    }
    fn remove(&mut self, no: u32) -> Option<Chunk> {
        self.0.find_entry(chunk_hash(no), |c| c.no == no).ok().map(|e| e.remove().0)
    }
    /// Set the entry of `c.no` to `c`, or remove it when `c` holds nothing.
    fn set_or_remove(&mut self, c: Chunk) {
        if c.bits == 0 {
            self.remove(c.no);
        } else if let Some(e) = self.get_mut(c.no) {
            *e = c;
        } else {
            self.insert(c);
        }
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn iter(&self) -> impl Iterator<Item = &Chunk> {
        self.0.iter()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
    /// Heap bytes: 16 per bucket plus a control byte.
    fn memory_bytes(&self) -> u64 {
        let buckets = if self.0.capacity() == 0 { 0 } else { (self.0.capacity() * 8 / 7).next_power_of_two() };
        (buckets * (std::mem::size_of::<Chunk>() + 1)) as u64
    }
}

/// What the index knows of one file.
pub struct FileIndex {
    id: FileId,
    state: Mutex<FileState>,
}

impl std::fmt::Debug for FileIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileIndex").field("id", &self.id).finish_non_exhaustive()
    }
}

impl FileIndex {
    /// A handle counted by [`BlockIndex::writer_opened`] closed; `stamp` reads the file's
    /// stamp through it (its descriptor is still open). The last one to close records the
    /// stamp its handles' changes left, unless a change is in progress (whose end records it).
    pub fn writer_closed(&self, stamp: impl FnOnce() -> std::io::Result<Stamp>) {
        let mut st = self.state.lock();
        st.writers = st.writers.saturating_sub(1);
        if st.writers == 0 && st.unstamped && st.changing == 0 {
            st.stamp = stamp().ok();
            st.unstamped = false;
        }
    }
}

struct FileState {
    /// Opaque wire identity; rotated if `next_version` ever wraps.
    key: u128,
    /// The backing file's change stamp when the mount last knew its contents (at an open, or
    /// after a change made through the mount). `None` until first seen.
    stamp: Option<Stamp>,
    /// Changes through the mount in progress (between [`BlockIndex::begin_change`] and
    /// [`BlockIndex::end_change`]): while any is, the stamp may move for the mount's own
    /// reasons, so an open does not judge it.
    changing: u32,
    /// Handles open for writing through the mount ([`BlockIndex::writer_opened`]): while any
    /// is, a change's stamp is taken when the last of them closes, not after each change.
    writers: u32,
    /// A change ended while `writers` were open: `stamp` predates it (the last writer's
    /// close records the new one). Only ever set while `writers > 0`, or while a change is
    /// in progress whose end records the stamp.
    unstamped: bool,
    next_version: u32,
    /// Per chunk: the current version and the blocks held under it.
    chunks: Chunks,
    /// Per chunk written while it held blocks: one older version and the blocks still valid
    /// under it (never written since). A chunk here is also in `chunks`, and no block is in
    /// both bitmaps.
    carried: Chunks,
}

impl FileState {
    fn lookup(&self, block: u64) -> Option<BlockKey> {
        let (c, bit) = (chunk_of(block), bit_of(block));
        let ch = self.chunks.get(c)?;
        let version = if ch.bits & bit != 0 {
            ch.version
        } else {
            let old = self.carried.get(c).filter(|o| o.bits & bit != 0)?;
            old.version
        };
        Some(BlockKey { file: self.key, block, version: version as u64 })
    }

    /// Take `mask` out of chunk `c`'s carried set (dropping the set when it empties).
    fn uncarry(&mut self, c: u32, mask: u64) {
        if let Some(old) = self.carried.get_mut(c) {
            old.bits &= !mask;
            if old.bits == 0 {
                self.carried.remove(c);
            }
        }
    }

    fn remote_blocks(&self) -> u64 {
        let n = |t: &Chunks| t.iter().map(|c| c.bits.count_ones() as u64).sum::<u64>();
        n(&self.chunks) + n(&self.carried)
    }
}

/// What says a backing file changed: its inode change time (which every write, truncate and
/// metadata change moves) and its size, from `fstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub ctime_sec: i64,
    pub ctime_nsec: i64,
    pub size: u64,
}

impl Stamp {
    /// The stamp of an open file now.
    pub fn of(file: &std::fs::File) -> std::io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Stamp { ctime_sec: m.ctime(), ctime_nsec: m.ctime_nsec(), size: m.size() })
    }
}

/// A fill in progress: a block read from the disk that is being stored on its lender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillTicket {
    pub key: BlockKey,
}

/// The index of one mount.
pub struct BlockIndex {
    /// Each shard's map hashes with foldhash (hashbrown's default), as [`Self::shard`] does:
    /// these are looked up on every read, and with std's SipHash hashing was 950 of the 1,560
    /// instructions the engine added to a read it kept on the disk (BENCHMARKS.md, "Session 55").
    files: Vec<Mutex<HashMap<FileId, Arc<FileIndex>>>>,
    /// Picks a file's shard: random per mount run.
    shards: hashbrown::DefaultHashBuilder,
    /// Keys file keys are derived with: random per mount run (SipHash, a keyed function:
    /// used once per file and rotation, never on a read).
    secret: std::hash::RandomState,
    chunks: AtomicI64,
}

impl Default for BlockIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockIndex {
    pub fn new() -> BlockIndex {
        BlockIndex {
            files: (0..FILE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shards: hashbrown::DefaultHashBuilder::default(),
            secret: std::hash::RandomState::new(),
            chunks: AtomicI64::new(0),
        }
    }

    fn shard(&self, id: &FileId) -> &Mutex<HashMap<FileId, Arc<FileIndex>>> {
        &self.files[(self.shards.hash_one(id) as usize) % FILE_SHARDS]
    }

    fn file_key(&self, id: &FileId, rotation: u64) -> u128 {
        ((self.secret.hash_one((id, rotation, 0u8)) as u128) << 64) | self.secret.hash_one((id, rotation, 1u8)) as u128
    }

    /// The index entry of `id`, created on first use.
    pub fn file(&self, id: &FileId) -> Arc<FileIndex> {
        let mut map = self.shard(id).lock();
        map.entry(*id)
            .or_insert_with(|| {
                Arc::new(FileIndex {
                    id: *id,
                    state: Mutex::new(FileState {
                        key: self.file_key(id, 0),
                        stamp: None,
                        changing: 0,
                        writers: 0,
                        unstamped: false,
                        next_version: 1,
                        chunks: Default::default(),
                        carried: Default::default(),
                    }),
                })
            })
            .clone()
    }

    /// Forget a file whose inode lost its last name: its blocks become unreachable (its
    /// identity can never come back: see `FileId`). Returns the keys it had cached, for
    /// best-effort deletion on the lenders.
    pub fn forget(&self, id: &FileId) -> Vec<BlockKey> {
        let Some(f) = self.shard(id).lock().remove(id) else { return Vec::new() };
        let mut st = f.state.lock();
        let mut keys = Vec::new();
        for chunk in st.chunks.iter().chain(st.carried.iter()) {
            push_keys(&mut keys, st.key, chunk.no, chunk.version, chunk.bits);
        }
        self.chunks.fetch_sub(st.chunks.len() as i64, Ordering::Relaxed);
        st.chunks.clear();
        st.carried.clear();
        keys
    }

    /// A backing file was opened; `stamp` reads its stamp now. If the index knew it with
    /// another stamp, it changed behind the mount's back (written by another program on the
    /// backing directory while it was not open here): every chunk gets a new version, so no
    /// copy of the old contents can be read again. Returns the keys that were cached, for
    /// best-effort deletion. Files the index has never seen need nothing.
    ///
    /// The stamp is read under the file's lock, and not at all while a change through the
    /// mount is in progress, so the mount's own writes on other handles are never taken for
    /// changes behind its back (in either order). Nor while handles that changed the file
    /// are still open (their changes' stamp is taken at the last one's close): the file is
    /// open through the mount, where a change behind it is not supported
    /// (docs/SEMANTICS.md, "Changes behind the mount").
    pub fn revalidate(&self, id: &FileId, stamp: impl FnOnce() -> std::io::Result<Stamp>) -> Vec<BlockKey> {
        let Some(f) = self.shard(id).lock().get(id).cloned() else { return Vec::new() };
        let mut st = f.state.lock();
        if st.changing > 0 || st.unstamped {
            return Vec::new();
        }
        let Ok(now) = stamp() else { return Vec::new() };
        let before = st.stamp.replace(now);
        let mut keys = Vec::new();
        if before.is_some_and(|b| b != now) {
            let all: Vec<u32> = st.chunks.iter().map(|c| c.no).collect();
            for c in all {
                self.bump(&mut st, &f.id, c, !0, &mut keys);
            }
        }
        keys
    }

    /// A change through the mount (write, truncate, fallocate) is about to reach the disk.
    /// Pair with [`Self::end_change`].
    pub fn begin_change(&self, f: &FileIndex) {
        f.state.lock().changing += 1;
    }

    /// The change is on the disk and [`Self::invalidate`]d: record the file's stamp (read by
    /// `stamp` under the file's lock, so the last change to end records the newest), so the
    /// next open does not take the mount's own change for a change behind its back. While
    /// handles counted by [`Self::writer_opened`] are open, `stamp` is not called: the last
    /// one's close records it ([`FileIndex::writer_closed`]) — one `statx` a handle instead
    /// of one a write (a database writes the same open files for hours).
    pub fn end_change(&self, f: &FileIndex, stamp: impl FnOnce() -> std::io::Result<Stamp>) {
        let mut st = f.state.lock();
        st.changing = st.changing.saturating_sub(1);
        if st.writers > 0 {
            st.unstamped = true;
        } else {
            st.stamp = stamp().ok();
            st.unstamped = false;
        }
    }

    /// A handle that may change `id` was opened through the mount: count it, so changes
    /// take their stamp at the last such handle's close. Returns the file's entry, whose
    /// [`FileIndex::writer_closed`] must be called once when the handle closes.
    pub fn writer_opened(&self, id: &FileId) -> Arc<FileIndex> {
        let f = self.file(id);
        f.state.lock().writers += 1;
        f
    }

    /// The key of `block` if a lender holds it: under its chunk's current version, or under
    /// the carried older version if the block was not written since.
    pub fn lookup(&self, f: &FileIndex, block: u64) -> Option<BlockKey> {
        f.state.lock().lookup(block)
    }

    /// Whether a lender holds every block of `first..=last` of `id` (for probes on the data
    /// path: no entry is made for a file the index does not know, one lock per file).
    pub fn holds_all(&self, id: &FileId, first: u64, last: u64) -> bool {
        if self.chunks() == 0 {
            return false;
        }
        let Some(f) = self.shard(id).lock().get(id).cloned() else { return false };
        let st = f.state.lock();
        (first..=last).all(|b| st.lookup(b).is_some())
    }

    /// Start filling `block` from the disk: the key to store it under. Call before reading
    /// the disk, so a write that lands in between is noticed by [`Self::fill_done`].
    pub fn fill_start(&self, f: &FileIndex, block: u64) -> FillTicket {
        let mut st = f.state.lock();
        let c = chunk_of(block);
        let version = match st.chunks.get(c) {
            Some(ch) => ch.version,
            None => {
                let v = self.next_version(&mut st, &f.id);
                st.chunks.insert(Chunk { bits: 0, no: c, version: v });
                self.chunks.fetch_add(1, Ordering::Relaxed);
                v
            }
        };
        FillTicket { key: BlockKey { file: st.key, block, version: version as u64 } }
    }

    /// The lender stored the fill: mark the block remote under the current version, unless
    /// its chunk changed since the fill started (conservative: any write to the chunk, not
    /// only to this block, voids the ticket). Returns whether the bit was set.
    pub fn fill_done(&self, f: &FileIndex, t: FillTicket) -> bool {
        let mut st = f.state.lock();
        if st.key != t.key.file {
            return false;
        }
        let (c, bit) = (chunk_of(t.key.block), bit_of(t.key.block));
        match st.chunks.get_mut(c) {
            Some(ch) if ch.version as u64 == t.key.version => ch.bits |= bit,
            _ => return false,
        }
        // The block was not written since the ticket (else the version would have changed),
        // so a carried copy holds the same bytes; the current one names them from now on.
        st.uncarry(c, bit);
        true
    }

    /// A lookup found nothing on the lender (evicted, or the lender restarted): clear the bit
    /// so the next read goes straight to the disk and refills.
    pub fn mark_missing(&self, f: &FileIndex, key: BlockKey) {
        let mut st = f.state.lock();
        if st.key != key.file {
            return;
        }
        let (c, bit) = (chunk_of(key.block), bit_of(key.block));
        if let Some(ch) = st.chunks.get_mut(c) {
            if ch.version as u64 == key.version {
                ch.bits &= !bit;
                return;
            }
        }
        if st.carried.get(c).is_some_and(|old| old.version as u64 == key.version) {
            st.uncarry(c, bit);
        }
    }

    /// Blocks `first..=last` changed on the disk (a write, truncate or fallocate): give
    /// their chunks new versions, so no old copy of these blocks can be named again; the
    /// chunks' other blocks stay reachable under an older version (see the module doc).
    /// Returns the keys that became unreachable, for best-effort deletion. Call *after* the
    /// disk changed (also when the change failed part-way): every fill whose disk read may
    /// have seen the old data took its ticket before this call, so its `fill_done` now fails,
    /// or it already set a bit that this call clears. (Called before the change, a fill
    /// could take a ticket under the new version, read the old data, and be marked current.)
    pub fn invalidate(&self, f: &FileIndex, first: u64, last: u64) -> Vec<BlockKey> {
        let mut st = f.state.lock();
        let mut keys = Vec::new();
        let (c0, c1) = (chunk_of(first), chunk_of(last));
        if (c1 - c0) as usize > st.chunks.len() {
            // A huge range (truncate of a large file): walk the chunks that exist.
            let affected: Vec<u32> = st.chunks.iter().map(|c| c.no).filter(|c| (c0..=c1).contains(c)).collect();
            for c in affected {
                self.bump(&mut st, &f.id, c, mask_in(c, first, last), &mut keys);
            }
        } else {
            for c in c0..=c1 {
                if st.chunks.get(c).is_some() {
                    self.bump(&mut st, &f.id, c, mask_in(c, first, last), &mut keys);
                }
            }
        }
        keys
    }

    /// Blocks `written` (a mask) of chunk `c` changed: a new current version with nothing
    /// under it; the larger of the two older sets, less `written`, is carried; the keys of
    /// everything else the chunk held go to `keys`.
    fn bump(&self, st: &mut FileState, id: &FileId, c: u32, written: u64, keys: &mut Vec<BlockKey>) {
        // Gone only if a key rotation (an earlier bump of the same change) dropped every
        // chunk: nothing of it can be named any more.
        let Some(cur) = st.chunks.get(c).copied() else { return };
        let mut keep = Chunk { bits: cur.bits & !written, ..cur };
        push_keys(keys, st.key, c, cur.version, cur.bits & written);
        if let Some(old) = st.carried.get(c).copied() {
            push_keys(keys, st.key, c, old.version, old.bits & written);
            let mut other = Chunk { bits: old.bits & !written, ..old };
            if other.bits.count_ones() > keep.bits.count_ones() {
                std::mem::swap(&mut keep, &mut other);
            }
            // One older set per chunk: the other's blocks become misses.
            push_keys(keys, st.key, c, other.version, other.bits);
        }
        let key = st.key;
        let v = self.next_version(st, id);
        if st.key != key {
            // A key rotation inside next_version dropped every chunk: nothing old can be named.
            st.chunks.insert(Chunk { bits: 0, no: c, version: v });
            self.chunks.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *st.chunks.get_mut(c).expect("bumped chunk exists") = Chunk { bits: 0, no: c, version: v };
        st.carried.set_or_remove(keep);
    }

    fn next_version(&self, st: &mut FileState, id: &FileId) -> u32 {
        if st.next_version == u32::MAX {
            // 4 billion changes to one file: start over under a new file key, which no old
            // copy was stored under.
            let rotation = (st.key as u64).wrapping_add(1);
            st.key = self.file_key(id, rotation);
            self.chunks.fetch_sub(st.chunks.len() as i64, Ordering::Relaxed);
            st.chunks.clear();
            st.carried.clear();
            st.next_version = 1;
        }
        st.next_version += 1;
        st.next_version - 1
    }

    /// Heap bytes of the index: every file's chunk tables (current and carried; 16 bytes and
    /// a control byte per bucket) and its record. Walks the index: for stats, not the data
    /// path.
    pub fn memory_bytes(&self) -> u64 {
        let mut total = 0;
        for shard in &self.files {
            let map = shard.lock();
            total += (map.capacity() * (std::mem::size_of::<(FileId, Arc<FileIndex>)>() + 1)) as u64;
            for f in map.values() {
                let st = f.state.lock();
                total += std::mem::size_of::<FileIndex>() as u64 + st.chunks.memory_bytes() + st.carried.memory_bytes();
            }
        }
        total
    }

    /// Chunks in the index.
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Relaxed).max(0) as u64
    }

    /// Blocks of `id` lenders hold (one lock; for choosing files to migrate, not the data
    /// path).
    pub fn file_remote_blocks(&self, id: &FileId) -> u64 {
        let Some(f) = self.shard(id).lock().get(id).cloned() else { return 0 };
        let n = f.state.lock().remote_blocks();
        n
    }

    /// The file `id` names now lives in another backing file with the same contents (a
    /// migration between branches): record that file's stamp, so the next open does not take
    /// the move for a change behind the mount's back. Files the index does not know need
    /// nothing.
    pub fn restamp(&self, id: &FileId, stamp: impl FnOnce() -> std::io::Result<Stamp>) {
        let Some(f) = self.shard(id).lock().get(id).cloned() else { return };
        let mut st = f.state.lock();
        st.stamp = stamp().ok();
        // The copy holds every change made so far (no change runs during a move).
        st.unstamped = false;
    }

    /// Blocks marked remote, over all files (walks the index: for stats, not the data path).
    pub fn remote_blocks(&self) -> u64 {
        let mut n = 0;
        for shard in &self.files {
            for f in shard.lock().values() {
                n += f.state.lock().remote_blocks();
            }
        }
        n
    }
}

fn chunk_of(block: u64) -> u32 {
    // Saturating, so that the chunk numbers of a range stay in order (`invalidate` of
    // "everything from here on" passes a huge last block). Blocks past 2^32 chunks (1 PiB)
    // share the last chunk number: that only invalidates more than needed, never less, and
    // a wrong bit there costs a miss, since keys carry the real block number.
    u32::try_from(block / CHUNK_BLOCKS).unwrap_or(u32::MAX)
}

fn bit_of(block: u64) -> u64 {
    1 << (block % CHUNK_BLOCKS)
}

/// The blocks of chunk `c` within `first..=last`, as a mask. The last chunk number, which
/// blocks past 2^32 chunks share (see [`chunk_of`]), is always wholly in.
fn mask_in(c: u32, first: u64, last: u64) -> u64 {
    if c == u32::MAX {
        return !0;
    }
    let lo = c as u64 * CHUNK_BLOCKS;
    let (a, b) = (first.max(lo), last.min(lo + CHUNK_BLOCKS - 1));
    if a > b {
        return 0;
    }
    let n = b - a + 1;
    let ones = if n == CHUNK_BLOCKS { !0 } else { (1u64 << n) - 1 };
    ones << (a - lo)
}

fn push_keys(keys: &mut Vec<BlockKey>, file: u128, no: u32, version: u32, mut bits: u64) {
    while bits != 0 {
        let i = bits.trailing_zeros() as u64;
        bits &= bits - 1;
        keys.push(BlockKey { file, block: no as u64 * CHUNK_BLOCKS + i, version: version as u64 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Generation;

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino, generation: Generation::Fs(7) }
    }

    /// Fill `blocks` (each marked remote); their keys, in order.
    fn fill(ix: &BlockIndex, f: &FileIndex, blocks: std::ops::Range<u64>) -> Vec<BlockKey> {
        blocks
            .map(|b| {
                let t = ix.fill_start(f, b);
                assert!(ix.fill_done(f, t), "block {b}");
                t.key
            })
            .collect()
    }

    /// A stamp of change time `s`, as read from the file.
    fn stamp(s: i64) -> impl FnOnce() -> std::io::Result<Stamp> {
        move || Ok(Stamp { ctime_sec: s, ctime_nsec: 0, size: 1 << 20 })
    }

    /// A stamp that must not be read (a writer is open, or a change under way).
    fn never() -> std::io::Result<Stamp> {
        panic!("a stamp read while a writer is open or a change is under way")
    }

    /// An open of file 1 that finds stamp `s` keeps its cache; one that then finds `s + 1` (a
    /// change behind the mount) drops all `held` blocks.
    fn kept_at_then_dropped_after(ix: &BlockIndex, s: i64, held: usize) {
        assert!(ix.revalidate(&id(1), stamp(s)).is_empty(), "the mount's own changes taken for another's");
        assert_eq!(ix.revalidate(&id(1), stamp(s + 1)).len(), held, "a change behind the mount was missed");
    }

    /// File 1 seen at an open with stamp 1, its blocks 0..8 held by a lender.
    fn opened_with_eight_held() -> (BlockIndex, Arc<FileIndex>) {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        assert!(ix.revalidate(&id(1), stamp(1)).is_empty());
        fill(&ix, &f, 0..8);
        (ix, f)
    }

    fn carried_chunks(f: &FileIndex) -> usize {
        f.state.lock().carried.len()
    }

    #[test]
    fn fill_then_lookup() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        assert_eq!(ix.lookup(&f, 5), None);
        let t = ix.fill_start(&f, 5);
        assert_eq!(ix.lookup(&f, 5), None, "not remote until the lender has it");
        assert!(ix.fill_done(&f, t));
        assert_eq!(ix.lookup(&f, 5), Some(t.key));
        assert_eq!(ix.lookup(&f, 6), None);
        assert_eq!(ix.remote_blocks(), 1);
    }

    /// A truncate invalidates "from the new end on" with a huge last block: every block from
    /// the new end on must lose its bits, whether the end is mid-chunk or on a boundary, and
    /// the blocks before it stay reachable under their keys.
    #[test]
    fn invalidating_to_the_end_of_a_huge_range_reaches_every_chunk() {
        for first in [0u64, 1, 63, 64, 65, 100, 128, 255] {
            let ix = BlockIndex::new();
            let f = ix.file(&id(1));
            let before = fill(&ix, &f, 0..256);
            // As `CachedPath::set_len` computes it: bytes from the new end, u64::MAX / 2 long.
            let last = (first * BLOCK_BYTES).saturating_add(u64::MAX / 2 - 1) / BLOCK_BYTES;
            let mut gone = ix.invalidate(&f, first, last);
            for b in 0..256u64 {
                let want = if b >= first { None } else { Some(before[b as usize]) };
                assert_eq!(ix.lookup(&f, b), want, "first {first}, block {b}");
            }
            gone.sort_by_key(|k| k.block);
            assert_eq!(gone, before[first as usize..].to_vec(), "first {first}");
            assert_eq!(ix.remote_blocks(), first);
        }
        assert_eq!(chunk_of(u64::MAX), u32::MAX);
        assert!(chunk_of(u64::MAX / 2) >= chunk_of(1 << 40));
    }

    #[test]
    fn a_write_between_fill_start_and_done_wins() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let t = ix.fill_start(&f, 3);
        ix.invalidate(&f, 3, 3);
        assert!(!ix.fill_done(&f, t), "a fill that raced a write must not be marked");
        assert_eq!(ix.lookup(&f, 3), None);
        // A new fill after the write uses a new version: the racing copy is unreachable.
        let t2 = ix.fill_start(&f, 3);
        assert_ne!(t2.key, t.key);
        assert!(ix.fill_done(&f, t2));
        assert_eq!(ix.lookup(&f, 3), Some(t2.key));
    }

    #[test]
    fn invalidate_returns_the_written_blocks_keys_and_keeps_the_rest() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let mut old = Vec::new();
        for b in [0, 1, 63, 64, 200] {
            let t = ix.fill_start(&f, b);
            ix.fill_done(&f, t);
            old.push(t.key);
        }
        let mut gone = ix.invalidate(&f, 1, 64);
        gone.sort_by_key(|k| k.block);
        assert_eq!(gone, old[1..4].to_vec(), "blocks 1..=64 were written");
        for b in [1, 63, 64] {
            assert_eq!(ix.lookup(&f, b), None);
        }
        assert_eq!(ix.lookup(&f, 0), Some(old[0]), "block 0 not written: still under its key");
        assert_eq!(ix.lookup(&f, 200), Some(old[4]), "chunk 3 untouched");
        // New fills of the chunks go under new versions.
        assert!(ix.fill_start(&f, 1).key.version > old[0].version);
        // Truncate-style huge range.
        assert_eq!(ix.invalidate(&f, 100, u64::MAX / 2), vec![old[4]]);
        assert_eq!(ix.lookup(&f, 200), None);
        assert_eq!(ix.lookup(&f, 0), Some(old[0]));
    }

    #[test]
    fn versions_never_repeat_within_a_file() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        for round in 0..100 {
            let t = ix.fill_start(&f, round % 3);
            ix.fill_done(&f, t);
            let before = ix.lookup(&f, round % 3).unwrap();
            ix.invalidate(&f, 0, 1000);
            let after = ix.fill_start(&f, round % 3);
            assert!(after.key.version > before.version);
        }
    }

    #[test]
    fn files_and_runs_have_distinct_keys() {
        let a = BlockIndex::new();
        let b = BlockIndex::new();
        let fa1 = a.file(&id(1));
        let fa2 = a.file(&id(2));
        let fb1 = b.file(&id(1));
        let k = |ix: &BlockIndex, f: &FileIndex| ix.fill_start(f, 0).key.file;
        assert_ne!(k(&a, &fa1), k(&a, &fa2));
        assert_ne!(k(&a, &fa1), k(&b, &fb1), "another run must never name this run's blocks");
        assert_eq!(k(&a, &fa1), k(&a, &a.file(&id(1))), "stable within a run");
    }

    #[test]
    fn forget_drops_everything() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(9));
        let t = ix.fill_start(&f, 1);
        ix.fill_done(&f, t);
        assert_eq!(ix.forget(&id(9)), vec![t.key]);
        assert_eq!(ix.remote_blocks(), 0);
        // Carried copies too.
        let f = ix.file(&id(10));
        let mut held = fill(&ix, &f, 0..3);
        ix.invalidate(&f, 0, 0);
        held.extend(fill(&ix, &f, 0..1));
        let mut gone = ix.forget(&id(10));
        gone.sort_by_key(|k| (k.block, k.version));
        held.sort_by_key(|k| (k.block, k.version));
        assert_eq!(gone, held[1..].to_vec(), "block 0's first copy was retired by the write");
        let f2 = ix.file(&id(9));
        assert_eq!(ix.lookup(&f2, 1), None);
    }

    #[test]
    fn mark_missing_clears_only_that_version() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let t = ix.fill_start(&f, 1);
        ix.fill_done(&f, t);
        ix.mark_missing(&f, BlockKey { version: t.key.version + 1, ..t.key });
        assert!(ix.lookup(&f, 1).is_some());
        ix.mark_missing(&f, t.key);
        assert!(ix.lookup(&f, 1).is_none());
    }

    /// The budget: ≤ 0.25 MiB of index per GiB cached remotely.
    #[test]
    fn index_memory_per_gib_is_within_budget() {
        let ix = BlockIndex::new();
        let blocks = (1u64 << 30) / BLOCK_BYTES;
        // 1 GiB cached, spread over 64 files of 16 MiB.
        for file in 0..64 {
            let f = ix.file(&id(file));
            for b in 0..blocks / 64 {
                let t = ix.fill_start(&f, b);
                ix.fill_done(&f, t);
            }
        }
        assert_eq!(ix.remote_blocks(), blocks);
        let per_gib = ix.memory_bytes();
        println!("index: {per_gib} bytes per GiB cached ({:.3} MiB)", per_gib as f64 / (1 << 20) as f64);
        assert!(per_gib <= 256 << 10, "{per_gib} bytes per GiB");
    }

    #[test]
    fn a_write_keeps_the_chunks_other_blocks_reachable_under_their_old_keys() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let old = fill(&ix, &f, 0..64);
        // One 8 KiB page: blocks 6 and 7.
        let mut gone = ix.invalidate(&f, 6, 7);
        gone.sort_by_key(|k| k.block);
        assert_eq!(gone, old[6..8].to_vec(), "only the written blocks are retired");
        for b in 0..64u64 {
            let want = if (6..=7).contains(&b) { None } else { Some(old[b as usize]) };
            assert_eq!(ix.lookup(&f, b), want, "block {b}");
        }
        assert_eq!(ix.remote_blocks(), 62);
        assert_eq!(carried_chunks(&f), 1);
        // The written blocks refill under a new version, never an earlier one.
        let new = fill(&ix, &f, 6..8);
        for (n, o) in new.iter().zip(&old[6..8]) {
            assert!(n.version > o.version, "{n:?} after {o:?}");
            assert_eq!(ix.lookup(&f, n.block), Some(*n));
        }
        assert_eq!(ix.remote_blocks(), 64);
        // A block refilled while carried moves to the current version (same bytes).
        let t = ix.fill_start(&f, 9);
        assert!(ix.fill_done(&f, t));
        assert_eq!(ix.lookup(&f, 9), Some(t.key));
        assert_ne!(t.key, old[9]);
        assert_eq!(ix.remote_blocks(), 64, "a block is counted once");
    }

    /// The invariant, by brute force over one chunk: after a write to a block, no key it was
    /// ever filled or looked up under before the write is returned for it again.
    #[test]
    fn a_written_blocks_key_never_equals_an_earlier_key_for_it() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        // Per block: keys issued or returned since its last write, and those retired by it.
        let mut live: Vec<Vec<BlockKey>> = vec![Vec::new(); 64];
        let mut retired: Vec<Vec<BlockKey>> = vec![Vec::new(); 64];
        let mut x = 7u64;
        for step in 0..20_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let b = (x >> 33) % 64;
            match (x >> 20) % 4 {
                0 => {
                    let len = 1 + (x >> 40) % 3;
                    let last = (b + len - 1).min(63);
                    ix.invalidate(&f, b, last);
                    for w in b..=last {
                        let keys = std::mem::take(&mut live[w as usize]);
                        retired[w as usize].extend(keys);
                    }
                }
                _ => {
                    let t = ix.fill_start(&f, b);
                    assert!(!retired[b as usize].contains(&t.key), "step {step}: ticket {t:?} reuses a retired key");
                    live[b as usize].push(t.key);
                    ix.fill_done(&f, t);
                }
            }
            let b = (x >> 45) % 64;
            if let Some(k) = ix.lookup(&f, b) {
                assert!(!retired[b as usize].contains(&k), "step {step}: lookup of {b} named retired {k:?}");
                assert!(live[b as usize].contains(&k), "step {step}: {k:?} was never filled");
            }
        }
        assert!(carried_chunks(&f) <= 1);
    }

    #[test]
    fn two_writes_keep_the_larger_older_set() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let v1 = fill(&ix, &f, 0..64);
        ix.invalidate(&f, 0, 0); // carried: v1, blocks 1..=63
        let v2 = fill(&ix, &f, 0..1); // current: block 0
                                      // Second write: (v2, {0}) against (v1, 2..=63): v1's set is larger and stays.
        let mut gone = ix.invalidate(&f, 1, 1);
        gone.sort_by_key(|k| k.block);
        assert_eq!(gone, vec![v2[0], v1[1]], "block 1 written; block 0's newer copy dropped");
        assert_eq!(ix.lookup(&f, 0), None);
        assert_eq!(ix.lookup(&f, 1), None);
        for b in 2..64u64 {
            assert_eq!(ix.lookup(&f, b), Some(v1[b as usize]));
        }
        // Refill blocks 0..=40 under the current version: they leave the carried set.
        let v3 = fill(&ix, &f, 0..41);
        assert_eq!(ix.remote_blocks(), 64);
        // Third write: (v3, 0..=40 less 40) against (v1, 41..=63 less 1 block): v3 stays.
        let gone = ix.invalidate(&f, 40, 40);
        assert_eq!(gone.len(), 1 + 23, "block 40 and the 23 blocks of the smaller set");
        for b in 0..64u64 {
            let want = if b < 40 { Some(v3[b as usize]) } else { None };
            assert_eq!(ix.lookup(&f, b), want, "block {b}");
        }
        assert_eq!(carried_chunks(&f), 1);
        // A write that leaves nothing of either set drops the carried entry.
        ix.invalidate(&f, 0, 63);
        assert_eq!((carried_chunks(&f), ix.remote_blocks()), (0, 0));
    }

    #[test]
    fn a_fill_racing_a_write_to_its_block_or_a_neighbour_is_not_marked() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let held = fill(&ix, &f, 10..12);
        for written in [3u64, 4] {
            let t = ix.fill_start(&f, 3);
            ix.invalidate(&f, written, written);
            assert!(!ix.fill_done(&f, t), "written {written}");
            assert_eq!(ix.lookup(&f, 3), None);
        }
        assert_eq!(ix.lookup(&f, 10), Some(held[0]), "the neighbours stay");
        // A fill of a carried block that raced a write elsewhere: still carried, unchanged.
        let t = ix.fill_start(&f, 11);
        ix.invalidate(&f, 5, 5);
        assert!(!ix.fill_done(&f, t));
        assert_eq!(ix.lookup(&f, 11), Some(held[1]));
    }

    #[test]
    fn mark_missing_clears_a_carried_block_by_its_version() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let old = fill(&ix, &f, 0..3);
        ix.invalidate(&f, 0, 0);
        let new = fill(&ix, &f, 0..1);
        // Wrong versions change nothing.
        ix.mark_missing(&f, BlockKey { version: old[1].version + 1, ..old[1] });
        ix.mark_missing(&f, BlockKey { block: 1, ..new[0] });
        assert_eq!(ix.lookup(&f, 1), Some(old[1]));
        ix.mark_missing(&f, old[1]);
        assert_eq!(ix.lookup(&f, 1), None);
        ix.mark_missing(&f, old[2]);
        assert_eq!(carried_chunks(&f), 0, "an emptied carried set is dropped");
        assert_eq!(ix.lookup(&f, 0), Some(new[0]));
        ix.mark_missing(&f, old[0]);
        assert_eq!(ix.lookup(&f, 0), Some(new[0]), "a retired key clears nothing");
    }

    #[test]
    fn a_change_behind_the_mount_drops_carried_blocks_too() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        assert!(ix.revalidate(&id(1), stamp(1)).is_empty());
        let old = fill(&ix, &f, 0..8);
        ix.invalidate(&f, 0, 0);
        let new = fill(&ix, &f, 0..1);
        assert!(ix.revalidate(&id(1), stamp(1)).is_empty(), "unchanged");
        assert_eq!(ix.remote_blocks(), 8);
        let mut gone = ix.revalidate(&id(1), stamp(2));
        gone.sort_by_key(|k| k.block);
        let mut want = new.clone();
        want.extend_from_slice(&old[1..]);
        assert_eq!(gone, want);
        assert_eq!((ix.remote_blocks(), carried_chunks(&f)), (0, 0));
        for b in 0..8 {
            assert_eq!(ix.lookup(&f, b), None);
        }
    }

    #[test]
    fn a_key_rotation_forgets_carried_sets() {
        let ix = BlockIndex::new();
        let f = ix.file(&id(1));
        let old = fill(&ix, &f, 0..4);
        ix.invalidate(&f, 0, 0);
        assert_eq!(carried_chunks(&f), 1);
        f.state.lock().next_version = u32::MAX;
        ix.invalidate(&f, 1, 1);
        assert_eq!((ix.remote_blocks(), carried_chunks(&f)), (0, 0));
        for b in 0..4 {
            assert_eq!(ix.lookup(&f, b), None);
        }
        let t = ix.fill_start(&f, 2);
        assert_ne!(t.key.file, old[2].file, "a new file key after the wrap");
        assert!(ix.fill_done(&f, t));
        assert_eq!(ix.lookup(&f, 2), Some(t.key));
    }

    #[test]
    fn a_writers_changes_take_their_stamp_at_its_close_not_after_each_change() {
        let (ix, f) = opened_with_eight_held();
        let (a, b) = (ix.writer_opened(&id(1)), ix.writer_opened(&id(1)));
        for _ in 0..3 {
            ix.begin_change(&f);
            ix.invalidate(&f, 0, 0);
            ix.end_change(&f, never);
        }
        // Another open meanwhile (the file is open through the mount): not judged, nothing
        // dropped, whatever the stamp says.
        assert!(ix.revalidate(&id(1), never).is_empty());
        assert_eq!(ix.remote_blocks(), 7);
        a.writer_closed(never);
        // The last writer's close records the stamp the changes left (2): an open then keeps
        // the cache, and a change behind the mount after it (3) is noticed.
        b.writer_closed(stamp(2));
        kept_at_then_dropped_after(&ix, 2, 7);
        assert_eq!(ix.remote_blocks(), 0);
        // With no writer open a change takes its stamp at its end, as a change through a
        // handle nobody counted (the write-back tier's own) does.
        fill(&ix, &f, 0..4);
        ix.begin_change(&f);
        ix.invalidate(&f, 0, 0);
        ix.end_change(&f, stamp(4));
        kept_at_then_dropped_after(&ix, 4, 3);
    }

    #[test]
    fn a_writer_closing_during_a_change_leaves_the_stamp_to_the_changes_end() {
        let (ix, f) = opened_with_eight_held();
        let w = ix.writer_opened(&id(1));
        ix.begin_change(&f);
        ix.end_change(&f, never);
        // A change through an uncounted handle is under way when the writer closes.
        ix.begin_change(&f);
        w.writer_closed(never);
        ix.invalidate(&f, 0, 0);
        ix.end_change(&f, stamp(2));
        kept_at_then_dropped_after(&ix, 2, 7);
    }

    #[test]
    fn mask_in_covers_exactly_the_range() {
        assert_eq!(mask_in(0, 0, 63), !0);
        assert_eq!(mask_in(0, 6, 7), 0b1100_0000);
        assert_eq!(mask_in(1, 0, 64), 1);
        assert_eq!(mask_in(1, 127, 1000), 1 << 63);
        assert_eq!(mask_in(2, 0, 64), 0);
        assert_eq!(mask_in(u32::MAX, u64::MAX, u64::MAX), !0);
    }

    /// The budget with writes: 1 GiB cached densely, then one 8 KiB page written in every
    /// chunk and refilled, so that every chunk has a carried set.
    #[test]
    fn index_memory_per_gib_when_every_chunk_carries() {
        let ix = BlockIndex::new();
        let blocks = (1u64 << 30) / BLOCK_BYTES;
        for file in 0..64 {
            let f = ix.file(&id(file));
            fill(&ix, &f, 0..blocks / 64);
            for c in 0..blocks / 64 / CHUNK_BLOCKS {
                ix.invalidate(&f, c * CHUNK_BLOCKS + 6, c * CHUNK_BLOCKS + 7);
                fill(&ix, &f, c * CHUNK_BLOCKS + 6..c * CHUNK_BLOCKS + 8);
            }
            assert_eq!(carried_chunks(&f) as u64, blocks / 64 / CHUNK_BLOCKS);
        }
        assert_eq!(ix.remote_blocks(), blocks);
        let per_gib = ix.memory_bytes();
        println!(
            "index, every chunk carrying: {per_gib} bytes per GiB cached ({:.3} MiB)",
            per_gib as f64 / (1 << 20) as f64
        );
        // At most the read-only budget twice over: the carried table is never larger than the
        // chunk table.
        assert!(per_gib <= 2 * (256 << 10), "{per_gib} bytes per GiB");
    }

    /// The model for the property test: what each block holds on the disk (a content id),
    /// the lenders' stores (which keep their copies in and out of the set), fills in flight
    /// and writes whose disk change is done but whose invalidation is not yet.
    mod model {
        use super::*;
        use proptest::prelude::*;
        use std::collections::HashMap;

        pub const BLOCKS: u64 = 3 * CHUNK_BLOCKS - 20;
        const LENDERS: usize = 3;

        #[derive(Clone, Debug)]
        pub enum Op {
            /// The disk changes (blocks `block..block + len`); the index learns it later.
            WriteDisk {
                block: u64,
                len: u64,
            },
            /// The oldest write in flight reaches the index; its DELs arrive if `dels`.
            WriteIndex {
                dels: bool,
            },
            /// Truncate to `block` blocks (and extend back): a disk change and its
            /// invalidation of everything from `block` on.
            Truncate {
                block: u64,
                dels: bool,
            },
            FillStart(u64),
            /// Fill `i` (modulo those in flight) reads the disk / is stored on its lender /
            /// is acknowledged (fill_done) / is dropped.
            FillRead(usize),
            FillPut(usize),
            FillDone(usize),
            FillDrop(usize),
            /// A read: the lookup, and on a miss at the lender, mark_missing.
            Read(u64),
            /// A lender loses one of its copies.
            Evict {
                lender: usize,
                pick: usize,
            },
            /// A lender leaves or rejoins the set (its memory stays).
            Toggle(usize),
            /// Another program changes a block while the file is closed; the next open sees it.
            /// The block is the `n`th of those a lender holds (modulo; any block if none is).
            ChangedBehind(usize),
            /// A handle is opened for writing through the mount (the open's revalidation,
            /// then counted as a writer) / the oldest one open closes.
            OpenWriter,
            CloseWriter,
            /// The version counter is about to wrap.
            NearWrap,
        }

        pub fn op() -> impl Strategy<Value = Op> {
            let block = 0..BLOCKS;
            prop_oneof![
                4 => (block.clone(), 1..4u64).prop_map(|(block, len)| Op::WriteDisk { block, len }),
                4 => any::<bool>().prop_map(|dels| Op::WriteIndex { dels }),
                1 => (block.clone(), any::<bool>()).prop_map(|(block, dels)| Op::Truncate { block, dels }),
                8 => block.clone().prop_map(Op::FillStart),
                6 => any::<usize>().prop_map(Op::FillRead),
                6 => any::<usize>().prop_map(Op::FillPut),
                6 => any::<usize>().prop_map(Op::FillDone),
                1 => any::<usize>().prop_map(Op::FillDrop),
                8 => block.clone().prop_map(Op::Read),
                1 => (0..LENDERS, any::<usize>()).prop_map(|(lender, pick)| Op::Evict { lender, pick }),
                3 => (0..LENDERS).prop_map(Op::Toggle),
                1 => any::<usize>().prop_map(Op::ChangedBehind),
                1 => Just(Op::OpenWriter),
                1 => Just(Op::CloseWriter),
                1 => Just(Op::NearWrap),
            ]
        }

        struct Fill {
            ticket: FillTicket,
            read: Option<u64>,
            stored: bool,
        }

        pub struct World {
            ix: BlockIndex,
            f: Arc<FileIndex>,
            disk: Vec<u64>,
            next_content: u64,
            stores: Vec<HashMap<BlockKey, u64>>,
            in_set: Vec<bool>,
            fills: Vec<Fill>,
            writes: Vec<(u64, u64)>,
            /// The disk's change stamp: moves with every change, the mount's or another's.
            stamp: i64,
            /// Handles open for writing through the mount.
            writers: Vec<Arc<FileIndex>>,
        }

        impl World {
            pub fn new() -> World {
                let ix = BlockIndex::new();
                let f = ix.file(&id(1));
                let mut w = World {
                    ix,
                    f,
                    disk: (0..BLOCKS).collect(),
                    next_content: BLOCKS,
                    stores: vec![HashMap::new(); LENDERS],
                    in_set: vec![true, true, false],
                    fills: Vec::new(),
                    writes: Vec::new(),
                    stamp: 0,
                    writers: Vec::new(),
                };
                w.reopen();
                w
            }

            fn disk_stamp(&self) -> std::io::Result<Stamp> {
                Ok(Stamp { ctime_sec: self.stamp, ctime_nsec: 0, size: BLOCKS * BLOCK_BYTES })
            }

            fn reopen(&mut self) {
                let stamp = self.disk_stamp();
                let gone = self.ix.revalidate(&id(1), || stamp);
                self.del(gone, true);
            }

            /// A change through the mount ends (its blocks invalidated): the stamp now.
            fn end_change(&mut self) {
                let stamp = self.disk_stamp();
                self.ix.end_change(&self.f, || stamp);
            }

            /// The lender of `k` in the set now: placement by file and block, as in
            /// `remote.rs` (a block's versions all land on one lender of a given set).
            fn owner(&self, k: &BlockKey) -> Option<usize> {
                (0..LENDERS)
                    .filter(|&l| self.in_set[l])
                    .max_by_key(|&l| mix((k.file as u64) ^ k.block.rotate_left(17) ^ mix(l as u64 + 1)))
            }

            fn del(&mut self, keys: Vec<BlockKey>, arrive: bool) {
                if arrive {
                    for k in keys {
                        if let Some(l) = self.owner(&k) {
                            self.stores[l].remove(&k);
                        }
                    }
                }
            }

            fn change(&mut self, blocks: std::ops::Range<u64>) {
                for b in blocks {
                    self.disk[b as usize] = self.next_content;
                    self.next_content += 1;
                }
                self.stamp += 1;
            }

            fn fill(&mut self, i: usize) -> Option<usize> {
                (!self.fills.is_empty()).then(|| i % self.fills.len())
            }

            pub fn apply(&mut self, op: &Op) {
                match *op {
                    Op::WriteDisk { block, len } => {
                        let end = (block + len).min(BLOCKS);
                        self.ix.begin_change(&self.f);
                        self.change(block..end);
                        self.writes.push((block, end - 1));
                    }
                    Op::WriteIndex { dels } => {
                        if !self.writes.is_empty() {
                            let (first, last) = self.writes.remove(0);
                            let gone = self.ix.invalidate(&self.f, first, last);
                            self.del(gone, dels);
                            self.end_change();
                        }
                    }
                    Op::Truncate { block, dels } => {
                        self.ix.begin_change(&self.f);
                        self.change(block..BLOCKS);
                        let gone = self.ix.invalidate(&self.f, block, u64::MAX / 2);
                        self.del(gone, dels);
                        self.end_change();
                    }
                    Op::FillStart(b) => {
                        let ticket = self.ix.fill_start(&self.f, b);
                        self.fills.push(Fill { ticket, read: None, stored: false });
                    }
                    Op::FillRead(i) => {
                        if let Some(i) = self.fill(i) {
                            let b = self.fills[i].ticket.key.block;
                            self.fills[i].read.get_or_insert(self.disk[b as usize]);
                        }
                    }
                    Op::FillPut(i) => {
                        if let Some(i) = self.fill(i) {
                            let fl = &self.fills[i];
                            if let (Some(v), false) = (fl.read, fl.stored) {
                                let k = fl.ticket.key;
                                if let Some(l) = self.owner(&k) {
                                    self.stores[l].insert(k, v);
                                    self.fills[i].stored = true;
                                } else {
                                    self.fills.remove(i); // no lender: dropped
                                }
                            }
                        }
                    }
                    Op::FillDone(i) => {
                        if let Some(i) = self.fill(i) {
                            if self.fills[i].stored {
                                let fl = self.fills.remove(i);
                                self.ix.fill_done(&self.f, fl.ticket);
                            }
                        }
                    }
                    Op::FillDrop(i) => {
                        if let Some(i) = self.fill(i) {
                            self.fills.remove(i);
                        }
                    }
                    Op::Read(b) => {
                        if let Some(k) = self.ix.lookup(&self.f, b) {
                            let got = self.owner(&k).and_then(|l| self.stores[l].get(&k).copied());
                            match got {
                                Some(v) if !self.in_flight(b) => {
                                    assert_eq!(v, self.disk[b as usize], "read of block {b} under {k:?}")
                                }
                                Some(_) => {}
                                None => self.ix.mark_missing(&self.f, k),
                            }
                        }
                    }
                    Op::Evict { lender, pick } => {
                        let store = &mut self.stores[lender];
                        if !store.is_empty() {
                            let k = *store.keys().nth(pick % store.len()).unwrap();
                            store.remove(&k);
                        }
                    }
                    Op::Toggle(l) => self.in_set[l] = !self.in_set[l],
                    Op::ChangedBehind(n) => {
                        // Only while the file is not open through the mount: the mount's own
                        // writes are done and its writers closed.
                        if self.writes.is_empty() && self.writers.is_empty() {
                            let held: Vec<u64> =
                                (0..BLOCKS).filter(|&b| self.ix.lookup(&self.f, b).is_some()).collect();
                            let b = if held.is_empty() { n as u64 % BLOCKS } else { held[n % held.len()] };
                            self.change(b..b + 1);
                            self.reopen();
                        }
                    }
                    Op::OpenWriter => {
                        self.reopen();
                        self.writers.push(self.ix.writer_opened(&id(1)));
                    }
                    Op::CloseWriter => {
                        if !self.writers.is_empty() {
                            let stamp = self.disk_stamp();
                            self.writers.remove(0).writer_closed(|| stamp);
                        }
                    }
                    Op::NearWrap => {
                        let mut st = self.f.state.lock();
                        st.next_version = st.next_version.max(u32::MAX - 3);
                    }
                }
            }

            /// A write to `b` reached the disk and not yet the index: a read now may see
            /// either bytes (the write has not returned).
            fn in_flight(&self, b: u64) -> bool {
                self.writes.iter().any(|&(first, last)| (first..=last).contains(&b))
            }

            /// The invariant: every key a lookup returns names the disk's bytes on *every*
            /// lender that holds a copy under it, in the set or not (so no change of the set,
            /// and no replay of an old sealed copy, can bring back other bytes).
            pub fn check(&self) {
                for b in 0..BLOCKS {
                    if self.in_flight(b) {
                        continue;
                    }
                    if let Some(k) = self.ix.lookup(&self.f, b) {
                        assert_eq!(k.block, b);
                        for (l, store) in self.stores.iter().enumerate() {
                            if let Some(&v) = store.get(&k) {
                                assert_eq!(v, self.disk[b as usize], "lender {l} holds other bytes under {k:?}");
                            }
                        }
                    }
                }
                let st = self.f.state.lock();
                for c in st.carried.iter() {
                    let cur = st.chunks.get(c.no).expect("a carried chunk has a current entry");
                    assert_eq!(cur.bits & c.bits, 0, "a block in both bitmaps");
                    assert!(c.version < cur.version && c.bits != 0);
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Random writes, fills (in pieces, racing the writes), reads, evictions, lender-set
        /// changes, truncates, changes behind the mount and version wraps, against a model of
        /// the disk: no lookup ever names other bytes than the disk's, on any lender.
        #[test]
        fn lookups_never_name_other_bytes_than_the_disks(ops in proptest::collection::vec(model::op(), 1..300)) {
            let mut w = model::World::new();
            for op in &ops {
                w.apply(op);
                w.check();
            }
        }
    }
}
