//! Shared test helpers for farcache's integration tests.
//!
//! * [`ServerProcess`]: the real `farcache server` binary on port 0, its stderr captured, its
//!   signals at hand, killed on drop so that a failing test leaves no process behind.
//! * [`RawConn`]: a plain blocking socket that sends arbitrary bytes and reads frames with a
//!   deadline, for tests that break the protocol on purpose; [`hello_bytes`] and [`frame`]
//!   build what it sends.
//! * [`MountProcess`]: the real `farcache mount` daemon, waited for until the mount is live,
//!   always unmounted and reaped on drop.
//! * [`MemcachedProcess`]: a real memcached on a free loopback port, for memcached lenders.
//! * [`check_round_trip`]: a well-behaved client in a few lines, to show that a server
//!   still serves after something hostile happened.
//!
//! Everything here is synchronous (std threads and sockets) so that tests stay simple; async
//! tests use `farcache-client` against the same [`ServerProcess`]. Every wait has a deadline:
//! a hang is reported as a failure, never as a stuck test run.

mod memcached;
pub mod mount;
mod process;
mod raw;
mod rng;
mod scratch;
mod uring;

pub use memcached::{free_port, memcached_bin, MemcachedProcess};
pub use mount::{
    fuse_minor, fuse_mounted, o_direct_write_then_read, require_fuse, require_root, AlignedBuf, DirectReader,
    MountProcess, Watchdog, LENDERS_FIRST,
};
pub use process::{run_bin, run_with_timeout, text, ServerProcess, StartError, START_TIMEOUT};
pub use raw::{
    check_round_trip, frame, frame_with_reserved, hello_body, hello_bytes, hello_bytes_versions, ErrorReply, RawConn,
};
pub use rng::Rng;
pub use scratch::{BlkioThrottle, LoopFs, MountDirs, ScratchDir, TierFile, TierScratch, UnionDirs};
pub use uring::{uring_at, uring_on, UringAt, UringOn, ENABLE_URING};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A fresh, empty directory `parent/TAG-PID-N` for one test (N counts up within the
/// process; whatever was there from an earlier run is removed).
pub fn fresh_dir(parent: &Path, tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let d = parent.join(format!("{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Poll `f` every `every` until it returns true or `timeout` passes. Returns whether it did.
pub fn wait_until(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// `len` pseudo-random bytes from `seed` (xorshift64): file contents that differ at every
/// offset and between seeds, so a block read from the wrong place or file cannot match.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The Prometheus metric names docs/METRICS.md (given as `doc`) lists in its `## Prometheus`
/// section: backquoted words that start with `farcache_`, sorted, each once.
pub fn documented_metric_names(doc: &str) -> Vec<String> {
    let section = doc.split("## Prometheus").nth(1).expect("docs/METRICS.md has a ## Prometheus section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut names: Vec<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.starts_with("farcache_") && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}
