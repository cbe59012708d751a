//! `farcache mount BACKING_DIR MOUNTPOINT`: show the backing directory through FUSE, in the
//! foreground, until SIGINT/SIGTERM (then unmount and exit 0) or until someone else unmounts
//! it (`fusermount3 -u MOUNTPOINT`, `umount`).
//!
//! While it runs, the daemon answers on its control socket (`crate::control`):
//! `farcache stats MOUNTPOINT` and `farcache lenders MOUNTPOINT` talk to it. The socket is
//! bound before anything else starts, so a second daemon for the same mount point stops at
//! once, and removed on exit.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use farcache_client::LenderAddr;
use farcache_engine::cached::CachedPath;
use farcache_engine::config::Routing;
use farcache_engine::remote::Remote;
use farcache_engine::stats::CacheStats;
use farcache_engine::{DataPath, DirectPath};
use farcache_fuse::{Ended, Mount, Unmounted};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::control::server::BoundSocket;
use crate::control::takeover::{self, Giver, Outcome};
use crate::control::{path as ctl_path, Control};

/// `--routing`: where reads go.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum RoutingArg {
    /// Paper 000: reads of `cache.threshold` bytes or more to the disk, smaller ones to lenders.
    Threshold,
    /// Each read where measured disk and lender costs say it finishes sooner.
    Adaptive,
}

impl From<RoutingArg> for Routing {
    fn from(r: RoutingArg) -> Routing {
        match r {
            RoutingArg::Threshold => Routing::Threshold,
            RoutingArg::Adaptive => Routing::Adaptive,
        }
    }
}

/// `--fuse-uring`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum FuseUringArg {
    Off,
    Auto,
    On,
}

impl From<FuseUringArg> for farcache_fuse::FuseUring {
    fn from(a: FuseUringArg) -> farcache_fuse::FuseUring {
        match a {
            FuseUringArg::Off => farcache_fuse::FuseUring::Off,
            FuseUringArg::Auto => farcache_fuse::FuseUring::Auto,
            FuseUringArg::On => farcache_fuse::FuseUring::On,
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Directory whose whole tree the mount shows: the truth, on the (slow) disk. Several,
    /// each on its own file system, as DIR1:DIR2[:...] (one tree of theirs, hot files moved
    /// off a busy one by `farcache balance`). Alone, it is the mount point and the
    /// directories are mount.backing's.
    #[arg(value_name = "BACKING_DIR")]
    backing_dir: PathBuf,
    /// Existing directory to mount on (outside the backing directories, or one of them).
    mountpoint: Option<PathBuf>,
    /// No remote tier: a plain passthrough, the baseline every benchmark compares against.
    #[arg(long, conflicts_with_all = ["servers", "tenant", "routing", "key_file", "memcached_plaintext"])]
    no_remote: bool,
    /// A lender to borrow from (repeat for several; blocks are spread by rendezvous hashing):
    /// a farcache server as HOST:PORT, or an existing memcached 1.6+ as
    /// memcached://HOST:PORT (needs --key-file, or --memcached-plaintext). Replaces
    /// cache.servers. With none here or there, a lender runs inside this process with the
    /// [server] capacity.
    #[arg(long = "server", value_name = "[memcached://]HOST:PORT")]
    servers: Vec<String>,
    /// Allow memcached lenders without --key-file: blocks stored there in plaintext, readable
    /// by anyone who reaches the memcached, and believed if it returns wrong bytes (sets
    /// cache.memcached_plaintext).
    #[arg(long)]
    memcached_plaintext: bool,
    /// Encrypt and authenticate every block before it leaves, with the key in FILE: 32
    /// random bytes as 64 hex digits on one line, mode 600 (`farcache keygen --out FILE`
    /// makes one). Overrides cache.key_file. Lenders need server.slot_bytes >= 4136.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// TLS to the lenders (override cache.tls_ca, tls_cert, tls_key, tls_server_name).
    #[command(flatten)]
    tls: super::TlsArgs,
    /// Tenant to borrow as (overrides cache.tenant).
    #[arg(long)]
    tenant: Option<String>,
    /// Where reads go (overrides cache.routing).
    #[arg(long, value_enum)]
    routing: Option<RoutingArg>,
    /// Control socket to answer on, instead of the default one derived from the mount
    /// point (see `farcache stats --help`).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics (GET /metrics over HTTP) on this IP:PORT, e.g.
    /// 127.0.0.1:7413 (overrides mount.metrics_listen; "" turns it off).
    #[arg(long, value_name = "ADDR", value_parser = super::parse_metrics_listen)]
    metrics_listen: Option<String>,
    /// Put a persistent write-back tier in front of the backing directory: a file (created
    /// if missing) or block device on fast local storage (overrides tier.path). Writes are
    /// acknowledged once durable there and written back later; on tmpfs they survive the
    /// daemon but not a power cut (the log and `farcache stats` say which).
    #[arg(long, value_name = "PATH")]
    tier: Option<PathBuf>,
    /// Size of the tier's medium, e.g. 4GiB (overrides tier.size).
    #[arg(long, value_name = "SIZE", requires = "tier")]
    tier_size: Option<farcache_config::ByteSize>,
    /// When an ssd tier's writes become durable (overrides tier.commit): "fsync" (at fsync,
    /// fdatasync, an O_SYNC/O_DSYNC write, or tier.commit_interval later, as on a local file
    /// system) or "write" (each write before it is acknowledged).
    #[arg(long, value_name = "WHEN", value_parser = ["fsync", "write"], requires = "tier")]
    tier_commit: Option<String>,
    /// A write continuing a sequential run of at least this many bytes written to one file
    /// since its last sync goes straight to the backing store, e.g. 4MiB; 0 sends every
    /// write to the tier (overrides tier.sequential_cutoff).
    #[arg(long, value_name = "SIZE", requires = "tier")]
    tier_sequential_cutoff: Option<farcache_config::ByteSize>,
    /// Configuration file (TOML); its [mount], [cache] and (for the lender inside this
    /// process) [server] tables apply. Flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// How the kernel's requests reach the daemon: off (/dev/fuse read loops), auto
    /// (FUSE-over-io_uring where the kernel offers it) or on (refuse to start without it).
    /// Overrides mount.fuse_uring.
    #[arg(long, value_enum, value_name = "MODE")]
    fuse_uring: Option<FuseUringArg>,
    /// Serve files with the kernel's FUSE passthrough (Linux 6.9+, root): reads, writes and
    /// mmap go from the kernel to the backing file without the daemon. Only with --no-remote,
    /// no tier, one backing directory, no --supervise/--takeover. Sets
    /// mount.kernel_passthrough.
    #[arg(long)]
    kernel_passthrough: bool,
    /// Take the live mount on MOUNTPOINT over from the daemon serving it (an upgrade in
    /// place): same arguments otherwise. The running daemon hands over its FUSE connection
    /// and exits; applications see a short stall, no error. A write-back tier (the same
    /// --tier) is handed over too. Refused, with the running daemon serving on, when the
    /// settings the kernel was promised differ.
    #[arg(long)]
    takeover: bool,
    /// Run under a supervisor that keeps the FUSE connection alive when the daemon dies and
    /// restarts it: applications see a stall, not an error (cmd/supervise.rs). SIGHUP to the
    /// supervisor upgrades the daemon in place.
    #[arg(long, conflicts_with = "takeover")]
    supervise: bool,
    /// With --supervise: crashes tolerated within --restart-window before giving up.
    #[arg(long, default_value_t = 5, requires = "supervise")]
    restart_limit: u32,
    /// With --supervise: the window, in seconds, --restart-limit counts crashes in.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, requires = "supervise")]
    restart_window: u64,
}

/// What `{"cmd":"stats"}` answers: who the mount is, then the engine's counters
/// ([`CacheStats`], docs/METRICS.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountStats {
    pub version: String,
    pub pid: u32,
    pub mountpoint: String,
    pub backing_dir: String,
    pub uptime_secs: u64,
    /// The same in milliseconds, taken with the counters: a `--watch` series' intervals.
    #[serde(default)]
    pub uptime_ms: u64,
    /// The wall clock when the counters were taken, in milliseconds since the Unix epoch:
    /// what lines a series up with what ran beside it (`bench paper`'s TPC-H queries carry
    /// their start, `started_unix_ms`).
    #[serde(default)]
    pub unix_ms: u64,
    /// "lenders" (`--server` or cache.servers), "embedded" (a lender inside the mount
    /// process) or "none" (`--no-remote`).
    pub remote_tier: String,
    #[serde(flatten)]
    pub cache: CacheStats,
    /// A mount of several backing branches: its counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub union: Option<farcache_fuse::union::UnionStats>,
    /// How requests reach the daemon: read loops or FUSE-over-io_uring, and why.
    #[serde(default)]
    pub fuse: farcache_fuse::TransportStats,
    /// The daemon's own resident memory (what its memory cgroup pays for).
    #[serde(default)]
    pub memory: DaemonMemory,
    /// The daemon's own CPU time since it started (what its CPU cgroup pays for).
    #[serde(default)]
    pub cpu: DaemonCpu,
}

/// The daemon's CPU time since it started, from `getrusage(RUSAGE_SELF)` at the time of the
/// stats request: every thread's, the finished ones' too. A `--watch` series' differences
/// say what each interval's reads cost the machine, beside what they took (BENCHMARKS.md,
/// session 68: the daemon's CPU per read under TPC-H, farcache against the passthrough).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonCpu {
    /// In user space (`ru_utime`), microseconds.
    pub user_us: u64,
    /// In the kernel on the daemon's behalf (`ru_stime`): its system calls — FUSE requests
    /// and replies, disk I/O submission, sockets to the lenders — microseconds.
    pub system_us: u64,
}

