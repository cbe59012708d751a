//! The `farcache mount` daemon of a configuration, inside the client's cgroups, and its
//! counters: from `farcache stats MNT --json` when that command works (the mount's control
//! socket), else from the one-line summary the daemon logs when it exits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cgroup::Cgroup;
use super::child::Child;
use super::sys;
use crate::error::IoContext;
use crate::{BenchError, Result};

/// The mount's remote-tier counters, whichever way they were read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MountCounters {
    /// "stats" (`farcache stats MNT --json`) or "exit-log" (the daemon's last lines).
    pub source: String,
    pub hits: Option<u64>,
    pub misses: Option<u64>,
    pub bytes_from_servers: Option<u64>,
    pub bytes_to_servers: Option<u64>,
    pub invalidations: Option<u64>,
    pub fallbacks: Option<u64>,
    pub remote_reads: Option<u64>,
    pub disk_reads: Option<u64>,
    pub sequential_bypasses: Option<u64>,
    pub index_bytes: Option<u64>,
    pub index_blocks: Option<u64>,
    /// Reads the daemon made of its backing files (direct + buffered): requests that went
    /// to the disk, whatever the configuration.
    pub backing_reads: Option<u64>,
    /// Reads the adaptive rule routed to the disk, and of those the ones fetched from the
    /// lenders anyway as probes (the engine's counters; stats only).
    #[serde(default)]
    pub adaptive_disk: Option<u64>,
    #[serde(default)]
    pub adaptive_probes: Option<u64>,
}

pub struct MountDaemon {
    child: Child,
    mnt: PathBuf,
    exe: PathBuf,
    /// Whether `farcache stats MNT --json` answered (None: not tried yet).
    stats_works: Option<bool>,
    tier: bool,
    /// `--watch-stats`: `farcache stats MNT --watch` writing the mount's series.
    watcher: Option<StatsWatcher>,
}

/// `farcache stats MNT --watch EVERY --json` appending to a file, stopped with its mount.
struct StatsWatcher(std::process::Child);

