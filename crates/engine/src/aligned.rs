//! A buffer with a chosen alignment, for `O_DIRECT` reads. Only the bytes a read has filled
//! are ever exposed, so the buffer need not be zeroed first.
//!
//! Buffers of 64 KiB to 2 MiB (a disk read's, up to `max_read` and its alignment) come from
//! one pool shared by every thread ([`Pool`]) instead of the allocator: mimalloc keeps what a
//! thread frees committed until its purge delay (a second in v3) has passed *and* that thread
//! calls into the allocator again, so 32 FUSE threads each reading 4 KiB–1 MiB directly held
//! 319 MiB of anonymous memory in the mount daemon — charged to the application's memory
//! cgroup, where it got the daemon OOM-killed under TPC-C in 128 MiB (BENCHMARKS.md, session
//! 38). The pool hands a buffer freed on any thread to the next read on any thread, cuts its
//! buffers from huge-page chunks ([`CHUNK`]), keeps at most [`POOL_IDLE_MAX`] idle (of which
//! at most [`COPIES_IDLE_MAX`] fills' small copies) and unmaps whole chunks beyond that.

use hashbrown::HashMap;
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{LazyLock, Mutex};

/// Where a buffer's memory came from.
enum Origin {
    /// The allocator, with this layout.
    Heap(Layout),
    /// A mapping of `class_bytes(class)` from `pool`, given back to it.
    Pooled { pool: &'static Pool, class: usize },
}

pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    origin: Origin,
    filled: usize,
}

// SAFETY: AlignedBuf owns its memory exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads the filled prefix.
unsafe impl Sync for AlignedBuf {}

/// The smallest pooled buffer, and the number of power-of-two size classes from it: 4 KiB
/// (a fill's copy of one block, [`pooled_copy`]) to 2 MiB, which holds a 1 MiB read rounded
/// out to its alignment.
const POOL_MIN_SHIFT: u32 = 12;
const POOL_CLASSES: usize = 10;
/// The smallest disk read whose buffer comes from the pool: a smaller one lives in the
/// allocator's small pages, which the reading thread reuses at once (a fill never holds it:
/// it takes a copy, [`pooled_copy`]).
pub(crate) const READ_POOL_MIN: usize = 64 << 10;
/// Pooled buffers are cut from chunks aligned to the chunk: any `O_DIRECT` alignment.
const POOL_ALIGN: usize = 4096;
/// Most bytes of idle buffers the pool keeps (by size class) for the next reads; beyond it,
/// chunks with no buffer in use are unmapped. What the daemon holds besides the buffers in
/// use.
const POOL_IDLE_MAX: usize = 16 << 20;
/// Most bytes of idle small buffers (fills' copies, [`pooled_copy`]) within [`POOL_IDLE_MAX`]:
/// one chunk. Fills come in bursts as deep as the outbox's bound (thousands of blocks behind a
/// slow link); kept idle after the burst, their copies held 8–16 MiB of the daemon's memory
/// for nothing (BENCHMARKS.md, session 60), while mapping a chunk anew costs a fill about a
/// page fault.
const COPIES_IDLE_MAX: usize = CHUNK;
/// The pool maps memory in chunks of one transparent huge page, aligned to it and advised
/// `MADV_HUGEPAGE`, and cuts each into buffers of one size class. A buffer in one huge page
/// is physically contiguous, so an `O_DIRECT` read into it is a few large segments: a 1 MiB
/// read into 4 KiB pages is 256 segments, which a loop device (128 at most) splits in two
/// requests and every read pins page by page. Sequential reads through the mount were 13%
/// slower in 4 KiB-page buffers (BENCHMARKS.md, "Read buffers in huge pages"). Where the
/// kernel has no huge page to give, the chunk is ordinary pages and works the same.
const CHUNK: usize = 2 << 20;

const fn class_bytes(class: usize) -> usize {
    1 << (POOL_MIN_SHIFT as usize + class)
}

/// Buffers of `class` in one chunk.
const fn per_chunk(class: usize) -> usize {
    CHUNK / class_bytes(class)
}

