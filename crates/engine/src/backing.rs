//! One open backing file: the descriptor opened as the application asked, and — for reads,
//! when `direct_io` is on — a second descriptor opened with `O_DIRECT`.
//!
//! Why `O_DIRECT` for the daemon's reads: the kernel page cache above the mount is the local
//! cache. If the daemon's own reads of the backing file went through the page cache too, every
//! block would be cached twice, memory limits on the application would not hold (the daemon's
//! cached pages are charged elsewhere), and a slow disk would look fast after the first read —
//! hiding exactly the misses farcache is meant to serve. Direct reads go to the device.
//!
//! Coherence: writes stay buffered (write-through to the backing file's page cache, durable on
//! fsync as on any file). A direct read first writes back dirty pages in its range (the kernel
//! does so for every `O_DIRECT` read), so it always sees the latest write.
//!
//! Alignment: a direct read covers the requested range rounded out to the device's direct-I/O
//! alignment (`statx` `STATX_DIOALIGN`, else 4096) into an aligned buffer, and answers the
//! requested slice. At end of file the device returns a short count ending at the file size,
//! so an unaligned tail needs no buffered read. A file system that refuses `O_DIRECT` at open
//! (tmpfs, some FUSE file systems) or at read time (`EINVAL`) gets buffered reads instead.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;

use crate::aligned::AlignedBuf;
use crate::identity::FileId;

/// The largest read one call may ask for. The kernel sends at most `max_pages` (256) pages
/// per FUSE read; this leaves room and bounds the buffer a caller can make us allocate.
pub const MAX_READ_BYTES: usize = 16 << 20;
/// Direct-I/O alignment used when the kernel does not report one.
pub const DEFAULT_DIO_ALIGN: u32 = 4096;
const _: () = assert!(DEFAULT_DIO_ALIGN.is_power_of_two());
const _: () = assert!(MAX_READ_BYTES.is_multiple_of(DEFAULT_DIO_ALIGN as usize));

/// How backing files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackingOptions {
    /// Read backing files with `O_DIRECT` where the file system supports it.
    pub direct_io: bool,
}

/// How one read was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    Direct,
    Buffered,
}

/// An open backing file. Shared by every FUSE request on one file handle; all methods take
/// `&self` and use positional I/O, so concurrent requests do not race on a file offset.
#[derive(Debug)]
pub struct BackingFile {
    id: FileId,
    file: File,
    readable: bool,
    writable: bool,
    /// `None` inside: direct reads are off, unsupported, or failed to open.
    direct: OnceLock<Option<DirectFd>>,
    direct_wanted: bool,
    /// Set when a direct read failed with EINVAL: the rest of this file's reads are buffered.
    direct_broken: AtomicBool,
}

#[derive(Debug)]
struct DirectFd {
    file: File,
    /// File offsets and lengths of direct reads are multiples of this.
    offset_align: u64,
    /// Buffers of direct reads are aligned to this.
    mem_align: usize,
}

impl BackingFile {
    /// Wrap `file`, opened with access mode `accmode` (`O_RDONLY`, `O_WRONLY` or `O_RDWR`).
    pub fn new(id: FileId, file: File, accmode: i32, opts: &BackingOptions) -> BackingFile {
        let readable = accmode != libc::O_WRONLY;
        BackingFile {
            id,
            file,
            readable,
            writable: accmode != libc::O_RDONLY,
            direct: OnceLock::new(),
            direct_wanted: opts.direct_io && readable,
            direct_broken: AtomicBool::new(false),
        }
    }

    pub fn id(&self) -> &FileId {
        &self.id
    }

