//! Paper 001 reproduced (issue 14): load balancing between two disks by migrating files,
//! read from the cache (lenders' RAM) rather than from the busy disk.
//!
//! The testbed's disk and a second one ([`Testbed::add_disk`]), both throttled by the run's
//! disk profile (`--profile hdd`: the paper's HDDs), as the two branches of one mount
//! (`farcache mount DISK1:DISK2 MNT`, lenders, paper 000's threshold routing). Per
//! configuration — copy source (`cache`, `disk`) × foreground threads — from a fresh setup
//! (files written again on the first disk, both file systems remounted cold, new lenders and
//! mount):
//! 1. `migrate_files` files of [`FILE_BYTES`] on disk 1 (the paper: 1,024 × 4 MiB);
//! 2. warm: every file read once, in random order, through the mount, so that the lenders
//!    (which hold about half of them: [`lender_bytes`]) keep the most recently read;
//! 3. the foreground: T threads of random whole-file reads (each file read start to end in
//!    [`READ_BYTES`] O_DIRECT requests, every block checked) — the harness's own readers
//!    stand in for FFSB, with per-second throughput;
//! 4. before: `migrate_phase_secs` of foreground alone (all files on one disk);
//! 5. the migration, foreground running: `farcache balance MNT --from 0 --to 1 --files N/2
//!    --source S`, which moves the recently read files whose blocks lenders hold first;
//! 6. after: `migrate_phase_secs` more (half of the files on each disk).
//!
//! Sampled every second: each loop device's /proc/diskstats (io_ticks, sectors read and
//! written) and the daemon's per-branch I/O time (`union.branch_busy_ms`), which is what
//! shows a throttled loop device's load (its io_ticks barely move: load.rs). The inode
//! numbers of every file are checked before and after.

use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::IoContext;
use crate::progress::Progress;
use crate::{BenchError, Result};

use super::mount::MountDaemon;
use super::report::{PaperReport, Verdict};
use super::testbed::{cpu_idle_steal_ticks, ExtraDisk, Testbed};
use super::worker::{fill_block, AlignedBuf, BLOCK};
use super::{sys, Experiment, PaperOptions, MIB};

/// Each file's size (the paper's).
pub const FILE_BYTES: u64 = 4 * MIB;
/// One foreground read: 31 blocks, the largest below paper 000's 32-block threshold, so that
/// lenders answer what they hold (a read of 32 blocks or more always goes to the disk).
pub const READ_BYTES: usize = 31 * BLOCK;
// The foreground's reads stay below paper 000's 32-block threshold.
const _: () = assert!(READ_BYTES / BLOCK < 32 && READ_BYTES.is_multiple_of(BLOCK));

/// Most files a configuration makes.
pub const MAX_FILES: u64 = 65_536;
/// Longest wait for one migration.
const MIGRATION_LIMIT: Duration = Duration::from_secs(3600);

/// The foreground's throughput in each phase, MB/s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Phases {
    pub before: Option<f64>,
    pub early: Option<f64>,
    pub middle: Option<f64>,
    pub late: Option<f64>,
    pub after: Option<f64>,
    /// Over the whole migration (the issue's "during"; the thirds show its shape).
    pub during: Option<f64>,
    /// What the two disks read, together, before and after (MB/s): the foreground's share that
    /// more disks can speed up — the rest is the lender's.
    pub disk_before: Option<f64>,
    pub disk_after: Option<f64>,
    /// What the lenders gave the mount before and after (MB/s), and the share of the blocks
    /// asked of them that they had evicted (the index still listed them).
    pub lender_before: Option<f64>,
    pub lender_after: Option<f64>,
    pub lender_miss_before: Option<f64>,
    pub lender_miss_after: Option<f64>,
    /// The machine's CPU busy (stolen time included) before, during and after, as a share of
    /// all its CPU time; and the share the hypervisor stole during.
    pub cpu_busy_before: Option<f64>,
    pub cpu_busy_during: Option<f64>,
    pub cpu_busy_after: Option<f64>,
    pub steal_during: Option<f64>,
}

/// One reading, taken every second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the foreground started.
    pub t_secs: f64,
    /// Bytes the foreground read so far.
    pub fg_bytes: u64,
    /// Per disk (1, 2): io_ticks (ms), bytes read, bytes written, so far.
    pub io_ticks_ms: [u64; 2],
    pub read_bytes: [u64; 2],
    pub write_bytes: [u64; 2],
    /// Per branch: the daemon's I/O time there so far (ms; `union.branch_busy_ms`).
    pub daemon_busy_ms: [u64; 2],
    /// The mount's counters so far (`farcache stats`): blocks its lenders gave (the copy's
    /// included) and fetched blocks they did not have (`remote.hits`, `remote.misses`: a
    /// miss is a block the index listed that the lender had evicted), and reads the mount
    /// sent to the disk whole (`engine.disk_reads`) or in part (`engine.partial_hits`).
    #[serde(default)]
    pub lender_hits: u64,
    #[serde(default)]
    pub lender_misses: u64,
    #[serde(default)]
    pub disk_reads: u64,
    #[serde(default)]
    pub partial_reads: u64,
    /// The machine's CPU time so far, its idle part and the part the hypervisor stole
    /// (clock ticks, `/proc/stat`): on two vCPUs the copy's CPU is the foreground's.
    #[serde(default)]
    pub cpu_ticks: u64,
    #[serde(default)]
    pub cpu_idle_ticks: u64,
    #[serde(default)]
    pub steal_ticks: u64,
}

