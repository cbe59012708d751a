//! [`Page`]: one 4 KiB page, aligned to 4 KiB, so that a `Vec<Page>` is a buffer `O_DIRECT`
//! accepts without a bounce.

use crate::PAGE_BYTES;

#[derive(Clone)]
#[repr(C, align(4096))]
pub struct Page(pub [u8; PAGE_BYTES]);

const _: () = assert!(std::mem::size_of::<Page>() == PAGE_BYTES);

impl Page {
    pub fn zeroed() -> Box<Page> {
        Box::new(Page([0; PAGE_BYTES]))
    }

    /// A page holding `data` (at most a page), zeros after it — without zeroing first what
    /// `data` covers (measured: the zeroing was a tenth of a 1 MiB write's CPU in the daemon).
    pub fn copied(data: &[u8]) -> Box<Page> {
        assert!(data.len() <= PAGE_BYTES, "more than a page");
        let mut p = Box::<Page>::new_uninit();
        let dst = p.as_mut_ptr().cast::<u8>();
        // SAFETY: `dst` is the page's PAGE_BYTES bytes; the two writes cover all of them, and
        // every bit pattern is a valid Page.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            std::ptr::write_bytes(dst.add(data.len()), 0, PAGE_BYTES - data.len());
            p.assume_init()
        }
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Page({:02x?}..)", &self.0[..8])
    }
}

/// The bytes of `pages`, contiguous.
pub fn bytes(pages: &[Page]) -> &[u8] {
    // SAFETY: Page is repr(C) plain bytes of size PAGE_BYTES; a slice of them is contiguous.
    unsafe { std::slice::from_raw_parts(pages.as_ptr().cast(), pages.len() * PAGE_BYTES) }
}

pub fn bytes_mut(pages: &mut [Page]) -> &mut [u8] {
    // SAFETY: as in `bytes`, and every bit pattern is a valid Page.
    unsafe { std::slice::from_raw_parts_mut(pages.as_mut_ptr().cast(), pages.len() * PAGE_BYTES) }
}

/// `n` zeroed pages.
pub fn zeroed(n: usize) -> Vec<Page> {
    vec![Page([0; PAGE_BYTES]); n]
}
