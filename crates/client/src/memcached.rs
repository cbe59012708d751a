//! memcached as a lender: an async, pipelined client of memcached's meta protocol (1.6+).
//!
//! Same shape and same guarantees as [`crate::Client`]: cheap clones share one TCP
//! connection, many tasks pipeline requests on it (at most `max_inflight` at once), every
//! answer is checked against the request it answers before a caller sees it, and anything
//! that breaks the protocol closes the connection — a caller never gets a value that might
//! belong to another request.
//!
//! memcached answers the requests of a connection in order, and the meta protocol echoes an
//! opaque token (`O<n>`) on every answer but errors. Each key of a request gets its own
//! token (consecutive numbers, never reused while the connection lives): the reader takes the
//! oldest request outstanding, expects exactly one answer per key, in order, carrying that
//! key's token and a code that fits the command — otherwise the connection closes.
//!
//! ```text
//! mg fc:db1:<file>:<block>:<epoch> v O7\r\n      ->  VA 4136 O7\r\n<4136 bytes>\r\n  |  EN O7\r\n
//! ms fc:db1:<...> 4136 T0 O8\r\n<4136 bytes>\r\n  ->  HD O8\r\n  |  NS O8\r\n  |  SERVER_ERROR ...\r\n
//! md fc:db1:<...> O9\r\n                         ->  HD O9\r\n  |  NF O9\r\n
//! ```
//!
//! Keys carry the tenant (`fc:<tenant>:<file>:<block>:<epoch>`, hex numbers, at most 134
//! bytes: memcached allows 250). memcached has no tenants and no authentication, so anyone who
//! can reach it can read, replace or evict any key: the engine seals blocks (authenticated
//! encryption bound to tenant, file, block and version) so that a lying or shared memcached
//! costs misses only, and refuses memcached lenders without a block key unless the operator
//! explicitly accepts plaintext (docs/SEMANTICS.md).
//!
//! Bounds: requests in flight (`max_inflight`, each holding its slot until its answer has
//! been read, even after its caller gave up, so answers owed never pile up), keys per request
//! ([`MAX_KEYS_PER_REQUEST`]), line length ([`MAX_LINE_BYTES`]), value length
//! ([`MAX_VALUE_BYTES`], or the server's `item_size_max` if smaller), handshake lines
//! ([`MAX_STAT_LINES`]), and time (connect and request timeouts).

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use farcache_wire::{is_valid_tenant_name, DelStatus, Key, PutStatus};
use parking_lot::Mutex;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout, timeout_at, Instant};

use crate::conn::{write_frames, Connection, TaskGuard};
use crate::{ClientConfig, ClientError};

/// Longest answer line accepted (a `VA` line, a `STAT` line, an error).
pub const MAX_LINE_BYTES: usize = 1024;
/// Most `STAT` lines accepted in the handshake's two `stats` answers.
pub const MAX_STAT_LINES: usize = 1024;
/// Most keys in one pipelined request; larger batches go out as several requests.
pub const MAX_KEYS_PER_REQUEST: usize = 256;
/// Largest value accepted in an answer (a sealed 4 KiB block is 4,136 bytes).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Prefix of every key this client uses.
pub const KEY_PREFIX: &str = "fc";
/// Bytes of the reader's buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;

/// What the handshake learned about the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McInfo {
    /// `version` from `stats`.
    pub version: String,
    /// Derived from the server's pid and start time: a new value after a reconnection means
    /// memcached restarted and its memory is new.
    pub instance_id: u64,
    /// The largest value this client accepts from (and sends to) this server: the smaller of
    /// [`MAX_VALUE_BYTES`] and `item_size_max` less room for the item header and key.
    pub max_value_bytes: u32,
}

/// The memcached key of `key` for `tenant`: `fc:<tenant>:<file>:<block>:<epoch>` in hex.
pub fn memcached_key(tenant: &str, key: &Key) -> String {
    let mut out = Vec::with_capacity(96);
    write_key(&mut out, tenant, key);
    String::from_utf8(out).expect("ASCII")
}

/// Append [`memcached_key`] to `out` in place (requests build no string per key).
fn write_key(out: &mut Vec<u8>, tenant: &str, key: &Key) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{KEY_PREFIX}:{tenant}:{:x}:{:x}:{:x}", key.file, key.block, key.epoch);
}

