//! Where [`crate::cached::CachedPath`] sends a read: the routing rule and, for the adaptive
//! rule, the measurements it decides from.
//!
//! - [`Router::Threshold`] is paper 000's rule: a read of `n` blocks or more goes to the disk,
//!   a smaller one to the lenders. Nothing is measured.
//! - [`Router::Adaptive`] is the dynamic `n` the paper left as future work: each read goes
//!   where [`Adaptive`] expects it to finish sooner, from moving averages of what this mount
//!   measured — every disk read (timed, by size, sequential or not) and every fetch from the
//!   lenders (timed, by bytes; a fetch that gave up at `fetch_timeout` counts with the time it
//!   waited, so a hung lender looks as slow as it is).
//!
//! Sequential or not is decided per file by a [`Stream`] in a fixed table of
//! [`STREAM_SLOTS`] slots, indexed by a hash of the file's identity: bounded however many
//! files are read, and two files that share a slot only make each other look random.
//!
//! A rule that sends everything to one side stops measuring the other, so a lender that
//! recovered (or a disk that got busy) would never be noticed. Probes keep both estimates
//! fresh at a bounded cost: when the lenders have not been measured for
//! [`REMOTE_PROBE_INTERVAL`], the next read the rule sends to the disk goes to the lenders
//! instead (when they hold all its blocks); when the disk has not been measured for
//! [`DISK_PROBE_INTERVAL`] (every miss measures it, so this only happens when nearly every
//! read hits), the next read the rule sends to the lenders goes to the disk. A probe also
//! waits at least [`PROBE_COST_FACTOR`] times what the last measurement of its side took,
//! so probing costs at most about 2% of the time whatever a side costs (a hung lender that
//! takes 50 ms a fetch is probed every 2.5 s, not every 20 ms). At most 50 lender probes
//! and 4 disk probes a second, counted in the stats.
//!
//! No oscillation: the rule keeps the side it chose last (per kind of read: random or
//! sequential) until the other side is expected to be faster by more than [`HYSTERESIS`],
//! and counts every switch.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farcache_policy::route::{Adaptive, Route, Stream, Threshold};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::identity::FileId;

/// Slots of the per-file stream table.
pub const STREAM_SLOTS: usize = 512;
/// The lenders are probed when they have not been measured for this long.
pub const REMOTE_PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// The disk is probed when it has not been measured for this long (a probe of a slow disk
/// costs a slow read: rarer).
pub const DISK_PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// Read-around is used while the wider read is expected to take at most this many times
/// as long as the read asked for.
pub const READ_AROUND_MAX_COST: f64 = 1.5;
/// A probe waits at least this many times the last measurement of its side.
pub const PROBE_COST_FACTOR: u64 = 50;
/// The other side must be expected faster by this fraction before the rule switches to it.
pub const HYSTERESIS: f64 = 0.1;
const _: () = assert!(STREAM_SLOTS.is_power_of_two());
const _: () = assert!(HYSTERESIS > 0.0 && HYSTERESIS < 0.5);

/// The routing rule a [`crate::cached::CachedPath`] is built with.
#[derive(Clone, Copy, Debug)]
pub enum Router {
    /// Paper 000's fixed threshold.
    Threshold(Threshold),
    /// Per read, from measured costs; starts from the model's prior.
    Adaptive(Adaptive),
}

impl From<Threshold> for Router {
    fn from(t: Threshold) -> Router {
        Router::Threshold(t)
    }
}

impl From<Adaptive> for Router {
    fn from(a: Adaptive) -> Router {
        Router::Adaptive(a)
    }
}

impl Router {
    /// The name of the rule in configuration and stats: "threshold" or "adaptive".
    pub fn mode(&self) -> &'static str {
        match self {
            Router::Threshold(_) => "threshold",
            Router::Adaptive(_) => "adaptive",
        }
    }
}

/// What the adaptive rule believes now (the model's moving averages) and how many
/// measurements it has taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveEstimates {
    /// Access time of a non-sequential disk read.
    pub disk_access_us: f64,
    /// Sequential disk throughput.
    pub disk_bytes_per_us: f64,
    /// Round trip of a small fetch from the lenders.
    pub remote_access_us: f64,
    /// Throughput of larger fetches beyond the round trip.
    pub remote_bytes_per_us: f64,
    /// Disk reads measured.
    pub disk_samples: u64,
    /// Fetches from the lenders measured.
    pub remote_samples: u64,
    /// Times the rule changed sides (random and sequential reads each).
    #[serde(default)]
    pub switches: u64,
    /// Reads sent to the disk although the rule chose the lenders, to measure the disk.
    #[serde(default)]
    pub disk_probes: u64,
}

