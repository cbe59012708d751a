//! The copy of a move gives way to the applications' I/O (`[balance] yield_to_foreground`).
//!
//! Why farcache's own: the idle I/O class (`balance.idle_io_priority`) needs a scheduler with
//! priorities, and neither the `none` scheduler (loop devices, most NVMe, many virtual disks)
//! nor blkio throttling has them. Measured in BENCHMARKS.md (issue 14, session 16): with one
//! synchronous reader the foreground already uses all of a throttled disk's IOPS, so every
//! request of the copy is one the foreground waits for.
//!
//! What counts as the applications' I/O: the mount's reads and writes of files on a branch
//! ([`Foreground`]: in flight now, or ended less than [`QUIET`] ago — a reader issuing its
//! next request right after the last one is not idle). The copy's own I/O is not counted.
//!
//! The rule, after each chunk (1 MiB) of a copy that read the source disk (a chunk lenders
//! or the tier gave whole costs the disks only its write, which the page cache takes until
//! the sync; known after the chunk, not before — a lender may have dropped blocks the index
//! still lists): while the branches it reads from and writes to have foreground I/O, wait —
//! at most `yield_wait_ratio` times that chunk's copy time and at most `yield_max_wait`. So
//! the copy never stops: under a foreground that never pauses it still runs at least
//! 1 / (1 + ratio) of its own speed, and goes at full speed as soon as the foreground pauses.
//! Waits and those that ran to their bound are counted.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A branch counts as busy for this long after its last foreground request ended.
pub const QUIET: Duration = Duration::from_millis(1);
/// How often a waiting copy looks again.
const POLL: Duration = Duration::from_micros(500);

/// The foreground's I/O on each branch: requests in flight and when the last one ended.
pub(crate) struct Foreground {
    epoch: Instant,
    in_flight: Vec<AtomicU32>,
    /// Nanoseconds since `epoch` at which the last request ended (0: none yet).
    last_end_ns: Vec<AtomicU64>,
}

