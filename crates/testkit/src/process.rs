//! The real `farcache server` as a child process of the test.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server gets to print its address. Generous: a debug build on a loaded two-core
/// machine starts slowly, and a server that never starts fails the test anyway.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Most stderr bytes kept per server. A hostile test makes one warning per connection; past
/// this the rest is counted, not kept, so a runaway log cannot eat the test's memory.
const MAX_STDERR_BYTES: usize = 32 << 20;

/// The prefix of the one line the server prints on stdout.
const LISTENING: &str = "farcache server listening on ";

/// Captured output of one stream, filled by a reader thread.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

/// Why a server did not start.
#[derive(Debug)]
pub enum StartError {
    /// It exited before printing its address (a bad configuration, for instance).
    Exited {
        status: ExitStatus,
        stdout: String,
        stderr: String,
    },
    /// It printed nothing within [`START_TIMEOUT`]; it was killed.
    Timeout {
        stderr: String,
    },
    /// It printed something else than the address line.
    BadLine {
        line: String,
        stderr: String,
    },
    Spawn(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Exited { status, stdout, stderr } => {
                write!(f, "server exited before listening ({status}); stdout: {stdout:?}; stderr:\n{stderr}")
            }
            StartError::Timeout { stderr } => write!(f, "server did not print its address in time; stderr:\n{stderr}"),
            StartError::BadLine { line, stderr } => {
                write!(f, "unexpected first stdout line {line:?}; stderr:\n{stderr}")
            }
            StartError::Spawn(e) => write!(f, "cannot spawn the server: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running `farcache server`, started by [`ServerProcess::start`]. Killed (SIGKILL) and
/// reaped on drop, so a failing test leaves no process behind.
pub struct ServerProcess {
    child: Child,
    addr: SocketAddr,
    stdout: Arc<Mutex<Captured>>,
    stderr: Arc<Mutex<Captured>>,
    readers: Vec<JoinHandle<()>>,
    /// Holds the config file and anything else a test puts beside it; removed on drop.
    dir: tempfile::TempDir,
    config_path: Option<PathBuf>,
    exit: Option<ExitStatus>,
}

impl ServerProcess {
    /// Run `bin server --listen 127.0.0.1:0 ARGS... [--config FILE]`, where FILE holds
    /// `config_toml` in a temporary directory the process owns, and wait for the address
    /// line. Panics (with the server's stderr) if the server does not start.
    pub fn start(bin: &Path, args: &[&str], config_toml: Option<&str>) -> ServerProcess {
        Self::start_env(bin, args, config_toml, &[])
    }

    /// [`ServerProcess::start`] with extra environment variables (e.g. `FARCACHE_LOG`).
    pub fn start_env(bin: &Path, args: &[&str], config_toml: Option<&str>, env: &[(&str, &str)]) -> ServerProcess {
        match Self::try_start(bin, args, config_toml, env) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`ServerProcess::start_env`], but a server that does not start is an `Err`
    /// carrying its exit status and stderr, for tests of refused configurations.
    pub fn try_start(
        bin: &Path,
        args: &[&str],
        config_toml: Option<&str>,
        env: &[(&str, &str)],
    ) -> Result<ServerProcess, StartError> {
        Self::try_start_on(bin, SocketAddr::from(([127, 0, 0, 1], 0)), args, config_toml, env)
    }

    /// [`ServerProcess::start`] listening on `listen` rather than on a free port: to restart
    /// a lender where its borrowers already look for it (after [`ServerProcess::kill`] the
    /// address is free again; the server binds with `SO_REUSEADDR`, so connections of the
    /// dead process in TIME_WAIT do not stand in the way), or to start one mid-test on an
    /// address a borrower was given before it existed.
    pub fn start_on(bin: &Path, listen: SocketAddr, args: &[&str], config_toml: Option<&str>) -> ServerProcess {
        match Self::try_start_on(bin, listen, args, config_toml, &[]) {
            Ok(s) => s,
            Err(e) => panic!("server on {listen}: {e}"),
        }
    }

    /// Like [`ServerProcess::start_on`] with extra environment variables, but a server that
    /// does not start (the address is taken, for instance) is an `Err`.
    pub fn try_start_on(
        bin: &Path,
        listen: SocketAddr,
        args: &[&str],
        config_toml: Option<&str>,
        env: &[(&str, &str)],
    ) -> Result<ServerProcess, StartError> {
        let dir = tempfile::Builder::new().prefix("farcache-test-").tempdir().map_err(StartError::Spawn)?;
        let mut cmd = Command::new(bin);
        cmd.arg("server").arg("--listen").arg(listen.to_string()).args(args);
        let config_path = match config_toml {
            Some(text) => {
                let p = dir.path().join("farcache.toml");
                std::fs::write(&p, text).map_err(StartError::Spawn)?;
                cmd.arg("--config").arg(&p);
                Some(p)
            }
            None => None,
        };
        cmd.envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(StartError::Spawn)?;

        let stderr = Arc::new(Mutex::new(Captured::default()));
        let stdout = Arc::new(Mutex::new(Captured::default()));
        let mut readers = Vec::new();
        let err_pipe = child.stderr.take().expect("piped stderr");
        readers.push(spawn_capture(err_pipe, stderr.clone()));
        let (line_tx, line_rx) = mpsc::channel::<String>();
        let out_pipe = child.stdout.take().expect("piped stdout");
        {
            let stdout = stdout.clone();
            readers.push(std::thread::spawn(move || {
                let mut r = BufReader::new(out_pipe);
                let mut first = true;
                // Bounded by the pipe: the loop ends when the server closes stdout or exits.
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    append(&stdout, line.as_bytes());
                    if first {
                        first = false;
                        let _ = line_tx.send(line.trim_end().to_string());
                    }
                }
            }));
        }

        let text = |c: &Arc<Mutex<Captured>>| String::from_utf8_lossy(&c.lock().unwrap().bytes).into_owned();
        let line = match line_rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed without a line: the server is exiting. Reap it, then let
                // the stderr reader finish so the message is complete.
                let status = wait_timeout(&mut child, Duration::from_secs(10)).unwrap_or_else(|| {
                    let _ = child.kill();
                    child.wait().expect("wait for killed server")
                });
                for r in readers {
                    let _ = r.join();
                }
                return Err(StartError::Exited { status, stdout: text(&stdout), stderr: text(&stderr) });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::Timeout { stderr: text(&stderr) });
            }
        };
        let addr = match line.strip_prefix(LISTENING).and_then(|a| a.parse().ok()) {
            Some(a) => a,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(StartError::BadLine { line, stderr: text(&stderr) });
            }
        };
        Ok(ServerProcess { child, addr, stdout, stderr, readers, dir, config_path, exit: None })
    }

    /// The address the server listens on (127.0.0.1 and the port it was given).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The temporary directory beside the config file (for secret files and the like).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    /// Resident memory of the server, from `VmRSS` in /proc/PID/status.
    pub fn rss_bytes(&self) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap_or_else(|| panic!("no VmRSS in {path} (has the server exited?)"));
        let kib: u64 = line
            .trim_start_matches("VmRSS:")
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad VmRSS line {line:?}: {e}"));
        kib * 1024
    }

    /// Everything the server wrote on stderr so far (lossy UTF-8).
    pub fn stderr_text(&self) -> String {
        let c = self.stderr.lock().unwrap();
        let mut s = String::from_utf8_lossy(&c.bytes).into_owned();
        if c.dropped > 0 {
            s.push_str(&format!("\n[testkit: {} more stderr bytes not kept]\n", c.dropped));
        }
        s
    }

    /// Everything the server wrote on stdout so far, the address line included.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap().bytes).into_owned()
    }

    /// Wait until a stderr line satisfies `pred`; return it, or `None` after `timeout`.
    pub fn wait_for_stderr(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let mut found = None;
        crate::wait_until(timeout, Duration::from_millis(20), || {
            let c = self.stderr.lock().unwrap();
            found = String::from_utf8_lossy(&c.bytes).lines().find(|l| pred(l)).map(str::to_string);
            found.is_some()
        });
        found
    }

    /// Stderr lines that satisfy `pred`.
    pub fn count_stderr_lines(&self, pred: impl Fn(&str) -> bool) -> usize {
        let c = self.stderr.lock().unwrap();
        String::from_utf8_lossy(&c.bytes).lines().filter(|l| pred(l)).count()
    }

    /// Whether the process is still running (a stopped process is running).
    pub fn is_alive(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.exit = Some(status);
                false
            }
            Err(e) => panic!("try_wait on server {}: {e}", self.pid()),
        }
    }

    /// The exit status, if the process has exited (and was reaped by this handle).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.is_alive();
        self.exit
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) with our own child's pid; it has not been reaped (we reap only in
        // methods that take &mut self and record the exit), so the pid is not reused.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({}, {sig}): {}", self.pid(), std::io::Error::last_os_error());
    }

    /// SIGKILL, then reap. Returns the exit status.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(s) = self.exit_status() {
            return s;
        }
        self.signal(libc::SIGKILL);
        let status = self.child.wait().expect("wait for killed server");
        self.exit = Some(status);
        status
    }

    /// SIGSTOP: the server freezes (a hung lender, as a client sees it). Returns once every
    /// thread of the process is stopped: kill(2) only queues the signal.
    pub fn stop(&mut self) {
        assert!(self.is_alive(), "stop(): server has exited");
        self.signal(libc::SIGSTOP);
        let pid = self.pid();
        let stopped = crate::wait_until(Duration::from_secs(5), Duration::from_millis(1), || all_threads_stopped(pid));
        assert!(stopped, "server {pid} not stopped 5 s after SIGSTOP");
    }

    /// SIGCONT after [`ServerProcess::stop`].
    pub fn cont(&mut self) {
        assert!(self.is_alive(), "cont(): server has exited");
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM, then wait up to `timeout` for the exit. `None` if it is still running then
    /// (it is left running; drop kills it).
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exit_status() {
            return Some(s);
        }
        self.signal(libc::SIGTERM);
        self.wait_exit(timeout)
    }

    /// Wait up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exit {
            return Some(s);
        }
        let status = wait_timeout(&mut self.child, timeout);
        if status.is_some() {
            self.exit = status;
            // The pipes close with the process: let the readers finish so stderr is whole.
            for r in self.readers.drain(..) {
                let _ = r.join();
            }
        }
        status
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.is_alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            // The failing test's most useful clue is often what the server said.
            let text = self.stderr_text();
            let tail_start = text.len().saturating_sub(8 << 10);
            let tail_start = (tail_start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
            eprintln!("--- farcache server {} stderr (last 8 KiB) ---\n{}", self.addr, &text[tail_start..]);
        }
    }
}

