//! The medium a tier lives on, and which of the three kinds it is.
//!
//! [`Medium`] is the seam under the log: positional writes and reads of whole pages, and a
//! flush that makes every completed write durable. Three implementations, chosen by what
//! the tier's path is ([`detect`]):
//! - `dram`: a file on tmpfs (or ramfs). A write is "durable" once it is in the file: it
//!   survives the daemon (a SIGKILL, a crash), **not** a power cut or a reboot. The flush is
//!   free. This is how paper 003 emulated NVM.
//! - `ssd`: a file on a disk file system, or a block device, written with `O_DIRECT` and made
//!   durable by `fdatasync` (a cache flush / FUA on the device). The log commits concurrent
//!   writers' records together (group commit), so one flush covers many writes.
//! - `pmem`: a file on a DAX file system mapped with `MAP_SYNC` (or a device-DAX character
//!   device): stores, cache-line flushes and a fence make a write durable. Detected, never
//!   faked: where the mapping is refused the tier says so and does not start.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{TierError, PAGE_BYTES};

/// Positional page I/O with a durability point. Offsets and lengths are multiples of
/// [`PAGE_BYTES`] and buffers are page-aligned (the log's own): `O_DIRECT` needs both.
#[allow(clippy::len_without_is_empty)]
pub trait Medium: Send + Sync {
    /// Bytes the medium holds.
    fn len(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Write all of `data` at `offset`. Not durable before the next [`Medium::flush`].
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Write `bufs`, one after the other, at `offset`: one write, as [`Medium::write_at`] of
    /// their concatenation (which the default makes, one copy). Each buffer is whole pages,
    /// page-aligned, so a medium opened `O_DIRECT` can write them where they are.
    fn write_vectored_at(&self, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        let mut all = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        for b in bufs {
            all.extend_from_slice(b);
        }
        self.write_at(offset, &all)
    }
    /// Make every write completed before the call durable.
    fn flush(&self) -> io::Result<()>;
    /// Start writing what is written but not yet durable towards the device, without waiting
    /// (a medium written through the page cache: so that the next flush has less to do). A
    /// hint: the default does nothing.
    fn start_writeback(&self) {}
    /// Read each `(offset, buffer)`, as [`Medium::read_at`] does: one after the other here;
    /// the engine's wrapper of a medium with a [`Medium::fd`] has them in flight together.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_at(*offset, buf)?;
        }
        Ok(())
    }
    /// The descriptor positional reads of this medium go to (`ssd`), for an I/O engine to
    /// submit [`Medium::read_many`]'s reads on; `None` for a mapping or a tmpfs file.
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// What kind of medium a tier is on (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Dram,
    Ssd,
    Pmem,
}

impl Mode {
    /// What a write acknowledged by this tier survives, for the log and `farcache stats`.
    pub fn durability(self) -> &'static str {
        match self {
            Mode::Dram => "survives the daemon, not a power cut (a file in RAM, tmpfs)",
            Mode::Ssd => "survives a power cut (O_DIRECT writes and fdatasync)",
            Mode::Pmem => "survives a power cut (DAX mapping with MAP_SYNC, cache-line flushes)",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Dram => "dram",
            Mode::Ssd => "ssd",
            Mode::Pmem => "pmem",
        })
    }
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// The mode `path` calls for: a device-DAX character device or a file on a file system
/// mounted with `dax` → pmem; a file on tmpfs or ramfs → dram; anything else (a file on a
/// disk file system, a block device) → ssd. `path` need not exist yet (its directory must).
pub fn detect(path: &Path) -> Result<Mode, TierError> {
    if let Ok(m) = std::fs::metadata(path) {
        if m.file_type().is_char_device() {
            return Ok(Mode::Pmem);
        }
        if m.file_type().is_block_device() {
            return Ok(Mode::Ssd);
        }
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let probe = if path.exists() { path.to_path_buf() } else { dir };
    let c = std::ffi::CString::new(probe.as_os_str().as_encoded_bytes())
        .map_err(|_| TierError::config(path, "the path contains a NUL byte", "name another path"))?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills `st` for a NUL-terminated path.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        let e = io::Error::last_os_error();
        return Err(TierError::config(path, &format!("cannot inspect its file system: {e}"), "create its directory"));
    }
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    if magic == TMPFS_MAGIC || magic == RAMFS_MAGIC {
        return Ok(Mode::Dram);
    }
    if mounted_with_dax(&probe) {
        return Ok(Mode::Pmem);
    }
    Ok(Mode::Ssd)
}

