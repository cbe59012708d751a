//! The daemon side of the control channel: one listener thread, one short-lived thread per
//! connection (at most [`MAX_CONNECTIONS`]), one request and one response per connection.
//!
//! Every connection is bounded: [`MAX_REQUEST_BYTES`] per request line, [`IO_TIMEOUT`] to
//! send it and to take the answer. A malformed or hostile client gets an error line (or is
//! dropped) and costs nothing else; none of this runs on, or waits for, a FUSE thread.
//!
//! The socket file: mode 0600 (the owner and root), bound under a 0177 umask so that it is
//! never reachable by others, even for an instant. At start, a socket file already there is
//! removed only if nothing answers on it (a stale one from a daemon that died); if something
//! does, another daemon serves this mount point and starting is an error. On exit the file is
//! removed — only if it is still ours (same device and inode).

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::path::{check_len, euid};
use super::{error, handle, Control, IO_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST_BYTES};

/// How often the listener thread looks at its stop flag.
const POLL_INTERVAL_MS: i32 = 200;
/// How long a refused connection may take to accept its one error line.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The socket file, as bound: removed only while it is still this one.
#[derive(Clone, Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the socket file if it is still ours. Safe to call more than once, and from
    /// another thread just before `process::exit`.
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            if m.dev() == self.dev && m.ino() == self.ino {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// A bound control socket not served yet: the daemon binds first (so that a second daemon
/// for the same mount point fails before it starts anything), then serves once its engine
/// exists. Dropping it removes the socket.
pub struct BoundSocket {
    listener: Option<UnixListener>,
    file: SocketFile,
}

impl BoundSocket {
    /// Bind `path`, after removing a stale socket there. Errors: `AddrInUse` when a live
    /// daemon answers on `path`; `AlreadyExists` when `path` is something else than a socket;
    /// whatever binding says otherwise.
    pub fn bind(path: &Path) -> io::Result<BoundSocket> {
        check_len(path)?;
        clear_stale(path)?;
        let listener = bind_private(path)?;
        let file = match std::fs::symlink_metadata(path) {
            Ok(m) => SocketFile { path: path.to_path_buf(), dev: m.dev(), ino: m.ino() },
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let bound = BoundSocket { listener: Some(listener), file };
        bound.listener.as_ref().expect("just set").set_nonblocking(true)?;
        Ok(bound)
    }

    /// Serve `control` on a thread of its own until the returned server is dropped.
    pub fn serve(mut self, control: Arc<dyn Control>) -> io::Result<ControlServer> {
        let listener = self.listener.take().expect("served once");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("farcache-control".into())
                .spawn(move || accept_loop(listener, control, stop))?
        };
        Ok(ControlServer { file: self.file.clone(), stop, thread: Some(thread) })
    }
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        // Served: the ControlServer owns the file now.
        if self.listener.is_some() {
            self.file.remove();
        }
    }
}

/// A running control listener. Dropping it stops the listener thread and removes the socket.
pub struct ControlServer {
    file: SocketFile,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// [`BoundSocket::bind`] then [`BoundSocket::serve`].
    #[cfg(test)]
    pub fn start(path: &Path, control: Arc<dyn Control>) -> io::Result<ControlServer> {
        BoundSocket::bind(path)?.serve(control)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The socket file, for removal from a thread that ends the process without unwinding.
    pub fn socket_file(&self) -> SocketFile {
        self.file.clone()
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.file.remove();
    }
}

/// Remove a socket file at `path` that nobody answers on.
fn clear_stale(path: &Path) -> io::Result<()> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !m.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket; remove it or choose another --control-socket", path.display()),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "another farcache mount answers on the control socket {}: this mount point is in use \
                 (or choose another --control-socket)",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused || e.kind() == io::ErrorKind::NotFound => {
            tracing::info!("removing stale control socket {}", path.display());
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
        Err(e) => Err(io::Error::new(e.kind(), format!("cannot check the socket at {}: {e}", path.display()))),
    }
}

