//! One connection's machinery: the table of waiting requests, the reader task and the writer
//! task.
//!
//! States of a connection (the client holds one per `Client`):
//! * open: both tasks run; requests register a waiter, queue their frame and wait;
//! * closed: `Shared::fail` ran exactly once, every waiter got the cause, the slot semaphore
//!   is closed so nobody new gets in, and both tasks are ending. There is no way back; the
//!   caller connects anew.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use farcache_wire::{
    check_len_prefix, decode_response, split_frame, Header, Limits, Response, FLAG_FATAL, HEADER_BYTES,
};
use hashbrown::HashMap;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::ClientError;

/// The writer gathers queued frames into one buffer of up to this many bytes per write
/// syscall. A frame this large or larger is written on its own, without a copy.
pub(crate) const COALESCE_BYTES: usize = 64 << 10;
/// The reader asks the socket for at least this many bytes at a time (never more than the
/// frame limit allows the buffer to hold).
pub(crate) const READ_CHUNK_BYTES: usize = 64 << 10;

/// What the answer to a request must look like. The reader checks it before a caller sees
/// anything, so a response that does not fit its request never reaches a caller.
#[derive(Debug)]
pub(crate) enum Expect {
    Values(usize),
    PutOk(usize),
    DelOk(usize),
    Stats,
    Pong(Bytes),
}

/// An answer that matched its request.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Hits share the memory of the frame they arrived in.
    Values(Vec<Option<Bytes>>),
    /// One status byte per entry, already checked against the known codes.
    Statuses(Vec<u8>),
    Stats(String),
    Pong,
}

pub(crate) type ReplyTx = oneshot::Sender<Result<Reply, ClientError>>;

/// A request waiting for its answer. It holds its in-flight slot: the slot is free again when
/// the answer arrives, the request gives up (timeout, cancellation) or the connection fails.
struct Waiter {
    tx: ReplyTx,
    expect: Expect,
    _slot: OwnedSemaphorePermit,
}

struct State {
    waiters: HashMap<u64, Waiter>,
    closed: bool,
}

/// What the client handle and both tasks share.
pub(crate) struct Shared {
    state: Mutex<State>,
    closed: AtomicBool,
    /// Flips to true once, when the connection fails; the tasks watch it to stop.
    closed_tx: watch::Sender<bool>,
    /// How many of the two tasks still run.
    live_tasks: watch::Sender<usize>,
    /// In-flight slots.
    pub(crate) slots: Arc<Semaphore>,
    /// The next request id. Ids are never reused on a connection, so an id at or above this
    /// was never sent and a response naming it is a protocol violation.
    next_id: AtomicU64,
    /// Response decoding limits, from HELLO_OK.
    limits: Limits,
}