impl StatsWatcher {
    /// Start it for the mount at `mnt`, its series in `dir`/`name`.stats.jsonl (appended to: a
    /// run that mounts again continues the file, each series starting at a small `uptime_ms`).
    fn start(exe: &Path, mnt: &Path, every_ms: u64, dir: &Path, name: &str) -> Result<StatsWatcher> {
        std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
        let path = dir.join(format!("{name}.stats.jsonl"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .ctx(|| format!("open {}", path.display()))?;
        let every = format!("{every_ms}ms");
        let child = Command::new(exe)
            .arg("stats")
            .arg(mnt)
            .args(["--watch", &every, "--json"])
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .ctx(|| "start farcache stats --watch".into())?;
        Ok(StatsWatcher(child))
    }
}

impl Drop for StatsWatcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl MountDaemon {
    /// `farcache mount BACKING MNT` (with `--server` per lender, or `--no-remote`), joined to
    /// `cgroups` before it starts; returns once the mount is live.
    pub fn start(
        exe: &Path,
        backing: &Path,
        mnt: &Path,
        lenders: Option<&[std::net::SocketAddr]>,
        routing: Option<&str>,
        cgroups: &[&Cgroup],
        log: &Path,
    ) -> Result<MountDaemon> {
        MountDaemon::start_with(exe, backing, mnt, lenders, routing, &[], cgroups, log)
    }

    /// [`MountDaemon::start`] with more arguments for `farcache mount` (e.g. `--tier`).
    #[allow(clippy::too_many_arguments)]
    pub fn start_with(
        exe: &Path,
        backing: &Path,
        mnt: &Path,
        lenders: Option<&[std::net::SocketAddr]>,
        routing: Option<&str>,
        extra: &[std::ffi::OsString],
        cgroups: &[&Cgroup],
        log: &Path,
    ) -> Result<MountDaemon> {
        let mut cmd = Command::new(exe);
        cmd.arg("mount").arg(backing).arg(mnt).args(extra).env("FARCACHE_LOG", "info");
        match lenders {
            None => {
                cmd.arg("--no-remote");
            }
            Some(addrs) => {
                for a in addrs {
                    cmd.arg("--server").arg(a.to_string());
                }
                if let Some(r) = routing {
                    cmd.arg("--routing").arg(r);
                }
            }
        }
        let procs: Vec<PathBuf> = cgroups.iter().map(|c| c.procs()).collect();
        let refs: Vec<&Path> = procs.iter().map(|p| p.as_path()).collect();
        sys::confine(&mut cmd, &refs);
        let mut child = Child::spawn("mount daemon", cmd, log, false)?;
        // A mount with a write-back tier destages everything before it exits.
        let tier = extra.iter().any(|a| a == "--tier");
        child.stop_timeout = Duration::from_secs(if tier { 300 } else { 30 });
        let line = child.next_line(Duration::from_secs(30))?;
        if !line.starts_with("farcache mounted") {
            return Err(BenchError::Setup(format!("farcache mount said {line:?}; log:\n{}", child.log_tail())));
        }
        Ok(MountDaemon {
            child,
            mnt: mnt.to_path_buf(),
            exe: exe.to_path_buf(),
            stats_works: None,
            tier,
            watcher: None,
        })
    }

    /// With `--watch-stats`, record this mount's counters over its run, named after its
    /// `log` — every mount's, the passthrough's too: its disk reads, their latency and the
    /// FUSE reads over time are what a farcache series is compared with (session 68: a
    /// TPC-H power test lost in the seconds the lenders took reads, and only the passthrough's
    /// series could say whether its disk was slow in the same seconds).
    pub(super) fn watched(mut self, o: &super::PaperOptions, log: &Path) -> Result<MountDaemon> {
        if let Some(ms) = o.watch_stats_ms {
            let name = log.file_name().map(|n| n.to_string_lossy().trim_end_matches(".log").to_string());
            let name = name.unwrap_or_else(|| "mount".into());
            self.watcher = Some(StatsWatcher::start(&self.exe, &self.mnt, ms, &o.stats_dir, &name)?);
        }
        Ok(self)
    }

    /// The mount of configuration `cfg` on the testbed — none for the configurations that
    /// read ext4 directly (native, ideal) — borrowing from `remote` lenders (none:
    /// `--no-remote`), with `extra` arguments, joined to `cgroups`.
    pub(super) fn for_config(
        tb: &super::testbed::Testbed,
        o: &super::PaperOptions,
        cfg: super::ConfigKind,
        remote: Option<&[std::net::SocketAddr]>,
        extra: &[std::ffi::OsString],
        cgroups: &[&Cgroup],
        log: &Path,
    ) -> Result<Option<MountDaemon>> {
        if !cfg.through_mount() {
            return Ok(None);
        }
        let mut extra = with_mount_config(o, extra);
        if cfg == super::ConfigKind::PassthroughKernel {
            extra.push("--kernel-passthrough".into());
        }
        let d = MountDaemon::start_with(&o.exe, &tb.ext4, &tb.mnt, remote, o.routing.as_deref(), &extra, cgroups, log)?;
        d.watched(o, log).map(Some)
    }

    /// The mount of a configuration over several branches (paper 001's two disks,
    /// `farcache mount DIR1:DIR2 MNT`) with `routing`, otherwise as
    /// [`MountDaemon::for_config`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_union(
        tb: &super::testbed::Testbed,
        o: &super::PaperOptions,
        branches: &[&Path],
        remote: Option<&[std::net::SocketAddr]>,
        routing: Option<&str>,
        extra: &[std::ffi::OsString],
        cgroups: &[&Cgroup],
        log: &Path,
    ) -> Result<MountDaemon> {
        let joined: Vec<String> = branches.iter().map(|b| b.display().to_string()).collect();
        let backing = PathBuf::from(joined.join(":"));
        MountDaemon::start_with(&o.exe, &backing, &tb.mnt, remote, routing, &with_mount_config(o, extra), cgroups, log)?
            .watched(o, log)
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mnt
    }

    /// Whether it runs with a write-back tier (`--tier`).
    pub fn has_tier(&self) -> bool {
        self.tier
    }

    /// The counters now, if `farcache stats MNT --json` works (tried once per mount).
    pub fn stats_now(&mut self) -> Option<(MountCounters, Value)> {
        if self.stats_works == Some(false) {
            return None;
        }
        let mnt = self.mnt.to_string_lossy().to_string();
        let exe = self.exe.to_string_lossy().to_string();
        let got = sys::run_with_timeout(&exe, &["stats", &mnt, "--json"], Duration::from_secs(5))
            .ok()
            .and_then(|out| serde_json::from_str::<Value>(out.trim()).ok())
            .filter(|v| v.is_object());
        self.stats_works = Some(got.is_some());
        got.map(|v| (from_stats_json(&v), v))
    }

    /// The FUSE requests the mount received so far, by opcode (`fuse.ops` of `farcache stats
    /// --json`; empty when the stats do not answer or a daemon predates the counters).
    pub fn fuse_ops(&mut self) -> BTreeMap<String, u64> {
        self.stats_now().map(|(_, v)| fuse_ops_of(&v)).unwrap_or_default()
    }

    /// Unmount (SIGTERM; the daemon unmounts and exits) and the exit summary from its log.
    pub fn stop(&mut self) -> Option<MountCounters> {
        self.watcher = None;
        let clean = self.child.stop().is_some();
        if !clean || sys::mounts_under(&self.mnt).iter().any(|(p, _)| Path::new(p) == self.mnt) {
            let m = self.mnt.to_string_lossy().to_string();
            let _ = sys::run_quiet("fusermount3", &["-uz", &m]);
        }
        from_exit_log(&self.child.log())
    }

    pub fn log_tail(&self) -> String {
        self.child.log_tail()
    }

    /// How the daemon ended, if it has (an OOM kill shows as SIGKILL).
    pub fn ended(&mut self) -> Option<std::process::ExitStatus> {
        self.child.wait_exit(Duration::ZERO)
    }
}

/// An OOM kill that took a PostgreSQL backend (the server restarts them all).
pub const PG_RESTARTED: &str = "PostgreSQL: it restarted";

/// Who an OOM kill in the client's cgroup took, for a run's error: the mount daemon if it
/// ended (`ended`, its status), else `otherwise` (the load the experiment runs beside it).
pub fn oom_victim(ended: Option<std::process::ExitStatus>, otherwise: &str) -> String {
    match ended {
        Some(st) => format!("the mount daemon ({st}): the kernel chose it, and the mount is gone"),
        None => otherwise.to_string(),
    }
}

/// `extra`, and `--config FILE` when the run has `--mount-config FILE`.
fn with_mount_config(o: &super::PaperOptions, extra: &[std::ffi::OsString]) -> Vec<std::ffi::OsString> {
    let mut extra = extra.to_vec();
    if let Some(c) = &o.mount_config {
        extra.extend([std::ffi::OsString::from("--config"), c.clone().into_os_string()]);
    }
    extra
}

impl Drop for MountDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The FUSE requests by opcode in a stats document (`fuse.ops`; empty if it has none).
pub fn fuse_ops_of(v: &Value) -> BTreeMap<String, u64> {
    v["fuse"]["ops"]
        .as_object()
        .map(|o| o.iter().filter_map(|(k, n)| Some((k.clone(), n.as_u64()?))).collect())
        .unwrap_or_default()
}

/// The requests of each opcode between two [`MountDaemon::fuse_ops`] readings (opcodes with
/// none left out).
pub fn ops_since(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(op, n)| (op.clone(), n.saturating_sub(before.get(op).copied().unwrap_or(0))))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The number right before `phrase` in `line` ("12 hits" → 12 for " hits").
fn number_before(line: &str, phrase: &str) -> Option<u64> {
    let at = line.find(phrase)?;
    let head = line[..at].trim_end();
    let digits: String = head.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

/// Parse the daemon's exit summary ("remote tier: N hits, N misses, N bytes from lenders, N
/// bytes to lenders, N invalidations, N fallbacks; N reads from lenders, N small reads from
/// disk, N sequential bypasses; index N bytes for N blocks"). Phrases it lacks stay None.
pub fn from_exit_log(log: &str) -> Option<MountCounters> {
    let Some(line) = log.lines().rev().find(|l| l.contains("remote tier:")) else {
        // A passthrough logs only its backing I/O.
        return backing_reads_from_log(log).map(|n| MountCounters {
            source: "exit-log".into(),
            backing_reads: Some(n),
            ..MountCounters::default()
        });
    };
    let tail = &line[line.find("remote tier:")?..];
    Some(MountCounters {
        source: "exit-log".into(),
        hits: number_before(tail, " hits"),
        misses: number_before(tail, " misses"),
        bytes_from_servers: number_before(tail, " bytes from lenders"),
        bytes_to_servers: number_before(tail, " bytes to lenders"),
        invalidations: number_before(tail, " invalidations"),
        fallbacks: number_before(tail, " fallbacks"),
        remote_reads: number_before(tail, " reads from lenders"),
        disk_reads: number_before(tail, " small reads from disk"),
        sequential_bypasses: number_before(tail, " sequential bypasses"),
        index_bytes: tail.find("index ").and_then(|i| number_before(&tail[i..], " bytes for")),
        index_blocks: number_before(tail, " blocks"),
        backing_reads: backing_reads_from_log(log),
        adaptive_disk: None,
        adaptive_probes: None,
    })
}

/// "backing I/O: N direct and M buffered reads" → N + M.
fn backing_reads_from_log(log: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains("backing I/O:"))?;
    Some(number_before(line, " direct and")? + number_before(line, " buffered reads")?)
}

/// Every numeric leaf of `v`, with its dotted path.
fn flatten(v: &Value, path: &str, out: &mut Vec<(String, u64)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                flatten(x, &p, out);
            }
        }
        Value::Number(n) => {
            if let Some(x) = n.as_u64() {
                out.push((path.to_string(), x));
            }
        }
        _ => {}
    }
}

