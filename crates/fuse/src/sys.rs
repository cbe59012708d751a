//! Thin, safe wrappers over the `*at` system calls the passthrough makes. Each returns the
//! OS error unchanged (the FUSE layer hands it to the application as errno) and retries
//! `EINTR`.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

pub(crate) fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Run `f` until it does not fail with EINTR; -1 becomes the OS error.
fn retry<T: PartialEq + From<i8>>(mut f: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let r = f();
        if r != T::from(-1) {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A name from the kernel as a C string. Names with NUL cannot come from the kernel; refuse.
pub(crate) fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| err(libc::EINVAL))
}

/// `/proc/self/fd/N`: reopening through it reaches the inode `fd` refers to, whatever its
/// name is now (or whether it has one).
pub(crate) fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

pub(crate) fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let fd = retry(|| {
        // SAFETY: name is NUL-terminated; returns a new descriptor or -1.
        unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC, mode) }
    })?;
    // SAFETY: a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open an `O_PATH` descriptor's inode again with real `flags`.
pub(crate) fn reopen(fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
    let p = proc_path(fd.as_raw_fd());
    let fd = retry(|| {
        // SAFETY: p is NUL-terminated; returns a new descriptor or -1.
        unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC) }
    })?;
    // SAFETY: a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dir` itself.
pub(crate) fn statat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    let flags = libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    // SAFETY: fstatat fills st on success; we read it only then.
    retry(|| unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: initialised by the successful fstatat.
    Ok(unsafe { st.assume_init() })
}

