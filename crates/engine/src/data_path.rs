//! The seam between the FUSE layer and the cache engine: every byte of file data that goes
//! through the mount passes through one [`DataPath`].
//!
//! Three implementations: [`crate::DirectPath`] (backing I/O only, the `--no-remote`
//! baseline), [`crate::cached::CachedPath`], which answers reads from lenders' RAM where it
//! can and falls back to a `DataPath` underneath, and [`crate::writeback::WritebackPath`], the
//! persistent write-back tier over either — the same shape as mountpoint-s3's `DataCache`
//! implementations layered over one another.

use std::io;

use bytes::Bytes;

use crate::backing::BackingFile;
use crate::direct::BackingCountersSnapshot;
use crate::identity::FileId;

/// What the FUSE layer asks of the data path.
///
/// Contract:
/// - Every method is synchronous and may block (on the disk or, later, the network within a
///   configured bound); it is called from several FUSE worker threads at once, also for the
///   same file.
/// - Errors are the backing file's own (`io::Error` with an OS error code, which the FUSE
///   layer hands to the application as errno). A tier in front of the disk never turns its
///   own failure into an error: it answers from the disk instead.
/// - The disk is the truth. A method that changes file data returns only once the backing
///   file has the change, and once no cached copy of the old data can be read any more —
///   except under a write-back tier ([`crate::writeback::WritebackPath`]), where a write
///   returns once it is durable in the tier, which then answers for the blocks it holds.
/// - The caller guarantees that `file` stays open for the duration of the call, and that it
///   was opened with the access the operation needs (read for `read`, write for the rest).
pub trait DataPath: Send + Sync + 'static {
    /// Up to `len` bytes of `file` at `offset`; fewer only at end of file. `len` is at most
    /// [`crate::MAX_READ_BYTES`].
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes>;

    /// [`DataPath::read`], with `meanwhile` run while the read is on its way: a path that
    /// reads the disk through the I/O engine submits the read, runs `meanwhile`, then waits
    /// for the read — so a caller overlaps its own wait (a lender fetch for the other blocks
    /// of one request) with the disk's, on one thread. `meanwhile` runs at most once; it may
    /// not have run when this returns an error ([`crate::io::Meanwhile`]). The default runs
    /// it first, then reads.
    fn read_while(
        &self,
        file: &BackingFile,
        offset: u64,
        len: usize,
        meanwhile: &mut crate::io::Meanwhile<'_>,
    ) -> io::Result<Bytes> {
        meanwhile.run();
        self.read(file, offset, len)
    }

    /// [`DataPath::read`], with when it started and ended: for a caller that times the read
    /// (the adaptive rule's measurements). A path that times its reads anyway
    /// ([`crate::DirectPath`], for its latency histogram) gives its own two clock reads, so
    /// the caller takes none of its own; the default reads the clock around
    /// [`DataPath::read`].
    fn read_timed(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<(Bytes, ReadTime)> {
        let start = std::time::Instant::now();
        let data = self.read(file, offset, len)?;
        Ok((data, ReadTime { start, end: std::time::Instant::now() }))
    }

    /// Work a read left for after its answer: the caller of [`DataPath::read`] (the FUSE
    /// layer, once its reply is sent) calls this on the same thread, so that a measurement the
    /// read found due — a stream probe of the lenders, which takes a 1 MiB fetch — does not
    /// hold the answer up. A path with nothing left does nothing (the default); a path whose
    /// caller never calls this does the work at its next read on that thread instead.
    fn after_reply(&self) {}

    /// Write all of `data` at `offset` through to the backing file; returns `data.len()`.
    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize>;

    /// Write each `(offset, data)` of `writes` (ranges that do not overlap) as
    /// [`DataPath::write`] writes one. A path over the I/O engine submits them together, so
    /// the disk gets them as one queue (the destager's merged runs of a file). On an error
    /// some may have been written and others not; as for `write`, nothing cached of any of
    /// the ranges can be read afterwards. The default writes them one after another.
    fn write_many(&self, file: &BackingFile, writes: &[(u64, &[u8])]) -> io::Result<()> {
        for (offset, data) in writes {
            self.write(file, *offset, data)?;
        }
        Ok(())
    }

    /// Set the file's size (truncate or extend). Data past the new size is gone.
    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()>;

    /// `fallocate(2)` with `mode` on `offset..offset + len`. Modes that change contents
    /// (punch hole, zero range, collapse or insert range) count as writes of what they change.
    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()>;

    /// `fsync(2)` (`datasync == false`) or `fdatasync(2)` of the backing file.
    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()>;

    /// `syncfs(2)` of the file system `fs` (a file or directory open on it) is on: every
    /// write made there becomes durable, and a write-back error of any file on it since `fs`
    /// was opened is reported. A write-back tier's destage round makes many files durable
    /// with one of these instead of a flush of each.
    fn sync_fs(&self, fs: &std::fs::File) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::syncfs(fs.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The application asked for the writes just made to `file` to be synchronous (`O_SYNC`,
    /// `O_DSYNC`, `RWF_DSYNC`): make them durable before they are acknowledged. The default
    /// does nothing: a path that writes through to the backing file opened it with the
    /// application's `O_SYNC`/`O_DSYNC`. A write-back tier that acknowledges writes before
    /// they are durable in it commits them here.
    fn sync_writes(&self, file: &BackingFile) -> io::Result<()> {
        let _ = file;
        Ok(())
    }

    /// The inode named by `id` lost its last name (unlinked, or replaced by a rename): no
    /// new open can reach it. Handles still open may read it until they close, and must get
    /// its real contents. Called after the change, at most once per name lost.
    fn forget(&self, id: &FileId);

    /// The file `id` has no name left and the kernel has forgotten it, so no process has it
    /// open: its data will never be read again. A tier holding data of it that is not yet on
    /// the backing store may drop that data instead of writing it back. Called after
    /// [`DataPath::forget`], at most once per file.
    fn discard(&self, id: &FileId) {
        let _ = id;
    }

    /// `file` was just opened through the mount (open or create). A tier that caches may
    /// check here whether the file changed behind the mount since it last saw it (close-to-
    /// open consistency for changes made directly on the backing directory).
    fn opened(&self, file: &BackingFile) {
        let _ = file;
    }

    /// The counters of the backing I/O underneath, if this path (or the path it wraps) keeps
    /// them. For stats; cheap (a few atomic loads).
    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        None
    }

    /// The I/O engine of the disk underneath, if this path (or the path it wraps) has one:
    /// for other writers of the backing store (a migration's copy) to go through the same
    /// engine, its queue, bounds and counters.
    fn io_engine(&self) -> Option<std::sync::Arc<crate::IoEngine>> {
        None
    }

    /// Read `len` bytes of `file` at `offset` from the disk for a copy of the file (a
    /// migration between backing branches; a copy from the cache takes
    /// [`DataPath::copy_read_held`] first): blocks a write-back tier holds dirty come from the
    /// tier (the disk lacks them), nothing is filled. The bytes are the file's current
    /// contents, as [`DataPath::read`]'s are. `offset` is block-aligned.
    fn copy_read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        let t0 = std::time::Instant::now();
        let data = self.read(file, offset, len)?;
        let disk_blocks = data.len().div_ceil(crate::index::BLOCK_BYTES as usize) as u64;
        Ok(CopyRead { data, disk_blocks, disk_time: t0.elapsed(), ..CopyRead::default() })
    }

    /// The part of [`DataPath::copy_read`] that tiers in front of the disk give, without
    /// reading the disk: `data` holds the range (`len` bytes, or fewer at the end of the
    /// file) with every block a tier gave in place, and `missing` the spans still to read —
    /// each with [`DataPath::copy_read`], which also takes the blocks a write-back tier holds
    /// dirty — whose bytes replace what `data` has there. A copy that
    /// gives the disk back to the applications between its disk reads goes on with the
    /// cached part meanwhile. The default holds nothing: the whole range is missing.
    fn copy_read_held(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        let _ = file;
        let missing = if len == 0 { Vec::new() } else { vec![(offset, len)] };
        Ok(CopyRead { missing, ..CopyRead::default() })
    }

    /// Blocks of the file `id` that a tier in front of the disk holds (to prefer such files
    /// for a migration). Walks one file's entry: not for the data path.
    fn cached_blocks(&self, id: &FileId) -> u64 {
        let _ = id;
        0
    }

    /// The file `id` is about to be replaced by `copy` (a synced copy of its current contents
    /// on another backing branch; `id` does not change), and nothing will be written to it
    /// before the switch ([`DataPath::moved`]) or the move is given up. A tier holding data
    /// of the file that the disk lacks records, durably, that the file may be `copy` after
    /// a crash, so that it finds the file whichever copy the move's journal keeps. An error
    /// gives the move up (the file stays where it is). Called outside the mount's gate.
    fn moving(&self, id: &FileId, copy: &std::fs::File) -> io::Result<()> {
        let _ = (id, copy);
        Ok(())
    }

    /// The file `id` now lives in `file`, a copy with the same contents (it moved between
    /// backing branches; `id` did not change): cached blocks stay valid, and the next open
    /// must not take the move for a change behind the mount's back. A tier writes the file's
    /// data back to `file` from now on. Called under the mount's gate: no I/O beyond a few
    /// system calls on descriptors.
    fn moved(&self, id: &FileId, file: &std::fs::File) {
        let _ = (id, file);
    }

    /// Whether every byte written through this path is in the backing files (no tier in
    /// front holds data the disk lacks): what the backing file says of its holes and data
    /// (`SEEK_HOLE`/`SEEK_DATA`) is then the truth.
    fn backing_is_complete(&self) -> bool {
        true
    }
}