/// Bind with no permission for group and others from the first instant, then make it 0600.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    // The umask is per process: other threads that create files meanwhile would get it too.
    // The daemon binds before it mounts, while only network threads run, which create none.
    // SAFETY: umask(2) cannot fail.
    let old = unsafe { libc::umask(0o177) };
    let res = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = res.map_err(|e| io::Error::new(e.kind(), format!("cannot bind {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Releases a connection slot when a connection thread ends (or unwinds).
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(used: &Arc<AtomicUsize>) -> Option<Slot> {
        used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_CONNECTIONS).then_some(n + 1))
            .ok()
            .map(|_| Slot(used.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: UnixListener, control: Arc<dyn Control>, stop: Arc<AtomicBool>) {
    let used = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, POLL_INTERVAL_MS) } <= 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, most likely: wait a little rather than spin.
                tracing::debug!("control: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure anyway.
        if stream.set_nonblocking(false).is_err() {
            continue;
        }
        let Some(slot) = Slot::take(&used) else {
            tracing::debug!("control: more than {MAX_CONNECTIONS} connections; refusing one");
            let _ = stream.set_write_timeout(Some(REFUSE_TIMEOUT));
            let msg = format!("too many control connections (at most {MAX_CONNECTIONS}); try again");
            let _ = write_line(&stream, &error(msg));
            continue;
        };
        let control = control.clone();
        let spawned = std::thread::Builder::new().name("farcache-ctl-conn".into()).spawn(move || {
            let _slot = slot;
            serve(stream, &*control);
        });
        if let Err(e) = spawned {
            tracing::warn!("control: cannot start a connection thread: {e}");
        }
    }
}

/// The uid of the process at the other end.
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

fn serve(mut s: UnixStream, control: &dyn Control) {
    if s.set_write_timeout(Some(IO_TIMEOUT)).is_err() {
        return;
    }
    // The socket's mode already keeps others out; this holds also for a socket placed (with
    // --control-socket) where its mode might be changed behind our back.
    match peer_uid(&s) {
        Ok(uid) if uid == 0 || uid == euid() => {}
        Ok(uid) => {
            let _ = write_line(&s, &error(format!("uid {uid} may not control this mount")));
            return;
        }
        Err(_) => return,
    }
    let response = match read_request(&mut s, Instant::now() + IO_TIMEOUT) {
        Ok(Some(line)) if is_takeover(&line) => {
            let req: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
            control.takeover(s, &req);
            return;
        }
        Ok(Some(line)) => {
            // A bug behind the trait must not take the listener down: answer it as an error.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(control, &line)))
                .unwrap_or_else(|_| error("internal error while answering; see the daemon's log"))
        }
        Ok(None) => return,
        Err(ReadError::TooLong) => error(format!("request line longer than {MAX_REQUEST_BYTES} bytes")),
        Err(ReadError::Timeout) => error(format!("no whole request line within {IO_TIMEOUT:?}")),
        Err(ReadError::Io(e)) => {
            tracing::debug!("control: reading a request: {e}");
            return;
        }
    };
    if response["ok"] == false {
        tracing::debug!("control: {}", response["error"]);
    }
    if let Err(e) = write_line(&s, &response) {
        tracing::debug!("control: writing a response: {e}");
    }
}

/// A takeover request: the connection then carries an exchange of its own.
fn is_takeover(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line).is_ok_and(|v| v["cmd"] == "takeover")
}

enum ReadError {
    TooLong,
    Timeout,
    Io(io::Error),
}

/// Read one line (without its newline, or up to end of input if the client sends none) by
/// `deadline`. `Ok(None)` when the client closed without sending anything.
fn read_request(s: &mut UnixStream, deadline: Instant) -> Result<Option<Vec<u8>>, ReadError> {
    let mut buf = vec![0u8; MAX_REQUEST_BYTES + 1];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        s.set_read_timeout(Some(left)).map_err(ReadError::Io)?;
        let n = match s.read(&mut buf[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => {
                return Err(ReadError::Timeout)
            }
            Err(e) => return Err(ReadError::Io(e)),
        };
        if n == 0 {
            if len == 0 {
                return Ok(None);
            }
            buf.truncate(len);
            return Ok(Some(buf));
        }
        if let Some(i) = buf[len..len + n].iter().position(|&b| b == b'\n') {
            let mut end = len + i;
            if end > MAX_REQUEST_BYTES {
                return Err(ReadError::TooLong);
            }
            if end > 0 && buf[end - 1] == b'\r' {
                end -= 1;
            }
            buf.truncate(end);
            return Ok(Some(buf));
        }
        len += n;
        if len > MAX_REQUEST_BYTES {
            return Err(ReadError::TooLong);
        }
    }
}

