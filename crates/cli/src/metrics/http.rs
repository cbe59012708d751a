//! The metrics endpoint: `GET /metrics` over HTTP/1.1, one request per connection.
//!
//! Hand-rolled rather than hyper: a scrape is one small GET every few seconds, and the
//! whole protocol needed is a request line, headers to skip, and one response with a
//! length. Threads rather than the daemon's tokio runtime, so that a lender's connection
//! threads and a mount's FUSE threads never run it and it needs no runtime of its own.
//! Bounded like the control socket: at most [`MAX_CONNECTIONS`] at once (more are answered
//! 503 and closed), [`MAX_REQUEST_BYTES`] of request head, [`IO_TIMEOUT`] to send it and to
//! take the answer.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;

/// Scrapes served at once.
pub const MAX_CONNECTIONS: usize = 4;
/// Longest request head (request line and headers) accepted.
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Time to send the request head, and to take the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The OpenMetrics text format's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape answers: the metrics text, made at the time of the request.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Bind `addr` for metrics; `origin` names the flag or setting it came from. The error
/// says what is wrong and what to do.
pub fn bind(origin: &str, addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| {
        let fix = match e.kind() {
            io::ErrorKind::AddrInUse => {
                "another process listens there (`ss -ltnp` shows which): choose another port, or stop it"
            }
            io::ErrorKind::AddrNotAvailable => "that IP is not on this machine: use one of its addresses, or 0.0.0.0",
            io::ErrorKind::PermissionDenied => "ports below 1024 need CAP_NET_BIND_SERVICE: choose a port above 1023",
            _ => "choose another address",
        };
        anyhow!("{origin}: cannot serve metrics on {addr}: {e}; {fix}")
    })
}

/// Serve `render` on `listener` from a thread of its own, for the life of the process.
pub fn serve(listener: TcpListener, render: Render) -> io::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new().name("farcache-metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                active.fetch_sub(1, Ordering::AcqRel);
                let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
                let _ =
                    respond(&mut conn, "503 Service Unavailable", "text/plain", b"busy: too many scrapes at once\n");
                continue;
            }
            let (render, done) = (render.clone(), active.clone());
            let spawned = std::thread::Builder::new().name("farcache-scrape".into()).spawn(move || {
                let _ = answer(conn, &render);
                done.fetch_sub(1, Ordering::AcqRel);
            });
            if spawned.is_err() {
                active.fetch_sub(1, Ordering::AcqRel);
            }
        }
    })?;
    Ok(addr)
}

/// Read one request head and answer it.
fn answer(mut conn: TcpStream, render: &Render) -> io::Result<()> {
    let Some(head) = read_head(&mut conn)? else {
        respond(&mut conn, "431 Request Header Fields Too Large", "text/plain", b"request head too large\n")?;
        // Take (a bounded amount of) what the client still sends, so that closing with
        // unread bytes does not reset the connection before it reads the answer.
        conn.shutdown(std::net::Shutdown::Write)?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        let _ = io::copy(&mut (&mut conn).take(1 << 16), &mut io::sink());
        return Ok(());
    };
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let line = head.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = render();
            let body = if method == "HEAD" { &[][..] } else { body.as_bytes() };
            respond(&mut conn, "200 OK", CONTENT_TYPE, body)
        }
        ("GET" | "HEAD", _) => respond(&mut conn, "404 Not Found", "text/plain", b"farcache serves GET /metrics\n"),
        _ => respond(&mut conn, "405 Method Not Allowed", "text/plain", b"only GET /metrics\n"),
    }
}

/// The request head up to its blank line, within [`IO_TIMEOUT`]; `None` if it is longer
/// than [`MAX_REQUEST_BYTES`]. A client that sends nothing whole in time gets an error.
fn read_head(conn: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(left))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(head));
        }
        if head.len() > MAX_REQUEST_BYTES {
            return Ok(None);
        }
    }
}

fn respond(conn: &mut TcpStream, status: &str, content_type: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn answers_metrics_refuses_the_rest_and_bounds_the_head() {
        let l = bind("test", "127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = serve(l, Arc::new(|| "m 1\n# EOF\n".to_string())).unwrap();
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nm 1\n# EOF\n"), "{ok}");
        assert!(ok.contains(CONTENT_TYPE) && ok.contains("Content-Length: 10\r\n"), "{ok}");
        assert!(ask(addr, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
        assert!(ask(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let huge = [b"GET /metrics HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 10_000]].concat();
        assert!(ask(addr, &huge).starts_with("HTTP/1.1 431"));
        // A port in use: the error says so and what to do.
        let e = bind("--metrics-listen", addr).unwrap_err().to_string();
        assert!(e.starts_with("--metrics-listen: cannot serve metrics on") && e.contains("choose another port"), "{e}");
    }
}