/// One configuration: copy source × foreground threads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MigrateRecord {
    /// "cache" or "disk".
    pub source: String,
    pub threads: u32,
    pub files: u64,
    pub file_bytes: u64,
    /// The warm pass.
    pub warm_secs: f64,
    /// Files the balance planned, and moved.
    pub planned: u64,
    pub moved: u64,
    /// The daemon's time for the migration (`farcache balance`'s `elapsed_ms`), and the
    /// command's wall time.
    pub migration_secs: f64,
    pub migration_wall_secs: f64,
    pub blocks_from_cache: u64,
    pub blocks_from_disk: u64,
    /// Seconds since the foreground started at which the migration began and ended.
    pub migration_start_secs: f64,
    pub migration_end_secs: f64,
    pub mbps: Phases,
    /// Inode numbers compared before and after, and how many differed.
    pub inodes_checked: u64,
    pub inodes_changed: u64,
    /// Foreground reads, and blocks whose contents were wrong.
    pub reads: u64,
    pub wrong_blocks: u64,
    pub samples: Vec<Sample>,
    /// `farcache balance --json`'s final status.
    pub balance: Option<Value>,
    pub error: Option<String>,
}

/// The lenders' room: a little more than half of the files (about the half read last
/// stays), so that the foreground also keeps the first disk busy with misses.
pub fn lender_bytes(files: u64) -> u64 {
    (files / 2 * FILE_BYTES) * 9 / 8 + 16 * MIB
}

/// The lender's size in a run: `--lender-capacity`, else [`lender_bytes`].
pub fn lender_of(o: &PaperOptions) -> u64 {
    o.migrate_lender_bytes.unwrap_or_else(|| lender_bytes(o.migrate_files))
}

/// Room on each disk.
pub fn disk_bytes(o: &PaperOptions) -> u64 {
    o.migrate_files * FILE_BYTES * 5 / 4
}

fn name(i: u64) -> String {
    format!("f{i:05}")
}

/// Run every configuration; a configuration that fails is recorded and the others still
/// run; configurations found in `o.migrate_resume` (an earlier run's) are kept, not run.
pub(super) fn run_experiment(
    tb: &mut Testbed,
    o: &PaperOptions,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    if !(2..=MAX_FILES).contains(&o.migrate_files) {
        return Err(BenchError::Setup(format!("--migrate-files: 2 to {MAX_FILES}")));
    }
    let disk2 = tb.add_disk("disk2", o.disk_bytes())?;
    for source in &o.migrate_sources {
        for &threads in &o.migrate_threads {
            bar.message(format!("migrate {source} {threads} threads"));
            if let Some(r) = o.migrate_resume.iter().find(|r| {
                r.source == *source && r.threads == threads && r.files == o.migrate_files && r.error.is_none()
            }) {
                note!("paper: [migrate {source} {threads}] done in an earlier run, kept");
                report.migrate_runs.push(r.clone());
                progress(report);
                bar.inc(1);
                continue;
            }
            let rec = match one(tb, &disk2, o, source, threads) {
                Ok(r) => r,
                Err(e) if sys::interrupted() => return Err(e),
                Err(e) => MigrateRecord {
                    source: source.clone(),
                    threads,
                    files: o.migrate_files,
                    file_bytes: FILE_BYTES,
                    error: Some(e.to_string()),
                    ..MigrateRecord::default()
                },
            };
            match &rec.error {
                Some(e) => note!("paper: [migrate {source} {threads}] FAILED: {e}"),
                None => note!(
                    "paper: [migrate {source} {threads}] {} of {} files moved in {:.1} s ({} blocks from cache, {} \
                     from disk); MB/s before {} during {}/{}/{} after {}",
                    rec.moved,
                    rec.planned,
                    rec.migration_secs,
                    rec.blocks_from_cache,
                    rec.blocks_from_disk,
                    f1(rec.mbps.before),
                    f1(rec.mbps.early),
                    f1(rec.mbps.middle),
                    f1(rec.mbps.late),
                    f1(rec.mbps.after)
                ),
            }
            report.migrate_runs.push(rec);
            progress(report);
            bar.inc(1);
        }
    }
    Ok(())
}

fn f1(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.1}"))
}

/// A share as a percentage (one decimal).
fn pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// Empty a disk's file system (the earlier configuration's files and union state).
fn empty(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).ctx(|| format!("list {}", dir.display()))?.flatten() {
        if e.file_name() == "lost+found" {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).ctx(|| format!("remove {}", p.display()))?;
        } else {
            std::fs::remove_file(&p).ctx(|| format!("remove {}", p.display()))?;
        }
    }
    Ok(())
}