impl DaemonCpu {
    /// This process's figures (zeros if the kernel does not say).
    pub fn of_self() -> DaemonCpu {
        // SAFETY: getrusage writes one `rusage` it is given; a zeroed one is a valid start.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_SELF with a pointer to a live rusage.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return DaemonCpu::default();
        }
        let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
        DaemonCpu { user_us: us(ru.ru_utime), system_us: us(ru.ru_stime) }
    }
}

/// The daemon's resident memory, from `/proc/self/status` and `/proc/self/smaps_rollup` at
/// the time of the stats request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonMemory {
    /// Resident set (`VmRSS`).
    pub rss_bytes: u64,
    /// Of it, anonymous memory (`RssAnon`): heap, request buffers.
    pub anon_bytes: u64,
    /// Of the anonymous memory, pages handed back with `MADV_FREE` (`LazyFree`): the FUSE
    /// request buffers' pages above 64 KiB after a large request. The kernel takes them
    /// back first under memory pressure.
    pub lazyfree_bytes: u64,
    /// Disk-read buffers of 64 KiB to 2 MiB (by size class), from the pool every thread
    /// shares: held by reads and fills in flight now, idle in the pool now, the most it keeps
    /// idle; buffers reused from it, newly mapped, and unmapped because it was full.
    pub io_buffers_bytes: u64,
    pub io_buffers_idle_bytes: u64,
    pub io_buffers_idle_max_bytes: u64,
    pub io_buffers_reused: u64,
    pub io_buffers_mapped: u64,
    pub io_buffers_unmapped: u64,
}

impl DaemonMemory {
    /// This process's figures (zeros where /proc does not say).
    pub fn of_self() -> DaemonMemory {
        fn kib(text: &str, key: &str) -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
                .map_or(0, |k| k * 1024)
        }
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        let io = farcache_engine::io_buffers();
        DaemonMemory {
            rss_bytes: kib(&status, "VmRSS:"),
            anon_bytes: kib(&status, "RssAnon:"),
            lazyfree_bytes: kib(&rollup, "LazyFree:"),
            io_buffers_bytes: io.in_use_bytes,
            io_buffers_idle_bytes: io.idle_bytes,
            io_buffers_idle_max_bytes: io.idle_max_bytes,
            io_buffers_reused: io.reused,
            io_buffers_mapped: io.mapped,
            io_buffers_unmapped: io.unmapped,
        }
    }
}

/// The data path behind the mount, as the control channel sees it.
enum Engine {
    Cached(Arc<CachedPath<DirectPath>>),
    Passthrough(Arc<DirectPath>),
}

/// [`Control`] over a running mount.
struct MountControl {
    /// Answers `--takeover` requests, once the mount serves.
    giver: std::sync::Mutex<Option<Arc<Giver>>>,
    engine: Engine,
    /// The write-back tier in front of the engine (`--tier`); set once this daemon holds it
    /// (taking a mount over, only once the running daemon let go of it).
    tier: std::sync::OnceLock<Arc<dyn farcache_engine::writeback::TierControl>>,
    mountpoint: String,
    backing_dir: String,
    remote_tier: &'static str,
    started: Instant,
    /// Set once a mount of several branches is live (replaced when a handover that did
    /// not happen has the daemon serve again).
    union: std::sync::Mutex<Option<farcache_fuse::union::UnionHandle>>,
    /// Set once the mount is live.
    transport: std::sync::OnceLock<farcache_fuse::Transport>,
}