/// The size class for a disk read's buffer of `capacity` bytes at `align`, if pooled.
fn class_of(capacity: usize, align: usize) -> Option<usize> {
    if align > POOL_ALIGN || capacity < READ_POOL_MIN {
        return None;
    }
    size_class(capacity)
}

/// Whether chunks of `class` are huge pages: those of disk reads' buffers ([`READ_POOL_MIN`]
/// and up), not those of small copies (see [`map_chunk`]).
const fn huge_class(class: usize) -> bool {
    class_bytes(class) >= READ_POOL_MIN
}

/// The size class holding `bytes` (> 0), if the pool has one that large.
fn size_class(bytes: usize) -> Option<usize> {
    if bytes > class_bytes(POOL_CLASSES - 1) {
        return None;
    }
    Some((bytes.max(class_bytes(0)).next_power_of_two().trailing_zeros() - POOL_MIN_SHIFT) as usize)
}

/// A copy of `data` (a block a fill sends to a lender) in a buffer of the shared pool.
///
/// A fill is answered on the remote runtime's thread, up to `fetch_timeout` later; a slice of
/// the disk read's buffer would keep that whole buffer (up to 1 MiB for one 4 KiB block)
/// alive until then, and a buffer from the allocator freed on another thread than the one
/// that took it stays committed in that thread's pages. With 32 FUSE threads this held
/// ~30 MiB more anonymous memory under TPC-B than the passthrough (BENCHMARKS.md, session
/// 52). The copy lets the read's buffer go with its answer, makes what fills hold exactly
/// the blocks on their way (`max_pending_puts` × 4 KiB at most), and hands a slot freed on
/// any thread to the next fill on any thread.
pub(crate) fn pooled_copy(data: &[u8]) -> bytes::Bytes {
    copy_in(&POOL, data)
}

/// [`pooled_copy`] from `pool`; past the largest class (or empty), a copy from the allocator.
fn copy_in(pool: &'static Pool, data: &[u8]) -> bytes::Bytes {
    match size_class(data.len()) {
        Some(class) if !data.is_empty() => {
            let mut b = AlignedBuf::pooled(pool, class, data.len());
            b.extend_from_slice(data);
            bytes::Bytes::from_owner(b)
        }
        _ => bytes::Bytes::copy_from_slice(data),
    }
}

/// The chunk a pooled buffer was cut from.
fn chunk_of(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize & !(CHUNK - 1)
}

/// A new chunk: `CHUNK` bytes aligned to `CHUNK`. Its pages become resident as buffers are
/// filled. `huge`: advised to be one huge page (a chunk for disk reads' buffers, see
/// [`CHUNK`]); otherwise advised never to be one: a chunk of small buffers (a fill's 4 KiB
/// copy) gains nothing from contiguity, and as a huge page its first copy would make all
/// 2 MiB resident — memory charged to the application's cgroup, taken from its page cache
/// (a mount filling a few blocks held 2 MiB more than the passthrough for each such chunk).
fn map_chunk(huge: bool) -> usize {
    // Twice the size, so that an aligned chunk lies inside; the ends are unmapped.
    let len = 2 * CHUNK;
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        alloc::handle_alloc_error(Layout::from_size_align(CHUNK, CHUNK).expect("a valid layout"));
    }
    let start = p as usize;
    let chunk = (start + CHUNK - 1) & !(CHUNK - 1);
    // SAFETY: both ends lie inside the mapping just made, outside the chunk kept; the advice
    // only concerns that chunk (and is a hint: refused, the chunk stays ordinary pages).
    unsafe {
        if chunk > start {
            libc::munmap(p, chunk - start);
        }
        if start + len > chunk + CHUNK {
            libc::munmap((chunk + CHUNK) as *mut libc::c_void, start + len - chunk - CHUNK);
        }
        let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        libc::madvise(chunk as *mut libc::c_void, CHUNK, advice);
    }
    chunk
}

