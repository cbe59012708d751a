//! `farcache mount --supervise ...`: a small process that keeps the mount's FUSE connection
//! alive across crashes of the daemon, and restarts it.
//!
//! The kernel keeps a FUSE connection while any process holds one of its `/dev/fuse`
//! descriptors, and a request read by a daemon stays queued on the descriptor it was read
//! from until it is answered or that descriptor's last copy is closed. So the supervisor
//! holds a copy of every descriptor the daemon reads from (the daemon *deposits* them, with
//! its state, over a socket pair as soon as it serves). When the daemon dies, nothing is
//! lost: the supervisor starts a new one, which *withdraws* the descriptors, takes the
//! connection over (`Mount::adopt`) and asks the kernel to resend what the dead one had read
//! (`FUSE_NOTIFY_RESEND`, Linux 6.9+). Applications see a stall, not an error.
//!
//! ```text
//! daemon → supervisor  {"cmd":"deposit","fds":N}, N descriptors, {"state":{...}}
//! daemon → supervisor  {"cmd":"withdraw"}           (a restarted daemon, before it serves)
//! supervisor → daemon  {"ok":true,"fds":N}, N descriptors, {"state":{...}}
//! ```
//!
//! Inodes the kernel knows that lose their last name are *kept* by the supervisor too
//! (`{"cmd":"keep","nodeid":N}` with their `O_PATH` descriptor, `{"cmd":"release",...}` when
//! the kernel forgets them): after a crash, node ids are resolved by inode number, which
//! must not have been reused meanwhile — and such files, still open somewhere, stay readable.
//! A mount of several branches keeps every inode the kernel knows this way (its node ids
//! are not inode numbers: `farcache_fuse::Kept::Known`). Before a restart the dead daemon's
//! link is read to its end, so nothing it told is lost to the race with its exit.
//!
//! The first three crashes within the window restart at once, later ones back off (50 ms
//! doubling to 2 s between restarts), and more than `--restart-limit`
//! within `--restart-window` end in a clear failure: the supervisor detaches the mount (so
//! the mount point is not left dead) and exits 1. SIGTERM/SIGINT go to the daemon, which
//! unmounts as usual; SIGHUP upgrades in place: a new daemon from the binary on disk takes
//! over from the running one (`--takeover`) and deposits anew. The supervisor never reads
//! requests and holds no other state, so it has nothing to upgrade.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use farcache_fuse::{Handover, HandoverState};
use serde_json::{json, Value};

use crate::control::fds;

/// The exit code of a supervised daemon that handed its mount to the next one (0 means it
/// unmounted): the supervisor then follows the new daemon, or, if that one is gone too,
/// restarts one.
pub const HANDED_OVER: i32 = 75;

/// The environment variable naming the daemon's end of its socket pair.
pub const SUPERVISOR_FD: &str = "FARCACHE_SUPERVISOR_FD";
/// Set for a daemon the supervisor restarts after a crash: it withdraws, then adopts.
pub const SUPERVISOR_RESTART: &str = "FARCACHE_SUPERVISOR_RESTART";
/// The incarnation the supervisor gives each daemon it starts, one more each time: handle
/// numbers carry it, so two daemons of one mount must never share one — also when the last
/// deposit is older than the daemon that died (it crashed before depositing).
pub const INCARNATION: &str = "FARCACHE_INCARNATION";
const MAX_LINE_BYTES: usize = 256 << 20;
/// Crashes within the window restarted without delay.
const FREE_RESTARTS: usize = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The deposit the supervisor holds: copies of the descriptors and the state.
type Deposit = Arc<Mutex<Option<Handover>>>;
/// Kept inodes by node id.
type KeptMap = Arc<Mutex<std::collections::HashMap<u64, OwnedFd>>>;
/// Most inodes kept (a bound on the supervisor's descriptors; mount.max_inodes' default).
const MAX_KEPT: usize = 1_000_000;