/// How long a daemon taking a mount over waits for the running one to let go of the
/// write-back tier (it does when it exits, right after the handover, having waited at most
/// `RELEASE_WAIT` for its destage round).
const TIER_HANDOVER_WAIT: Duration = Duration::from_secs(15);
const _: () = assert!(TIER_HANDOVER_WAIT.as_secs() > 2 * farcache_engine::writeback::RELEASE_WAIT.as_secs());

const ONE_BRANCH: &str =
    "this mount has one backing directory: nothing to balance (mount DIR1:DIR2 MOUNTPOINT to have several)";

/// `mount.fuse_uring = "on"` with a way of handing the connection to another daemon.
const RINGS_NOT_HANDED_OVER: &str = "mount.fuse_uring = \"on\" cannot be combined with WHAT: a request in flight on \
     a FUSE-over-io_uring entry cannot be handed to another daemon (there is no commit without a fetch and the kernel \
     resends none of them), so the mount would hang when its daemon changes; fix: set mount.fuse_uring = \"auto\" \
     (read loops with WHAT) or \"off\", or leave WHAT out";

/// `mount.kernel_passthrough` on a mount whose reads or writes must reach the daemon: what
/// stands in its way (`None`: nothing does).
fn kernel_passthrough_conflict(
    a: &Args,
    s: &crate::config::Config,
    union: bool,
    supervised: bool,
) -> Option<&'static str> {
    if !s.mount.kernel_passthrough {
        return None;
    }
    if !a.no_remote {
        Some("lenders serve reads through the daemon; add --no-remote (a mount without lenders) or leave it out")
    } else if s.tier.enabled() {
        Some("the write-back tier takes every write through the daemon; remove [tier] or leave it out")
    } else if union {
        Some("several backing directories move files under their open handles; mount one directory or leave it out")
    } else if supervised || a.takeover {
        Some(
            "a connection handed to another daemon cannot keep files open in passthrough (the next daemon does \
             not know their backing ids); drop --supervise/--takeover or leave it out",
        )
    } else {
        None
    }
}

const NO_REMOTE: &str = "this mount has no remote tier (--no-remote); remount without it to borrow from lenders";

impl MountControl {
    fn cache_stats(&self) -> CacheStats {
        let mut s = match &self.engine {
            Engine::Cached(c) => c.stats(),
            Engine::Passthrough(d) => CacheStats::passthrough(d.snapshot()),
        };
        s.tier = self.tier.get().map(|t| t.stats());
        s
    }

    fn mount_stats(&self) -> MountStats {
        let up = self.started.elapsed();
        MountStats {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            mountpoint: self.mountpoint.clone(),
            backing_dir: self.backing_dir.clone(),
            uptime_secs: up.as_secs(),
            uptime_ms: up.as_millis() as u64,
            unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            remote_tier: self.remote_tier.to_string(),
            cache: self.cache_stats(),
            union: self.union_handle().map(|u| u.stats()),
            fuse: self.transport.get().map(|t| t.snapshot()).unwrap_or_default(),
            memory: DaemonMemory::of_self(),
            cpu: DaemonCpu::of_self(),
        }
    }

    fn union_handle(&self) -> Option<farcache_fuse::union::UnionHandle> {
        self.union.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A mount of several branches is live (served by `mount`): what balance and the stats
    /// reach, and the automatic balancer (`[balance]`) of it.
    fn set_union(
        &self,
        mount: &Mount,
        balance: &farcache_fuse::union::BalanceConfig,
    ) -> anyhow::Result<Option<farcache_fuse::union::AutoBalancer>> {
        let Some(u) = mount.union() else { return Ok(None) };
        let auto = u.configure(balance).map_err(|e| anyhow::anyhow!("[balance]: {e}"))?;
        *self.union.lock().unwrap_or_else(|e| e.into_inner()) = Some(u);
        Ok(auto)
    }

    fn remote(&self) -> Result<&Remote, String> {
        match &self.engine {
            Engine::Cached(c) => Ok(c.remote()),
            Engine::Passthrough(_) => Err(NO_REMOTE.into()),
        }
    }
}

impl Control for MountControl {
    fn stats(&self) -> Value {
        serde_json::to_value(self.mount_stats()).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
    fn lenders(&self) -> Vec<Value> {
        let Ok(remote) = self.remote() else { return Vec::new() };
        remote.lenders().iter().filter_map(|l| serde_json::to_value(l).ok()).collect()
    }
    fn add_lender(&self, addr: LenderAddr) -> Result<(), String> {
        self.remote()?.add_lender(addr).map_err(|e| e.to_string())
    }
    fn remove_lender(&self, addr: LenderAddr) -> Result<(), String> {
        self.remote()?.remove_lender(addr).map_err(|e| e.to_string())
    }
    fn takeover(&self, s: std::os::unix::net::UnixStream, req: &Value) {
        let giver = self.giver.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match giver {
            Some(g) => g.serve(s, req),
            None => {
                let _ = crate::control::fds::write_line(&s, &crate::control::error("not serving yet; try again"));
            }
        }
    }
    fn balance(&self, options: &Value) -> Result<Value, String> {
        let u = self.union_handle().ok_or(ONE_BRANCH)?;
        let o: farcache_fuse::union::BalanceOptions =
            serde_json::from_value(options.clone()).map_err(|e| format!("balance: bad options: {e}"))?;
        let st = u.start(o)?;
        serde_json::to_value(st).map_err(|e| e.to_string())
    }
    fn balance_status(&self) -> Result<Value, String> {
        let u = self.union_handle().ok_or(ONE_BRANCH)?;
        serde_json::to_value(u.status()).map_err(|e| e.to_string())
    }
    fn flush(&self, wait: std::time::Duration, through: Option<u64>) -> Result<Value, String> {
        let Some(t) = self.tier.get() else { return Err("this mount has no write-back tier (--tier)".into()) };
        use farcache_engine::writeback::FlushError;
        let through = through.unwrap_or_else(|| t.last_seq());
        match t.flush_through(through, wait, &mut |_| {}) {
            Ok(()) => {
                Ok(serde_json::json!({ "done": true, "dirty_bytes": t.stats().log.dirty_bytes, "through": through }))
            }
            Err(FlushError::Timeout(_, left)) => {
                Ok(serde_json::json!({ "done": false, "dirty_bytes": left, "through": through }))
            }
            Err(e) => Err(format!("flush: {e}")),
        }
    }
}

/// The control socket this mount answers on: `--control-socket`, or the default path for
/// its canonical mount point (in a private directory, created if need be).
/// The mount's intent journal (`farcache_fuse`'s `journal.rs`): the control socket's path
/// with `.journal` added, so that every daemon of the mount — restarted, or taking over —
/// names the same file.
fn journal_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

fn control_socket_path(explicit: Option<&Path>, canonical_mountpoint: &Path) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return std::path::absolute(p).with_context(|| format!("--control-socket {}", p.display()));
    }
    let dir = ctl_path::runtime_dir();
    ctl_path::ensure_private_dir(&dir)?;
    Ok(ctl_path::default_socket_path(canonical_mountpoint)?)
}

