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
