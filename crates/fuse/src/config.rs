//! `[mount]`: how `farcache mount` serves the backing directory. Every default is written
//! out in [`TEMPLATE`]; a test keeps the two in step.

use farcache_config::{ConfigError, HumanDuration};
use farcache_engine::io::{IoEngineKind, IoOptions};
use serde::{Deserialize, Serialize};

/// The `[mount]` table with every default, as it belongs in etc/farcache.toml.
pub const TEMPLATE: &str = r#"[mount]
# Backing directories, when the command line names none (`farcache mount MOUNTPOINT`): one
# string ("/srv/a", or "/srv/a:/srv/b" in mergerfs's notation) or a list of directories.
# With several (branches, each on its own file system), every regular file lives on exactly
# one of them and `farcache balance` moves hot files off a busy one (docs/SEMANTICS.md,
# "Several backing directories").
backing = []
# Where a new file (or symlink, fifo...) of a mount of several branches goes, among the
# branches where its directory exists: "most-free" (most available bytes), "least-busy"
# (least device busy time lately, then most free) or "first" (the first in order).
create_policy = "most-free"
# Threads serving FUSE requests, each with its own /dev/fuse descriptor: as many requests as
# there are threads reach the backing I/O engine at once (an application's queue depth of 32
# needs 32). Each thread keeps a request buffer of up to max_write once it served a write;
# under --supervise it has it from the start, locked in memory (docs/SEMANTICS.md).
threads = 32
# How long the kernel may trust attributes and names without asking again. The backing
# directory belongs to the mount while it is mounted: changes made behind its back may be
# seen this late.
attr_timeout = "1s"
entry_timeout = "1s"
# Keep the kernel's page cache of a file across opens (the local cache farcache sits under).
# Off: every open drops the file's cached pages (slower; sees changes made behind the mount).
keep_cache = true
# Read backing files with O_DIRECT where the file system supports it, so the daemon's reads
# do not fill the page cache a second time (and a slow disk stays slow).
direct_io_backing = true
# With direct_io_backing: write backing files with O_DIRECT too where a write is aligned (the
# others buffered), so a page written through the mount is cached once — in the kernel's page
# cache above the mount — rather than a second time in the backing file's, which the
# daemon's direct reads never use and the daemon's memory cgroup pays for. Each aligned write
# then waits for the device, as it would for an application's O_DIRECT write.
direct_io_backing_writes = false
# Backing I/O engine: "uring" (io_uring, where the kernel offers it; else the synchronous
# path, counted in `farcache stats` as backing.io.fallback_no_uring) or "sync" (one blocking
# system call per operation on the FUSE thread).
io_engine = "uring"
# Most backing operations one caller has in flight at once (each io_uring ring's size).
io_queue_depth = 32
# Most backing operations in flight across the mount at once; callers beyond it wait.
io_max_in_flight = 256
# How the kernel's FUSE requests reach the daemon: "off" (read loops on /dev/fuse, one per
# thread), "auto" (FUSE-over-io_uring where the kernel offers it — Linux 6.14+ with
# /sys/module/fuse/parameters/enable_uring on — else read loops; the log and `farcache stats`
# say which) or "on" (refuse to start without it). Not with --supervise or --takeover: a
# request in flight on a ring cannot be handed to another daemon (ARCHITECTURE.md, "The FUSE
# transport").
fuse_uring = "off"
# Ring entries per queue with FUSE-over-io_uring (one queue per possible CPU, one serving
# thread per entry, each with a payload buffer of max_write): requests served at once per CPU.
fuse_uring_queue_depth = 16
# Let other users use the mount (only when run as root; the kernel still checks permissions).
allow_other = true
# Offer READDIRPLUS (names and attributes in one reply) for large directories.
readdirplus = true
# The kernel's write-back cache (FUSE_WRITEBACK_CACHE): write() returns once the data is in
# the page cache, and the kernel sends it on later in large requests (at fsync, close, or
# when it writes dirty pages back) — as a local file system does. Much faster small writes,
# the same durability contract as a disk (only fsync makes data durable), but: a daemon that
# crashes without --supervise loses what was written and not yet sent, and the kernel keeps
# the file size it knows, so changes behind the mount are seen later still
# (docs/SEMANTICS.md, "The kernel's write-back cache").
writeback_cache = false
# Extended attributes through the mount (getxattr, setxattr, listxattr, removexattr; ACLs).
# Off: they are answered "not supported", and the kernel stops asking — including the
# security.capability lookup it makes before every write(2) to a FUSE file (one extra FUSE
# round trip per write: BENCHMARKS.md, "Nothing gets slower", session 11). For a database
# that uses no xattrs or ACLs, off is the faster write path.
xattrs = true
# The daemon drops a written or truncated file's set-user-ID/set-group-ID bits and
# capabilities itself (FUSE_HANDLE_KILLPRIV_V2), as a local file system does. The kernel then
# stops asking for security.capability before every write(2) — one FUSE round trip per write
# saved, with extended attributes still served (BENCHMARKS.md, "Session 14"). Off: the kernel
# asks before every write, as before.
handle_killpriv = true
# The kernel's FUSE passthrough (Linux 6.9+, root only): an open file's reads, writes and mmap
# go from the kernel straight to the backing file, without a request to this daemon — the
# disk's own speed at any queue depth. Only where every read belongs on the disk anyway: a
# mount with --no-remote, no write-back tier, one backing directory, and no --supervise or
# --takeover (the mount refuses the others by name). Opens, attributes, truncate and fsync
# still reach the daemon; reads and writes are not counted in `farcache stats` (the kernel's
# own counters are the backing device's). Not with writeback_cache.
kernel_passthrough = false
# Requests the kernel may queue in the background (readahead, async reads).
max_background = 64
# Largest write request the kernel sends (at most 1MiB with 4KiB pages).
max_write = "1MiB"
# The kernel's readahead for files read through the mount (the mount's read_ahead_kb in
# /sys/class/bdi, set once the mount is up; needs root). A FUSE mount starts at 128KiB, so a
# sequential reader's pages come as 128KiB requests, each a round trip to the daemon; at
# 1MiB they come as the largest request (max_pages), a round trip per MiB. It is also how
# far the kernel reads around a random read beside cached pages (a database's index
# lookups): "512KiB" read streams 16-28% slower and tpch's lookups 0.96-1.27x as fast
# (BENCHMARKS.md, session 33). Also the window an mmap page fault reads around. "0": leave
# the kernel's (128KiB). At most 16MiB.
read_ahead = "1MiB"
# Backing inodes the kernel may know at once; each holds one open descriptor.
max_inodes = 1000000
# Files and directories open through the mount at once.
max_open_handles = 65536
# On SIGINT/SIGTERM with the mount still in use: detach it at once, then wait this long for
# its users to close their files before exiting anyway.
shutdown_grace = "10s"
# Address to serve Prometheus metrics on (GET /metrics over HTTP: every counter of
# `farcache stats MOUNTPOINT`, latency histograms), e.g. "127.0.0.1:7413". "" for none.
metrics_listen = ""
"#;

