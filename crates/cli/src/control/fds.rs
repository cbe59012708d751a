//! Descriptors over a unix socket (`SCM_RIGHTS`), and line reads that never read ahead —
//! a buffered read could swallow the byte a batch of descriptors rides on, and the kernel
//! drops descriptors whose byte is read without ancillary data.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Descriptors per message (the kernel's `SCM_MAX_FD` is 253).
pub const FDS_PER_MESSAGE: usize = 250;

fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<libc::c_int>()) as u32) as usize }
}

/// Send `fds` in batches of at most [`FDS_PER_MESSAGE`], each riding on one byte.
pub fn send_fds(s: &UnixStream, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    for batch in fds.chunks(FDS_PER_MESSAGE) {
        let mut byte = [b'F'];
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        let mut cbuf = vec![0u8; cmsg_space(batch.len())];
        // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.len() as _;
        // SAFETY: the control buffer has room for one header and `batch.len()` ints.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((batch.len() * std::mem::size_of::<libc::c_int>()) as u32) as _;
            let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
            for (i, fd) in batch.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
        // SAFETY: msg is fully initialised.
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n != 1 {
            return Err(if n < 0 { io::Error::last_os_error() } else { io::Error::other("short sendmsg") });
        }
    }
    Ok(())
}

/// Receive `n` descriptors sent by [`send_fds`].
pub fn recv_fds(s: &UnixStream, n: usize) -> io::Result<Vec<OwnedFd>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(FDS_PER_MESSAGE);
        let mut byte = [0u8];
        let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
        let mut cbuf = vec![0u8; cmsg_space(FDS_PER_MESSAGE)];
        // SAFETY: as in send_fds.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.len() as _;
        // SAFETY: buffers valid for the call; MSG_CMSG_CLOEXEC marks received fds close-on-exec.
        let r = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed while sending descriptors"));
        }
        let before = out.len();
        // SAFETY: walking the control messages the kernel filled in.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                    for i in 0..bytes / std::mem::size_of::<libc::c_int>() {
                        out.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || out.len() - before != want {
            return Err(io::Error::other(format!(
                "expected {want} descriptors in one message, got {} (truncated: {})",
                out.len() - before,
                msg.msg_flags & libc::MSG_CTRUNC != 0
            )));
        }
    }
    Ok(out)
}

/// One line (without its newline), read a byte at a time, at most `max` bytes.
pub fn read_line(mut s: &UnixStream, max: usize) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut b = [0u8];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection")),
            Ok(_) if b[0] == b'\n' => return Ok(line),
            Ok(_) => {
                if line.len() >= max {
                    return Err(io::Error::other(format!("line longer than {max} bytes")));
                }
                line.push(b[0]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

pub fn write_line(mut s: &UnixStream, v: &serde_json::Value) -> io::Result<()> {
    let mut b = serde_json::to_vec(v).map_err(io::Error::other)?;
    b.push(b'\n');
    s.write_all(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_cross_in_batches_and_lines_stay_apart() {
        let (a, b) = UnixStream::pair().unwrap();
        let files: Vec<std::fs::File> = (0..300).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        write_line(&a, &serde_json::json!({"n": 300})).unwrap();
        send_fds(&a, &fds).unwrap();
        write_line(&a, &serde_json::json!({"after": true})).unwrap();
        assert_eq!(read_line(&b, 100).unwrap(), br#"{"n":300}"#);
        let got = recv_fds(&b, 300).unwrap();
        assert_eq!(got.len(), 300);
        assert_eq!(read_line(&b, 100).unwrap(), br#"{"after":true}"#);
    }
}