/// The configuration in force: the file's (or the defaults), flags over it, validated.
/// With `--no-remote` the [cache] table is not used, so not checked.
fn settings(a: &Args) -> anyhow::Result<crate::config::Config> {
    let mut c = crate::config::Config::load(a.config.as_deref())?;
    if let Some(m) = &a.metrics_listen {
        c.mount.metrics_listen = m.clone();
    }
    if let Some(u) = a.fuse_uring {
        c.mount.fuse_uring = u.into();
    }
    if a.kernel_passthrough {
        c.mount.kernel_passthrough = true;
    }
    c.mount.validate()?;
    if !a.servers.is_empty() {
        c.cache.servers = a.servers.clone();
    }
    if let Some(t) = &a.tenant {
        c.cache.tenant = t.clone();
    }
    if let Some(r) = a.routing {
        c.cache.routing = r.into();
    }
    if let Some(k) = &a.key_file {
        c.cache.key_file = k.display().to_string();
    }
    if a.memcached_plaintext {
        c.cache.memcached_plaintext = true;
    }
    a.tls.apply(&mut c.cache);
    if let Some(t) = &a.tier {
        c.tier.path = t.display().to_string();
    }
    if let Some(n) = a.tier_size {
        c.tier.size = n;
    }
    if let Some(w) = &a.tier_commit {
        c.tier.commit = if w == "write" {
            farcache_engine::writeback::TierCommit::Write
        } else {
            farcache_engine::writeback::TierCommit::Fsync
        };
    }
    if let Some(n) = a.tier_sequential_cutoff {
        c.tier.sequential_cutoff = n;
    }
    c.tier.validate()?;
    c.balance.validate()?;
    if !a.no_remote {
        crate::config::check_cache_tls_files(&c.cache)?;
        c.cache.tenant_from_certificate()?;
        c.cache.validate()?;
    }
    Ok(c)
}

/// Keep the daemon's heap from holding on to freed read buffers.
///
/// The daemon runs in the memory the application is short of. Left to itself, glibc raises its
/// mmap threshold to the largest buffer freed so far (up to 32 MiB), after which every 128 KiB
/// to 1 MiB read buffer comes from, and is freed back into, one of up to 8 arenas per core,
/// which keep it: ~68 MiB after sequential reads (BENCHMARKS.md, "The client's memory").
/// A fixed threshold keeps large buffers on mmap, returned at free; two arenas keep the small
/// allocations' fragmentation from multiplying with the FUSE threads.
fn limit_malloc_caching() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

impl Args {
    /// The mount point: the second directory named, or the only one.
    fn mountpoint(&self) -> &Path {
        self.mountpoint.as_deref().unwrap_or(&self.backing_dir)
    }
}