/// A connection to one memcached. Cheap to clone; all clones share the connection, which
/// closes when the last clone is dropped or [`McClient::close`] is called.
#[derive(Clone)]
pub struct McClient {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    info: McInfo,
    addr: SocketAddr,
    tenant: String,
    request_timeout: Duration,
    /// Encoded requests for the writer task. Bounded by the in-flight limit.
    frames: mpsc::Sender<Vec<u8>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.fail(ClientError::Closed);
    }
}

impl fmt::Debug for McClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McClient")
            .field("addr", &self.inner.addr)
            .field("info", &self.inner.info)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// The command of a request; every key of it gets one answer of the command's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmd {
    Get,
    Set,
    Delete,
}

/// One answer, checked against its command.
#[derive(Debug)]
enum Answer {
    Value(Option<Bytes>),
    Put(PutStatus),
    Del(DelStatus),
}

type AnswersTx = oneshot::Sender<Result<Vec<Answer>, ClientError>>;

/// A request on the wire whose answers are still owed. It holds its in-flight slot until
/// they have all been read, even after its caller gave up.
struct Owed {
    cmd: Cmd,
    /// The token of its first key; key `i` carries `first_token + i`.
    first_token: u32,
    keys: usize,
    tx: AnswersTx,
    _slot: OwnedSemaphorePermit,
}

struct State {
    /// Requests in the order they were handed to the writer, which is the order memcached
    /// answers them.
    owed: VecDeque<Owed>,
    next_token: u32,
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    closed: AtomicBool,
    closed_tx: watch::Sender<bool>,
    live_tasks: watch::Sender<usize>,
    slots: Arc<Semaphore>,
    /// Largest value accepted.
    max_value_bytes: usize,
}

impl Shared {
    fn fail(&self, cause: ClientError) {
        let owed = {
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            std::mem::take(&mut st.owed)
        };
        self.closed.store(true, Ordering::Release);
        self.slots.close();
        self.closed_tx.send_replace(true);
        tracing::debug!(cause = %cause, owed = owed.len(), "memcached connection closed");
        for o in owed {
            let _ = o.tx.send(Err(cause.duplicate()));
        }
    }
}

impl Connection for Shared {
    fn fail(&self, cause: ClientError) {
        Shared::fail(self, cause)
    }
    fn live_tasks(&self) -> &watch::Sender<usize> {
        &self.live_tasks
    }
}