    /// The descriptor opened as the application asked (buffered).
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn readable(&self) -> bool {
        self.readable
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Whether this file's reads currently go direct (opens the direct descriptor on first
    /// use).
    pub fn reads_direct(&self) -> bool {
        self.direct_fd().is_some() && !self.direct_broken.load(Ordering::Relaxed)
    }

    /// Read up to `len` bytes at `offset`; fewer only at end of file.
    pub fn read_at(&self, offset: u64, len: usize) -> io::Result<(Bytes, ReadMode)> {
        if len > MAX_READ_BYTES {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if len == 0 {
            return Ok((Bytes::new(), ReadMode::Buffered));
        }
        if !self.direct_broken.load(Ordering::Relaxed) {
            if let Some(d) = self.direct_fd() {
                match read_direct(d, offset, len) {
                    Ok(b) => return Ok((b, ReadMode::Direct)),
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        tracing::debug!(
                            "direct read of {:?} at {offset}+{len} refused (EINVAL); buffered from now on",
                            self.id
                        );
                        self.direct_broken.store(true, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok((read_buffered(&self.file, offset, len)?, ReadMode::Buffered))
    }

    /// Write all of `data` at `offset` (buffered, through to the backing file).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(data, offset)?;
        Ok(data.len())
    }

    fn direct_fd(&self) -> Option<&DirectFd> {
        if !self.direct_wanted {
            return None;
        }
        self.direct.get_or_init(|| open_direct(&self.file, &self.id)).as_ref()
    }
}

/// Reopen `file` read-only with `O_DIRECT` through its /proc/self/fd entry (the same inode,
/// whatever its name is now).
fn open_direct(file: &File, id: &FileId) -> Option<DirectFd> {
    let path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
    // SAFETY: path is NUL-terminated; open returns a new descriptor we own, or -1.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_DIRECT | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        tracing::debug!("no O_DIRECT for {id:?}: {e}; buffered reads");
        return None;
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let (offset_align, mem_align) = match dio_align(&file) {
        Some((0, _)) => {
            tracing::debug!("{id:?}: file system reports no direct-I/O support; buffered reads");
            return None;
        }
        Some((o, m)) => (o.max(1), m.max(1)),
        None => (DEFAULT_DIO_ALIGN, DEFAULT_DIO_ALIGN),
    };
    if !offset_align.is_power_of_two() || !mem_align.is_power_of_two() {
        return None;
    }
    Some(DirectFd { file, offset_align: u64::from(offset_align), mem_align: mem_align as usize })
}

/// `(offset alignment, memory alignment)` from statx STATX_DIOALIGN, or `None` when this
/// kernel or file system does not say.
fn dio_align(file: &File) -> Option<(u32, u32)> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: empty path with AT_EMPTY_PATH names the descriptor; statx fills stx.
    let r = unsafe {
        libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, stx.as_mut_ptr())
    };
    if r != 0 {
        return None;
    }
    // SAFETY: zero-initialised and filled by a successful statx.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

fn read_direct(d: &DirectFd, offset: u64, len: usize) -> io::Result<Bytes> {
    let a = d.offset_align;
    let start = offset / a * a;
    let end = (offset.checked_add(len as u64))
        .and_then(|e| e.checked_next_multiple_of(a))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let span = (end - start) as usize;
    let mut buf = AlignedBuf::with_capacity(span, d.mem_align.max(a as usize));
    while buf.filled() < span {
        let (ptr, room) = buf.spare();
        let pos = start + buf.filled() as u64;
        // SAFETY: ptr/room describe the unfilled, owned part of buf; pread writes at most room.
        let n = unsafe { libc::pread(d.file.as_raw_fd(), ptr.cast(), room, pos as libc::off_t) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: pread initialised n bytes at ptr.
        unsafe { buf.advance(n as usize) };
        // End of file, or a short count that ends off the alignment (only at end of file):
        // another read would start misaligned and add nothing.
        if n == 0 || !(n as u64).is_multiple_of(a) {
            break;
        }
    }
    let skip = (offset - start) as usize;
    let got = buf.filled();
    if got <= skip {
        return Ok(Bytes::new());
    }
    let upto = got.min(skip + len);
    Ok(Bytes::from_owner(buf).slice(skip..upto))
}

fn read_buffered(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identities;
    use std::io::Write;

    fn tmpdir(tag: &str) -> std::path::PathBuf {
        // Under the target directory, not /tmp: it must be a disk file system (tmpfs has no
        // O_DIRECT) for the direct path to be exercised.
        let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/engine-test")
            .join(format!("{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    #[test]
    fn direct_reads_match_buffered_at_every_alignment_and_at_eof() {
        let d = tmpdir("direct");
        let p = d.join("f");
        let data = pattern(3 * 4096 + 123);
        File::create(&p).unwrap().write_all(&data).unwrap();
        let ids = Identities::new();
        let f = File::open(&p).unwrap();
        let id = ids.identify(&f).unwrap();
        let bf = BackingFile::new(id, f, libc::O_RDONLY, &BackingOptions { direct_io: true });
        let direct = bf.reads_direct();
        // The target directory is on a disk file system here; only tmpfs lacks O_DIRECT.
        // SAFETY: statfs is plain old data; all zeroes is a valid value.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path; statfs fills sfs.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut sfs) }, 0);
        assert!(direct || sfs.f_type == libc::TMPFS_MAGIC, "O_DIRECT backing reads unavailable on a disk file system");
        for (off, len) in
            [(0, 4096), (1, 10), (4095, 2), (4096, 8192), (5000, 100_000), (12_300, 50), (20_000, 10), (0, 0)]
        {
            let (got, mode) = bf.read_at(off, len).unwrap();
            let lo = (off as usize).min(data.len());
            let hi = (off as usize + len).min(data.len());
            assert_eq!(&got[..], &data[lo..hi], "read {off}+{len}");
            if direct && len > 0 {
                assert_eq!(mode, ReadMode::Direct);
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn direct_read_sees_a_buffered_write_not_yet_synced() {
        let d = tmpdir("coherent");
        let p = d.join("f");
        File::create(&p).unwrap().write_all(&pattern(8192)).unwrap();
        let ids = Identities::new();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let id = ids.identify(&f).unwrap();
        let bf = BackingFile::new(id, f, libc::O_RDWR, &BackingOptions { direct_io: true });
        bf.write_at(4000, b"hello").unwrap();
        let (got, _) = bf.read_at(3998, 9).unwrap();
        let mut want = pattern(8192)[3998..4007].to_vec();
        want[2..7].copy_from_slice(b"hello");
        assert_eq!(&got[..], &want[..]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn write_only_files_never_read_direct_and_oversized_reads_are_refused() {
        let d = tmpdir("wo");
        let p = d.join("f");
        let f = File::create(&p).unwrap();
        let id = Identities::new().identify(&f).unwrap();
        let bf = BackingFile::new(id, f, libc::O_WRONLY, &BackingOptions { direct_io: true });
        assert!(!bf.reads_direct());
        assert_eq!(bf.read_at(0, MAX_READ_BYTES + 1).unwrap_err().raw_os_error(), Some(libc::EINVAL));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