/// Send `h` (descriptors and state) after a header line `head`.
fn send_handover(s: &UnixStream, head: Value, h: &Handover) -> std::io::Result<()> {
    let list = h.fds();
    let mut head = head;
    head["fds"] = json!(list.len());
    fds::write_line(s, &head)?;
    fds::send_fds(s, &list)?;
    fds::write_line(s, &json!({ "state": h.state }))
}

/// Receive what [`send_handover`] sent, the header line already read.
fn recv_handover(s: &UnixStream, head: &Value) -> anyhow::Result<Handover> {
    let n = head["fds"].as_u64().unwrap_or(0) as usize;
    if n == 0 || n > 1 + farcache_fuse::MAX_THREADS as usize + 1_000_000 {
        bail!("{n} descriptors announced");
    }
    let got = fds::recv_fds(s, n)?;
    let doc: Value = serde_json::from_slice(&fds::read_line(s, MAX_LINE_BYTES)?)?;
    let state: HandoverState = serde_json::from_value(doc["state"].clone())?;
    Ok(Handover::from_fds(state, got)?)
}

/// The daemon's arguments as given, without the supervisor's own options.
pub fn daemon_args() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut it = std::env::args_os().skip(1).skip_while(|a| a != "mount").skip(1);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--supervise" || s.starts_with("--restart-limit=") || s.starts_with("--restart-window=") {
            continue;
        }
        if s == "--restart-limit" || s == "--restart-window" {
            it.next();
            continue;
        }
        out.push(a);
    }
    out
}

/// The daemon's side of the socket pair; writes from several threads are whole messages.
pub struct Link(Mutex<UnixStream>);

impl Link {
    fn stream(&self) -> std::sync::MutexGuard<'_, UnixStream> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serve `mount` as a supervised daemon: it stays mounted when this process ends (only
    /// an explicit unmount ends it), its request buffers are faulted in before it reads (a
    /// SIGKILL while the kernel copies a request into a page not yet present would be an
    /// EIO to the application), its kept inodes are reported here, and copies of its
    /// descriptors are deposited with the supervisor.
    pub fn adopt(self: &Arc<Self>, mount: &mut farcache_fuse::Mount) -> anyhow::Result<()> {
        mount.keep_mounted_on_drop();
        mount.prefault_request_buffers();
        mount.set_keeper(self.keeper());
        self.deposit(&mount.deposit()?)
    }

    /// Hand copies of the descriptors and state to the supervisor.
    pub fn deposit(&self, h: &Handover) -> anyhow::Result<()> {
        send_handover(&self.stream(), json!({ "cmd": "deposit" }), h)
            .context("depositing the FUSE descriptors with the supervisor")
    }

    /// After a crash of the previous daemon: take the deposit (and the kept inodes).
    pub fn withdraw(&self) -> anyhow::Result<Handover> {
        let s = self.stream();
        fds::write_line(&s, &json!({ "cmd": "withdraw" }))?;
        let head: Value = serde_json::from_slice(&fds::read_line(&s, MAX_LINE_BYTES)?)?;
        if head["ok"] != true {
            bail!("the supervisor has nothing to hand over: {}", head["error"].as_str().unwrap_or("?"));
        }
        recv_handover(&s, &head).context("withdrawing the FUSE descriptors from the supervisor")
    }

    /// The keeper a supervised mount reports to (`farcache_fuse::Mount::set_keeper`).
    pub fn keeper(self: &Arc<Self>) -> farcache_fuse::Keeper {
        let link = self.clone();
        Box::new(move |k| {
            let s = link.stream();
            let res = match k {
                farcache_fuse::Kept::Unlinked { nodeid, fd } | farcache_fuse::Kept::Known { nodeid, fd } => {
                    fds::write_line(&s, &json!({ "cmd": "keep", "nodeid": nodeid }))
                        .and_then(|()| fds::send_fds(&s, &[fd]))
                }
                farcache_fuse::Kept::Forgotten { nodeid } => {
                    fds::write_line(&s, &json!({ "cmd": "release", "nodeid": nodeid }))
                }
            };
            if let Err(e) = res {
                tracing::warn!("telling the supervisor about an inode to keep: {e}");
            }
        })
    }
}