impl McClient {
    /// Connect (TCP, with TCP_NODELAY) and check that the server speaks the meta protocol,
    /// learning its version, instance and item size limit, all within `cfg.connect_timeout`.
    /// `cfg.secret` must be empty and `cfg.tls` unset: memcached has neither.
    pub async fn connect(cfg: &ClientConfig) -> Result<McClient, ClientError> {
        if !is_valid_tenant_name(&cfg.tenant) {
            return Err(ClientError::Config(format!("tenant {:?}: use 1 to 64 of A-Z a-z 0-9 . _ -", cfg.tenant)));
        }
        if cfg.tls.is_some() {
            return Err(ClientError::Config(
                "memcached lenders are reached over plain TCP; TLS is not available".into(),
            ));
        }
        if !cfg.secret.is_empty() {
            return Err(ClientError::Config("memcached has no tenant secrets; connect without one".into()));
        }
        let max_inflight = (cfg.max_inflight as usize).max(1);
        let setup = async {
            let tcp = TcpStream::connect(cfg.addr).await.map_err(ClientError::Connect)?;
            tcp.set_nodelay(true).map_err(ClientError::Connect)?;
            let (rd, mut wr) = tcp.into_split();
            let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, rd);
            let info = handshake(&mut rd, &mut wr, cfg.addr).await?;
            Ok::<_, ClientError>((rd, wr, info))
        };
        let (rd, wr, info) = timeout(cfg.connect_timeout, setup).await.map_err(|_| ClientError::Timeout)??;
        let shared = Arc::new(Shared {
            state: Mutex::new(State { owed: VecDeque::new(), next_token: 1, closed: false }),
            closed: AtomicBool::new(false),
            closed_tx: watch::Sender::new(false),
            live_tasks: watch::Sender::new(0),
            slots: Arc::new(Semaphore::new(max_inflight)),
            max_value_bytes: info.max_value_bytes as usize,
        });
        let (frames_tx, frames_rx) = mpsc::channel(max_inflight);
        tokio::spawn(reader(TaskGuard::new(shared.clone()), rd));
        tokio::spawn(writer(TaskGuard::new(shared.clone()), wr, frames_rx));
        tracing::debug!(addr = %cfg.addr, tenant = %cfg.tenant, ?info, "memcached connection open");
        Ok(McClient {
            inner: Arc::new(Inner {
                shared,
                info,
                addr: cfg.addr,
                tenant: cfg.tenant.clone(),
                request_timeout: cfg.request_timeout,
                frames: frames_tx,
            }),
        })
    }

    /// What the handshake learned: version, instance id, value size limit.
    pub fn info(&self) -> &McInfo {
        &self.inner.info
    }

    /// Look up blocks: one entry per key, in order, `None` on a miss (or on a
    /// `SERVER_ERROR` for that key).
    pub async fn get(&self, keys: &[Key]) -> Result<Vec<Option<Bytes>>, ClientError> {
        let answers = self.run(Cmd::Get, keys.len(), |i, token, out| {
            out.extend_from_slice(b"mg ");
            write_key(out, &self.inner.tenant, &keys[i]);
            let _ = write!(out, " v O{token}\r\n");
        });
        Ok(answers
            .await?
            .into_iter()
            .map(|a| match a {
                Answer::Value(v) => v,
                other => unreachable!("checked by the reader: {other:?}"),
            })
            .collect())
    }

    /// Store blocks (no expiry: memcached evicts by its own LRU). One status per entry, in
    /// order. A value longer than [`McInfo::max_value_bytes`] is not sent and reads
    /// `TooLarge`.
    pub async fn put(&self, entries: &[(Key, &[u8])]) -> Result<Vec<PutStatus>, ClientError> {
        let limit = self.inner.info.max_value_bytes as usize;
        let fits: Vec<usize> = (0..entries.len()).filter(|&i| entries[i].1.len() <= limit).collect();
        let answers = self.run(Cmd::Set, fits.len(), |i, token, out| {
            let (key, value) = entries[fits[i]];
            out.extend_from_slice(b"ms ");
            write_key(out, &self.inner.tenant, &key);
            let _ = write!(out, " {} T0 O{token}\r\n", value.len());
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        });
        let answers = answers.await?;
        let mut statuses = vec![PutStatus::TooLarge; entries.len()];
        for (&i, a) in fits.iter().zip(answers) {
            match a {
                Answer::Put(s) => statuses[i] = s,
                other => unreachable!("checked by the reader: {other:?}"),
            }
        }
        Ok(statuses)
    }

    /// Delete blocks: one status per key, in order.
    pub async fn del(&self, keys: &[Key]) -> Result<Vec<DelStatus>, ClientError> {
        let answers = self.run(Cmd::Delete, keys.len(), |i, token, out| {
            out.extend_from_slice(b"md ");
            write_key(out, &self.inner.tenant, &keys[i]);
            let _ = write!(out, " O{token}\r\n");
        });
        Ok(answers
            .await?
            .into_iter()
            .map(|a| match a {
                Answer::Del(s) => s,
                other => unreachable!("checked by the reader: {other:?}"),
            })
            .collect())
    }

    /// Send `n` keys' commands (written by `encode(i, token, out)`) as requests of at most
    /// [`MAX_KEYS_PER_REQUEST`] keys, pipelined, and collect their answers in order. Each
    /// request is bounded by the request timeout, from waiting for its slot to its answer.
    async fn run(
        &self,
        cmd: Cmd,
        n: usize,
        mut encode: impl FnMut(usize, u32, &mut Vec<u8>),
    ) -> Result<Vec<Answer>, ClientError> {
        let inner = &*self.inner;
        let mut pending = Vec::new();
        let mut start = 0;
        while start < n {
            let end = (start + MAX_KEYS_PER_REQUEST).min(n);
            let deadline = Instant::now() + inner.request_timeout;
            let slot = match timeout_at(deadline, inner.shared.slots.clone().acquire_owned()).await {
                Err(_) => return Err(ClientError::Timeout),
                Ok(Err(_)) => return Err(ClientError::Closed),
                Ok(Ok(s)) => s,
            };
            let (tx, rx) = oneshot::channel();
            {
                // Under the lock: the order of `owed` is the order of the bytes on the wire.
                let mut st = inner.shared.state.lock();
                if st.closed {
                    return Err(ClientError::Closed);
                }
                let first_token = st.next_token;
                let mut out = Vec::with_capacity((end - start) * 96);
                for (j, i) in (start..end).enumerate() {
                    encode(i, first_token.wrapping_add(j as u32), &mut out);
                }
                // Room is guaranteed: the channel holds as many requests as there are slots.
                if inner.frames.try_send(out).is_err() {
                    drop(st);
                    inner.shared.fail(ClientError::Closed);
                    return Err(ClientError::Closed);
                }
                st.next_token = first_token.wrapping_add((end - start) as u32);
                st.owed.push_back(Owed { cmd, first_token, keys: end - start, tx, _slot: slot });
            }
            pending.push((deadline, rx));
            start = end;
        }
        let mut out = Vec::with_capacity(n);
        for (deadline, rx) in pending {
            match timeout_at(deadline, rx).await {
                Err(_) => return Err(ClientError::Timeout),
                Ok(Err(_)) => return Err(ClientError::Closed),
                Ok(Ok(answers)) => out.extend(answers?),
            }
        }
        Ok(out)
    }

    /// Has the connection closed? A closed client stays closed; connect anew.
    pub fn is_closed(&self) -> bool {
        self.inner.shared.closed.load(Ordering::Acquire)
    }

    /// Close the connection; requests in flight fail with [`ClientError::Closed`].
    pub fn close(&self) {
        self.inner.shared.fail(ClientError::Closed);
    }

    /// Wait until the connection has closed and both its tasks have ended.
    pub async fn wait_closed(&self) {
        let mut rx = self.inner.shared.live_tasks.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// `mn` (does it speak the meta protocol?), then `stats` and `stats settings`.
async fn handshake<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    addr: SocketAddr,
) -> Result<McInfo, ClientError> {
    wr.write_all(b"mn\r\nstats\r\nstats settings\r\n").await.map_err(ClientError::Connect)?;
    let mut line = Vec::with_capacity(MAX_LINE_BYTES);
    if !read_line(rd, &mut line).await? {
        return Err(ClientError::Connect(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during the handshake")));
    }
    if line != b"MN" {
        return Err(ClientError::UnsupportedVersion(format!(
            "{addr} answered {:?} to the meta protocol's no-op: it is not memcached 1.6 or later (the meta protocol \
             is needed); upgrade it, or list it as a farcache lender without memcached://",
            String::from_utf8_lossy(&line)
        )));
    }
    let mut stats = Vec::new();
    let mut ends = 0;
    while ends < 2 {
        if stats.len() >= MAX_STAT_LINES {
            return Err(ClientError::Protocol(format!("more than {MAX_STAT_LINES} STAT lines")));
        }
        if !read_line(rd, &mut line).await? {
            return Err(ClientError::Connect(io::Error::new(io::ErrorKind::UnexpectedEof, "closed during stats")));
        }
        if line == b"END" {
            ends += 1;
            continue;
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        let mut t = text.split(' ');
        match (t.next(), t.next(), t.next()) {
            (Some("STAT"), Some(name), Some(value)) => stats.push((name.to_owned(), value.to_owned())),
            _ => return Err(ClientError::Protocol(format!("unexpected line in the stats answer: {text:?}"))),
        }
    }
    let get = |name: &str| stats.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    let num = |name: &str| get(name).and_then(|v| v.parse::<u64>().ok());
    let (pid, time, uptime) = (num("pid").unwrap_or(0), num("time").unwrap_or(0), num("uptime").unwrap_or(0));
    let started = time.saturating_sub(uptime);
    // Start times a second apart or less are the same start (`time` and `uptime` are read
    // at slightly different moments).
    let instance_id = ((pid << 40) ^ (started / 2)).max(1);
    let item_size_max = num("item_size_max").unwrap_or(1 << 20) as usize;
    // An item holds its header (~56 bytes), the key (up to 250) and a few bytes of suffix.
    let max_value_bytes = item_size_max.saturating_sub(320).min(MAX_VALUE_BYTES) as u32;
    Ok(McInfo { version: get("version").unwrap_or("unknown").to_owned(), instance_id, max_value_bytes })
}

/// Read one `\r\n`-terminated line into `line` (without its terminator). `Ok(false)`: the
/// stream ended cleanly before the line started. A line longer than [`MAX_LINE_BYTES`], one
/// ending in a bare `\n`, or an end of stream inside a line is a protocol violation.
async fn read_line<R: AsyncBufRead + Unpin>(rd: &mut R, line: &mut Vec<u8>) -> Result<bool, ClientError> {
    line.clear();
    loop {
        let buf = rd.fill_buf().await.map_err(ClientError::Io)?;
        if buf.is_empty() {
            if line.is_empty() {
                return Ok(false);
            }
            return Err(ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "memcached closed mid-line")));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE_BYTES + 2 {
            return Err(ClientError::Protocol(format!("an answer line longer than {MAX_LINE_BYTES} bytes")));
        }
        line.extend_from_slice(&buf[..take]);
        rd.consume(take);
        if done {
            if !line.ends_with(b"\r\n") {
                return Err(ClientError::Protocol("an answer line ends in a bare \\n".into()));
            }
            line.truncate(line.len() - 2);
            return Ok(true);
        }
    }
}

/// One answer line, split: the code, the value length of a `VA`, the opaque token.
#[derive(Debug, PartialEq, Eq)]
struct Line<'a> {
    code: &'a str,
    value_len: Option<usize>,
    token: Option<u32>,
}

fn parse_line(line: &[u8]) -> Result<Line<'_>, ClientError> {
    let bad = || ClientError::Protocol(format!("malformed answer line {:?}", String::from_utf8_lossy(line)));
    let text = std::str::from_utf8(line).map_err(|_| bad())?;
    let mut words = text.split(' ');
    let code = words.next().ok_or_else(bad)?;
    let value_len =
        if code == "VA" { Some(words.next().ok_or_else(bad)?.parse::<usize>().map_err(|_| bad())?) } else { None };
    let mut token = None;
    for w in words {
        if let Some(t) = w.strip_prefix('O') {
            if token.replace(t.parse::<u32>().map_err(|_| bad())?).is_some() {
                return Err(bad());
            }
        }
    }
    Ok(Line { code, value_len, token })
}

