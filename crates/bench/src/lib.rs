//! Load generators and experiment drivers for farcache.
//!
//! * [`server`]: `farcache bench server`, the farcache server against memcached 1.6 on the
//!   same machine, driven by the same blocking closed-loop client logic: memory overhead
//!   after a fill, then throughput and latency per (mix, batch, connections).
//! * [`policy`]: `farcache bench policy`, LRU against S3-FIFO, in trace simulation
//!   ([`simulate`]) and against the real server started once per policy.
//! * [`alloc`]: `farcache bench alloc`, the four ways a lender divides its memory among
//!   tenants (`server.allocation`) on a synthetic suite, through the real server.
//! * [`paper`]: `farcache bench paper`, paper 000's evaluation on a testbed of real kernel
//!   mechanisms (loop device, blkio throttling, memory cgroup, network namespaces), every
//!   configuration side by side.
//!
//! * [`restart`]: `farcache bench restart`, the stall an application sees through a mount
//!   whose daemon is upgraded in place or crashes under `--supervise` (issue 15).
//!
//! Both systems run as real child processes ([`proc`]); the clients here are small and
//! synchronous on purpose ([`fc_client`], [`mc_client`]), so that the two systems see
//! identical client behaviour and the client's cost is easy to reason about.

pub mod alloc;
pub mod error;
pub mod fc_client;
pub mod load;
pub mod machine;
pub mod mc_client;
pub mod paper;
pub mod policy;
mod policysim;
pub mod proc;
pub mod progress;
mod recv;
pub mod restart;
pub mod rng;
pub mod server;
pub mod value;

pub use error::BenchError;
pub use machine::Machine;
pub use policysim::{scan_mix_trace, simulate, zipf_trace, SimResult};

/// Result of everything in this crate.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
