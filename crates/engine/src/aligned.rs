//! A heap buffer with a chosen alignment, for `O_DIRECT` reads. Only the bytes a read has
//! filled are ever exposed, so the buffer need not be zeroed first.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
    filled: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads the filled prefix.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `capacity` bytes (> 0) aligned to `align` (a power of two).
    pub(crate) fn with_capacity(capacity: usize, align: usize) -> AlignedBuf {
        assert!(capacity > 0, "empty aligned buffer");
        let layout = Layout::from_size_align(capacity, align).expect("alignment is a power of two");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout, filled: 0 }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.layout.size()
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
        // SAFETY: allocated in with_capacity with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
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
}