/// Whether the file system holding `path` is mounted with the `dax` option (or `dax=always`).
fn mounted_with_dax(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    // The longest mount point that is a prefix of the path is the one holding it.
    let mut best: Option<(usize, bool)> = None;
    for line in info.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 6 {
            continue;
        }
        let mp = Path::new(f[4]);
        let sep = f.iter().position(|x| *x == "-").unwrap_or(f.len());
        let supers = f.get(sep + 3).copied().unwrap_or("");
        let dax = f[5].split(',').chain(supers.split(',')).any(|o| o == "dax" || o == "dax=always");
        if canon.starts_with(mp) && best.is_none_or(|(n, _)| mp.as_os_str().len() >= n) {
            best = Some((mp.as_os_str().len(), dax));
        }
    }
    best.is_some_and(|(_, d)| d)
}

/// Open (or create, `size` bytes) the medium at `path` in `mode`. A device is used up to
/// `size` bytes (or its own size if smaller).
pub fn open(path: &Path, mode: Mode, size: u64) -> Result<Box<dyn Medium>, TierError> {
    open_with(path, mode, size, false)
}

/// [`open`]; `buffered`: an `ssd` medium written through the page cache instead of with
/// `O_DIRECT`, for a log that commits lazily ([`crate::Log::commit_lazily`]): a write is a
/// copy into the page cache, as a write to the backing file would be, and the flush
/// (`fdatasync`) writes back what the lazy appends left there — the log's pages, in ring
/// order — and then drops the tier's pages from the page cache, so the tier holds page cache
/// only for what is not yet flushed (and reads since the last flush).
pub fn open_with(path: &Path, mode: Mode, size: u64, buffered: bool) -> Result<Box<dyn Medium>, TierError> {
    let io_err = |what: &str, e: io::Error| {
        TierError::config(path, &format!("{what}: {e}"), "check the path and its permissions")
    };
    match mode {
        Mode::Dram | Mode::Ssd => {
            let mut o = OpenOptions::new();
            o.read(true).write(true);
            let is_dev = std::fs::metadata(path).map(|m| m.file_type().is_block_device()).unwrap_or(false);
            if !is_dev {
                o.create(true);
            }
            let buffered = buffered && mode == Mode::Ssd;
            if mode == Mode::Ssd && !buffered {
                o.custom_flags(libc::O_DIRECT);
            }
            let file = o.open(path).map_err(|e| {
                if e.raw_os_error() == Some(libc::EINVAL) && mode == Mode::Ssd {
                    TierError::config(
                        path,
                        "its file system refuses O_DIRECT",
                        "put the tier on a disk file system or a block device, or on tmpfs for mode dram",
                    )
                } else {
                    io_err("cannot open it", e)
                }
            })?;
            let len = if is_dev {
                device_size(&file).map_err(|e| io_err("cannot read the device's size", e))?.min(size)
            } else {
                let have = file.metadata().map_err(|e| io_err("cannot stat it", e))?.len();
                if have < size {
                    file.set_len(size).map_err(|e| io_err("cannot size it", e))?;
                    // Reserve the space now: a tier that runs out of room on its own file
                    // system would fail writes it already promised.
                    allocate(&file, size).map_err(|e| io_err(&format!("cannot reserve {size} bytes"), e))?;
                    if mode == Mode::Ssd {
                        write_once(&file, have, size).map_err(|e| io_err("cannot write its new space once", e))?;
                    }
                }
                size
            };
            Ok(Box::new(FileMedium {
                file,
                len: len / PAGE_BYTES as u64 * PAGE_BYTES as u64,
                sync: mode == Mode::Ssd,
                buffered,
            }))
        }
        Mode::Pmem => Ok(Box::new(PmemMedium::open(path, size)?)),
    }
}

