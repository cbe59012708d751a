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
//! The rule. Each read of the source disk by a copy (a chunk of 1 MiB, or the span of a
//! chunk that lenders or the tier did not give: known only once they were asked — a lender
//! may have dropped blocks the index still lists) owes the applications a wait of at most
//! `yield_wait_ratio` times that read (not the lenders' part of its chunk, nor its write:
//! what the copy gives back is the disk time it took), and each fetch of a chunk's held
//! blocks from the lenders a wait of [`LENDER_WAIT_RATIO`] times that fetch (the
//! applications' lender reads share the link and queue behind the copy's); both at most
//! `yield_max_wait`, counted from the end of what owes them. Before using a side again the
//! copy waits out what it owes there while the branches it reads from and writes to have
//! foreground I/O. It does the other side's work meanwhile: chunks the lenders give whole cost
//! the disks only their write, which the page cache takes until the sync, and the disk reads
//! queue behind (a few chunks' worth at most), so the waits are spent on work that does not
//! touch the busy side. The copy never stops: under a foreground that never pauses it still
//! holds the source disk 1 / (1 + ratio) of the time, and goes at full speed as soon as the
//! foreground pauses. Waits and those that ran to their bound are counted.

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
    /// The most the copy waits before reading the source disk again, as a multiple of its
    /// last read of it.
    pub(crate) wait_ratio: f64,
    /// The most the copy waits before using either side again, whatever the ratio.
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

/// What a copy's wait gives back to the applications.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The source disk: owed after each read of it, `yield_wait_ratio` times that read.
    Disk,
    /// The lenders and the link to them: owed after each fetch of a chunk's held blocks,
    /// [`LENDER_WAIT_RATIO`] times that fetch — the applications' fetches share the link,
    /// and one that arrives behind the copy's waits for it.
    Lenders,
}

/// After fetching a chunk's blocks from the lenders, a copy waits this many times the
/// fetch while the applications have I/O (so it takes at most half the link's time from
/// them). Measured (BENCHMARKS.md, issue 14, session 20): one reader half of whose reads are
/// lender hits lost 14–28% of its rate to a copy fetching back to back, though the copy
/// read the disk no more than the conventional one that cost it nothing.
pub const LENDER_WAIT_RATIO: f64 = 1.0;

/// A wait owed since `since`.
#[derive(Clone, Copy)]
struct Owed {
    owed: Duration,
    since: Instant,
}

impl Owed {
    fn left(&self) -> Duration {
        self.owed.saturating_sub(self.since.elapsed())
    }
}

/// One balance's yielding: after each read of the source disk, and after each fetch from
/// the lenders, the copy owes the applications a wait on that side (a multiple of what it
/// took, at most `max_wait`), counted from its end — so the copy's work on the other side
/// goes on meanwhile and pays it off.
pub(crate) struct Yielder {
    policy: YieldPolicy,
    /// The wait owed on each side ([`Side::Disk`], [`Side::Lenders`]).
    owed: [Owed; 2],
    /// Per side: waits, of them those that waited to the bound, and the time waited.
    yields: [u64; 2],
    bounded: [u64; 2],
    waited: [Duration; 2],
}

impl Yielder {
    pub(crate) fn new(policy: YieldPolicy) -> Yielder {
        let none = Owed { owed: Duration::ZERO, since: Instant::now() };
        Yielder { policy, owed: [none; 2], yields: [0; 2], bounded: [0; 2], waited: [Duration::ZERO; 2] }
    }

    /// The longest the next use of `side` may still wait.
    pub(crate) fn bound(&self, side: Side) -> Duration {
        self.owed[side as usize].left()
    }

    /// Whether the copy may use `side` now: nothing is owed there any more, or `busy()` says
    /// the applications have no I/O on its branches (or yielding is off).
    pub(crate) fn may_use(&self, side: Side, busy: impl Fn() -> bool) -> bool {
        !self.policy.enabled || self.bound(side).is_zero() || !busy()
    }

    /// Before using `side`: wait while `busy()` says the applications have I/O on the copy's
    /// branches, at most [`Yielder::bound`].
    pub(crate) fn give_way(&mut self, side: Side, busy: impl Fn() -> bool) -> Waited {
        let bound = self.bound(side);
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
        let i = side as usize;
        self.yields[i] += 1;
        self.bounded[i] += matches!(w, Waited::Bounded(_)) as u64;
        self.waited[i] += t0.elapsed();
        w
    }

