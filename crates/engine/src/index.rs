//! The borrower's index of what its lenders hold: "is this block remote, and under which
//! key?" answered from local memory, without a round trip (paper 000's "management area").
//!
//! # Layout and budget
//! Blocks are grouped in chunks of [`CHUNK_BLOCKS`] (64 blocks = 256 KiB). A chunk is a bitmap
//! of the blocks the lenders hold plus the *version* those copies were stored under. Only
//! chunks with something cached (or a version that must not be reused) exist. A chunk is a
//! 16-byte entry in an open-addressing table (plus a control byte and the table's slack):
//! 0.3–0.6 bytes per cached block, i.e. 74–147 KiB per GiB cached remotely (budget: 256 KiB
//! per GiB; the paper's prototype needed 8 MiB).
//!
//! # Why data can never be stale
//! The key under which a block is stored and looked up carries its chunk's version. A write
//! (or truncate, or fallocate that changes contents) gives every chunk it touches a new
//! version, taken from a per-file counter that only grows, and clears the chunk's bits. So:
//! - a copy stored before the write is under the old version: no lookup will ever name it
//!   again, whether or not the invalidation (DEL) reached its lender;
//! - a copy read from the disk before the write but stored after it (a fill racing a write)
//!   is stored under the old version too, and its bit is not set: [`BlockIndex::fill_done`]
//!   sets a bit only if the chunk's version is still the one the fill started under.
//! - a chunk dropped and created again gets a version never used before in this file.
//!
//! File keys are a keyed hash of the file's identity with a secret drawn per mount run, so a
//! restarted mount, or another borrower of the same tenant, can never name this run's blocks.

use std::collections::HashMap;
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

