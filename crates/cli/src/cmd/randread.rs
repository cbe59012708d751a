//! `farcache randread FILE`: 4 KiB reads at aligned random offsets, the same sequence in
//! every pass, timed per pass — the paper's random-read experiment in one command, for a
//! quick look at a mount (`make run` uses it). With `--direct` (the default) every read
//! bypasses the local page cache and reaches the mount, as on a host whose page cache is too
//! small for the file; `--verify FILE` compares every block with another copy (the backing
//! file), so a wrong byte is an error, not a number. `--json` prints the result as one JSON
//! object on stdout (the per-pass lines go to stderr), for scripts such as scripts/run-demo.sh.
//!
//! Verification is kept out of the timed loop: during a pass each block read gets a 64-bit
//! fingerprint (well under a microsecond per 4 KiB), and after the pass the other copy is read
//! in offset order and compared. Reading the other copy between two timed reads would leave
//! the disk idle meanwhile, and a rate-capped disk (a blkio throttle, a cloud volume's IOPS
//! limit) banks idle time as credit: the timed reads would then run faster than the disk can.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use farcache_config::ByteSize;
use serde::Serialize;

/// Largest block size accepted.
const MAX_BLOCK: u64 = 1 << 20;
/// Most passes.
const MAX_PASSES: u32 = 100;

#[derive(clap::Args)]
pub struct Args {
    /// File to read (e.g. a file on a farcache mount).
    file: PathBuf,
    /// Bytes to read per pass (default: the whole file). Offsets repeat if larger.
    #[arg(long)]
    size: Option<ByteSize>,
    /// Size of each read; a multiple of 4KiB.
    #[arg(long, default_value = "4KiB")]
    block: ByteSize,
    /// Passes over the same random sequence.
    #[arg(long, default_value_t = 2)]
    passes: u32,
    /// Seed of the random sequence.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Read through the page cache instead of with O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Compare every block read with the same range of this file.
    #[arg(long, value_name = "FILE")]
    verify: Option<PathBuf>,
    /// Print the result as one JSON object on stdout; the per-pass lines go to stderr.
    #[arg(long)]
    json: bool,
}

/// The whole run, as `--json` prints it.
#[derive(Serialize)]
struct Report {
    file: PathBuf,
    block_bytes: u64,
    reads_per_pass: u64,
    direct: bool,
    verified: bool,
    passes: Vec<PassReport>,
}

/// One pass. `secs` is the time spent in the reads (verification excluded); latencies are
/// of single reads, in microseconds.
#[derive(Serialize)]
struct PassReport {
    pass: u32,
    secs: f64,
    reads_per_sec: f64,
    mib_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    mean_us: f64,
}

