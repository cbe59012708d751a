//! The systems under test as child processes: the farcache server (this very binary, run as
//! `farcache server`) and memcached. A [`ChildGuard`] stops its child when dropped, so an
//! error anywhere in a benchmark still leaves no server behind.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::IoContext;
use crate::{BenchError, Result};

/// How long a child gets to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a child gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct ChildGuard {
    name: String,
    child: Child,
    log: PathBuf,
    /// Held open so that a late write by the child never meets a closed pipe.
    _stdout: Option<BufReader<ChildStdout>>,
}

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Resident memory of the child now (VmRSS).
    pub fn rss_bytes(&self) -> Result<u64> {
        rss_bytes(self.pid())
    }

    /// The end of the child's log, for error messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Fail if the child has exited.
    /// `played` as is, but an error carries this process's death when it died meanwhile.
    pub fn blame<T>(&mut self, played: Result<T>) -> Result<T> {
        played.map_err(|e| match self.check_alive() {
            Err(dead) => BenchError::Setup(format!("{e}\n{dead}")),
            Ok(()) => e,
        })
    }

    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(st)) => {
                Err(BenchError::Setup(format!("{} exited ({st}); its log ends:\n{}", self.name, self.log_tail())))
            }
            Err(e) => Err(BenchError::io(format!("wait for {}", self.name), e)),
        }
    }

    /// SIGTERM, wait, SIGKILL if it lingers. Idempotent.
    pub fn stop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: kill(2) on the pid of a child we have not reaped: it cannot name another
        // process.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// VmRSS of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).ctx(|| format!("read {path}"))?;
    parse_vmrss(&text).ok_or_else(|| BenchError::Setup(format!("no VmRSS line in {path}")))
}

/// The anonymous memory process `pid` holds, in bytes: /proc/PID/smaps_rollup's `Anonymous`
/// less `LazyFree` (pages the allocator has given back with `MADV_FREE`, which stay resident
/// and in VmRSS until the kernel needs them, and which it takes without asking). What the
/// process itself keeps charged to its memory cgroup, beyond the file pages it shares.
pub fn anon_held_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).ctx(|| format!("read {path}"))?;
    parse_anon_held(&text).ok_or_else(|| BenchError::Setup(format!("no Anonymous line in {path}")))
}

fn parse_anon_held(rollup: &str) -> Option<u64> {
    let kib = |key: &str| -> Option<u64> {
        let line = rollup.lines().find(|l| l.starts_with(key))?;
        let mut parts = line[key.len()..].split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        (parts.next() == Some("kB")).then_some(n * 1024)
    };
    Some(kib("Anonymous:")?.saturating_sub(kib("LazyFree:").unwrap_or(0)))
}

fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let mut parts = line["VmRSS:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then_some(n * 1024)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Have the kernel send the child SIGTERM should the benchmark die without running its
/// destructors (SIGKILL, Ctrl-C). The signal follows the death of the spawning *thread*,
/// so children are spawned from the thread that runs the whole benchmark.
fn harden(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
            Ok(())
        });
    }
}

/// A directory for the children's logs and config, removed when dropped.
pub struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    pub fn new() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("farcache-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path).ctx(|| format!("create {}", path.display()))?;
        Ok(WorkDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// How to start a farcache server.
#[derive(Clone, Debug)]
pub struct FarcacheSpec {
    /// The `farcache` binary.
    pub exe: PathBuf,
    pub capacity_bytes: u64,
    pub policy: String,
    pub worker_threads: u32,
    /// More `[server]` lines for its configuration file ("" for none).
    pub config: String,
    /// The server's log filter (`FARCACHE_LOG`); `None`: warnings only.
    pub log_filter: Option<String>,
}

/// Start `farcache server` on 127.0.0.1, port 0, and wait for its address line.
pub fn spawn_farcache(spec: &FarcacheSpec, dir: &WorkDir, tag: &str) -> Result<(ChildGuard, SocketAddr)> {
    let cfg = dir.path().join(format!("farcache-{tag}.toml"));
    std::fs::write(&cfg, format!("[server]\nworker_threads = {}\n{}", spec.worker_threads, spec.config))
        .ctx(|| format!("write {}", cfg.display()))?;
    let log = dir.path().join(format!("farcache-{tag}.log"));
    let log_file = std::fs::File::create(&log).ctx(|| format!("create {}", log.display()))?;
    let capacity_mib = spec.capacity_bytes.div_ceil(1 << 20);
    let mut cmd = Command::new(&spec.exe);
    cmd.args(["server", "--listen", "127.0.0.1:0", "--policy", &spec.policy])
        .arg("--capacity")
        .arg(format!("{capacity_mib}MiB"))
        .arg("--config")
        .arg(&cfg)
        .env("FARCACHE_LOG", spec.log_filter.as_deref().unwrap_or("warn"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file);
    harden(&mut cmd);
    let child = cmd.spawn().ctx(|| format!("start {} server", spec.exe.display()))?;
    let mut guard = ChildGuard { name: format!("farcache server ({tag})"), child, log, _stdout: None };
    let mut out = BufReader::new(guard.child.stdout.take().expect("piped"));
    let mut line = String::new();
    // The server prints its address once it listens, or exits: either ends this read.
    out.read_line(&mut line).ctx(|| "read the farcache server's address".into())?;
    let addr = line
        .trim()
        .strip_prefix("farcache server listening on ")
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or_else(|| {
            BenchError::Setup(format!(
                "farcache server did not start (stdout {:?}); its log ends:\n{}",
                line.trim(),
                guard.log_tail()
            ))
        })?;
    guard._stdout = Some(out);
    Ok((guard, addr))
}

/// The memcached binary: on PATH or in /usr/bin.
pub fn find_memcached() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("memcached")).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin/memcached"), PathBuf::from("/usr/local/bin/memcached")])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            BenchError::Setup(
                "memcached not found on PATH or in /usr/bin: install it (Debian: `apt-get install -y memcached`), \
                 or pass --no-memcached to benchmark the farcache server alone"
                    .into(),
            )
        })
}

