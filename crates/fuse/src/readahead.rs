//! `mount.read_ahead`: the kernel's readahead window for the mount.
//!
//! A FUSE super block gets its own backing device info (`/sys/class/bdi/MAJOR:MINOR`, the
//! mount's `st_dev`), whose readahead starts at the kernel's default, 128 KiB, and which the
//! INIT reply may only lower. So a sequential reader's pages reach the daemon as 128 KiB
//! requests, a round trip each, although a request may carry 1 MiB (`max_pages` 256, which
//! the INIT reply asks for). The window is raised through sysfs once INIT is done (before,
//! the INIT reply would lower it again) — which needs root; without it the mount serves on
//! at the kernel's default and says so once. Files opened before the change keep the window
//! they were opened with (the kernel copies it at open), so it is set before anything is
//! served: after the INIT handshake, before the session's loops start.
//!
//! The window is also what the kernel reads around a random read that lands beside cached
//! pages (it takes them for a stream's history: `page_cache_sync_ra`), so random readers
//! that touch neighbouring pages — a database's index lookups — reach the daemon as reads of
//! up to the window. The default stays 1 MiB: 512 KiB cost streams 16–28% on a fast disk
//! for a gain in tpch's lookups that three rounds did not confirm (BENCHMARKS.md, "Session
//! 33: the readahead window and random lookups").

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;

/// The window asked for and what came of it; shared with the stats.
#[derive(Debug)]
pub struct ReadAhead {
    dev: u64,
    /// KiB; 0 leaves the kernel's.
    want_kb: u64,
    /// Why the window is not `want_kb` ("" when it is, or was never asked for).
    problem: Mutex<String>,
}

impl ReadAhead {
    pub(crate) fn new(dev: u64, want_bytes: u64) -> Arc<ReadAhead> {
        Arc::new(ReadAhead { dev, want_kb: want_bytes / 1024, problem: Mutex::new(String::new()) })
    }

    /// `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb` of the mount.
    pub fn sysfs_path(&self) -> PathBuf {
        PathBuf::from(format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(self.dev), libc::minor(self.dev)))
    }

    /// The window in effect now, in KiB (None where sysfs cannot be read).
    pub fn current_kb(&self) -> Option<u64> {
        std::fs::read_to_string(self.sysfs_path()).ok()?.trim().parse().ok()
    }

    /// The window asked for, in KiB (0: the kernel's left alone).
    pub fn wanted_kb(&self) -> u64 {
        self.want_kb
    }

    /// Why the window is not the one asked for ("" when it is).
    pub fn problem(&self) -> String {
        self.problem.lock().clone()
    }

    /// Set the window now, if one was asked for. Called before the session serves: INIT is
    /// done by then (a new connection's handshake happens in `Session::new`, and a
    /// connection taken over was initialized by the earlier daemon), so nothing lowers it
    /// again, and a new mount has no file opened under the old window. Writing sysfs, not asking
    /// the mount: a `stat` of the mount point from here (session 21's way of waiting for
    /// INIT) could still be in flight when the mount was unmounted, which then failed with
    /// EBUSY.
    pub(crate) fn apply_if_wanted(&self) {
        if self.want_kb > 0 {
            self.apply();
        }
    }

    /// Write the window now and check it reads back.
    pub(crate) fn apply(&self) {
        let path = self.sysfs_path();
        if let Err(e) = std::fs::write(&path, format!("{}\n", self.want_kb)) {
            let fix = if e.kind() == std::io::ErrorKind::PermissionDenied {
                "run the mount as root, or set mount.read_ahead = \"0\" to keep the kernel's"
            } else {
                "set mount.read_ahead = \"0\" to keep the kernel's"
            };
            return self.failed(format!("cannot write {} ({e}); fix: {fix}", path.display()));
        }
        match self.current_kb() {
            Some(kb) if kb == self.want_kb => {
                *self.problem.lock() = String::new();
                tracing::info!("readahead of the mount: {} KiB a window ({})", kb, path.display());
            }
            got => self.failed(format!("wrote {} KiB to {}, it reads back {:?}", self.want_kb, path.display(), got)),
        }
    }

    fn failed(&self, why: String) {
        tracing::warn!(
            "mount.read_ahead: {why}; sequential reads reach the daemon in the kernel's default windows (128 KiB), \
             a round trip each"
        );
        *self.problem.lock() = why;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_the_mounts_bdi_in_kib() {
        let r = ReadAhead::new(libc::makedev(0, 53), 1 << 20);
        assert_eq!(r.sysfs_path(), PathBuf::from("/sys/class/bdi/0:53/read_ahead_kb"));
        assert_eq!(r.wanted_kb(), 1024);
        assert_eq!(r.problem(), "");
    }

    #[test]
    fn a_window_that_cannot_be_written_is_a_problem_that_names_the_key() {
        // No bdi has this number: the write fails like a missing permission would, loudly.
        let r = ReadAhead::new(libc::makedev(0, 1_000_000), 1 << 20);
        r.apply();
        let p = r.problem();
        assert!(p.contains("cannot write /sys/class/bdi/0:1000000/read_ahead_kb"), "{p}");
        assert!(p.contains("mount.read_ahead"), "{p}");
    }
}
