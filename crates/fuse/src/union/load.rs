//! How busy each branch's device is: the growth of its *io_ticks* (field 13 of
//! /proc/diskstats: milliseconds during which the device had I/O in flight) over a window,
//! as a fraction of the window. A branch whose file system has no block device (tmpfs, a
//! network file system) reads as idle. A device throttled by a cgroup (`io.max`) or a
//! delayed loop device shows the throttling as busy time only for the requests dispatched
//! to it (docs/SEMANTICS.md, "Several backing directories", says what was checked).
//!
//! `farcache balance` samples two readings `window` apart; `create_policy = "least-busy"`
//! uses the growth since the previous reading (taken at most once a second, on a create).

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Branch;

/// Reads closer than this reuse the previous answer (`least-busy` on every create).
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// io_ticks of the device `dev` (`st_dev` of a file system on it), or `None` if it has none
/// in /proc/diskstats.
pub(crate) fn io_ticks(diskstats: &str, dev: u64) -> Option<u64> {
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    diskstats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 12 && f[0].parse::<u32>().ok()? == maj && f[1].parse::<u32>().ok()? == min)
            .then(|| f[12].parse().ok())
            .flatten()
    })
}

fn read_diskstats() -> String {
    std::fs::read_to_string("/proc/diskstats").unwrap_or_default()
}

/// Each branch's io_ticks now (0 for branches without a device).
pub(crate) fn ticks_now(branches: &[Branch]) -> Vec<u64> {
    let s = read_diskstats();
    branches.iter().map(|b| io_ticks(&s, b.dev).unwrap_or(0)).collect()
}

/// Busy per mille of each branch between two readings `elapsed` apart.
pub(crate) fn busy_between(before: &[u64], after: &[u64], elapsed: Duration) -> Vec<u32> {
    let ms = elapsed.as_millis().max(1) as u64;
    before.iter().zip(after).map(|(b, a)| (a.saturating_sub(*b) * 1000 / ms).min(1000) as u32).collect()
}

/// A reading: when, each branch's io_ticks, and the busy per mille it gave.
type Reading = (Instant, Vec<u64>, Vec<u32>);

/// The last reading, for `least-busy` placement.
#[derive(Default)]
pub(crate) struct LoadSampler {
    last: Mutex<Option<Reading>>,
}

impl LoadSampler {
    /// Busy per mille of each branch since the previous reading.
    pub(crate) fn busy(&self, branches: &[Branch]) -> Vec<u32> {
        let mut last = self.last.lock();
        let now = Instant::now();
        match last.as_ref() {
            Some((t, _, busy)) if now.duration_since(*t) < MIN_INTERVAL => busy.clone(),
            Some((t, ticks, _)) => {
                let after = ticks_now(branches);
                let busy = busy_between(ticks, &after, now.duration_since(*t));
                *last = Some((now, after, busy.clone()));
                busy
            }
            None => {
                let after = ticks_now(branches);
                let busy = vec![0; branches.len()];
                *last = Some((now, after, busy.clone()));
                busy
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_ticks_are_field_13_of_the_devices_line() {
        let s = "   7       0 loop0 10 0 80 5 20 0 160 9 0 1234 14 0 0 0 0\n 253       0 vda 1 2 3 4 5 6 7 8 0 99 9\n";
        assert_eq!(io_ticks(s, libc::makedev(7, 0)), Some(1234));
        assert_eq!(io_ticks(s, libc::makedev(253, 0)), Some(99));
        assert_eq!(io_ticks(s, libc::makedev(8, 0)), None);
        assert_eq!(busy_between(&[100, 5], &[600, 5], Duration::from_secs(1)), vec![500, 0]);
        assert_eq!(busy_between(&[0], &[5000], Duration::from_secs(1)), vec![1000]);
    }
}