    /// Waits for `side`, of them those that waited to the bound, and the time waited.
    pub(crate) fn totals(&self, side: Side) -> (u64, u64, Duration) {
        let i = side as usize;
        (self.yields[i], self.bounded[i], self.waited[i])
    }

    /// The copy just used `side` for `d` (a read of the disk: not the lenders' part of its
    /// chunk nor its write; a fetch of held blocks): the next use owes a wait from now.
    pub(crate) fn used(&mut self, side: Side, d: Duration) {
        let ratio = match side {
            Side::Disk => self.policy.wait_ratio,
            Side::Lenders => LENDER_WAIT_RATIO,
        };
        self.owed[side as usize] = Owed { owed: d.mul_f64(ratio).min(self.policy.max_wait), since: Instant::now() };
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
        // Never idle, but nothing used yet: nothing owed, no wait at all.
        assert_eq!(y.give_way(Side::Disk, || true), Waited::No);
        assert!(y.may_use(Side::Disk, || true) && y.may_use(Side::Lenders, || true));
        // After a 5 ms read: at most 4 × 5 = 20 ms, counted from the read's end.
        y.used(Side::Disk, Duration::from_millis(5));
        let b = y.bound(Side::Disk);
        assert!(b <= Duration::from_millis(20) && b > Duration::from_millis(10), "{b:?}");
        assert!(!y.may_use(Side::Disk, || true), "owed, and the foreground is busy");
        assert!(y.may_use(Side::Disk, || false), "nothing to give way to");
        assert!(y.may_use(Side::Lenders, || true), "the other side owes nothing");
        let t = Instant::now();
        let Waited::Bounded(w) = y.give_way(Side::Disk, || true) else {
            panic!("a busy foreground must bound the wait")
        };
        assert!(w >= b && t.elapsed() < Duration::from_millis(200), "{w:?}");
        // Paid: the next read goes at once.
        assert!(y.may_use(Side::Disk, || true));
        assert_eq!(y.give_way(Side::Disk, || true), Waited::No);
        // Time spent on other work after the read counts: the wait is owed from its end.
        y.used(Side::Disk, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(25));
        assert!(y.may_use(Side::Disk, || true) && y.bound(Side::Disk).is_zero());
        // The lenders' side owes LENDER_WAIT_RATIO times a fetch.
        y.used(Side::Lenders, Duration::from_millis(8));
        let b = y.bound(Side::Lenders);
        assert!(b <= Duration::from_millis(8).mul_f64(LENDER_WAIT_RATIO) && !b.is_zero(), "{b:?}");
        assert!(!y.may_use(Side::Lenders, || true) && y.may_use(Side::Disk, || true));
        // A long read: the cap (40 ms), not 4 × 1 s.
        y.used(Side::Disk, Duration::from_secs(1));
        assert!(y.bound(Side::Disk) <= Duration::from_millis(40) && y.bound(Side::Disk) > Duration::from_millis(30));
        // The foreground pauses after three looks: the copy goes on at once.
        let looks = Cell::new(0);
        let w = y.give_way(Side::Disk, || {
            looks.set(looks.get() + 1);
            looks.get() < 3
        });
        assert!(matches!(w, Waited::Yielded(d) if d < Duration::from_millis(40)), "{w:?}");
        // Idle: no wait; off: no wait however busy.
        assert_eq!(y.give_way(Side::Lenders, || false), Waited::No);
        let (yields, bounded, waited) = y.totals(Side::Disk);
        assert_eq!((yields, bounded), (2, 1));
        assert!(waited >= Duration::from_millis(10), "{waited:?}");
        assert_eq!(y.totals(Side::Lenders), (0, 0, Duration::ZERO));
        let mut off = Yielder::new(policy(false));
        off.used(Side::Disk, Duration::from_secs(1));
        off.used(Side::Lenders, Duration::from_secs(1));
        assert_eq!(off.give_way(Side::Disk, || true), Waited::No);
        assert!(off.may_use(Side::Disk, || true) && off.may_use(Side::Lenders, || true));
    }
}