/// The daemon's side: the socket to its supervisor, if it has one.
pub fn daemon_link() -> Option<Arc<Link>> {
    let v = std::env::var(SUPERVISOR_FD).ok()?;
    let fd: i32 = v.parse().ok()?;
    // SAFETY: the supervisor passed this descriptor to us for this purpose; we take it once
    // (the variable is removed, so nothing else in this process claims it).
    let s = unsafe { UnixStream::from_raw_fd(fd) };
    std::env::remove_var(SUPERVISOR_FD);
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(10)));
    // Not inherited by anything this daemon starts.
    // SAFETY: plain fcntl on a descriptor we own.
    unsafe { libc::fcntl(s.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Some(Arc::new(Link(Mutex::new(s))))
}

/// Whether this daemon was started by the supervisor after a crash.
pub fn is_restart() -> bool {
    std::env::var_os(SUPERVISOR_RESTART).is_some()
}

/// Make `h`, about to be adopted (which takes its incarnation + 1), give this daemon at least
/// the incarnation its supervisor assigned.
pub fn assign_incarnation(h: &mut Handover) {
    if let Some(n) = std::env::var(INCARNATION).ok().and_then(|v| v.parse::<u32>().ok()) {
        h.state.incarnation = h.state.incarnation.max(n.saturating_sub(1));
    }
}

/// Serve one daemon's link: store its deposits, answer its withdrawal.
fn serve_link(s: UnixStream, deposit: Deposit, kept: KeptMap, deposited: mpsc::Sender<u32>, pid: u32) {
    loop {
        let line = match fds::read_line(&s, MAX_LINE_BYTES) {
            Ok(l) => l,
            Err(_) => return, // the daemon exited (or closed its end)
        };
        let req: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
        match req["cmd"].as_str() {
            Some("deposit") => match recv_handover(&s, &req) {
                Ok(h) => {
                    tracing::debug!("supervisor: pid {pid} deposited {:?}", h);
                    *deposit.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                    let _ = deposited.send(pid);
                }
                Err(e) => {
                    tracing::error!("supervisor: a bad deposit from pid {pid}: {e:#}");
                    return;
                }
            },
            Some("keep") => {
                let Some(nodeid) = req["nodeid"].as_u64() else {
                    tracing::error!("supervisor: a bad keep from pid {pid}: {req}");
                    return;
                };
                let mut fd = match fds::recv_fds(&s, 1) {
                    Ok(fd) => fd,
                    // The message came (the stream is in step) but its descriptor did not:
                    // this process is out of descriptors. That node will not survive a crash.
                    Err(e) if e.kind() == std::io::ErrorKind::Other => {
                        tracing::warn!("supervisor: cannot keep node {nodeid} of pid {pid}: {e}");
                        continue;
                    }
                    Err(e) => {
                        tracing::error!("supervisor: a bad keep from pid {pid}: {e}");
                        return;
                    }
                };
                let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
                if k.len() < MAX_KEPT || k.contains_key(&nodeid) {
                    k.insert(nodeid, fd.remove(0));
                }
            }
            Some("release") => {
                if let Some(nodeid) = req["nodeid"].as_u64() {
                    kept.lock().unwrap_or_else(|e| e.into_inner()).remove(&nodeid);
                }
            }
            Some("withdraw") => {
                let d = deposit.lock().unwrap_or_else(|e| e.into_inner());
                let res = match d.as_ref().map(|h| with_kept(h, &kept)) {
                    Some(Ok(h)) => send_handover(&s, json!({ "ok": true }), &h),
                    Some(Err(e)) => fds::write_line(&s, &json!({ "ok": false, "error": e.to_string() })),
                    None => fds::write_line(&s, &json!({ "ok": false, "error": "no deposit" })),
                };
                if let Err(e) = res {
                    tracing::warn!("supervisor: handing the descriptors to pid {pid}: {e}");
                }
            }
            _ => {
                tracing::error!("supervisor: unexpected message from pid {pid}: {req}");
                return;
            }
        }
    }
}

/// A copy of the deposit with the kept inodes added.
fn with_kept(h: &Handover, kept: &KeptMap) -> std::io::Result<Handover> {
    let mut h = h.try_clone()?;
    for (nodeid, fd) in kept.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        h.keep.push(fd.try_clone()?);
        h.state.keep_nodes.push(*nodeid);
    }
    Ok(h)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    First,
    Restart,
    Takeover,
}

