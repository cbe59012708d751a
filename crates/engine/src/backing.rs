//! One open backing file: the descriptor opened as the application asked, and — when
//! `direct_io` is on — a second descriptor opened with `O_DIRECT`. All transfers go through
//! the [`IoEngine`] (`io/`), which counts every fallback taken here.
//!
//! Why `O_DIRECT` for the daemon's reads: the kernel page cache above the mount is the local
//! cache. If the daemon's own reads of the backing file went through the page cache too, every
//! block would be cached twice, memory limits on the application would not hold (the daemon's
//! cached pages are charged elsewhere), and a slow disk would look fast after the first read —
//! hiding exactly the misses farcache is meant to serve. Direct reads go to the device.
//!
//! Writes: buffered (write-through to the backing file's page cache, durable on fsync as on
//! any file) — unless the application opened the file with `O_DIRECT` (a database managing
//! its own cache): then its aligned writes go direct too, copied into an aligned buffer, and
//! an unaligned one is written buffered (counted: `fallback_unaligned_writes`). With
//! `direct_writes` (`mount.direct_io_backing_writes`) every aligned write goes direct, the
//! others buffered (not counted): a page written through the mount is cached once, above
//! it, instead of also in the backing file's page cache, where the daemon's direct reads
//! never look and which the memory cgroup of the daemon pays for (BENCHMARKS.md, session 14).
//!
//! Coherence: a direct read first writes back dirty pages in its range, and a direct write
//! writes them back and drops them (the kernel does both for every `O_DIRECT` transfer), so
//! reads always see the latest write however each was done.
//!
//! Alignment: a direct read covers the requested range rounded out to the device's direct-I/O
//! alignment (`statx` `STATX_DIOALIGN`, else 4096) into an aligned buffer, and answers the
//! requested slice. At end of file the device returns a short count ending at the file size,
//! so an unaligned tail needs no buffered read. A read off the alignment is counted
//! (`fallback_unaligned_reads`: it cost a bounce buffer and more bytes than asked). A file
//! system that refuses `O_DIRECT` at open (tmpfs, some FUSE file systems) or at the first
//! transfer (`EINVAL`) gets buffered I/O instead (counted: `fallback_direct_refused`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::aligned::AlignedBuf;
use crate::identity::FileId;
use crate::index::{FileIndex, Stamp};
use crate::io::{IoEngine, Meanwhile};

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
    /// With `direct_io`: write them with `O_DIRECT` too where a write is aligned, whatever
    /// the application's open flags (`mount.direct_io_backing_writes`), so written pages do
    /// not sit in the backing file's page cache as a second copy of the mount's.
    pub direct_writes: bool,
}

/// How one read or write was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    Direct,
    Buffered,
}

/// How one write was served (the same two ways as a read).
pub type WriteMode = ReadMode;

/// An open backing file. Shared by every FUSE request on one file handle; all methods take
/// `&self` and use positional I/O, so concurrent requests do not race on a file offset.
#[derive(Debug)]
pub struct BackingFile {
    id: FileId,
    file: File,
    readable: bool,
    writable: bool,
    /// `None` inside: direct I/O is off, unsupported, or failed to open.
    direct: OnceLock<Option<DirectFd>>,
    direct_wanted: bool,
    /// Aligned writes go direct: the application opened the file with `O_DIRECT`, or
    /// `BackingOptions::direct_writes`.
    writes_direct: bool,
    /// The application opened the file with `O_DIRECT` (an unaligned write is a fallback).
    app_direct: bool,
    /// Set when a direct transfer failed with EINVAL: the rest of this file's I/O is buffered.
    direct_broken: AtomicBool,
    /// The index entry told when this handle closes (`Drop`), if the data path counted it
    /// as a writer ([`Self::count_as_writer`]).
    writer_of: OnceLock<Arc<FileIndex>>,
}

