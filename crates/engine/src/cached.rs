//! [`CachedPath`]: the data path with lenders' RAM in front of the disk (paper 000's DC
//! client, in user space).
//!
//! - A read smaller than the routing threshold (random, single-block) asks the index; when
//!   every block it covers is on a lender, it is answered from there. Otherwise it reads the
//!   whole-block range from the disk, answers, and sends the full blocks it read to their
//!   lenders in the background (a *fill*).
//! - A larger read (a sequential stream's readahead) goes straight to the disk.
//! - Writes, truncates and fallocates go to the disk first; then the blocks they touched get
//!   new versions in the index (old copies become unreachable) and the old copies are deleted
//!   in the background. Nothing waits on a lender.
//! - Whatever a lender does — no answer, a late answer, a wrong-length answer, a dead
//!   connection — the read falls back to the disk within `fetch_timeout`.
//!
//! Only whole 4 KiB blocks are cached: a short block at the end of a file never is, so a file
//! that grows can never be answered with its old, shorter tail.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use farcache_policy::route::{Route, Threshold};

use crate::backing::BackingFile;
use crate::data_path::DataPath;
use crate::identity::FileId;
use crate::index::{BlockIndex, FileIndex, BLOCK_BYTES};
use crate::remote::Remote;

/// Counters of the cache engine beyond the remote tier's own.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Reads answered wholly from lenders.
    pub remote_reads: AtomicU64,
    /// Reads sent to the disk because they were large (a sequential stream).
    pub sequential_bypasses: AtomicU64,
    /// Small reads that went to the disk (something missing or not delivered).
    pub disk_reads: AtomicU64,
    /// Blocks sent to lenders after a disk read.
    pub fills: AtomicU64,
}

pub struct CachedPath<D: DataPath> {
    disk: D,
    remote: Remote,
    index: Arc<BlockIndex>,
    threshold: Threshold,
    counters: EngineCounters,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl<D: DataPath> CachedPath<D> {
    pub fn new(disk: D, remote: Remote, threshold: Threshold) -> CachedPath<D> {
        CachedPath { disk, remote, index: Arc::new(BlockIndex::new()), threshold, counters: EngineCounters::default() }
    }

    pub fn disk(&self) -> &D {
        &self.disk
    }
    pub fn remote(&self) -> &Remote {
        &self.remote
    }
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// After the disk changed bytes `offset..offset + len` of `file`.
    fn changed(&self, id: &FileId, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let f = self.index.file(id);
        let last = offset.saturating_add(len - 1) / BLOCK_BYTES;
        let gone = self.index.invalidate(&f, offset / BLOCK_BYTES, last);
        self.remote.del_async(gone);
    }

    /// Read whole blocks `first..=last` from the disk, answer `offset..offset+len` of them,
    /// and fill the lenders with the whole blocks read.
    fn read_and_fill(
        &self,
        file: &BackingFile,
        f: &Arc<FileIndex>,
        offset: u64,
        len: usize,
        first: u64,
        last: u64,
    ) -> io::Result<Bytes> {
        // Tickets before the disk read: a write landing after this point voids them.
        let tickets: Vec<_> = (first..=last).map(|b| self.index.fill_start(f, b)).collect();
        let start = first * BLOCK_BYTES;
        let data = self.disk.read(file, start, ((last - first + 1) * BLOCK_BYTES) as usize)?;
        for t in tickets {
            let from = ((t.key.block - first) * BLOCK_BYTES) as usize;
            if data.len() < from + BLOCK_BYTES as usize {
                break; // end of file: never cache a short block
            }
            if self.index.lookup(f, t.key.block) == Some(t.key) {
                continue; // already there
            }
            let block = data.slice(from..from + BLOCK_BYTES as usize);
            let (index, fi) = (self.index.clone(), f.clone());
            add(&self.counters.fills, 1);
            self.remote.put_async(t.key, block, move || {
                index.fill_done(&fi, t);
            });
        }
        let skip = (offset - start) as usize;
        Ok(if data.len() <= skip { Bytes::new() } else { data.slice(skip..data.len().min(skip + len)) })
    }
}

impl<D: DataPath> DataPath for CachedPath<D> {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> io::Result<Bytes> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        if self.threshold.route(len as u64) == Route::Disk {
            add(&self.counters.sequential_bypasses, 1);
            return self.disk.read(file, offset, len);
        }
        let first = offset / BLOCK_BYTES;
        let last = (offset + len as u64 - 1) / BLOCK_BYTES;
        let f = self.index.file(file.id());
        let keys: Option<Vec<_>> = (first..=last).map(|b| self.index.lookup(&f, b)).collect();
        if let Some(keys) = keys {
            let values = self.remote.get(&keys, BLOCK_BYTES as usize);
            if values.iter().all(|v| v.is_some()) {
                add(&self.counters.remote_reads, 1);
                let skip = (offset - first * BLOCK_BYTES) as usize;
                if values.len() == 1 {
                    let v = values.into_iter().next().flatten().expect("checked");
                    return Ok(v.slice(skip..skip + len));
                }
                let mut buf = BytesMut::with_capacity(values.len() * BLOCK_BYTES as usize);
                for v in values.into_iter().flatten() {
                    buf.extend_from_slice(&v);
                }
                return Ok(buf.freeze().slice(skip..skip + len));
            }
            // Forget what the lenders no longer have, so the next read refills at once.
            for (k, v) in keys.iter().zip(&values) {
                if v.is_none() {
                    self.index.mark_missing(&f, *k);
                }
            }
        }
        add(&self.counters.disk_reads, 1);
        self.read_and_fill(file, &f, offset, len, first, last)
    }

    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> io::Result<usize> {
        let r = self.disk.write(file, offset, data);
        self.changed(file.id(), offset, data.len() as u64);
        r
    }

    fn set_len(&self, file: &BackingFile, size: u64) -> io::Result<()> {
        let r = self.disk.set_len(file, size);
        // Everything from the block holding the new end on may have changed.
        self.changed(file.id(), size / BLOCK_BYTES * BLOCK_BYTES, u64::MAX / 2);
        r
    }

    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        let r = self.disk.fallocate(file, mode, offset, len);
        // Collapse and insert range shift everything after `offset`.
        let shifts = mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0;
        self.changed(file.id(), offset, if shifts { u64::MAX / 2 } else { len });
        r
    }

    fn fsync(&self, file: &BackingFile, datasync: bool) -> io::Result<()> {
        self.disk.fsync(file, datasync)
    }

    fn forget(&self, id: &FileId) {
        let gone = self.index.forget(id);
        self.remote.del_async(gone);
        self.disk.forget(id);
    }
}