/// Write zeros over `from..to` of a new `ssd` tier file once (`O_DIRECT`, 1 MiB at a time),
/// then `fdatasync`. Space reserved with `fallocate` is *unwritten* on ext4 and XFS: the first
/// write to each block converts its extent, a metadata change that the group commit's
/// `fdatasync` must then commit too, until the ring has gone round once (BENCHMARKS.md,
/// issue 12, session 30: fio's 4 KiB writes + `fdatasync` ran at half the rate on a
/// fallocated file; 32 durable writers through a fresh ssd tier 1.12–1.52× with this). The
/// partial page past the last whole one is never used, and not written.
fn write_once(file: &File, from: u64, to: u64) -> io::Result<()> {
    const CHUNK_PAGES: usize = 256;
    let t0 = std::time::Instant::now();
    let zeros = crate::page::zeroed(CHUNK_PAGES);
    let buf = crate::page::bytes(&zeros);
    let page = PAGE_BYTES as u64;
    let (mut at, to) = (from / page * page, to / page * page);
    while at < to {
        let n = buf.len().min((to - at) as usize);
        std::os::unix::fs::FileExt::write_all_at(file, &buf[..n], at)?;
        at += n as u64;
    }
    file.sync_data()?;
    tracing::info!(
        "tier: wrote {} MiB of the new tier file once in {:.1} s (so that commits need no file system metadata)",
        to.saturating_sub(from) >> 20,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn allocate(file: &File, size: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    // Some file systems cannot preallocate; the space was set with set_len.
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(e)
}

fn device_size(file: &File) -> io::Result<u64> {
    let mut n: u64 = 0;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    // SAFETY: the ioctl writes one u64 into `n`.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n)
}

/// `dram` and `ssd`: a file or block device, written with `pwrite` (`O_DIRECT` for ssd).
struct FileMedium {
    file: File,
    len: u64,
    /// Flush with `fdatasync` (ssd); dram's writes are as durable as they get once written.
    sync: bool,
    /// An ssd medium written through the page cache ([`open_with`]): its pages are dropped
    /// from the page cache after each flush.
    buffered: bool,
}

impl Medium for FileMedium {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }
    /// `pwritev` from where the buffers are (a batch's data pages stay in the appends that
    /// hold them: measured, the copy into one buffer and its zeroing were a fifth of a
    /// 1 MiB write's CPU in the daemon), continued after a short write.
    fn write_vectored_at(&self, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        let mut iov: Vec<libc::iovec> =
            bufs.iter().map(|b| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }).collect();
        let (mut first, mut at) = (0usize, offset);
        while first < iov.len() {
            // At most IOV_MAX buffers a call.
            let n = iov.len().min(first + 1024) - first;
            // SAFETY: the iovecs point into `bufs`, borrowed for the call.
            let r = unsafe { libc::pwritev(self.file.as_raw_fd(), iov[first..].as_ptr(), n as i32, at as libc::off_t) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "the medium took no bytes"));
            }
            at += r as u64;
            let mut left = r as usize;
            while left > 0 && first < iov.len() {
                if left >= iov[first].iov_len {
                    left -= iov[first].iov_len;
                    first += 1;
                } else {
                    // SAFETY: advancing within the same buffer.
                    iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(left).cast() };
                    iov[first].iov_len -= left;
                    left = 0;
                }
            }
            while first < iov.len() && iov[first].iov_len == 0 {
                first += 1;
            }
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if self.sync {
            self.file.sync_data()?;
        }
        if self.buffered {
            // Clean now: drop them (pages written meanwhile are dirty and stay).
            // SAFETY: plain syscall on a descriptor we own.
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        Ok(())
    }
    fn start_writeback(&self) {
        if self.buffered {
            // SAFETY: plain syscall on a descriptor we own; SYNC_FILE_RANGE_WRITE starts the
            // write-back of the file's dirty pages and does not wait for it.
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
    }
    /// An ssd tier's: a device worth queueing reads on (a dram tier's reads are copies).
    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.sync.then(|| std::os::fd::AsFd::as_fd(&self.file))
    }
}