/// Write `path` with O_DIRECT from the harness (not throttled, nothing left cached):
/// block b is [`fill_block`]`(b)`.
fn write_file(path: &Path, size: u64) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ctx(|| format!("create {}", path.display()))?;
    let mut buf = AlignedBuf::new(size as usize);
    for (i, blk) in buf.as_mut_slice().chunks_mut(BLOCK).enumerate() {
        fill_block(i as u64, blk);
    }
    f.write_all(&buf.as_mut_slice()[..size as usize]).ctx(|| format!("write {}", path.display()))?;
    f.sync_all().ctx(|| format!("fsync {}", path.display()))
}

/// Whether `data`, read at block `b` of a file, starts with the right word.
fn block_ok(b: u64, data: &[u8]) -> bool {
    let mut w = [0u8; 8];
    fill_block(b, &mut w);
    data.len() < 8 || data[..8] == w
}

/// Counters the readers share.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    bytes: AtomicU64,
    reads: AtomicU64,
    wrong: AtomicU64,
    error: std::sync::Mutex<Option<String>>,
}

/// Read file `path` start to end in [`READ_BYTES`] O_DIRECT requests, checking each block.
fn read_whole(path: &Path, buf: &mut AlignedBuf, s: &Shared) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)?;
    let mut off = 0u64;
    loop {
        let b = &mut buf.as_mut_slice()[..READ_BYTES];
        let n = f.read_at(b, off)?;
        if n == 0 {
            return Ok(());
        }
        for (i, blk) in b[..n].chunks(BLOCK).enumerate() {
            if !block_ok(off / BLOCK as u64 + i as u64, blk) {
                s.wrong.fetch_add(1, Ordering::Relaxed);
            }
        }
        s.bytes.fetch_add(n as u64, Ordering::Relaxed);
        s.reads.fetch_add(1, Ordering::Relaxed);
        off += n as u64;
        if s.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

/// A mutex's guard, poisoned or not (a reader that panicked still leaves its counters).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// xorshift64: the readers' choice of file.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `threads` readers of random whole files under `mnt` until `s.stop`.
fn start_readers(mnt: &Path, files: u64, threads: u32, seed: u64, s: &Arc<Shared>) -> Vec<std::thread::JoinHandle<()>> {
    (0..threads)
        .map(|t| {
            let (mnt, s) = (mnt.to_path_buf(), s.clone());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(READ_BYTES);
                let mut x = seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1)) | 1;
                while !s.stop.load(Ordering::Relaxed) {
                    let i = next(&mut x) % files;
                    if let Err(e) = read_whole(&mnt.join(name(i)), &mut buf, &s) {
                        *lock(&s.error) = Some(format!("reading {} through the mount: {e}", name(i)));
                        return;
                    }
                }
            })
        })
        .collect()
}

/// The warm pass: every file once, in a random order, by `threads` readers.
fn warm(mnt: &Path, files: u64, threads: u32, seed: u64) -> Result<f64> {
    let t = Instant::now();
    let mut order: Vec<u64> = (0..files).collect();
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        order.swap(i, (next(&mut x) % (i as u64 + 1)) as usize);
    }
    let order = Arc::new(order);
    let at = Arc::new(AtomicU64::new(0));
    let s = Arc::new(Shared::default());
    let hs: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let (order, at, s, mnt) = (order.clone(), at.clone(), s.clone(), mnt.to_path_buf());
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::new(READ_BYTES);
                loop {
                    let k = at.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&i) = order.get(k) else { return };
                    if let Err(e) = read_whole(&mnt.join(name(i)), &mut buf, &s) {
                        *lock(&s.error) = Some(format!("warm pass, {}: {e}", name(i)));
                        return;
                    }
                }
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    if let Some(e) = lock(&s.error).take() {
        return Err(BenchError::Setup(e));
    }
    if s.wrong.load(Ordering::Relaxed) > 0 {
        return Err(BenchError::Setup(format!("warm pass: {} wrong blocks", s.wrong.load(Ordering::Relaxed))));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// io_ticks (ms), bytes read and written of block device `dev`, from /proc/diskstats.
fn diskstats(text: &str, dev: &str) -> (u64, u64, u64) {
    let name = dev.trim_start_matches("/dev/");
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 12 && f[2] == name).then(|| {
                let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
                (n(12), n(5) * 512, n(9) * 512)
            })
        })
        .unwrap_or_default()
}

/// The mount's counters from `farcache stats MNT --json` (zeros when it does not answer).
fn mount_counters(exe: &Path, mnt: &Path) -> Value {
    let out = sys::run_with_timeout(
        &exe.to_string_lossy(),
        &["stats", &mnt.to_string_lossy(), "--json"],
        Duration::from_secs(5),
    );
    out.ok().and_then(|o| serde_json::from_str(o.trim()).ok()).unwrap_or_default()
}