fn write_line(mut s: &UnixStream, v: &Value) -> io::Result<()> {
    let mut out = serde_json::to_vec(v).map_err(io::Error::other)?;
    out.push(b'\n');
    s.write_all(&out)?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::super::client::{call, CallError};
    use super::super::fake::Fake;
    use super::*;
    use serde_json::json;
    use std::io::BufRead;

    fn start(dir: &Path) -> (ControlServer, Arc<Fake>) {
        let fake = Arc::new(Fake::default());
        let s = ControlServer::start(&dir.join("c.sock"), fake.clone()).unwrap();
        (s, fake)
    }

    /// Send raw bytes, return the one response line (empty if the server closed silently).
    fn raw(path: &Path, bytes: &[u8]) -> String {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        let mut line = String::new();
        let _ = io::BufReader::new(s).read_line(&mut line);
        line
    }

    fn ok(path: &Path) -> bool {
        call(path, &json!({"cmd":"stats"}), Duration::from_secs(10)).is_ok_and(|v| v["stats"]["hits"] == 1)
    }

    #[test]
    fn serves_requests_and_removes_its_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, fake) = start(tmp.path());
        let p = s.path().to_path_buf();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert!(ok(&p));
        let v = call(&p, &json!({"cmd":"add_lender","addr":"127.0.0.1:9"}), Duration::from_secs(10)).unwrap();
        assert_eq!(v["lenders"][0]["addr"], "127.0.0.1:9");
        assert_eq!(fake.lenders.lock().unwrap().len(), 1);
        match call(&p, &json!({"cmd":"remove_lender","addr":"127.0.0.1:10"}), Duration::from_secs(10)) {
            Err(CallError::Refused(e)) => assert!(e.contains("is not in the set"), "{e}"),
            other => panic!("{other:?}"),
        }
        // Without a newline, up to end of input; CRLF is fine too.
        let mut c = UnixStream::connect(&p).unwrap();
        c.write_all(br#"{"cmd":"lenders"}"#).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut line = String::new();
        io::BufReader::new(c).read_line(&mut line).unwrap();
        assert!(line.starts_with(r#"{"lenders":"#) && line.ends_with('\n'), "{line:?}");
        assert!(raw(&p, b"{\"cmd\":\"ping\"}\r\n").contains("\"ok\":true"));
        // Closing without a word is no error.
        drop(UnixStream::connect(&p).unwrap());
        drop(s);
        assert!(!p.exists(), "socket removed on exit");
        assert!(matches!(call(&p, &json!({"cmd":"stats"}), Duration::from_secs(1)), Err(CallError::NotAnswering(_))));
    }

    #[test]
    fn malformed_and_oversize_lines_get_errors_and_the_server_goes_on() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, _) = start(tmp.path());
        let p = s.path();
        for bad in [&b"not json\n"[..], b"{\"cmd\":\"nope\"}\n", b"\xff\xfe\x00\n", b"\n", b"[]\n"] {
            let line = raw(p, bad);
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{bad:?}: {line:?}: {e}"));
            assert_eq!(v["ok"], false, "{bad:?}");
            assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
        }
        // Exactly the limit is fine (padded with spaces, which JSON allows); one more is not.
        let req = br#"{"cmd":"stats"}"#;
        let mut at_limit = req.to_vec();
        at_limit.resize(MAX_REQUEST_BYTES, b' ');
        at_limit.push(b'\n');
        assert!(raw(p, &at_limit).contains("\"ok\":true"));
        let mut over = req.to_vec();
        over.resize(MAX_REQUEST_BYTES + 1, b' ');
        over.push(b'\n');
        assert!(raw(p, &over).contains("longer than 4096 bytes"));
        // A megabyte without a newline: refused after 4 KiB, never buffered whole.
        let line = raw(p, &vec![b'{'; 1 << 20]);
        assert!(line.contains("longer than 4096 bytes"), "{line:?}");
        assert!(ok(p));
    }

    #[test]
    fn slow_clients_time_out_and_too_many_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (s, fake) = start(tmp.path());
        let p = s.path().to_path_buf();
        // MAX_CONNECTIONS clients that send half a line and wait hold every slot...
        let mut idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| {
                let mut c = UnixStream::connect(&p).unwrap();
                c.write_all(b"{\"cmd\":").unwrap();
                c
            })
            .collect();
        // ...so the next one is told so (after the listener has taken them all).
        let refused = farcache_testkit::wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            matches!(
                call(&p, &json!({"cmd":"stats"}), Duration::from_secs(5)),
                Err(CallError::Refused(e)) if e.contains("too many control connections")
            )
        });
        assert!(refused, "a ninth connection was not refused");
        // The slow ones are cut off at IO_TIMEOUT with an error line, and the slots come back.
        let t0 = Instant::now();
        for c in &mut idle {
            c.set_read_timeout(Some(IO_TIMEOUT + Duration::from_secs(10))).unwrap();
            let mut line = String::new();
            io::BufReader::new(&*c).read_line(&mut line).unwrap();
            assert!(line.contains("no whole request line"), "{line:?}");
        }
        assert!(t0.elapsed() < IO_TIMEOUT + Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(farcache_testkit::wait_until(Duration::from_secs(5), Duration::from_millis(20), || ok(&p)));
        // A slow handler (a stats call that takes a while) holds a slot only while it runs.
        *fake.stats_delay.lock().unwrap() = Duration::from_millis(300);
        let threads: Vec<_> = (0..MAX_CONNECTIONS * 2)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || call(&p, &json!({"cmd":"stats"}), Duration::from_secs(10)))
            })
            .collect();
        let mut served = 0;
        for t in threads {
            // Each one is either served or told to come back; none hangs or sees anything else.
            match t.join().unwrap() {
                Ok(v) => {
                    assert_eq!(v["stats"]["hits"], 1);
                    served += 1
                }
                Err(CallError::Refused(e)) => assert!(e.contains("too many control connections"), "{e}"),
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(served >= 1);
        *fake.stats_delay.lock().unwrap() = Duration::ZERO;
        assert!(farcache_testkit::wait_until(Duration::from_secs(5), Duration::from_millis(20), || ok(&p)));
    }

    #[test]
    fn stale_sockets_are_replaced_live_ones_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("c.sock");
        // A stale socket: bound, then its listener gone (as when a daemon is SIGKILLed).
        drop(UnixListener::bind(&p).unwrap());
        assert!(p.exists());
        let s = ControlServer::start(&p, Arc::new(Fake::default())).unwrap();
        assert!(ok(&p));
        // A second daemon for the same socket is refused, and the first goes on.
        let e = ControlServer::start(&p, Arc::new(Fake::default())).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(e.to_string().contains("another farcache mount answers"), "{e}");
        assert!(ok(&p));
        // Something else than a socket is never removed.
        let f = tmp.path().join("file");
        std::fs::write(&f, "keep me").unwrap();
        let e = ControlServer::start(&f, Arc::new(Fake::default())).err().unwrap();
        assert!(e.to_string().contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep me");
        // A socket file replaced behind our back is not ours to remove on exit.
        std::fs::remove_file(&p).unwrap();
        let other = UnixListener::bind(&p).unwrap();
        drop(s);
        assert!(p.exists(), "removed a socket that was not ours");
        drop(other);
        // Bound but never served (the daemon failed to start): the socket goes with it.
        let q = tmp.path().join("q.sock");
        let b = BoundSocket::bind(&q).unwrap();
        assert!(q.exists());
        drop(b);
        assert!(!q.exists());
        // Paths too long for sun_path are refused up front.
        let long = tmp.path().join("x".repeat(120));
        assert!(ControlServer::start(&long, Arc::new(Fake::default())).is_err());
    }
}
