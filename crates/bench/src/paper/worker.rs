//! The application of the paper's experiments: `farcache bench paper-worker`, started by the
//! harness inside the client's memory and blkio cgroups (it joins them between fork and
//! exec, before it allocates anything).
//!
//! It reads the way an application does: plain `read`/`pread` through the kernel page cache
//! (no O_DIRECT), so the memory cgroup's limit is what bounds its local cache. It runs one
//! pass per `pass` line on stdin and answers each with one JSON line, so that the harness
//! can read every counter between passes:
//!
//! - `seqread`: the whole file front to back in 1 MiB reads (Table 4).
//! - `randread`: `size / 4 KiB` reads of 4 KiB at 4 KiB-aligned offsets drawn uniformly from
//!   the file, the same sequence (same seed) in every pass (Tables 5 and 6).
//! - `probe N SEED`: N 4 KiB reads at random blocks with O_DIRECT — past the page cache, so
//!   each one costs what the tier below costs (the disk, or a lender): the per-read times
//!   behind "what the hardware allows". The first quarter (at most [`PROBE_UNTIMED`]) is not
//!   timed: blkio throttling lets about one 100 ms slice's worth of I/Os through at once
//!   after an idle moment, which would flatter the disk.
//!
//! - `durable THREADS SECS [own]`: paper 003's durable small writes — THREADS threads, each a
//!   loop of one 4 KiB `pwrite` at a random block and an `fdatasync`, for SECS seconds; the
//!   latency of each pair is one sample. All in the one file, or with `own` each thread in a
//!   file of its own (FILE.N, of SIZE / THREADS bytes: the same data in all) — FUSE serialises the writes of one file
//!   (the inode lock) where a disk file system only serialises the copy into its page cache.
//!
//! Every block read is checked: its first word must be the one the harness wrote there.

use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::error::IoContext;
use crate::rng::{mix64, Rng};
use crate::{BenchError, Result};

/// The block: ext4's and farcache's.
pub const BLOCK: usize = 4096;
/// Seeds every test file's contents.
const CONTENT_SEED: u64 = 0xFA2C_AC4E_0000_0000;
/// Sequential reads are this large (what `cat`/`cp` use is 128 KiB; larger changes nothing
/// below the page cache, whose readahead makes the requests).
const SEQ_READ_BYTES: usize = 1 << 20;
/// Most untimed reads at the start of a probe.
pub const PROBE_UNTIMED: u64 = 500;