impl Foreground {
    pub(crate) fn new(branches: usize) -> Foreground {
        Foreground {
            epoch: Instant::now(),
            in_flight: (0..branches).map(|_| AtomicU32::new(0)).collect(),
            last_end_ns: (0..branches).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A request on branch `b` starts (ended by [`Foreground::end`]).
    pub(crate) fn begin(&self, b: usize) {
        if let Some(c) = self.in_flight.get(b) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request on branch `b` ended at `at`.
    pub(crate) fn end(&self, b: usize, at: Instant) {
        if let (Some(c), Some(t)) = (self.in_flight.get(b), self.last_end_ns.get(b)) {
            t.fetch_max(at.duration_since(self.epoch).as_nanos() as u64, Ordering::Relaxed);
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether any of `branches` has a request in flight or ended one less than [`QUIET`] ago.
    pub(crate) fn busy(&self, branches: &[usize]) -> bool {
        let now = self.epoch.elapsed().as_nanos() as u64;
        branches.iter().any(|&b| {
            self.in_flight.get(b).is_some_and(|c| c.load(Ordering::Relaxed) > 0)
                || self.last_end_ns.get(b).is_some_and(|t| {
                    let t = t.load(Ordering::Relaxed);
                    t != 0 && now.saturating_sub(t) < QUIET.as_nanos() as u64
                })
        })
    }
}

/// `[balance]`'s yielding settings, as a balance uses them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct YieldPolicy {
    pub(crate) enabled: bool,
    /// The most a chunk waits, as a multiple of the previous chunk's copy time.
    pub(crate) wait_ratio: f64,
    /// The most a chunk waits, whatever the ratio.
    pub(crate) max_wait: Duration,
}

/// How one chunk's wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The branches had no foreground I/O (or yielding is off, or the bound is zero): no
    /// wait.
    No,
    /// The foreground paused after this long.
    Yielded(Duration),
    /// The foreground was still busy when the bound ran out (this long).
    Bounded(Duration),
}

/// One balance's yielding: the bound of the next wait follows the previous chunk's time.
pub(crate) struct Yielder {
    policy: YieldPolicy,
    last_chunk: Duration,
    /// Chunks that waited, of them those that waited to the bound, and the time waited.
    yields: u64,
    bounded: u64,
    waited: Duration,
}

impl Yielder {
    pub(crate) fn new(policy: YieldPolicy) -> Yielder {
        Yielder { policy, last_chunk: Duration::ZERO, yields: 0, bounded: 0, waited: Duration::ZERO }
    }

    /// The longest the next chunk may wait.
    pub(crate) fn bound(&self) -> Duration {
        self.last_chunk.mul_f64(self.policy.wait_ratio).min(self.policy.max_wait)
    }

    /// After a chunk that read the disk ([`Yielder::chunk_took`] first): wait while `busy()`
    /// says the foreground has I/O on the chunk's branches, at most [`Yielder::bound`].
    pub(crate) fn give_way(&mut self, busy: impl Fn() -> bool) -> Waited {
        let bound = self.bound();
        if !self.policy.enabled || bound.is_zero() || !busy() {
            return Waited::No;
        }
        let t0 = Instant::now();
        let w = loop {
            let waited = t0.elapsed();
            if waited >= bound {
                break Waited::Bounded(waited);
            }
            // Waiting for the applications' I/O to pause: a bounded poll (the foreground's
            // requests do not signal the copy, which would cost them on their hot path).
            std::thread::sleep(POLL.min(bound - waited));
            if !busy() {
                break Waited::Yielded(t0.elapsed());
            }
        };
        self.yields += 1;
        self.bounded += matches!(w, Waited::Bounded(_)) as u64;
        self.waited += t0.elapsed();
        w
    }

    /// Chunks that waited, of them those that waited to the bound, and the time waited.
    pub(crate) fn totals(&self) -> (u64, u64, Duration) {
        (self.yields, self.bounded, self.waited)
    }

    /// A chunk that read the disk took `d` to copy (read and write; no wait included).
    pub(crate) fn chunk_took(&mut self, d: Duration) {
        self.last_chunk = d;
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn policy(enabled: bool) -> YieldPolicy {
        YieldPolicy { enabled, wait_ratio: 4.0, max_wait: Duration::from_millis(40) }
    }

    #[test]
    fn the_foreground_is_busy_while_in_flight_and_just_after() {
        let f = Foreground::new(2);
        assert!(!f.busy(&[0, 1]));
        f.begin(1);
        assert!(f.busy(&[0, 1]) && f.busy(&[1]) && !f.busy(&[0]));
        f.end(1, Instant::now());
        assert!(f.busy(&[1]), "ended less than QUIET ago");
        std::thread::sleep(QUIET * 2);
        assert!(!f.busy(&[1]));
        // A branch outside the union (NO_BRANCH) counts nowhere.
        f.begin(usize::MAX);
        f.end(usize::MAX, Instant::now());
        assert!(!f.busy(&[0, 1]));
    }

    #[test]
    fn a_chunk_waits_while_busy_bounded_by_ratio_and_max() {
        let mut y = Yielder::new(policy(true));
        // Never idle, but no chunk timed yet: a zero bound, no wait at all.
        assert_eq!(y.give_way(|| true), Waited::No);
        // After a 5 ms chunk: at most 4 × 5 = 20 ms.
        y.chunk_took(Duration::from_millis(5));
        assert_eq!(y.bound(), Duration::from_millis(20));
        let t = Instant::now();
        let Waited::Bounded(w) = y.give_way(|| true) else { panic!("a busy foreground must bound the wait") };
        assert!(w >= Duration::from_millis(20) && t.elapsed() < Duration::from_millis(200), "{w:?}");
        // A long chunk: the cap (40 ms), not 4 × 1 s.
        y.chunk_took(Duration::from_secs(1));
        assert_eq!(y.bound(), Duration::from_millis(40));
        // The foreground pauses after three looks: the copy goes on at once.
        let looks = Cell::new(0);
        let w = y.give_way(|| {
            looks.set(looks.get() + 1);
            looks.get() < 3
        });
        assert!(matches!(w, Waited::Yielded(d) if d < Duration::from_millis(40)), "{w:?}");
        // Idle: no wait; off: no wait however busy.
        assert_eq!(y.give_way(|| false), Waited::No);
        let (yields, bounded, waited) = y.totals();
        assert_eq!((yields, bounded), (2, 1));
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        let mut off = Yielder::new(policy(false));
        off.chunk_took(Duration::from_secs(1));
        assert_eq!(off.give_way(|| true), Waited::No);
    }
}
