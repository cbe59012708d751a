//! The synchronous path: one blocking system call per operation, on the caller's thread
//! (`io_engine = "sync"`, and the fallback when io_uring is unavailable).

use std::io;

use super::{Op, MAX_OP_BYTES};

/// Run `op`; an interrupted call is repeated.
pub(super) fn run(op: &mut Op<'_>) -> io::Result<usize> {
    let fd = op.fd();
    loop {
        // SAFETY: each call gets a live descriptor (borrowed for the call) and a buffer the
        // caller owns for the call, with its true length (clamped to MAX_OP_BYTES).
        let r = unsafe {
            match op {
                Op::Read { offset, buf, .. } => {
                    let len = buf.len().min(MAX_OP_BYTES);
                    libc::pread(fd, buf.as_mut_ptr().cast(), len, off(*offset)?) as i64
                }
                Op::Write { offset, data, .. } => {
                    let len = data.len().min(MAX_OP_BYTES);
                    libc::pwrite(fd, data.as_ptr().cast(), len, off(*offset)?) as i64
                }
                Op::Fsync { datasync: true, .. } => i64::from(libc::fdatasync(fd)),
                Op::Fsync { datasync: false, .. } => i64::from(libc::fsync(fd)),
            }
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A file offset as `off_t`, or `EFBIG`.
pub(super) fn off(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))
}
