//! A buffer with a chosen alignment, for `O_DIRECT` reads. Only the bytes a read has filled
//! are ever exposed, so the buffer need not be zeroed first.
//!
//! Buffers of 64 KiB to 2 MiB (a disk read's, up to `max_read` and its alignment) come from
//! one pool shared by every thread ([`Pool`]) instead of the allocator: mimalloc keeps what a
//! thread frees committed until its purge delay (a second in v3) has passed *and* that thread
//! calls into the allocator again, so 32 FUSE threads each reading 4 KiB–1 MiB directly held
//! 319 MiB of anonymous memory in the mount daemon — charged to the application's memory
//! cgroup, where it got the daemon OOM-killed under TPC-C in 128 MiB (BENCHMARKS.md, session
//! 38). The pool hands a buffer freed on any thread to the next read on any thread, keeps at
//! most [`POOL_IDLE_MAX`] idle and unmaps the rest.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

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

/// The smallest pooled buffer (a smaller one lives in the allocator's small pages, which a
/// thread reuses at once), and the number of power-of-two size classes from it: 64 KiB to
/// 2 MiB, which holds a 1 MiB read rounded out to its alignment.
const POOL_MIN_SHIFT: u32 = 16;
const POOL_CLASSES: usize = 6;
/// Pooled buffers are whole mappings, so aligned to the page: any `O_DIRECT` alignment.
const POOL_ALIGN: usize = 4096;
/// Most bytes of idle buffers the pool keeps (by size class) for the next reads; a buffer
/// freed beyond it is unmapped. What the daemon holds besides the buffers in use.
const POOL_IDLE_MAX: usize = 16 << 20;

const fn class_bytes(class: usize) -> usize {
    1 << (POOL_MIN_SHIFT as usize + class)
}

/// The size class for `capacity` bytes at `align`, if pooled.
fn class_of(capacity: usize, align: usize) -> Option<usize> {
    if align > POOL_ALIGN || capacity < class_bytes(0) || capacity > class_bytes(POOL_CLASSES - 1) {
        return None;
    }
    Some((capacity.next_power_of_two().trailing_zeros() - POOL_MIN_SHIFT) as usize)
}

/// Idle buffers by size class, most recently freed last (its pages are the likeliest to be
/// resident still), and their bytes.
pub(crate) struct Pool {
    free: Mutex<([Vec<NonNull<u8>>; POOL_CLASSES], usize)>,
    idle_max: usize,
    stats: PoolStats,
}

// SAFETY: the idle mappings are owned by the pool alone; the pointers are only handed out
// under the lock, each to one taker.
unsafe impl Send for Pool {}
// SAFETY: as above; all access to the lists is under the mutex.
unsafe impl Sync for Pool {}

/// The pool's counters since the start (`farcache stats`, `memory`); the idle bytes are the
/// free lists' own count, read under their lock.
struct PoolStats {
    /// Bytes (by size class) of pooled buffers in use now.
    in_use: AtomicU64,
    /// Buffers taken from the pool, newly mapped, and unmapped because the pool was full.
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
    pub reused: u64,
    pub mapped: u64,
    pub unmapped: u64,
}

impl Pool {
    pub(crate) const fn new(idle_max: usize) -> Pool {
        Pool {
            free: Mutex::new(([const { Vec::new() }; POOL_CLASSES], 0)),
            idle_max,
            stats: PoolStats {
                in_use: AtomicU64::new(0),
                reused: AtomicU64::new(0),
                mapped: AtomicU64::new(0),
                unmapped: AtomicU64::new(0),
            },
        }
    }

    /// A buffer of `class`: an idle one, or a new mapping.
    fn take(&self, class: usize) -> NonNull<u8> {
        let bytes = class_bytes(class);
        let reused = {
            let mut g = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let p = g.0[class].pop();
            if p.is_some() {
                g.1 -= bytes;
            }
            p
        };
        self.stats.in_use.fetch_add(bytes as u64, Relaxed);
        if let Some(p) = reused {
            self.stats.reused.fetch_add(1, Relaxed);
            return p;
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched. Pages
        // become resident as reads fill them.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            alloc::handle_alloc_error(Layout::from_size_align(bytes, POOL_ALIGN).expect("a valid layout"));
        }
        self.stats.mapped.fetch_add(1, Relaxed);
        NonNull::new(p.cast()).expect("mmap returned null")
    }