/// `[mount]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MountConfig {
    pub backing: Backing,
    pub create_policy: CreatePolicy,
    pub threads: u32,
    pub attr_timeout: HumanDuration,
    pub entry_timeout: HumanDuration,
    pub keep_cache: bool,
    pub direct_io_backing: bool,
    pub direct_io_backing_writes: bool,
    pub io_engine: IoEngineKind,
    pub io_queue_depth: u32,
    pub io_max_in_flight: u32,
    pub fuse_uring: FuseUring,
    pub fuse_uring_queue_depth: u32,
    pub allow_other: bool,
    pub readdirplus: bool,
    pub writeback_cache: bool,
    pub xattrs: bool,
    pub handle_killpriv: bool,
    pub kernel_passthrough: bool,
    pub max_background: u16,
    pub max_write: farcache_config::ByteSize,
    pub read_ahead: farcache_config::ByteSize,
    pub max_inodes: u64,
    pub max_open_handles: u64,
    pub shutdown_grace: HumanDuration,
    /// Address to serve Prometheus metrics on; "" for none.
    pub metrics_listen: String,
}

/// `mount.backing`: one string (branches separated by `:`) or a list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Backing {
    One(String),
    Many(Vec<String>),
}

impl Default for Backing {
    fn default() -> Self {
        Backing::Many(Vec::new())
    }
}

impl Backing {
    /// The branches, in order (empty: none set).
    pub fn dirs(&self) -> Vec<std::path::PathBuf> {
        match self {
            Backing::One(s) => split_branches(s),
            Backing::Many(v) => v.iter().filter(|s| !s.is_empty()).map(std::path::PathBuf::from).collect(),
        }
    }
}