/// Read the answer to key `i` of `owed`. An `Err` closes the connection.
async fn read_answer<R: AsyncBufRead + Unpin>(
    rd: &mut R,
    line: &mut Vec<u8>,
    owed: &Owed,
    i: usize,
    max_value_bytes: usize,
) -> Result<Answer, ClientError> {
    if !read_line(rd, line).await? {
        return Err(ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "memcached closed the connection")));
    }
    if line.starts_with(b"SERVER_ERROR") {
        // memcached could not do it (out of memory, too large): no token on these.
        let text = String::from_utf8_lossy(line);
        return Ok(match owed.cmd {
            Cmd::Get => Answer::Value(None),
            Cmd::Set if text.contains("too large") => Answer::Put(PutStatus::TooLarge),
            Cmd::Set => Answer::Put(PutStatus::NoSpace),
            Cmd::Delete => Answer::Del(DelStatus::Absent),
        });
    }
    if line.starts_with(b"CLIENT_ERROR") || line == b"ERROR" {
        return Err(ClientError::Protocol(format!(
            "memcached refused a {:?} request: {}",
            owed.cmd,
            String::from_utf8_lossy(line)
        )));
    }
    let l = parse_line(line)?;
    let want = owed.first_token.wrapping_add(i as u32);
    if l.token != Some(want) {
        return Err(ClientError::Protocol(format!(
            "answer {:?} carries token {:?} where O{want} was due",
            String::from_utf8_lossy(line),
            l.token
        )));
    }
    let answer = match (owed.cmd, l.code) {
        (Cmd::Get, "EN") => Answer::Value(None),
        (Cmd::Get, "VA") => {
            let n = l.value_len.unwrap_or(0);
            if n > max_value_bytes {
                return Err(ClientError::Protocol(format!(
                    "a value of {n} bytes, more than the {max_value_bytes} allowed"
                )));
            }
            let mut v = BytesMut::zeroed(n + 2);
            rd.read_exact(&mut v).await.map_err(ClientError::Io)?;
            if &v[n..] != b"\r\n" {
                return Err(ClientError::Protocol(format!("a value of {n} bytes not followed by \\r\\n")));
            }
            v.truncate(n);
            Answer::Value(Some(v.freeze()))
        }
        (Cmd::Set, "HD") => Answer::Put(PutStatus::Stored),
        (Cmd::Set, "NS") => Answer::Put(PutStatus::NoSpace),
        (Cmd::Delete, "HD") => Answer::Del(DelStatus::Removed),
        (Cmd::Delete, "NF") => Answer::Del(DelStatus::Absent),
        (cmd, code) => {
            return Err(ClientError::Protocol(format!("answer code {code:?} does not fit a {cmd:?} request")))
        }
    };
    Ok(answer)
}