/// Fill block `b` of a test file.
pub fn fill_block(b: u64, out: &mut [u8]) {
    for (j, w) in out.chunks_mut(8).enumerate() {
        let v = mix64(CONTENT_SEED ^ (b << 9) ^ j as u64).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

/// Whether `data` (starting at block `b`) starts with the right word.
fn block_ok(b: u64, data: &[u8]) -> bool {
    let want = mix64(CONTENT_SEED ^ (b << 9)).to_le_bytes();
    data.len() < 8 || data[..8] == want
}

/// A buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(BLOCK), BLOCK).expect("layout");
        // SAFETY: a non-zero size; checked for null below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        AlignedBuf { ptr, len: len.max(BLOCK) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of len bytes, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, BLOCK).expect("layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Seqread,
    Randread,
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "seqread" => Ok(Op::Seqread),
            "randread" => Ok(Op::Randread),
            _ => Err(format!("unknown worker op {s:?}: seqread or randread")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct WorkerArgs {
    pub op: Op,
    pub file: PathBuf,
    /// The access size: bytes read per pass.
    pub size: u64,
    pub seed: u64,
}

/// One pass, as the application saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PassOutcome {
    pub secs: f64,
    pub reads: u64,
    pub bytes: u64,
    pub lat_us_mean: f64,
    pub lat_us_p50: f64,
    pub lat_us_p99: f64,
    /// Blocks whose contents were not what the harness wrote (must be 0).
    pub mismatches: u64,
}

/// Run the worker: announce, then serve `pass` / `probe N SEED` / `quit` lines from stdin.
pub fn run(a: &WorkerArgs) -> Result<()> {
    let mut file = std::fs::File::open(&a.file).ctx(|| format!("open {}", a.file.display()))?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let cg: Vec<&str> = cgroups.lines().filter(|l| l.contains(":memory:") || l.contains(":blkio:")).collect();
    let mut out = std::io::stdout().lock();
    let hello = serde_json::json!({ "ready": true, "pid": std::process::id(), "cgroups": cg });
    writeln!(out, "{hello}").and_then(|_| out.flush()).ctx(|| "write to stdout".into())?;
    let mut buf = AlignedBuf::new(SEQ_READ_BYTES);
    for line in std::io::stdin().lock().lines() {
        let line = line.ctx(|| "read stdin".into())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["pass"] => match a.op {
                Op::Seqread => serde_json::to_value(seq_pass(&mut file, &mut buf)?),
                Op::Randread => serde_json::to_value(rand_pass(&file, a.size, a.seed, &mut buf)?),
            },
            ["probe", n, seed] => {
                let n = n.parse().map_err(|_| BenchError::Setup(format!("bad probe count {n:?}")))?;
                let seed = seed.parse().map_err(|_| BenchError::Setup(format!("bad probe seed {seed:?}")))?;
                serde_json::to_value(probe(a, n, seed, &mut buf)?)
            }
            ["durable", threads, secs, rest @ ..] => {
                let threads =
                    threads.parse().map_err(|_| BenchError::Setup(format!("bad thread count {threads:?}")))?;
                let secs = secs.parse().map_err(|_| BenchError::Setup(format!("bad seconds {secs:?}")))?;
                let own = match rest {
                    [] => false,
                    ["own"] => true,
                    _ => return Err(BenchError::Setup(format!("worker: unknown command {line:?}"))),
                };
                serde_json::to_value(durable(a, threads, secs, own)?)
            }
            ["quit"] => break,
            _ => return Err(BenchError::Setup(format!("worker: unknown command {line:?}"))),
        }
        .expect("serializable");
        writeln!(out, "{answer}").and_then(|_| out.flush()).ctx(|| "write to stdout".into())?;
    }
    Ok(())
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

fn finish(h: &Histogram<u64>, start: Instant, reads: u64, bytes: u64, mismatches: u64) -> PassOutcome {
    PassOutcome {
        secs: start.elapsed().as_secs_f64(),
        reads,
        bytes,
        lat_us_mean: h.mean(),
        lat_us_p50: h.value_at_quantile(0.5) as f64,
        lat_us_p99: h.value_at_quantile(0.99) as f64,
        mismatches,
    }
}

fn seq_pass(file: &mut std::fs::File, buf: &mut AlignedBuf) -> Result<PassOutcome> {
    file.seek(SeekFrom::Start(0)).ctx(|| "seek".into())?;
    let mut h = histogram();
    let (mut reads, mut bytes, mut bad) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    loop {
        let t = Instant::now();
        let n = file.read(buf.as_mut_slice()).ctx(|| "read".into())?;
        h.saturating_record(t.elapsed().as_micros() as u64);
        if n == 0 {
            break;
        }
        // Reads of a regular file return whole requested lengths until the end, so `bytes`
        // stays block-aligned and block numbers follow from it.
        for (i, blk) in buf.as_mut_slice()[..n].chunks(BLOCK).enumerate() {
            bad += u64::from(!block_ok(bytes / BLOCK as u64 + i as u64, blk));
        }
        reads += 1;
        bytes += n as u64;
    }
    Ok(finish(&h, start, reads, bytes, bad))
}

fn rand_pass(file: &std::fs::File, size: u64, seed: u64, buf: &mut AlignedBuf) -> Result<PassOutcome> {
    let blocks = size / BLOCK as u64;
    let mut rng = Rng::new(seed);
    let mut h = histogram();
    let mut bad = 0u64;
    let b = &mut buf.as_mut_slice()[..BLOCK];
    let start = Instant::now();
    for _ in 0..blocks {
        let blk = rng.below(blocks);
        let t = Instant::now();
        file.read_exact_at(b, blk * BLOCK as u64).ctx(|| format!("read block {blk}"))?;
        h.saturating_record(t.elapsed().as_micros() as u64);
        bad += u64::from(!block_ok(blk, b));
    }
    Ok(finish(&h, start, blocks, blocks * BLOCK as u64, bad))
}

fn probe(a: &WorkerArgs, n: u64, seed: u64, buf: &mut AlignedBuf) -> Result<PassOutcome> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&a.file)
        .ctx(|| format!("open {} with O_DIRECT", a.file.display()))?;
    let blocks = a.size / BLOCK as u64;
    let mut rng = Rng::new(seed);
    let mut h = histogram();
    let mut bad = 0u64;
    let b = &mut buf.as_mut_slice()[..BLOCK];
    let untimed = (n / 4).min(PROBE_UNTIMED);
    let mut start = Instant::now();
    for i in 0..n {
        if i == untimed {
            h.reset();
            start = Instant::now();
        }
        let blk = rng.below(blocks);
        let t = Instant::now();
        f.read_exact_at(b, blk * BLOCK as u64).ctx(|| format!("O_DIRECT read of block {blk}"))?;
        h.saturating_record(t.elapsed().as_micros() as u64);
        bad += u64::from(!block_ok(blk, b));
    }
    Ok(finish(&h, start, n - untimed, (n - untimed) * BLOCK as u64, bad))
}

/// Most writer threads of `durable`.
pub const DURABLE_MAX_THREADS: usize = 256;