/// `pmem`: a shared mapping with `MAP_SYNC` (DAX file system) or of a device-DAX device.
struct PmemMedium {
    base: *mut u8,
    len: u64,
    _file: File,
}

// SAFETY: the mapping is shared memory; the log never writes one page from two threads at
// once (it writes only pages it allocated to the writing leader) and reads only pages that
// are live.
unsafe impl Send for PmemMedium {}
unsafe impl Sync for PmemMedium {}

const MAP_SHARED_VALIDATE: i32 = 0x03;
const MAP_SYNC: i32 = 0x80000;

impl PmemMedium {
    fn open(path: &Path, size: u64) -> Result<PmemMedium, TierError> {
        let is_chr = std::fs::metadata(path).map(|m| m.file_type().is_char_device()).unwrap_or(false);
        let file = OpenOptions::new().read(true).write(true).create(!is_chr).open(path).map_err(|e| {
            TierError::config(path, &format!("cannot open it: {e}"), "check the path and its permissions")
        })?;
        if !is_chr && file.metadata().map(|m| m.len()).unwrap_or(0) < size {
            file.set_len(size).map_err(|e| TierError::config(path, &format!("cannot size it: {e}"), "free space"))?;
        }
        let flags = if is_chr { libc::MAP_SHARED } else { MAP_SHARED_VALIDATE | MAP_SYNC };
        // SAFETY: a fresh shared mapping of `size` bytes of a file we keep open.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(TierError::config(
                path,
                &format!("pmem: the kernel refused a DAX mapping with MAP_SYNC ({e}); this machine or file system has no usable persistent memory"),
                "mount a pmem device's file system with -o dax, or give a file on tmpfs (mode dram) or on an SSD (mode ssd)",
            ));
        }
        Ok(PmemMedium { base: p.cast(), len: size / PAGE_BYTES as u64 * PAGE_BYTES as u64, _file: file })
    }
}

impl Drop for PmemMedium {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `open`.
        unsafe { libc::munmap(self.base.cast(), self.len as usize) };
    }
}