/// Which inode `dir/name` is (without following a symlink): device, inode number and birth
/// time, which tells a reused inode number from the inode that had it (0 where the file
/// system keeps no birth time). An empty name is `dir` itself.
pub(crate) fn ident_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<crate::journal::Ident> {
    let mut sx = MaybeUninit::<libc::statx>::uninit();
    let flags =
        libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_SYNC_AS_STAT | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    let mask = libc::STATX_INO | libc::STATX_BTIME;
    // SAFETY: statx fills sx on success; we read it only then.
    retry(|| unsafe { libc::statx(dir.as_raw_fd(), name.as_ptr(), flags, mask, sx.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful statx.
    let sx = unsafe { sx.assume_init() };
    let birth = if sx.stx_mask & libc::STATX_BTIME != 0 {
        (sx.stx_btime.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(u64::from(sx.stx_btime.tv_nsec))
    } else {
        0
    };
    Ok(crate::journal::Ident { dev: libc::makedev(sx.stx_dev_major, sx.stx_dev_minor), ino: sx.stx_ino, birth })
}

pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    statat(fd, c"")
}

pub(crate) fn fchmod_path(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let p = proc_path(fd.as_raw_fd());
    // SAFETY: plain syscall with a NUL-terminated path.
    retry(|| unsafe { libc::chmod(p.as_ptr(), mode) })?;
    Ok(())
}

pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall.
    retry(|| unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
    Ok(())
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)`: works on `O_PATH`
/// descriptors and on symlinks. `u32::MAX` leaves an id unchanged.
pub(crate) fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain syscall with an empty NUL-terminated path.
    retry(|| unsafe {
        libc::fchownat(fd.as_raw_fd(), c"".as_ptr(), uid, gid, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
    })?;
    Ok(())
}

/// Set times through an open descriptor (`Some`) or the `O_PATH` one of the inode.
pub(crate) fn utimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2], open: bool, symlink: bool) -> io::Result<()> {
    if open {
        // SAFETY: times points to two timespecs.
        retry(|| unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })?;
    } else if symlink {
        // SAFETY: empty path with AT_EMPTY_PATH names the descriptor itself.
        retry(|| unsafe {
            libc::utimensat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                times.as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
    } else {
        let p = proc_path(fd.as_raw_fd());
        // SAFETY: NUL-terminated path, two timespecs.
        retry(|| unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) })?;
    }
    Ok(())
}

pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: plain syscall with a NUL-terminated name.
    retry(|| unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

pub(crate) fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: plain syscall with a NUL-terminated name.
    retry(|| unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) })?;
    Ok(())
}

pub(crate) fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: plain syscall with NUL-terminated strings.
    retry(|| unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// Give the inode of `fd` one more name: `newdir/newname`.
pub(crate) fn link_proc(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> io::Result<()> {
    let p = proc_path(fd.as_raw_fd());
    // AT_SYMLINK_FOLLOW follows the /proc magic link to the inode itself (a symlink stays a
    // symlink: the magic link is not a textual link). Needs no CAP_DAC_READ_SEARCH.
    // SAFETY: plain syscall with NUL-terminated strings.
    retry(|| unsafe {
        libc::linkat(libc::AT_FDCWD, p.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), libc::AT_SYMLINK_FOLLOW)
    })?;
    Ok(())
}

pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: plain syscall with a NUL-terminated name.
    retry(|| unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

pub(crate) fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: plain syscall with NUL-terminated names.
    retry(|| unsafe {
        libc::renameat2(olddir.as_raw_fd(), oldname.as_ptr(), newdir.as_raw_fd(), newname.as_ptr(), flags)
    })?;
    Ok(())
}

pub(crate) fn readlink(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buf has buf.len() bytes; an empty path names the O_PATH symlink itself.
    let n = retry(|| unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n as usize);
    Ok(buf)
}

pub(crate) fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fills st on success; read only then.
    retry(|| unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call.
    Ok(unsafe { st.assume_init() })
}

pub(crate) fn faccess(fd: BorrowedFd<'_>, mask: i32) -> io::Result<()> {
    let p = proc_path(fd.as_raw_fd());
    // SAFETY: plain syscall with a NUL-terminated path.
    retry(|| unsafe { libc::faccessat(libc::AT_FDCWD, p.as_ptr(), mask, 0) })?;
    Ok(())
}

pub(crate) fn fsync_fd(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscalls.
    retry(|| unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })?;
    Ok(())
}

pub(crate) fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall.
    retry(|| unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) })
}

/// One `getdents64` into `buf`; returns the bytes filled (0 at the end of the directory).
pub(crate) fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the kernel writes at most buf.len() bytes into buf.
    let n = retry(|| unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()) })?;
    Ok(n as usize)
}

/// One directory entry parsed from a `getdents64` buffer.
pub(crate) struct Dirent<'a> {
    pub(crate) ino: u64,
    /// Where the entry after this one starts: the offset to seek to for the rest.
    pub(crate) next_off: u64,
    pub(crate) dtype: u8,
    pub(crate) name: &'a [u8],
}

/// The entries in `buf[..len]`, in order.
pub(crate) fn parse_dirents(buf: &[u8]) -> impl Iterator<Item = Dirent<'_>> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        const HDR: usize = 19;
        if pos + HDR > buf.len() {
            return None;
        }
        let rec = &buf[pos..];
        let ino = u64::from_ne_bytes(rec[0..8].try_into().ok()?);
        let off = u64::from_ne_bytes(rec[8..16].try_into().ok()?);
        let reclen = u16::from_ne_bytes(rec[16..18].try_into().ok()?) as usize;
        if reclen < HDR || reclen > rec.len() {
            return None;
        }
        let dtype = rec[18];
        let name_area = &rec[HDR..reclen];
        let name_len = name_area.iter().position(|&b| b == 0).unwrap_or(name_area.len());
        pos += reclen;
        Some(Dirent { ino, next_off: off, dtype, name: &name_area[..name_len] })
    })
}

pub(crate) fn getxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let p = proc_path(fd.as_raw_fd());
    let (ptr, len) = if buf.is_empty() { (std::ptr::null_mut(), 0) } else { (buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated strings; the kernel writes at most len bytes to ptr.
    let n = retry(|| unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), ptr.cast(), len) })?;
    Ok(n as usize)
}

pub(crate) fn listxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let p = proc_path(fd.as_raw_fd());
    let (ptr, len) = if buf.is_empty() { (std::ptr::null_mut(), 0) } else { (buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated path; the kernel writes at most len bytes to ptr.
    let n = retry(|| unsafe { libc::listxattr(p.as_ptr(), ptr.cast(), len) })?;
    Ok(n as usize)
}

pub(crate) fn setxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
    let p = proc_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated strings; value is read for value.len() bytes.
    retry(|| unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags) })?;
    Ok(())
}

/// Drop a regular file's set-user-ID bit, and its set-group-ID bit where group execute is set
/// (else it marks mandatory locking, and stays), as the kernel does when a caller without
/// `CAP_FSETID` writes or truncates it. Under `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves
/// this to the file system, and the daemon, running as root, writes with `CAP_FSETID`, so the
/// backing file system would not. A file with neither bit costs one `fstat`. `o_path`: `fd`
/// is an `O_PATH` descriptor (changed by its /proc path).
pub(crate) fn kill_suidgid(fd: BorrowedFd<'_>, o_path: bool) -> io::Result<()> {
    let st = fstat(fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let mode = st.st_mode & 0o7777;
    let kill = libc::S_ISUID | if mode & libc::S_IXGRP != 0 { libc::S_ISGID } else { 0 };
    if mode & kill == 0 {
        return Ok(());
    }
    if o_path {
        fchmod_path(fd, mode & !kill)
    } else {
        fchmod(fd, mode & !kill)
    }
}

/// Drop a file's capabilities (`security.capability`), as a local file system does on every
/// write: with `mount.xattrs = false` and a write-back tier the kernel no longer asks the mount
/// about them and the backing file is written later, so the daemon does it (a file without
/// them costs one system call answered ENODATA).
pub(crate) fn drop_capabilities(fd: BorrowedFd<'_>) {
    // SAFETY: a descriptor we hold and a NUL-terminated name.
    let r = unsafe { libc::fremovexattr(fd.as_raw_fd(), c"security.capability".as_ptr()) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) {
            tracing::debug!("dropping a written file's capabilities: {e}");
        }
    }
}

pub(crate) fn removexattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let p = proc_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated strings.
    retry(|| unsafe { libc::removexattr(p.as_ptr(), name.as_ptr()) })?;
    Ok(())
}

/// Raise the soft limit on open descriptors to the hard one (and, as root, both as far as
/// `fs.nr_open` allows, up to `want`): every inode the kernel knows holds one descriptor.
pub(crate) fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fills lim.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(lim.rlim_max);
    let target = want.min(nr_open);
    if target > lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: target, rlim_max: target };
        // SAFETY: plain syscall; fails without CAP_SYS_RESOURCE, and then we keep the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return target;
        }
    }
    let soft = libc::rlimit { rlim_cur: lim.rlim_max.min(want.max(lim.rlim_cur)), rlim_max: lim.rlim_max };
    // SAFETY: plain syscall.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) } == 0 {
        soft.rlim_cur
    } else {
        lim.rlim_cur
    }
}