impl Shared {
    pub(crate) fn new(slots: usize, first_id: u64, limits: Limits) -> Shared {
        Shared {
            state: Mutex::new(State { waiters: HashMap::new(), closed: false }),
            closed: AtomicBool::new(false),
            closed_tx: watch::Sender::new(false),
            live_tasks: watch::Sender::new(0),
            slots: Arc::new(Semaphore::new(slots)),
            next_id: AtomicU64::new(first_id),
            limits,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Register a waiter for `id`. Fails once the connection is closed, so no waiter can be
    /// added after `fail` has drained the table.
    pub(crate) fn register(
        &self,
        id: u64,
        tx: ReplyTx,
        expect: Expect,
        slot: OwnedSemaphorePermit,
    ) -> Result<(), ClientError> {
        let mut st = self.state.lock();
        if st.closed {
            return Err(ClientError::Closed);
        }
        let old = st.waiters.insert(id, Waiter { tx, expect, _slot: slot });
        debug_assert!(old.is_none(), "request id {id} reused");
        Ok(())
    }

    /// The request gave up: drop its waiter (and free its slot). A late answer is then dropped.
    pub(crate) fn forget(&self, id: u64) {
        let w = self.state.lock().waiters.remove(&id);
        drop(w);
    }

    /// Close the connection for `cause`: every waiter gets a copy of it, nobody new gets in,
    /// the tasks stop. Only the first call has an effect.
    pub(crate) fn fail(&self, cause: ClientError) {
        let waiters = {
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            st.closed = true;
            std::mem::take(&mut st.waiters)
        };
        self.closed.store(true, Ordering::Release);
        self.slots.close();
        self.closed_tx.send_replace(true);
        tracing::debug!(cause = %cause, waiters = waiters.len(), "farcache connection closed");
        for (_, w) in waiters {
            let _ = w.tx.send(Err(cause.duplicate()));
        }
    }

    /// Wait until both tasks have ended.
    pub(crate) async fn wait_tasks_done(&self) {
        let mut rx = self.live_tasks.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    fn closed_rx(&self) -> watch::Receiver<bool> {
        self.closed_tx.subscribe()
    }

    /// Handle one whole frame from the server. An `Err` is a reason to close the connection.
    fn on_frame(&self, header: Header, frame: Bytes) -> Result<(), ClientError> {
        let body = frame.slice(HEADER_BYTES..);
        let id = header.request_id;
        let resp = decode_response(&header, &body, &self.limits)
            .map_err(|e| ClientError::Protocol(format!("response to request {id}: {e}")))?;
        if let Response::Error(err) = resp {
            if header.flags & !FLAG_FATAL != 0 {
                return Err(ClientError::Protocol(format!("ERROR frame with unknown flags 0x{:02x}", header.flags)));
            }
            let cause = ClientError::from_server(err.code, err.message);
            if err.fatal {
                return Err(cause);
            }
            if id == 0 {
                tracing::warn!(
                    code = ?err.code,
                    message = err.message,
                    "farcache server reported a connection-level error"
                );
                return Ok(());
            }
            return match self.take_waiter(id)? {
                Some(w) => {
                    let _ = w.tx.send(Err(cause));
                    Ok(())
                }
                None => Ok(()),
            };
        }
        if header.flags != 0 {
            return Err(ClientError::Protocol(format!(
                "response opcode 0x{:02x} with flags 0x{:02x}",
                header.opcode, header.flags
            )));
        }
        let Some(w) = self.take_waiter(id)? else {
            return Ok(());
        };
        match check_reply(resp, &w.expect, &body) {
            Ok(reply) => {
                let _ = w.tx.send(Ok(reply));
                Ok(())
            }
            Err(why) => {
                let why = format!("response to request {id}: {why}");
                let _ = w.tx.send(Err(ClientError::Protocol(why.clone())));
                Err(ClientError::Protocol(why))
            }
        }
    }

    /// The waiter for `id`, `None` for a request that gave up (its answer is dropped), and an
    /// error for an id that was never sent.
    fn take_waiter(&self, id: u64) -> Result<Option<Waiter>, ClientError> {
        if let Some(w) = self.state.lock().waiters.remove(&id) {
            return Ok(Some(w));
        }
        if id == 0 || id >= self.next_id.load(Ordering::Relaxed) {
            return Err(ClientError::Protocol(format!("response to request {id}, which was never sent")));
        }
        tracing::trace!(id, "dropping a late response");
        Ok(None)
    }
}

/// Turn a decoded response into the reply its request expects, or say why it does not fit.
fn check_reply(resp: Response<'_>, expect: &Expect, body: &Bytes) -> Result<Reply, String> {
    let count_mismatch =
        |what: &str, got: usize, want: usize| format!("{what} has {got} entries for a request of {want}");
    match (resp, expect) {
        (Response::Values(v), Expect::Values(n)) => {
            if v.len() != *n {
                return Err(count_mismatch("VALUES", v.len(), *n));
            }
            Ok(Reply::Values(v.iter().map(|hit| hit.map(|b| body.slice_ref(b))).collect()))
        }
        (Response::PutOk(s), Expect::PutOk(n)) => {
            if s.len() != *n {
                return Err(count_mismatch("PUT_OK", s.len(), *n));
            }
            Ok(Reply::Statuses(s.as_slice().to_vec()))
        }
        (Response::DelOk(s), Expect::DelOk(n)) => {
            if s.len() != *n {
                return Err(count_mismatch("DEL_OK", s.len(), *n));
            }
            Ok(Reply::Statuses(s.as_slice().to_vec()))
        }
        (Response::StatsOk(json), Expect::Stats) => Ok(Reply::Stats(json.to_owned())),
        (Response::Pong(payload), Expect::Pong(sent)) => {
            if payload != &sent[..] {
                return Err("PONG payload differs from the PING payload".into());
            }
            Ok(Reply::Pong)
        }
        (resp, expect) => Err(format!("answer {} does not fit a request expecting {expect:?}", name(&resp))),
    }
}

fn name(resp: &Response<'_>) -> &'static str {
    match resp {
        Response::HelloOk(_) => "HELLO_OK",
        Response::Values(_) => "VALUES",
        Response::PutOk(_) => "PUT_OK",
        Response::DelOk(_) => "DEL_OK",
        Response::StatsOk(_) => "STATS_OK",
        Response::Pong(_) => "PONG",
        Response::Error(_) => "ERROR",
    }
}

/// Frame buffers a connection keeps for reuse besides the one it reads into: a fetch
/// connection has one answer out at a time, so two cover it; a pipelined connection whose
/// callers hold more answers at once allocates the rest.
const FRAME_BUFS_KEPT: usize = 2;
/// A frame of at most this many bytes is copied out of the read buffer (a small allocation,
/// and the frames after it stay where they are); a larger one is handed out in the buffer it
/// was read into, without a copy, and the buffer comes back when the last of its values is
/// dropped.
const SMALL_FRAME_BYTES: usize = 4 << 10;

/// A connection's spare frame buffers. Each holds at most the frame limit (the reader
/// reserves exactly), so a connection keeps at most `FRAME_BUFS_KEPT + 1` frames' worth.
#[derive(Default)]
struct FrameBufs(Mutex<Vec<Vec<u8>>>);

impl FrameBufs {
    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut kept = self.0.lock();
        if kept.len() < FRAME_BUFS_KEPT {
            kept.push(buf);
        }
    }
}

/// A frame buffer on loan to the values of the frame it holds: back to its connection's
/// spares when the last of them is dropped, whichever thread that happens on.
struct Lent {
    buf: Vec<u8>,
    home: Arc<FrameBufs>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.home.give(std::mem::take(&mut self.buf));
    }
}

/// Splits a connection's byte stream into frames. Frames arrive in buffers the connection
/// reuses: before this, every frame took a fresh allocation of 64 KiB or more, which the
/// allocator handed back to the kernel and faulted in again (BENCHMARKS.md, "Session 62").
///
/// Never holds more than `max_frame_bytes` of unconsumed input: each read asks for no more
/// than the room left, and the length prefix is checked as soon as it is in.
pub(crate) struct FrameReader {
    /// `buf[start..]` is input not yet returned as a frame.
    buf: Vec<u8>,
    start: usize,
    spares: Arc<FrameBufs>,
    max_frame_bytes: u32,
}

impl FrameReader {
    pub(crate) fn new(max_frame_bytes: u32) -> FrameReader {
        FrameReader { buf: Vec::new(), start: 0, spares: Arc::default(), max_frame_bytes }
    }

    /// The limit from here on (the handshake's is smaller than the connection's).
    pub(crate) fn set_max_frame_bytes(&mut self, max_frame_bytes: u32) {
        self.max_frame_bytes = max_frame_bytes;
    }

    /// Bytes read and not yet returned in a frame.
    fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Read until a whole frame is in and return it. `Ok(None)` is a clean end of stream at a
    /// frame boundary.
    pub(crate) async fn next<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
    ) -> Result<Option<(Header, Bytes)>, ClientError> {
        let protocol = |e: farcache_wire::WireError| ClientError::Protocol(e.to_string());
        let max = self.max_frame_bytes;
        loop {
            if let Some((h, n)) = split_frame(&self.buf[self.start..], max).map_err(protocol)? {
                return Ok(Some((h, self.take_frame(n))));
            }
            // Less than one frame is buffered, and that frame is within the limit.
            let frame_bytes = check_len_prefix(&self.buf[self.start..], max).map_err(protocol)?.unwrap_or(HEADER_BYTES);
            if self.start > 0 {
                // The start of a frame after ones already returned: to the front.
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let have = self.buf.len();
            let room = max as usize - have;
            // A large frame's remainder exactly (it is handed out in this buffer, so no
            // following frame should start in it); otherwise a chunk, which may hold several
            // small frames.
            let missing = frame_bytes - have;
            let want = if frame_bytes > SMALL_FRAME_BYTES { missing } else { missing.max(READ_CHUNK_BYTES) }.min(room);
            debug_assert!(want > 0);
            if self.buf.capacity() - have < want {
                self.buf.reserve_exact(want);
            }
            let n = (&mut *rd).take(want as u64).read_buf(&mut self.buf).await.map_err(ClientError::Io)?;
            if n == 0 {
                if have == 0 {
                    return Ok(None);
                }
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("server closed the connection {have} bytes into a frame"),
                )));
            }
        }
    }

    /// The whole frame of `n` bytes at the start of the unconsumed input.
    fn take_frame(&mut self, n: usize) -> Bytes {
        let (start, end) = (self.start, self.start + n);
        let frame = if n <= SMALL_FRAME_BYTES {
            self.start = end;
            Bytes::copy_from_slice(&self.buf[start..end])
        } else {
            // Lend this buffer to the frame; whatever follows it moves to a spare.
            let mut next = self.spares.take();
            next.extend_from_slice(&self.buf[end..]);
            let mut lent = std::mem::replace(&mut self.buf, next);
            lent.truncate(end);
            self.start = 0;
            Bytes::from_owner(Lent { buf: lent, home: self.spares.clone() }).slice(start..)
        };
        if self.buffered() == 0 {
            self.buf.clear();
            self.start = 0;
        }
        frame
    }
}