impl Medium for PmemMedium {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if offset + buf.len() as u64 > self.len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: in bounds (checked); the page is not being written (see the Sync impl).
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset as usize), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if offset + data.len() as u64 > self.len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: in bounds (checked); only this leader writes these pages.
        unsafe {
            let dst = self.base.add(offset as usize);
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            flush_lines(dst, data.len());
        }
        Ok(())
    }
    fn write_vectored_at(&self, offset: u64, bufs: &[&[u8]]) -> io::Result<()> {
        let mut at = offset;
        for b in bufs {
            self.write_at(at, b)?;
            at += b.len() as u64;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a store fence has no memory-safety preconditions.
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            // SAFETY: msync of our own mapping.
            if unsafe { libc::msync(self.base.cast(), self.len as usize, libc::MS_SYNC) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Write the cache lines of `p..p + n` back to persistent memory.
unsafe fn flush_lines(p: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = p as usize & !63;
        let mut a = start;
        while a < p as usize + n {
            // SAFETY: `a` is inside the mapping (a line of the range just written).
            unsafe { std::arch::x86_64::_mm_clflush(a as *const u8) };
            a += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_is_dram_and_a_disk_file_system_is_ssd() {
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(detect(Path::new("/dev/shm/farcache-tier-probe")).unwrap(), Mode::Dram);
        }
        let dir = tempfile::tempdir().unwrap();
        let m = detect(&dir.path().join("t")).unwrap();
        assert!(matches!(m, Mode::Ssd | Mode::Dram | Mode::Pmem));
    }

    /// A new ssd tier file is written once: no extent of it is left unwritten (each would
    /// cost a metadata commit at its first write).
    #[test]
    fn a_new_ssd_tier_file_has_no_unwritten_extents() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let p = dir.path().join("t");
        if detect(&p).unwrap() != Mode::Ssd {
            return; // the source tree is on tmpfs here: nothing to test
        }
        let size = (8 << 20) + 4096;
        let m = open(&p, Mode::Ssd, size).unwrap();
        assert_eq!(m.len(), size);
        let out = std::process::Command::new("filefrag").arg("-v").arg(&p).output().expect("filefrag (e2fsprogs) runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "filefrag -v: {text}");
        let extents =
            text.lines().filter(|l| l.trim_start().chars().next().is_some_and(|c| c.is_ascii_digit())).count();
        assert!(extents > 0, "filefrag listed no extent: {text}");
        assert!(!text.contains("unwritten"), "extents left unwritten:\n{text}");
    }

    #[test]
    fn an_ssd_tier_on_a_disk_file_system_round_trips_with_o_direct() {
        use crate::{Append, Entry, FileKey, Log, Page};
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let p = dir.path().join("t");
        if detect(&p).unwrap() != Mode::Ssd {
            return; // the source tree is on tmpfs here: nothing to test
        }
        let put = |log: &Log, b: u64| {
            let mut page = Page::zeroed();
            page.0.fill(b as u8 + 1);
            let e = Entry::Data { key: FileKey(1), block: b, valid: 4096, page };
            log.append(Append {
                entries: vec![e],
                names: vec![(FileKey(1), std::sync::Arc::from(&b"n"[..]))],
                reserve: false,
                lazy: false,
            })
            .unwrap();
        };
        let (log, r) = Log::open(open(&p, Mode::Ssd, 4 << 20).unwrap(), Mode::Ssd, Some("b")).unwrap();
        assert!(r.formatted);
        // Formatting wrote every page once: no extent is left "unwritten" (whose first write
        // would cost a journal commit in the fdatasync after it).
        if let Ok(out) = std::process::Command::new("filefrag").arg("-v").arg(&p).output() {
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && text.contains(" found") {
                assert!(!text.contains("unwritten"), "{text}");
            }
        }
        for b in 0..10 {
            put(&log, b);
        }
        drop(log);
        let (log, r) = Log::open(open(&p, Mode::Ssd, 4 << 20).unwrap(), Mode::Ssd, Some("b")).unwrap();
        assert_eq!((r.formatted, r.records), (false, 10));
        let (page, _) = log.read_block(FileKey(1), 7).unwrap().unwrap();
        assert!(page.0.iter().all(|&x| x == 8));
    }

    /// A vectored write lands as one write of the buffers' concatenation, on a file written
    /// plainly (dram) and with `O_DIRECT` (ssd), from pages allocated apart.
    #[test]
    fn a_vectored_write_lands_as_the_concatenation_of_its_pages() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        for mode in [Mode::Dram, Mode::Ssd] {
            let p = dir.path().join(format!("{mode}"));
            if mode == Mode::Ssd && detect(&p).unwrap() != Mode::Ssd {
                continue; // the source tree is on tmpfs here: no O_DIRECT
            }
            let m = open(&p, mode, 1 << 20).unwrap();
            let pages: Vec<Box<crate::Page>> = (0..70u8)
                .map(|i| {
                    let mut pg = crate::Page::zeroed();
                    pg.0.fill(i + 1);
                    pg
                })
                .collect();
            let bufs: Vec<&[u8]> = pages.iter().map(|p| &p.0[..]).collect();
            m.write_vectored_at(3 * 4096, &bufs).unwrap();
            m.flush().unwrap();
            let mut back = crate::page::zeroed(72);
            m.read_at(2 * 4096, crate::page::bytes_mut(&mut back)).unwrap();
            assert!(back[0].0.iter().all(|&x| x == 0), "{mode}: before the write");
            for (i, pg) in back[1..71].iter().enumerate() {
                assert!(pg.0.iter().all(|&x| x == i as u8 + 1), "{mode}: page {i}");
            }
            assert!(back[71].0.iter().all(|&x| x == 0), "{mode}: after the write");
        }
    }

    #[test]
    fn pmem_is_refused_clearly_where_there_is_no_dax() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        if mounted_with_dax(dir.path()) {
            return; // a real DAX file system: nothing to refuse
        }
        let e = open(&p, Mode::Pmem, 1 << 20).err().expect("MAP_SYNC on a file system without DAX must fail");
        assert!(e.to_string().contains("pmem") && e.to_string().contains("fix:"), "{e}");
    }
}