fn sample(t0: Instant, devs: [&str; 2], exe: &Path, mnt: &Path, s: &Shared) -> Sample {
    let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let (a, b) = (diskstats(&text, devs[0]), diskstats(&text, devs[1]));
    let t_secs = t0.elapsed().as_secs_f64();
    let fg_bytes = s.bytes.load(Ordering::Relaxed);
    let (cpu_ticks, cpu_idle_ticks, steal_ticks) =
        cpu_idle_steal_ticks(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
    let v = mount_counters(exe, mnt);
    let c = |section: &str, k: &str| v[section][k].as_u64().unwrap_or(0);
    let busy = |i: usize| v["union"]["branch_busy_ms"][i].as_u64().unwrap_or(0);
    Sample {
        t_secs,
        fg_bytes,
        io_ticks_ms: [a.0, b.0],
        read_bytes: [a.1, b.1],
        write_bytes: [a.2, b.2],
        daemon_busy_ms: [busy(0), busy(1)],
        lender_hits: c("remote", "hits"),
        lender_misses: c("remote", "misses"),
        disk_reads: c("engine", "disk_reads"),
        partial_reads: c("engine", "partial_hits"),
        cpu_ticks,
        cpu_idle_ticks,
        steal_ticks,
    }
}

/// Foreground bytes read by time `t` (linear between samples).
fn bytes_at(samples: &[Sample], t: f64) -> Option<f64> {
    let i = samples.iter().position(|x| x.t_secs >= t)?;
    let b = &samples[i];
    if i == 0 || b.t_secs == t {
        return Some(b.fg_bytes as f64);
    }
    let a = &samples[i - 1];
    let w = (t - a.t_secs) / (b.t_secs - a.t_secs);
    Some(a.fg_bytes as f64 + w * (b.fg_bytes as f64 - a.fg_bytes as f64))
}

/// Foreground MB/s between `a` and `b` seconds.
pub fn mbps(samples: &[Sample], a: f64, b: f64) -> Option<f64> {
    if b <= a {
        return None;
    }
    Some((bytes_at(samples, b)? - bytes_at(samples, a)?) / (b - a) / 1e6)
}

/// The change per second of `count` between the samples nearest after `a` and nearest
/// before `b` (the counters are read once a second; no interpolation).
fn rate(samples: &[Sample], a: f64, b: f64, count: impl Fn(&Sample) -> u64) -> Option<f64> {
    let first = samples.iter().find(|s| s.t_secs >= a)?;
    let last = samples.iter().rev().find(|s| s.t_secs <= b)?;
    let dt = last.t_secs - first.t_secs;
    (dt > 0.0).then(|| count(last).saturating_sub(count(first)) as f64 / dt)
}

/// MB/s both disks read between `a` and `b` seconds.
pub fn disk_mbps(samples: &[Sample], a: f64, b: f64) -> Option<f64> {
    rate(samples, a, b, |s| s.read_bytes.iter().sum()).map(|r| r / 1e6)
}

/// MB/s the lenders gave the mount between `a` and `b` seconds.
pub fn lender_mbps(samples: &[Sample], a: f64, b: f64) -> Option<f64> {
    rate(samples, a, b, |s| s.lender_hits * BLOCK as u64).map(|r| r / 1e6)
}

/// Of the blocks the mount asked its lenders for between `a` and `b` seconds, the share
/// they no longer held (the index listed them; the lender had evicted them).
pub fn lender_miss_share(samples: &[Sample], a: f64, b: f64) -> Option<f64> {
    let hits = rate(samples, a, b, |s| s.lender_hits)?;
    let misses = rate(samples, a, b, |s| s.lender_misses)?;
    (hits + misses > 0.0).then(|| misses / (hits + misses))
}

/// `part`'s share of the machine's CPU time between `a` and `b` seconds.
fn share_of_cpu(samples: &[Sample], a: f64, b: f64, part: impl Fn(&Sample) -> u64) -> Option<f64> {
    let all = rate(samples, a, b, |s| s.cpu_ticks)?;
    (all > 0.0).then(|| rate(samples, a, b, part).unwrap_or(0.0) / all)
}

/// The machine's busy share of its CPU time between `a` and `b` seconds.
fn cpu_busy(samples: &[Sample], a: f64, b: f64) -> Option<f64> {
    share_of_cpu(samples, a, b, |s| s.cpu_ticks.saturating_sub(s.cpu_idle_ticks))
}

/// The phases of a record's samples.
pub fn phases(samples: &[Sample], m0: f64, m1: f64) -> Phases {
    let end = samples.last().map_or(0.0, |s| s.t_secs);
    let third = (m1 - m0) / 3.0;
    Phases {
        before: mbps(samples, 0.0, m0),
        early: mbps(samples, m0, m0 + third),
        middle: mbps(samples, m0 + third, m0 + 2.0 * third),
        late: mbps(samples, m0 + 2.0 * third, m1),
        after: mbps(samples, m1, end),
        during: mbps(samples, m0, m1),
        disk_before: disk_mbps(samples, 0.0, m0),
        disk_after: disk_mbps(samples, m1, end),
        lender_before: lender_mbps(samples, 0.0, m0),
        lender_after: lender_mbps(samples, m1, end),
        lender_miss_before: lender_miss_share(samples, 0.0, m0),
        lender_miss_after: lender_miss_share(samples, m1, end),
        cpu_busy_before: cpu_busy(samples, 0.0, m0),
        cpu_busy_during: cpu_busy(samples, m0, m1),
        cpu_busy_after: cpu_busy(samples, m1, end),
        steal_during: share_of_cpu(samples, m0, m1, |s| s.steal_ticks),
    }
}

/// One configuration from a fresh setup.
fn one(tb: &mut Testbed, disk2: &ExtraDisk, o: &PaperOptions, source: &str, threads: u32) -> Result<MigrateRecord> {
    let n = o.migrate_files;
    empty(&tb.ext4)?;
    empty(&disk2.dir)?;
    for i in 0..n {
        sys::check_interrupt()?;
        write_file(&tb.ext4.join(name(i)), FILE_BYTES)?;
    }
    tb.remount()?;
    disk2.remount()?;
    let mem = tb.memory_cgroup(Some(o.memory_bytes))?;
    let mut lenders = tb.start_lenders(lender_of(o), o.policy.as_deref())?;
    let log = tb.logs.join(format!("migrate-{source}-{threads}.mount.log"));
    let routing = o.routing.as_deref().or(Some("threshold"));
    let branches = [tb.ext4.as_path(), disk2.dir.as_path()];
    let mut mount =
        MountDaemon::for_union(tb, o, &branches, Some(&lenders.addrs), routing, &[], &[&mem, &tb.blkio], &log)?;
    let mnt = tb.mnt.clone();
    let inos = |what: &str| -> Result<Vec<u64>> {
        (0..n)
            .map(|i| Ok(std::fs::metadata(mnt.join(name(i))).ctx(|| format!("stat {} {what}", name(i)))?.ino()))
            .collect()
    };
    let before_inos = inos("before the migration")?;
    let warm_secs = warm(&mnt, n, threads, o.seed)?;

    let s = Arc::new(Shared::default());
    let t0 = Instant::now();
    let devs = [tb.loopdev.as_str(), disk2.loopdev.as_str()];
    let samples = Arc::new(std::sync::Mutex::new(vec![sample(t0, devs, &o.exe, &mnt, &s)]));
    let sampler = {
        let (samples, s, exe, mnt, devs) =
            (samples.clone(), s.clone(), o.exe.clone(), mnt.clone(), [devs[0].to_string(), devs[1].to_string()]);
        std::thread::spawn(move || {
            let mut k = 1u32;
            while !s.stop.load(Ordering::Relaxed) {
                let due = t0 + Duration::from_secs(k as u64);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                k += 1;
                let x = sample(t0, [&devs[0], &devs[1]], &exe, &mnt, &s);
                lock(&samples).push(x);
            }
        })
    };
    let readers = start_readers(&mnt, n, threads, o.seed ^ threads as u64, &s);
    let stop = |readers: Vec<std::thread::JoinHandle<()>>| {
        s.stop.store(true, Ordering::Relaxed);
        for r in readers {
            let _ = r.join();
        }
    };
    let phase = Duration::from_secs(o.migrate_phase_secs);
    if let Err(e) = sys::sleep_checked(phase) {
        stop(readers);
        let _ = sampler.join();
        return Err(e);
    }
    let m0 = t0.elapsed().as_secs_f64();
    lock(&samples).push(sample(t0, devs, &o.exe, &mnt, &s));
    let (mnt_s, files) = (mnt.to_string_lossy().to_string(), (n / 2).to_string());
    let argv = [
        "balance",
        &mnt_s,
        "--from",
        "0",
        "--to",
        "1",
        "--files",
        &files,
        "--source",
        source,
        "--window-ms",
        "100",
        "--json",
    ];
    let out = sys::run_with_timeout(&o.exe.to_string_lossy(), &argv, MIGRATION_LIMIT);
    let m1 = t0.elapsed().as_secs_f64();
    lock(&samples).push(sample(t0, devs, &o.exe, &mnt, &s));
    let after = if out.is_ok() { sys::sleep_checked(phase) } else { Ok(()) };
    stop(readers);
    let _ = sampler.join();
    let out = out?;
    after?;
    if let Some(e) = lock(&s.error).take() {
        return Err(BenchError::Setup(e));
    }
    let balance: Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| BenchError::Setup(format!("farcache balance printed no status: {out}")))?;
    let after_inos = inos("after the migration")?;
    // The sampler's and the boundary readings, in time order (each is stamped before its
    // `farcache stats` call, pushed after it).
    let mut samples = std::mem::take(&mut *lock(&samples));
    samples.sort_by(|a, b| a.t_secs.total_cmp(&b.t_secs));
    let g = |k: &str| balance[k].as_u64().unwrap_or(0);
    let rec = MigrateRecord {
        source: source.into(),
        threads,
        files: n,
        file_bytes: FILE_BYTES,
        warm_secs,
        planned: balance["planned"].as_array().map_or(0, |a| a.len() as u64),
        moved: g("moved"),
        migration_secs: g("elapsed_ms") as f64 / 1000.0,
        migration_wall_secs: m1 - m0,
        blocks_from_cache: g("blocks_from_cache"),
        blocks_from_disk: g("blocks_from_disk"),
        migration_start_secs: m0,
        migration_end_secs: m1,
        mbps: phases(&samples, m0, m1),
        inodes_checked: n,
        inodes_changed: before_inos.iter().zip(&after_inos).filter(|(a, b)| a != b).count() as u64,
        reads: s.reads.load(Ordering::Relaxed),
        wrong_blocks: s.wrong.load(Ordering::Relaxed),
        samples,
        balance: Some(balance),
        error: None,
    };
    mount.stop();
    lenders.stop();
    Ok(rec)
}