/// `DIR1:DIR2[:...]` (mergerfs's notation) as directories; one directory without a colon.
pub fn split_branches(s: &str) -> Vec<std::path::PathBuf> {
    s.split(':').filter(|p| !p.is_empty()).map(std::path::PathBuf::from).collect()
}

/// `mount.create_policy`: which branch a new file goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CreatePolicy {
    /// The branch with the most available bytes.
    MostFree,
    /// The branch whose device was least busy lately (ties: most free).
    LeastBusy,
    /// The first branch, in order.
    First,
}

/// `mount.fuse_uring`: how requests reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FuseUring {
    /// `/dev/fuse` read loops.
    Off,
    /// FUSE-over-io_uring when the kernel offers it, else read loops (said in the log and
    /// in `farcache stats`).
    Auto,
    /// FUSE-over-io_uring or refuse to start.
    On,
}

impl std::fmt::Display for FuseUring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FuseUring::Off => "off",
            FuseUring::Auto => "auto",
            FuseUring::On => "on",
        })
    }
}

/// Most ring entries per queue (`mount.fuse_uring_queue_depth`).
pub const MAX_FUSE_URING_QUEUE_DEPTH: u32 = 256;
const _: () = assert!(MAX_FUSE_URING_QUEUE_DEPTH as usize <= fuser::URING_MAX_QUEUE_DEPTH);

/// Most FUSE worker threads.
pub const MAX_THREADS: u32 = 256;
/// The kernel's largest FUSE request payload with 4 KiB pages (256 pages).
pub const MAX_WRITE_BYTES: u64 = 1 << 20;
/// Most `mount.read_ahead`.
pub const MAX_READ_AHEAD_BYTES: u64 = 16 << 20;
const _: () = assert!(MAX_WRITE_BYTES as usize <= farcache_engine::MAX_READ_BYTES);

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            backing: Backing::default(),
            create_policy: CreatePolicy::MostFree,
            threads: 32,
            attr_timeout: HumanDuration::secs(1),
            entry_timeout: HumanDuration::secs(1),
            keep_cache: true,
            direct_io_backing: true,
            direct_io_backing_writes: false,
            io_engine: IoEngineKind::Uring,
            io_queue_depth: 32,
            io_max_in_flight: 256,
            fuse_uring: FuseUring::Off,
            fuse_uring_queue_depth: 16,
            allow_other: true,
            readdirplus: true,
            writeback_cache: false,
            xattrs: true,
            handle_killpriv: true,
            kernel_passthrough: false,
            max_background: 64,
            max_write: farcache_config::ByteSize::mib(1),
            read_ahead: farcache_config::ByteSize::mib(1),
            max_inodes: 1_000_000,
            max_open_handles: 65_536,
            shutdown_grace: HumanDuration::secs(10),
            metrics_listen: String::new(),
        }
    }
}

impl MountConfig {
    /// The backing I/O engine's options.
    pub fn io_options(&self) -> IoOptions {
        IoOptions { kind: self.io_engine, queue_depth: self.io_queue_depth, max_in_flight: self.io_max_in_flight }
    }