/// One read's route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    pub route: Route,
    /// Decided by the adaptive rule (else by the threshold).
    pub adaptive: bool,
    /// The read continues its file's stream (adaptive rule only; `false` otherwise).
    pub sequential: bool,
    /// The read goes to the other side than the rule chose, to measure it: to the lenders
    /// (`route` is `Remote`; only if they hold all of its blocks, else it goes to the disk
    /// as the rule said), or to the disk (`route` is `Disk`).
    pub probe: bool,
}

impl Decision {
    /// Where the rule itself sent the read (before any probe).
    pub fn chosen(&self) -> Route {
        match (self.route, self.probe) {
            (r, false) => r,
            (Route::Remote, true) => Route::Disk,
            (Route::Disk, true) => Route::Remote,
        }
    }
}

/// The routing rule with its state.
pub(crate) enum RouterState {
    Threshold(Threshold),
    Adaptive(Box<Measured>),
}

pub(crate) struct Measured {
    model: Mutex<Adaptive>,
    streams: Streams,
    disk_samples: AtomicU64,
    remote_samples: AtomicU64,
    /// The side chosen last, for random (`[0]`) and sequential (`[1]`) reads: true = lenders.
    prefer_remote: [AtomicBool; 2],
    switches: AtomicU64,
    disk_probes: AtomicU64,
    /// When each side was last measured (or probed), in µs after `born`.
    disk_seen_us: AtomicU64,
    remote_seen_us: AtomicU64,
    /// What the last measurement of each side took, in µs.
    disk_cost_us: AtomicU64,
    remote_cost_us: AtomicU64,
    born: Instant,
}

impl Measured {
    fn now_us(&self) -> u64 {
        self.born.elapsed().as_micros() as u64
    }