/// When a read ([`DataPath::read_timed`]) started and ended.
#[derive(Clone, Copy, Debug)]
pub struct ReadTime {
    pub start: std::time::Instant,
    pub end: std::time::Instant,
}

impl ReadTime {
    /// How long the read took.
    pub fn took(&self) -> std::time::Duration {
        self.end.saturating_duration_since(self.start)
    }
}

/// What [`DataPath::copy_read`] read, and from where.
#[derive(Clone, Debug, Default)]
pub struct CopyRead {
    pub data: Bytes,
    /// Whole blocks taken from a tier in front of the disk (lenders, or the write-back tier:
    /// these include `tier_blocks`).
    pub cache_blocks: u64,
    /// Blocks read from the disk (a short last block counts as one).
    pub disk_blocks: u64,
    /// Of `cache_blocks`, those the write-back tier held (dirty there: the disk lacks them).
    pub tier_blocks: u64,
    /// Time spent reading the disk (what a copy that gives way to the applications' I/O
    /// weighs its waits by: the time it held the disk, not the time it fetched from lenders).
    pub disk_time: std::time::Duration,
    /// From [`DataPath::copy_read_held`]: the spans (offset, length) not read yet.
    pub missing: Vec<(u64, usize)>,
}

/// A shared data path is a data path (the mount keeps an `Arc` of the stack for its control
/// socket, and a tier wraps a clone of it).
impl<T: DataPath + ?Sized> DataPath for std::sync::Arc<T> {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        (**self).read(file, offset, len)
    }
    fn read_while(
        &self,
        file: &BackingFile,
        offset: u64,
        len: usize,
        meanwhile: &mut crate::io::Meanwhile<'_>,
    ) -> io::Result<Bytes> {
        (**self).read_while(file, offset, len, meanwhile)
    }
    fn read_timed(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<(Bytes, ReadTime)> {
        (**self).read_timed(file, offset, len)
    }
    fn after_reply(&self) {
        (**self).after_reply()
    }
    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        (**self).write(file, offset, data)
    }
    fn write_many(&self, file: &BackingFile, writes: &[(u64, &[u8])]) -> io::Result<()> {
        (**self).write_many(file, writes)
    }
    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        (**self).set_len(file, size)
    }
    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        (**self).fallocate(file, mode, offset, len)
    }
    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        (**self).fsync(file, datasync)
    }
    fn sync_fs(&self, fs: &std::fs::File) -> io::Result<()> {
        (**self).sync_fs(fs)
    }
    fn sync_writes(&self, file: &BackingFile) -> io::Result<()> {
        (**self).sync_writes(file)
    }
    fn forget(&self, id: &FileId) {
        (**self).forget(id)
    }
    fn discard(&self, id: &FileId) {
        (**self).discard(id)
    }
    fn opened(&self, file: &BackingFile) {
        (**self).opened(file)
    }
    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        (**self).backing_counters()
    }
    fn io_engine(&self) -> Option<std::sync::Arc<crate::IoEngine>> {
        (**self).io_engine()
    }
    fn copy_read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        (**self).copy_read(file, offset, len)
    }
    fn copy_read_held(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        (**self).copy_read_held(file, offset, len)
    }
    fn cached_blocks(&self, id: &FileId) -> u64 {
        (**self).cached_blocks(id)
    }
    fn moving(&self, id: &FileId, copy: &std::fs::File) -> io::Result<()> {
        (**self).moving(id, copy)
    }
    fn moved(&self, id: &FileId, file: &std::fs::File) {
        (**self).moved(id, file)
    }
    fn backing_is_complete(&self) -> bool {
        (**self).backing_is_complete()
    }
}