/// `IOPRIO_CLASS_IDLE` (linux/ioprio.h), in the class bits of an I/O priority.
pub(crate) const IOPRIO_IDLE: i32 = 3 << 13;

/// Put the calling thread in the idle I/O priority class (`ioprio_set(IOPRIO_WHO_PROCESS,
/// 0, IOPRIO_CLASS_IDLE)`; 0 names the calling thread). Its reads and writes — io_uring's
/// too, which take the submitter's priority when a request carries none — then go to the
/// device only when nothing else waits, where the scheduler has priorities (bfq,
/// mq-deadline).
pub(crate) fn set_idle_io_priority() -> io::Result<()> {
    // SAFETY: a plain system call with integer arguments.
    if unsafe { libc::syscall(libc::SYS_ioprio_set, 1, 0, IOPRIO_IDLE) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn set_umask(mask: u32) {
    // SAFETY: cannot fail.
    unsafe { libc::umask(mask) };
}

/// `MAX_HANDLE_SZ` of the kernel: the largest file handle `name_to_handle_at` returns.
pub(crate) const MAX_HANDLE_BYTES: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_BYTES],
}

/// The file system's handle of the inode `fd` refers to (`name_to_handle_at` with
/// `AT_EMPTY_PATH`): `(type, bytes)`. Works on `O_PATH` descriptors.
pub(crate) fn handle_of(fd: BorrowedFd<'_>) -> io::Result<(i32, Vec<u8>)> {
    let mut h = RawHandle { handle_bytes: MAX_HANDLE_BYTES as u32, handle_type: 0, f_handle: [0; MAX_HANDLE_BYTES] };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: h has room for MAX_HANDLE_BYTES bytes, as handle_bytes says; empty path + flag.
    retry(|| unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            fd.as_raw_fd(),
            c"".as_ptr(),
            &mut h as *mut RawHandle,
            &mut mount_id as *mut libc::c_int,
            libc::AT_EMPTY_PATH,
        ) as i32
    })?;
    let n = (h.handle_bytes as usize).min(MAX_HANDLE_BYTES);
    Ok((h.handle_type, h.f_handle[..n].to_vec()))
}

