//! [`DirectPath`]: the data path with no tier in front of the disk. Reads and writes go to
//! the backing file (reads with `O_DIRECT` where enabled and supported). It is the
//! `--no-remote` baseline and the fallback every other tier ends in.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::backing::{BackingFile, ReadMode};
use crate::data_path::DataPath;
use crate::identity::FileId;
use crate::latency::{Latency, LatencySnapshot};

/// Counters of the backing I/O (names in docs/METRICS.md once the mount exports them).
#[derive(Debug, Default)]
pub struct BackingCounters {
    pub reads_direct: AtomicU64,
    pub reads_buffered: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
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
    pub write_bytes: u64,
    pub fsyncs: u64,
    pub forgets: u64,
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
            write_bytes: l(&self.write_bytes),
            fsyncs: l(&self.fsyncs),
            forgets: l(&self.forgets),
            read_latency: self.read_latency.snapshot(),
            write_latency: self.write_latency.snapshot(),
        }
    }
}

/// Backing I/O only.
#[derive(Debug, Default)]
pub struct DirectPath {
    counters: BackingCounters,
}

impl DirectPath {
    pub fn new() -> DirectPath {
        DirectPath::default()
    }

    pub fn counters(&self) -> &BackingCounters {
        &self.counters
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl DataPath for DirectPath {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        let t = Instant::now();
        let (data, mode) = file.read_at(offset, len)?;
        self.counters.read_latency.record(t.elapsed());
        match mode {
            ReadMode::Direct => add(&self.counters.reads_direct, 1),
            ReadMode::Buffered => add(&self.counters.reads_buffered, 1),
        }
        add(&self.counters.read_bytes, data.len() as u64);
        Ok(data)
    }

    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        let t = Instant::now();
        let n = file.write_at(offset, data)?;
        self.counters.write_latency.record(t.elapsed());
        add(&self.counters.writes, 1);
        add(&self.counters.write_bytes, n as u64);
        Ok(n)
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
        if datasync {
            file.file().sync_data()
        } else {
            file.file().sync_all()
        }
    }

    fn forget(&self, _id: &FileId) {
        // Nothing is cached here; counted so tests can see the FUSE layer reports deletions.
        add(&self.counters.forgets, 1);
    }

    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        Some(self.counters.snapshot())
    }
}
