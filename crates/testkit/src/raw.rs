//! A blocking socket that sends whatever bytes a test wants and reads frames with deadlines.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use farcache_wire::{
    decode_response, encode_hello, encode_keys, encode_put, encode_raw, ErrorCode, Header, Hello, HelloOk, Key, Limits,
    Opcode, Response, HEADER_BYTES, HELLO_MAGIC, MAX_FRAME_BYTES_CEILING, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN,
};

/// How long `connect` waits for TCP.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one `send` may block on a server that does not read.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Limits for decoding whatever a server sends: the protocol's ceilings.
const ANY: Limits = Limits { max_frame_bytes: MAX_FRAME_BYTES_CEILING, max_batch: u16::MAX, max_value_bytes: u32::MAX };

/// An ERROR frame, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    pub request_id: u64,
    pub code: ErrorCode,
    pub fatal: bool,
    pub message: String,
}

impl ErrorReply {
    /// Decode `body` as an ERROR if `h` says it is one.
    pub fn parse(h: &Header, body: &[u8]) -> Option<ErrorReply> {
        match decode_response(h, body, &ANY) {
            Ok(Response::Error(e)) => Some(ErrorReply {
                request_id: h.request_id,
                code: e.code,
                fatal: e.fatal,
                message: e.message.to_string(),
            }),
            _ => None,
        }
    }
}

/// A raw client connection: no protocol logic beyond splitting frames.
pub struct RawConn {
    sock: TcpStream,
    local: SocketAddr,
    buf: Vec<u8>,
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> io::Result<RawConn> {
        let sock = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
        sock.set_nodelay(true)?;
        sock.set_write_timeout(Some(SEND_TIMEOUT))?;
        let local = sock.local_addr()?;
        Ok(RawConn { sock, local, buf: Vec::new() })
    }

    /// This end's address: the `peer` the server names in its log lines.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Write all of `bytes` (each write blocks at most 5 s).
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.sock.write_all(bytes)
    }

    /// Close the sending half: the server sees EOF after what was sent.
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.sock.shutdown(Shutdown::Write)
    }

    /// Read one whole frame within `timeout`. `Ok(None)`: the server closed the connection
    /// (EOF or reset) between frames. `Err(TimedOut)`: no whole frame in time.
    /// `Err(UnexpectedEof)`: closed in the middle of a frame. `Err(InvalidData)`: the server
    /// sent a header no peer may send.
    pub fn read_frame(&mut self, timeout: Duration) -> io::Result<Option<(Header, Vec<u8>)>> {
        let deadline = Instant::now() + timeout;
        let mut chunk = vec![0u8; 64 << 10];
        // Bounded by the deadline: each pass reads with the time that is left.
        loop {
            match Header::decode(&self.buf, MAX_FRAME_BYTES_CEILING) {
                Err(e) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("server sent a bad header: {e}")))
                }
                Ok(Some(h)) if self.buf.len() >= h.frame_bytes() => {
                    let body = self.buf[HEADER_BYTES..h.frame_bytes()].to_vec();
                    self.buf.drain(..h.frame_bytes());
                    return Ok(Some((h, body)));
                }
                Ok(_) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no whole frame within {timeout:?}")));
            }
            self.sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match self.sock.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("closed after {} bytes of a frame", self.buf.len()),
                    ))
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset && self.buf.is_empty() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// Read frames until the server closes the connection, within `timeout`. Returns the
    /// frames that came before the close.
    pub fn expect_closed(&mut self, timeout: Duration) -> io::Result<Vec<(Header, Vec<u8>)>> {
        let deadline = Instant::now() + timeout;
        let mut frames = Vec::new();
        // Bounded by the deadline, which each read_frame respects.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_frame(left) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return Ok(frames),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connection still open after {timeout:?} ({} frames read)", frames.len()),
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Read one frame and require it to be an ERROR.
    pub fn read_error(&mut self, timeout: Duration) -> io::Result<ErrorReply> {
        match self.read_frame(timeout)? {
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed without an ERROR")),
            Some((h, body)) => ErrorReply::parse(&h, &body).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("expected ERROR, got opcode 0x{:02x}", h.opcode))
            }),
        }
    }

    /// Expect a fatal ERROR with `code`, then the close, all within `timeout`. Returns it.
    pub fn expect_fatal(&mut self, code: ErrorCode, timeout: Duration) -> io::Result<ErrorReply> {
        let deadline = Instant::now() + timeout;
        let e = self.read_error(timeout)?;
        if e.code != code || !e.fatal {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected fatal {code:?}, got {e:?}")));
        }
        let rest = self.expect_closed(deadline.saturating_duration_since(Instant::now()))?;
        if !rest.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} frames after a fatal ERROR", rest.len()),
            ));
        }
        Ok(e)
    }

    /// Send HELLO (request id 1, this build's versions) and require HELLO_OK.
    pub fn hello(&mut self, tenant: &str, secret: &[u8], timeout: Duration) -> io::Result<HelloOk> {
        self.send(&hello_bytes(tenant, secret))?;
        let (h, body) = self
            .read_frame(timeout)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "closed instead of HELLO_OK"))?;
        match decode_response(&h, &body, &Limits::HANDSHAKE) {
            Ok(Response::HelloOk(ok)) if h.request_id == 1 => Ok(ok),
            other => {
                Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected HELLO_OK for id 1, got {other:?}")))
            }
        }
    }

    /// Send one request frame and read one frame back; require the answer's request id to
    /// be the request's.
    pub fn request(&mut self, frame_bytes: &[u8], timeout: Duration) -> io::Result<(Header, Vec<u8>)> {
        let id = u64::from_le_bytes(frame_bytes[8..16].try_into().unwrap());
        self.send(frame_bytes)?;
        let (h, body) = self
            .read_frame(timeout)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "closed instead of answering"))?;
        if h.request_id != id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("answer for request {} to request {id} (opcode 0x{:02x})", h.request_id, h.opcode),
            ));
        }
        Ok((h, body))
    }

    /// PING with `payload`; require a PONG that echoes it.
    pub fn ping(&mut self, request_id: u64, payload: &[u8], timeout: Duration) -> io::Result<()> {
        let mut f = Vec::new();
        encode_raw(&mut f, Opcode::Ping, request_id, payload);
        let (h, body) = self.request(&f, timeout)?;
        if h.opcode != Opcode::Pong as u8 || body != payload {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected PONG echoing {payload:?}, got opcode 0x{:02x} body {body:?}", h.opcode),
            ));
        }
        Ok(())
    }
}

