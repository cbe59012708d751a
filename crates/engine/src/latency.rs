//! [`Latency`]: a latency histogram the data path can record into for the price of a clock
//! read and two relaxed atomic additions — no lock, no allocation — so that a metrics scrape
//! can show how long lender fetches, fills and disk reads and writes take.
//!
//! The buckets are fixed ([`BOUNDS_US`], in microseconds), wide enough apart to tell a
//! loopback lender (tens of µs), a local disk (hundreds of µs), a throttled cloud volume
//! (milliseconds) and a lender timing out (`cache.fetch_timeout`, 50 ms) from each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the buckets, in µs; one more bucket holds everything above the last.
pub const BOUNDS_US: [u64; 15] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];
/// Buckets: one per bound, plus the overflow.
pub const BUCKETS: usize = BOUNDS_US.len() + 1;
const _: () = {
    let mut i = 1;
    while i < BOUNDS_US.len() {
        assert!(BOUNDS_US[i - 1] < BOUNDS_US[i], "bounds must grow");
        i += 1;
    }
};

/// A histogram of durations, recorded from any thread.
#[derive(Debug, Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl Latency {
    /// Count one duration.
    pub fn record(&self, took: Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        let i = BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(BOUNDS_US.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let buckets = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        LatencySnapshot { count: buckets.iter().sum(), sum_us: self.sum_us.load(Ordering::Relaxed), buckets }
    }
}

/// A point-in-time copy of a [`Latency`]: `buckets[i]` counts durations up to
/// `BOUNDS_US[i]` µs and above the bound before it (not cumulative); the last counts those
/// above every bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencySnapshot {
    pub count: u64,
    pub sum_us: u64,
    pub buckets: [u64; BUCKETS],
}

impl LatencySnapshot {
    /// Each bucket's upper bound in seconds (`+Inf` last) and its own count, not
    /// cumulative: what `prometheus-client`'s encoder takes (it accumulates them).
    pub fn buckets_seconds(&self) -> [(f64, u64); BUCKETS] {
        std::array::from_fn(|i| (BOUNDS_US.get(i).map_or(f64::INFINITY, |&b| b as f64 / 1e6), self.buckets[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_into_the_right_bucket_and_sums() {
        let l = Latency::default();
        l.record(Duration::from_micros(10));
        l.record(Duration::from_micros(11));
        l.record(Duration::from_millis(3));
        l.record(Duration::from_secs(5));
        let s = l.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.sum_us, 10 + 11 + 3_000 + 5_000_000);
        assert_eq!((s.buckets[0], s.buckets[1], s.buckets[8], s.buckets[BUCKETS - 1]), (1, 1, 1, 1));
        let c = s.buckets_seconds();
        assert_eq!((c[0], c[1], c[2]), ((0.00001, 1), (0.000025, 1), (0.00005, 0)));
        assert_eq!(c[8], (0.005, 1));
        assert_eq!(c[BUCKETS - 1], (f64::INFINITY, 1));
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<LatencySnapshot>(&json).unwrap(), s);
    }
}