async fn reader<R: AsyncBufRead + Unpin>(guard: TaskGuard<Shared>, mut rd: R) {
    let shared = guard.0.clone();
    let mut closed = shared.closed_tx.subscribe();
    let mut line = Vec::with_capacity(MAX_LINE_BYTES + 2);
    let cause = loop {
        // Wait for bytes first: an answer with no request outstanding is a violation.
        let ready = tokio::select! {
            _ = closed.wait_for(|c| *c) => return,
            r = rd.fill_buf() => r.map(|b| b.is_empty()),
        };
        match ready {
            Err(e) => break ClientError::Io(e),
            Ok(true) => break ClientError::Closed,
            Ok(false) => {}
        }
        let Some(owed) = shared.state.lock().owed.pop_front() else {
            break ClientError::Protocol("memcached sent an answer to no request".into());
        };
        let mut answers = Vec::with_capacity(owed.keys);
        let mut failed = None;
        for i in 0..owed.keys {
            let a = tokio::select! {
                _ = closed.wait_for(|c| *c) => return,
                a = read_answer(&mut rd, &mut line, &owed, i, shared.max_value_bytes) => a,
            };
            match a {
                Ok(a) => answers.push(a),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(cause) = failed {
            let _ = owed.tx.send(Err(cause.duplicate()));
            break cause;
        }
        let _ = owed.tx.send(Ok(answers));
    };
    shared.fail(cause);
}

async fn writer<W: AsyncWrite + Unpin>(guard: TaskGuard<Shared>, mut wr: W, mut frames: mpsc::Receiver<Vec<u8>>) {
    let shared = &guard.0;
    if let Err(e) = write_frames(&mut wr, &mut frames, shared.closed_tx.subscribe()).await {
        shared.fail(ClientError::Io(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_tenant_and_fit_memcached() {
        let k = Key::new(u128::MAX, u64::MAX, u64::MAX);
        let tenant = "t".repeat(64);
        let s = memcached_key(&tenant, &k);
        assert!(s.starts_with(&format!("fc:{tenant}:")));
        assert!(s.len() <= 250, "{}", s.len());
        assert!(!s.contains(|c: char| c.is_whitespace() || c.is_control()));
        assert_ne!(memcached_key("a", &Key::new(1, 2, 3)), memcached_key("b", &Key::new(1, 2, 3)));
        assert_ne!(memcached_key("a", &Key::new(1, 2, 3)), memcached_key("a", &Key::new(1, 2, 4)));
        assert_eq!(memcached_key("db", &Key::new(0x1f, 2, 3)), "fc:db:1f:2:3");
    }

    #[test]
    fn lines_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_line(b"VA 12 O7").unwrap(), Line { code: "VA", value_len: Some(12), token: Some(7) });
        assert_eq!(parse_line(b"EN O9").unwrap(), Line { code: "EN", value_len: None, token: Some(9) });
        assert_eq!(parse_line(b"HD").unwrap(), Line { code: "HD", value_len: None, token: None });
        for bad in [&b"VA x O1"[..], b"VA", b"EN Ox", b"EN O1 O2", b"\xff\xfe"] {
            assert!(parse_line(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn read_line_is_bounded_and_strict() {
        let mut line = Vec::new();
        let mut ok: &[u8] = b"MN\r\n";
        assert!(read_line(&mut ok, &mut line).await.unwrap());
        assert_eq!(line, b"MN");
        let long = vec![b'a'; MAX_LINE_BYTES + 10];
        assert!(matches!(read_line(&mut &long[..], &mut line).await, Err(ClientError::Protocol(_))));
        assert!(matches!(read_line(&mut &b"MN\n"[..], &mut line).await, Err(ClientError::Protocol(_))));
        assert!(matches!(read_line(&mut &b"MN"[..], &mut line).await, Err(ClientError::Io(_))));
        assert!(!read_line(&mut &b""[..], &mut line).await.unwrap());
    }
}