/// Idle buffers by size class, most recently freed last (its pages are the likeliest to be
/// resident still); their bytes; and the idle buffers of each mapped chunk. The last could be
/// counted from the lists when the bound is passed, but that scan (under the lock, on every
/// give past the bound) looked costlier: 0.66–0.97× the reads a second in four alternating
/// rounds (BENCHMARKS.md, "Read buffers in huge pages").
struct Free {
    lists: [Vec<NonNull<u8>>; POOL_CLASSES],
    bytes: usize,
    /// Of `bytes`, those of small classes (not [`huge_class`]).
    small_bytes: usize,
    /// Chunk address → (its class, its idle buffers).
    chunks: HashMap<usize, (usize, usize)>,
}

impl Free {
    /// Idle bytes of `class` added (or, negative, taken).
    fn count(&mut self, class: usize, bytes: isize) {
        self.bytes = self.bytes.wrapping_add_signed(bytes);
        if !huge_class(class) {
            self.small_bytes = self.small_bytes.wrapping_add_signed(bytes);
        }
    }

    /// Whether more is idle than `max`, or more of small classes than `small_max`.
    fn over(&self, max: usize, small_max: usize) -> bool {
        self.bytes > max || self.small_bytes > small_max
    }

    /// Take the chunks with no buffer in use out of the lists, until at most `max` bytes are
    /// idle and at most `small_max` of small classes; they are the caller's to unmap.
    fn shed(&mut self, max: usize, small_max: usize) -> Vec<usize> {
        let whole: Vec<(usize, usize)> = self
            .chunks
            .iter()
            .filter(|(_, &(class, idle))| idle == per_chunk(class))
            .map(|(&c, &(class, _))| (c, class))
            .collect();
        let mut shed = Vec::new();
        for (chunk, class) in whole {
            if !self.over(max, small_max) {
                break;
            }
            // Past the small classes' own bound only: keep the large chunks.
            if self.bytes <= max && huge_class(class) {
                continue;
            }
            self.lists[class].retain(|&p| chunk_of(p) != chunk);
            self.chunks.remove(&chunk);
            self.count(class, -(CHUNK as isize));
            shed.push(chunk);
        }
        shed
    }
}

/// The pool of disk-read buffers: chunks of one huge page, cut into buffers of one class.
pub(crate) struct Pool {
    free: Mutex<Free>,
    idle_max: usize,
    /// Of `idle_max`, the most of small classes ([`COPIES_IDLE_MAX`]).
    small_idle_max: usize,
    stats: PoolStats,
}

// SAFETY: the idle buffers are owned by the pool alone; the pointers are only handed out
// under the lock, each to one taker.
unsafe impl Send for Pool {}
// SAFETY: as above; all access to the lists is under the mutex.
unsafe impl Sync for Pool {}

/// The pool's counters since the start (`farcache stats`, `memory`); the idle bytes are the
/// free lists' own count, read under their lock.
struct PoolStats {
    /// Bytes (by size class) of pooled buffers in use now.
    in_use: AtomicU64,
    /// Buffers taken idle from the pool; chunks newly mapped, and unmapped because the pool
    /// held more idle than its bound.
    reused: AtomicU64,
    mapped: AtomicU64,
    unmapped: AtomicU64,
}

/// What [`io_buffers`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoBufferStats {
    pub in_use_bytes: u64,
    pub idle_bytes: u64,
    pub idle_max_bytes: u64,
    /// Buffers taken idle from the pool.
    pub reused: u64,
    /// Chunks (of 2 MiB) mapped, and unmapped.
    pub mapped: u64,
    pub unmapped: u64,
}