/// What the supervisor needs to start daemons.
struct Spawner {
    exe: PathBuf,
    args: Vec<OsString>,
    deposit: Deposit,
    kept: KeptMap,
    deposited: mpsc::Sender<u32>,
    /// The next daemon's incarnation (the first one's is 0).
    next_incarnation: std::sync::atomic::AtomicU32,
    /// Each daemon's link thread, by pid.
    links: Mutex<std::collections::HashMap<u32, std::thread::JoinHandle<()>>>,
}

impl Spawner {
    fn spawn(&self, mode: Mode) -> anyhow::Result<Child> {
        let (ours, theirs) = UnixStream::pair().context("supervisor: socketpair")?;
        let theirs = OwnedFd::from(theirs);
        let fd = theirs.as_raw_fd();
        let mut cmd = Command::new(&self.exe);
        let incarnation = self.next_incarnation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cmd.arg("mount").args(&self.args).env(SUPERVISOR_FD, fd.to_string()).env(INCARNATION, incarnation.to_string());
        match mode {
            Mode::First => {}
            Mode::Restart => {
                cmd.env(SUPERVISOR_RESTART, "1");
            }
            Mode::Takeover => {
                cmd.arg("--takeover");
            }
        }
        if mode != Mode::First {
            // The supervised mount's one stdout line ("farcache mounted ...") is the first
            // daemon's. A restarted or upgraded one writes its line nowhere: stdout is often a
            // pipe whose reader took the first line and left (a script, a test harness), and
            // ~500 restarts' lines filled its 64 KiB, blocking the next daemon before it
            // served (found by `make test-long`). Its log says it started.
            cmd.stdout(std::process::Stdio::null());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: clear close-on-exec
        // on the daemon's end, and (the supervisor blocks them) unblock the usual signals.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("supervisor: starting {}", self.exe.display()))?;
        drop(theirs);
        let (deposit, kept, deposited, pid) =
            (self.deposit.clone(), self.kept.clone(), self.deposited.clone(), child.id());
        let link = std::thread::Builder::new()
            .name("farcache-supervisor-link".into())
            .spawn(move || serve_link(ours, deposit, kept, deposited, pid))?;
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.retain(|_, t| !t.is_finished());
        links.insert(pid, link);
        Ok(child)
    }

    /// Before a restart: the dead daemon's link has read everything it sent (inodes it
    /// told us to keep may still be in the socket when its exit is seen), at most `wait`.
    fn drain_link(&self, pid: u32, wait: Duration) {
        let Some(t) = self.links.lock().unwrap_or_else(|e| e.into_inner()).remove(&pid) else { return };
        let t0 = Instant::now();
        // The thread ends at the socket's end of file, which the daemon's exit brought.
        while !t.is_finished() && t0.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(2));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            tracing::warn!("supervisor: the link of pid {pid} is still reading after {wait:?}; restarting anyway");
        }
    }
}

