//! [`IoEngine`]: the backing store's I/O engine — every read, write and sync of a backing
//! file goes through one, and so will the tiers that are still to come (the write-back tier's
//! destaging, migration of hot files): this is their seam to the disk.
//!
//! What it owns:
//! - **Its queue.** With `io_engine = "uring"`, a pool of io_uring rings (`uring.rs`): a
//!   caller takes a ring, submits its operations, waits for their completions on that same
//!   ring and gives it back. Submission and completion happen in one place, on the caller's
//!   thread: no completion thread, so a lone request pays no extra wake-up, and no lock is
//!   held while the I/O runs (the pool's mutex covers only taking and returning a ring), so
//!   requests on different ranges of one file proceed in parallel, as many as there are
//!   callers. With `io_engine = "sync"` (or when io_uring is unavailable), the same
//!   operations are plain `pread`/`pwrite`/`fsync` calls (`sync.rs`).
//! - **A bound on what is in flight.** One call has at most `queue_depth` operations in the
//!   kernel at once (a larger batch is a sliding window: each completion lets the next
//!   operation in, so the device's queue does not drain between rounds), and at most
//!   `max_in_flight` operations are in flight across the engine; a caller beyond that waits
//!   for room.
//! - **Buffers with an owner.** An [`Op`] borrows its caller's buffer for exactly the call:
//!   every call returns only once the kernel has finished with every operation it submitted
//!   (a submission failure with operations still in the kernel waits for them first).
//! - **Its fallbacks, counted and logged once** ([`IoCounters`], shown by
//!   `farcache stats MOUNTPOINT` under `backing.io`): io_uring unavailable → the synchronous
//!   path; a short transfer → the rest resubmitted; and, counted here by the backing file's
//!   read and write paths, an unaligned request → a bounce buffer (reads) or a buffered write,
//!   and a file system refusing `O_DIRECT` → buffered I/O. Paper 002's bug was an engine that
//!   fell back silently; here every fallback is a counter and one log line.

mod counters;
mod sync;
mod uring;

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

pub use counters::{IoCounters, IoCountersSnapshot};

/// Which engine does backing I/O (`[mount] io_engine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngineKind {
    /// io_uring, where the kernel offers it (else the synchronous path, counted).
    #[default]
    Uring,
    /// One blocking system call per operation on the caller's thread.
    Sync,
}

impl std::fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoEngineKind::Uring => "uring",
            IoEngineKind::Sync => "sync",
        })
    }
}

/// How an [`IoEngine`] is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoOptions {
    pub kind: IoEngineKind,
    /// Most operations one call has in flight at once (each ring's size).
    pub queue_depth: u32,
    /// Most operations in flight across the engine at once.
    pub max_in_flight: u32,
}

/// Largest `queue_depth` (io_uring's own limit is 32768 entries; this keeps a ring small).
pub const MAX_QUEUE_DEPTH: u32 = 4096;
/// Largest `max_in_flight`.
pub const MAX_IN_FLIGHT: u32 = 65_536;
/// The most bytes one operation moves; a longer transfer is split by the callers' loops (the
/// kernel caps one transfer near 2 GiB anyway).
pub const MAX_OP_BYTES: usize = 1 << 30;
const _: () = assert!(MAX_QUEUE_DEPTH <= MAX_IN_FLIGHT);
const _: () = assert!(MAX_OP_BYTES <= u32::MAX as usize);

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions { kind: IoEngineKind::Uring, queue_depth: 32, max_in_flight: 256 }
    }
}

impl IoOptions {
    /// `None` if the options are consistent, else what is wrong (for the config's message).
    pub fn problem(&self) -> Option<String> {
        if !(1..=MAX_QUEUE_DEPTH).contains(&self.queue_depth) {
            return Some(format!("io_queue_depth {} is out of range 1 to {MAX_QUEUE_DEPTH}", self.queue_depth));
        }
        if self.max_in_flight < self.queue_depth || self.max_in_flight > MAX_IN_FLIGHT {
            return Some(format!(
                "io_max_in_flight {} must be at least io_queue_depth ({}) and at most {MAX_IN_FLIGHT}",
                self.max_in_flight, self.queue_depth
            ));
        }
        None
    }
}

/// One operation on an open descriptor. The buffers are the caller's, borrowed for the call.
#[derive(Debug)]
pub enum Op<'a> {
    /// Read up to `buf.len()` bytes at `offset` (fewer at end of file, or a short transfer).
    /// The buffer may be uninitialised: the first `n` bytes are once the read returns `n`.
    Read { fd: BorrowedFd<'a>, offset: u64, buf: &'a mut [MaybeUninit<u8>] },
    /// Write up to `data.len()` bytes at `offset`.
    Write { fd: BorrowedFd<'a>, offset: u64, data: &'a [u8] },
    /// `fsync(2)`, or `fdatasync(2)` with `datasync`.
    Fsync { fd: BorrowedFd<'a>, datasync: bool },
}