/// Read the counters out of the mount's stats document without knowing its exact shape:
/// the first dotted path that ends with one of the names given, in order of preference.
pub fn from_stats_json(v: &Value) -> MountCounters {
    let mut flat = Vec::new();
    flatten(v, "", &mut flat);
    let find = |names: &[&str]| {
        names.iter().find_map(|n| flat.iter().find(|(p, _)| p == n || p.ends_with(&format!(".{n}"))).map(|(_, x)| *x))
    };
    MountCounters {
        source: "stats".into(),
        hits: find(&["remote.hits", "remote_hits", "lenders.hits"]),
        misses: find(&["remote.misses", "remote_misses", "lenders.misses"]),
        bytes_from_servers: find(&["bytes_from_servers", "bytes_from_lenders"]),
        bytes_to_servers: find(&["bytes_to_servers", "bytes_to_lenders"]),
        invalidations: find(&["invalidations"]),
        fallbacks: find(&["fallbacks"]),
        remote_reads: find(&["remote_reads"]),
        disk_reads: find(&["disk_reads"]),
        sequential_bypasses: find(&["sequential_bypasses"]),
        index_bytes: find(&["index.memory_bytes", "index_memory_bytes", "index_bytes", "index.bytes"]),
        index_blocks: find(&["index.remote_blocks", "index_blocks", "index.blocks", "remote_blocks"]),
        backing_reads: find(&["backing.reads_direct", "reads_direct"])
            .map(|d| d + find(&["backing.reads_buffered", "reads_buffered"]).unwrap_or(0)),
        adaptive_disk: find(&["engine.adaptive_disk", "adaptive_disk"]),
        adaptive_probes: find(&["engine.adaptive_probes", "adaptive_probes"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_kill_names_the_mount_daemon_when_it_ended() {
        use std::os::unix::process::ExitStatusExt;
        let killed = oom_victim(Some(std::process::ExitStatus::from_raw(libc::SIGKILL)), PG_RESTARTED);
        assert!(killed.starts_with("the mount daemon (signal: 9 (SIGKILL))"), "{killed}");
        assert_eq!(oom_victim(None, PG_RESTARTED), "PostgreSQL: it restarted");
    }

    #[test]
    fn parses_the_exit_summary() {
        let log = "2025-11-22T04:00:00Z  INFO farcache mounted\n\
            2025-11-22T04:01:00Z  INFO remote tier: 10 hits, 2 misses, 40960 bytes from lenders, 81920 bytes to \
            lenders, 3 invalidations, 0 fallbacks; 10 reads from lenders, 5 small reads from disk, 7 sequential \
            bypasses; index 1234 bytes for 20 blocks\n\
            2025-11-22T04:01:00Z  INFO backing I/O: 12 direct and 0 buffered reads (1 bytes)\n";
        let c = from_exit_log(log).unwrap();
        assert_eq!(c.hits, Some(10));
        assert_eq!(c.misses, Some(2));
        assert_eq!(c.bytes_from_servers, Some(40960));
        assert_eq!(c.bytes_to_servers, Some(81920));
        assert_eq!(c.invalidations, Some(3));
        assert_eq!(c.remote_reads, Some(10));
        assert_eq!(c.disk_reads, Some(5));
        assert_eq!(c.sequential_bypasses, Some(7));
        assert_eq!((c.index_bytes, c.index_blocks), (Some(1234), Some(20)));
        assert_eq!(c.backing_reads, Some(12));
        assert!(from_exit_log("INFO backing I/O: nothing").is_none());
        let passthrough = "INFO backing I/O: 7 direct and 2 buffered reads (1 bytes), 0 writes (0 bytes)";
        assert_eq!(from_exit_log(passthrough).unwrap().backing_reads, Some(9));
    }

    #[test]
    fn requests_between_two_readings_leave_out_the_opcodes_with_none() {
        let m = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<BTreeMap<_, _>>();
        let before = m(&[("read", 10), ("write", 5), ("fsync", 2)]);
        let after = m(&[("read", 25), ("write", 5), ("fsync", 3), ("getattr", 4)]);
        assert_eq!(ops_since(&after, &before), m(&[("read", 15), ("fsync", 1), ("getattr", 4)]));
        // A daemon that restarted (counters from zero) gives no negative counts.
        assert_eq!(ops_since(&m(&[("read", 3)]), &before), BTreeMap::new());
    }

    #[test]
    fn reads_a_stats_document_of_unknown_shape() {
        let v: Value = serde_json::json!({
            "remote": {"hits": 5, "misses": 1, "bytes_from_servers": 20480, "bytes_to_servers": 4096,
                       "invalidations": 2},
            "index": {"memory_bytes": 99, "remote_blocks": 4},
            "tiers": {"disk_reads": 3},
            "engine": {"adaptive_disk": 11, "adaptive_probes": 2},
            "backing": {"reads_direct": 7, "reads_buffered": 1}
        });
        let c = from_stats_json(&v);
        assert_eq!((c.hits, c.misses, c.invalidations), (Some(5), Some(1), Some(2)));
        assert_eq!((c.bytes_from_servers, c.bytes_to_servers), (Some(20480), Some(4096)));
        assert_eq!((c.index_bytes, c.index_blocks, c.disk_reads), (Some(99), Some(4), Some(3)));
        assert_eq!(c.backing_reads, Some(8));
        assert_eq!((c.adaptive_disk, c.adaptive_probes), (Some(11), Some(2)));
        assert_eq!(c.source, "stats");
    }
}