impl Pool {
    pub(crate) fn new(idle_max: usize, small_idle_max: usize) -> Pool {
        Pool {
            free: Mutex::new(Free { lists: Default::default(), bytes: 0, small_bytes: 0, chunks: HashMap::new() }),
            idle_max,
            small_idle_max: small_idle_max.min(idle_max),
            stats: PoolStats {
                in_use: AtomicU64::new(0),
                reused: AtomicU64::new(0),
                mapped: AtomicU64::new(0),
                unmapped: AtomicU64::new(0),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `class`: an idle one, or the first of a new chunk (the rest go idle).
    fn take(&self, class: usize) -> NonNull<u8> {
        let bytes = class_bytes(class);
        self.stats.in_use.fetch_add(bytes as u64, Relaxed);
        {
            let mut g = self.lock();
            if let Some(p) = g.lists[class].pop() {
                g.count(class, -(bytes as isize));
                g.chunks.get_mut(&chunk_of(p)).expect("an idle buffer's chunk is mapped").1 -= 1;
                drop(g);
                self.stats.reused.fetch_add(1, Relaxed);
                return p;
            }
        }
        let chunk = map_chunk(huge_class(class));
        self.stats.mapped.fetch_add(1, Relaxed);
        let n = per_chunk(class);
        let buf = |i: usize| NonNull::new((chunk + i * bytes) as *mut u8).expect("mmap returned null");
        let mut g = self.lock();
        // Listed in reverse, so that the next takes go through the chunk in order.
        g.lists[class].extend((1..n).rev().map(buf));
        g.count(class, ((n - 1) * bytes) as isize);
        g.chunks.insert(chunk, (class, n - 1));
        buf(0)
    }

    /// Give a buffer of `class` back. Beyond the idle bound, chunks with no buffer in use
    /// are unmapped.
    fn give(&self, class: usize, p: NonNull<u8>) {
        let bytes = class_bytes(class);
        self.stats.in_use.fetch_sub(bytes as u64, Relaxed);
        let shed = {
            let mut g = self.lock();
            g.lists[class].push(p);
            g.count(class, bytes as isize);
            g.chunks.get_mut(&chunk_of(p)).expect("a pooled buffer's chunk is mapped").1 += 1;
            if !g.over(self.idle_max, self.small_idle_max) {
                return;
            }
            g.shed(self.idle_max, self.small_idle_max)
        };
        for chunk in shed {
            self.stats.unmapped.fetch_add(1, Relaxed);
            // SAFETY: a chunk this pool mapped, none of whose buffers is in use or listed.
            unsafe { libc::munmap(chunk as *mut libc::c_void, CHUNK) };
        }
    }

    fn stats(&self) -> IoBufferStats {
        let s = &self.stats;
        IoBufferStats {
            in_use_bytes: s.in_use.load(Relaxed),
            idle_bytes: self.lock().bytes as u64,
            idle_max_bytes: self.idle_max as u64,
            reused: s.reused.load(Relaxed),
            mapped: s.mapped.load(Relaxed),
            unmapped: s.unmapped.load(Relaxed),
        }
    }
}

/// The process's pool of disk-read buffers.
static POOL: LazyLock<Pool> = LazyLock::new(|| Pool::new(POOL_IDLE_MAX, COPIES_IDLE_MAX));

/// The disk-read buffer pool's bytes and counters (`farcache stats`, `memory.io_buffers_*`).
pub fn io_buffers() -> IoBufferStats {
    POOL.stats()
}

impl AlignedBuf {
    /// A buffer of `capacity` bytes (> 0) aligned to `align` (a power of two).
    /// From the shared pool where the size is pooled ([`class_of`]), else from the allocator.
    pub(crate) fn with_capacity(capacity: usize, align: usize) -> AlignedBuf {
        Self::from_pool(&POOL, capacity, align)
    }

    fn from_pool(pool: &'static Pool, capacity: usize, align: usize) -> AlignedBuf {
        assert!(capacity > 0, "empty aligned buffer");
        assert!(align.is_power_of_two(), "alignment {align} is not a power of two");
        if let Some(class) = class_of(capacity, align) {
            return AlignedBuf::pooled(pool, class, capacity);
        }
        let layout = Layout::from_size_align(capacity, align).expect("alignment is a power of two");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, capacity, origin: Origin::Heap(layout), filled: 0 }
    }

    /// An empty buffer of `capacity` bytes, a buffer of `class` taken from `pool`.
    fn pooled(pool: &'static Pool, class: usize, capacity: usize) -> AlignedBuf {
        AlignedBuf { ptr: pool.take(class), capacity, origin: Origin::Pooled { pool, class }, filled: 0 }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn filled(&self) -> usize {
        self.filled
    }

    /// Empty again, to be filled anew (the allocation is kept).
    pub(crate) fn clear(&mut self) {
        self.filled = 0;
    }

    /// Where the next bytes go, and how many still fit.
    pub(crate) fn spare(&mut self) -> (*mut u8, usize) {
        // SAFETY: filled <= capacity, so the pointer stays inside the allocation.
        (unsafe { self.ptr.as_ptr().add(self.filled) }, self.capacity() - self.filled)
    }

    /// The unfilled part, for a read to fill.
    pub(crate) fn spare_uninit(&mut self) -> &mut [std::mem::MaybeUninit<u8>] {
        let (p, room) = self.spare();
        // SAFETY: `room` bytes from `p` are owned by this buffer and not yet exposed; as
        // MaybeUninit they may be uninitialised.
        unsafe { std::slice::from_raw_parts_mut(p.cast(), room) }
    }

    /// Append `data` (which must fit).
    pub(crate) fn extend_from_slice(&mut self, data: &[u8]) {
        let (p, room) = self.spare();
        assert!(data.len() <= room, "aligned buffer overflow");
        // SAFETY: `data.len()` bytes fit in the spare room we own; they are initialised by
        // the copy.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len());
            self.advance(data.len());
        }
    }

    /// Record that `n` more bytes after the filled prefix were written.
    ///
    /// # Safety
    /// The caller wrote `n` initialised bytes at `spare().0`, and `n <= spare().1`.
    pub(crate) unsafe fn advance(&mut self, n: usize) {
        debug_assert!(self.filled + n <= self.capacity());
        self.filled += n;
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were initialised (see `advance`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.filled) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.origin {
            // SAFETY: allocated in from_pool with this very layout.
            Origin::Heap(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Origin::Pooled { pool, class } => pool.give(class, self.ptr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_exposes_only_filled_bytes() {
        let mut b = AlignedBuf::with_capacity(8192, 4096);
        assert_eq!(b.spare().0 as usize % 4096, 0);
        assert!(b.as_ref().is_empty());
        let (p, room) = b.spare();
        assert_eq!(room, 8192);
        // SAFETY: writing 3 bytes into the spare room we own.
        unsafe {
            std::ptr::copy_nonoverlapping(b"abc".as_ptr(), p, 3);
            b.advance(3);
        }
        assert_eq!(b.as_ref(), b"abc");
        assert_eq!(b.filled(), 3);
    }

    /// A pool of its own, so that other tests' reads do not move its counters.
    fn pool(idle_max: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new(idle_max, idle_max)))
    }

    #[test]
    fn sizes_map_to_power_of_two_classes_from_64_kib_to_2_mib() {
        assert_eq!(class_of(64 << 10, 4096), Some(4));
        assert_eq!(class_of((64 << 10) + 1, 512), Some(5));
        assert_eq!(class_of(1 << 20, 4096), Some(8));
        assert_eq!(class_of((1 << 20) + 4096, 4096), Some(9), "a 1 MiB read rounded out to its alignment");
        assert_eq!(class_of(2 << 20, 4096), Some(9));
        assert_eq!(class_of((2 << 20) + 1, 4096), None, "above the largest class: the allocator");
        assert_eq!(class_of(60 << 10, 4096), None, "below 64 KiB: the allocator");
        assert_eq!(class_of(1 << 20, 8192), None, "aligned beyond a page: the allocator");
    }

    #[test]
    fn a_freed_buffer_serves_the_next_read_of_its_class_on_any_thread() {
        let p = pool(4 << 20);
        let first = AlignedBuf::from_pool(p, 300 << 10, 4096);
        let addr = first.ptr.as_ptr() as usize;
        assert_eq!(addr % CHUNK, 0, "the first buffer of a chunk aligned to a huge page");
        assert_eq!(first.capacity(), 300 << 10, "the capacity asked for, not the class's");
        let s = p.stats();
        assert_eq!((s.in_use_bytes, s.mapped, s.idle_bytes), (512 << 10, 1, 3 * (512 << 10)), "one chunk of four");
        // Freed on another thread, as a fill's slice is after the lender has it.
        std::thread::spawn(move || drop(first)).join().unwrap();
        assert_eq!((p.stats().in_use_bytes, p.stats().idle_bytes), (0, 2 << 20));
        let mut again = AlignedBuf::from_pool(p, 257 << 10, 512);
        assert_eq!(again.ptr.as_ptr() as usize, addr, "the buffer freed last was reused");
        assert_eq!(again.spare().1, 257 << 10);
        again.extend_from_slice(&[7; 1000]);
        assert_eq!(again.as_ref(), &[7; 1000][..]);
        // The chunk's other buffers follow, each its own part of it.
        let rest: Vec<_> = (0..3).map(|_| AlignedBuf::from_pool(p, 512 << 10, 4096)).collect();
        let mut addrs: Vec<usize> = rest.iter().map(|b| b.ptr.as_ptr() as usize).collect();
        addrs.sort();
        assert_eq!(addrs, [1, 2, 3].map(|i| addr + i * (512 << 10)));
        let s = p.stats();
        assert_eq!((s.reused, s.mapped, s.unmapped, s.idle_bytes), (4, 1, 0, 0));
        // Another class maps a chunk of its own.
        let other = AlignedBuf::from_pool(p, 64 << 10, 4096);
        assert_eq!(chunk_of(other.ptr), other.ptr.as_ptr() as usize);
        assert_ne!(chunk_of(other.ptr), addr);
        assert_eq!(p.stats().mapped, 2);
    }

    #[test]
    fn the_pool_keeps_at_most_its_idle_bound_and_unmaps_whole_chunks() {
        let p = pool(2 << 20);
        let bufs: Vec<_> = (0..8).map(|_| AlignedBuf::from_pool(p, 1 << 20, 4096)).collect();
        let s = p.stats();
        assert_eq!((s.in_use_bytes, s.mapped), (8 << 20, 4), "two 1 MiB buffers a chunk");
        drop(bufs);
        let s = p.stats();
        assert_eq!((s.in_use_bytes, s.idle_bytes, s.unmapped), (0, 2 << 20, 3), "one chunk kept, three unmapped");
        // A chunk with a buffer in use stays mapped, whatever is idle.
        let p = pool(0);
        let held = AlignedBuf::from_pool(p, 128 << 10, 4096);
        let other = AlignedBuf::from_pool(p, 128 << 10, 4096);
        drop(other);
        let s = p.stats();
        assert_eq!((s.idle_bytes, s.unmapped), (CHUNK as u64 - (128 << 10), 0), "the chunk is in use");
        let mut held = held;
        held.extend_from_slice(&[1; 4096]);
        assert_eq!(held.as_ref(), &[1; 4096][..], "the held buffer is still mapped");
        drop(held);
        assert_eq!((p.stats().idle_bytes, p.stats().unmapped), (0, 1), "its last buffer back, the chunk goes");
        // Small and over-aligned buffers never touch the pool.
        let small = AlignedBuf::from_pool(p, 8192, 4096);
        assert!(matches!(small.origin, Origin::Heap(_)));
        assert_eq!(small.ptr.as_ptr() as usize % 4096, 0);
        assert_eq!(p.stats().in_use_bytes, 0);
    }

    #[test]
    fn a_pooled_copy_holds_one_block_slot_and_frees_it_on_any_thread() {
        let p = pool(4 << 20);
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let copy = copy_in(p, &block);
        assert_eq!(&copy[..], &block[..], "the copy holds the block's bytes");
        let addr = copy.as_ptr() as usize;
        let s = p.stats();
        assert_eq!((s.in_use_bytes, s.mapped, s.idle_bytes), (4096, 1, (2 << 20) - 4096), "one 4 KiB slot of a chunk");
        // A slice of it (as a sealed fill may keep) holds the same slot.
        let part = copy.slice(100..200);
        drop(copy);
        assert_eq!(p.stats().in_use_bytes, 4096);
        std::thread::spawn(move || drop(part)).join().unwrap();
        assert_eq!(p.stats().in_use_bytes, 0, "freed on another thread, back in the pool");
        let again = copy_in(p, &block[..4000]);
        assert_eq!(again.as_ptr() as usize, addr, "the next fill reuses the slot freed last");
        assert_eq!(&again[..], &block[..4000]);
        assert_eq!((p.stats().reused, p.stats().mapped), (1, 1));
        // Nothing to copy, or more than the largest class: no slot.
        assert!(copy_in(p, &[]).is_empty());
        let big = vec![3u8; (2 << 20) + 1];
        assert_eq!(&copy_in(p, &big)[..], &big[..]);
        assert_eq!(p.stats().in_use_bytes, 4096, "only the 4,000-byte copy holds a slot");
    }

    #[test]
    fn idle_copies_are_held_to_their_own_bound_and_reads_buffers_stay() {
        // 16 MiB idle at most, of it one chunk of small copies.
        let p: &'static Pool = Box::leak(Box::new(Pool::new(16 << 20, CHUNK)));
        let read = AlignedBuf::from_pool(p, 1 << 20, 4096);
        drop(read);
        assert_eq!(p.stats().idle_bytes, 2 << 20, "a read's chunk stays idle");
        // A burst of 2,048 fills' copies: four chunks of 512.
        let copies: Vec<_> = (0..2048u32).map(|i| copy_in(p, &i.to_le_bytes().repeat(1024))).collect();
        assert_eq!((p.stats().mapped, p.stats().in_use_bytes), (5, 8 << 20));
        assert!(copies.iter().enumerate().all(|(i, c)| c[..4] == (i as u32).to_le_bytes()));
        drop(copies);
        let s = p.stats();
        // One chunk of copies kept, three unmapped; the read's chunk untouched although the
        // pool's whole bound was never passed.
        assert_eq!((s.in_use_bytes, s.idle_bytes, s.unmapped), (0, 4 << 20, 3), "{s:?}");
        let before = p.stats().reused;
        let again = AlignedBuf::from_pool(p, 1 << 20, 4096);
        assert_eq!((p.stats().reused - before, p.stats().mapped), (1, 5), "the read's buffer reused");
        drop(again);
    }

    /// The `THPeligible` field of the mapping holding `addr` in this process's smaps.
    fn thp_eligible(addr: usize) -> Option<bool> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
                let (a, b) = range.split_once('-')?;
                let (a, b) = (usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?);
                inside = (a..b).contains(&addr);
            } else if let Some(v) = line.strip_prefix("THPeligible:").filter(|_| inside) {
                return Some(v.trim() == "1");
            }
        }
        None
    }

    #[test]
    fn small_copies_stay_in_small_pages() {
        // A fill's 4 KiB copy: its chunk is never a huge page, whatever the THP mode, so one
        // copy makes one page resident, not 2 MiB.
        let p = pool(4 << 20);
        let b = copy_in(p, &[5; 4096]);
        let addr = b.as_ptr() as usize;
        assert_eq!(addr % CHUNK, 0, "the first buffer of a new chunk");
        assert_eq!(thp_eligible(addr), Some(false), "a 4 KiB copy's chunk must not be a huge page");
        assert!(!huge_class(size_class(32 << 10).unwrap()) && huge_class(class_of(64 << 10, 4096).unwrap()));
    }

    #[test]
    fn chunks_are_advised_to_be_huge_pages() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let p = pool(4 << 20);
        let b = AlignedBuf::from_pool(p, 1 << 20, 4096);
        let addr = b.ptr.as_ptr() as usize;
        match thp_eligible(addr) {
            // Eligible exactly when the kernel gives huge pages at all ("always" or "madvise").
            Some(eligible) => assert_eq!(eligible, !thp.contains("[never]"), "THP mode {thp:?}"),
            None => panic!("no mapping holds the chunk at {addr:#x} in /proc/self/smaps"),
        }
    }
}
