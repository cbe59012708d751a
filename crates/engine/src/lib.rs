//! The borrower's cache engine: what the FUSE layer hands file data to.
//!
//! - [`DataPath`] (`data_path.rs`) is the seam: read, write, set_len, fallocate, fsync and
//!   forget, for one open backing file. The FUSE layer sees nothing else of the engine.
//! - [`DirectPath`] (`direct.rs`) is its one implementation today: backing I/O only.
//! - [`BackingFile`] (`backing.rs`) is an open backing file with direct (`O_DIRECT`) reads.
//! - [`FileId`] (`identity.rs`) names a file's data for the life of its inode —
//!   `(dev, ino, generation)` — so that a reused inode number can never alias cached blocks.
//!
//! No FUSE types here, and no wire types yet: the remote tier will live in this crate and
//! speak to lenders through `farcache-client`.

mod aligned;
pub mod backing;
pub mod cached;
pub mod data_path;
pub mod direct;
pub mod identity;
pub mod index;
pub mod remote;

pub use backing::{BackingFile, BackingOptions, ReadMode, MAX_READ_BYTES};
/// Reads answer with `bytes::Bytes`, re-exported so callers need not depend on `bytes`.
pub use bytes::Bytes;
pub use data_path::DataPath;
pub use direct::{BackingCounters, BackingCountersSnapshot, DirectPath};
pub use identity::{FileId, Generation, Identities};