/// A page-aligned buffer for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("valid layout");
        // SAFETY: len > 0 (checked by the caller); freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let block = a.block.0;
    if block == 0 || !block.is_multiple_of(4096) || block > MAX_BLOCK {
        bail!("--block {}: must be a multiple of 4KiB, at most 1MiB", a.block);
    }
    if a.passes == 0 || a.passes > MAX_PASSES {
        bail!("--passes {}: must be 1..={MAX_PASSES}", a.passes);
    }
    let mut opts = OpenOptions::new();
    opts.read(true);
    if !a.buffered {
        opts.custom_flags(libc::O_DIRECT);
    }
    let file = opts.open(&a.file).with_context(|| format!("opening {}", a.file.display()))?;
    let len = file.metadata()?.len();
    let blocks = len / block;
    if blocks == 0 {
        bail!("{} is smaller than one block ({block} bytes)", a.file.display());
    }
    let verify = match &a.verify {
        Some(p) => Some(File::open(p).with_context(|| format!("opening {}", p.display()))?),
        None => None,
    };
    let size = a.size.map(|s| s.0).unwrap_or(blocks * block);
    let reads = size.div_ceil(block).max(1);
    // The offsets: a xorshift sequence, the same in every pass.
    let mut x = a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let offsets: Vec<u64> = (0..reads)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % blocks) * block
        })
        .collect();
    // Human-readable lines: stdout, or stderr when stdout carries the JSON.
    let say = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(format!(
        "randread {}: {} reads of {} per pass at random aligned offsets ({}), {} passes",
        a.file.display(),
        reads,
        ByteSize(block),
        if a.buffered { "through the page cache" } else { "O_DIRECT" },
        a.passes
    ));
    let mut buf = Aligned::new(block as usize);
    let mut want = vec![0u8; block as usize];
    // Per read of the pass: (bytes read, fingerprint of them).
    let mut got: Vec<(usize, u64)> = Vec::with_capacity(if verify.is_some() { offsets.len() } else { 0 });
    let mut lat = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    let mut report = Report {
        file: a.file.clone(),
        block_bytes: block,
        reads_per_pass: reads,
        direct: !a.buffered,
        verified: verify.is_some(),
        passes: Vec::new(),
    };
    // The reads in offset order, for verification (the other copy is then read front to back).
    let mut by_offset: Vec<usize> = if verify.is_some() { (0..offsets.len()).collect() } else { Vec::new() };
    by_offset.sort_by_key(|&i| offsets[i]);
    for pass in 1..=a.passes {
        lat.reset();
        got.clear();
        let t0 = Instant::now();
        for &off in &offsets {
            let t = Instant::now();
            let n = file.read_at(buf.buf(), off).with_context(|| format!("read at {off}"))?;
            lat.saturating_record(t.elapsed().as_micros() as u64);
            if verify.is_some() {
                got.push((n, fingerprint(&buf.buf()[..n])));
            }
        }
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        if let Some(v) = &verify {
            // (offset, (length, fingerprint)) of the other copy's block last read: an offset
            // drawn twice is read once.
            let mut last: Option<(u64, (usize, u64))> = None;
            for &i in &by_offset {
                let off = offsets[i];
                let expect = match last {
                    Some((o, e)) if o == off => e,
                    _ => {
                        let m = v.read_at(&mut want, off).with_context(|| format!("verify read at {off}"))?;
                        let e = (m, fingerprint(&want[..m]));
                        last = Some((off, e));
                        e
                    }
                };
                if got[i] != expect {
                    bail!(
                        "pass {pass}: the {} bytes read at offset {off} differ from {}",
                        got[i].0,
                        a.verify.as_ref().unwrap().display()
                    );
                }
            }
        }
        let p = PassReport {
            pass,
            secs,
            reads_per_sec: reads as f64 / secs,
            mib_per_sec: (reads * block) as f64 / secs / (1 << 20) as f64,
            p50_us: lat.value_at_quantile(0.5),
            p99_us: lat.value_at_quantile(0.99),
            max_us: lat.max(),
            mean_us: lat.mean(),
        };
        say(format!(
            "pass {pass}: {:.2} s, {:.0} reads/s, {:.1} MiB/s, latency p50 {} us, p99 {} us{}",
            p.secs,
            p.reads_per_sec,
            p.mib_per_sec,
            p.p50_us,
            p.p99_us,
            if verify.is_some() { ", every block verified" } else { "" }
        ));
        report.passes.push(p);
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// A 64-bit fingerprint of `data` (whose length is a multiple of 8: blocks are multiples of
/// 4 KiB; a shorter tail is folded in byte by byte). Each step maps the state through a
/// bijection keyed by one word, so two inputs that differ in a single word always differ
/// here; other differences collide with probability about 2^-64. Not for adversaries: the
/// engine authenticates what lenders return; this catches wrong bytes.
fn fingerprint(data: &[u8]) -> u64 {
    const K: u64 = 0xff51_afd7_ed55_8ccd;
    let mut h = 0x9E37_79B9_7F4A_7C15 ^ data.len() as u64;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(K).rotate_left(31);
    }
    for &b in words.remainder() {
        h = (h ^ b as u64).wrapping_mul(K).rotate_left(31);
    }
    // fmix64 (MurmurHash3's finaliser): every input bit reaches every output bit.
    h ^= h >> 33;
    h = h.wrapping_mul(K);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::fingerprint;

    #[test]
    fn fingerprint_sees_any_single_changed_byte() {
        let mut x = 7u64;
        let block: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let base = fingerprint(&block);
        assert_eq!(base, fingerprint(&block.clone()));
        for i in (0..4096).step_by(97) {
            let mut b = block.clone();
            b[i] ^= 1;
            assert_ne!(fingerprint(&b), base, "byte {i}");
        }
        assert_ne!(fingerprint(&block[..4088]), base, "a short read");
        assert_ne!(fingerprint(&[0u8; 4096]), fingerprint(&[0u8; 4088]));
    }
}
