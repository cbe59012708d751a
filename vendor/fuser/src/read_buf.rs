use std::mem::{align_of, size_of};
use std::ptr::NonNull;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

// farcache patch: the buffer is an anonymous mapping of its own (not the allocator's), laid
// out so that a WRITE's payload starts on a page, and whose pages above `KEEP` are handed
// back lazily (MADV_FREE) after a large request. Before, each serving thread's calloc'd
// 16 MiB buffer kept resident up to the largest request it ever read (1 MiB after one
// max_write WRITE: 32 MiB over 32 threads, charged to the client's memory cgroup), and the
// allocator reused the freed handshake buffer for the first thread's, zeroing all 16 MiB.

/// Where the aligned part starts in the mapping: a WRITE's data (after `fuse_in_header` and
/// `fuse_write_in`) then lands on a page boundary, so that `O_DIRECT` can take it as it is.
const WRITE_DATA_OFFSET: usize = size_of::<abi::fuse_in_header>() + size_of::<abi::fuse_write_in>();
const PAGE: usize = 4096;
const LEAD: usize = PAGE - WRITE_DATA_OFFSET;
const MAP_SIZE: usize = BUFFER_SIZE + PAGE;
/// Bytes at the start of the buffer that always stay resident (every request is read there).
const KEEP: usize = 64 * 1024;

/// A buffer that provides an aligned sub-slice for FUSE operations.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    map: NonNull<u8>,
    /// farcache patch: bytes from the aligned start `prefault` made present (and locked
    /// where allowed); 0: none. Those pages are never handed back (`release_after`).
    pinned: usize,
}

// SAFETY: the mapping is owned by this value alone, like a Vec<u8>.
unsafe impl Send for FuseReadBuf {}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf`: address space only, pages come as requests touch them.
    pub(crate) fn new() -> Self {
        const _: () = assert!(LEAD % align_of::<abi::fuse_in_header>() == 0);
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAP_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            panic!(
                "FUSE request buffer: mmap of {MAP_SIZE} bytes failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Self {
            map: NonNull::new(p.cast()).expect("mmap returned null"),
            pinned: 0,
        }
    }

    /// farcache patch: fault in the pages of the first `bytes` of the aligned portion (the
    /// most a request of this connection can fill) and lock them in memory where the
    /// process may, so the kernel never faults while it copies a request in.
    ///
    /// Why: `read(2)` on `/dev/fuse` copies a request into this buffer by pinning its pages
    /// (`fuse_copy_fill`, `iov_iter_get_pages2`). A page not yet present — the buffer is
    /// a fresh mapping, so each page is absent until first used: the first write request a thread
    /// reads touches a second page; pages `release_after` handed back may be gone again) —
    /// takes the slow path of get_user_pages, which fails
    /// with `EINTR` when a fatal signal is pending; `fuse_dev_do_read` then ends that
    /// request with `EIO` to the application (it never reaches the daemon, so it is not
    /// resent). A SIGKILL of a supervised daemon in that instant was an application's `EIO`.
    /// Returns whether the pages were locked as well.
    pub(crate) fn prefault(&mut self, bytes: usize) -> bool {
        let buf = self.as_mut();
        let len = bytes.min(buf.len());
        if len == 0 {
            return false;
        }
        let base = buf.as_mut_ptr();
        // mlock(2) faults every page of the range in, writable (a private mapping), in one
        // system call: a quarter less CPU than a write fault per page (32 buffers of 1 MiB:
        // ~9.5 ms against ~12 ms, measured).
        // SAFETY: `len` bytes of the buffer we own; unlocked on drop.
        self.pinned = len;
        if unsafe { libc::mlock(base.cast(), len) } == 0 {
            return true;
        }
        // Not allowed to lock (RLIMIT_MEMLOCK without the privilege): a write to each page.
        // The pages are then present, and only reclaim to swap could take one away again.
        let page = page_size::get();
        let (first, end) = (base as usize, base as usize + len);
        let mut at = first;
        while at < end {
            // SAFETY: `first <= at < end`: a byte of the buffer we own. It is written
            // before the first request is read into the buffer, so its content does not
            // matter; the store makes its page present and writable. Volatile so that it
            // is not elided.
            unsafe { std::ptr::write_volatile(base.add(at - first), 0) };
            at = (at / page + 1) * page;
        }
        false
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: LEAD + BUFFER_SIZE <= MAP_SIZE: inside our mapping, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(LEAD), BUFFER_SIZE) }
    }

    /// After a request of `size` bytes has been dispatched (nothing borrows the buffer any
    /// more): if it reached past `KEEP`, tell the kernel the pages it touched there are free
    /// (MADV_FREE: reclaimed under memory pressure, kept and reused at no cost otherwise).
    /// One madvise per large request (~12 µs per MiB), none for the small ones.
    /// Not for a prefaulted buffer: its pages must stay present (`prefault`).
    pub(crate) fn release_after(&mut self, size: usize) {
        if self.pinned != 0 {
            return;
        }
        let end = (LEAD + size.min(BUFFER_SIZE)).next_multiple_of(PAGE);
        if end <= KEEP {
            return;
        }
        // SAFETY: [KEEP, end) lies inside our mapping, page-aligned, and nothing borrows it.
        unsafe {
            libc::madvise(
                self.map.as_ptr().add(KEEP).cast(),
                end - KEEP,
                libc::MADV_FREE,
            );
        }
    }
}

impl Drop for FuseReadBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no borrow of it outlives self (munmap also undoes
        // `prefault`'s mlock).
        unsafe { libc::munmap(self.map.as_ptr().cast(), MAP_SIZE) };
    }
}
