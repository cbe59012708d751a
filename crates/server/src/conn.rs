//! One client connection: read frames, answer them in order, enforce every limit.
//!
//! Requests are handled to completion as they are decoded (the store never blocks for
//! long), and answers are gathered into one output buffer that is written when no complete
//! frame is left to handle or the next answer would not fit. So a pipelining client gets many
//! answers per write. Each connection keeps two small buffers (`BASE_BUF`); a large frame or a
//! large answer borrows from one server-wide budget (`server.max_buffer_bytes`), so the memory
//! of all connections together is bounded whatever clients send.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use farcache_tls::Stream;
use farcache_wire::{
    check_len_prefix, decode_request, encode_error, encode_hello_ok, encode_raw, encode_statuses,
    max_values_frame_bytes, split_frame, ErrorCode, Header, HelloOk, Limits, Opcode, Request, ValuesWriter, WireError,
    HEADER_BYTES, HELLO_OK_FLAG_ADMIN, MAX_ERROR_MESSAGE_BYTES, PROTOCOL_VERSION_MAX, PROTOCOL_VERSION_MIN,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::store::TenantId;
use crate::Server;

/// Bytes read from the socket at a time, and the buffer size every connection may keep
/// without drawing on the server-wide budget (`server.max_buffer_bytes`).
const BASE_BUF: usize = 16 << 10;
/// Budget permits are counted in KiB.
const PERMIT_BYTES: usize = 1024;
/// A connection quiet this long gives back buffer memory beyond its base size.
const SHRINK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug)]
enum ConnState {
    /// Accepted; the only frame allowed is HELLO, within `handshake_timeout`, and frames are
    /// limited to `HANDSHAKE_MAX_FRAME_BYTES`.
    AwaitHello,
    /// Authenticated as `tenant`; serving requests. `admin`: STATS show every tenant.
    Ready { tenant: TenantId, admin: bool },
}

/// Why a connection ended.
enum Close {
    /// The client hung up between frames: the normal end.
    Eof,
    Shutdown,
    /// Closed for cause; logged once as a warning.
    Protocol(String),
    Timeout(String),
    Io(std::io::Error),
}

/// What handling one frame asks of the connection.
enum Next {
    Continue,
    Close(Close),
}

struct Conn<'a> {
    server: &'a Server,
    sock: Stream,
    /// When the TCP connection was accepted: HELLO (and the TLS handshake before it) must be
    /// done within `handshake_timeout` of this.
    accepted: Instant,
    peer: SocketAddr,
    /// The common name of the client's certificate, when client certificates name tenants
    /// (`server.tls_client_ca`): the only tenant this connection may be.
    certified: Option<String>,
    state: ConnState,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// Scratch for per-entry statuses, reused across requests.
    statuses: Vec<u8>,
    /// Buffer bytes beyond `2 × BASE_BUF` granted from the server-wide budget, held while a
    /// large frame is read or a large answer written, and returned when both buffers shrink.
    grant: Option<OwnedSemaphorePermit>,
}

pub(crate) async fn serve(server: &Server, sock: TcpStream, peer: SocketAddr, close_rx: watch::Receiver<bool>) {
    let accepted = Instant::now();
    let mut certified = None;
    let sock = match &server.tls {
        None => Stream::Plain(sock),
        Some(acceptor) => {
            let deadline = accepted + server.cfg.handshake_timeout.get();
            match tokio::time::timeout_at(deadline, accept_tls(acceptor, sock)).await {
                Ok(Ok(s)) => {
                    if server.cfg.tls_mode() == crate::config::TlsMode::Certificates {
                        let cn = s
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(farcache_tls::common_name);
                        let Some(cn) = cn else {
                            server.conns.protocol_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(%peer, "client refused: its certificate has no common name (its tenant); make client certificates with farcache certs --client TENANT");
                            return;
                        };
                        certified = Some(cn);
                    }
                    Stream::Server(Box::new(s))
                }
                Ok(Err(why)) => {
                    server.conns.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "{why}");
                    return;
                }
                Err(_) => {
                    server.conns.timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "client refused: no TLS handshake within server.handshake_timeout");
                    return;
                }
            }
        }
    };
    let mut conn = Conn {
        server,
        sock,
        accepted,
        peer,
        certified,
        state: ConnState::AwaitHello,
        inbuf: Vec::with_capacity(BASE_BUF),
        out: Vec::with_capacity(BASE_BUF),
        statuses: Vec::with_capacity(server.limits.max_batch as usize),
        grant: None,
    };
    let why = conn.run(close_rx).await;
    let c = &server.conns;
    match why {
        Close::Eof | Close::Shutdown => tracing::debug!(%peer, "connection closed"),
        Close::Protocol(msg) => {
            c.protocol_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "closing connection: {msg}");
        }
        Close::Timeout(msg) => {
            c.timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%peer, "closing connection: {msg}");
        }
        Close::Io(e) => tracing::debug!(%peer, "connection error: {e}"),
    }
}