    /// Whether the side last seen at `seen`, whose last measurement took `cost` µs, is due
    /// a probe; claims it (one probe per interval, however many threads ask).
    fn probe_due(&self, seen: &AtomicU64, cost: &AtomicU64, interval: Duration) -> bool {
        let now = self.now_us();
        let last = seen.load(Ordering::Relaxed);
        let wait = (interval.as_micros() as u64).max(cost.load(Ordering::Relaxed).saturating_mul(PROBE_COST_FACTOR));
        now.saturating_sub(last) >= wait
            && seen.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

impl RouterState {
    pub fn new(r: Router) -> RouterState {
        match r {
            Router::Threshold(t) => RouterState::Threshold(t),
            Router::Adaptive(a) => RouterState::Adaptive(Box::new(Measured {
                model: Mutex::new(a),
                streams: Streams::new(),
                disk_samples: AtomicU64::new(0),
                remote_samples: AtomicU64::new(0),
                prefer_remote: [AtomicBool::new(a.route(4096, false) == Route::Remote), AtomicBool::new(false)],
                switches: AtomicU64::new(0),
                disk_probes: AtomicU64::new(0),
                disk_seen_us: AtomicU64::new(0),
                remote_seen_us: AtomicU64::new(0),
                disk_cost_us: AtomicU64::new(0),
                remote_cost_us: AtomicU64::new(0),
                born: Instant::now(),
            })),
        }
    }

    pub fn mode(&self) -> &'static str {
        match self {
            RouterState::Threshold(_) => "threshold",
            RouterState::Adaptive(_) => "adaptive",
        }
    }

    /// Bytes from which the threshold rule sends reads to the disk; 0 for the adaptive rule.
    pub fn threshold_bytes(&self) -> u64 {
        match self {
            RouterState::Threshold(t) => t.blocks as u64 * t.block_bytes as u64,
            RouterState::Adaptive(_) => 0,
        }
    }

    /// Whether reads should be timed (only the adaptive rule uses the times).
    pub fn measures(&self) -> bool {
        matches!(self, RouterState::Adaptive(_))
    }

    /// Where a read of `len` bytes at `offset` of `id` goes.
    pub fn decide(&self, id: &FileId, offset: u64, len: u64) -> Decision {
        match self {
            RouterState::Threshold(t) => {
                Decision { route: t.route(len), adaptive: false, sequential: false, probe: false }
            }
            RouterState::Adaptive(m) => {
                let sequential = m.streams.observe(id, offset, len);
                let (remote_us, disk_us) = {
                    let a = m.model.lock();
                    (a.remote_us(len), a.disk_us(len, sequential))
                };
                let prefer = &m.prefer_remote[sequential as usize];
                let was_remote = prefer.load(Ordering::Relaxed);
                // Stay unless the other side is clearly faster.
                let remote = if was_remote {
                    remote_us <= disk_us * (1.0 + HYSTERESIS)
                } else {
                    remote_us * (1.0 + HYSTERESIS) < disk_us
                };
                if remote != was_remote && prefer.swap(remote, Ordering::Relaxed) == was_remote {
                    m.switches.fetch_add(1, Ordering::Relaxed);
                }
                let (route, probe) = if remote {
                    if m.probe_due(&m.disk_seen_us, &m.disk_cost_us, DISK_PROBE_INTERVAL) {
                        m.disk_probes.fetch_add(1, Ordering::Relaxed);
                        (Route::Disk, true)
                    } else {
                        (Route::Remote, false)
                    }
                } else if m.probe_due(&m.remote_seen_us, &m.remote_cost_us, REMOTE_PROBE_INTERVAL) {
                    (Route::Remote, true)
                } else {
                    (Route::Disk, false)
                };
                Decision { route, adaptive: true, sequential, probe }
            }
        }
    }

    /// Whether reading `wide` bytes instead of `len` costs the disk little more (at most
    /// [`READ_AROUND_MAX_COST`] times as long, by the adaptive rule's measurements): always
    /// under the threshold rule, which measures nothing.
    pub fn read_around_pays(&self, len: u64, wide: u64) -> bool {
        match self {
            RouterState::Threshold(_) => true,
            RouterState::Adaptive(m) => {
                let a = m.model.lock();
                a.disk_us(wide, false) <= READ_AROUND_MAX_COST * a.disk_us(len, false)
            }
        }
    }

    /// A disk read of `len` bytes took `took`.
    pub fn disk_read(&self, len: u64, sequential: bool, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.model.lock().observe_disk(len, sequential, took.as_secs_f64() * 1e6);
            m.disk_samples.fetch_add(1, Ordering::Relaxed);
            m.disk_seen_us.store(m.now_us(), Ordering::Relaxed);
            m.disk_cost_us.store(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// A fetch of `len` bytes from the lenders took `took`.
    pub fn remote_fetch(&self, len: u64, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.model.lock().observe_remote(len, took.as_secs_f64() * 1e6);
            m.remote_samples.fetch_add(1, Ordering::Relaxed);
            m.remote_seen_us.store(m.now_us(), Ordering::Relaxed);
            m.remote_cost_us.store(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// The adaptive rule's estimates; `None` for the threshold rule.
    pub fn estimates(&self) -> Option<AdaptiveEstimates> {
        let RouterState::Adaptive(m) = self else { return None };
        let a = *m.model.lock();
        Some(AdaptiveEstimates {
            disk_access_us: a.disk_access_us.get(),
            disk_bytes_per_us: a.disk_bytes_per_us.get(),
            remote_access_us: a.remote_access_us.get(),
            remote_bytes_per_us: a.remote_bytes_per_us.get(),
            disk_samples: m.disk_samples.load(Ordering::Relaxed),
            remote_samples: m.remote_samples.load(Ordering::Relaxed),
            switches: m.switches.load(Ordering::Relaxed),
            disk_probes: m.disk_probes.load(Ordering::Relaxed),
        })
    }
}

/// Sequential-stream detection per file, in a fixed number of slots.
struct Streams {
    hasher: std::hash::RandomState,
    /// (hash of the file's identity, its stream).
    slots: Box<[Mutex<(u64, Stream)>]>,
}

impl Streams {
    fn new() -> Streams {
        Streams {
            hasher: std::hash::RandomState::new(),
            slots: (0..STREAM_SLOTS).map(|_| Mutex::new((0, Stream::default()))).collect(),
        }
    }

    /// Record a read; whether it continues the previous read of the same file.
    fn observe(&self, id: &FileId, offset: u64, len: u64) -> bool {
        let h = self.hasher.hash_one(id);
        let mut slot = self.slots[h as usize & (STREAM_SLOTS - 1)].lock();
        if slot.0 != h {
            *slot = (h, Stream::default());
        }
        slot.1.observe(offset, len) > len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Generation;

    fn id(ino: u64) -> FileId {
        FileId { dev: 1, ino, generation: Generation::Fs(3) }
    }

    #[test]
    fn streams_are_per_file_and_bounded() {
        let s = Streams::new();
        assert!(!s.observe(&id(1), 0, 4096));
        assert!(!s.observe(&id(2), 0, 4096), "another file's stream is its own");
        assert!(s.observe(&id(1), 4096, 8192), "file 1 continues");
        assert!(s.observe(&id(2), 4096, 4096), "file 2 continues");
        assert!(!s.observe(&id(1), 1 << 20, 4096), "a jump is not sequential");
        // Many more files than slots: the table does not grow, and each file still works.
        for ino in 0..10 * STREAM_SLOTS as u64 {
            s.observe(&id(100 + ino), 0, 4096);
        }
        assert_eq!(s.slots.len(), STREAM_SLOTS);
        assert!(!s.observe(&id(7), 0, 4096));
        assert!(s.observe(&id(7), 4096, 4096));
    }

    #[test]
    fn threshold_rule_is_the_papers() {
        let r = RouterState::new(Threshold::PAPER.into());
        assert_eq!(r.mode(), "threshold");
        assert_eq!(r.threshold_bytes(), 128 << 10);
        assert!(!r.measures());
        assert_eq!(r.decide(&id(1), 0, 4096).route, Route::Remote);
        assert_eq!(r.decide(&id(1), 0, 128 << 10).route, Route::Disk);
        assert_eq!(r.estimates(), None);
    }

    #[test]
    fn adaptive_rule_learns_and_probes_within_its_bounds() {
        let r = RouterState::new(Adaptive::new().into());
        assert_eq!(r.mode(), "adaptive");
        assert_eq!(r.threshold_bytes(), 0);
        // A slow lender and a fast disk: reads go to the disk; the lenders are probed at
        // most once per REMOTE_PROBE_INTERVAL, however many reads there are.
        r.remote_fetch(4096, Duration::from_micros(350));
        r.disk_read(4096, false, Duration::from_micros(200));
        let t = Instant::now();
        let mut probes = 0;
        let mut reads = 0u64;
        while t.elapsed() < REMOTE_PROBE_INTERVAL * 5 {
            let d = r.decide(&id(1), (reads * 7 % 1000) * (1 << 20), 4096);
            reads += 1;
            assert!(d.adaptive && !d.sequential);
            assert_eq!(d.chosen(), Route::Disk);
            if d.probe {
                assert_eq!(d.route, Route::Remote);
                probes += 1;
            } else {
                assert_eq!(d.route, Route::Disk);
            }
        }
        assert!(reads > 100, "{reads}");
        assert!((4..=6).contains(&probes), "{probes} lender probes in 5 intervals");
        let e = r.estimates().unwrap();
        assert_eq!((e.disk_samples, e.remote_samples), (1, 1));
        assert!(e.remote_access_us > 250.0 && e.disk_access_us < 200.0, "{e:?}");
        assert_eq!(e.switches, 1, "one switch from the prior's lenders to the disk: {e:?}");
        // Sequential reads are recognised per file.
        assert!(!r.decide(&id(2), 0, 65536).sequential);
        assert!(r.decide(&id(2), 65536, 65536).sequential);
    }

    #[test]
    fn a_hung_lender_is_probed_at_a_bounded_cost() {
        let r = RouterState::new(Adaptive::new().into());
        r.disk_read(4096, false, Duration::from_micros(200));
        // Each probe of a hung lender waits out a 10 ms timeout: the next waits 50 times that.
        r.remote_fetch(4096, Duration::from_millis(10));
        let t = Instant::now();
        let mut probes = 0;
        while t.elapsed() < Duration::from_millis(400) {
            if r.decide(&id(5), 1 << 30, 4096).probe {
                probes += 1;
                r.remote_fetch(4096, Duration::from_millis(10));
            }
        }
        assert!(probes <= 1, "{probes} probes in 400 ms of a lender that costs 10 ms a fetch");
    }

    #[test]
    fn near_equal_costs_do_not_flip_the_route() {
        let r = RouterState::new(Adaptive::new().into());
        // Disk and lenders within a few percent of each other, noisy samples around them:
        // the rule settles on one side and stays there.
        let mut seen = Vec::new();
        for i in 0..2000u64 {
            let jitter = (i * 37 % 11) as u64;
            r.disk_read(4096, false, Duration::from_micros(95 + jitter));
            r.remote_fetch(4096, Duration::from_micros(95 + (10 - jitter)));
            if i > 200 {
                let d = r.decide(&id(3), (i * 13 % 997) << 20, 4096);
                seen.push(d.chosen());
            }
        }
        let e = r.estimates().unwrap();
        assert!(e.switches <= 2, "the route flipped {} times: {e:?}", e.switches);
        assert!(seen.windows(2).filter(|w| w[0] != w[1]).count() <= 1);
    }

    #[test]
    fn a_disk_that_is_never_read_is_probed_rarely() {
        let r = RouterState::new(Adaptive::new().into());
        // A slow disk and fast lenders: every read goes to the lenders, the disk is probed
        // at most once per DISK_PROBE_INTERVAL.
        r.disk_read(4096, false, Duration::from_millis(5));
        for _ in 0..20 {
            r.remote_fetch(4096, Duration::from_micros(100));
        }
        let t = Instant::now();
        let (mut probes, mut reads) = (0, 0u64);
        while t.elapsed() < DISK_PROBE_INTERVAL * 2 + DISK_PROBE_INTERVAL / 2 {
            let d = r.decide(&id(4), (reads * 7 % 1000) << 20, 4096);
            reads += 1;
            assert_eq!(d.chosen(), Route::Remote);
            if d.probe {
                assert_eq!(d.route, Route::Disk);
                probes += 1;
            }
        }
        assert!((1..=3).contains(&probes), "{probes} disk probes in {reads} reads");
        assert_eq!(r.estimates().unwrap().disk_probes, probes);
    }
}
