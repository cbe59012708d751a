//! `farcache randread FILE`: 4 KiB reads at aligned random offsets, the same sequence in
//! every pass, timed per pass — the paper's random-read experiment in one command, for a
//! quick look at a mount (`make run` uses it). With `--direct` (the default) every read
//! bypasses the local page cache and reaches the mount, as on a host whose page cache is too
//! small for the file; `--verify FILE` compares every block with another copy (the backing
//! file), so a wrong byte is an error, not a number.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use farcache_config::ByteSize;

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
    println!(
        "randread {}: {} reads of {} per pass at random aligned offsets ({}), {} passes",
        a.file.display(),
        reads,
        ByteSize(block),
        if a.buffered { "through the page cache" } else { "O_DIRECT" },
        a.passes
    );
    let mut buf = Aligned::new(block as usize);
    let mut want = vec![0u8; block as usize];
    let mut lat = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    for pass in 1..=a.passes {
        lat.reset();
        let t0 = Instant::now();
        for &off in &offsets {
            let t = Instant::now();
            let n = file.read_at(buf.buf(), off).with_context(|| format!("read at {off}"))?;
            lat.saturating_record(t.elapsed().as_micros() as u64);
            if let Some(v) = &verify {
                let m = v.read_at(&mut want, off).with_context(|| format!("verify read at {off}"))?;
                if n != m || buf.buf()[..n] != want[..m] {
                    bail!(
                        "pass {pass}: the {n} bytes at offset {off} differ from {}",
                        a.verify.as_ref().unwrap().display()
                    );
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "pass {pass}: {:.2} s, {:.0} reads/s, {:.1} MiB/s, latency p50 {} us, p99 {} us{}",
            secs,
            reads as f64 / secs,
            (reads * block) as f64 / secs / (1 << 20) as f64,
            lat.value_at_quantile(0.5),
            lat.value_at_quantile(0.99),
            if verify.is_some() { ", every block verified" } else { "" }
        );
    }
    Ok(())
}