/// Open the inode a file handle names, on the file system `mount_fd` is on
/// (`open_by_handle_at`; needs `CAP_DAC_READ_SEARCH`).
pub(crate) fn open_handle(mount_fd: BorrowedFd<'_>, handle_type: i32, bytes: &[u8], flags: i32) -> io::Result<OwnedFd> {
    if bytes.len() > MAX_HANDLE_BYTES {
        return Err(err(libc::EINVAL));
    }
    let mut h = RawHandle { handle_bytes: bytes.len() as u32, handle_type, f_handle: [0; MAX_HANDLE_BYTES] };
    h.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: h is a valid file_handle; returns a new descriptor or -1.
    let fd = retry(|| unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &h as *const RawHandle,
            flags | libc::O_CLOEXEC,
        ) as i32
    })?;
    // SAFETY: a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new `/dev/fuse` descriptor attached to the connection of `main` (`FUSE_DEV_IOC_CLONE`):
/// requests of the connection can be read from either, and each keeps its own queue of
/// requests read and not answered yet.
pub(crate) fn clone_fuse_fd(main: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let mut src = main.as_raw_fd() as u32;
    // _IOR(229, 0, uint32_t)
    const FUSE_DEV_IOC_CLONE: libc::c_ulong = (2 << 30) | (4 << 16) | (229 << 8);
    // SAFETY: the ioctl reads one u32 from a local.
    retry(|| unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &mut src as *mut u32) })?;
    Ok(OwnedFd::from(dev))
}

/// `FUSE_NOTIFY_RESEND` (Linux 6.9+): the kernel puts every request of the connection that
/// was read and not answered back in the queue, to be read again (with bit 63 of `unique`
/// set). What a dead daemon had read is served by the next one. Fails with EINVAL on older
/// kernels.
pub(crate) fn notify_resend(fuse: BorrowedFd<'_>) -> io::Result<()> {
    // struct fuse_out_header { u32 len; i32 error; u64 unique }: unique 0 = a notification,
    // error = the notification code (FUSE_NOTIFY_RESEND = 7), no payload.
    const FUSE_NOTIFY_RESEND: i32 = 7;
    let mut hdr = [0u8; 16];
    hdr[0..4].copy_from_slice(&16u32.to_ne_bytes());
    hdr[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    // SAFETY: writes 16 bytes from a local buffer.
    let n = retry(|| unsafe { libc::write(fuse.as_raw_fd(), hdr.as_ptr().cast(), hdr.len()) })?;
    if n != 16 {
        return Err(err(libc::EIO));
    }
    Ok(())
}

pub(crate) fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}
