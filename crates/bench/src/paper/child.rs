//! A child process of the testbed (lender, mount daemon, load generator): its stdout read
//! line by line on a thread (so every wait is bounded and sees signals), stopped with
//! SIGTERM then SIGKILL when dropped.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::sys;
use crate::error::IoContext;
use crate::{BenchError, Result};

pub struct Child {
    name: String,
    child: std::process::Child,
    log: PathBuf,
    lines: mpsc::Receiver<String>,
    stdin: Option<ChildStdin>,
    /// How long a SIGTERM gets before SIGKILL.
    pub stop_timeout: Duration,
    status: Option<ExitStatus>,
}

impl Child {
    /// Start `cmd` with stdout piped (read by a thread), stderr to `log`, stdin piped when
    /// `with_stdin`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path, with_stdin: bool) -> Result<Child> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
        }
        let log_file = std::fs::File::create(log).ctx(|| format!("create {}", log.display()))?;
        cmd.stdin(if with_stdin { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(log_file);
        let mut child = cmd.spawn().ctx(|| format!("start {name} ({cmd:?})"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("paper-{name}-stdout"))
            .spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .ctx(|| "spawn a reader thread".into())?;
        let stdin = child.stdin.take();
        Ok(Child {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            lines,
            stdin,
            stop_timeout: Duration::from_secs(10),
            status: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of the child's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// The next line on the child's stdout, waiting at most `limit` (and not past a signal,
    /// nor past the child's death).
    pub fn next_line(&mut self, limit: Duration) -> Result<String> {
        self.try_line(limit)?.ok_or_else(|| {
            BenchError::Setup(format!(
                "{} gave no answer within {limit:?} (bounded wait); its log ends:\n{}",
                self.name,
                self.log_tail()
            ))
        })
    }

    /// Like [`Child::next_line`], but a wait that runs out is `Ok(None)`.
    pub fn try_line(&mut self, limit: Duration) -> Result<Option<String>> {
        let end = Instant::now() + limit;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(l) => return Ok(Some(l)),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Let the exit status settle, then report it with the log.
                    std::thread::sleep(Duration::from_millis(100));
                    let st = self.exited().map_or("still running".to_string(), |s| s.to_string());
                    return Err(BenchError::Setup(format!(
                        "{} closed its output ({st}); its log ends:\n{}",
                        self.name,
                        self.log_tail()
                    )));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            sys::check_interrupt()?;
            if Instant::now() > end {
                return Ok(None);
            }
        }
    }

    /// Send one line on the child's stdin.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let name = self.name.clone();
        let stdin = self.stdin.as_mut().ok_or_else(|| BenchError::Setup(format!("{name} has no stdin")))?;
        writeln!(stdin, "{line}").and_then(|_| stdin.flush()).ctx(|| format!("write to {name}"))
    }

    /// Close stdin (EOF to the child).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Wait up to `limit` for the child to exit on its own.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, wait up to `stop_timeout`, SIGKILL. Idempotent; the exit status if it exited.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if let Some(st) = self.exited() {
            return Some(st);
        }
        sys::signal(self.pid(), libc::SIGTERM);
        if let Some(st) = self.wait_exit(self.stop_timeout) {
            return Some(st);
        }
        note!("paper: {} ignored SIGTERM for {:?}: killing it", self.name, self.stop_timeout);
        let _ = self.child.kill();
        // Bounded even now: a process stuck in the kernel (a FUSE request to a dead daemon)
        // may take a while to die; after 10 s it is left to init rather than hang the run.
        let st = self.wait_exit(Duration::from_secs(10));
        if st.is_none() {
            note!("paper: warning: {} (pid {}) did not die within 10 s of SIGKILL", self.name, self.pid());
        }
        st
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.stdin = None;
        self.stop();
    }
}
