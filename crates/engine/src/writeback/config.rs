//! `[tier]`: the persistent write-back tier (`farcache mount --tier PATH --tier-size SIZE`).
//! Every default is written out in [`TEMPLATE`]; a test keeps the two in step.

use farcache_config::{ByteSize, ConfigError, HumanDuration};
use serde::{Deserialize, Serialize};

/// The `[tier]` table with every default, as it belongs in etc/farcache.toml.
pub const TEMPLATE: &str = r#"[tier]
# The write-back tier's medium: a file (created if missing) or a block device on fast local
# storage. "" for none: every write goes through to the backing directory before it is
# acknowledged. With a tier, a write is acknowledged once it is in the tier (durable there
# as `commit` says), and the tier writes it back ("destages" it) later. The mode follows
# from what the path is: a file on tmpfs is "dram" (survives the daemon, NOT a power cut), a
# file on a disk file system or a block device is "ssd" (fdatasync), a file on a DAX file
# system is "pmem".
path = ""
# Bytes of the medium the tier uses (a file is created and preallocated with this size).
size = "1GiB"
# "auto" (from the path, as above), or force "dram", "ssd" or "pmem".
mode = "auto"
# When an ssd tier's writes become durable (docs/SEMANTICS.md, "The write-back tier").
# "fsync": as on a local file system — a write is in the tier when acknowledged (it survives
# the daemon: a SIGKILL, a crash), and survives a power cut once the application asks:
# fsync or fdatasync (of any file on the mount), a write with O_SYNC or O_DSYNC; at the
# latest commit_interval later, or once max_unflushed bytes wait. Its writes go through the
# page cache: an unsynced write costs a copy, as written through to the backing file it would.
# "write": every write is durable in the tier before it is acknowledged (O_DIRECT and
# fdatasync: each small write without an fsync pays a device flush; fsync then costs
# nothing more). dram and pmem tiers ignore it (their flush costs nothing, or a fence).
commit = "fsync"
# With commit = "fsync": the longest a write stays acknowledged but not durable against a
# power cut, and the most bytes that may.
commit_interval = "1s"
max_unflushed = "64MiB"
# An ssd tier: a write that continues a sequential run of at least this many bytes, written
# to one file since its last sync, goes straight to the backing store, as without a tier
# (unless it overwrites blocks dirty in the tier): the tier would copy a long stream, write it
# and read it back to write it to the disk again (bcache's sequential_cutoff). A writer that
# syncs often (a database's log) keeps the tier. "0": every write to the tier. dram and pmem
# tiers take every write (memory takes a stream faster than the disk).
sequential_cutoff = "4MiB"
# Destaging starts when this share of the tier is used, in percent, and stops at
# low_watermark (dm-writecache's defaults).
high_watermark = 50
low_watermark = 45
# A block is destaged at the latest this long after it was written.
max_dirty_age = "30s"
# Destage whatever is dirty past this many bytes, whatever the watermarks say.
max_dirty_bytes = "4GiB"
# How often the destager looks at the tier when nobody wakes it.
destage_interval = "100ms"
# Once the mount has seen no reads or writes for this long, destage everything: an idle
# backing store takes the write-back at no one's expense. "0s": only by the rules above.
idle_destage_after = "2s"
# Largest single write a destage round merges neighbouring dirty blocks into. A write-back
# holds at most eight of these in memory (two batches of four: one written, one filled).
destage_write = "1MiB"
# After a destage error (the backing refused a write or a sync): retry after retry_min,
# doubling up to retry_max. The data stays dirty in the tier meanwhile.
retry_min = "100ms"
retry_max = "30s"
# A destage round that has waited this long on the backing store (a write or a sync that
# does not complete: a hung disk, a dead NFS server) is reported stalled: logged (again every
# stall_warning while it lasts), counted, and shown in `farcache stats`. The data stays dirty
# in the tier meanwhile; nothing is lost or given up.
stall_warning = "30s"
# The most descriptors of backing files the tier keeps open while idle (it holds one while it
# merges a partial write into a file or writes the file back, and opens an idle file again by
# its handle when it needs it). 0: a quarter of the daemon's descriptor limit (LimitNOFILE's
# soft limit at start), from 64 to 65536, so that many dirty files never run it out of them.
max_open_files = 0
"#;

/// `mode`: what kind of medium the tier is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierMode {
    #[default]
    Auto,
    Dram,
    Ssd,
    Pmem,
}

/// `commit`: when an ssd tier's writes become durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierCommit {
    /// At fsync, fdatasync, an O_SYNC/O_DSYNC write, `commit_interval`, `max_unflushed`.
    #[default]
    Fsync,
    /// Before each write is acknowledged.
    Write,
}