/// The backing branches: the command line's (`DIR1:DIR2...`), or mount.backing's when it
/// names only the mount point.
fn branches(a: &Args, cfg: &farcache_fuse::MountConfig) -> anyhow::Result<Vec<PathBuf>> {
    let dirs = match &a.mountpoint {
        Some(_) => farcache_fuse::split_branches(&a.backing_dir.to_string_lossy()),
        None => cfg.backing.dirs(),
    };
    if dirs.is_empty() {
        anyhow::bail!(
            "no backing directory: name it (`farcache mount BACKING_DIR MOUNTPOINT`, or DIR1:DIR2 for several) or set              mount.backing in the configuration file"
        );
    }
    Ok(dirs)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.supervise {
        // Checked here, not only in the daemon: a daemon that refuses to start would be
        // restarted until the limit.
        let s = settings(&a)?;
        if s.mount.fuse_uring == farcache_fuse::FuseUring::On {
            anyhow::bail!("{}", RINGS_NOT_HANDED_OVER.replace("WHAT", "--supervise"));
        }
        if let Some(why) = kernel_passthrough_conflict(&a, &s, branches(&a, &s.mount)?.len() > 1, true) {
            anyhow::bail!("mount.kernel_passthrough = true cannot be used here: {why}");
        }
        let window = std::time::Duration::from_secs(a.restart_window);
        return super::supervise::run(super::supervise::daemon_args(), a.restart_limit, window, a.mountpoint());
    }
    limit_malloc_caching();
    let supervisor = super::supervise::daemon_link();
    let file_cfg = settings(&a)?;
    let branches = branches(&a, &file_cfg.mount)?;
    let backing_dir = branches[0].clone();
    let union = branches.len() > 1;
    if let Some(why) = kernel_passthrough_conflict(&a, &file_cfg, union, supervisor.is_some()) {
        anyhow::bail!("mount.kernel_passthrough = true cannot be used here: {why}");
    }
    let shown = branches.iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(":");
    let mut cfg = file_cfg.mount.clone();
    if cfg.fuse_uring != farcache_fuse::FuseUring::Off && (a.takeover || supervisor.is_some()) {
        let what = if a.takeover { "--takeover" } else { "--supervise" };
        if cfg.fuse_uring == farcache_fuse::FuseUring::On {
            anyhow::bail!("{}", RINGS_NOT_HANDED_OVER.replace("WHAT", what));
        }
        tracing::info!(
            "mount.fuse_uring = \"auto\" with {what}: /dev/fuse read loops (a request in flight on a ring cannot \
             be handed to another daemon)"
        );
        cfg.fuse_uring = farcache_fuse::FuseUring::Off;
    }
    let cfg = cfg;
    let cache = file_cfg.cache.clone();

    // The control socket first: if another daemon serves this mount point, stop before
    // starting anything. (A mount point that does not resolve fails in `Mount::new` below,
    // with the right message.)
    let canonical = canonical_mountpoint(a.mountpoint());
    let socket_path = control_socket_path(a.control_socket.as_deref(), &canonical)?;
    // The intent journal lives beside the socket: every daemon of this mount finds it there.
    let journal_path = journal_path(&socket_path);
    // Taking over, the socket and the metrics port are the running daemon's until it exits.
    let bound = if a.takeover { None } else { Some(BoundSocket::bind(&socket_path).context("the control socket")?) };
    // The metrics port too: taken before the mount goes live, or the daemon stops here.
    let metrics_origin = if a.metrics_listen.is_some() { "--metrics-listen" } else { "mount.metrics_listen" };
    let bind_metrics = || -> anyhow::Result<_> {
        farcache_config::metrics_listen("mount.metrics_listen", &cfg.metrics_listen)?
            .map(|m| crate::metrics::http::bind(metrics_origin, m))
            .transpose()
    };
    let metrics = if a.takeover { None } else { bind_metrics()? };
    let backing_canonical = std::fs::canonicalize(&backing_dir).unwrap_or_else(|_| backing_dir.clone());
    let remote_kind = match (a.no_remote, cache.servers.is_empty()) {
        (true, _) => "none",
        (false, true) => "embedded",
        (false, false) => "lenders",
    };
    let tier_path = match file_cfg.tier.enabled() {
        true => Some(std::path::absolute(&file_cfg.tier.path)?),
        false => None,
    };
    // A union's branches, all of them in order, must be the running daemon's.
    let handover_backing = match union {
        true => PathBuf::from(
            branches
                .iter()
                .map(|b| std::fs::canonicalize(b).unwrap_or_else(|_| b.clone()).display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        ),
        false => backing_canonical.clone(),
    };
    let handover_settings = takeover::settings(&handover_backing, &canonical, remote_kind, &cfg, tier_path.as_deref());

    // The embedded lender's runtime must outlive the mount: kept here until `run` returns.
    let mut _embedded: Option<tokio::runtime::Runtime> = None;
    // Before any tier sizes its share of the descriptor limit (`tier.max_open_files`).
    farcache_fuse::raise_descriptors_for(&cfg);
    // One I/O engine for the backing store, whatever tier sits in front of it.
    let io = Arc::new(farcache_engine::IoEngine::new(cfg.io_options()));
    tracing::info!(
        "backing I/O engine {} (queue depth {}, at most {} in flight)",
        cfg.io_engine,
        cfg.io_queue_depth,
        cfg.io_max_in_flight
    );
    let (data, engine, remote_tier): (Arc<dyn DataPath>, Engine, &'static str) = if a.no_remote {
        tracing::info!("no remote tier (--no-remote): plain passthrough");
        let d = Arc::new(DirectPath::with_io(io));
        (d.clone(), Engine::Passthrough(d), "none")
    } else {
        let seal = cache.block_seal()?;
        let sealed_bytes = seal.sealed_len(farcache_engine::index::BLOCK_BYTES as usize);
        let (servers, tier) = if cache.servers.is_empty() {
            let mut server_cfg = file_cfg.server.clone();
            // Sealed blocks are larger than a block: the lender inside this process gets
            // slots that hold them (separate lenders are told in the log if theirs do not).
            if (server_cfg.slot_bytes as usize) < sealed_bytes {
                server_cfg.slot_bytes = sealed_bytes as u32;
                server_cfg.validate().context("the lender inside this process, with slots for sealed blocks")?;
            }
            // It lends this process's own memory: inside a memory cgroup, a lender as large as
            // the limit gets the mount OOM-killed once it fills (the default 512MiB in a
            // 512MiB cgroup did, in `bench paper`).
            let limit = cgroup_memory_limit();
            if let Some(cap) = embedded_capacity(server_cfg.capacity.bytes(), limit) {
                tracing::warn!(
                    "the lender inside this process would lend {} of a memory cgroup limited to {}: lending {} \
                     (a quarter of the limit) instead; give lenders elsewhere (--server) for more",
                    server_cfg.capacity,
                    farcache_config::ByteSize(limit.unwrap_or_default()),
                    farcache_config::ByteSize(cap)
                );
                server_cfg.capacity = farcache_config::ByteSize(cap);
                server_cfg.validate().context(
                    "the lender inside this process, shrunk to a quarter of the memory cgroup's limit; \
                     raise the limit or give lenders elsewhere (--server)",
                )?;
            }
            let capacity = server_cfg.capacity;
            let (rt, addr) = embedded_lender(server_cfg)?;
            _embedded = Some(rt);
            tracing::info!("no lenders configured: lending {capacity} from this process on {addr}");
            (vec![addr.into()], "embedded")
        } else {
            (cache.resolve_servers()?, "lenders")
        };
        let rc = cache.remote_config(servers)?;
        if rc.tls.is_some() && cache.tls_psk_file.is_empty() {
            tracing::info!(
                "TLS 1.3 to lenders as tenant {:?}, the client certificate {}",
                cache.tenant,
                cache.tls_cert
            );
        } else if rc.tls.is_some() {
            let psk = farcache_tls::psk::read_file("cache.tls_psk_file", std::path::Path::new(&cache.tls_psk_file))?;
            tracing::info!(
                "TLS 1.3 to lenders with the pre-shared key {} (fingerprint {})",
                cache.tls_psk_file,
                farcache_tls::psk::fingerprint(&psk)
            );
        }
        let memcached: Vec<String> = rc.servers.iter().filter(|a| a.is_memcached()).map(|a| a.to_string()).collect();
        if !memcached.is_empty() {
            tracing::warn!(
                "memcached lenders ({}): plain TCP, keys carry the tenant but memcached authenticates no one{}",
                memcached.join(", "),
                if cache.key_file.is_empty() {
                    "; blocks stored in plaintext there (cache.memcached_plaintext = true): anyone who reaches it \
                     reads them, and wrong bytes from it would be believed"
                } else {
                    "; blocks sealed, so a memcached that is shared, lies or evicts costs misses only"
                }
            );
        }
        if cache.key_file.is_empty() {
            tracing::info!(
                "blocks go to lenders in plaintext (no cache.key_file / --key-file): trust them and the network"
            );
        } else {
            tracing::info!(
                "block encryption on ({}, key from {}): blocks are {sealed_bytes} bytes on lenders, which need \
                 server.slot_bytes >= {sealed_bytes}",
                rc.seal.name(),
                cache.key_file
            );
        }
        if tier == "lenders" {
            super::preflight::check_lenders(&rc)?;
        }
        let remote = Remote::start(rc).context("starting the remote tier")?;
        tracing::info!(
            "routing {}",
            match cache.routing {
                Routing::Threshold => format!("threshold: reads of {} or more go to the disk", cache.threshold),
                Routing::Adaptive => "adaptive: each read where measured costs say it finishes sooner".to_string(),
            }
        );
        let c = Arc::new(
            CachedPath::new(DirectPath::with_io(io), remote, cache.router())
                .with_read_around(cache.read_around_blocks()),
        );
        (c.clone(), Engine::Cached(c), tier)
    };
    // A union with a tier is opened before the tier (its interrupted moves finished, so the
    // tier finds its files where they are), and then mounted as it is.
    let mut opened_union: Option<farcache_fuse::union::OpenUnion> = None;
    // The write-back tier in front of everything (or the refusal of a backing directory
    // whose tier is dirty but not given). Taking a mount over, the running daemon holds the
    // tier until it exits: the mount is made over a deferred path that becomes the tier once
    // this daemon holds it (after the handover, below, before the session serves).
    let (data, tier, deferred) = if a.takeover && tier_path.is_some() {
        // What can be checked before the running daemon lets go is checked now: a failure
        // after the handover would leave nobody serving the mount.
        match union {
            true => super::tier::precheck_union(&file_cfg.tier, &branches).map(|_| ())?,
            false => super::tier::precheck(&file_cfg.tier, &backing_dir).map(|_| ())?,
        }
        let d = Arc::new(farcache_engine::Deferred::new(TIER_HANDOVER_WAIT + Duration::from_secs(300)));
        (d.clone() as Arc<dyn DataPath>, None, Some((d, data)))
    } else if union {
        let (data, tier, opened) = super::tier::wrap_union(&file_cfg.tier, &branches, &cfg, data)?;
        opened_union = opened;
        (data, tier, None)
    } else {
        let (data, tier) = super::tier::wrap(&file_cfg.tier, &backing_dir, cfg.direct_io_backing, data)?;
        (data, tier, None)
    };
    let control = Arc::new(MountControl {
        giver: std::sync::Mutex::new(None),
        engine,
        tier: tier.map(std::sync::OnceLock::from).unwrap_or_default(),
        mountpoint: canonical.display().to_string(),
        backing_dir: if union {
            shown.clone()
        } else {
            std::fs::canonicalize(&backing_dir).unwrap_or_else(|_| backing_dir.clone()).display().to_string()
        },
        remote_tier,
        started: Instant::now(),
        union: std::sync::Mutex::new(None),
        transport: std::sync::OnceLock::new(),
    });

    // Signal handlers go in before the mount: a SIGTERM between the mount going live and a
    // handler being installed would kill the daemon and leave a dead mount behind.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _in_rt = rt.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };

    // The automatic balancer (`[balance]`) of a mount of several branches: stopped when this
    // function returns.
    let mut auto_balancer: Option<farcache_fuse::union::AutoBalancer>;
    // Everything above (lenders, the engine) is ready before the running daemon is asked to
    // stop: the stall is the handover alone.
    let (mut mount, bound, metrics, took_from) = if a.takeover {
        let (mut h, giving) = takeover::request(&socket_path, &handover_settings, supervisor.is_some())?;
        super::supervise::assign_incarnation(&mut h);
        let m = Mount::adopt(&branches, &canonical, &cfg, data.clone(), h, true, &journal_path, None)?;
        takeover::confirm(&giving).context("--takeover: confirming to the running daemon")?;
        auto_balancer = control.set_union(&m, &file_cfg.balance)?;
        if let Some((d, inner)) = deferred {
            // The running daemon lets go of the tier when it exits, right after its goodbye;
            // requests meanwhile wait in the kernel (nobody serves yet).
            let t0 = Instant::now();
            // A union's tier finds its files by id in the union the mount just opened (its
            // journal replayed: the running daemon finished its moves before handing over).
            let (data, tier) = match m.union() {
                Some(u) => super::tier::wrap_union_waiting(
                    &file_cfg.tier,
                    &branches,
                    cfg.direct_io_backing,
                    inner,
                    u.files(),
                    TIER_HANDOVER_WAIT,
                ),
                None => super::tier::wrap_waiting(
                    &file_cfg.tier,
                    &backing_dir,
                    cfg.direct_io_backing,
                    inner,
                    TIER_HANDOVER_WAIT,
                ),
            }
            .context("--takeover: taking the write-back tier over from the running daemon")?;
            d.set(data);
            if let Some(t) = tier {
                let _ = control.tier.set(t);
            }
            tracing::info!("took the write-back tier over in {} ms", t0.elapsed().as_millis());
        }
        let bound = takeover::bind_when_free(&socket_path)?;
        let metrics = takeover::retry_bind(bind_metrics)?;
        (m, bound, metrics, Some(()))
    } else if let Some(link) = supervisor.as_ref().filter(|_| super::supervise::is_restart()) {
        // The previous daemon died: its connection is alive in the supervisor's hands.
        let mut h = link.withdraw()?;
        super::supervise::assign_incarnation(&mut h);
        // A union with a tier was opened (its interrupted moves finished) before the tier.
        let m = Mount::adopt(&branches, &canonical, &cfg, data.clone(), h, true, &journal_path, opened_union.take())?;
        auto_balancer = control.set_union(&m, &file_cfg.balance)?;
        (m, bound.expect("bound unless taking over"), metrics, Some(()))
    } else {
        let m = match opened_union.take() {
            Some(u) => Mount::with_union(u, a.mountpoint(), &cfg, data.clone(), &journal_path)?,
            None => Mount::with_branches(&branches, a.mountpoint(), &cfg, data.clone(), &journal_path)?,
        };
        auto_balancer = control.set_union(&m, &file_cfg.balance)?;
        if m.union().is_none() && file_cfg.balance.enabled {
            tracing::info!("balance.enabled: this mount has one backing directory, nothing to balance");
        }
        (m, bound.expect("bound unless taking over"), metrics, None)
    };
    let _ = control.transport.set(mount.transport());
    if let Some(link) = &supervisor {
        link.adopt(&mut mount)?;
    }
    let control_server = bound.serve(control.clone()).context("starting the control socket")?;
    tracing::info!("control socket {}", control_server.path().display());
    if let Some(l) = metrics {
        let c = control.clone();
        let render = move || crate::metrics::render(crate::metrics::mount::Snapshot(c.mount_stats()));
        let addr = crate::metrics::http::serve(l, Arc::new(render)).context("starting the metrics endpoint")?;
        tracing::info!("metrics on http://{addr}/metrics");
    }
    let socket_file = control_server.socket_file();
    let own_socket = socket_file.clone();
    let mut unmounter = mount.unmounter();
    // The one line on stdout, once the mount is live: scripts and tests wait for it.
    println!(
        "farcache mounted {} on {}{}",
        shown,
        mount.mountpoint().display(),
        if took_from.is_some() { " (taken over)" } else { "" }
    );
    std::io::stdout().flush()?;
    let main_pid = if supervisor.is_some() { std::os::unix::process::parent_id() } else { std::process::id() };
    crate::notify::ready_for(&format!("serving {} on {}", shown, mount.mountpoint().display()), main_pid);

    let grace = cfg.shutdown_grace.get();
    let summary = control.clone();
    let signal_journal = journal_path.clone();
    std::thread::Builder::new().name("farcache-signals".into()).spawn(move || {
        rt.block_on(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!("{which}: unmounting");
            crate::notify::stopping();
            let code = match unmounter.unmount() {
                Ok(Unmounted::Done | Unmounted::NotMounted) => 0,
                Ok(Unmounted::Detached) => {
                    tracing::warn!("the mount was busy: detached it; waiting up to {grace:?} for its users");
                    0
                }
                Err(e) => {
                    tracing::error!("unmount failed: {e}");
                    1
                }
            };
            // The mount point is no longer this daemon's (even if detached users remain):
            // its socket must not keep a new mount there from starting.
            if code == 0 {
                socket_file.remove();
            }
            // `Mount::run` returns (and the process exits) as soon as the kernel ends the
            // session. If users still hold files after the grace period, or a second signal
            // comes, exit anyway: closing /dev/fuse aborts the connection. A session that
            // outlives a clean unmount is held by a copy of the mount in another mount
            // namespace (a process that ran `unshare -m` meanwhile): say so.
            let held = async {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                super::tier::drained().await;
                tracing::warn!(
                    "unmounted here, but the session goes on: a copy of the mount lives in another mount \
                     namespace; waiting up to {grace:?} for it"
                );
                std::future::pending::<()>().await
            };
            let forced = tokio::select! {
                _ = super::tier::after_grace(grace) => {
                    tracing::warn!("still in use after {grace:?}; exiting");
                    false
                }
                _ = held, if code == 0 => false,
                _ = term.recv() => {
                    tracing::warn!("second signal: exiting now");
                    true
                }
                _ = int.recv() => {
                    tracing::warn!("second signal: exiting now");
                    true
                }
            };
            // Exiting without unwinding: the tier's write-back (unless a second signal asked
            // to exit now: the next mount recovers it), the counters and the control socket
            // go first.
            if let (false, Some(t)) = (forced, summary.tier.get()) {
                super::tier::shutdown(t);
            }
            log_summary(&summary);
            socket_file.remove();
            if code == 0 {
                // Unmounted: no request of this connection can be resent any more.
                let _ = std::fs::remove_file(&signal_journal);
            }
            std::process::exit(code);
        })
    })?;

    loop {
        // A connection whose INIT asked for rings refuses to be taken over.
        let mut offered = handover_settings.clone();
        offered["fuse_transport"] =
            serde_json::json!(if mount.transport().negotiated_rings() { "io_uring" } else { "read-loops" });
        // Nor does one that may have files open in the kernel's passthrough.
        offered["kernel_passthrough"] = serde_json::json!(cfg.kernel_passthrough);
        let giver = Arc::new(Giver::new(mount.handle(), offered, supervisor.is_some()));
        *control.giver.lock().unwrap_or_else(|e| e.into_inner()) = Some(giver.clone());
        match mount.run()? {
            Ended::Unmounted => break,
            Ended::HandedOver(h) => match giver.complete(h) {
                Outcome::Done => {
                    // The new daemon serves the mount (and binds the socket once we are gone),
                    // and takes the tier once this process has exited: its destaging stops
                    // here, and what is dirty stays in the tier for the new daemon.
                    if let Some(t) = control.tier.get() {
                        t.release();
                    }
                    log_summary(&control);
                    own_socket.remove();
                    // Under a supervisor, a distinct code: it follows the new daemon.
                    std::process::exit(if supervisor.is_some() { super::supervise::HANDED_OVER } else { 0 });
                }
                Outcome::Resume(h) => {
                    tracing::warn!("takeover did not complete: serving again");
                    // A union is opened again with the mount: its balancer goes first (it
                    // moved nothing since the handover began).
                    drop(auto_balancer.take());
                    mount = Mount::adopt(&branches, &canonical, &cfg, data.clone(), h, true, &journal_path, None)?;
                    auto_balancer = control.set_union(&mount, &file_cfg.balance)?;
                    if let Some(link) = &supervisor {
                        link.adopt(&mut mount)?;
                    }
                }
            },
        }
    }
    // No more moves: the one in hand finishes (a move cut short by an exit is the journal's,
    // as after a crash).
    drop(auto_balancer);
    // Unmounted (by us on a signal, or by someone else): a clean unmount destages everything.
    if let Some(t) = control.tier.get() {
        super::tier::shutdown(t);
    }
    // Unmounted by someone else (fusermount3 -u, umount): stopping as well.
    crate::notify::stopping();
    log_summary(&control);
    drop(control_server);
    // The connection is gone, and with it every request the journal could answer for.
    let _ = std::fs::remove_file(&journal_path);
    Ok(())
}

