//! The borrower's cache engine: what the FUSE layer hands file data to.
//!
//! - [`DataPath`] (`data_path.rs`) is the seam: read, write, set_len, fallocate, fsync and
//!   forget, for one open backing file. The FUSE layer sees nothing else of the engine.
//! - [`DirectPath`] (`direct.rs`): backing I/O only, the `--no-remote` baseline.
//! - [`cached::CachedPath`] (`cached.rs`): lenders' RAM in front of a `DataPath`, with the
//!   client-side [`index::BlockIndex`] (`index.rs`), the lender set [`remote::Remote`]
//!   (`remote.rs`, lenders can join and leave while running) and the routing rule
//!   [`routing::Router`] (`routing.rs`: paper 000's threshold, or adaptive from measured
//!   costs).
//! - [`seal::BlockSeal`] (`seal.rs`): what a block looks like on a lender — the identity,
//!   or encrypted and authenticated (XChaCha20-Poly1305) so a lender can cost a miss, never
//!   wrong data.
//! - [`BackingFile`] (`backing.rs`) is an open backing file with direct (`O_DIRECT`) reads
//!   (and writes, for applications that opened it `O_DIRECT`).
//! - [`IoEngine`] (`io/`) does every transfer and sync of a backing file: io_uring (or
//!   synchronous system calls), a bound on what is in flight, every fallback counted. It is
//!   the seam the tiers to come (write-back destaging, migration) use to reach the disk.
//! - [`latency::Latency`] (`latency.rs`): lock-free latency histograms of lender fetches,
//!   fills and disk reads and writes, for the metrics endpoint.
//! - [`FileId`] (`identity.rs`) names a file's data for the life of its inode —
//!   `(dev, ino, generation)` — so that a reused inode number can never alias cached blocks.
//! - [`config::CacheConfig`] (`config.rs`) is the `[cache]` table of farcache.toml;
//!   [`stats::CacheStats`] (`stats.rs`) the operator's snapshot of every counter.
//!
//! - [`writeback::WritebackPath`] (`writeback/`): the persistent write-back tier in front of
//!   any `DataPath` (its log is `farcache-tier`): writes acknowledged once durable there,
//!   destaged in the background, recovered at start.
//!
//! No FUSE types and no wire types here: lenders are reached through `farcache-client`.

mod aligned;
pub mod backing;
pub mod cached;
pub mod config;
pub mod data_path;
pub mod descriptors;
pub mod direct;
pub mod identity;
pub mod index;
pub mod io;
pub mod latency;
mod outbox;
pub mod remote;
pub mod routing;
pub mod seal;
pub mod stats;
pub mod writeback;

pub use aligned::{io_buffers, IoBufferStats};
pub use backing::{BackingFile, BackingOptions, ReadMode, WriteMode, MAX_READ_BYTES};
/// Reads answer with `bytes::Bytes`, re-exported so callers need not depend on `bytes`.
pub use bytes::Bytes;
pub use config::{CacheConfig, Routing};
pub use data_path::{CopyRead, DataPath, Deferred, ReadTime};
pub use direct::{BackingCounters, BackingCountersSnapshot, DirectPath};
pub use identity::{FileId, Generation, Identities, UnionFiles};
pub use io::{IoEngine, IoEngineKind, IoOptions};
pub use remote::{LenderError, LenderStatus};
pub use routing::Router;
pub use seal::{BlockSeal, Plaintext, SealError, XChaCha};
pub use stats::CacheStats;