    /// Give a buffer of `class` back: kept idle while the pool has room, else unmapped.
    fn give(&self, class: usize, p: NonNull<u8>) {
        let bytes = class_bytes(class);
        self.stats.in_use.fetch_sub(bytes as u64, Relaxed);
        {
            let mut g = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if g.1 + bytes <= self.idle_max {
                g.0[class].push(p);
                g.1 += bytes;
                return;
            }
        }
        self.stats.unmapped.fetch_add(1, Relaxed);
        // SAFETY: `p` is a mapping of `bytes` this pool made and nobody else holds.
        unsafe { libc::munmap(p.as_ptr().cast(), bytes) };
    }

    fn stats(&self) -> IoBufferStats {
        let s = &self.stats;
        IoBufferStats {
            in_use_bytes: s.in_use.load(Relaxed),
            idle_bytes: self.free.lock().unwrap_or_else(|e| e.into_inner()).1 as u64,
            idle_max_bytes: self.idle_max as u64,
            reused: s.reused.load(Relaxed),
            mapped: s.mapped.load(Relaxed),
            unmapped: s.unmapped.load(Relaxed),
        }
    }
}

/// The process's pool of disk-read buffers.
static POOL: Pool = Pool::new(POOL_IDLE_MAX);

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
            return AlignedBuf { ptr: pool.take(class), capacity, origin: Origin::Pooled { pool, class }, filled: 0 };
        }
        let layout = Layout::from_size_align(capacity, align).expect("alignment is a power of two");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, capacity, origin: Origin::Heap(layout), filled: 0 }
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
        Box::leak(Box::new(Pool::new(idle_max)))
    }

    #[test]
    fn sizes_map_to_power_of_two_classes_from_64_kib_to_2_mib() {
        assert_eq!(class_of(64 << 10, 4096), Some(0));
        assert_eq!(class_of((64 << 10) + 1, 512), Some(1));
        assert_eq!(class_of(1 << 20, 4096), Some(4));
        assert_eq!(class_of((1 << 20) + 4096, 4096), Some(5), "a 1 MiB read rounded out to its alignment");
        assert_eq!(class_of(2 << 20, 4096), Some(5));
        assert_eq!(class_of((2 << 20) + 1, 4096), None, "above the largest class: the allocator");
        assert_eq!(class_of(60 << 10, 4096), None, "below 64 KiB: the allocator");
        assert_eq!(class_of(1 << 20, 8192), None, "aligned beyond a page: the allocator");
    }

    #[test]
    fn a_freed_buffer_serves_the_next_read_of_its_class_on_any_thread() {
        let p = pool(4 << 20);
        let first = AlignedBuf::from_pool(p, 300 << 10, 4096);
        let addr = first.ptr.as_ptr() as usize;
        assert_eq!(addr % 4096, 0);
        assert_eq!(first.capacity(), 300 << 10, "the capacity asked for, not the class's");
        assert_eq!((p.stats().in_use_bytes, p.stats().mapped), (512 << 10, 1));
        // Freed on another thread, as a fill's slice is after the lender has it.
        std::thread::spawn(move || drop(first)).join().unwrap();
        assert_eq!((p.stats().in_use_bytes, p.stats().idle_bytes), (0, 512 << 10));
        let mut again = AlignedBuf::from_pool(p, 257 << 10, 512);
        assert_eq!(again.ptr.as_ptr() as usize, addr, "the idle buffer of the class was reused");
        assert_eq!(again.spare().1, 257 << 10);
        again.extend_from_slice(&[7; 1000]);
        assert_eq!(again.as_ref(), &[7; 1000][..]);
        let s = p.stats();
        assert_eq!((s.reused, s.mapped, s.unmapped, s.idle_bytes), (1, 1, 0, 0));
        // Another class maps anew.
        let other = AlignedBuf::from_pool(p, 64 << 10, 4096);
        assert_ne!(other.ptr.as_ptr() as usize, addr);
        assert_eq!(p.stats().mapped, 2);
    }

    #[test]
    fn the_pool_keeps_at_most_its_idle_bound_and_unmaps_the_rest() {
        let p = pool(2 << 20);
        let bufs: Vec<_> = (0..8).map(|_| AlignedBuf::from_pool(p, 1 << 20, 4096)).collect();
        assert_eq!(p.stats().in_use_bytes, 8 << 20);
        drop(bufs);
        let s = p.stats();
        assert_eq!((s.in_use_bytes, s.idle_bytes, s.unmapped), (0, 2 << 20, 6), "two kept, six unmapped");
        // Small and over-aligned buffers never touch the pool.
        let small = AlignedBuf::from_pool(p, 8192, 4096);
        assert!(matches!(small.origin, Origin::Heap(_)));
        assert_eq!(small.ptr.as_ptr() as usize % 4096, 0);
        assert_eq!(p.stats().in_use_bytes, 0);
    }
}
