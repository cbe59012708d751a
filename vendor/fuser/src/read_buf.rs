use std::mem::align_of;

use crate::ll::fuse_abi as abi;
use crate::session::MAX_WRITE_SIZE;

/// Size of the buffer for reading a request from the kernel. Since the kernel may send
/// up to `MAX_WRITE_SIZE` bytes in a write request, we use that value plus some extra space.
const BUFFER_SIZE: usize = MAX_WRITE_SIZE + 4096;

/// A buffer that provides an aligned sub-slice for FUSE operations.
///
/// This struct wraps a `Vec<u8>` and provides access to an aligned portion
/// of the buffer, ensuring proper alignment for `fuse_in_header`.
#[derive(Debug)]
pub(crate) struct FuseReadBuf {
    buffer: Vec<u8>,
    /// farcache patch: bytes from the aligned start locked by `prefault` (0: none).
    locked: usize,
}

impl Drop for FuseReadBuf {
    fn drop(&mut self) {
        if self.locked != 0 {
            let p = self.as_mut().as_ptr();
            // SAFETY: the range `prefault` locked, still ours until the Vec drops after this.
            unsafe { libc::munlock(p.cast(), self.locked) };
        }
    }
}

impl FuseReadBuf {
    /// Creates a new `FuseReadBuf` with the default buffer size.
    ///
    /// The actual buffer may be slightly larger to accommodate alignment requirements.
    pub(crate) fn new() -> Self {
        Self {
            buffer: vec![0; BUFFER_SIZE],
            locked: 0,
        }
    }

    /// farcache patch: fault in the pages of the first `bytes` of the aligned portion (the
    /// most a request of this connection can fill) and lock them in memory where the
    /// process may, so the kernel never faults while it copies a request in.
    ///
    /// Why: `read(2)` on `/dev/fuse` copies a request into this buffer by pinning its pages
    /// (`fuse_copy_fill`, `iov_iter_get_pages2`). A page not yet present — the buffer is
    /// calloc'd, so each page is absent until first used: the first write request a thread
    /// reads touches a second page — takes the slow path of get_user_pages, which fails
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
        if unsafe { libc::mlock(base.cast(), len) } == 0 {
            self.locked = len;
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
            // is not elided (the buffer is calloc'd: the compiler may know it is zero).
            unsafe { std::ptr::write_volatile(base.add(at - first), 0) };
            at = (at / page + 1) * page;
        }
        false
    }

    /// Returns a mutable reference to the aligned portion of the buffer.
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        let alignment = align_of::<abi::fuse_in_header>();
        let off = alignment - (self.buffer.as_ptr() as usize) % alignment;
        if off == alignment {
            &mut self.buffer
        } else {
            &mut self.buffer[off..]
        }
    }
}