/// Run the supervisor. `args` are the mount's arguments without `--supervise` and its own
/// options.
pub fn run(args: Vec<OsString>, restart_limit: u32, restart_window: Duration, mountpoint: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("supervisor: where is this binary?")?;
    // One descriptor per inode kept (a mount of several branches keeps every inode the
    // kernel knows), beyond the usual soft limit of 1,024.
    let limit = farcache_fuse::raise_descriptor_limit(MAX_KEPT as u64 + 1024);
    tracing::debug!("supervisor: open descriptor limit {limit}");
    // Signals are taken synchronously (sigwait-style polling below), so none can kill the
    // supervisor between a crash and the restart.
    let signals = Signals::block()?;
    let (tx, rx) = mpsc::channel();
    let spawner = Spawner {
        exe,
        args,
        deposit: Arc::new(Mutex::new(None)),
        kept: KeptMap::default(),
        deposited: tx,
        next_incarnation: std::sync::atomic::AtomicU32::new(0),
        links: Mutex::default(),
    };
    let mut current = spawner.spawn(Mode::First)?;
    let mut previous: Vec<Child> = Vec::new();
    let mut upgrading: Option<Child> = None;
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    let mut stopping = false;
    tracing::info!("supervisor: daemon pid {} started", current.id());
    loop {
        // Deposits: the newest daemon to deposit is the current one.
        while let Ok(pid) = rx.try_recv() {
            if let Some(up) = upgrading.take() {
                if up.id() == pid {
                    tracing::info!("supervisor: pid {pid} took over from pid {}", current.id());
                    previous.push(std::mem::replace(&mut current, up));
                } else {
                    upgrading = Some(up);
                }
            }
        }
        match signals.take() {
            Some(libc::SIGTERM | libc::SIGINT) if !stopping => {
                stopping = true;
                tracing::info!("supervisor: stopping: SIGTERM to pid {}", current.id());
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(current.id() as i32, libc::SIGTERM) };
            }
            Some(libc::SIGHUP) if upgrading.is_none() && !stopping => {
                tracing::info!("supervisor: SIGHUP: upgrading in place (a new daemon takes over)");
                match spawner.spawn(Mode::Takeover) {
                    Ok(c) => upgrading = Some(c),
                    Err(e) => tracing::error!("supervisor: {e:#}"),
                }
            }
            _ => {}
        }
        previous.retain_mut(|c| c.try_wait().ok().flatten().is_none());
        if let Some(up) = upgrading.as_mut() {
            if let Some(st) = up.try_wait()? {
                // If the old daemon handed over before this, it exits with HANDED_OVER
                // and a daemon is restarted below; otherwise it serves on.
                tracing::error!("supervisor: the new daemon exited ({st}) during the upgrade");
                upgrading = None;
            }
        }
        let Some(st) = current.try_wait()? else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let handed_over = st.code() == Some(HANDED_OVER);
        if !st.success() {
            if let Some(up) = upgrading.take() {
                // The old daemon handed over and left (its `bye` was the last thing it sent),
                // or died during the upgrade: the new one serves, or fails and is restarted
                // below. Its deposit may not have come yet.
                tracing::info!("supervisor: pid {} follows pid {} ({st})", up.id(), current.id());
                current = up;
                continue;
            }
        }
        if handed_over {
            tracing::warn!("supervisor: pid {} handed over to a daemon that is gone", current.id());
        } else if stopping || st.success() {
            tracing::info!("supervisor: the daemon ended ({st}); exiting");
            return if st.success() { Ok(()) } else { bail!("the daemon ended with {st}") };
        }
        if spawner.deposit.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            bail!("the daemon exited ({st}) before it served the mount; see its log above");
        }
        let now = Instant::now();
        crashes.push_back(now);
        while crashes.front().is_some_and(|t| now.duration_since(*t) > restart_window) {
            crashes.pop_front();
        }
        if crashes.len() as u32 > restart_limit {
            give_up(mountpoint, &spawner.deposit);
            bail!(
                "the daemon crashed {} times within {restart_window:?} (last: {st}); gave up and unmounted {}; \
                 fix: read the daemon's log above, then mount again (--restart-limit sets how many crashes are \
                 tolerated)",
                crashes.len(),
                mountpoint.display()
            );
        }
        // The first crashes restart at once (the stall is the application's); a loop of them
        // backs off, then ends at the limit.
        let backoff = match crashes.len().checked_sub(FREE_RESTARTS + 1) {
            None => Duration::ZERO,
            Some(n) => FIRST_BACKOFF.saturating_mul(1 << n.min(6)).min(MAX_BACKOFF),
        };
        tracing::warn!(
            "supervisor: the daemon (pid {}) died ({st}); restarting in {backoff:?} ({} of at most {restart_limit} \
             restarts within {restart_window:?})",
            current.id(),
            crashes.len()
        );
        std::thread::sleep(backoff);
        spawner.drain_link(current.id(), Duration::from_secs(5));
        current = spawner.spawn(Mode::Restart)?;
        tracing::info!("supervisor: daemon pid {} started", current.id());
    }
}

