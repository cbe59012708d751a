//! `farcache mount --takeover`: handing a live mount from the running daemon to a new one,
//! over the running daemon's control socket.
//!
//! ```text
//! new → old  {"cmd":"takeover","protocol":1,"version":"0.1.0","pid":N}
//! old → new  {"ok":true,"phase":"offer","protocol":1,"version":...,"pid":...,"settings":{...}}
//!            (or {"ok":false,"error":...}: protocol mismatch, a takeover already under way)
//! new → old  {"cmd":"proceed"}, or {"cmd":"abort","reason":...} when the settings differ
//!   old: stops reading requests at a clean point (each one read is answered)
//! old → new  {"ok":true,"phase":"handover","fds":N}, N descriptors (SCM_RIGHTS: the main
//!            /dev/fuse one, the workers' clones, unlinked inodes), {"state":{...}}
//! new → old  {"cmd":"done"} once its session is set up
//! old → new  {"ok":true,"phase":"bye"}; the old daemon exits, the new one starts serving.
//! ```
//!
//! The old daemon keeps its own copies until `done`: if the new one goes away or says
//! nothing within [`DONE_TIMEOUT`], the old one serves again (asking the kernel to resend
//! whatever the new one had read). The new one serves only once it has the `bye`, so the two
//! never serve at once: without it (the old one timed out, or died) the new one exits.
//! Nothing fails meanwhile: requests wait in the kernel.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use farcache_fuse::{Handover, HandoverState, MountHandle, INIT_KEYS, TAKEOVER_PROTOCOL};
use serde_json::{json, Value};

use super::fds;

/// Each step of the exchange must come within this.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the old daemon waits for `done` after handing over before it serves again.
pub const DONE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the old daemon waits for its workers to finish the requests in hand.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest state document accepted (a node is ~100 bytes of JSON: a million inodes fit).
const MAX_STATE_BYTES: usize = 256 << 20;
const MAX_LINE_BYTES: usize = 1 << 20;

/// The settings two daemons must share to hand a mount over: what the mount is, and what
/// the kernel was promised at INIT ([`INIT_KEYS`]). Other settings may change.
///
/// A mount with a write-back tier also names it (`tier`): a new daemon given another tier
/// (or none) would leave what the running one's tier holds behind. The key is absent
/// without a tier, as from daemons of versions that could not hand a tier over (they
/// refused to take a tier's mount over, and a tier's mount from one does not match).
pub fn settings(
    backing: &Path,
    mountpoint: &Path,
    remote_tier: &str,
    mount: &farcache_fuse::MountConfig,
    tier: Option<&Path>,
) -> Value {
    let m = serde_json::to_value(mount).unwrap_or(Value::Null);
    let init: serde_json::Map<String, Value> =
        INIT_KEYS.iter().map(|k| (format!("mount.{k}"), m.get(*k).cloned().unwrap_or(Value::Null))).collect();
    let mut v = json!({
        "backing_dir": backing.display().to_string(),
        "mountpoint": mountpoint.display().to_string(),
        "remote_tier": remote_tier,
        "init": init,
    });
    if let Some(t) = tier {
        v["tier"] = json!(t.display().to_string());
    }
    v
}

/// The first difference between the running daemon's settings and ours, as `key: problem`.
fn mismatch(running: &Value, ours: &Value) -> Option<String> {
    // A ring entry's request in flight cannot be handed over: there is no commit without a
    // fetch, and the kernel resends none of them (ARCHITECTURE.md, "The FUSE transport").
    if running.get("fuse_transport").and_then(Value::as_str) == Some("io_uring") {
        return Some(
            "fuse_transport: the running daemon serves over FUSE-over-io_uring, whose requests in flight cannot be \
             handed to another daemon (mount it with mount.fuse_uring = \"off\" to be able to take it over)"
                .into(),
        );
    }
    // Files open in the kernel's passthrough are tied to backing ids the next daemon would not
    // know: its opens of those files would fail (the kernel allows one backing per inode).
    if running.get("kernel_passthrough").and_then(Value::as_bool) == Some(true) {
        return Some(
            "kernel_passthrough: the running daemon serves files with the kernel's passthrough, whose open files \
             cannot be handed to another daemon (mount it with mount.kernel_passthrough = false to be able to take \
             it over)"
                .into(),
        );
    }
    for k in ["backing_dir", "mountpoint", "remote_tier", "tier"] {
        if running.get(k) != ours.get(k) {
            return Some(format!("{k}: the running daemon has {}, this one {}", running[k], ours[k]));
        }
    }
    let (r, o) = (running["init"].as_object()?, ours["init"].as_object()?);
    for (k, v) in o {
        if r.get(k) != Some(v) {
            return Some(format!(
                "{k}: the running daemon has {}, this one {} (the kernel was promised the running one's at mount time)",
                r.get(k).unwrap_or(&Value::Null),
                v
            ));
        }
    }
    None
}

