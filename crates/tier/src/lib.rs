//! The persistent write-back tier's medium and log (issue 12, paper 003): 4 KiB blocks kept
//! durable on fast local storage until they are destaged to the backing store.
//!
//! This crate knows nothing of lenders, FUSE or backing files: a record names a block by an
//! opaque [`FileKey`] and a block number, and a file key is declared once with an opaque
//! *name* (the caller's way of finding the file again after a restart). The engine's
//! write-back layer (`farcache_engine::writeback`) gives it meaning.
//!
//! - `medium.rs`: the [`Medium`] seam (page I/O and a durability point) and the three kinds of
//!   medium, chosen by what the tier's path is: `dram` (tmpfs), `ssd` (`O_DIRECT` +
//!   `fdatasync`), `pmem` (DAX with `MAP_SYNC`; detected, never faked).
//! - `format.rs`: the on-medium format and the commit rule, byte by byte.
//! - `log.rs`: [`Log`] — group commit of concurrent appends, the index of dirty blocks (the
//!   newest record of each), reads of dirty blocks, the destage plan and freeing, recovery.
//! - `crash.rs` (tests): a recording medium and the crash-state checker.

pub mod format;
pub mod log;
pub mod medium;
mod page;

#[cfg(test)]
mod crash;

pub use log::{Append, AppendError, Entry, FilePlan, Log, LogStats, Rec, Recovered};
pub use medium::{detect, Medium, Mode};
pub use page::Page;

/// Bytes per page: a block, a header, a superblock.
pub const PAGE_BYTES: usize = 4096;

/// An opaque file key: the caller's name for a file's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey(pub u64);

/// What can go wrong opening a tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A configuration or environment problem, with the fix (`key: problem; fix`).
    #[error("tier {path}: {problem}; fix: {fix}")]
    Config { path: String, problem: String, fix: String },
    /// The medium failed.
    #[error("tier: I/O error {what}: {source}")]
    Io { what: String, source: std::io::Error },
}

impl TierError {
    pub fn config(path: &std::path::Path, problem: &str, fix: &str) -> TierError {
        TierError::Config { path: path.display().to_string(), problem: problem.into(), fix: fix.into() }
    }
    pub(crate) fn io(what: &str, source: std::io::Error) -> TierError {
        TierError::Io { what: what.into(), source }
    }
}

/// A random u64 from the kernel (log ids, sessions).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_ne_bytes(b);
    }
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}