/// A data path that becomes another once it is ready: until [`Deferred::set`], every request
/// waits for it, at most [`Deferred::new`]'s bound, then fails with `EIO`.
///
/// For a daemon taking a mount over whose tier the running daemon still holds: its mount is
/// made (and can still be given back) before the running daemon lets go of the tier, so it
/// is made over this path, which becomes the tier once this daemon holds it. The session
/// serves only after that; the wait here is a safety net, bounded, for a request that would
/// come earlier.
/// Calls that answer no request (`forget`, `discard`, `opened`, `moved`, counters) wait as
/// well, except the counters, which read as empty meanwhile.
pub struct Deferred {
    slot: std::sync::OnceLock<std::sync::Arc<dyn DataPath>>,
    wait: std::sync::Mutex<()>,
    ready: std::sync::Condvar,
    bound: std::time::Duration,
}

impl Deferred {
    pub fn new(bound: std::time::Duration) -> Deferred {
        Deferred {
            slot: std::sync::OnceLock::new(),
            wait: std::sync::Mutex::new(()),
            ready: std::sync::Condvar::new(),
            bound,
        }
    }

    /// Make every waiting and later request go to `path`. Only the first call counts.
    pub fn set(&self, path: std::sync::Arc<dyn DataPath>) {
        let _g = self.wait.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.slot.set(path);
        self.ready.notify_all();
    }

