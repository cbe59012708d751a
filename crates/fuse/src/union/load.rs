//! How busy each branch is, per mille of a window, as the larger of two measures:
//! - the device's: the growth of its *io_ticks* (field 13 of /proc/diskstats: milliseconds
//!   during which the device had I/O in flight). A branch whose file system has no block
//!   device (tmpfs, a network file system) has none.
//! - the daemon's own: the time its reads and writes of files on the branch took (summed
//!   over threads, so it can pass the window; capped at 1000).
//!
//! Checked on this machine: a loop device throttled by blkio (what `farcache bench paper`
//! builds) shows almost nothing in io_ticks — 300 reads held to 100 IOPS took 2.9 s and
//! moved io_ticks by 4 ms — because requests wait in the throttle before they are
//! dispatched; the daemon's time shows the wait. A real busy disk shows in both.
//!
//! `farcache balance` samples two readings `window` apart; `create_policy = "least-busy"`
//! uses the growth since the previous reading (taken at most once a second, on a create).

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

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

/// One reading of a branch: its device's io_ticks (ms; 0 without a device) and the
/// daemon's time in its I/O (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ticks {
    pub(crate) device_ms: u64,
    pub(crate) daemon_ns: u64,
}

/// Each branch's reading now.
pub(crate) fn ticks_now(branches: &[Branch], daemon_ns: &[AtomicU64]) -> Vec<Ticks> {
    let s = read_diskstats();
    branches
        .iter()
        .enumerate()
        .map(|(i, b)| Ticks {
            device_ms: io_ticks(&s, b.dev).unwrap_or(0),
            daemon_ns: daemon_ns.get(i).map_or(0, |c| c.load(Ordering::Relaxed)),
        })
        .collect()
}

/// Busy per mille of each branch between two readings `elapsed` apart.
pub(crate) fn busy_between(before: &[Ticks], after: &[Ticks], elapsed: Duration) -> Vec<u32> {
    let ms = elapsed.as_millis().max(1) as u64;
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let device = a.device_ms.saturating_sub(b.device_ms) * 1000 / ms;
            let daemon = a.daemon_ns.saturating_sub(b.daemon_ns) / 1000 / ms;
            device.max(daemon).min(1000) as u32
        })
        .collect()
}

/// A reading: when, each branch's io_ticks, and the busy per mille it gave.
type Reading = (Instant, Vec<Ticks>, Vec<u32>);

/// The last reading, for `least-busy` placement.
#[derive(Default)]
pub(crate) struct LoadSampler {
    last: Mutex<Option<Reading>>,
}

impl LoadSampler {
    /// Busy per mille of each branch since the previous reading.
    pub(crate) fn busy(&self, branches: &[Branch], daemon_ns: &[AtomicU64]) -> Vec<u32> {
        let mut last = self.last.lock();
        let now = Instant::now();
        match last.as_ref() {
            Some((t, _, busy)) if now.duration_since(*t) < MIN_INTERVAL => busy.clone(),
            Some((t, ticks, _)) => {
                let after = ticks_now(branches, daemon_ns);
                let busy = busy_between(ticks, &after, now.duration_since(*t));
                *last = Some((now, after, busy.clone()));
                busy
            }
            None => {
                let after = ticks_now(branches, daemon_ns);
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
        let t = |device_ms, daemon_ns| Ticks { device_ms, daemon_ns };
        let s = Duration::from_secs(1);
        assert_eq!(busy_between(&[t(100, 0), t(5, 0)], &[t(600, 0), t(5, 0)], s), vec![500, 0]);
        assert_eq!(busy_between(&[t(0, 0)], &[t(5000, 0)], s), vec![1000], "capped");
        // The daemon's own time counts when the device shows none (a throttled loop device).
        assert_eq!(busy_between(&[t(10, 0)], &[t(14, 700_000_000)], s), vec![700]);
    }
}
