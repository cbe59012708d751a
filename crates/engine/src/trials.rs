//! Trials: the adaptive rule judged by what the application's random reads take, with the
//! lenders and without them, side by side in time.
//!
//! The rule ([`crate::routing`]) compares a disk read with a lender hit, each timed alone.
//! What it cannot see is what the lenders' traffic costs the *other* reads: on a host with
//! few CPUs the lender connection's wake-ups, the fills and (in the testbed) the lender
//! itself take the CPU that the disk's reads, the loop device and the application need.
//! Measured on this machine's fast virtual disk (BENCHMARKS.md, sessions 17 and 21), the
//! rule timed the disk's reads at 175 µs and a lender hit at 102 µs and so kept most reads
//! on the lenders, while the same reads through the passthrough took 88 µs each: the
//! disk's reads were slow *because* the lenders were busy. No comparison of the two sides'
//! own times can find that; comparing whole periods can.
//!
//! So time is cut into epochs, each with one mode: *shared* (the rule decides, as without
//! trials) or *disk only* (every random read goes to the disk as asked; nothing is filled,
//! seeded or probed, and the rule learns nothing from those reads). The mode the last
//! trials chose — the *verdict* — holds for most epochs. Now and then a *test* epoch runs the
//! other mode, after a short *settle* period (nothing measured: the reads, fills and
//! connections of the mode before finish), and its mean read time is compared with the
//! verdict's epoch just before it: one *pair*, `shared ÷ disk only`. The verdict goes to
//! *disk only* when the median of the last [`TRIAL_PAIRS`] pairs is above `1 +`
//! [`TRIAL_MARGIN`] (the lenders make the reads slower), and back to *shared* when it falls
//! below 1 (they make them faster); at least [`TRIAL_MIN_PAIRS`] pairs since the last change
//! are needed either way, so one noisy epoch never flips it.
//!
//! The cost is bounded: a test runs every [`TRIAL_EVERY_MIN`] epochs after a change or a
//! test that disagrees with the verdict, and the spacing doubles with each test that agrees,
//! up to [`TRIAL_EVERY_MAX`] epochs (one test every 16 s: about 2% of the time in the mode
//! the verdict rejected). A change of the disk or of the lenders is seen by the next test.
//!
//! An epoch closes after [`TRIAL_EPOCH`] and at least [`TRIAL_MIN_READS`] reads; one that
//! does not see that many within [`TRIAL_MAX_EPOCH`] is void (a mount that barely reads has
//! nothing to judge, and keeps its verdict). Each read is tagged with the epoch it was
//! decided in, and a read that completes in a later one is not counted.
//!
//! Sequential reads are not part of trials: the rule decides them by their own measured
//! cost per byte.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Shortest epoch.
pub const TRIAL_EPOCH: Duration = Duration::from_millis(250);
/// What a mode change waits before a test (or the verdict's next epoch) is measured.
pub const TRIAL_SETTLE: Duration = Duration::from_millis(50);
/// Fewest reads an epoch's mean is taken from.
pub const TRIAL_MIN_READS: u32 = 16;
/// An epoch with fewer reads than [`TRIAL_MIN_READS`] by then is void.
pub const TRIAL_MAX_EPOCH: Duration = Duration::from_secs(2);
/// Pairs whose median decides.
pub const TRIAL_PAIRS: usize = 5;
/// Fewest pairs since the last change before the verdict may change.
pub const TRIAL_MIN_PAIRS: usize = 3;
/// How much slower the shared mode must make the reads before the disk has them all.
pub const TRIAL_MARGIN: f64 = 0.05;
/// Epochs between tests after a change of verdict, or a test that disagreed.
pub const TRIAL_EVERY_MIN: u32 = 4;
/// Most epochs between tests.
pub const TRIAL_EVERY_MAX: u32 = 64;
const _: () = assert!(TRIAL_MIN_PAIRS <= TRIAL_PAIRS && TRIAL_MIN_PAIRS > 0);
const _: () = assert!(TRIAL_EVERY_MIN >= 2 && TRIAL_EVERY_MIN <= TRIAL_EVERY_MAX);
const _: () = assert!(TRIAL_MIN_READS > 0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// An epoch of the verdict's mode, measured: the reference of the next test.
    Regular,
    /// The other mode, not measured yet.
    SettleOut,
    /// The other mode, measured.
    Test,
    /// The verdict's mode again, not measured yet.
    SettleBack,
}

/// What the trials found, for `farcache stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrialStats {
    /// true: every random read goes to the disk, because the lenders made them slower.
    pub disk_only: bool,
    /// Tests run.
    pub tests: u64,
    /// Times the verdict changed.
    pub changes: u64,
    /// Epochs with too few reads to judge.
    pub void_epochs: u64,
    /// The median of the recent pairs, shared ÷ disk only (0: none yet).
    pub shared_over_disk: f64,
    /// Epochs between tests now.
    pub test_every: u32,
}

