//! The client handle: requests, batching, timeouts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use farcache_wire::{
    encode_keys, encode_put, encode_raw, DelStatus, HelloOk, Key, Opcode, PutStatus, BATCH_PREFIX_BYTES, HEADER_BYTES,
    KEY_BYTES,
};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{timeout, timeout_at, Instant};

use crate::conn::{spawn_tasks, Expect, Reply, Shared};
use crate::handshake::{handshake, FIRST_REQUEST_ID};
use crate::{ClientConfig, ClientError, ClientTls};
use farcache_tls::rustls::pki_types::ServerName;
use farcache_tls::Stream;

/// Bytes of a batched frame before its entries.
const BATCH_FRAME_BYTES: usize = HEADER_BYTES + BATCH_PREFIX_BYTES;
/// Bytes of one PUT entry besides its value: key and length.
const PUT_ENTRY_BYTES: usize = KEY_BYTES + 4;
/// Bytes of one VALUES hit besides its value: status and length.
const VALUE_ENTRY_BYTES: usize = 1 + 4;

/// A connection to one farcache server. Cheap to clone; all clones share the connection,
/// which closes when the last clone is dropped or [`Client::close`] is called.
///
/// Every method may be called from many tasks at once; requests are pipelined on the one
/// connection, at most [`Client::inflight_limit`] at a time, and answers are matched to
/// requests by request id.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    hello: HelloOk,
    request_timeout: Duration,
    inflight_limit: usize,
    /// Encoded frames for the writer task. Bounded by the in-flight limit.
    frames: mpsc::Sender<Vec<u8>>,
    /// Most keys in one GET: within `max_batch`, the request frame and the largest possible
    /// VALUES answer both fit `max_frame_bytes`.
    get_batch: usize,
    /// Most keys in one DEL.
    del_batch: usize,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.fail(ClientError::Closed);
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("hello", &self.inner.hello)
            .field("inflight_limit", &self.inner.inflight_limit)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Client {
    /// Connect (TCP, with TCP_NODELAY) and shake hands, all within `cfg.connect_timeout`.
    pub async fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        cfg.validate()?;
        let setup = async {
            let tcp = TcpStream::connect(cfg.addr).await.map_err(ClientError::Connect)?;
            tcp.set_nodelay(true).map_err(ClientError::Connect)?;
            let mut stream = match &cfg.tls {
                None => Stream::Plain(tcp),
                Some(tls) => Stream::Client(Box::new(connect_tls(tls, cfg.addr, tcp).await?)),
            };
            let (hello, leftover) = handshake(&mut stream, &cfg).await?;
            Ok::<_, ClientError>((stream, hello, leftover))
        };
        let (stream, hello, leftover) =
            timeout(cfg.connect_timeout, setup).await.map_err(|_| ClientError::Timeout)??;

        let inflight_limit = cfg.max_inflight.min(hello.max_inflight) as usize;
        let shared = Arc::new(Shared::new(inflight_limit, FIRST_REQUEST_ID, hello.limits()));
        let (frames_tx, frames_rx) = mpsc::channel(inflight_limit);
        match stream {
            Stream::Plain(tcp) => {
                let (rd, wr) = tcp.into_split();
                spawn_tasks(&shared, rd, leftover, wr, frames_rx);
            }
            tls => {
                let (rd, wr) = tokio::io::split(tls);
                spawn_tasks(&shared, rd, leftover, wr, frames_rx);
            }
        }

        let room = hello.max_frame_bytes as usize - BATCH_FRAME_BYTES;
        let max_batch = hello.max_batch as usize;
        let get_batch =
            max_batch.min(room / KEY_BYTES).min(room / (VALUE_ENTRY_BYTES + hello.max_value_bytes as usize));
        let del_batch = max_batch.min(room / KEY_BYTES);
        // check_hello_ok guaranteed room for one PUT of the largest value.
        debug_assert!(get_batch >= 1 && del_batch >= 1);
        tracing::debug!(addr = %cfg.addr, tenant = %cfg.tenant, ?hello, "farcache connection open");
        Ok(Client {
            inner: Arc::new(Inner {
                shared,
                hello,
                request_timeout: cfg.request_timeout,
                inflight_limit,
                frames: frames_tx,
                get_batch,
                del_batch,
            }),
        })
    }

    /// The server's HELLO_OK: protocol version, limits, ADMIN flag, instance id.
    pub fn hello(&self) -> &HelloOk {
        &self.inner.hello
    }

    /// Most requests this client has in flight at once.
    pub fn inflight_limit(&self) -> usize {
        self.inner.inflight_limit
    }

    /// Look up blocks. The answer has one entry per key, in order: the value, or `None` on a
    /// miss. Batches the server's limits do not allow in one frame go out as several
    /// pipelined requests.
    ///
    /// Values share memory with the frame they arrived in; copy them to keep them long.
    pub async fn get(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, ClientError> {
        let inner = &*self.inner;
        let mut pending = Vec::new();
        for chunk in keys.chunks(inner.get_batch) {
            let p = inner
                .start(Expect::Values(chunk.len()), BATCH_FRAME_BYTES + chunk.len() * KEY_BYTES, |out, id| {
                    encode_keys(out, Opcode::Get, id, chunk)
                })
                .await?;
            pending.push(p);
        }
        let mut values = Vec::with_capacity(keys.len());
        for p in pending {
            match p.wait().await? {
                Reply::Values(v) => values.extend(v),
                other => unreachable!("checked by the reader: {other:?}"),
            }
        }
        Ok(values)
    }

    /// Store blocks. The answer has one status per entry, in order. A value larger than the
    /// server's `max_value_bytes` is answered `TooLarge` without being sent.
    pub async fn put(&self, entries: &[(Key, &[u8])]) -> Result<Vec<PutStatus>, ClientError> {
        let inner = &*self.inner;
        let max_value = inner.hello.max_value_bytes as usize;
        let max_frame = inner.hello.max_frame_bytes as usize;
        let max_batch = inner.hello.max_batch as usize;
        let mut statuses = vec![PutStatus::TooLarge; entries.len()];

        // Each chunk: the indexes (into `entries`) it carries.
        let mut chunks: Vec<Vec<usize>> = Vec::new();
        let mut chunk = Vec::new();
        let mut chunk_bytes = BATCH_FRAME_BYTES;
        for (i, (_, value)) in entries.iter().enumerate() {
            if value.len() > max_value {
                continue;
            }
            let entry_bytes = PUT_ENTRY_BYTES + value.len();
            if !chunk.is_empty() && (chunk.len() == max_batch || chunk_bytes + entry_bytes > max_frame) {
                chunks.push(std::mem::take(&mut chunk));
                chunk_bytes = BATCH_FRAME_BYTES;
            }
            chunk.push(i);
            chunk_bytes += entry_bytes;
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }

        let mut pending = Vec::with_capacity(chunks.len());
        let mut batch: Vec<(Key, &[u8])> = Vec::new();
        for idx in &chunks {
            batch.clear();
            batch.extend(idx.iter().map(|&i| entries[i]));
            let bytes = BATCH_FRAME_BYTES + batch.iter().map(|(_, v)| PUT_ENTRY_BYTES + v.len()).sum::<usize>();
            debug_assert!(bytes <= max_frame);
            let p = inner.start(Expect::PutOk(idx.len()), bytes, |out, id| encode_put(out, id, &batch)).await?;
            pending.push(p);
        }
        for (idx, p) in chunks.iter().zip(pending) {
            match p.wait().await? {
                Reply::Statuses(s) => {
                    for (&i, &b) in idx.iter().zip(&s) {
                        statuses[i] = PutStatus::from_u8(b).expect("checked by the decoder");
                    }
                }
                other => unreachable!("checked by the reader: {other:?}"),
            }
        }
        Ok(statuses)
    }

    /// Remove blocks. The answer has one status per key, in order.
    pub async fn del(&self, keys: &[Key]) -> Result<Vec<DelStatus>, ClientError> {
        let inner = &*self.inner;
        let mut pending = Vec::new();
        for chunk in keys.chunks(inner.del_batch) {
            let p = inner
                .start(Expect::DelOk(chunk.len()), BATCH_FRAME_BYTES + chunk.len() * KEY_BYTES, |out, id| {
                    encode_keys(out, Opcode::Del, id, chunk)
                })
                .await?;
            pending.push(p);
        }
        let mut statuses = Vec::with_capacity(keys.len());
        for p in pending {
            match p.wait().await? {
                Reply::Statuses(s) => statuses.extend(s.iter().map(|&b| match b {
                    0 => DelStatus::Absent,
                    _ => DelStatus::Removed,
                })),
                other => unreachable!("checked by the reader: {other:?}"),
            }
        }
        Ok(statuses)
    }

    /// The server's statistics as JSON text: server totals and this tenant, or every tenant
    /// when HELLO_OK carried the ADMIN flag.
    pub async fn stats(&self) -> Result<String, ClientError> {
        let p =
            self.inner.start(Expect::Stats, HEADER_BYTES, |out, id| encode_raw(out, Opcode::Stats, id, b"")).await?;
        match p.wait().await? {
            Reply::Stats(json) => Ok(json),
            other => unreachable!("checked by the reader: {other:?}"),
        }
    }

    /// Round-trip time of a PING, from queueing the frame to the PONG (waiting for an
    /// in-flight slot not included). The PONG must echo the PING's payload.
    pub async fn ping(&self) -> Result<Duration, ClientError> {
        let mut sent_at = Instant::now();
        let p = self
            .inner
            .start_with(Expect::Pong, HEADER_BYTES + 8, |out, id| {
                sent_at = Instant::now();
                let payload = id.to_le_bytes();
                encode_raw(out, Opcode::Ping, id, &payload);
                Bytes::copy_from_slice(&payload)
            })
            .await?;
        match p.wait().await? {
            Reply::Pong => Ok(sent_at.elapsed()),
            other => unreachable!("checked by the reader: {other:?}"),
        }
    }

    /// Has the connection closed (by [`Client::close`], by the server, or after a failure)?
    /// A closed client stays closed; connect anew.
    pub fn is_closed(&self) -> bool {
        self.inner.shared.is_closed()
    }

    /// Close the connection. Requests in flight fail with [`ClientError::Closed`], later ones
    /// too. Returns at once; [`Client::wait_closed`] waits for the socket to be released.
    pub fn close(&self) {
        self.inner.shared.fail(ClientError::Closed);
    }

    /// Wait until the connection has closed and its reader and writer tasks have ended
    /// (the socket is released then).
    pub async fn wait_closed(&self) {
        self.inner.shared.wait_tasks_done().await
    }
}