/// What a connection's task guard needs of the state it shares with its tasks.
pub(crate) trait Connection: Send + Sync + 'static {
    /// Close the connection for `cause` (only the first call counts).
    fn fail(&self, cause: ClientError);
    /// How many of its tasks run.
    fn live_tasks(&self) -> &watch::Sender<usize>;
}

impl Connection for Shared {
    fn fail(&self, cause: ClientError) {
        Shared::fail(self, cause)
    }
    fn live_tasks(&self) -> &watch::Sender<usize> {
        &self.live_tasks
    }
}

/// Counts a task as live until it ends, however it ends. Ending the connection here too means
/// that even a panicking task (a bug) leaves no caller waiting.
pub(crate) struct TaskGuard<S: Connection>(pub(crate) Arc<S>);

impl<S: Connection> TaskGuard<S> {
    pub(crate) fn new(shared: Arc<S>) -> TaskGuard<S> {
        shared.live_tasks().send_modify(|n| *n += 1);
        TaskGuard(shared)
    }
}

impl<S: Connection> Drop for TaskGuard<S> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(ClientError::Protocol("client task panicked (a bug)".into()));
        } else {
            self.0.fail(ClientError::Closed);
        }
        self.0.live_tasks().send_modify(|n| *n -= 1);
    }
}

