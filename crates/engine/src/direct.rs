//! [`DirectPath`]: the data path with no tier in front of the disk. Reads, writes and syncs
//! go to the backing file through the [`IoEngine`] (reads with `O_DIRECT` where enabled and
//! supported). It is the `--no-remote` baseline and the fallback every other tier ends in.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::backing::{BackingFile, ReadMode, WriteMode};
use crate::data_path::{DataPath, ReadTime};
use crate::identity::FileId;
use crate::io::{IoCountersSnapshot, IoEngine, Meanwhile};
use crate::latency::{Latency, LatencySnapshot};

/// Counters of the backing I/O (names in docs/METRICS.md once the mount exports them).
#[derive(Debug, Default)]
pub struct BackingCounters {
    pub reads_direct: AtomicU64,
    pub reads_buffered: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    /// Of `writes`: written with `O_DIRECT` (the application opened the file so).
    pub writes_direct: AtomicU64,
    pub write_bytes: AtomicU64,
    pub fsyncs: AtomicU64,
    pub forgets: AtomicU64,
    /// Time of each backing read and write that succeeded.
    pub read_latency: Latency,
    pub write_latency: Latency,
}

/// A point-in-time copy of [`BackingCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackingCountersSnapshot {
    pub reads_direct: u64,
    pub reads_buffered: u64,
    pub read_bytes: u64,
    pub writes: u64,
    #[serde(default)]
    pub writes_direct: u64,
    pub write_bytes: u64,
    pub fsyncs: u64,
    pub forgets: u64,
    /// The I/O engine underneath: which one, how deep its queue got, every fallback.
    #[serde(default)]
    pub io: IoCountersSnapshot,
    #[serde(default)]
    pub read_latency: LatencySnapshot,
    #[serde(default)]
    pub write_latency: LatencySnapshot,
}

impl BackingCounters {
    pub fn snapshot(&self) -> BackingCountersSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BackingCountersSnapshot {
            reads_direct: l(&self.reads_direct),
            reads_buffered: l(&self.reads_buffered),
            read_bytes: l(&self.read_bytes),
            writes: l(&self.writes),
            writes_direct: l(&self.writes_direct),
            write_bytes: l(&self.write_bytes),
            fsyncs: l(&self.fsyncs),
            forgets: l(&self.forgets),
            io: IoCountersSnapshot::default(),
            read_latency: self.read_latency.snapshot(),
            write_latency: self.write_latency.snapshot(),
        }
    }
}

/// Backing I/O only.
#[derive(Debug, Default)]
pub struct DirectPath {
    counters: BackingCounters,
    io: Arc<IoEngine>,
}

impl DirectPath {
    /// Backing I/O through an engine with the default options (io_uring where it works).
    pub fn new() -> DirectPath {
        DirectPath::default()
    }

    /// Backing I/O through `io` (which other users of the disk may share).
    pub fn with_io(io: Arc<IoEngine>) -> DirectPath {
        DirectPath { counters: BackingCounters::default(), io }
    }

    pub fn counters(&self) -> &BackingCounters {
        &self.counters
    }

    pub fn io(&self) -> &Arc<IoEngine> {
        &self.io
    }

    /// Every backing counter, the engine's included.
    pub fn snapshot(&self) -> BackingCountersSnapshot {
        BackingCountersSnapshot { io: self.io.counters().snapshot(), ..self.counters.snapshot() }
    }

    /// Count one read of `data`, made in `mode`.
    fn count_read(&self, mode: ReadMode, data: &Bytes) {
        match mode {
            ReadMode::Direct => add(&self.counters.reads_direct, 1),
            ReadMode::Buffered => add(&self.counters.reads_buffered, 1),
        }
        add(&self.counters.read_bytes, data.len() as u64);
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl DataPath for DirectPath {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        Ok(self.read_timed(file, offset, len)?.0)
    }

    fn read_while(
        &self,
        file: &BackingFile,
        offset: u64,
        len: usize,
        meanwhile: &mut Meanwhile<'_>,
    ) -> io::Result<Bytes> {
        if !meanwhile.pending() {
            return Ok(self.read_timed(file, offset, len)?.0);
        }
        // A read overlapped with other work is not timed: its time is the longer of the two.
        let (data, mode) = file.read_at_while(&self.io, offset, len, meanwhile)?;
        self.count_read(mode, &data);
        Ok(data)
    }

    fn read_timed(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<(Bytes, ReadTime)> {
        let start = Instant::now();
        let (data, mode) = file.read_at_while(&self.io, offset, len, &mut Meanwhile::none())?;
        let time = ReadTime { start, end: Instant::now() };
        self.counters.read_latency.record(time.took());
        self.count_read(mode, &data);
        Ok((data, time))
    }

    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        let t = Instant::now();
        let mode = file.write_at(&self.io, offset, data)?;
        self.counters.write_latency.record(t.elapsed());
        if mode == WriteMode::Direct {
            add(&self.counters.writes_direct, 1);
        }
        add(&self.counters.writes, 1);
        add(&self.counters.write_bytes, data.len() as u64);
        Ok(data.len())
    }

    fn write_many(&self, file: &BackingFile, writes: &[(u64, &[u8])]) -> io::Result<()> {
        let t = Instant::now();
        let direct = file.write_many_at(&self.io, writes)?;
        // Each write of the batch was in flight for about the batch's time.
        let took = t.elapsed();
        for _ in writes {
            self.counters.write_latency.record(took);
        }
        add(&self.counters.writes_direct, direct as u64);
        add(&self.counters.writes, writes.len() as u64);
        add(&self.counters.write_bytes, writes.iter().map(|(_, d)| d.len() as u64).sum());
        Ok(())
    }

    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        file.file().set_len(size)
    }

    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        };
        loop {
            // SAFETY: plain syscall on a descriptor we keep open for the call.
            let r = unsafe { libc::fallocate(file.file().as_raw_fd(), mode, off, len) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        add(&self.counters.fsyncs, 1);
        self.io.fsync(file.file().as_fd(), datasync)
    }

    fn forget(&self, _id: &FileId) {
        // Nothing is cached here; counted so tests can see the FUSE layer reports deletions.
        add(&self.counters.forgets, 1);
    }

    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        Some(self.snapshot())
    }

    fn io_engine(&self) -> Option<Arc<IoEngine>> {
        Some(self.io.clone())
    }
}
