//! Requests by FUSE opcode: one relaxed atomic addition per request, on the serving thread,
//! before the request is dispatched (the vendored fuser's `Filesystem::request_received`).
//! What `farcache stats` shows as `fuse.ops` and the metrics endpoint as
//! `farcache_mount_fuse_requests_total{op=...}`: the way to see which round trips a load
//! costs (a GETATTR after every write, a GETXATTR before one) without tracing the kernel.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Opcodes up to this one have a slot of their own (FUSE_COPY_FILE_RANGE is 47; the kernel's
/// later ones — SETUPMAPPING 48, REMOVEMAPPING 49, SYNCFS 50, TMPFILE 51, STATX 52 — are
/// named too, should a kernel send them); any other is counted as `other`.
const SLOTS: usize = 53;

/// Each opcode's name, by opcode (`""`: none).
const NAMES: [&str; SLOTS] = [
    "",
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "symlink",
    "",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "statfs",
    "release",
    "",
    "fsync",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "flush",
    "init",
    "opendir",
    "readdir",
    "releasedir",
    "fsyncdir",
    "getlk",
    "setlk",
    "setlkw",
    "access",
    "create",
    "interrupt",
    "bmap",
    "destroy",
    "ioctl",
    "poll",
    "notify_reply",
    "batch_forget",
    "fallocate",
    "readdirplus",
    "rename2",
    "lseek",
    "copy_file_range",
    "setupmapping",
    "removemapping",
    "syncfs",
    "tmpfile",
    "statx",
];

/// Requests received, by opcode. Shared between the file system (which counts) and the
/// mount's stats (which read).
#[derive(Debug)]
pub struct OpCounts {
    by_opcode: [AtomicU64; SLOTS],
    other: AtomicU64,
}

impl Default for OpCounts {
    fn default() -> Self {
        OpCounts { by_opcode: std::array::from_fn(|_| AtomicU64::new(0)), other: AtomicU64::new(0) }
    }
}

impl OpCounts {
    /// One request with this raw opcode was received.
    pub fn count(&self, opcode: u32) {
        match self.by_opcode.get(opcode as usize) {
            Some(c) if !NAMES[opcode as usize].is_empty() => c.fetch_add(1, Ordering::Relaxed),
            _ => self.other.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Every named opcode (zero or not, so the set of names never changes) and `other`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = NAMES
            .iter()
            .zip(&self.by_opcode)
            .filter(|(n, _)| !n.is_empty())
            .map(|(n, c)| (n.to_string(), c.load(Ordering::Relaxed)))
            .collect();
        m.insert("other".into(), self.other.load(Ordering::Relaxed));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_kernel_opcodes() {
        // Spot checks against include/uapi/linux/fuse.h.
        assert_eq!(NAMES[3], "getattr");
        assert_eq!(NAMES[16], "write");
        assert_eq!(NAMES[20], "fsync");
        assert_eq!(NAMES[22], "getxattr");
        assert_eq!(NAMES[36], "interrupt");
        assert_eq!(NAMES[44], "readdirplus");
        assert_eq!(NAMES[46], "lseek");
        assert_eq!(NAMES[52], "statx");
    }

    #[test]
    fn counts_by_opcode_and_unknown_as_other() {
        let c = OpCounts::default();
        c.count(3);
        c.count(3);
        c.count(16);
        c.count(7); // no such opcode
        c.count(4096); // CUSE_INIT
        let s = c.snapshot();
        assert_eq!(s["getattr"], 2);
        assert_eq!(s["write"], 1);
        assert_eq!(s["other"], 2);
        assert_eq!(s["lseek"], 0);
        assert_eq!(s.values().sum::<u64>(), 5);
        assert_eq!(s.len(), NAMES.iter().filter(|n| !n.is_empty()).count() + 1);
    }
}