/// Start the reader and the writer. `frames_in` holds whatever arrived after HELLO_OK.
pub(crate) fn spawn_tasks<R, W>(
    shared: &Arc<Shared>,
    rd: R,
    frames_in: FrameReader,
    wr: W,
    frames: mpsc::Receiver<Vec<u8>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let reader_guard = TaskGuard::new(shared.clone());
    let writer_guard = TaskGuard::new(shared.clone());
    tokio::spawn(reader(reader_guard, rd, frames_in));
    tokio::spawn(writer(writer_guard, wr, frames));
}

async fn reader<R: AsyncRead + Unpin>(guard: TaskGuard<Shared>, mut rd: R, mut frames_in: FrameReader) {
    let shared = &guard.0;
    let mut closed = shared.closed_rx();
    frames_in.set_max_frame_bytes(shared.limits.max_frame_bytes);
    let cause = loop {
        let frame = tokio::select! {
            _ = closed.wait_for(|c| *c) => return,
            f = frames_in.next(&mut rd) => f,
        };
        match frame {
            Ok(Some((header, frame))) => {
                if let Err(cause) = shared.on_frame(header, frame) {
                    break cause;
                }
            }
            Ok(None) => break ClientError::Closed,
            Err(cause) => break cause,
        }
    };
    shared.fail(cause);
}