/// The successful record of (source, threads).
fn get<'a>(r: &'a PaperReport, source: &str, threads: u32) -> Option<&'a MigrateRecord> {
    r.migrate_runs.iter().find(|x| x.source == source && x.threads == threads && x.error.is_none())
}

/// Migration time from cache ÷ from disk, for `threads`.
pub fn time_ratio(r: &PaperReport, threads: u32) -> Option<f64> {
    let (c, d) = (get(r, "cache", threads)?, get(r, "disk", threads)?);
    (d.migration_secs > 0.0).then(|| c.migration_secs / d.migration_secs)
}

/// Sanity checks: every planned file moved, every block read right, inode numbers kept,
/// and the cache copies took blocks from lenders.
pub fn checks(r: &PaperReport) -> Vec<Verdict> {
    let mut v = Vec::new();
    for x in &r.migrate_runs {
        let tag = format!("migrate {} {} threads", x.source, x.threads);
        if let Some(e) = &x.error {
            v.push(Verdict { what: format!("{tag}: ran"), measured: e.clone(), ok: false });
            continue;
        }
        v.push(Verdict {
            what: format!("{tag}: every planned file moved (half of them)"),
            measured: format!("{} of {} planned, of {} files", x.moved, x.planned, x.files),
            ok: x.planned == x.files / 2 && x.moved == x.planned,
        });
        v.push(Verdict {
            what: format!("{tag}: every block read right, inode numbers unchanged"),
            measured: format!(
                "{} wrong blocks in {} reads; {} of {} inode numbers changed",
                x.wrong_blocks, x.reads, x.inodes_changed, x.inodes_checked
            ),
            ok: x.wrong_blocks == 0 && x.reads > 0 && x.inodes_changed == 0 && x.inodes_checked == x.files,
        });
        let cache = x.source == "cache";
        v.push(Verdict {
            what: format!("{tag}: blocks copied from lenders {}", if cache { "> 0" } else { "= 0" }),
            measured: format!("{} from cache, {} from disk", x.blocks_from_cache, x.blocks_from_disk),
            ok: if cache { x.blocks_from_cache > 0 } else { x.blocks_from_cache == 0 },
        });
    }
    v
}