/// The first line of `memcached -V`, e.g. "memcached 1.6.18".
pub fn memcached_version(exe: &Path) -> Result<String> {
    let out = Command::new(exe).arg("-V").output().ctx(|| format!("run {} -V", exe.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("memcached (unknown version)").trim().to_string())
}

/// How to start memcached.
#[derive(Clone, Debug)]
pub struct MemcachedSpec {
    pub exe: PathBuf,
    /// `-m`: memory for items, in MiB (memcached's "megabytes").
    pub memory_mib: u64,
    /// `-t`.
    pub threads: u32,
}

impl MemcachedSpec {
    /// The arguments, without the port.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "-m",
            &self.memory_mib.to_string(),
            "-t",
            &self.threads.to_string(),
            "-c",
            "1024",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // memcached refuses to run as root unless told which user to be.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            a.extend(["-u".to_string(), "root".to_string()]);
        }
        a
    }
}

/// Start memcached on a free port of 127.0.0.1 and wait until it accepts connections.
pub fn spawn_memcached(spec: &MemcachedSpec, dir: &WorkDir) -> Result<(ChildGuard, SocketAddr)> {
    let log = dir.path().join("memcached.log");
    // memcached cannot report a port it chose, so pick one that is free now; the window in
    // which another process could take it is tiny, and a failure to bind is reported below.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").ctx(|| "find a free port".into())?;
        l.local_addr().ctx(|| "find a free port".into())?.port()
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log_file = std::fs::File::create(&log).ctx(|| format!("create {}", log.display()))?;
    let mut cmd = Command::new(&spec.exe);
    cmd.args(spec.args()).arg("-p").arg(port.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log_file);
    harden(&mut cmd);
    let child = cmd.spawn().ctx(|| format!("start {}", spec.exe.display()))?;
    let mut guard = ChildGuard { name: "memcached".into(), child, log, _stdout: None };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        guard.check_alive()?;
        if TcpStream::connect(addr).is_ok() {
            return Ok((guard, addr));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Setup(format!("memcached did not listen on {addr} within {START_TIMEOUT:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A farcache server's STATS document, parsed.
pub fn parse_stats(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text)
        .map_err(|e| BenchError::Protocol { system: "farcache", msg: format!("STATS is not JSON: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmrss_parsing() {
        let status = "Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t    2048 kB\nRssAnon:\t 1 kB\n";
        assert_eq!(parse_vmrss(status), Some(2048 * 1024));
        assert_eq!(parse_vmrss("Name: x\n"), None);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn anonymous_memory_held_leaves_out_lazily_freed_pages() {
        let rollup = "Rss:  9000 kB\nAnonymous:   5000 kB\nLazyFree:   3000 kB\nAnonHugePages: 0 kB\n";
        assert_eq!(parse_anon_held(rollup), Some(2000 * 1024));
        assert_eq!(parse_anon_held("Anonymous:   5000 kB\n"), Some(5000 * 1024), "no LazyFree line: none");
        assert_eq!(parse_anon_held("Rss: 1 kB\n"), None);
        // This process has touched heap memory of its own by now.
        let v = vec![1u8; 1 << 20];
        assert!(anon_held_bytes(std::process::id()).unwrap() > 0);
        drop(std::hint::black_box(v));
        assert!(anon_held_bytes(u32::MAX).is_err());
    }

    #[test]
    fn memcached_arguments() {
        let a = MemcachedSpec { exe: "memcached".into(), memory_mib: 1088, threads: 2 }.args();
        assert_eq!(&a[..10], &["-m", "1088", "-t", "2", "-c", "1024", "-U", "0", "-l", "127.0.0.1"]);
    }
}
