//! farcache patch: FUSE-over-io_uring, a second way for a session to receive requests and
//! send replies (Linux 6.14+, protocol 7.42; switched by
//! `/sys/module/fuse/parameters/enable_uring`).
//!
//! How the kernel side works (fs/fuse/dev_uring.c), and what this file relies on:
//! - The daemon asks for it by setting `FUSE_OVER_IO_URING` (flags2 bit 9, bit 41 of the
//!   64-bit flags) in its INIT reply, which it may only do when INIT offered it (the kernel
//!   offers it only while `enable_uring` is on). From then on the kernel holds back every new
//!   request (`fuse_block_alloc`) until each of its queues — one per *possible* CPU — has at
//!   least one registered entry; only then are requests routed to the rings. A failed
//!   `REGISTER` clears the connection's io_uring flag and releases the held requests to
//!   `/dev/fuse` instead.
//! - Each entry is one `IORING_OP_URING_CMD` on the `/dev/fuse` descriptor, 128-byte SQE,
//!   `cmd_op` = `FUSE_IO_URING_CMD_REGISTER`, the 80-byte command area holding
//!   `struct fuse_uring_cmd_req { flags, commit_id, qid }`, `addr`/`len` an array of two
//!   iovecs: the 288-byte `struct fuse_uring_req_header` and a payload buffer of at least
//!   `max(8 KiB, max_write, max_pages * page)`. The command completes when a request is
//!   assigned to the entry: `fuse_in_header` in `in_out`, the op's fixed argument in `op_in`,
//!   the rest in the payload, `ent_in_out.payload_sz` its length.
//! - The reply goes back in the same buffers (`fuse_out_header` in `in_out`, the body in the
//!   payload, `payload_sz`) with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, whose `commit_id` is
//!   the request's `unique`; it both commits and waits for the next request — there is no
//!   commit without a fetch.
//! - The queue is chosen by the CPU of the task that makes the request. FORGETs, INTERRUPTs
//!   and notifications (and INIT) never go over the rings: `/dev/fuse` read loops stay.
//! - When the ring's owner dies (or closes the ring), entries waiting for a request are
//!   cancelled (`fuse_uring_cancel`) and never used again; a request already handed to an
//!   entry that was never committed is lost until the connection is torn down (FUSE_NOTIFY_
//!   RESEND only walks the `/dev/fuse` processing queues). New `REGISTER`s are accepted on a
//!   live connection, but requests queued while no entry was free are only picked up by a
//!   later commit.
//!
//! Here, one thread per entry, each with its own small io_uring: a thread waits for its
//! entry's request, dispatches it to the session's one `Filesystem` exactly as a read loop
//! does (the request bytes rebuilt in the `/dev/fuse` layout), and commits the reply.
//! `queue_depth` threads per queue serve as many requests at once as the read loops would.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;
use parking_lot::Condvar;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::ReplyEmpty;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const IN_OUT_SZ: usize = 128;
const OP_IN_SZ: usize = 128;
const IN_HEADER_SZ: usize = 40;
const OUT_HEADER_SZ: usize = 16;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The kernel's smallest payload buffer (`FUSE_MIN_READ_BUFFER`).
const MIN_PAYLOAD: usize = 8192;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`.
#[repr(C)]
struct ReqHeader {
    in_out: [u8; IN_OUT_SZ],
    op_in: [u8; OP_IN_SZ],
    ent: EntInOut,
}

/// `struct fuse_uring_cmd_req`, at the start of the SQE's 80-byte command area.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

const _: () = assert!(std::mem::size_of::<EntInOut>() == 32);
const _: () = assert!(std::mem::size_of::<ReqHeader>() == 288);
const _: () = assert!(std::mem::size_of::<CmdReq>() == 24);
const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

/// Settings of the ring transport (farcache patch). Part of [`crate::Config`]: when set, the
/// session asks for FUSE-over-io_uring in its INIT reply if the kernel offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Entries (and serving threads) per queue; there is one queue per possible CPU.
    pub queue_depth: usize,
}

/// Most entries per queue this transport accepts (each holds a payload buffer of max_write).
pub const MAX_QUEUE_DEPTH: usize = 256;

/// What the ring transport did, shared with the caller (farcache patch).
#[derive(Debug, Default)]
pub struct UringStats {
    /// INIT offered FUSE_OVER_IO_URING (the kernel parameter was on).
    pub offered: AtomicBool,
    /// The INIT reply asked for it: requests are held until every queue is registered.
    pub negotiated: AtomicBool,
    /// Every entry of every queue was registered: requests go over the rings.
    pub active: AtomicBool,
    /// Queues registered (every possible CPU's, once active).
    pub queues: AtomicU64,
    /// Entries registered, over all queues.
    pub entries: AtomicU64,
    /// Requests received and answered over the rings.
    pub requests: AtomicU64,
    /// Commits the kernel refused (the request got an error instead of the reply).
    pub commit_errors: AtomicU64,
    /// Why registration failed, if it did.
    pub error: Mutex<Option<String>>,
}

/// The number of ring queues the kernel makes: one per possible CPU, indexed by CPU number.
pub fn possible_cpus() -> usize {
    // "0-1", "0", "0-3,5"...: the kernel indexes queues by CPU number, so the highest + 1.
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    s.trim()
        .split([',', '-'])
        .filter_map(|t| t.parse::<usize>().ok())
        .max()
        .map(|m| m + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The payload buffer the kernel requires (`fuse_uring_create`).
pub(crate) fn payload_size(max_write: u32, max_pages: u16) -> usize {
    let page = page_size::get();
    MIN_PAYLOAD.max(max_write as usize).max(max_pages as usize * page)
}

/// One entry's reply slot: where a reply is written, from whichever thread answers.
#[derive(Debug)]
pub(crate) struct RingSlot {
    state: Mutex<SlotState>,
    answered: Condvar,
    /// The payload buffer registered with the kernel; written by a reply only under
    /// `state`'s lock and only while the entry is out of the kernel's hands.
    payload: *mut u8,
    payload_len: usize,
}

// SAFETY: `payload` points into a buffer owned by the entry's thread for its whole life and
// is only written under `state`'s lock, while the kernel does not touch it.
unsafe impl Send for RingSlot {}
// SAFETY: as above.
unsafe impl Sync for RingSlot {}

#[derive(Debug, Default)]
struct SlotState {
    replied: bool,
    out_header: [u8; OUT_HEADER_SZ],
    payload_sz: usize,
}

/// Sends a reply into a ring entry (a `ReplySender` variant).
#[derive(Debug, Clone)]
pub(crate) struct RingReplySender {
    slot: Arc<RingSlot>,
    /// The connection, for what is never a reply (backing ids for passthrough).
    pub(crate) ch: ChannelSender,
}

impl RingReplySender {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|b| b.len()).sum();
        let mut st = self.slot.state.lock();
        if st.replied {
            return Err(io::Error::other("a second reply to one ring request"));
        }
        let fits = total >= OUT_HEADER_SZ && total - OUT_HEADER_SZ <= self.slot.payload_len;
        let mut at = 0usize;
        if fits {
            for b in data {
                let mut src: &[u8] = b;
                if at < OUT_HEADER_SZ {
                    let n = src.len().min(OUT_HEADER_SZ - at);
                    st.out_header[at..at + n].copy_from_slice(&src[..n]);
                    at += n;
                    src = &src[n..];
                }
                if !src.is_empty() {
                    let off = at - OUT_HEADER_SZ;
                    // SAFETY: off + len <= payload_len (checked above); the kernel does not
                    // touch the buffer until the commit this reply precedes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), self.slot.payload.add(off), src.len());
                    }
                    at += src.len();
                }
            }
            st.payload_sz = total - OUT_HEADER_SZ;
        } else {
            // Answer EIO rather than leave the entry (and the application) waiting.
            let mut h = [0u8; OUT_HEADER_SZ];
            let first: Vec<u8> = data.iter().flat_map(|b| b.iter().copied()).take(16).collect();
            h[..first.len()].copy_from_slice(&first);
            h[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
            h[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            st.out_header = h;
            st.payload_sz = 0;
        }
        st.replied = true;
        drop(st);
        self.slot.answered.notify_all();
        if fits {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "reply of {total} bytes does not fit the ring payload of {}",
                self.slot.payload_len
            )))
        }
    }
}

/// One entry: its header and payload buffers (registered with the kernel), its own ring.
struct Entry {
    qid: u16,
    header: Box<ReqHeader>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    slot: Arc<RingSlot>,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The request rebuilt in the `/dev/fuse` layout.
    req: Vec<u8>,
}

impl Entry {
    fn new(qid: u16, payload_len: usize) -> io::Result<Entry> {
        let mut header: Box<ReqHeader> = Box::new(ReqHeader {
            in_out: [0; IN_OUT_SZ],
            op_in: [0; OP_IN_SZ],
            ent: EntInOut::default(),
        });
        let mut payload = vec![0u8; payload_len].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: (&mut *header as *mut ReqHeader).cast(),
                iov_len: std::mem::size_of::<ReqHeader>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload_len,
            },
        ]);
        let slot = Arc::new(RingSlot {
            state: Mutex::new(SlotState::default()),
            answered: Condvar::new(),
            payload: payload.as_mut_ptr(),
            payload_len,
        });
        // The ring is this thread's alone: the kernel's task work for it (a request being
        // copied in) then runs only when the thread asks for completions, not as a signal-
        // like interruption (SINGLE_ISSUER + DEFER_TASKRUN, Linux 6.1+); plain if refused.
        let ring = match std::env::var_os("FUSER_URING_PLAIN") {
            Some(_) => IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4)?,
            None => IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .setup_single_issuer()
                .setup_defer_taskrun()
                .build(4)
                .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4))?,
        };
        Ok(Entry {
            qid,
            header,
            payload,
            iov,
            slot,
            ring,
            req: Vec::with_capacity(IN_HEADER_SZ + OP_IN_SZ + payload_len),
        })
    }

    /// Submit a REGISTER or a COMMIT_AND_FETCH for this entry.
    fn submit(&mut self, fd: i32, cmd_op: u32, commit_id: u64) -> io::Result<()> {
        let req = CmdReq {
            commit_id,
            qid: self.qid,
            ..CmdReq::default()
        };
        let mut cmd = [0u8; 80];
        // SAFETY: CmdReq is plain old data of 24 bytes.
        let bytes: [u8; 24] = unsafe { std::mem::transmute(req) };
        cmd[..24].copy_from_slice(&bytes);
        let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd_op)
            .cmd(cmd)
            .addr(Some(self.iov.as_ptr() as u64))
            .build()
            .user_data(u64::from(cmd_op));
        // The io-uring crate's UringCmd80 has no `len`; the kernel wants the iovec count
        // there (`FUSE_URING_IOV_SEGS`). Offset 24 of `struct io_uring_sqe` is `len`.
        // SAFETY: Entry128 is repr(C), 128 bytes (asserted), a plain io_uring_sqe + 64 bytes.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        // SAFETY: as above, back to the same type.
        let sqe: squeue::Entry128 = unsafe { std::mem::transmute(raw) };
        // SAFETY: the buffers the SQE points to (iov, header, payload) live as long as self,
        // and self outlives the ring's use of them (the ring is dropped with self first).
        unsafe {
            self.ring
                .submission()
                .push(&sqe)
                .map_err(|_| io::Error::other("ring submission queue full"))?;
        }
        Ok(())
    }

    /// Submit what is queued and wait for this entry's next completion; its result.
    fn wait(&mut self) -> io::Result<i32> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            if let Some(cqe) = self.ring.completion().next() {
                return Ok(cqe.result());
            }
        }
    }

    /// Submit what is queued; the result of a completion already posted (a REGISTER that
    /// failed at once), or None (the command is waiting for a request).
    fn submit_and_peek(&mut self) -> io::Result<Option<i32>> {
        self.ring.submit()?;
        Ok(self.ring.completion().next().map(|c| c.result()))
    }

    /// Rebuild the request the kernel put in the buffers, in the `/dev/fuse` layout.
    fn rebuild(&mut self) -> Result<(), String> {
        let h = &self.header;
        let len = u32::from_ne_bytes(h.in_out[0..4].try_into().expect("4 bytes")) as usize;
        let payload_sz = h.ent.payload_sz as usize;
        if payload_sz > self.payload.len() || len < IN_HEADER_SZ + payload_sz {
            return Err(format!(
                "ring request of {len} bytes with a payload of {payload_sz}"
            ));
        }
        let op_len = len - IN_HEADER_SZ - payload_sz;
        if op_len > OP_IN_SZ {
            return Err(format!("ring request with {op_len} bytes of op header"));
        }
        self.req.clear();
        self.req.extend_from_slice(&h.in_out[..IN_HEADER_SZ]);
        self.req.extend_from_slice(&h.op_in[..op_len]);
        self.req.extend_from_slice(&self.payload[..payload_sz]);
        Ok(())
    }
}

/// A running ring transport: its threads, joined before the file system is destroyed.
pub(crate) struct Rings {
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
}

/// Register `queues` × `depth` entries on `ch`, one thread each, and serve requests on them
/// with `make_loop`'s dispatch context. Waits (at most 5 s) for every registration to be
/// accepted or refused; on any refusal the rest still run (the kernel then routes requests
/// to `/dev/fuse`), the error is recorded in `stats` and returned.
pub(crate) fn start<FS: Filesystem + 'static>(
    ch: &Channel,
    queues: usize,
    depth: usize,
    payload_len: usize,
    stats: Arc<UringStats>,
    mut make_loop: impl FnMut(String) -> SessionEventLoop<FS>,
) -> (Rings, io::Result<()>) {
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let mut threads = Vec::with_capacity(queues * depth);
    let mut spawned = 0usize;
    let mut first_err: Option<io::Error> = None;
    'outer: for qid in 0..queues {
        for i in 0..depth {
            let name = format!("fuser-ring-{qid}-{i}");
            let se = make_loop(name.clone());
            let tx = tx.clone();
            let stats = stats.clone();
            let ch = ch.clone();
            let spawned_thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve_entry(ch, qid as u16, payload_len, se, stats, tx));
            match spawned_thread {
                Ok(t) => {
                    threads.push(t);
                    spawned += 1;
                }
                Err(e) => {
                    first_err = Some(e);
                    break 'outer;
                }
            }
        }
    }
    drop(tx);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut ok = 0usize;
    for _ in 0..spawned {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
            Err(_) => {
                if first_err.is_none() {
                    first_err = Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "ring registration did not answer within 5 s",
                    ));
                }
                break;
            }
        }
    }
    stats.entries.store(ok as u64, Ordering::Relaxed);
    let result = match first_err {
        None => {
            stats.queues.store(queues as u64, Ordering::Relaxed);
            stats.active.store(true, Ordering::SeqCst);
            Ok(())
        }
        Some(e) => {
            *stats.error.lock() = Some(e.to_string());
            Err(e)
        }
    };
    (Rings { threads }, result)
}

fn serve_entry<FS: Filesystem>(
    ch: Channel,
    qid: u16,
    payload_len: usize,
    se: SessionEventLoop<FS>,
    stats: Arc<UringStats>,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let fd = ch.as_fd_raw();
    let mut ent = match Entry::new(qid, payload_len) {
        Ok(e) => e,
        Err(e) => {
            let _ = registered.send(Err(e));
            return;
        }
    };
    let first = ent
        .submit(fd, CMD_REGISTER, 0)
        .and_then(|()| ent.submit_and_peek());
    let mut pending = match first {
        Ok(None) => {
            let _ = registered.send(Ok(()));
            None
        }
        Ok(Some(res)) if res < 0 => {
            let e = io::Error::from_raw_os_error(-res);
            let _ = registered.send(Err(io::Error::new(
                e.kind(),
                format!("FUSE_IO_URING_CMD_REGISTER on queue {qid}: {e}"),
            )));
            return;
        }
        // A request arrived already.
        Ok(Some(res)) => {
            let _ = registered.send(Ok(()));
            Some(res)
        }
        Err(e) => {
            let _ = registered.send(Err(e));
            return;
        }
    };
    drop(registered);
    loop {
        let res = match pending.take() {
            Some(r) => r,
            None => match ent.wait() {
                Ok(r) => r,
                Err(e) => {
                    error!("ring queue {qid}: waiting for a request: {e}");
                    return;
                }
            },
        };
        if res < 0 {
            let e = -res;
            if e == libc::ENOTCONN || e == libc::ECONNABORTED || e == libc::ENODEV {
                debug!("ring queue {qid}: connection gone");
            } else if e == libc::ENOENT || e == libc::EINVAL {
                // The kernel refused a commit: the request it was for got an error; this
                // entry is no longer waiting for anything.
                stats.commit_errors.fetch_add(1, Ordering::Relaxed);
                warn!("ring queue {qid}: commit refused ({}): entry retired", io::Error::from_raw_os_error(e));
            } else {
                error!("ring queue {qid}: {}", io::Error::from_raw_os_error(e));
            }
            return;
        }
        let commit_id = ent.header.ent.commit_id;
        if let Err(why) = ent.rebuild() {
            error!("ring queue {qid}: {why}");
            answer_error(&ent, libc::EIO);
        } else {
            {
                let mut st = ent.slot.state.lock();
                st.replied = false;
                st.payload_sz = 0;
            }
            let sender = crate::reply::ReplySender::Ring(RingReplySender {
                slot: ent.slot.clone(),
                ch: ch.sender(),
            });
            match RequestWithSender::new(sender, &ent.req) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(&se);
                    }
                }
                None => answer_error(&ent, libc::EIO),
            }
        }
        wait_answered(&ent.slot, qid);
        let (out, n) = {
            let st = ent.slot.state.lock();
            (st.out_header, st.payload_sz)
        };
        ent.header.in_out[..OUT_HEADER_SZ].copy_from_slice(&out);
        ent.header.ent.payload_sz = n as u32;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = ent.submit(fd, CMD_COMMIT_AND_FETCH, commit_id) {
            error!("ring queue {qid}: commit: {e}");
            return;
        }
    }
}

/// An error reply for a request that could not be dispatched.
fn answer_error(ent: &Entry, errno: i32) {
    let unique = u64::from_ne_bytes(ent.header.in_out[8..16].try_into().expect("8 bytes"));
    let mut h = [0u8; OUT_HEADER_SZ];
    h[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    let mut st = ent.slot.state.lock();
    st.out_header = h;
    st.payload_sz = 0;
    st.replied = true;
}

/// Wait until the request in hand is answered (a file system may answer from another
/// thread; fuser answers EIO for a reply dropped unanswered, so it always comes).
fn wait_answered(slot: &RingSlot, qid: u16) {
    let mut st = slot.state.lock();
    let mut waited = 0u32;
    while !st.replied {
        if slot
            .answered
            .wait_for(&mut st, Duration::from_secs(10))
            .timed_out()
        {
            waited += 10;
            warn!("ring queue {qid}: a request unanswered for {waited} s");
        }
    }
}

impl Channel {
    pub(crate) fn as_fd_raw(&self) -> i32 {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}
