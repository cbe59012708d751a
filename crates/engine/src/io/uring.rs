//! The io_uring path: a pool of rings, each used by one caller at a time.
//!
//! A caller takes an idle ring (or makes one), pushes its round of operations, and waits on
//! that ring until every one has completed; then it gives the ring back. Submission and
//! completion are one function on one thread: no completion thread to wake (a wake-up costs
//! tens of microseconds on a virtual CPU), no lock while the I/O runs. Rings are made on
//! demand, so there are as many as callers ever ran at once — bounded by the engine's
//! `max_in_flight`, since every caller holding a ring holds at least one of its slots.
//!
//! Soundness: the operations borrow their buffers from the caller for the call, and the call
//! returns only when the kernel has completed every operation it consumed. Operations pushed
//! but never consumed (a submission that failed) die with their ring, which is then dropped,
//! never given back.

use std::io;
use std::sync::atomic::Ordering;

use io_uring::{opcode, squeue, types, IoUring, Probe};
use parking_lot::Mutex;

use super::counters::IoCounters;
use super::{sync, Meanwhile, Op, MAX_OP_BYTES};

/// Consecutive failed waits for operations already in the kernel before giving up on the
/// process (their buffers cannot be freed while the kernel may still write to them).
const MAX_WAIT_FAILURES: u32 = 10_000;

pub(super) struct RingPool {
    depth: u32,
    idle: Mutex<Vec<IoUring>>,
}

impl RingPool {
    pub(super) fn new(depth: u32) -> RingPool {
        RingPool { depth, idle: Mutex::new(Vec::new()) }
    }

    /// A ring of `depth` entries that can read, write and sync, or why not.
    fn make(&self) -> io::Result<IoUring> {
        let ring = IoUring::builder().setup_clamp().build(self.depth)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in
            [(opcode::Read::CODE, "read"), (opcode::Write::CODE, "write"), (opcode::Fsync::CODE, "fsync")]
        {
            if !probe.is_supported(code) {
                return Err(io::Error::new(io::ErrorKind::Unsupported, format!("the kernel's io_uring lacks {name}")));
            }
        }
        if (ring.params().sq_entries() as usize) < self.depth as usize {
            return Err(io::Error::other(format!(
                "a ring of {} entries was asked, {} made",
                self.depth,
                ring.params().sq_entries()
            )));
        }
        Ok(ring)
    }

    fn take(&self, c: &IoCounters, n: u32) -> Option<IoUring> {
        if c.uring_unavailable.load(Ordering::Relaxed) {
            c.fallback_no_uring.hit_n(u64::from(n), unavailable_note);
            return None;
        }
        if let Some(r) = self.idle.lock().pop() {
            return Some(r);
        }
        match self.make() {
            Ok(r) => {
                c.rings.fetch_add(1, Ordering::Relaxed);
                Some(r)
            }
            Err(e) => {
                // No ring ever: io_uring is not there (ENOSYS), forbidden (EPERM: the
                // io_uring_disabled sysctl, a seccomp filter) or lacking. One more ring
                // failing (memory) costs only this call.
                if c.rings.load(Ordering::Relaxed) == 0 {
                    c.uring_unavailable.store(true, Ordering::Relaxed);
                }
                c.fallback_no_uring.hit_n(u64::from(n), || {
                    format!("no io_uring ring could be made ({e}); synchronous system calls instead")
                });
                None
            }
        }
    }