/// The running daemon's side: answers one takeover at a time.
pub struct Giver {
    handle: MountHandle,
    settings: Value,
    /// This daemon runs under `--supervise`: only a daemon of the same supervisor (started
    /// by its SIGHUP) may take over, or the supervisor would lose the mount.
    supervised: bool,
    busy: AtomicBool,
    /// Set while a handover is under way: the channel the main thread sends the copies of
    /// the descriptors on, and the one it hears the outcome on.
    main_side: Mutex<Option<(mpsc::SyncSender<Handover>, mpsc::Receiver<bool>)>>,
}

/// What the main thread does once its session stopped for a handover.
pub enum Outcome {
    /// The new daemon serves: exit.
    Done,
    /// It did not take over: serve again, from these.
    Resume(Handover),
}

impl Giver {
    pub fn new(handle: MountHandle, settings: Value, supervised: bool) -> Giver {
        Giver { handle, settings, supervised, busy: AtomicBool::new(false), main_side: Mutex::new(None) }
    }

    /// Called by the main thread when `Mount::run` ended with a handover.
    pub fn complete(&self, h: Handover) -> Outcome {
        let Some((tx, rx)) = self.main_side.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Outcome::Resume(h);
        };
        let copy = match h.try_clone() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("takeover: cannot copy the FUSE descriptors: {e}; serving on");
                return Outcome::Resume(h);
            }
        };
        if tx.send(copy).is_err() {
            return Outcome::Resume(h);
        }
        match rx.recv_timeout(DONE_TIMEOUT + STEP_TIMEOUT * 2) {
            Ok(true) => Outcome::Done,
            _ => Outcome::Resume(h),
        }
    }

    /// The control thread's side of one takeover request on `s`.
    pub fn serve(&self, s: UnixStream, req: &Value) {
        if self.busy.swap(true, Ordering::SeqCst) {
            let _ = fds::write_line(&s, &super::error("a takeover is already under way; try again"));
            return;
        }
        let res = self.exchange(&s, req);
        self.busy.store(false, Ordering::SeqCst);
        if let Err(e) = res {
            tracing::warn!("takeover: {e:#}; this daemon serves on");
            let _ = fds::write_line(&s, &super::error(format!("{e:#}")));
        }
    }

    fn exchange(&self, s: &UnixStream, req: &Value) -> anyhow::Result<()> {
        let _ = s.set_read_timeout(Some(STEP_TIMEOUT));
        let _ = s.set_write_timeout(Some(STEP_TIMEOUT));
        let theirs = req["protocol"].as_u64().unwrap_or(0);
        let version = req["version"].as_str().unwrap_or("?");
        if theirs != u64::from(TAKEOVER_PROTOCOL) {
            bail!(
                "takeover refused: the new daemon (version {version}) speaks takeover protocol {theirs}, this one \
                 (version {}) {TAKEOVER_PROTOCOL}; fix: upgrade through a version that speaks both, or unmount and \
                 mount again",
                env!("CARGO_PKG_VERSION")
            );
        }
        if self.supervised && req["supervised"] != true {
            bail!(
                "takeover refused: this mount runs under a supervisor (pid {}), which would lose it; fix: upgrade \
                 through the supervisor (kill -HUP {}, or systemctl reload for the unit)",
                std::os::unix::process::parent_id(),
                std::os::unix::process::parent_id()
            );
        }
        fds::write_line(
            s,
            &json!({
                "ok": true, "phase": "offer", "protocol": TAKEOVER_PROTOCOL,
                "version": env!("CARGO_PKG_VERSION"), "pid": std::process::id(), "settings": self.settings,
            }),
        )?;
        let answer: Value = serde_json::from_slice(&fds::read_line(s, MAX_LINE_BYTES)?)?;
        match answer["cmd"].as_str() {
            Some("proceed") => {}
            Some("abort") => {
                tracing::info!("takeover: the new daemon withdrew: {}", answer["reason"].as_str().unwrap_or("?"));
                return Ok(());
            }
            _ => bail!("takeover: unexpected answer {answer}"),
        }
        // A union: no file may be moving between branches while the next daemon starts
        // (the move in hand finishes first, bounded).
        if let Err(e) = self.handle.quiesce() {
            self.handle.resume();
            bail!(
                "takeover refused for now: {e}; fix: try again once it is done (farcache balance MOUNTPOINT shows it)"
            );
        }
        tracing::info!("takeover: handing the mount over to pid {}", req["pid"]);
        let (h_tx, h_rx) = mpsc::sync_channel(1);
        let (r_tx, r_rx) = mpsc::channel();
        *self.main_side.lock().unwrap_or_else(|e| e.into_inner()) = Some((h_tx, r_rx));
        self.handle.stop_for_handover();
        // From here the main thread resumes serving unless it hears `true`.
        let h = h_rx.recv_timeout(STOP_TIMEOUT).context("the FUSE workers did not stop in time")?;
        let fds_list = h.fds();
        fds::write_line(s, &json!({ "ok": true, "phase": "handover", "fds": fds_list.len() }))?;
        fds::send_fds(s, &fds_list)?;
        fds::write_line(s, &json!({ "state": h.state }))?;
        let _ = s.set_read_timeout(Some(DONE_TIMEOUT));
        let done = fds::read_line(s, MAX_LINE_BYTES)
            .ok()
            .and_then(|l| serde_json::from_slice::<Value>(&l).ok())
            .is_some_and(|v| v["cmd"] == "done")
            && fds::write_line(s, &json!({ "ok": true, "phase": "bye" })).is_ok();
        if !done {
            // The new daemon must not serve now: it waits for the `bye` it will never get.
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // Said before the main thread hears it: on `true` it exits at once, and a line this
        // thread logged after that could be lost with the process.
        if done {
            tracing::info!("takeover: the new daemon serves; exiting");
        }
        let _ = r_tx.send(done);
        if !done {
            bail!("the new daemon did not confirm the takeover within {DONE_TIMEOUT:?}");
        }
        Ok(())
    }
}