impl Op<'_> {
    fn fd(&self) -> i32 {
        match self {
            Op::Read { fd, .. } | Op::Write { fd, .. } | Op::Fsync { fd, .. } => fd.as_raw_fd(),
        }
    }
}

/// The backing store's I/O engine (module docs). Shared by every thread doing backing I/O.
pub struct IoEngine {
    opts: IoOptions,
    rings: Option<uring::RingPool>,
    counters: IoCounters,
    room: Room,
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine").field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl Default for IoEngine {
    fn default() -> Self {
        IoEngine::new(IoOptions::default())
    }
}

impl IoEngine {
    /// An engine with `opts` (validated by the caller; out-of-range values are clamped). The
    /// first io_uring ring is made on first use: a kernel without io_uring costs nothing here.
    pub fn new(opts: IoOptions) -> IoEngine {
        let queue_depth = opts.queue_depth.clamp(1, MAX_QUEUE_DEPTH);
        let opts =
            IoOptions { queue_depth, max_in_flight: opts.max_in_flight.clamp(queue_depth, MAX_IN_FLIGHT), ..opts };
        let counters = IoCounters::new(opts.kind);
        let rings = (opts.kind == IoEngineKind::Uring).then(|| uring::RingPool::new(opts.queue_depth));
        IoEngine { opts, rings, counters, room: Room::new(opts.max_in_flight) }
    }

    pub fn options(&self) -> &IoOptions {
        &self.opts
    }

    pub fn counters(&self) -> &IoCounters {
        &self.counters
    }