/// `threads` writers of 4 KiB `pwrite` + `fdatasync` pairs at random blocks of the file for
/// `secs` seconds; one latency sample per pair. The blocks written keep the file's contents
/// (each block gets what [`fill_block`] says), so reads after it still check.
fn durable(a: &WorkerArgs, threads: usize, secs: f64, own: bool) -> Result<PassOutcome> {
    if threads == 0 || threads > DURABLE_MAX_THREADS || !(0.0..=3600.0).contains(&secs) {
        return Err(BenchError::Setup(format!(
            "durable: 1 to {DURABLE_MAX_THREADS} threads and at most 3600 s, not {threads} and {secs}"
        )));
    }
    let open = |p: &std::path::Path| {
        std::fs::OpenOptions::new().read(true).write(true).open(p).ctx(|| format!("open {} for writing", p.display()))
    };
    let shared = open(&a.file)?;
    let mut files = Vec::new();
    let bytes = if own { (a.size / threads as u64).max(BLOCK as u64) } else { a.size };
    if own {
        let mut data = vec![0u8; BLOCK];
        for t in 0..threads {
            let p = a.file.with_extension(t.to_string());
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&p)
                .ctx(|| format!("create {}", p.display()))?;
            for b in 0..bytes / BLOCK as u64 {
                fill_block(b, &mut data);
                f.write_all_at(&data, b * BLOCK as u64).ctx(|| format!("write {}", p.display()))?;
            }
            f.sync_all().ctx(|| format!("fsync {}", p.display()))?;
            files.push(f);
        }
    }
    let blocks = (bytes / BLOCK as u64).max(1);
    let until = Instant::now() + std::time::Duration::from_secs_f64(secs);
    let start = Instant::now();
    let results: Vec<Result<(Histogram<u64>, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = files.get(t).unwrap_or(&shared);
                s.spawn(move || {
                    let mut rng = Rng::new(a.seed ^ mix64(t as u64 + 1));
                    let mut h = histogram();
                    let mut b = vec![0u8; BLOCK];
                    let mut n = 0u64;
                    while Instant::now() < until {
                        let blk = rng.below(blocks);
                        fill_block(blk, &mut b);
                        let t0 = Instant::now();
                        f.write_all_at(&b, blk * BLOCK as u64).ctx(|| format!("write block {blk}"))?;
                        f.sync_data().ctx(|| "fdatasync".into())?;
                        h.saturating_record(t0.elapsed().as_micros() as u64);
                        n += 1;
                    }
                    Ok((h, n))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("durable writer panicked")).collect()
    });
    let mut h = histogram();
    let mut ops = 0;
    for r in results {
        let (th, n) = r?;
        h.add(&th).map_err(|e| BenchError::Setup(format!("histogram: {e}")))?;
        ops += n;
    }
    Ok(finish(&h, start, ops, ops * BLOCK as u64, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_check_against_their_own_contents() {
        let mut b = vec![0u8; BLOCK];
        fill_block(7, &mut b);
        assert!(block_ok(7, &b));
        assert!(!block_ok(8, &b));
        let mut buf = AlignedBuf::new(3 * BLOCK);
        assert_eq!(buf.as_mut_slice().as_ptr() as usize % BLOCK, 0);
        assert_eq!(buf.as_mut_slice().len(), 3 * BLOCK);
    }

    #[test]
    fn passes_over_a_plain_file() {
        let dir = std::env::temp_dir().join(format!("paper-worker-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let mut data = vec![0u8; 64 * BLOCK];
        for (i, blk) in data.chunks_mut(BLOCK).enumerate() {
            fill_block(i as u64, blk);
        }
        std::fs::write(&path, &data).unwrap();
        let a = WorkerArgs { op: Op::Randread, file: path.clone(), size: data.len() as u64, seed: 1 };
        let mut buf = AlignedBuf::new(SEQ_READ_BYTES);
        let mut f = std::fs::File::open(&path).unwrap();
        let s = seq_pass(&mut f, &mut buf).unwrap();
        assert_eq!((s.bytes, s.mismatches), (data.len() as u64, 0));
        let r = rand_pass(&f, a.size, a.seed, &mut buf).unwrap();
        assert_eq!((r.reads, r.mismatches), (64, 0));
        assert!(r.secs > 0.0);
        let d = durable(&a, 4, 0.2, false).unwrap();
        assert!(d.reads > 0 && d.lat_us_p50 > 0.0, "{d:?}");
        let r = rand_pass(&f, a.size, a.seed, &mut buf).unwrap();
        assert_eq!(r.mismatches, 0, "durable writes keep the contents");
        let d = durable(&a, 2, 0.2, true).unwrap();
        assert!(d.reads > 0, "{d:?}");
        let own = std::fs::File::open(path.with_extension("1")).unwrap();
        assert_eq!(own.metadata().unwrap().len(), a.size / 2);
        assert_eq!(rand_pass(&own, a.size / 2, a.seed, &mut buf).unwrap().mismatches, 0);
        assert!(durable(&a, 0, 1.0, false).is_err() && durable(&a, DURABLE_MAX_THREADS + 1, 1.0, false).is_err());
        std::fs::write(&path, vec![0u8; data.len()]).unwrap();
        let r = rand_pass(&f, a.size, a.seed, &mut buf).unwrap();
        assert_eq!(r.mismatches, 64, "zeroed blocks are caught");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