/// The running daemon, as the new one sees it during a takeover.
pub struct Giving {
    conn: UnixStream,
    pid: u32,
}

/// The new daemon's side: everything up to the descriptors in hand; [`confirm`] then tells
/// the running daemon to go.
pub fn request(socket: &Path, ours: &Value, supervised: bool) -> anyhow::Result<(Handover, Giving)> {
    let s = UnixStream::connect(socket).with_context(|| {
        format!(
            "--takeover: no daemon answers on the control socket {}; fix: check the mount point (and \
             --control-socket), or mount without --takeover",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(STOP_TIMEOUT + STEP_TIMEOUT))?;
    s.set_write_timeout(Some(STEP_TIMEOUT))?;
    fds::write_line(
        &s,
        &json!({ "cmd": "takeover", "protocol": TAKEOVER_PROTOCOL, "version": env!("CARGO_PKG_VERSION"),
                 "pid": std::process::id(), "supervised": supervised }),
    )?;
    let offer: Value = serde_json::from_slice(&fds::read_line(&s, MAX_LINE_BYTES)?)?;
    if offer["ok"] != true {
        bail!("--takeover: the running daemon refused: {}", offer["error"].as_str().unwrap_or("?"));
    }
    if let Some(m) = mismatch(&offer["settings"], ours) {
        let _ = fds::write_line(&s, &json!({ "cmd": "abort", "reason": m }));
        bail!(
            "--takeover refused, the running daemon (pid {}) serves on: {m}; fix: start the new daemon with the \
             running one's settings, or unmount and mount again to change them",
            offer["pid"]
        );
    }
    fds::write_line(&s, &json!({ "cmd": "proceed" }))?;
    let head: Value = serde_json::from_slice(&fds::read_line(&s, MAX_LINE_BYTES)?)?;
    if head["ok"] != true {
        bail!("--takeover: the running daemon could not hand over: {}", head["error"].as_str().unwrap_or("?"));
    }
    let n = head["fds"].as_u64().unwrap_or(0) as usize;
    if n == 0 || n > 1 + farcache_fuse::MAX_THREADS as usize + 1_000_000 {
        bail!("--takeover: the running daemon announced {n} descriptors");
    }
    let received = fds::recv_fds(&s, n).context("--takeover: receiving the FUSE descriptors")?;
    let line = fds::read_line(&s, MAX_STATE_BYTES).context("--takeover: receiving the state")?;
    let doc: Value = serde_json::from_slice(&line)?;
    let state: HandoverState = serde_json::from_value(doc["state"].clone())?;
    let h = Handover::from_fds(state, received)?;
    let pid = offer["pid"].as_u64().and_then(|p| u32::try_from(p).ok()).unwrap_or(0);
    Ok((h, Giving { conn: s, pid }))
}

/// Tell the running daemon the new one is ready, and wait for its goodbye: only then may
/// the new one serve. Without it the old one serves again — or is dead, killed after it
/// handed over: then nobody serves the mount and the new one must (checked by its pid).
pub fn confirm(g: &Giving) -> anyhow::Result<()> {
    match goodbye(&g.conn) {
        Ok(()) => Ok(()),
        Err(e) if g.pid != 0 && gone_soon(g.pid) => {
            tracing::warn!("takeover: the running daemon (pid {}) died before its goodbye ({e:#}); serving", g.pid);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Whether process `pid` has exited (or becomes a zombie) within a second: a daemon killed
/// after it handed over closes its end of the connection while it exits.
fn gone_soon(pid: u32) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) STATE ...: the state follows the last ')'.
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        if matches!(state, None | Some('Z' | 'X')) {
            return true;
        }
        if t0.elapsed() > Duration::from_secs(1) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn goodbye(s: &UnixStream) -> anyhow::Result<()> {
    fds::write_line(s, &json!({ "cmd": "done" }))?;
    s.set_read_timeout(Some(STEP_TIMEOUT))?;
    let bye: Value = serde_json::from_slice(&fds::read_line(s, MAX_LINE_BYTES)?)?;
    if bye["phase"] != "bye" {
        bail!("unexpected answer {bye}");
    }
    Ok(())
}

/// Bind the control socket once the daemon we took over from has let it go (it exits right
/// after our confirmation): bounded retries.
pub fn bind_when_free(path: &Path) -> anyhow::Result<super::server::BoundSocket> {
    let t0 = std::time::Instant::now();
    loop {
        match super::server::BoundSocket::bind(path) {
            Ok(b) => return Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && t0.elapsed() < DONE_TIMEOUT => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("the control socket, after the takeover"),
        }
    }
}

/// `bind` until the port is free (the daemon we took over from exits): bounded retries.
pub fn retry_bind<T>(bind: impl Fn() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let t0 = std::time::Instant::now();
    loop {
        match bind() {
            Ok(v) => return Ok(v),
            Err(_) if t0.elapsed() < DONE_TIMEOUT => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => return Err(e.context("after the takeover")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_shape_init_must_match_others_may_change() {
        let a = farcache_fuse::MountConfig::default();
        let base = settings(Path::new("/b"), Path::new("/m"), "embedded", &a, None);
        let mut b = a.clone();
        b.threads = 4;
        b.attr_timeout = farcache_config::HumanDuration::secs(5);
        assert_eq!(mismatch(&base, &settings(Path::new("/b"), Path::new("/m"), "embedded", &b, None)), None);
        b.max_write = farcache_config::ByteSize::kib(128);
        let m = mismatch(&base, &settings(Path::new("/b"), Path::new("/m"), "embedded", &b, None)).unwrap();
        assert!(m.starts_with("mount.max_write: "), "{m}");
        let m = mismatch(&base, &settings(Path::new("/other"), Path::new("/m"), "embedded", &a, None)).unwrap();
        assert!(m.starts_with("backing_dir: "), "{m}");
        let m = mismatch(&base, &settings(Path::new("/b"), Path::new("/m"), "none", &a, None)).unwrap();
        assert!(m.starts_with("remote_tier: "), "{m}");
        // A tier named on one side only, or two different tiers, do not match.
        let t = |p: &str| settings(Path::new("/b"), Path::new("/m"), "embedded", &a, Some(Path::new(p)));
        assert!(mismatch(&base, &t("/t")).unwrap().starts_with("tier: "));
        assert!(mismatch(&t("/t"), &base).unwrap().starts_with("tier: "));
        assert!(mismatch(&t("/t"), &t("/u")).unwrap().starts_with("tier: "));
        assert_eq!(mismatch(&t("/t"), &t("/t")), None);
        let mut rings = base.clone();
        rings["fuse_transport"] = json!("io_uring");
        assert!(mismatch(&rings, &base).unwrap().starts_with("fuse_transport: "));
        rings["fuse_transport"] = json!("read-loops");
        assert_eq!(mismatch(&rings, &base), None);
        let mut kp = base.clone();
        kp["kernel_passthrough"] = json!(true);
        assert!(mismatch(&kp, &base).unwrap().starts_with("kernel_passthrough: "));
        kp["kernel_passthrough"] = json!(false);
        assert_eq!(mismatch(&kp, &base), None);
    }
}