fn append(c: &Mutex<Captured>, data: &[u8]) {
    let mut c = c.lock().unwrap();
    let room = MAX_STDERR_BYTES.saturating_sub(c.bytes.len());
    let keep = data.len().min(room);
    c.bytes.extend_from_slice(&data[..keep]);
    c.dropped += data.len() - keep;
}

fn spawn_capture(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<Captured>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 << 10];
        // Ends when the child closes the pipe (it exits or is killed).
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => append(&into, &buf[..n]),
            }
        }
    })
}

/// Poll `child` until it exits or `timeout` passes.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("try_wait: {e}"),
        }
    }
}

/// Run `bin args...` to completion (at most 30 s) with captured output; panics, naming the
/// command, if it had to be killed. For the CLI's short commands in tests.
pub fn run_bin(bin: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    run_with_timeout(cmd, Duration::from_secs(30)).unwrap_or_else(|e| panic!("{} {args:?}: {e}", bin.display()))
}

/// Captured output as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Run a command to completion with captured output, killing it after `timeout`.
/// `Err` (with what it printed) if it had to be killed.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawn {cmd:?}: {e}"))?;
    let out = Arc::new(Mutex::new(Captured::default()));
    let err = Arc::new(Mutex::new(Captured::default()));
    let r1 = spawn_capture(child.stdout.take().unwrap(), out.clone());
    let r2 = spawn_capture(child.stderr.take().unwrap(), err.clone());
    let status = wait_timeout(&mut child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = r1.join();
    let _ = r2.join();
    let take = |c: &Arc<Mutex<Captured>>| std::mem::take(&mut c.lock().unwrap().bytes);
    match status {
        Some(status) => Ok(Output { status, stdout: take(&out), stderr: take(&err) }),
        None => Err(format!(
            "{cmd:?} did not finish within {timeout:?}; stdout: {:?}; stderr: {:?}",
            String::from_utf8_lossy(&take(&out)),
            String::from_utf8_lossy(&take(&err))
        )),
    }
}

/// Whether every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat): kill(2)
/// only queues SIGSTOP, and each thread stops when it is next scheduled.
pub(crate) fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // "pid (comm) S ...": the state follows the last ')', as comm may hold anything.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T") | Some("t")) {
            return false;
        }
        any = true;
    }
    any
}
