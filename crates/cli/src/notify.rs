//! systemd readiness (`Type=notify`): the daemons tell the service manager `READY=1` once
//! they serve (the lender listens, the mount is live) and `STOPPING=1` when a signal starts
//! their shutdown, as sd_notify(3) does: one datagram to the unix socket `$NOTIFY_SOCKET`
//! names (a path, or an abstract name after `@`). Without `$NOTIFY_SOCKET` (not started by
//! systemd) nothing is sent. A few lines over a datagram socket rather than a crate: the
//! protocol is one `sendto`.

use std::os::unix::net::UnixDatagram;

/// The environment variable systemd sets for `Type=notify` services.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Send `state` (newline-separated `KEY=VALUE` lines, e.g. `READY=1`) to the service
/// manager, if there is one. A failure is logged, never fatal: the daemon works without it.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET) else { return };
    if let Err(e) = send(&path, state) {
        tracing::warn!("cannot tell the service manager {state:?} through {NOTIFY_SOCKET}={path:?}: {e}");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<usize> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    match path.as_bytes() {
        [b'@', name @ ..] => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)
        }
        _ => sock.send_to(state.as_bytes(), path),
    }
}

/// `READY=1` with a status line for `systemctl status`, and the main pid (so that a
/// wrapper, e.g. `sudo`, does not confuse systemd about who is ready).
pub fn ready(status: &str) {
    ready_for(status, std::process::id());
}

/// [`ready`] naming `main_pid` as the service's main process: a supervised mount daemon
/// names its supervisor, which must stay the main process (a crash of the daemon is then
/// the supervisor's to handle, not systemd's).
pub fn ready_for(status: &str, main_pid: u32) {
    notify(&format!("READY=1\nSTATUS={status}\nMAINPID={main_pid}"));
}

/// `STOPPING=1`: the daemon is shutting down on purpose.
pub fn stopping() {
    notify("STOPPING=1\nSTATUS=stopping");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("notify");
        let listener = UnixDatagram::bind(&p).unwrap();
        send(p.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("farcache-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abs = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        // Nobody listening: an error, not a panic.
        assert!(send(dir.path().join("none").as_os_str(), "READY=1").is_err());
    }
}