/// The wire key of a block: opaque file key, block number, chunk version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub file: u128,
    pub block: u64,
    pub version: u64,
}

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
fn mix(mut x: u64) -> u64 {
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
    next_version: u32,
    chunks: Chunks,
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
    files: Vec<Mutex<HashMap<FileId, Arc<FileIndex>>>>,
    /// Keys file keys are derived with: random per mount run.
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
            secret: std::hash::RandomState::new(),
            chunks: AtomicI64::new(0),
        }
    }

    fn shard(&self, id: &FileId) -> &Mutex<HashMap<FileId, Arc<FileIndex>>> {
        &self.files[(self.secret.hash_one(id) as usize) % FILE_SHARDS]
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
                        next_version: 1,
                        chunks: Default::default(),
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
        for chunk in st.chunks.iter() {
            push_keys(&mut keys, st.key, chunk);
        }
        self.chunks.fetch_sub(st.chunks.len() as i64, Ordering::Relaxed);
        st.chunks.clear();
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
    /// changes behind its back (in either order).
    pub fn revalidate(&self, id: &FileId, stamp: impl FnOnce() -> std::io::Result<Stamp>) -> Vec<BlockKey> {
        let Some(f) = self.shard(id).lock().get(id).cloned() else { return Vec::new() };
        let mut st = f.state.lock();
        if st.changing > 0 {
            return Vec::new();
        }
        let Ok(now) = stamp() else { return Vec::new() };
        let before = st.stamp.replace(now);
        let mut keys = Vec::new();
        if before.is_some_and(|b| b != now) {
            let all: Vec<u32> = st.chunks.iter().map(|c| c.no).collect();
            for c in all {
                self.bump(&mut st, &f.id, c, &mut keys);
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
    /// next open does not take the mount's own change for a change behind its back.
    pub fn end_change(&self, f: &FileIndex, stamp: impl FnOnce() -> std::io::Result<Stamp>) {
        let mut st = f.state.lock();
        st.changing = st.changing.saturating_sub(1);
        st.stamp = stamp().ok();
    }

    /// The key of `block` if a lender holds it.
    pub fn lookup(&self, f: &FileIndex, block: u64) -> Option<BlockKey> {
        let st = f.state.lock();
        let c = st.chunks.get(chunk_of(block))?;
        (c.bits & bit_of(block) != 0).then(|| BlockKey { file: st.key, block, version: c.version as u64 })
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

    /// The lender stored the fill: mark the block remote, unless its chunk changed since the
    /// fill started. Returns whether the bit was set.
    pub fn fill_done(&self, f: &FileIndex, t: FillTicket) -> bool {
        let mut st = f.state.lock();
        if st.key != t.key.file {
            return false;
        }
        match st.chunks.get_mut(chunk_of(t.key.block)) {
            Some(ch) if ch.version as u64 == t.key.version => {
                ch.bits |= bit_of(t.key.block);
                true
            }
            _ => false,
        }
    }

    /// A lookup found nothing on the lender (evicted, or the lender restarted): clear the bit
    /// so the next read goes straight to the disk and refills.
    pub fn mark_missing(&self, f: &FileIndex, key: BlockKey) {
        let mut st = f.state.lock();
        if st.key != key.file {
            return;
        }
        if let Some(ch) = st.chunks.get_mut(chunk_of(key.block)) {
            if ch.version as u64 == key.version {
                ch.bits &= !bit_of(key.block);
            }
        }
    }

    /// Blocks `first..=last` changed on the disk (a write, truncate or fallocate): give
    /// their chunks new versions so no old copy can be named again. Returns the keys that
    /// were cached, for best-effort deletion. Call *after* the disk changed (also when the
    /// change failed part-way): every fill whose disk read may have seen the old data took
    /// its ticket before this call, so its `fill_done` now fails, or it already set a bit that
    /// this call clears. (Called before the change, a fill could take a ticket under the new
    /// version, read the old data, and be marked current.)
    pub fn invalidate(&self, f: &FileIndex, first: u64, last: u64) -> Vec<BlockKey> {
        let mut st = f.state.lock();
        let mut keys = Vec::new();
        let (c0, c1) = (chunk_of(first), chunk_of(last));
        if (c1 - c0) as usize > st.chunks.len() {
            // A huge range (truncate of a large file): walk the chunks that exist.
            let affected: Vec<u32> = st.chunks.iter().map(|c| c.no).filter(|c| (c0..=c1).contains(c)).collect();
            for c in affected {
                self.bump(&mut st, &f.id, c, &mut keys);
            }
        } else {
            for c in c0..=c1 {
                if st.chunks.get(c).is_some() {
                    self.bump(&mut st, &f.id, c, &mut keys);
                }
            }
        }
        keys
    }

    fn bump(&self, st: &mut FileState, id: &FileId, c: u32, keys: &mut Vec<BlockKey>) {
        let old = *st.chunks.get(c).expect("bumped chunk exists");
        push_keys(keys, st.key, &old);
        let v = self.next_version(st, id);
        // The chunk may have been dropped by a key rotation inside next_version.
        if let Some(ch) = st.chunks.get_mut(c) {
            *ch = Chunk { bits: 0, no: c, version: v };
        } else {
            st.chunks.insert(Chunk { bits: 0, no: c, version: v });
            self.chunks.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn next_version(&self, st: &mut FileState, id: &FileId) -> u32 {
        if st.next_version == u32::MAX {
            // 4 billion changes to one file: start over under a new file key, which no old
            // copy was stored under.
            let rotation = (st.key as u64).wrapping_add(1);
            st.key = self.file_key(id, rotation);
            self.chunks.fetch_sub(st.chunks.len() as i64, Ordering::Relaxed);
            st.chunks.clear();
            st.next_version = 1;
        }
        st.next_version += 1;
        st.next_version - 1
    }

    /// Heap bytes of the index: every file's chunk table (16 bytes and a control byte per
    /// bucket) and its record. Walks the index: for stats, not the data path.
    pub fn memory_bytes(&self) -> u64 {
        let mut total = 0;
        for shard in &self.files {
            let map = shard.lock();
            total += (map.capacity() * (std::mem::size_of::<(FileId, Arc<FileIndex>)>() + 1)) as u64;
            for f in map.values() {
                total += std::mem::size_of::<FileIndex>() as u64 + f.state.lock().chunks.memory_bytes();
            }
        }
        total
    }

    /// Chunks in the index.
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Relaxed).max(0) as u64
    }

    /// Blocks marked remote, over all files (walks the index: for stats, not the data path).
    pub fn remote_blocks(&self) -> u64 {
        let mut n = 0;
        for shard in &self.files {
            for f in shard.lock().values() {
                n += f.state.lock().chunks.iter().map(|c| c.bits.count_ones() as u64).sum::<u64>();
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

fn push_keys(keys: &mut Vec<BlockKey>, file: u128, ch: &Chunk) {
    let mut bits = ch.bits;
    while bits != 0 {
        let i = bits.trailing_zeros() as u64;
        bits &= bits - 1;
        keys.push(BlockKey { file, block: ch.no as u64 * CHUNK_BLOCKS + i, version: ch.version as u64 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Generation;

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino, generation: Generation::Fs(7) }
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

    /// A truncate invalidates "from the new end on" with a huge last block: every chunk
    /// past the new end must lose its bits, whether the end is mid-chunk or on a boundary.
    #[test]
    fn invalidating_to_the_end_of_a_huge_range_reaches_every_chunk() {
        for first in [0u64, 1, 63, 64, 65, 100, 128, 255] {
            let ix = BlockIndex::new();
            let f = ix.file(&id(1));
            for b in 0..256 {
                let t = ix.fill_start(&f, b);
                assert!(ix.fill_done(&f, t));
            }
            // As `CachedPath::set_len` computes it: bytes from the new end, u64::MAX / 2 long.
            let last = (first * BLOCK_BYTES).saturating_add(u64::MAX / 2 - 1) / BLOCK_BYTES;
            let gone = ix.invalidate(&f, first, last);
            let first_chunk = first / CHUNK_BLOCKS * CHUNK_BLOCKS;
            for b in 0..256 {
                assert_eq!(ix.lookup(&f, b).is_none(), b >= first_chunk, "first {first}, block {b}");
            }
            assert_eq!(gone.len() as u64, 256 - first_chunk, "first {first}");
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
    fn invalidate_returns_cached_keys_and_changes_versions() {
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
        assert_eq!(gone, old[..4].to_vec(), "blocks 0..=64 share chunks 0 and 1");
        for b in [0, 1, 63, 64] {
            assert_eq!(ix.lookup(&f, b), None);
        }
        assert_eq!(ix.lookup(&f, 200), Some(old[4]), "chunk 3 untouched");
        // Truncate-style huge range.
        assert_eq!(ix.invalidate(&f, 100, u64::MAX / 2), vec![old[4]]);
        assert_eq!(ix.lookup(&f, 200), None);
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
}