/// The issue's targets.
pub fn targets(r: &PaperReport) -> Vec<Verdict> {
    let o = &r.options;
    let mut v = Vec::new();
    for &t in &o.migrate_threads {
        if let Some(x) = time_ratio(r, t) {
            v.push(Verdict {
                what: format!("migrate {t} threads: from cache ≤ 0.70× the time from disk"),
                measured: format!("{x:.2}×"),
                ok: x <= 0.70,
            });
        }
        for src in &o.migrate_sources {
            let Some(x) = get(r, src, t) else { continue };
            let p = &x.mbps;
            // The issue's measure is the whole migration; the lowest third is reported beside it
            // (stricter, and at 1 thread as much the order of the reads as the copy).
            if let (Some(b), Some(d)) = (p.before, p.during) {
                let lo = [p.early, p.middle, p.late].into_iter().flatten().reduce(f64::min);
                v.push(Verdict {
                    what: format!("migrate {src} {t} threads: foreground during the migration ≥ 90% of before"),
                    measured: format!(
                        "during {d:.1} MB/s, before {b:.1} MB/s ({:.0}%; lowest third {})",
                        100.0 * d / b.max(1e-9),
                        lo.map_or("–".into(), |lo| format!("{:.0}%", 100.0 * lo / b.max(1e-9)))
                    ),
                    ok: d >= 0.9 * b,
                });
            }
            if t >= 2 {
                if let (Some(b), Some(a)) = (p.before, p.after) {
                    let disks = p.disk_before.zip(p.disk_after).map_or(String::new(), |(db, da)| {
                        format!("; the disks' reads {da:.1} vs {db:.1} MB/s ({:.2}×)", da / db.max(1e-9))
                    });
                    v.push(Verdict {
                        what: format!("migrate {src} {t} threads: two disks ≥ 1.8× one disk after the migration"),
                        measured: format!("{a:.1} vs {b:.1} MB/s ({:.2}×){disks}", a / b.max(1e-9)),
                        ok: a >= 1.8 * b,
                    });
                }
            }
        }
    }
    v
}