/// `[tier]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TierConfig {
    pub path: String,
    pub size: ByteSize,
    pub mode: TierMode,
    pub commit: TierCommit,
    pub commit_interval: HumanDuration,
    pub max_unflushed: ByteSize,
    pub sequential_cutoff: ByteSize,
    pub high_watermark: u32,
    pub low_watermark: u32,
    pub max_dirty_age: HumanDuration,
    pub max_dirty_bytes: ByteSize,
    pub destage_interval: HumanDuration,
    pub idle_destage_after: HumanDuration,
    pub destage_write: ByteSize,
    pub retry_min: HumanDuration,
    pub retry_max: HumanDuration,
    pub stall_warning: HumanDuration,
    pub max_open_files: u64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            path: String::new(),
            size: ByteSize::gib(1),
            mode: TierMode::Auto,
            commit: TierCommit::Fsync,
            commit_interval: HumanDuration::secs(1),
            max_unflushed: ByteSize::mib(64),
            sequential_cutoff: ByteSize::mib(4),
            high_watermark: 50,
            low_watermark: 45,
            max_dirty_age: HumanDuration::secs(30),
            max_dirty_bytes: ByteSize::gib(4),
            destage_interval: HumanDuration::ms(100),
            idle_destage_after: HumanDuration::secs(2),
            destage_write: ByteSize::mib(1),
            retry_min: HumanDuration::ms(100),
            retry_max: HumanDuration::secs(30),
            stall_warning: HumanDuration::secs(30),
            max_open_files: 0,
        }
    }
}

/// Smallest tier.
pub const MIN_SIZE_BYTES: u64 = 1 << 20;

impl TierConfig {
    pub fn enabled(&self) -> bool {
        !self.path.is_empty()
    }

    /// Refuse values that cannot work, naming the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.size.bytes() < MIN_SIZE_BYTES {
            return Err(ConfigError::invalid("tier.size", format!("{} is too small", self.size), "set at least 1MiB"));
        }
        if !(1..=95).contains(&self.high_watermark) {
            return Err(ConfigError::invalid(
                "tier.high_watermark",
                format!("{} is out of range", self.high_watermark),
                "set 1 to 95 (percent)",
            ));
        }
        if self.low_watermark >= self.high_watermark {
            return Err(ConfigError::invalid(
                "tier.low_watermark",
                format!("{} is not below high_watermark ({})", self.low_watermark, self.high_watermark),
                "set it below tier.high_watermark",
            ));
        }
        if self.commit_interval.get().is_zero() || self.commit_interval.get() > std::time::Duration::from_secs(60) {
            return Err(ConfigError::invalid(
                "tier.commit_interval",
                format!("{} is out of range", self.commit_interval),
                "set 1ms to 60s (or commit = \"write\" for every write durable when acknowledged)",
            ));
        }
        let u = self.max_unflushed.bytes();
        if !((8 << 20)..=(4 << 30)).contains(&u) {
            return Err(ConfigError::invalid(
                "tier.max_unflushed",
                format!("{} is out of range", self.max_unflushed),
                "set 8MiB (the largest group commit) to 4GiB",
            ));
        }
        if self.max_dirty_bytes.bytes() < 4096 {
            return Err(ConfigError::invalid("tier.max_dirty_bytes", "below one block", "set at least 4KiB"));
        }
        let w = self.destage_write.bytes();
        if !(4096..=(64 << 20)).contains(&w) || !w.is_multiple_of(4096) {
            return Err(ConfigError::invalid(
                "tier.destage_write",
                format!("{} is not a multiple of 4KiB from 4KiB to 64MiB", self.destage_write),
                "set e.g. 1MiB",
            ));
        }
        if self.destage_interval.get().is_zero() || self.retry_min.get().is_zero() {
            return Err(ConfigError::invalid("tier.destage_interval", "zero spins the destager", "set at least 1ms"));
        }
        if self.retry_max.get() < self.retry_min.get() {
            return Err(ConfigError::invalid("tier.retry_max", "below tier.retry_min", "set it at least as long"));
        }
        if self.stall_warning.get() < std::time::Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "tier.stall_warning",
                format!("{} is below 1s", self.stall_warning),
                "set at least 1s (a destage round of a few hundred ms is normal work)",
            ));
        }
        if self.max_open_files > (1 << 20) {
            return Err(ConfigError::invalid(
                "tier.max_open_files",
                format!("{} is above 1048576", self.max_open_files),
                "set 0 (a quarter of the descriptor limit) or at most 1048576",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        tier: TierConfig,
    }

    #[test]
    fn template_is_the_defaults_and_mentions_every_key() {
        let keys = farcache_config::check_template::<TierConfig>("tier", TEMPLATE).unwrap();
        assert!(!keys.is_empty());
        TierConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let c = TierConfig { low_watermark: 50, ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.low_watermark"));
        let c = TierConfig { size: ByteSize(4096), ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.size"));
        let c = TierConfig { destage_write: ByteSize(5000), ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.destage_write"));
        let c = TierConfig { commit_interval: HumanDuration::ms(0), ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.commit_interval"));
        let c = TierConfig { max_unflushed: ByteSize::mib(1), ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.max_unflushed"));
        let c = TierConfig { stall_warning: HumanDuration::ms(500), ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.stall_warning"));
        let c = TierConfig { max_open_files: 1 << 30, ..TierConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("tier.max_open_files"));
        let f: File = toml::from_str("[tier]\ncommit = \"write\"").unwrap();
        assert_eq!(f.tier.commit, TierCommit::Write);
        assert!(toml::from_str::<File>("[tier]\ncommit = \"sometimes\"").is_err());
        let f: File = toml::from_str("[tier]\nmode = \"ssd\"").unwrap();
        assert_eq!(f.tier.mode, TierMode::Ssd);
        assert!(toml::from_str::<File>("[tier]\nmode = \"nvme\"").is_err());
    }
}