/// The mount point's canonical path, resolving its parent only: stat(2) of the mount point
/// itself asks the file system on it, which nobody serves while a crashed daemon is being
/// replaced (the new one would wait for itself). A mount point that is a symlink is not
/// resolved (mount(8) resolves it, so name the target).
fn canonical_mountpoint(p: &Path) -> PathBuf {
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
            std::fs::canonicalize(parent).map(|d| d.join(name)).unwrap_or_else(|_| p.to_path_buf())
        }
        _ => std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// The counters, logged once as the daemon ends (on every exit path).
fn log_summary(control: &MountControl) {
    let s = control.cache_stats();
    if matches!(control.engine, Engine::Cached(_)) {
        let (r, e) = (&s.remote, &s.engine);
        tracing::info!(
            "remote tier: {} hits, {} misses, {} bytes from lenders, {} bytes to lenders, {} invalidations, \
             {} fallbacks; {} reads from lenders, {} small reads from disk, {} sequential bypasses; \
             index {} bytes for {} blocks",
            r.hits,
            r.misses,
            r.bytes_from_servers,
            r.bytes_to_servers,
            r.invalidations,
            r.fallbacks,
            e.remote_reads,
            e.disk_reads,
            e.sequential_bypasses,
            s.index.memory_bytes,
            s.index.remote_blocks
        );
    }
    let c = &s.backing;
    tracing::info!(
        "backing I/O: {} direct and {} buffered reads ({} bytes), {} writes ({} direct, {} bytes), \
         {} fsyncs; {} files lost their last name",
        c.reads_direct,
        c.reads_buffered,
        c.read_bytes,
        c.writes,
        c.writes_direct,
        c.write_bytes,
        c.fsyncs,
        c.forgets
    );
    let io = &c.io;
    tracing::info!(
        "backing I/O engine {}: {} io_uring and {} synchronous operations, at most {} in flight; fallbacks: \
         {} without io_uring, {} unaligned reads, {} unaligned writes, {} refused O_DIRECT, {} short retries",
        io.engine,
        io.ops_uring,
        io.ops_sync,
        io.in_flight_peak,
        io.fallback_no_uring,
        io.fallback_unaligned_reads,
        io.fallback_unaligned_writes,
        io.fallback_direct_refused,
        io.short_retries
    );
}