impl Drop for BackingFile {
    fn drop(&mut self) {
        if let Some(f) = self.writer_of.get() {
            // The descriptor is still open here: the stamp its changes left.
            f.writer_closed(|| Stamp::of(&self.file));
        }
    }
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
        let writable = accmode != libc::O_RDONLY;
        let writes_direct = opts.direct_io && opts.direct_writes && writable;
        BackingFile {
            id,
            file,
            readable,
            writable,
            direct: OnceLock::new(),
            direct_wanted: (opts.direct_io && readable) || writes_direct,
            writes_direct,
            app_direct: false,
            direct_broken: AtomicBool::new(false),
            writer_of: OnceLock::new(),
        }
    }

    /// Count this handle as a writer of its file's index entry (`open`: the entry, counted
    /// — [`crate::index::BlockIndex::writer_opened`]), once however often it is asked; its close
    /// tells the entry ([`FileIndex::writer_closed`]).
    pub fn count_as_writer(&self, open: impl FnOnce() -> Arc<FileIndex>) {
        self.writer_of.get_or_init(open);
    }

    /// The application opened the file with `O_DIRECT` (`flags` are its open flags): write
    /// direct too, where `direct_io` is on and the writes are aligned.
    pub fn with_app_flags(mut self, flags: i32, opts: &BackingOptions) -> BackingFile {
        self.app_direct = opts.direct_io && self.writable && flags & libc::O_DIRECT != 0;
        self.writes_direct |= self.app_direct;
        self.direct_wanted |= self.writes_direct;
        self
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

    /// The file moved to another backing branch: `new`, open on the new copy with the same
    /// access (contents equal), takes the place of this handle's descriptors, under their
    /// numbers (`dup3`), so I/O already queued on them and every later request reach the new
    /// copy without any lock on the data path. The direct descriptor follows (opened on the
    /// new copy now if it was not yet, so a concurrent first open cannot leave it on the old
    /// one); where the new copy refuses `O_DIRECT` the buffered descriptor stands in for it
    /// and the rest of this file's I/O is buffered. The caller holds off writes meanwhile.
    pub fn replace_file(&self, new: &File) -> io::Result<()> {
        dup3(new.as_raw_fd(), self.file.as_raw_fd())?;
        if let Some(d) = self.direct_fd(None) {
            match open_direct(new, &self.id, self.readable, self.writable) {
                Some(nd) if nd.offset_align == d.offset_align && nd.mem_align == d.mem_align => {
                    dup3(nd.file.as_raw_fd(), d.file.as_raw_fd())?;
                }
                _ => {
                    self.direct_broken.store(true, Ordering::SeqCst);
                    dup3(new.as_raw_fd(), d.file.as_raw_fd())?;
                }
            }
        }
        Ok(())
    }

    /// Whether this file's reads currently go direct (opens the direct descriptor on first
    /// use).
    pub fn reads_direct(&self) -> bool {
        self.direct_fd(None).is_some() && !self.direct_broken.load(Ordering::Relaxed)
    }

    /// Read up to `len` bytes at `offset` through `io`; fewer only at end of file.
    pub fn read_at(&self, io: &IoEngine, offset: u64, len: usize) -> io::Result<(Bytes, ReadMode)> {
        self.read_at_while(io, offset, len, &mut Meanwhile::none())
    }

    /// [`BackingFile::read_at`], running `meanwhile` while the read is in the kernel (see
    /// [`Meanwhile`]; it may not have run when this returns an error).
    pub fn read_at_while(
        &self,
        io: &IoEngine,
        offset: u64,
        len: usize,
        meanwhile: &mut Meanwhile<'_>,
    ) -> io::Result<(Bytes, ReadMode)> {
        if len > MAX_READ_BYTES {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if len == 0 {
            meanwhile.run();
            return Ok((Bytes::new(), ReadMode::Buffered));
        }
        if let Some(d) = self.live_direct_fd(io) {
            match read_direct(io, d, offset, len, meanwhile) {
                Ok(b) => return Ok((b, ReadMode::Direct)),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct_refused(io, "read", offset, len),
                Err(e) => return Err(e),
            }
        }
        Ok((read_buffered(io, &self.file, offset, len, meanwhile)?, ReadMode::Buffered))
    }

    /// Write all of `data` at `offset` through `io`: direct if the application opened the
    /// file with `O_DIRECT` (or `direct_writes` is on) and the write is aligned, else buffered
    /// (through to the backing file's page cache).
    pub fn write_at(&self, io: &IoEngine, offset: u64, data: &[u8]) -> io::Result<WriteMode> {
        if self.writes_direct && !data.is_empty() {
            if let Some(d) = self.live_direct_fd(io) {
                if offset.is_multiple_of(d.offset_align) && (data.len() as u64).is_multiple_of(d.offset_align) {
                    // The FUSE request buffer puts a WRITE's data on a page: written from
                    // there, with no aligned copy (a 1 MiB allocation per write, whose pages
                    // each thread's allocator heap then kept).
                    let align = d.mem_align.max(d.offset_align as usize);
                    let copy;
                    let src = if (data.as_ptr() as usize).is_multiple_of(align) {
                        data
                    } else {
                        let mut buf = AlignedBuf::with_capacity(data.len(), align);
                        buf.extend_from_slice(data);
                        copy = buf;
                        copy.as_ref()
                    };
                    match io.write_all(d.file.as_fd(), offset, src) {
                        Ok(()) => return Ok(ReadMode::Direct),
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                            self.direct_refused(io, "write", offset, data.len())
                        }
                        Err(e) => return Err(e),
                    }
                } else if self.app_direct {
                    io.counters().fallback_unaligned_writes.hit(|| {
                        format!(
                            "a write of {:?} opened O_DIRECT at {offset}+{} is off the {}-byte alignment; written buffered",
                            self.id,
                            data.len(),
                            d.offset_align
                        )
                    });
                }
            }
        }
        io.write_all(self.file.as_fd(), offset, data)?;
        Ok(ReadMode::Buffered)
    }

    /// Write each `(offset, data)` of `writes` (ranges that do not overlap) as
    /// [`BackingFile::write_at`] would, submitted to `io` together where they can be: all
    /// direct (each aligned, its buffer too) or all buffered, in rounds of the engine's queue
    /// depth. Otherwise, and for one write, one at a time. A short transfer is resubmitted for
    /// the rest (counted); a direct write refused with `EINVAL` makes the file's I/O buffered
    /// (counted, as for one write) and is written again that way. Returns how many went
    /// direct. On an error some writes may have reached the file and others not.
    pub fn write_many_at(&self, io: &IoEngine, writes: &[(u64, &[u8])]) -> io::Result<usize> {
        let one_by_one = |writes: &[(u64, &[u8])]| -> io::Result<usize> {
            let mut direct = 0;
            for (offset, data) in writes {
                if self.write_at(io, *offset, data)? == ReadMode::Direct {
                    direct += 1;
                }
            }
            Ok(direct)
        };
        if writes.len() < 2 {
            return one_by_one(writes);
        }
        let fits = |w: &&(u64, &[u8])| !w.1.is_empty() && w.1.len() <= crate::io::MAX_OP_BYTES;
        type Writes<'w> = Vec<(u64, &'w [u8])>;
        let (fd, direct, together, rest): (_, _, Writes<'_>, Writes<'_>) =
            match self.writes_direct.then(|| self.live_direct_fd(io)).flatten() {
                Some(d) => {
                    let align = d.mem_align.max(d.offset_align as usize);
                    // The unaligned ones (a file's last, partial block) go one by one: write_at
                    // copies or counts each.
                    let (together, rest) = writes.iter().partition(|w| {
                        fits(w)
                            && w.0.is_multiple_of(d.offset_align)
                            && (w.1.len() as u64).is_multiple_of(d.offset_align)
                            && (w.1.as_ptr() as usize).is_multiple_of(align)
                    });
                    (d.file.as_fd(), true, together, rest)
                }
                // No direct writes (or direct refused): buffered, as write_at would.
                None => {
                    let (together, rest) = writes.iter().partition(fits);
                    (self.file.as_fd(), false, together, rest)
                }
            };
        let mut went_direct = one_by_one(&rest)?;
        let mut ops: Vec<crate::io::Op<'_>> =
            together.iter().map(|(offset, data)| crate::io::Op::Write { fd, offset: *offset, data }).collect();
        let results = io.run(&mut ops);
        let mut refused = Vec::new();
        for ((offset, data), r) in together.iter().zip(results) {
            match r {
                Ok(n) if n == data.len() => {}
                Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Ok(n) => {
                    io.counters().short_retries.hit(|| "a short transfer was resubmitted for the rest".into());
                    io.write_all(fd, offset + n as u64, &data[n..])?;
                }
                Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => refused.push((*offset, *data)),
                Err(e) => return Err(e),
            }
        }
        if let Some((offset, data)) = refused.first() {
            self.direct_refused(io, "write", *offset, data.len());
            for (offset, data) in &refused {
                io.write_all(self.file.as_fd(), *offset, data)?;
            }
        }
        if direct {
            went_direct += together.len() - refused.len();
        }
        Ok(went_direct)
    }

    /// The direct descriptor, unless direct I/O is off, unsupported or refused.
    fn live_direct_fd(&self, io: &IoEngine) -> Option<&DirectFd> {
        if self.direct_broken.load(Ordering::Relaxed) {
            return None;
        }
        self.direct_fd(Some(io))
    }

    /// A direct transfer failed with EINVAL: the rest of this file's I/O is buffered.
    fn direct_refused(&self, io: &IoEngine, what: &str, offset: u64, len: usize) {
        if !self.direct_broken.swap(true, Ordering::Relaxed) {
            io.counters().fallback_direct_refused.hit(|| {
                format!("a direct {what} of {:?} at {offset}+{len} was refused (EINVAL); buffered from now on", self.id)
            });
        }
    }

    /// The direct descriptor, opened on first use; a file system refusing it is counted
    /// (once per file) on `io`.
    fn direct_fd(&self, io: Option<&IoEngine>) -> Option<&DirectFd> {
        if !self.direct_wanted {
            return None;
        }
        self.direct
            .get_or_init(|| {
                let d = open_direct(&self.file, &self.id, self.readable, self.writable);
                if let (None, Some(io)) = (&d, io) {
                    io.counters()
                        .fallback_direct_refused
                        .hit(|| format!("the file system of {:?} refuses O_DIRECT; its I/O is buffered", self.id));
                }
                d
            })
            .as_ref()
    }
}

