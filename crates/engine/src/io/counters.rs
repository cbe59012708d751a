//! [`IoCounters`]: what the I/O engine did, and every fallback it took. Each fallback is a
//! [`Fallback`]: a counter, and one log line the first time it moves (names in
//! docs/METRICS.md, under `backing.io`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::IoEngineKind;

/// A fallback: counted every time, logged the first time.
#[derive(Debug)]
pub struct Fallback {
    name: &'static str,
    count: AtomicU64,
    logged: AtomicBool,
}

impl Fallback {
    const fn new(name: &'static str) -> Fallback {
        Fallback { name, count: AtomicU64::new(0), logged: AtomicBool::new(false) }
    }

    /// Count one; the first time, log `what()` (why the fallback happened) at info level.
    pub fn hit(&self, what: impl FnOnce() -> String) {
        self.hit_n(1, what)
    }

    /// Count `n`; the first time, log `what()`.
    pub fn hit_n(&self, n: u64, what: impl FnOnce() -> String) {
        self.count.fetch_add(n, Ordering::Relaxed);
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "backing I/O fallback ({}): {}; counted in `farcache stats` as backing.io.{}, logged once",
                self.name,
                what(),
                self.name
            );
        }
    }

    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The engine's counters. All count from the engine's start and only grow, except
/// `in_flight`.
#[derive(Debug)]
pub struct IoCounters {
    configured: IoEngineKind,
    /// Set once io_uring turned out to be unavailable: the engine runs synchronously.
    pub(super) uring_unavailable: AtomicBool,
    /// Operations completed through io_uring.
    pub ops_uring: AtomicU64,
    /// Operations completed by a synchronous system call (`io_engine = "sync"`, or fallback).
    pub ops_sync: AtomicU64,
    /// Of all operations: writes, and fsyncs or fdatasyncs (the rest are reads).
    pub write_ops: AtomicU64,
    pub sync_ops: AtomicU64,
    /// Operations in flight now.
    pub in_flight: AtomicU64,
    /// The most operations ever in flight at once: how deep the queue really got.
    pub in_flight_peak: AtomicU64,
    /// io_uring rings made (one per caller that ever ran at once).
    pub rings: AtomicU64,
    /// Calls that waited because `max_in_flight` operations were already in flight.
    pub waits_for_room: AtomicU64,
    /// Operations run synchronously because io_uring was unavailable (no ring could be made,
    /// or the kernel lacks an operation, or a submission failed).
    pub fallback_no_uring: Fallback,
    /// Direct reads whose offset or length was off the device's alignment: read rounded out
    /// into an aligned bounce buffer.
    pub fallback_unaligned_reads: Fallback,
    /// Writes to a file opened with `O_DIRECT` that were off the alignment: written buffered.
    pub fallback_unaligned_writes: Fallback,
    /// Files whose backing file system refused `O_DIRECT` (at open or at the first
    /// transfer): read and written buffered.
    pub fallback_direct_refused: Fallback,
    /// Short transfers resubmitted for the rest.
    pub short_retries: Fallback,
}

impl IoCounters {
    pub(super) fn new(configured: IoEngineKind) -> IoCounters {
        IoCounters {
            configured,
            uring_unavailable: AtomicBool::new(false),
            ops_uring: AtomicU64::new(0),
            ops_sync: AtomicU64::new(0),
            write_ops: AtomicU64::new(0),
            sync_ops: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            in_flight_peak: AtomicU64::new(0),
            rings: AtomicU64::new(0),
            waits_for_room: AtomicU64::new(0),
            fallback_no_uring: Fallback::new("fallback_no_uring"),
            fallback_unaligned_reads: Fallback::new("fallback_unaligned_reads"),
            fallback_unaligned_writes: Fallback::new("fallback_unaligned_writes"),
            fallback_direct_refused: Fallback::new("fallback_direct_refused"),
            short_retries: Fallback::new("short_retries"),
        }
    }

    /// The engine doing the work now: the configured one, or `Sync` once io_uring failed.
    pub fn engine(&self) -> IoEngineKind {
        if self.uring_unavailable.load(Ordering::Relaxed) {
            IoEngineKind::Sync
        } else {
            self.configured
        }
    }

    pub(super) fn start(&self, n: u32) {
        let now = self.in_flight.fetch_add(u64::from(n), Ordering::Relaxed) + u64::from(n);
        self.in_flight_peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(super) fn finish(&self, n: u32) {
        self.in_flight.fetch_sub(u64::from(n), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> IoCountersSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IoCountersSnapshot {
            engine: self.engine(),
            ops_uring: l(&self.ops_uring),
            ops_sync: l(&self.ops_sync),
            write_ops: l(&self.write_ops),
            sync_ops: l(&self.sync_ops),
            in_flight: l(&self.in_flight),
            in_flight_peak: l(&self.in_flight_peak),
            rings: l(&self.rings),
            waits_for_room: l(&self.waits_for_room),
            fallback_no_uring: self.fallback_no_uring.get(),
            fallback_unaligned_reads: self.fallback_unaligned_reads.get(),
            fallback_unaligned_writes: self.fallback_unaligned_writes.get(),
            fallback_direct_refused: self.fallback_direct_refused.get(),
            short_retries: self.short_retries.get(),
        }
    }
}

/// A point-in-time copy of [`IoCounters`], field for field; `engine` is the engine in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IoCountersSnapshot {
    pub engine: IoEngineKind,
    pub ops_uring: u64,
    pub ops_sync: u64,
    pub write_ops: u64,
    pub sync_ops: u64,
    pub in_flight: u64,
    pub in_flight_peak: u64,
    pub rings: u64,
    pub waits_for_room: u64,
    pub fallback_no_uring: u64,
    pub fallback_unaligned_reads: u64,
    pub fallback_unaligned_writes: u64,
    pub fallback_direct_refused: u64,
    pub short_retries: u64,
}
