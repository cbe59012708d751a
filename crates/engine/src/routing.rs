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
//! A rule that sends everything to the disk stops measuring the lenders, so a lender that
//! recovered would never be tried again: one read in [`PROBE_EVERY`] that the adaptive rule
//! sends to the disk is sent to the lenders instead, when they hold all its blocks, to
//! measure them afresh.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use farcache_policy::route::{Adaptive, Route, Stream, Threshold};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::identity::FileId;

/// Slots of the per-file stream table.
pub const STREAM_SLOTS: usize = 512;
/// One in this many reads the adaptive rule sends to the disk goes to the lenders instead
/// (when they hold its blocks), to keep measuring them.
pub const PROBE_EVERY: u64 = 64;
const _: () = assert!(STREAM_SLOTS.is_power_of_two() && PROBE_EVERY > 1);

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
}

/// One read's route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    pub route: Route,
    /// Decided by the adaptive rule (else by the threshold).
    pub adaptive: bool,
    /// The read continues its file's stream (adaptive rule only; `false` otherwise).
    pub sequential: bool,
    /// The rule said disk, but the read goes to the lenders to measure them (only if they
    /// hold all of its blocks; `route` is `Remote`).
    pub probe: bool,
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
    /// Reads the rule sent to the disk, for probing.
    disk_decisions: AtomicU64,
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
                disk_decisions: AtomicU64::new(0),
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
                let route = m.model.lock().route(len, sequential);
                let probe = route == Route::Disk
                    && m.disk_decisions.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == PROBE_EVERY - 1;
                Decision { route: if probe { Route::Remote } else { route }, adaptive: true, sequential, probe }
            }
        }
    }

    /// A disk read of `len` bytes took `took`.
    pub fn disk_read(&self, len: u64, sequential: bool, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.model.lock().observe_disk(len, sequential, took.as_secs_f64() * 1e6);
            m.disk_samples.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A fetch of `len` bytes from the lenders took `took`.
    pub fn remote_fetch(&self, len: u64, took: Duration) {
        if let RouterState::Adaptive(m) = self {
            m.model.lock().observe_remote(len, took.as_secs_f64() * 1e6);
            m.remote_samples.fetch_add(1, Ordering::Relaxed);
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
    fn adaptive_rule_learns_and_probes() {
        let r = RouterState::new(Adaptive::new().into());
        assert_eq!(r.mode(), "adaptive");
        assert_eq!(r.threshold_bytes(), 0);
        // A hung lender and a fast disk: reads go to the disk, one in PROBE_EVERY probes.
        r.remote_fetch(4096, Duration::from_millis(50));
        r.disk_read(4096, false, Duration::from_micros(200));
        let mut probes = 0;
        for i in 0..4 * PROBE_EVERY {
            let d = r.decide(&id(1), (i * 7 % 1000) * (1 << 20), 4096);
            assert!(d.adaptive && !d.sequential);
            if d.probe {
                assert_eq!(d.route, Route::Remote);
                probes += 1;
            } else {
                assert_eq!(d.route, Route::Disk);
            }
        }
        assert_eq!(probes, 4);
        let e = r.estimates().unwrap();
        assert_eq!((e.disk_samples, e.remote_samples), (1, 1));
        assert!(e.remote_access_us > 40_000.0 && e.disk_access_us < 200.0, "{e:?}");
        // Sequential reads are recognised per file.
        assert!(!r.decide(&id(2), 0, 65536).sequential);
        assert!(r.decide(&id(2), 65536, 65536).sequential);
    }
}