/// Make descriptor number `to` refer to what `from` refers to (atomically; `to` stays open).
fn dup3(from: std::os::fd::RawFd, to: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: both are descriptors this process owns; dup3 replaces `to` atomically.
    if unsafe { libc::dup3(from, to, libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reopen `file` with `O_DIRECT` and its own access mode through its /proc/self/fd entry
/// (the same inode, whatever its name is now).
fn open_direct(file: &File, id: &FileId, readable: bool, writable: bool) -> Option<DirectFd> {
    let path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
    let accmode = match (readable, writable) {
        (true, true) => libc::O_RDWR,
        (false, true) => libc::O_WRONLY,
        _ => libc::O_RDONLY,
    };
    // SAFETY: path is NUL-terminated; open returns a new descriptor we own, or -1.
    let fd = unsafe { libc::open(path.as_ptr().cast(), accmode | libc::O_DIRECT | libc::O_CLOEXEC) };
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

fn read_direct(
    io: &IoEngine,
    d: &DirectFd,
    offset: u64,
    len: usize,
    meanwhile: &mut Meanwhile<'_>,
) -> io::Result<Bytes> {
    let a = d.offset_align;
    let start = offset / a * a;
    let end = (offset.checked_add(len as u64))
        .and_then(|e| e.checked_next_multiple_of(a))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let span = (end - start) as usize;
    if start != offset || span != len {
        io.counters().fallback_unaligned_reads.hit(|| {
            format!("a direct read at {offset}+{len} is off the {a}-byte alignment; read rounded out to {start}+{span}")
        });
    }
    let mut buf = AlignedBuf::with_capacity(span, d.mem_align.max(a as usize));
    let n = io.read_full_while(d.file.as_fd(), start, buf.spare_uninit(), a, meanwhile)?;
    // SAFETY: read_full initialised the first n bytes of the spare room.
    unsafe { buf.advance(n) };
    let skip = (offset - start) as usize;
    let got = buf.filled();
    if got <= skip {
        return Ok(Bytes::new());
    }
    let upto = got.min(skip + len);
    Ok(Bytes::from_owner(buf).slice(skip..upto))
}

fn read_buffered(
    io: &IoEngine,
    file: &File,
    offset: u64,
    len: usize,
    meanwhile: &mut Meanwhile<'_>,
) -> io::Result<Bytes> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    let got = io.read_full_while(file.as_fd(), offset, &mut buf.spare_capacity_mut()[..len], 1, meanwhile)?;
    // SAFETY: read_full initialised the first `got` bytes of the spare capacity.
    unsafe { buf.set_len(got) };
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

    /// One engine of each kind.
    fn engines() -> [IoEngine; 2] {
        use crate::io::IoOptions;
        [IoKind::Uring, IoKind::Sync].map(|kind| IoEngine::new(IoOptions { kind, ..IoOptions::default() }))
    }
    use crate::io::IoEngineKind as IoKind;

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
        let bf = BackingFile::new(id, f, libc::O_RDONLY, &BackingOptions { direct_io: true, direct_writes: false });
        let direct = bf.reads_direct();
        // The target directory is on a disk file system here; only tmpfs lacks O_DIRECT.
        // SAFETY: statfs is plain old data; all zeroes is a valid value.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path; statfs fills sfs.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut sfs) }, 0);
        assert!(direct || sfs.f_type == libc::TMPFS_MAGIC, "O_DIRECT backing reads unavailable on a disk file system");
        for (io, (off, len)) in engines().iter().flat_map(|io| {
            [(0, 4096), (1, 10), (4095, 2), (4096, 8192), (5000, 100_000), (12_300, 50), (20_000, 10), (0, 0)]
                .map(|r| (io, r))
        }) {
            let (got, mode) = bf.read_at(io, off, len).unwrap();
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
        let bf = BackingFile::new(id, f, libc::O_RDWR, &BackingOptions { direct_io: true, direct_writes: false });
        let io = IoEngine::default();
        bf.write_at(&io, 4000, b"hello").unwrap();
        let (got, _) = bf.read_at(&io, 3998, 9).unwrap();
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
        let bf = BackingFile::new(id, f, libc::O_WRONLY, &BackingOptions { direct_io: true, direct_writes: false });
        assert!(!bf.reads_direct());
        assert_eq!(
            bf.read_at(&IoEngine::default(), 0, MAX_READ_BYTES + 1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn o_direct_writers_write_direct_when_aligned_and_buffered_otherwise() {
        let d = tmpdir("dwrite");
        let p = d.join("f");
        File::create(&p).unwrap().write_all(&pattern(3 * 4096)).unwrap();
        let opts = BackingOptions { direct_io: true, direct_writes: false };
        for io in engines() {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
            let id = Identities::new().identify(&f).unwrap();
            let bf = BackingFile::new(id, f, libc::O_RDWR, &opts).with_app_flags(libc::O_RDWR | libc::O_DIRECT, &opts);
            assert_eq!(bf.write_at(&io, 4096, &[7u8; 4096]).unwrap(), ReadMode::Direct);
            assert_eq!(bf.write_at(&io, 10, b"abc").unwrap(), ReadMode::Buffered);
            assert_eq!(io.counters().snapshot().fallback_unaligned_writes, 1);
            let (got, _) = bf.read_at(&io, 0, 3 * 4096).unwrap();
            let mut want = pattern(3 * 4096);
            want[4096..8192].fill(7);
            want[10..13].copy_from_slice(b"abc");
            assert_eq!(&got[..], &want[..]);
            assert_eq!(io.counters().snapshot().fallback_unaligned_reads, 0, "an aligned read needs no bounce");
            bf.read_at(&io, 1, 10).unwrap();
            assert_eq!(io.counters().snapshot().fallback_unaligned_reads, 1);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A batch of writes lands byte for byte whatever mix it is: aligned blocks from an
    /// aligned buffer (submitted together, direct), a run off the alignment (written on its
    /// own, buffered, counted), and on a file with direct writes off, all of it buffered.
    #[test]
    fn write_many_writes_each_range_direct_where_aligned() {
        let d = tmpdir("wmany");
        let p = d.join("f");
        let size = 64 * 4096;
        for io in engines() {
            for direct_writes in [true, false] {
                File::create(&p).unwrap().write_all(&pattern(size)).unwrap();
                let opts = BackingOptions { direct_io: true, direct_writes };
                let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
                let id = Identities::new().identify(&f).unwrap();
                let bf = BackingFile::new(id, f, libc::O_RDWR, &opts);
                let mut buf = AlignedBuf::with_capacity(6 * 4096, 4096);
                buf.extend_from_slice(&[1u8; 4096]);
                buf.extend_from_slice(&[2u8; 2 * 4096]);
                buf.extend_from_slice(&[3u8; 3 * 4096]);
                let b = buf.as_ref();
                let odd = [4u8; 100];
                let writes: Vec<(u64, &[u8])> = vec![
                    (40 * 4096, &b[..4096]),
                    (3 * 4096, &b[4096..3 * 4096]),
                    (20 * 4096 + 7, &odd),
                    (60 * 4096, &b[3 * 4096..]),
                ];
                let before = io.counters().snapshot().fallback_unaligned_writes;
                let direct = bf.write_many_at(&io, &writes).unwrap();
                let want_direct = if direct_writes && bf.reads_direct() { 3 } else { 0 };
                assert_eq!(direct, want_direct, "direct_writes {direct_writes}");
                // Counted only for a file the application opened O_DIRECT (not this one).
                assert_eq!(io.counters().snapshot().fallback_unaligned_writes - before, 0);
                let mut want = pattern(size);
                for (o, w) in &writes {
                    want[*o as usize..*o as usize + w.len()].copy_from_slice(w);
                }
                assert_eq!(std::fs::read(&p).unwrap(), want, "direct_writes {direct_writes}");
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