    /// Run `ops` on a ring, filling `out`; false if no ring could be had (the caller runs
    /// them synchronously; counted here). At most `depth` are in the kernel at once: a batch
    /// larger than that is a sliding window — each completion makes room for the next
    /// operation, so the device's queue stays full instead of draining between rounds.
    /// `meanwhile` runs once the first operations are submitted, before the wait for them; a
    /// panic in it is held until every operation the kernel took has completed.
    pub(super) fn run(
        &self,
        ops: &mut [Op<'_>],
        out: &mut [Option<io::Result<usize>>],
        c: &IoCounters,
        meanwhile: &mut Meanwhile<'_>,
    ) -> bool {
        let n = ops.len();
        let Some(mut ring) = self.take(c, n as u32) else { return false };
        let pushed = push(&mut ring, ops, out, 0, self.depth as usize);
        let mut panicked = None;
        if meanwhile.pending() {
            // Submitted without waiting; a failed submission is met again by the wait below.
            let _ = ring.submit();
            // The buffers stay borrowed by the kernel until the wait below: an unwind now
            // would free them under it.
            panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| meanwhile.run())).err();
        }
        let ran = self.finish(ring, pushed, ops, out, c);
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
        ran
    }

    /// Wait for the operations of `ops` on `ring` (the first `pushed` of them already
    /// pushed), pushing the rest as completions make room, filling `out`; the ring goes back
    /// to the pool (or, after a failed submission, the rest runs synchronously).
    fn finish(
        &self,
        mut ring: IoUring,
        mut pushed: usize,
        ops: &mut [Op<'_>],
        out: &mut [Option<io::Result<usize>>],
        c: &IoCounters,
    ) -> bool {
        let n = ops.len();
        let mut done = 0;
        let mut failures = 0;
        while done < n {
            // With operations still to push, wake for the first completion (room for the
            // next); with all of them pushed, for the last.
            let want = if pushed < n { 1 } else { pushed - done };
            match ring.submit_and_wait(want) {
                Ok(_) => failures = 0,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => {
                    done += reap(&mut ring, out);
                    let unconsumed = ring.submission().len();
                    if pushed - unconsumed == done {
                        // Nothing of ours in the kernel: drop the ring (with what it never
                        // consumed) and finish synchronously, with those never pushed.
                        drop(ring);
                        c.fallback_no_uring.hit_n((n - done) as u64, || {
                            format!("an io_uring submission failed ({e}); synchronous system calls for it")
                        });
                        for (op, r) in ops.iter_mut().zip(out.iter_mut()).filter(|(_, r)| r.is_none()) {
                            *r = Some(sync::run(op));
                        }
                        c.ops_uring.fetch_add(done as u64, Ordering::Relaxed);
                        c.ops_sync.fetch_add((n - done) as u64, Ordering::Relaxed);
                        return true;
                    }
                    failures += 1;
                    if failures >= MAX_WAIT_FAILURES {
                        tracing::error!("io_uring: cannot wait for operations in the kernel ({e}); aborting");
                        std::process::abort();
                    }
                }
            }
            done += reap(&mut ring, out);
            if pushed < n {
                let room = self.depth as usize - (pushed - done);
                pushed = push(&mut ring, ops, out, pushed, room);
            }
        }
        c.ops_uring.fetch_add(n as u64, Ordering::Relaxed);
        self.idle.lock().push(ring);
        true
    }
}

/// Push `ops[from..]`, at most `room` of them, on `ring`'s submission queue (which has room
/// for them: the caller keeps at most `depth` operations unfinished); returns the index after
/// the last pushed.
fn push(
    ring: &mut IoUring,
    ops: &mut [Op<'_>],
    out: &mut [Option<io::Result<usize>>],
    from: usize,
    room: usize,
) -> usize {
    let to = ops.len().min(from + room);
    let mut sq = ring.submission();
    for i in from..to {
        let e = entry(&mut ops[i], &mut out[i]).user_data(i as u64);
        // SAFETY: the entry's buffer and descriptor are borrowed for this call, which
        // returns only after the kernel completed every entry it consumed.
        unsafe { sq.push(&e) }.expect("no more unfinished operations than the ring has entries");
    }
    to
}

fn unavailable_note() -> String {
    "io_uring is unavailable; synchronous system calls instead".into()
}

/// Move every completion into `out`; returns how many there were.
fn reap(ring: &mut IoUring, out: &mut [Option<io::Result<usize>>]) -> usize {
    let mut k = 0;
    for cqe in ring.completion() {
        let i = cqe.user_data() as usize;
        let res = cqe.result();
        // An operation answered before submission (an offset off the range) keeps that answer.
        if out[i].is_none() {
            out[i] = Some(if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) });
        }
        k += 1;
    }
    k
}

/// The ring entry for `op`. An offset io_uring would misread (above `i64::MAX`; all ones
/// means "the file position") is answered `EFBIG` here and sent as a no-op.
fn entry(op: &mut Op<'_>, answer: &mut Option<io::Result<usize>>) -> squeue::Entry {
    let fd = types::Fd(op.fd());
    match op {
        Op::Read { offset, .. } | Op::Write { offset, .. } if sync::off(*offset).is_err() => {
            *answer = Some(Err(io::Error::from_raw_os_error(libc::EFBIG)));
            opcode::Nop::new().build()
        }
        Op::Read { offset, buf, .. } => {
            opcode::Read::new(fd, buf.as_mut_ptr().cast(), buf.len().min(MAX_OP_BYTES) as u32).offset(*offset).build()
        }
        Op::Write { offset, data, .. } => {
            opcode::Write::new(fd, data.as_ptr(), data.len().min(MAX_OP_BYTES) as u32).offset(*offset).build()
        }
        Op::Fsync { datasync, .. } => {
            let flags = if *datasync { types::FsyncFlags::DATASYNC } else { types::FsyncFlags::empty() };
            opcode::Fsync::new(fd).flags(flags).build()
        }
    }
}