/// The client side of the TLS handshake, checking the server's certificate against the
/// configured CA and name.
async fn connect_tls(
    tls: &ClientTls,
    addr: std::net::SocketAddr,
    tcp: TcpStream,
) -> Result<farcache_tls::tokio_rustls::client::TlsStream<TcpStream>, ClientError> {
    let name = match &tls.server_name {
        Some(n) => ServerName::try_from(n.clone())
            .map_err(|_| ClientError::Config(format!("tls server name {n:?} is not a DNS name or IP address")))?,
        None => ServerName::IpAddress(addr.ip().into()),
    };
    farcache_tls::TlsConnector::from(tls.config.clone()).connect(name, tcp).await.map_err(|e| {
        let why = match e.get_ref().and_then(|i| i.downcast_ref::<farcache_tls::rustls::Error>()) {
            Some(r) => r.to_string(),
            None => e.to_string(),
        };
        ClientError::Tls(why)
    })
}

impl Inner {
    /// Send one request: take an in-flight slot, register a waiter, queue the frame. All of it
    /// within the request timeout, which keeps running in [`Pending::wait`].
    async fn start(
        &self,
        expect: Expect,
        frame_bytes: usize,
        encode: impl FnOnce(&mut Vec<u8>, u64),
    ) -> Result<Pending<'_>, ClientError> {
        self.start_with(
            |()| expect,
            frame_bytes,
            |out, id| {
                encode(out, id);
            },
        )
        .await
    }

    /// [`Inner::start`] where encoding yields what the answer must match.
    async fn start_with<T>(
        &self,
        expect: impl FnOnce(T) -> Expect,
        frame_bytes: usize,
        encode: impl FnOnce(&mut Vec<u8>, u64) -> T,
    ) -> Result<Pending<'_>, ClientError> {
        let deadline = Instant::now() + self.request_timeout;
        let send = async {
            if self.shared.is_closed() {
                return Err(ClientError::Closed);
            }
            let slot = self.shared.slots.clone().acquire_owned().await.map_err(|_| ClientError::Closed)?;
            let id = self.shared.next_id();
            let mut frame = Vec::with_capacity(frame_bytes);
            let made = encode(&mut frame, id);
            debug_assert!(frame.len() <= self.hello.max_frame_bytes as usize);
            let (tx, rx) = oneshot::channel();
            self.shared.register(id, tx, expect(made), slot)?;
            // From here on, dropping `pending` (an error, a timeout, a cancelled caller) takes
            // the waiter out again.
            let pending = Pending { shared: &self.shared, id, rx, deadline, armed: true };
            self.frames.send(frame).await.map_err(|_| ClientError::Closed)?;
            Ok(pending)
        };
        timeout_at(deadline, send).await.unwrap_or(Err(ClientError::Timeout))
    }
}

/// A request on the wire, waiting for its answer.
struct Pending<'a> {
    shared: &'a Shared,
    id: u64,
    rx: oneshot::Receiver<Result<Reply, ClientError>>,
    deadline: Instant,
    /// Still registered: forget the waiter on drop.
    armed: bool,
}

impl Pending<'_> {
    async fn wait(mut self) -> Result<Reply, ClientError> {
        match timeout_at(self.deadline, &mut self.rx).await {
            Err(_) => Err(ClientError::Timeout),
            Ok(answer) => {
                // Whoever sent (or dropped) the answer took the waiter out already.
                self.armed = false;
                answer.unwrap_or(Err(ClientError::Closed))
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.forget(self.id);
        }
    }
}