    fn get(&self) -> io::Result<&std::sync::Arc<dyn DataPath>> {
        if let Some(p) = self.slot.get() {
            return Ok(p);
        }
        let deadline = std::time::Instant::now() + self.bound;
        let mut g = self.wait.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = self.slot.get() {
                return Ok(p);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::other(format!("the data path was not ready within {:?}", self.bound)));
            }
            g = self.ready.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn eio(e: io::Error) -> io::Error {
        tracing::error!("{e}");
        io::Error::from_raw_os_error(libc::EIO)
    }
}

impl DataPath for Deferred {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        self.get().map_err(Self::eio)?.read(file, offset, len)
    }
    fn after_reply(&self) {
        // Never waits: a read answered before the path was ready left nothing.
        if let Some(p) = self.slot.get() {
            p.after_reply();
        }
    }
    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        self.get().map_err(Self::eio)?.write(file, offset, data)
    }
    fn write_many(&self, file: &BackingFile, writes: &[(u64, &[u8])]) -> io::Result<()> {
        self.get().map_err(Self::eio)?.write_many(file, writes)
    }
    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        self.get().map_err(Self::eio)?.set_len(file, size)
    }
    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        self.get().map_err(Self::eio)?.fallocate(file, mode, offset, len)
    }
    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        self.get().map_err(Self::eio)?.fsync(file, datasync)
    }
    fn sync_fs(&self, fs: &std::fs::File) -> io::Result<()> {
        self.get().map_err(Self::eio)?.sync_fs(fs)
    }
    fn sync_writes(&self, file: &BackingFile) -> io::Result<()> {
        self.get().map_err(Self::eio)?.sync_writes(file)
    }
    fn forget(&self, id: &FileId) {
        if let Ok(p) = self.get() {
            p.forget(id)
        }
    }
    fn discard(&self, id: &FileId) {
        if let Ok(p) = self.get() {
            p.discard(id)
        }
    }
    fn opened(&self, file: &BackingFile) {
        if let Ok(p) = self.get() {
            p.opened(file)
        }
    }
    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        self.slot.get().and_then(|p| p.backing_counters())
    }
    fn io_engine(&self) -> Option<std::sync::Arc<crate::IoEngine>> {
        self.slot.get().and_then(|p| p.io_engine())
    }
    fn copy_read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        self.get().map_err(Self::eio)?.copy_read(file, offset, len)
    }
    fn copy_read_held(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<CopyRead> {
        self.get().map_err(Self::eio)?.copy_read_held(file, offset, len)
    }
    fn cached_blocks(&self, id: &FileId) -> u64 {
        self.slot.get().map_or(0, |p| p.cached_blocks(id))
    }
    fn moving(&self, id: &FileId, copy: &std::fs::File) -> io::Result<()> {
        self.get().map_err(Self::eio)?.moving(id, copy)
    }
    fn moved(&self, id: &FileId, file: &std::fs::File) {
        if let Ok(p) = self.get() {
            p.moved(id, file)
        }
    }
    fn backing_is_complete(&self) -> bool {
        // Deferred only in front of a tier (a takeover of its mount).
        self.slot.get().is_some_and(|p| p.backing_is_complete())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn file() -> (tempfile::TempDir, BackingFile) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"deferred").unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        (
            d,
            BackingFile::new(
                FileId::union(1),
                f,
                libc::O_RDWR,
                &crate::BackingOptions { direct_io: false, direct_writes: false },
            ),
        )
    }

    #[test]
    fn requests_wait_until_the_path_is_set_and_fail_after_the_bound() {
        let (_d, f) = file();
        let late = Deferred::new(Duration::from_millis(50));
        let t0 = Instant::now();
        let e = late.read(&f, 0, 8).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(late.backing_counters().is_none() && late.cached_blocks(&FileId::union(1)) == 0);

        let d = Arc::new(Deferred::new(Duration::from_secs(10)));
        let reader = {
            let d = d.clone();
            std::thread::spawn(move || {
                let (_dir, f) = file();
                d.read(&f, 0, 8).map(|b| b.to_vec())
            })
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(!reader.is_finished(), "a read must wait for the path");
        d.set(Arc::new(crate::DirectPath::new()));
        assert_eq!(reader.join().unwrap().unwrap(), b"deferred");
        assert_eq!(d.read(&f, 0, 8).unwrap().as_ref(), b"deferred");
    }
}