async fn writer<W: AsyncWrite + Unpin>(guard: TaskGuard<Shared>, mut wr: W, mut frames: mpsc::Receiver<Vec<u8>>) {
    let shared = &guard.0;
    if let Err(e) = write_frames(&mut wr, &mut frames, shared.closed_rx()).await {
        shared.fail(ClientError::Io(e));
    }
}

/// A connection's writer: drain `frames` into `wr` (coalesced) until `closed` flips or the
/// channel ends (`Ok`), or a write fails (the error: the caller closes the connection).
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    wr: &mut W,
    frames: &mut mpsc::Receiver<Vec<u8>>,
    mut closed: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(COALESCE_BYTES);
    loop {
        let first = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => return Ok(()),
            f = frames.recv() => match f {
                Some(f) => f,
                None => return Ok(()),
            },
        };
        tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => return Ok(()),
            r = write_coalesced(wr, first, frames, &mut out) => r?,
        };
    }
}

/// Write `first` and whatever else is queued right now, in as few syscalls as
/// [`COALESCE_BYTES`] allows.
async fn write_coalesced<W: AsyncWrite + Unpin>(
    wr: &mut W,
    first: Vec<u8>,
    frames: &mut mpsc::Receiver<Vec<u8>>,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    out.clear();
    let mut next = Some(first);
    while let Some(frame) = next.take() {
        if !out.is_empty() && out.len() + frame.len() > COALESCE_BYTES {
            wr.write_all(out).await?;
            out.clear();
        }
        if frame.len() >= COALESCE_BYTES {
            wr.write_all(&frame).await?;
        } else {
            out.extend_from_slice(&frame);
        }
        next = frames.try_recv().ok();
    }
    if !out.is_empty() {
        wr.write_all(out).await?;
    }
    wr.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use farcache_wire::{encode_raw, Opcode};

    #[tokio::test]
    async fn frame_reader_never_buffers_past_the_limit() {
        // Two frames back to back, then garbage announcing a huge frame.
        let mut bytes = Vec::new();
        encode_raw(&mut bytes, Opcode::Pong, 3, b"abc");
        encode_raw(&mut bytes, Opcode::Pong, 4, b"");
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 100]);
        let mut rd = &bytes[..];
        let mut frames = FrameReader::new(64);
        let (h, f) = frames.next(&mut rd).await.unwrap().unwrap();
        assert_eq!((h.request_id, &f[HEADER_BYTES..]), (3, &b"abc"[..]));
        let (h, _) = frames.next(&mut rd).await.unwrap().unwrap();
        assert_eq!(h.request_id, 4);
        let err = frames.next(&mut rd).await.unwrap_err();
        assert!(matches!(&err, ClientError::Protocol(m) if m.contains("exceeds")), "{err:?}");
        assert!(frames.buffered() <= 64 && frames.buf.capacity() <= 64, "{}", frames.buf.capacity());
    }

    #[tokio::test]
    async fn frame_reader_reports_eof_inside_a_frame() {
        let mut bytes = Vec::new();
        encode_raw(&mut bytes, Opcode::Pong, 3, b"abcdef");
        bytes.truncate(bytes.len() - 2);
        let mut rd = &bytes[..];
        match FrameReader::new(4096).next(&mut rd).await {
            Err(ClientError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        let mut empty: &[u8] = &[];
        assert!(FrameReader::new(4096).next(&mut empty).await.unwrap().is_none());
    }

    /// Hands out at most `per_read` bytes a call, so frames arrive split
    /// anywhere.
    struct Trickle<'a> {
        data: &'a [u8],
        per_read: usize,
    }

    impl AsyncRead for Trickle<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let n = self.per_read.min(buf.remaining()).min(self.data.len());
            buf.put_slice(&self.data[..n]);
            self.data = &self.data[n..];
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn frame_reader_returns_every_frame_intact_and_reuses_large_frames_buffers() {
        // Small and large frames interleaved, each body a pattern of its own id.
        let sizes = [0usize, 10, 5000, 3, 70_000, 4096 - HEADER_BYTES, 4097 - HEADER_BYTES, 200_000, 1, 9000];
        let body = |id: u64, len: usize| (0..len).map(|i| (i as u64 * 7 + id) as u8).collect::<Vec<u8>>();
        let mut bytes = Vec::new();
        for round in 0..3u64 {
            for (i, &len) in sizes.iter().enumerate() {
                let id = round * 100 + i as u64 + 1;
                encode_raw(&mut bytes, Opcode::StatsOk, id, &body(id, len));
            }
        }
        for per_read in [1 << 20, 65_536, 4096, 777] {
            let mut rd = Trickle { data: &bytes, per_read };
            let mut frames = FrameReader::new(1 << 20);
            let mut held = Vec::new();
            for round in 0..3u64 {
                for (i, &len) in sizes.iter().enumerate() {
                    let id = round * 100 + i as u64 + 1;
                    let (h, f) = frames.next(&mut rd).await.unwrap().expect("a frame");
                    assert_eq!(h.request_id, id, "per_read {per_read}");
                    assert_eq!(&f[HEADER_BYTES..], &body(id, len)[..], "frame {id}, per_read {per_read}");
                    // Hold a few frames past the next reads: a buffer on loan is never reused.
                    held.push(f);
                    if held.len() > 3 {
                        held.remove(0);
                    }
                }
            }
            assert!(frames.next(&mut rd).await.unwrap().is_none());
            drop(held);
            // Every large frame's buffer came back, up to the number kept.
            assert_eq!(frames.spares.0.lock().len(), FRAME_BUFS_KEPT, "per_read {per_read}");
            assert!(frames.spares.0.lock().iter().all(|b| b.capacity() <= 1 << 20));
        }
    }

    #[tokio::test]
    async fn frame_reader_lends_the_same_buffer_again_once_its_frame_is_dropped() {
        let mut bytes = Vec::new();
        for id in 1..=4 {
            encode_raw(&mut bytes, Opcode::StatsOk, id, &vec![id as u8; 50_000]);
        }
        let mut rd = &bytes[..];
        let mut frames = FrameReader::new(1 << 20);
        let mut seen = std::collections::HashSet::new();
        for _ in 1..=4 {
            let (_, f) = frames.next(&mut rd).await.unwrap().unwrap();
            seen.insert(f.as_ptr() as usize);
            drop(f);
            assert_eq!(frames.spares.0.lock().len(), 1, "the frame's buffer is back");
        }
        // One answer out at a time: two buffers take turns (the one read into, the one lent).
        assert!(seen.len() <= 2, "{} distinct buffers for 4 frames", seen.len());
    }

    /// Counts write calls, to tell one coalesced write from many small ones.
    #[derive(Default)]
    struct CountingSink {
        writes: usize,
        bytes: Vec<u8>,
    }

    impl AsyncWrite for CountingSink {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn writer_coalesces_queued_frames() {
        let (tx, mut rx) = mpsc::channel(8);
        for i in 0..5u8 {
            tx.send(vec![i; 10]).await.unwrap();
        }
        let first = rx.recv().await.unwrap();
        let mut sink = CountingSink::default();
        let mut out = Vec::new();
        write_coalesced(&mut sink, first, &mut rx, &mut out).await.unwrap();
        assert_eq!(sink.writes, 1, "all queued frames went out in one write");
        let want: Vec<u8> = (0..5u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(sink.bytes, want, "in queue order");
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test]
    async fn writer_sends_large_frames_on_their_own() {
        let (tx, mut rx) = mpsc::channel(8);
        tx.send(vec![1; COALESCE_BYTES]).await.unwrap();
        tx.send(vec![2; 10]).await.unwrap();
        tx.send(vec![3; COALESCE_BYTES - 5]).await.unwrap();
        let first = vec![0; 10];
        let mut sink = CountingSink::default();
        let mut out = Vec::new();
        write_coalesced(&mut sink, first, &mut rx, &mut out).await.unwrap();
        // [0;10] flushed before the big frame, the big frame alone, then [2;10] and [3; ..]
        // do not fit one buffer together.
        assert_eq!(sink.writes, 4);
        assert_eq!(sink.bytes.len(), 10 + COALESCE_BYTES + 10 + COALESCE_BYTES - 5);
        assert_eq!(&sink.bytes[..10], &[0; 10]);
        assert_eq!(sink.bytes[10], 1);
        assert_eq!(sink.bytes[10 + COALESCE_BYTES], 2);
    }
}