/// The server side of a TLS handshake. A connection whose first byte does not start a TLS
/// handshake record is a plaintext client (its HELLO begins with a length prefix): it is
/// told in its own protocol that TLS is required, and refused.
async fn accept_tls(
    acceptor: &farcache_tls::TlsAcceptor,
    mut sock: TcpStream,
) -> Result<farcache_tls::tokio_rustls::server::TlsStream<TcpStream>, String> {
    let mut first = [0u8; 1];
    match sock.peek(&mut first).await {
        Ok(0) => return Err("client refused: closed before the TLS handshake".into()),
        Ok(_) if first[0] != farcache_tls::TLS_HANDSHAKE_RECORD => {
            let mut out = Vec::new();
            let msg = "TLS required: connect with TLS and a client certificate (cache.tls_ca, tls_cert, tls_key)";
            encode_error(&mut out, 0, ErrorCode::AuthFailed, true, msg);
            let _ = sock.write_all(&out).await;
            let _ = sock.shutdown().await;
            return Err("plaintext client refused: TLS required".into());
        }
        Ok(_) => {}
        Err(e) => return Err(format!("client refused: {e}")),
    }
    acceptor.accept(sock).await.map_err(|e| farcache_tls::describe_server_handshake_error(&e))
}

/// Tell a client over the connection limit why it is turned away.
pub(crate) async fn refuse_busy(mut sock: TcpStream) {
    let mut out = Vec::new();
    encode_error(&mut out, 0, ErrorCode::Busy, true, "too many connections; try again later");
    let _ = sock.write_all(&out).await;
    let _ = sock.shutdown().await;
}