    /// Refuse values that cannot work, naming the key and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.threads == 0 || self.threads > MAX_THREADS {
            return Err(ConfigError::invalid(
                "mount.threads",
                format!("{} is out of range", self.threads),
                format!("set 1 to {MAX_THREADS}"),
            ));
        }
        let w = self.max_write.bytes();
        if !(4096..=MAX_WRITE_BYTES).contains(&w) {
            return Err(ConfigError::invalid(
                "mount.max_write",
                format!("{} is out of range", self.max_write),
                "set 4KiB to 1MiB",
            ));
        }
        let ra = self.read_ahead.bytes();
        if ra != 0 && !(4096..=MAX_READ_AHEAD_BYTES).contains(&ra) {
            return Err(ConfigError::invalid(
                "mount.read_ahead",
                format!("{} is out of range", self.read_ahead),
                "set 4KiB to 16MiB, or 0 to leave the kernel's",
            ));
        }
        if let Some(p) = self.io_options().problem() {
            let key = if p.starts_with("io_queue_depth") { "mount.io_queue_depth" } else { "mount.io_max_in_flight" };
            return Err(ConfigError::invalid(key, p, "see etc/farcache.toml for the ranges"));
        }
        if self.fuse_uring_queue_depth == 0 || self.fuse_uring_queue_depth > MAX_FUSE_URING_QUEUE_DEPTH {
            return Err(ConfigError::invalid(
                "mount.fuse_uring_queue_depth",
                format!("{} is out of range", self.fuse_uring_queue_depth),
                format!("set 1 to {MAX_FUSE_URING_QUEUE_DEPTH}"),
            ));
        }
        if self.kernel_passthrough && self.writeback_cache {
            return Err(ConfigError::invalid(
                "mount.kernel_passthrough",
                "cannot be combined with mount.writeback_cache (the kernel caches neither a passthrough file's \
                 pages nor its writes)",
                "set one of the two to false",
            ));
        }
        if self.max_background == 0 {
            return Err(ConfigError::invalid("mount.max_background", "0 stalls readahead", "set at least 1"));
        }
        if self.max_inodes < 16 {
            return Err(ConfigError::invalid("mount.max_inodes", "too small to be useful", "set at least 16"));
        }
        farcache_config::metrics_listen("mount.metrics_listen", &self.metrics_listen)?;
        if self.max_open_handles < 16 {
            return Err(ConfigError::invalid("mount.max_open_handles", "too small to be useful", "set at least 16"));
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
        mount: MountConfig,
    }

    #[test]
    fn template_is_the_defaults_and_mentions_every_key() {
        let keys = farcache_config::check_template::<MountConfig>("mount", TEMPLATE).unwrap();
        assert!(!keys.is_empty());
        MountConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let mut c = MountConfig { threads: 0, ..MountConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("mount.threads"));
        c.threads = 4;
        c.max_write = farcache_config::ByteSize::mib(2);
        assert!(c.validate().unwrap_err().to_string().contains("mount.max_write"));
        c.max_write = farcache_config::ByteSize::mib(1);
        c.read_ahead = farcache_config::ByteSize::mib(17);
        assert!(c.validate().unwrap_err().to_string().contains("mount.read_ahead"));
        c.read_ahead = farcache_config::ByteSize::kib(1);
        assert!(c.validate().unwrap_err().to_string().contains("mount.read_ahead"));
        c.read_ahead = farcache_config::ByteSize::mib(0);
        c.validate().unwrap();
        c.read_ahead = farcache_config::ByteSize::mib(1);
        c.io_queue_depth = 0;
        assert!(c.validate().unwrap_err().to_string().contains("mount.io_queue_depth"));
        c.io_queue_depth = 512;
        assert!(c.validate().unwrap_err().to_string().contains("mount.io_max_in_flight"));
        let f: File = toml::from_str("[mount]\nbacking = \"/a:/b\"\ncreate_policy = \"first\"").unwrap();
        assert_eq!(f.mount.backing.dirs(), vec![std::path::PathBuf::from("/a"), "/b".into()]);
        assert_eq!(f.mount.create_policy, CreatePolicy::First);
        let f: File = toml::from_str("[mount]\nbacking = [\"/a\", \"/b:c\"]").unwrap();
        assert_eq!(f.mount.backing.dirs(), vec![std::path::PathBuf::from("/a"), "/b:c".into()]);
        assert!(toml::from_str::<File>("[mount]\ncreate_policy = \"random\"").is_err());
        let f: File = toml::from_str("[mount]\nio_engine = \"sync\"").unwrap();
        assert_eq!(f.mount.io_engine, IoEngineKind::Sync);
        assert!(toml::from_str::<File>("[mount]\nio_engine = \"aio\"").is_err());
        let f: File = toml::from_str("[mount]\nfuse_uring = \"auto\"").unwrap();
        assert_eq!(f.mount.fuse_uring, FuseUring::Auto);
        assert!(toml::from_str::<File>("[mount]\nfuse_uring = \"yes\"").is_err());
        let f: File = toml::from_str("[mount]\nkernel_passthrough = true\nwriteback_cache = true").unwrap();
        let e = f.mount.validate().unwrap_err().to_string();
        assert!(e.contains("mount.kernel_passthrough") && e.contains("writeback_cache"), "{e}");
        c.io_queue_depth = 32;
        c.fuse_uring_queue_depth = 0;
        assert!(c.validate().unwrap_err().to_string().contains("mount.fuse_uring_queue_depth"));
        let e = toml::from_str::<File>("[mount]\nthreds = 3").err().unwrap().to_string();
        assert!(e.contains("threds"), "{e}");
    }
}