/// A sparkline of per-second shares (0..=1).
fn spark(xs: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    xs.iter().map(|x| BARS[((x.clamp(0.0, 1.0) * 7.0).round()) as usize]).collect()
}

/// Per-second busy shares of branch `b` by the daemon's measure, and by io_ticks.
fn utilization(samples: &[Sample], b: usize) -> (Vec<f64>, Vec<f64>) {
    let mut daemon = Vec::new();
    let mut ticks = Vec::new();
    for w in samples.windows(2) {
        let dt = ((w[1].t_secs - w[0].t_secs) * 1000.0).max(1.0);
        if dt < 500.0 {
            continue; // a boundary reading, not a second
        }
        daemon.push(w[1].daemon_busy_ms[b].saturating_sub(w[0].daemon_busy_ms[b]) as f64 / dt);
        ticks.push(w[1].io_ticks_ms[b].saturating_sub(w[0].io_ticks_ms[b]) as f64 / dt);
    }
    (daemon, ticks)
}

/// The markdown section.
pub fn render(s: &mut String, r: &PaperReport) {
    use std::fmt::Write;
    let o = &r.options;
    if !o.experiments.contains(&Experiment::Migrate) {
        return;
    }
    let _ = writeln!(
        s,
        "## migrate ({}): migration between two disks, from cache vs from disk\n\n{} files × 4 MiB on disk 1 of two \
         loop devices ({}), a lender of {}, random whole-file reads ({} KiB O_DIRECT requests) by \
         the foreground; {} s before, then `farcache balance --files {}` from disk 1 to disk 2, then {} s after. \
         Each configuration from a fresh setup.\n",
        Experiment::Migrate.table(),
        o.migrate_files,
        o.profile.describe(),
        super::human(lender_of(o)),
        READ_BYTES / 1024,
        o.migrate_phase_secs,
        o.migrate_files / 2,
        o.migrate_phase_secs
    );
    let _ = writeln!(
        s,
        "| threads | from cache s | from disk s | cache/disk | blocks from cache (cache run) | from disk (cache run) |\n\
         |---:|---:|---:|---:|---:|---:|"
    );
    for &t in &o.migrate_threads {
        let (c, d) = (get(r, "cache", t), get(r, "disk", t));
        let _ = writeln!(
            s,
            "| {t} | {} | {} | {} | {} | {} |",
            f1(c.map(|x| x.migration_secs)),
            f1(d.map(|x| x.migration_secs)),
            time_ratio(r, t).map_or("–".into(), |x| format!("{x:.2}")),
            c.map_or("–".into(), |x| x.blocks_from_cache.to_string()),
            c.map_or("–".into(), |x| x.blocks_from_disk.to_string())
        );
    }
    let _ = writeln!(
        s,
        "\nForeground MB/s (the paper's Fig. 11-c and Fig. 17): before (one disk), the migration's thirds, after \
         (two disks); during is the whole migration; the disks' reads are both disks' MB/s before and after (the \
         lender serves the rest), the lenders' what the mount got from them, and their misses the share of blocks \
         asked of them that they had evicted; CPU busy is the machine's (both vCPUs, stolen time included).\n\n| source \
         | threads | before | early | middle | late | during | after | after/before | disks' reads before / after | \
         lenders' before / after | lenders' misses before / after | CPU busy before / during / after |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for x in &r.migrate_runs {
        if let Some(e) = &x.error {
            let _ =
                writeln!(s, "| {} | {} | failed: {} | | | | | | | | | | |", x.source, x.threads, e.replace('|', "/"));
            continue;
        }
        let p = &x.mbps;
        let ratio = p.before.zip(p.after).map(|(b, a)| a / b.max(1e-9));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} / {} / {} |",
            x.source,
            x.threads,
            f1(p.before),
            f1(p.early),
            f1(p.middle),
            f1(p.late),
            f1(p.during),
            f1(p.after),
            ratio.map_or("–".into(), |v| format!("{v:.2}")),
            f1(p.disk_before),
            f1(p.disk_after),
            f1(p.lender_before),
            f1(p.lender_after),
            pct(p.lender_miss_before),
            pct(p.lender_miss_after),
            pct(p.cpu_busy_before),
            pct(p.cpu_busy_during),
            pct(p.cpu_busy_after)
        );
    }
    let _ = writeln!(
        s,
        "\nEach disk's utilization, one character per second (the paper's Figs. 14–16), by the daemon's I/O time on \
         the branch (a throttled loop device's io_ticks barely move; shown below it). The migration ran from `[` \
         to `]`.\n\n```"
    );
    for x in r.migrate_runs.iter().filter(|x| x.error.is_none()) {
        for b in 0..2 {
            let (daemon, ticks) = utilization(&x.samples, b);
            let (m0, m1) = (x.migration_start_secs.floor() as usize, x.migration_end_secs.ceil() as usize);
            let mark = |xs: &[f64]| {
                let mut line = String::new();
                for (i, c) in spark(xs).chars().enumerate() {
                    if i == m0 {
                        line.push('[');
                    }
                    line.push(c);
                    if i + 1 == m1 {
                        line.push(']');
                    }
                }
                line
            };
            let _ = writeln!(s, "{:>5} T={} disk{} daemon {}", x.source, x.threads, b + 1, mark(&daemon));
            let _ = writeln!(s, "{:>5} T={} disk{} ticks  {}", x.source, x.threads, b + 1, mark(&ticks));
        }
    }
    let _ = writeln!(s, "```\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: f64, mb: u64) -> Sample {
        Sample { t_secs: t, fg_bytes: mb * 1_000_000, ..Sample::default() }
    }

    #[test]
    fn phases_interpolate_between_samples() {
        // 10 MB/s before 10 s, 4 MB/s during 10..16 s, 20 MB/s after.
        let s = vec![at(0.0, 0), at(5.0, 50), at(10.0, 100), at(13.0, 112), at(16.0, 124), at(20.0, 204)];
        let p = phases(&s, 10.0, 16.0);
        assert!((p.before.unwrap() - 10.0).abs() < 1e-9);
        assert!((p.early.unwrap() - 4.0).abs() < 1e-9 && (p.late.unwrap() - 4.0).abs() < 1e-9);
        assert!((p.after.unwrap() - 20.0).abs() < 1e-9);
        assert!((p.during.unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(mbps(&s, 3.0, 3.0), None);
        assert_eq!(mbps(&s, 0.0, 30.0), None, "beyond the last sample");
        // The disks' reads: disk 1 alone at 2 MB/s, then both at 3 MB/s each.
        let d = |t: f64, a: u64, b: u64| Sample { t_secs: t, read_bytes: [a * 1_000_000, b * 1_000_000], ..at(t, 0) };
        let s = vec![d(0.0, 0, 0), d(5.0, 10, 0), d(10.0, 20, 0), d(12.0, 26, 6), d(14.0, 32, 12)];
        assert!((disk_mbps(&s, 0.0, 10.0).unwrap() - 2.0).abs() < 1e-9);
        assert!((disk_mbps(&s, 10.0, 14.0).unwrap() - 6.0).abs() < 1e-9);
        assert_eq!(disk_mbps(&s, 11.0, 11.5), None, "no two samples between");
        // The lenders: 250 blocks a second with 50 misses, then 500 with none.
        let l = |t: f64, hits: u64, misses: u64| Sample { lender_hits: hits, lender_misses: misses, ..at(t, 0) };
        let s = vec![l(0.0, 0, 0), l(4.0, 1000, 200), l(6.0, 2000, 200)];
        assert!((lender_mbps(&s, 0.0, 4.0).unwrap() - 250.0 * 4096.0 / 1e6).abs() < 1e-9);
        assert!((lender_miss_share(&s, 0.0, 4.0).unwrap() - 200.0 / 1200.0).abs() < 1e-9);
        assert_eq!(lender_miss_share(&s, 4.0, 6.0), Some(0.0));
        assert_eq!(lender_miss_share(&[l(0.0, 5, 5), l(1.0, 5, 5)], 0.0, 1.0), None, "nothing asked");
        // The machine's CPU: 200 ticks a second, idle 150 of them, then 20 (10 stolen).
        let c = |t: f64, all: u64, idle: u64, steal: u64| Sample {
            cpu_ticks: all,
            cpu_idle_ticks: idle,
            steal_ticks: steal,
            ..at(t, 0)
        };
        let s = vec![c(0.0, 0, 0, 0), c(2.0, 400, 300, 0), c(3.0, 600, 320, 10)];
        assert!((cpu_busy(&s, 0.0, 2.0).unwrap() - 0.25).abs() < 1e-9);
        assert!((cpu_busy(&s, 2.0, 3.0).unwrap() - 0.9).abs() < 1e-9);
        assert!((share_of_cpu(&s, 2.0, 3.0, |x| x.steal_ticks).unwrap() - 0.05).abs() < 1e-9);
        assert_eq!(cpu_busy(&[c(0.0, 5, 5, 0), c(1.0, 5, 5, 0)], 0.0, 1.0), None, "no ticks");
    }

    #[test]
    fn diskstats_fields_and_sparklines() {
        let text =
            "   7       0 loop0 10 0 80 5 20 0 160 9 0 1234 14 0 0 0 0\n   7       1 loop1 1 0 8 0 2 0 16 0 0 5 0\n";
        assert_eq!(diskstats(text, "/dev/loop0"), (1234, 80 * 512, 160 * 512));
        assert_eq!(diskstats(text, "/dev/loop1"), (5, 8 * 512, 16 * 512));
        assert_eq!(diskstats(text, "/dev/loop9"), (0, 0, 0));
        assert_eq!(spark(&[0.0, 0.5, 1.0, 2.0]), "▁▅██");
        assert_eq!(lender_bytes(1024), 512 * FILE_BYTES * 9 / 8 + 16 * MIB);
    }
}