impl Conn<'_> {
    fn frame_limit(&self) -> u32 {
        match self.state {
            ConnState::AwaitHello => farcache_wire::HANDSHAKE_MAX_FRAME_BYTES,
            ConnState::Ready { .. } => self.server.limits.max_frame_bytes,
        }
    }

    async fn run(&mut self, mut close_rx: watch::Receiver<bool>) -> Close {
        let cfg = &self.server.cfg;
        let accepted = self.accepted;
        // When the frame now in `inbuf` began to arrive, if one has.
        let mut frame_started: Option<Instant> = None;
        loop {
            // Handle every whole frame in the buffer. Answers gather in `out`; it is written
            // before an answer would take it past its base size, and when no frame is left.
            let mut consumed = 0;
            loop {
                match split_frame(&self.inbuf[consumed..], self.frame_limit()) {
                    Ok(None) => break,
                    Ok(Some((h, n))) => {
                        let start = consumed;
                        consumed += n;
                        let answer = self.answer_bound(&h, &self.inbuf[start + HEADER_BYTES..start + n]);
                        if self.out.len() + answer > BASE_BUF {
                            if let Err(why) = self.flush().await {
                                return why;
                            }
                            if let Err(why) = self.reserve(self.inbuf.capacity(), answer, frame_started).await {
                                return why;
                            }
                            // Exactly the budgeted size, not a doubling of it.
                            self.out.reserve_exact(answer);
                        }
                        let next = self.handle(&h, start + HEADER_BYTES, start + n);
                        if let Next::Close(why) = next {
                            let _ = self.flush().await;
                            return why;
                        }
                    }
                    Err(e) => {
                        let code = if matches!(e, WireError::TooLarge { .. }) {
                            ErrorCode::TooLarge
                        } else {
                            ErrorCode::BadFrame
                        };
                        encode_error(&mut self.out, 0, code, true, &e.to_string());
                        let _ = self.flush().await;
                        return Close::Protocol(format!("bad frame: {e}"));
                    }
                }
            }
            if consumed > 0 {
                self.inbuf.drain(..consumed);
                frame_started = (!self.inbuf.is_empty()).then(Instant::now);
            }
            if let Err(why) = self.flush().await {
                return why;
            }

            // Read more, within the deadline that applies now.
            // An unauthenticated connection lives at most handshake_timeout, however its
            // bytes trickle in.
            let handshake = (accepted + cfg.handshake_timeout.get(), "no HELLO within server.handshake_timeout");
            let (deadline, what) = match (self.state, frame_started) {
                (ConnState::AwaitHello, Some(t)) if t + cfg.frame_timeout.get() >= handshake.0 => handshake,
                (_, Some(t)) => {
                    (t + cfg.frame_timeout.get(), "a frame did not arrive whole within server.frame_timeout")
                }
                (ConnState::AwaitHello, None) => handshake,
                (ConnState::Ready { .. }, None) => {
                    (Instant::now() + cfg.idle_timeout.get(), "idle for server.idle_timeout")
                }
            };
            // Room for the rest of the frame that has begun (known from its length prefix), or
            // a chunk; a frame larger than the base buffer draws on the server-wide budget.
            // (A buffer holding a partial frame with no room left means the frame is larger
            // than the buffer: whole frames were handled above.)
            let frame_len = check_len_prefix(&self.inbuf, self.frame_limit()).ok().flatten().unwrap_or(0);
            let want = frame_len.max(BASE_BUF);
            if want > self.inbuf.capacity() {
                if let Err(why) = self.reserve(want, self.out.capacity(), frame_started.or(Some(Instant::now()))).await
                {
                    return why;
                }
                self.inbuf.reserve_exact(want - self.inbuf.len());
            }
            // Buffers grown for large frames stay while the client keeps sending (growing
            // and shrinking them per request costs more than the requests); they shrink, and
            // their budget returns, once the connection has been quiet for SHRINK_AFTER.
            let shrink_first = self.inbuf.is_empty() && self.holds_extra();
            let first_deadline = if shrink_first { deadline.min(Instant::now() + SHRINK_AFTER) } else { deadline };
            let read = tokio::select! {
                r = tokio::time::timeout_at(first_deadline, self.sock.read_buf(&mut self.inbuf)) => r,
                _ = async { let _ = close_rx.wait_for(|&closing| closing).await; } => {
                    encode_error(&mut self.out, 0, ErrorCode::ShuttingDown, true, "server shutting down");
                    let _ = self.flush().await;
                    return Close::Shutdown;
                }
            };
            match read {
                Err(_) if first_deadline < deadline => {
                    self.shrink();
                    continue;
                }
                Err(_) => {
                    encode_error(&mut self.out, 0, ErrorCode::Timeout, true, what);
                    let _ = self.flush().await;
                    return Close::Timeout(what.to_string());
                }
                Ok(Err(e)) => return Close::Io(e),
                Ok(Ok(0)) if self.inbuf.is_empty() => return Close::Eof,
                Ok(Ok(0)) => {
                    return Close::Protocol(format!(
                        "connection closed mid-frame ({} bytes of a frame)",
                        self.inbuf.len()
                    ))
                }
                Ok(Ok(_)) => {
                    if frame_started.is_none() {
                        frame_started = Some(Instant::now());
                    }
                }
            }
        }
    }

    /// Write the gathered answers, within `write_timeout`.
    async fn flush(&mut self) -> Result<(), Close> {
        if self.out.is_empty() {
            return Ok(());
        }
        let timeout = self.server.cfg.write_timeout.get();
        let sock = &mut self.sock;
        let out = &self.out;
        let res = tokio::time::timeout(timeout, async {
            sock.write_all(out).await?;
            // TLS may hold the last record back until flushed; plain TCP flushes at once.
            sock.flush().await
        })
        .await;
        self.out.clear();
        match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Close::Io(e)),
            Err(_) => Err(Close::Timeout("client did not read its responses within server.write_timeout".into())),
        }
    }

    /// Make sure the budget covers an input buffer of `in_bytes` and an output buffer of
    /// `out_bytes`, waiting for other connections to return theirs until the frame's deadline.
    async fn reserve(&mut self, in_bytes: usize, out_bytes: usize, since: Option<Instant>) -> Result<(), Close> {
        let extra = in_bytes.saturating_sub(BASE_BUF) + out_bytes.saturating_sub(BASE_BUF);
        let need = extra.div_ceil(PERMIT_BYTES) as u32;
        let held = self.grant.as_ref().map_or(0, |g| g.num_permits() as u32);
        if need <= held {
            return Ok(());
        }
        let deadline = since.unwrap_or_else(Instant::now) + self.server.cfg.frame_timeout.get();
        let more = self.server.buffers.clone().acquire_many_owned(need - held);
        match tokio::time::timeout_at(deadline, more).await {
            Ok(Ok(permit)) => {
                match &mut self.grant {
                    Some(g) => g.merge(permit),
                    None => self.grant = Some(permit),
                }
                Ok(())
            }
            _ => {
                let msg = "server buffer budget (server.max_buffer_bytes) exhausted; try again later";
                encode_error(&mut self.out, 0, ErrorCode::Busy, true, msg);
                let _ = self.flush().await;
                Err(Close::Timeout(msg.into()))
            }
        }
    }

    /// Whether the buffers hold more than their base size (and so, budget).
    fn holds_extra(&self) -> bool {
        self.grant.is_some() || self.inbuf.capacity() > BASE_BUF || self.out.capacity() > BASE_BUF
    }

    /// Between frames: give back buffer memory beyond the base size, and its budget.
    fn shrink(&mut self) {
        if self.inbuf.len() <= BASE_BUF && self.inbuf.capacity() > BASE_BUF {
            self.inbuf.shrink_to(BASE_BUF);
        }
        if self.out.capacity() > BASE_BUF {
            self.out.shrink_to(BASE_BUF);
        }
        if self.inbuf.capacity() <= BASE_BUF {
            self.grant = None;
        }
    }

    /// The most bytes the answer to this frame can take.
    fn answer_bound(&self, h: &Header, body: &[u8]) -> usize {
        let limits = &self.server.limits;
        match Opcode::from_u8(h.opcode) {
            Ok(Opcode::Get) if body.len() >= 2 => {
                let count = (u16::from_le_bytes([body[0], body[1]]) as usize).min(limits.max_batch as usize);
                max_values_frame_bytes(count, limits.max_value_bytes)
            }
            Ok(Opcode::Stats) => limits.max_frame_bytes as usize,
            // Statuses (one byte a key), PONG (≤ 256 bytes), HELLO_OK, ERROR (≤ 1 KiB).
            _ => HEADER_BYTES + 4 + limits.max_batch as usize + MAX_ERROR_MESSAGE_BYTES,
        }
    }

    /// Handle the frame whose body is `inbuf[body_start..end]`.
    fn handle(&mut self, h: &Header, body_start: usize, end: usize) -> Next {
        let limits = match self.state {
            // Say what is wrong before trying to decode a request the handshake forbids.
            ConnState::AwaitHello if h.opcode != Opcode::Hello as u8 => {
                return self.fatal(h.request_id, ErrorCode::HandshakeRequired, "the first frame must be HELLO".into())
            }
            ConnState::AwaitHello => Limits::HANDSHAKE,
            ConnState::Ready { .. } => self.server.limits,
        };
        let inbuf = std::mem::take(&mut self.inbuf);
        let next = match decode_request(h, &inbuf[body_start..end], &limits) {
            Ok(req) => self.request(h.request_id, req),
            Err(e) => self.bad_request(h.request_id, e),
        };
        self.inbuf = inbuf;
        next
    }

    fn bad_request(&mut self, id: u64, e: WireError) -> Next {
        let code = match e {
            WireError::UnknownOpcode(_) => ErrorCode::UnknownOpcode,
            WireError::BatchTooLarge { .. } | WireError::ValueTooLarge { .. } => ErrorCode::TooLarge,
            _ => ErrorCode::BadFrame,
        };
        match self.state {
            // Before HELLO nothing but a good HELLO is acceptable.
            ConnState::AwaitHello => self.fatal(id, code, format!("handshake failed: {e}")),
            // The framing is intact: answer this request and go on.
            ConnState::Ready { .. } => {
                encode_error(&mut self.out, id, code, false, &e.to_string());
                self.server.conns.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.peer, "bad request: {e}");
                Next::Continue
            }
        }
    }

    fn fatal(&mut self, id: u64, code: ErrorCode, msg: String) -> Next {
        encode_error(&mut self.out, id, code, true, &msg);
        Next::Close(Close::Protocol(msg))
    }

    fn request(&mut self, id: u64, req: Request<'_>) -> Next {
        let server = self.server;
        let (tenant, admin) = match (self.state, req) {
            (ConnState::AwaitHello, Request::Hello(hello)) => return self.hello(id, &hello),
            (ConnState::AwaitHello, _) => {
                return self.fatal(id, ErrorCode::HandshakeRequired, "the first frame must be HELLO".into())
            }
            (ConnState::Ready { .. }, Request::Hello(_)) => {
                return self.fatal(id, ErrorCode::HandshakeRequired, "a second HELLO on one connection".into())
            }
            (ConnState::Ready { tenant, admin }, _) => (tenant, admin),
        };
        let store = &server.store;
        let out = &mut self.out;
        match req {
            Request::Hello(_) => unreachable!("handled above"),
            Request::Get(keys) => {
                let mut w = ValuesWriter::begin(out, id, keys.len());
                for key in keys.iter() {
                    if !store.get(tenant, &key, |v| w.hit(out, v)) {
                        w.miss(out);
                    }
                }
                w.finish(out);
            }
            Request::Put(entries) => {
                self.statuses.clear();
                for (key, value) in entries.iter() {
                    self.statuses.push(store.put(tenant, &key, value) as u8);
                }
                encode_statuses(out, Opcode::PutOk, id, &self.statuses);
            }
            Request::Del(keys) => {
                self.statuses.clear();
                for key in keys.iter() {
                    self.statuses.push(store.del(tenant, &key) as u8);
                }
                encode_statuses(out, Opcode::DelOk, id, &self.statuses);
            }
            Request::Stats => {
                let room = server.limits.max_frame_bytes as usize - HEADER_BYTES;
                let json = crate::stats::collect(server, tenant, admin).to_json_within(room);
                encode_raw(out, Opcode::StatsOk, id, json.as_bytes());
            }
            Request::Ping(payload) => encode_raw(out, Opcode::Pong, id, payload),
        }
        Next::Continue
    }

    fn hello(&mut self, id: u64, hello: &farcache_wire::Hello<'_>) -> Next {
        let server = self.server;
        let version = hello.max_version.min(PROTOCOL_VERSION_MAX);
        if version < hello.min_version || version < PROTOCOL_VERSION_MIN {
            return self.fatal(
                id,
                ErrorCode::UnsupportedVersion,
                format!(
                    "client speaks protocol versions {}..={}, this server {}..={}",
                    hello.min_version, hello.max_version, PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX
                ),
            );
        }
        let certified = self.certified.as_deref();
        let (tenant, admin) = match server.tenants.authenticate(hello.tenant, hello.secret, certified, &server.store) {
            Ok(x) => x,
            Err(e @ crate::tenants::AuthError::TooMany(_)) => return self.fatal(id, ErrorCode::Busy, e.to_string()),
            Err(e) => return self.fatal(id, ErrorCode::AuthFailed, format!("tenant {:?}: {e}", hello.tenant)),
        };
        let limits = server.limits;
        encode_hello_ok(
            &mut self.out,
            id,
            &HelloOk {
                version,
                flags: if admin { HELLO_OK_FLAG_ADMIN } else { 0 },
                max_frame_bytes: limits.max_frame_bytes,
                max_batch: limits.max_batch,
                max_inflight: server.cfg.max_inflight,
                max_value_bytes: limits.max_value_bytes,
                instance_id: server.instance_id,
            },
        );
        tracing::debug!(peer = %self.peer, tenant = hello.tenant, "client connected");
        self.state = ConnState::Ready { tenant, admin };
        Next::Continue
    }
}