/// One mount's trials (see the module doc).
pub struct Trials {
    /// The current epoch's number shifted left once, plus 1 when it is disk only: one word,
    /// so that a read's tag and its mode always agree.
    now: AtomicU64,
    inner: Mutex<Inner>,
    born: Instant,
    /// What tests skipped ahead on the clock.
    skipped_us: AtomicU64,
}

struct Inner {
    disk_only: bool,
    every: u32,
    since_test: u32,
    phase: Phase,
    epoch: u64,
    start_us: u64,
    sum_us: f64,
    reads: u32,
    /// The last regular epoch's mean read time, µs.
    reference: Option<f64>,
    /// Recent pairs, shared ÷ disk only, oldest first.
    pairs: Vec<f64>,
    tests: u64,
    changes: u64,
    void_epochs: u64,
    median: f64,
}

impl Default for Trials {
    fn default() -> Self {
        Trials::new()
    }
}

impl Trials {
    pub fn new() -> Trials {
        Trials {
            now: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                disk_only: false,
                every: TRIAL_EVERY_MIN,
                since_test: 0,
                phase: Phase::Regular,
                epoch: 0,
                start_us: 0,
                sum_us: 0.0,
                reads: 0,
                reference: None,
                pairs: Vec::with_capacity(TRIAL_PAIRS),
                tests: 0,
                changes: 0,
                void_epochs: 0,
                median: 0.0,
            }),
            born: Instant::now(),
            skipped_us: AtomicU64::new(0),
        }
    }

    /// The tag of a random read decided now; [`Self::disk_only`] says its mode.
    pub fn tag(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// Whether a read tagged `tag` goes to the disk only.
    pub fn disk_only(tag: u64) -> bool {
        tag & 1 == 1
    }

    fn now_us(&self) -> u64 {
        self.born.elapsed().as_micros() as u64 + self.skipped_us.load(Ordering::Relaxed)
    }

    /// Let the clock skip `by` ahead (tests that simulate time).
    #[cfg(test)]
    pub(crate) fn skip(&self, by: Duration) {
        self.skipped_us.fetch_add(by.as_micros() as u64, Ordering::Relaxed);
    }

    /// A random read tagged `tag` (by [`Self::tag`] when it was decided) took `took`.
    pub fn read_done(&self, tag: u64, took: Duration) {
        let now = self.now_us();
        let mut i = self.inner.lock();
        if tag == self.now.load(Ordering::Relaxed) && matches!(i.phase, Phase::Regular | Phase::Test) {
            i.sum_us += took.as_secs_f64() * 1e6;
            i.reads += 1;
        }
        self.advance(&mut i, now);
    }

    /// Close the epoch if it is over, and open the next.
    fn advance(&self, i: &mut Inner, now: u64) {
        let age = now.saturating_sub(i.start_us);
        let next = match i.phase {
            Phase::SettleOut | Phase::SettleBack if age < TRIAL_SETTLE.as_micros() as u64 => return,
            Phase::SettleOut => Phase::Test,
            Phase::SettleBack => Phase::Regular,
            Phase::Regular | Phase::Test => {
                let enough = i.reads >= TRIAL_MIN_READS && age >= TRIAL_EPOCH.as_micros() as u64;
                if !enough && age < TRIAL_MAX_EPOCH.as_micros() as u64 {
                    return;
                }
                let mean = enough.then(|| i.sum_us / f64::from(i.reads));
                if mean.is_none() {
                    i.void_epochs += 1;
                }
                match (i.phase, mean) {
                    (Phase::Regular, None) => {
                        i.reference = None;
                        Phase::Regular
                    }
                    (Phase::Regular, Some(mean)) => {
                        i.reference = Some(mean);
                        i.since_test += 1;
                        if i.since_test + 1 >= i.every {
                            Phase::SettleOut
                        } else {
                            Phase::Regular
                        }
                    }
                    (_, mean) => {
                        i.since_test = 0;
                        if let (Some(test), Some(reference)) = (mean, i.reference.take()) {
                            Self::judge(i, test, reference);
                        }
                        Phase::SettleBack
                    }
                }
            }
        };
        i.phase = next;
        i.epoch += 1;
        i.start_us = now;
        i.sum_us = 0.0;
        i.reads = 0;
        let other = matches!(next, Phase::SettleOut | Phase::Test);
        let disk_only = i.disk_only != other;
        self.now.store(i.epoch << 1 | u64::from(disk_only), Ordering::Relaxed);
    }

    /// A test epoch's mean against its reference (the verdict's epoch before it).
    fn judge(i: &mut Inner, test: f64, reference: f64) {
        i.tests += 1;
        let (shared, disk) = if i.disk_only { (test, reference) } else { (reference, test) };
        let pair = shared / disk.max(1.0);
        if i.pairs.len() == TRIAL_PAIRS {
            i.pairs.remove(0);
        }
        i.pairs.push(pair);
        let mut sorted = i.pairs.clone();
        sorted.sort_by(f64::total_cmp);
        i.median = sorted[sorted.len() / 2];
        let agrees = if i.disk_only { pair >= 1.0 } else { pair <= 1.0 + TRIAL_MARGIN };
        i.every = if agrees { (i.every * 2).min(TRIAL_EVERY_MAX) } else { TRIAL_EVERY_MIN };
        if i.pairs.len() < TRIAL_MIN_PAIRS {
            return;
        }
        let change = if i.disk_only { i.median < 1.0 } else { i.median > 1.0 + TRIAL_MARGIN };
        if change {
            i.disk_only = !i.disk_only;
            i.changes += 1;
            i.pairs.clear();
            i.every = TRIAL_EVERY_MIN;
            tracing::info!(
                shared_over_disk = i.median,
                "random reads now go {}",
                if i.disk_only {
                    "to the disk only: the lenders' traffic made them slower (routing trials)"
                } else {
                    "to the disk and the lenders again: the lenders made them faster (routing trials)"
                }
            );
        }
    }

    pub fn stats(&self) -> TrialStats {
        let i = self.inner.lock();
        TrialStats {
            disk_only: i.disk_only,
            tests: i.tests,
            changes: i.changes,
            void_epochs: i.void_epochs,
            shared_over_disk: i.median,
            test_every: i.every,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `epochs` epochs' worth of reads: each read takes `shared_us` in a shared epoch and
    /// `disk_us` in a disk-only one; simulated time moves by the read's time.
    fn run(t: &Trials, reads: u32, shared_us: u64, disk_us: u64) -> (u32, u32) {
        let (mut shared, mut disk) = (0, 0);
        for _ in 0..reads {
            let tag = t.tag();
            let us = if Trials::disk_only(tag) {
                disk += 1;
                disk_us
            } else {
                shared += 1;
                shared_us
            };
            t.skip(Duration::from_micros(us));
            t.read_done(tag, Duration::from_micros(us));
        }
        (shared, disk)
    }

    #[test]
    fn lenders_that_slow_the_reads_lose_them_and_win_them_back_when_they_help() {
        let t = Trials::new();
        // Shared reads take 120 µs, disk-only ones 90: within a minute every random read is
        // on the disk, and it stays there with few tests.
        run(&t, 60_000_000 / 120, 120, 90);
        let s = t.stats();
        assert!(s.disk_only, "the lenders slowed the reads: {s:?}");
        assert_eq!(s.changes, 1, "one change, no oscillation: {s:?}");
        let (shared, disk) = run(&t, 60_000_000 / 90, 120, 90);
        assert!(t.stats().disk_only);
        assert!(shared * 20 < disk, "tests are rare once the verdict holds: {shared} shared of {disk}");
        // The disk slows down (it is now 3× a shared read): back to shared within 30 s.
        run(&t, 30_000_000 / 150, 100, 300);
        let s = t.stats();
        assert!(!s.disk_only, "the lenders help again: {s:?}");
        assert_eq!(s.changes, 2, "{s:?}");
    }

    #[test]
    fn a_tie_keeps_the_rule_and_noise_does_not_flip_it() {
        let t = Trials::new();
        // Equal means, with every fifth epoch's reads twice as slow whatever the mode.
        let mut slow = 0u64;
        for _ in 0..200_000 {
            let tag = t.tag();
            slow += 1;
            let us = if (slow / 2_000) % 5 == 4 { 200 } else { 100 };
            t.skip(Duration::from_micros(us));
            t.read_done(tag, Duration::from_micros(us));
        }
        let s = t.stats();
        assert!(!s.disk_only, "{s:?}");
        assert_eq!(s.changes, 0, "{s:?}");
        assert!(s.tests >= 3, "tests ran: {s:?}");
    }

    #[test]
    fn a_mount_that_barely_reads_keeps_its_verdict_and_voids_its_epochs() {
        let t = Trials::new();
        // One read every 200 ms: never 16 in an epoch.
        for _ in 0..100 {
            let tag = t.tag();
            assert!(!Trials::disk_only(tag), "no test without a reference");
            t.skip(Duration::from_millis(200));
            t.read_done(tag, Duration::from_micros(90));
        }
        let s = t.stats();
        assert_eq!((s.tests, s.changes), (0, 0), "{s:?}");
        assert!(s.void_epochs >= 5, "{s:?}");
    }

    #[test]
    fn a_read_that_ends_in_a_later_epoch_is_not_counted() {
        let t = Trials::new();
        let late = t.tag();
        // Fast reads fill epoch 0 and close it.
        run(&t, 5_000, 60, 60);
        assert_ne!(t.tag(), late);
        let reads_before = t.inner.lock().reads;
        t.read_done(late, Duration::from_secs(10));
        assert_eq!(t.inner.lock().reads, reads_before, "a read of an old epoch is not counted");
        assert!(t.inner.lock().sum_us < 10e6);
    }
}