/// The last resort: no daemon will serve, so end the connection and detach the mount (a
/// dead mount point would answer "Transport endpoint is not connected" until someone
/// unmounts it).
fn give_up(mountpoint: &Path, deposit: &Deposit) {
    if let Some(h) = deposit.lock().unwrap_or_else(|e| e.into_inner()).take() {
        if farcache_fuse::mounted_dev(mountpoint) == Some(h.state.dev) {
            let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes()).unwrap_or_default();
            // SAFETY: plain syscall with a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        drop(h);
    }
}

/// SIGTERM, SIGINT and SIGHUP, blocked and polled.
struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    fn block() -> anyhow::Result<Signals> {
        // SAFETY: sigset manipulation on a local; the mask applies to this thread and the
        // threads it starts later (the link threads), so no thread takes these signals.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                bail!("supervisor: cannot block signals");
            }
            Ok(Signals { set })
        }
    }

    /// A pending signal, if any (does not wait).
    fn take(&self) -> Option<i32> {
        let ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: sigtimedwait with a zero timeout on our blocked set.
        let s = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (s > 0).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deposit_and_withdraw_round_trip() {
        let (sup, daemon) = UnixStream::pair().unwrap();
        let deposit: Deposit = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let d2 = deposit.clone();
        let kept = KeptMap::default();
        let k2 = kept.clone();
        let t = std::thread::spawn(move || serve_link(sup, d2, k2, tx, 7));
        let daemon = Arc::new(Link(Mutex::new(daemon)));
        let f = std::fs::File::open("/dev/null").unwrap();
        let h = Handover {
            fuse: OwnedFd::from(f),
            workers: vec![OwnedFd::from(std::fs::File::open("/dev/null").unwrap())],
            keep: Vec::new(),
            state: HandoverState {
                protocol: farcache_fuse::TAKEOVER_PROTOCOL,
                dev: 42,
                incarnation: 3,
                workers: 1,
                ..HandoverState::default()
            },
        };
        daemon.deposit(&h).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 7);
        // Two inodes kept, one released: the withdrawal carries the other.
        let keeper = daemon.keeper();
        let f1 = std::fs::File::open("/dev/null").unwrap();
        let f2 = std::fs::File::open("/dev/null").unwrap();
        keeper(farcache_fuse::Kept::Unlinked { nodeid: 11, fd: std::os::fd::AsFd::as_fd(&f1) });
        keeper(farcache_fuse::Kept::Unlinked { nodeid: 12, fd: std::os::fd::AsFd::as_fd(&f2) });
        keeper(farcache_fuse::Kept::Forgotten { nodeid: 11 });
        let back = daemon.withdraw().unwrap();
        assert_eq!((back.state.dev, back.state.incarnation, back.workers.len()), (42, 3, 1));
        assert_eq!((back.state.keep_nodes.clone(), back.keep.len()), (vec![12], 1));
        drop(keeper);
        drop(daemon);
        t.join().unwrap();
        assert!(deposit.lock().unwrap().is_some());
        assert_eq!(kept.lock().unwrap().len(), 1);
    }
}