/// What the lender inside this process lends instead of `configured` bytes under a memory
/// cgroup limit of `limit` bytes: a quarter of the limit (whole MiB) when `configured` is more
/// than that, else `None` (as configured).
fn embedded_capacity(configured: u64, limit: Option<u64>) -> Option<u64> {
    let quarter = limit? / 4 / (1 << 20) * (1 << 20);
    (configured > quarter).then_some(quarter)
}

/// The memory limit of this process's memory cgroup (v1 `memory.limit_in_bytes`, v2
/// `memory.max`), if it has one.
fn cgroup_memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_of(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_limit`] for a `/proc/PID/cgroup` text and the cgroup file systems under
/// `root`: the v1 memory controller's line if there is one, else the v2 (unified) line.
fn memory_limit_of(proc_cgroup: &str, root: &std::path::Path) -> Option<u64> {
    let lines: Vec<(&str, &str)> = proc_cgroup
        .lines()
        .filter_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, ctls, path) = (p.next()?, p.next()?, p.next()?);
            Some((ctls, path.trim_start_matches('/')))
        })
        .collect();
    let file = match lines.iter().find(|(c, _)| c.split(',').any(|c| c == "memory")) {
        Some((_, path)) => root.join("memory").join(path).join("memory.limit_in_bytes"),
        None => {
            let (_, path) = lines.iter().find(|(c, _)| c.is_empty())?;
            root.join(path).join("memory.max")
        }
    };
    let text = std::fs::read_to_string(file).ok()?;
    // v2 says "max"; v1 says a number near 2^63 for none.
    text.trim().parse::<u64>().ok().filter(|&n| n < 1 << 62)
}

/// Start a lender inside this process on a loopback port: `farcache mount` on one machine.
fn embedded_lender(
    cfg: farcache_server::ServerConfig,
) -> anyhow::Result<(tokio::runtime::Runtime, std::net::SocketAddr)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("farcache-lender")
        .enable_all()
        .build()?;
    let server = farcache_server::Server::new(cfg)?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    rt.spawn(async move {
        if let Err(e) = farcache_server::run(listener, server, std::future::pending::<()>()).await {
            tracing::error!("embedded lender failed: {e}");
        }
    });
    Ok((rt, addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_embedded_lender_takes_a_quarter_of_a_memory_cgroup_at_most() {
        const MIB: u64 = 1 << 20;
        assert_eq!(embedded_capacity(512 * MIB, None), None);
        assert_eq!(embedded_capacity(512 * MIB, Some(512 * MIB)), Some(128 * MIB));
        assert_eq!(embedded_capacity(512 * MIB, Some(4096 * MIB)), None);
        assert_eq!(embedded_capacity(512 * MIB, Some(1000 * MIB + 5)), Some(250 * MIB));

        let root = tempfile::tempdir().unwrap();
        let put = |dir: &str, file: &str, text: &str| {
            let d = root.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), text).unwrap();
        };
        put("memory/fcb-c3", "memory.limit_in_bytes", "536870912\n");
        put("memory/free", "memory.limit_in_bytes", "9223372036854771712\n");
        put("app.slice", "memory.max", "268435456\n");
        put("none.slice", "memory.max", "max\n");
        let v1 = "12:blkio:/fcb-b\n7:memory:/fcb-c3\n0::/other\n";
        assert_eq!(memory_limit_of(v1, root.path()), Some(512 * MIB), "v1 wins over the unified line");
        assert_eq!(memory_limit_of("7:memory:/free\n", root.path()), None, "v1 without a limit");
        assert_eq!(memory_limit_of("0::/app.slice\n", root.path()), Some(256 * MIB));
        assert_eq!(memory_limit_of("0::/none.slice\n", root.path()), None);
        assert_eq!(memory_limit_of("0::/gone\n", root.path()), None, "unreadable: no limit known");
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(["mount", "/b", "/m"].iter().chain(extra)).map(|c| c.args)
    }

    #[test]
    fn flags_override_the_cache_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.toml");
        std::fs::write(
            &file,
            "[cache]\nservers = [\"10.0.0.1:7411\", \"10.0.0.2:7411\"]\ntenant = \"db1\"\nrouting = \"adaptive\"\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();

        let c = settings(&parse(&["--config", f]).unwrap()).unwrap();
        assert_eq!(c.cache.servers, ["10.0.0.1:7411", "10.0.0.2:7411"]);
        assert_eq!((c.cache.tenant.as_str(), c.cache.routing), ("db1", Routing::Adaptive));

        let c = settings(
            &parse(&["--config", f, "--server", "127.0.0.1:1", "--tenant", "db2", "--routing", "threshold"]).unwrap(),
        )
        .unwrap();
        assert_eq!(c.cache.servers, ["127.0.0.1:1"], "--server replaces cache.servers");
        assert_eq!((c.cache.tenant.as_str(), c.cache.routing), ("db2", Routing::Threshold));

        // Without a file: the defaults (an embedded lender, adaptive routing).
        let c = settings(&parse(&[]).unwrap()).unwrap();
        assert!(c.cache.servers.is_empty());
        assert_eq!(c.cache.routing, Routing::Adaptive);

        // Bad values are refused by key, flags included.
        let e = settings(&parse(&["--tenant", "no spaces"]).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("cache.tenant:"), "{e}");
        let e = settings(&parse(&["--server", "nohost"]).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("cache.servers:"), "{e}");
        assert!(parse(&["--routing", "fastest"]).is_err());
        assert!(parse(&["--no-remote", "--server", "127.0.0.1:1"]).is_err());
        assert!(parse(&["--no-remote", "--routing", "adaptive"]).is_err());
        assert!(parse(&["--no-remote", "--key-file", "/k"]).is_err());
        let e = settings(&parse(&["--key-file", "/nonexistent/k"]).unwrap()).unwrap_err().to_string();
        assert!(e.starts_with("cache.key_file:") && e.contains("/nonexistent/k"), "{e}");
        // --no-remote does not use [cache], so a bad one there does not stop it.
        std::fs::write(&file, "[cache]\nthreshold = \"5000B\"\n").unwrap();
        assert!(settings(&parse(&["--config", f]).unwrap()).is_err());
        settings(&parse(&["--config", f, "--no-remote"]).unwrap()).unwrap();
    }
}