    /// Run every operation of `ops`, at most `queue_depth` at once (each completion making
    /// room for the next operation), and return each one's result in order: the bytes moved
    /// (0 for a sync) or the OS error. Returns only once the kernel is done with every buffer.
    pub fn run(&self, ops: &mut [Op<'_>]) -> Vec<io::Result<usize>> {
        let mut out: Vec<Option<io::Result<usize>>> = (0..ops.len()).map(|_| None).collect();
        self.run_round(ops, &mut out, &mut Meanwhile::none());
        out.into_iter().map(|r| r.expect("every operation answered")).collect()
    }

    /// One operation (no allocation).
    pub fn run_one(&self, op: Op<'_>) -> io::Result<usize> {
        self.run_one_while(op, &mut Meanwhile::none())
    }

    /// [`IoEngine::run_one`], running `meanwhile` (if it has not run yet) while the operation
    /// is in flight: on a ring, after the submission and before the wait for its completion;
    /// on the synchronous path, before the call (there is nothing to overlap).
    fn run_one_while(&self, op: Op<'_>, meanwhile: &mut Meanwhile<'_>) -> io::Result<usize> {
        let mut ops = [op];
        let mut res = [None];
        self.run_round(&mut ops, &mut res, meanwhile);
        res[0].take().expect("the operation answered")
    }

    /// Read `buf.len()` bytes at `offset`, or up to end of file, and return the bytes read
    /// (which are then initialised).
    /// A short transfer is resubmitted for the rest — unless it is empty or ends off `align`
    /// (the file ends there: an `O_DIRECT` read cannot go on off the alignment). A
    /// resubmission that found more is counted (`short_retries`); one that found the end of
    /// the file is not (that is how a buffered read learns where a file ends).
    pub fn read_full(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        buf: &mut [MaybeUninit<u8>],
        align: u64,
    ) -> io::Result<usize> {
        self.read_full_while(fd, offset, buf, align, &mut Meanwhile::none())
    }

    /// [`IoEngine::read_full`], running `meanwhile` once while the first read is in flight
    /// ([`Meanwhile`]).
    pub fn read_full_while(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        buf: &mut [MaybeUninit<u8>],
        align: u64,
        meanwhile: &mut Meanwhile<'_>,
    ) -> io::Result<usize> {
        let mut got = 0;
        let mut was_short = false;
        while got < buf.len() {
            let end = buf.len().min(got + MAX_OP_BYTES);
            let op = Op::Read { fd, offset: offset + got as u64, buf: &mut buf[got..end] };
            let n = self.run_one_while(op, meanwhile)?;
            if n > 0 && was_short {
                self.counters.short_retries.hit(|| "a short transfer was resubmitted for the rest".into());
            }
            was_short = got + n < end;
            got += n;
            if n == 0 || !(n as u64).is_multiple_of(align.max(1)) {
                break;
            }
        }
        Ok(got)
    }

    /// Write all of `data` at `offset`, resubmitting after a short transfer (counted). A
    /// transfer of 0 bytes is an error (`EIO`): the device took nothing and said nothing.
    pub fn write_all(&self, fd: BorrowedFd<'_>, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut put = 0;
        while put < data.len() {
            let end = data.len().min(put + MAX_OP_BYTES);
            let n = self.run_one(Op::Write { fd, offset: offset + put as u64, data: &data[put..end] })?;
            if n == 0 {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            put += n;
            if put < end {
                self.counters.short_retries.hit(|| "a short transfer was resubmitted for the rest".into());
            }
        }
        Ok(())
    }

    /// `fsync(2)` or (`datasync`) `fdatasync(2)`, as a ring operation where io_uring runs.
    pub fn fsync(&self, fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
        self.run_one(Op::Fsync { fd, datasync }).map(drop)
    }

    /// Room for a window of up to `queue_depth` operations first, then a ring (a larger
    /// batch slides through the window) or the sync path.
    fn run_round(&self, ops: &mut [Op<'_>], out: &mut [Option<io::Result<usize>>], meanwhile: &mut Meanwhile<'_>) {
        debug_assert!(ops.len() == out.len());
        if ops.is_empty() {
            meanwhile.run();
            return;
        }
        let n = ops.len() as u32;
        let window = n.min(self.opts.queue_depth);
        if self.room.take(window) {
            self.counters.waits_for_room.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.start(window);
        let (writes, syncs) = ops.iter().fold((0, 0), |(w, f), op| match op {
            Op::Write { .. } => (w + 1, f),
            Op::Fsync { .. } => (w, f + 1),
            Op::Read { .. } => (w, f),
        });
        // Only when there are some: a read costs no write to these shared counters.
        if writes > 0 {
            self.counters.write_ops.fetch_add(writes, Ordering::Relaxed);
        }
        if syncs > 0 {
            self.counters.sync_ops.fetch_add(syncs, Ordering::Relaxed);
        }
        let ran = match &self.rings {
            Some(pool) => pool.run(ops, out, &self.counters, meanwhile),
            None => false,
        };
        if !ran {
            meanwhile.run();
            for (op, r) in ops.iter_mut().zip(out.iter_mut()) {
                *r = Some(sync::run(op));
            }
            self.counters.ops_sync.fetch_add(u64::from(n), Ordering::Relaxed);
        }
        self.counters.finish(window);
        self.room.give(window);
    }
}

/// Work for the caller's thread to do while its own operation is in the kernel (a lender
/// fetch beside the disk read of one FUSE request: paper 002's "one event loop for disk and
/// lenders", without a second thread). Runs at most once; [`Meanwhile::run`] runs it now if it
/// has not run, so a caller may call it after the I/O to be sure it ran (an error, or an empty
/// operation, returns before any submission).
pub struct Meanwhile<'a>(Option<&'a mut dyn FnMut()>);

impl<'a> Meanwhile<'a> {
    pub fn new(f: &'a mut dyn FnMut()) -> Meanwhile<'a> {
        Meanwhile(Some(f))
    }

    pub fn none() -> Meanwhile<'static> {
        Meanwhile(None)
    }

    /// Whether there is work that has not run yet.
    pub fn pending(&self) -> bool {
        self.0.is_some()
    }

    /// Run it, if it has not run yet.
    pub fn run(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A counting semaphore over operations in flight: an atomic on the way through, a mutex
/// and condition variable only when the engine is full.
struct Room {
    free: AtomicU32,
    waiters: AtomicU32,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Room {
    fn new(max: u32) -> Room {
        Room { free: AtomicU32::new(max), waiters: AtomicU32::new(0), lock: Mutex::new(()), freed: Condvar::new() }
    }

    fn try_take(&self, n: u32) -> bool {
        let mut f = self.free.load(Ordering::SeqCst);
        loop {
            if f < n {
                return false;
            }
            match self.free.compare_exchange_weak(f, f - n, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => f = now,
            }
        }
    }

    /// Take `n` slots, waiting while there are fewer free; true if it had to wait.
    fn take(&self, n: u32) -> bool {
        if self.try_take(n) {
            return false;
        }
        let mut g = self.lock.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while !self.try_take(n) {
            self.freed.wait(&mut g);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        true
    }

    fn give(&self, n: u32) {
        self.free.fetch_add(n, Ordering::SeqCst);
        // A waiter registers under the lock before its last try: either it sees these slots,
        // or we see it and wake it once it waits.
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests;