/// A frame with any opcode, flags and body; the length is right and reserved is zero.
pub fn frame(opcode: u8, flags: u8, request_id: u64, body: &[u8]) -> Vec<u8> {
    frame_with_reserved(opcode, flags, 0, request_id, body)
}

/// [`frame`] with the reserved header field set to `reserved`.
pub fn frame_with_reserved(opcode: u8, flags: u8, reserved: u16, request_id: u64, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_BYTES + body.len());
    f.extend_from_slice(&((HEADER_BYTES - 4 + body.len()) as u32).to_le_bytes());
    f.push(opcode);
    f.push(flags);
    f.extend_from_slice(&reserved.to_le_bytes());
    f.extend_from_slice(&request_id.to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// A HELLO body with every field chosen by the caller, valid or not.
pub fn hello_body(magic: [u8; 4], min_version: u16, max_version: u16, tenant: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&magic);
    b.extend_from_slice(&min_version.to_le_bytes());
    b.extend_from_slice(&max_version.to_le_bytes());
    b.push(tenant.len() as u8);
    b.extend_from_slice(tenant);
    b.push(secret.len() as u8);
    b.extend_from_slice(secret);
    b
}

/// A well-formed HELLO frame (request id 1, this build's protocol versions).
pub fn hello_bytes(tenant: &str, secret: &[u8]) -> Vec<u8> {
    hello_bytes_versions(tenant, secret, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX)
}

/// A HELLO frame offering `min..=max` (request id 1). Raw, so any range can be offered.
pub fn hello_bytes_versions(tenant: &str, secret: &[u8], min: u16, max: u16) -> Vec<u8> {
    if min <= max && min == PROTOCOL_VERSION_MIN && max == PROTOCOL_VERSION_MAX {
        // The real encoder, so the common case is exactly what clients send.
        let mut out = Vec::new();
        encode_hello(&mut out, 1, &Hello { min_version: min, max_version: max, tenant, secret });
        return out;
    }
    frame(Opcode::Hello as u8, 0, 1, &hello_body(HELLO_MAGIC, min, max, tenant.as_bytes(), secret))
}

/// A well-behaved client in miniature: connect, HELLO, PUT a block derived from `seed`, GET it
/// back, compare every byte, DEL it, PING. All within a few seconds. `Err` says which step
/// failed; tests use it to show a server still serves after something hostile.
pub fn check_round_trip(addr: SocketAddr, tenant: &str, secret: &[u8], seed: u64) -> Result<(), String> {
    let t = Duration::from_secs(5);
    let step = |what: &str, e: io::Error| format!("round trip {seed} to {addr}: {what}: {e}");
    let mut c = RawConn::connect(addr).map_err(|e| step("connect", e))?;
    c.hello(tenant, secret, t).map_err(|e| step("HELLO", e))?;
    let mut rng = crate::Rng::new(seed);
    let key = Key::new(0x00C0_FFEE_0000_0000 ^ seed as u128, rng.next_u64(), 1);
    let len = 1 + rng.below(4096) as usize;
    let value = rng.bytes(len);

    let mut f = Vec::new();
    encode_put(&mut f, 2, &[(key, &value)]);
    let (h, body) = c.request(&f, t).map_err(|e| step("PUT", e))?;
    match decode_response(&h, &body, &ANY) {
        Ok(Response::PutOk(s)) if s.as_slice() == [0] => {}
        other => return Err(format!("round trip {seed}: PUT answered {other:?}")),
    }
    f.clear();
    encode_keys(&mut f, Opcode::Get, 3, &[key]);
    let (h, body) = c.request(&f, t).map_err(|e| step("GET", e))?;
    match decode_response(&h, &body, &ANY) {
        Ok(Response::Values(v)) => {
            let got: Vec<Option<&[u8]>> = v.iter().collect();
            if got != [Some(&value[..])] {
                return Err(format!("round trip {seed}: GET returned {} entries, not the value put", got.len()));
            }
        }
        other => return Err(format!("round trip {seed}: GET answered {other:?}")),
    }
    f.clear();
    encode_keys(&mut f, Opcode::Del, 4, &[key]);
    let (h, body) = c.request(&f, t).map_err(|e| step("DEL", e))?;
    match decode_response(&h, &body, &ANY) {
        Ok(Response::DelOk(s)) if s.as_slice() == [1] => {}
        other => return Err(format!("round trip {seed}: DEL answered {other:?}")),
    }
    c.ping(5, &seed.to_le_bytes(), t).map_err(|e| step("PING", e))?;
    Ok(())
}
