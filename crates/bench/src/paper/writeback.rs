//! Paper 003 (VEMS) reproduced: the write-back tier (`farcache mount --tier`) against the
//! backing alone, on the same throttled loop disk (`--profile ssd` stands in for the paper's
//! SATA SSD), each configuration from a cold start:
//!
//! - `native`: ext4 on the loop disk directly, in the client's memory cgroup;
//! - `passthrough`: `farcache mount --no-remote` (write-through, no tier);
//! - `tier-dram`: the mount with a tier file on tmpfs (`dram`: paper 003's emulation of NVM);
//! - `tier-ssd`: the mount with a tier file on the machine's own fast disk (`ssd`).
//!
//! The experiments:
//! - `postmark`: Debian's `postmark` with Table 1's three settings (small, medium, large;
//!   `postmark_scale` scales files and transactions for shorter runs). Throughput is
//!   transactions per second of wall time, measured here (postmark's own report has whole
//!   seconds only).
//! - `dfsio`: TestDFSIO-like, with fio: one file of `dfsio_bytes`, then [`DFSIO_FILES`] files
//!   of an eighth of it each by as many writers, written sequentially in 1 MiB requests and
//!   `fsync`ed at the end (a write counts once it is durable: HDFS's close is not a sync, but
//!   the tier's point is what a sync costs), then the page cache is dropped and they are read
//!   back. MB/s of wall time, fsync included.
//! - `durable`: 4 KiB `pwrite` + `fdatasync` pairs at random blocks of a 64 MiB file by 1 and
//!   by 32 writers, and by 32 writers each in a file of its own ([`super::worker`]); per-pair
//!   latency and pairs per second. (FUSE serialises one file's writes under its inode lock,
//!   so 32 writers of one file through the mount commit one by one.)
//!
//! The tier file is made (and its space reserved) by the harness, outside the client's
//! memory cgroup: a `dram` tier's pages are RAM of the machine, not of the client, as
//! persistent memory would be.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::IoContext;
use crate::progress::Progress;
use crate::{BenchError, Result};

use super::mount::MountDaemon;
use super::report::PaperReport;
use super::testbed::{DiskStat, Testbed};
use super::{human, sys, ConfigKind, Experiment, PaperOptions, MIB};

/// How many files the "several files" part of `dfsio` writes and reads, in parallel.
pub const DFSIO_FILES: u64 = 8;
/// The `durable` experiment's file.
const DURABLE_FILE_BYTES: u64 = 64 * MIB;
/// Writers of the `durable` experiment's second load.
pub const DURABLE_WRITERS: usize = 32;

/// Table 1 of paper 003: (name, smallest file, largest file, files, transactions).
pub const POSTMARK_TABLE_1: [(&str, u64, u64, u64, u64); 3] = [
    ("small", 5_000, 20_000, 30_000, 300_000),
    ("medium", 30_000, 100_000, 10_000, 500_000),
    ("large", 500_000, 1_000_000, 1_000, 200_000),
];

/// One measurement of one configuration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TierRecord {
    pub experiment: Option<Experiment>,
    pub config: Option<ConfigKind>,
    /// "small", "write 1 × 800MiB", "1 writer", …
    pub case: String,
    pub secs: f64,
    /// Transactions (postmark), bytes (dfsio) or write+fdatasync pairs (durable).
    pub ops: u64,
    /// The headline figure, higher is better: transactions/s, MB/s or pairs/s.
    pub per_sec: f64,
    pub unit: String,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// What reached the loop disk while it ran (the tier destages later, in the background).
    pub disk: DiskStat,
    /// `farcache stats MNT --json`'s `tier` section at the end of the case.
    pub tier: Option<Value>,
    pub error: Option<String>,
}

impl TierRecord {
    fn failed(exp: Experiment, cfg: ConfigKind, case: &str, error: String) -> TierRecord {
        TierRecord {
            experiment: Some(exp),
            config: Some(cfg),
            case: case.into(),
            error: Some(error),
            ..TierRecord::default()
        }
    }
}

/// Disk room the experiments need on the loop disk, beyond the fixed slack.
pub fn disk_bytes(o: &PaperOptions) -> u64 {
    let mut need = 0;
    for e in &o.experiments {
        need = need.max(match e {
            Experiment::Postmark => postmark_cases(o).iter().map(|c| c.files * c.hi).max().unwrap_or(0) * 2,
            Experiment::Dfsio => 2 * o.dfsio_bytes,
            Experiment::Durable => 2 * DURABLE_FILE_BYTES,
            Experiment::Destage => 2 * o.destage_bytes + DURABLE_FILE_BYTES,
            _ => 0,
        });
    }
    need
}

/// One postmark setting, scaled.
#[derive(Clone, Debug)]
pub struct PostmarkCase {
    pub name: &'static str,
    pub lo: u64,
    pub hi: u64,
    pub files: u64,
    pub transactions: u64,
}

pub fn postmark_cases(o: &PaperOptions) -> Vec<PostmarkCase> {
    let (s, fs) = (o.postmark_scale.clamp(0.0001, 1.0), o.postmark_files_scale.clamp(0.0001, 1.0));
    POSTMARK_TABLE_1
        .iter()
        .map(|&(name, lo, hi, files, tx)| PostmarkCase {
            name,
            lo,
            hi,
            files: ((files as f64 * fs) as u64).max(10),
            transactions: ((tx as f64 * s) as u64).max(100),
        })
        .collect()
}

/// The first number on postmark's report line that contains `what` (" created (").
fn postmark_count(report: &str, what: &str) -> Option<u64> {
    let line = report.lines().find(|l| l.contains(what))?;
    line.split_whitespace().next()?.parse().ok()
}

/// The postmark script for one case (Table 1; everything else postmark's defaults).
pub fn postmark_script(c: &PostmarkCase, dir: &Path, seed: u64) -> String {
    format!(
        "set location {}\nset size {} {}\nset number {}\nset transactions {}\nset seed {}\nrun\nquit\n",
        dir.display(),
        c.lo,
        c.hi,
        c.files,
        c.transactions,
        seed % 1_000_000_000
    )
}

/// Run `exp` in every configuration; a configuration that fails is recorded and the others
/// still run.
pub(super) fn run_experiment(
    tb: &mut Testbed,
    o: &PaperOptions,
    exp: Experiment,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    for cfg in o.configs_for(exp) {
        bar.message(format!("{} {}", exp.name(), cfg.name()));
        let recs = match exp {
            Experiment::Postmark => postmark_cases(o)
                .into_iter()
                .map(|c| {
                    let name = c.name;
                    in_config(tb, o, exp, cfg, name, |tb, dir, m| postmark(tb, o, &c, dir, m))
                        .unwrap_or_else(|e| vec![TierRecord::failed(exp, cfg, name, e.to_string())])
                })
                .collect::<Vec<_>>()
                .concat(),
            Experiment::Dfsio => in_config(tb, o, exp, cfg, "dfsio", |tb, dir, m| dfsio(tb, o, dir, m))
                .unwrap_or_else(|e| vec![TierRecord::failed(exp, cfg, "dfsio", e.to_string())]),
            Experiment::Durable => in_config(tb, o, exp, cfg, "durable", |tb, dir, m| durable(tb, o, dir, m))
                .unwrap_or_else(|e| vec![TierRecord::failed(exp, cfg, "durable", e.to_string())]),
            Experiment::Destage => in_config(tb, o, exp, cfg, "destage", |tb, dir, m| destage(tb, o, dir, m))
                .unwrap_or_else(|e| vec![TierRecord::failed(exp, cfg, "destage", e.to_string())]),
            _ => unreachable!("not a tier experiment"),
        };
        sys::check_interrupt()?;
        for mut r in recs {
            r.experiment = Some(exp);
            r.config = Some(cfg);
            match &r.error {
                Some(e) => note!("paper: [{} {} {}] FAILED: {e}", exp.name(), cfg.name(), r.case),
                None => note!(
                    "paper: [{} {} {}] {:.1} {} in {:.1} s{}",
                    exp.name(),
                    cfg.name(),
                    r.case,
                    r.per_sec,
                    r.unit,
                    r.secs,
                    r.p50_us
                        .map(|p| format!(", p50 {p:.0} µs, p99 {:.0} µs", r.p99_us.unwrap_or(0.0)))
                        .unwrap_or_default()
                ),
            }
            report.tier_runs.push(r);
        }
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

/// The client of one configuration, from a cold start: the ext4 remounted, a new memory
/// cgroup, for the mounts a fresh tier file and a new daemon. `body` gets the directory to
/// work in (on the mount or on ext4) and the daemon.
fn in_config(
    tb: &mut Testbed,
    o: &PaperOptions,
    exp: Experiment,
    cfg: ConfigKind,
    case: &str,
    body: impl FnOnce(&ClientEnv, &Path, Option<&mut MountDaemon>) -> Result<Vec<TierRecord>>,
) -> Result<Vec<TierRecord>> {
    tb.remount()?;
    let work = tb.ext4.join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("remove {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("create {}", work.display()))?;
    sys::run("sync", &[])?;
    let mem = tb.memory_cgroup(Some(o.memory_bytes))?;
    let log = tb.logs.join(format!("{}-{case}-{}.mount.log", exp.name(), cfg.name()));
    let tier = TierFile::make(tb, cfg, o.tier_bytes)?;
    let extra = tier.as_ref().map(|t| t.mount_args(o)).unwrap_or_default();
    let mut mount = MountDaemon::for_config(tb, o, cfg, None, &extra, &[&mem, &tb.blkio], &log)?;
    let dir = if mount.is_some() { tb.mnt.join("work") } else { work.clone() };
    let env = ClientEnv {
        procs: vec![mem.procs(), tb.blkio.procs()],
        tb_disk: Box::new({
            let dev = tb.loopdev.clone();
            move || super::testbed::disk_stat_of(&dev)
        }),
        logs: tb.logs.clone(),
        exe: o.exe.clone(),
        seed: o.seed,
    };
    let out = body(&env, &dir, mount.as_mut());
    let out = out.map(|mut recs| {
        if let Some(m) = mount.as_mut() {
            let tier_stats = m.stats_now().and_then(|(_, v)| v.get("tier").cloned());
            for r in &mut recs {
                r.tier = r.tier.take().or_else(|| tier_stats.clone());
            }
        }
        recs
    });
    if let Some(mut m) = mount {
        // A clean unmount destages everything first (not timed).
        m.stop();
    }
    drop(tier);
    let _ = std::fs::remove_dir_all(&work);
    out
}

/// What a case needs of its configuration.
struct ClientEnv {
    /// `cgroup.procs` of the client's memory and blkio cgroups.
    procs: Vec<PathBuf>,
    tb_disk: Box<dyn Fn() -> DiskStat + Send + Sync>,
    logs: PathBuf,
    exe: PathBuf,
    seed: u64,
}

impl ClientEnv {
    fn disk(&self) -> DiskStat {
        (self.tb_disk)()
    }

    /// `cmd` inside the client's cgroups, at most `limit`; its stdout.
    fn run(&self, mut cmd: Command, limit: Duration, what: &str) -> Result<String> {
        let refs: Vec<&Path> = self.procs.iter().map(|p| p.as_path()).collect();
        sys::confine(&mut cmd, &refs);
        sys::output_bounded(cmd, limit, what)
    }
}

/// The tier's medium, made by the harness (space reserved outside the client's cgroup) and
/// removed when dropped.
pub(super) struct TierFile {
    path: PathBuf,
}

impl TierFile {
    /// `farcache mount`'s arguments for this tier of `bytes`.
    pub(super) fn mount_args(&self, o: &PaperOptions) -> Vec<OsString> {
        let mut a = vec![
            OsString::from("--tier"),
            self.path.clone().into_os_string(),
            OsString::from("--tier-size"),
            OsString::from(o.tier_bytes.to_string()),
        ];
        if let Some(c) = &o.tier_commit {
            a.extend([OsString::from("--tier-commit"), OsString::from(c)]);
        }
        if let Some(n) = o.tier_sequential_cutoff {
            a.extend([OsString::from("--tier-sequential-cutoff"), OsString::from(n.to_string())]);
        }
        a
    }

    /// The tier of configuration `cfg`, if it has one.
    pub(super) fn make(tb: &Testbed, cfg: ConfigKind, bytes: u64) -> Result<Option<TierFile>> {
        let path = match cfg {
            ConfigKind::TierDram | ConfigKind::FarcacheTier => PathBuf::from(format!("/dev/shm/{}-tier", tb.prefix)),
            ConfigKind::TierSsd => tb.dir.join("tier-ssd"),
            _ => return Ok(None),
        };
        let _ = std::fs::remove_file(&path);
        if cfg == ConfigKind::TierSsd {
            // The mount makes it, as an operator's first mount would: reserved, then written
            // once (a fallocated file's unwritten extents cost a metadata commit per group
            // commit until the ring has gone round). `O_DIRECT` charges no page cache to the
            // client's cgroup.
            return Ok(Some(TierFile { path }));
        }
        let f = std::fs::File::create(&path).ctx(|| format!("create the tier file {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) } != 0 {
            let e = std::io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(BenchError::Setup(format!(
                "cannot reserve {} for the tier at {}: {e} (free space there, or pass a smaller --tier-size)",
                human(bytes),
                path.display()
            )));
        }
        Ok(Some(TierFile { path }))
    }
}

impl Drop for TierFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn postmark(
    env: &ClientEnv,
    o: &PaperOptions,
    c: &PostmarkCase,
    dir: &Path,
    _m: Option<&mut MountDaemon>,
) -> Result<Vec<TierRecord>> {
    let script = env.logs.join(format!("postmark-{}.pm", c.name));
    std::fs::write(&script, postmark_script(c, dir, env.seed)).ctx(|| format!("write {}", script.display()))?;
    let mut cmd = Command::new("postmark");
    cmd.arg(&script);
    let d0 = env.disk();
    let t = Instant::now();
    // Bounded: a disk at its cap moves at least 1 MB/s here; every transaction moves at most
    // `hi` bytes.
    let limit = Duration::from_secs(600 + c.transactions * c.hi / 1_000_000 / 4);
    let out = env.run(cmd, limit, "postmark (apt-get install postmark)")?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::write(env.logs.join(format!("postmark-{}-{}.out", c.name, o.seed)), &out);
    if !out.contains("transactions") || out.contains("out of files") {
        return Err(BenchError::Setup(format!(
            "postmark did not finish its transactions (too few files for them? raise --postmark-files-scale): {}",
            out.trim()
        )));
    }
    // Postmark deletes every file it created before it reports; one that failed a create,
    // an open or a delete (it says so on stderr and goes on) did less work than asked.
    let (created, deleted) = (postmark_count(&out, " created ("), postmark_count(&out, " deleted ("));
    if created.is_none() || created != deleted {
        return Err(BenchError::Setup(format!(
            "postmark's file operations failed ({created:?} files created, {deleted:?} deleted; its stderr names \
             them): a mount daemon out of open descriptors (its log says so at start) or a full disk. Its \
             transactions per second would not be comparable"
        )));
    }
    Ok(vec![TierRecord {
        case: c.name.into(),
        secs,
        ops: c.transactions,
        per_sec: c.transactions as f64 / secs.max(1e-9),
        unit: "transactions/s".into(),
        disk: env.disk().since(&d0),
        ..TierRecord::default()
    }])
}

fn drop_caches() -> Result<()> {
    sys::run("sync", &[])?;
    sys::write_file(Path::new("/proc/sys/vm/drop_caches"), "3")
}

fn dfsio(env: &ClientEnv, o: &PaperOptions, dir: &Path, _m: Option<&mut MountDaemon>) -> Result<Vec<TierRecord>> {
    let mut recs = Vec::new();
    let each = (o.dfsio_bytes / DFSIO_FILES / MIB).max(1) * MIB;
    for (files, bytes) in [(1u64, o.dfsio_bytes), (DFSIO_FILES, each)] {
        for rw in ["write", "read"] {
            if rw == "read" {
                drop_caches()?;
            }
            let name = format!("f{files}");
            let mut cmd = Command::new("fio");
            cmd.args(["--name", &name, "--directory"])
                .arg(dir)
                .args(["--rw", rw, "--bs", "1M", "--ioengine", "psync", "--size"])
                .arg(bytes.to_string())
                .args(["--numjobs", &files.to_string(), "--group_reporting", "--output-format=json"]);
            if rw == "write" {
                cmd.args(["--end_fsync=1", "--create_on_open=1"]);
            }
            let d0 = env.disk();
            let t = Instant::now();
            let limit = Duration::from_secs(300 + files * bytes / 2_000_000);
            let out = env.run(cmd, limit, "fio")?;
            let secs = t.elapsed().as_secs_f64();
            let _ = std::fs::write(env.logs.join(format!("dfsio-{rw}-{files}.json")), &out);
            let total = files * bytes;
            recs.push(TierRecord {
                case: format!("{rw} {files} × {}", human(bytes)),
                secs,
                ops: total,
                per_sec: total as f64 / secs.max(1e-9) / 1e6,
                unit: "MB/s".into(),
                disk: env.disk().since(&d0),
                ..TierRecord::default()
            });
        }
    }
    Ok(recs)
}

/// The `durable` experiment's writer: a worker process (in the client's cgroups) doing
/// 4 KiB `pwrite` + `fdatasync` pairs at random blocks of a 64 MiB file in `dir`.
struct DurableWriter {
    w: super::child::Child,
}

impl DurableWriter {
    fn start(env: &ClientEnv, dir: &Path) -> Result<DurableWriter> {
        let file = dir.join("durable");
        {
            // Written in place with the contents the worker checks.
            let mut data = vec![0u8; MIB as usize];
            let f = std::fs::File::create(&file).ctx(|| format!("create {}", file.display()))?;
            use std::os::unix::fs::FileExt;
            for m in 0..DURABLE_FILE_BYTES / MIB {
                for (i, b) in data.chunks_mut(super::worker::BLOCK).enumerate() {
                    super::worker::fill_block(m * MIB / super::worker::BLOCK as u64 + i as u64, b);
                }
                f.write_all_at(&data, m * MIB).ctx(|| format!("write {}", file.display()))?;
            }
            f.sync_all().ctx(|| format!("fsync {}", file.display()))?;
        }
        let mut cmd = Command::new(&env.exe);
        cmd.args(["bench", "paper-worker", "--op", "randread", "--file"])
            .arg(&file)
            .args(["--size", &DURABLE_FILE_BYTES.to_string(), "--seed", &env.seed.to_string()])
            .env("FARCACHE_LOG", "warn");
        let refs: Vec<&Path> = env.procs.iter().map(|p| p.as_path()).collect();
        sys::confine(&mut cmd, &refs);
        let mut w = super::child::Child::spawn("durable writer", cmd, &env.logs.join("durable.worker.log"), true)?;
        w.next_line(Duration::from_secs(30))?;
        Ok(DurableWriter { w })
    }

    /// `threads` writers (each on a file of its own if `own`) for `secs` seconds.
    fn run(&mut self, threads: usize, secs: u64, own: bool) -> Result<super::worker::PassOutcome> {
        self.w.send(&format!("durable {threads} {secs}{}", if own { " own" } else { "" }))?;
        let line = self.w.next_line(Duration::from_secs(secs + 120))?;
        serde_json::from_str(&line).map_err(|e| BenchError::Setup(format!("durable writer said {line:?}: {e}")))
    }

    /// One writer in one-second passes while `busy()` holds (at least one pass, at most
    /// `max` seconds): pairs per second over all of them, the mean p50 and the worst p99.
    fn run_while(&mut self, max: u64, busy: impl Fn() -> bool) -> Result<(f64, u64, f64, f64)> {
        let (mut secs, mut n, mut p50, mut p99, mut passes) = (0.0, 0u64, 0.0f64, 0.0f64, 0u32);
        while passes == 0 || (busy() && u64::from(passes) < max) {
            let p = self.run(1, 1, false)?;
            (secs, n, p50, p99, passes) =
                (secs + p.secs, n + p.reads, p50 + p.lat_us_p50, p99.max(p.lat_us_p99), passes + 1);
        }
        Ok((secs, n, p50 / f64::from(passes), p99))
    }

    fn quit(mut self) {
        let _ = self.w.send("quit");
        self.w.close_stdin();
        self.w.wait_exit(Duration::from_secs(10));
    }
}

fn durable(env: &ClientEnv, o: &PaperOptions, dir: &Path, m: Option<&mut MountDaemon>) -> Result<Vec<TierRecord>> {
    let mut recs = Vec::new();
    if m.is_some_and(|m| m.has_tier()) {
        recs.push(fuse_noop_pair(env, o)?);
    }
    let mut w = DurableWriter::start(env, dir)?;
    for (threads, own) in [(1usize, false), (DURABLE_WRITERS, false), (DURABLE_WRITERS, true)] {
        let d0 = env.disk();
        let p = w.run(threads, o.durable_secs, own)?;
        let case = match (threads, own) {
            (1, _) => "1 writer".into(),
            (n, false) => format!("{n} writers, one file"),
            (n, true) => format!("{n} writers, a file each"),
        };
        recs.push(TierRecord { disk: env.disk().since(&d0), ..pairs_record(case, &p) });
    }
    w.quit();
    Ok(recs)
}

/// The case of [`fuse_noop_pair`].
pub const FUSE_NOOP_CASE: &str = "1 writer, FUSE round trips only (mount of tmpfs)";

/// Issue 12's reference for a `dram` tier's durable write: the same write + fdatasync pair
/// through a mount that does nothing costly with it (`--no-remote`, no tier, its backing on
/// tmpfs, where fdatasync is free) — two FUSE round trips and a copy into memory. Target:
/// the dram tier's p50 within 10 µs of this one's.
fn fuse_noop_pair(env: &ClientEnv, o: &PaperOptions) -> Result<TierRecord> {
    let backing = PathBuf::from(format!("/dev/shm/farcache-noop-{}", std::process::id()));
    let mnt = env.logs.join("noop-mnt");
    for d in [&backing, &mnt] {
        std::fs::create_dir_all(d).ctx(|| format!("create {}", d.display()))?;
    }
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(backing.clone());
    let log = env.logs.join("durable-noop.mount.log");
    let mut noop = MountDaemon::start(&env.exe, &backing, &mnt, None, None, &[], &log)?;
    let mut w = DurableWriter::start(env, &mnt)?;
    let p = w.run(1, o.durable_secs, false);
    w.quit();
    noop.stop();
    Ok(pairs_record(FUSE_NOOP_CASE.into(), &p?))
}

/// A durable writer's pass as a record: write + fdatasync pairs per second and latencies.
fn pairs_record(case: String, p: &super::worker::PassOutcome) -> TierRecord {
    TierRecord {
        case,
        secs: p.secs,
        ops: p.reads,
        per_sec: p.reads as f64 / p.secs.max(1e-9),
        unit: "writes/s".into(),
        p50_us: Some(p.lat_us_p50),
        p99_us: Some(p.lat_us_p99),
        ..TierRecord::default()
    }
}

/// The case names of `destage`, shared by every configuration so the report sets them side
/// by side: the write-back (with a tier) against the disk's own sequential writes (without),
/// and a durable writer while each runs and while nothing does.
pub const DESTAGE_CASES: [&str; 3] =
    ["written back (tier) / sequential write (no tier), MB/s", "1 writer, meanwhile", "1 writer, idle"];

/// The most one-second passes of the idle baseline in `destage`: fewer than the tier's
/// default `max_dirty_age` (30 s) in seconds, so none of the writer's own records is written
/// back during it.
const DESTAGE_IDLE_PASSES: u64 = 20;

/// Issue 12's destage targets: write-back at ≥ 80% of the disk's sequential rate, and the
/// foreground p99 meanwhile ≤ 2× idle. With a tier: `destage_bytes` written into it at
/// random 4 KiB blocks (fio, each block once), then `farcache flush` times the write-back of
/// what the tier holds (sorted and merged into large writes); again, with a durable writer
/// in one-second passes while the flush runs; then the writer alone. Without a tier (native
/// ext4, the write-through mount): the same region written sequentially in 1 MiB requests
/// and fsynced — the disk's own rate — alone, then beside the writer.
fn destage(env: &ClientEnv, o: &PaperOptions, dir: &Path, mut m: Option<&mut MountDaemon>) -> Result<Vec<TierRecord>> {
    let mut w = DurableWriter::start(env, dir)?;
    let limit = Duration::from_secs(300 + o.destage_bytes / 1_000_000);
    let tiered = m.as_ref().is_some_and(|m| m.has_tier());
    let fio = |name: &str| {
        let mut cmd = Command::new("fio");
        cmd.args(["--name", name, "--directory"]).arg(dir);
        if tiered {
            cmd.args(["--rw", "randwrite", "--bs", "4k"]);
        } else {
            cmd.args(["--rw", "write", "--bs", "1M"]);
        }
        cmd.args(["--ioengine", "psync", "--end_fsync=1", "--size"])
            .arg(o.destage_bytes.to_string())
            .arg("--output-format=json");
        cmd
    };
    let mnt = m.as_ref().map(|m| m.mountpoint().to_path_buf());
    let exe = env.exe.clone();
    // What the tier holds dirty now (it may have begun writing back while fio wrote, past
    // its watermark): what a flush then writes back.
    let dirty = |m: &mut Option<&mut MountDaemon>| -> Result<u64> {
        match m.as_mut() {
            Some(m) if tiered => m.stats_now().and_then(|(_, v)| v["tier"]["dirty_bytes"].as_u64()).ok_or_else(|| {
                BenchError::Setup(
                    "`farcache stats` gave no tier.dirty_bytes: cannot tell what a flush writes back".into(),
                )
            }),
            _ => Ok(o.destage_bytes),
        }
    };
    // The write-back of what the tier holds (with a tier), or the sequential write itself
    // (without): (seconds, bytes).
    let background = |round: &str, held: u64| -> Result<(f64, u64)> {
        if let Some(mnt) = mnt.as_ref().filter(|_| tiered) {
            let t = Instant::now();
            let mut cmd = Command::new(&exe);
            cmd.arg("flush").arg(mnt).args(["--timeout", "30m"]);
            sys::output_bounded(cmd, limit, "farcache flush")?;
            Ok((t.elapsed().as_secs_f64(), held))
        } else {
            let t = Instant::now();
            env.run(fio(round), limit, "fio")?;
            Ok((t.elapsed().as_secs_f64(), o.destage_bytes))
        }
    };
    let mut recs = Vec::new();
    // The writer's file went through the tier too: written back first (not timed), so that
    // the region is all a flush below writes back.
    if tiered {
        background("settle", 0)?;
    }
    // 1. Alone.
    if tiered {
        env.run(fio("region1"), limit, "fio into the tier")?;
    }
    let held = dirty(&mut m)?;
    let d0 = env.disk();
    let (secs, bytes) = background("seq1", held)?;
    recs.push(TierRecord {
        case: DESTAGE_CASES[0].into(),
        secs,
        ops: bytes,
        per_sec: bytes as f64 / secs.max(1e-9) / 1e6,
        unit: "MB/s".into(),
        disk: env.disk().since(&d0),
        ..TierRecord::default()
    });
    // 2. Beside a durable writer.
    if tiered {
        env.run(fio("region2"), limit, "fio into the tier")?;
    }
    let held = dirty(&mut m)?;
    let d0 = env.disk();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (bg, fg) = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let r = background("seq2", held);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        let fg = w.run_while(limit.as_secs(), || !done.load(std::sync::atomic::Ordering::SeqCst));
        (h.join().unwrap_or_else(|_| Err(BenchError::Setup("the write-back thread panicked".into()))), fg)
    });
    let ((bg_secs, _), (secs, n, p50, p99)) = (bg?, fg?);
    recs.push(TierRecord {
        case: DESTAGE_CASES[1].into(),
        secs,
        ops: n,
        per_sec: n as f64 / secs.max(1e-9),
        unit: format!("writes/s (write-back took {bg_secs:.1} s)"),
        p50_us: Some(p50),
        p99_us: Some(p99),
        disk: env.disk().since(&d0),
        ..TierRecord::default()
    });
    // 3. Alone, as many one-second passes as ran beside the write-back, at most
    // [`DESTAGE_IDLE_PASSES`]. What the writer left dirty in phase 2 is written back first
    // (not timed): left in the tier, it reached the 30 s dirty age during these passes and
    // was written back beside them, so the baseline was not idle (session 24's idle p99s of
    // 3.1–3.4 ms against 0.3 ms). The cap keeps the writer's own records of this phase
    // younger than that age.
    if tiered {
        background("settle2", 0)?;
    }
    let passes = (secs.round() as u64).clamp(1, DESTAGE_IDLE_PASSES);
    let d0 = env.disk();
    let (secs, n, p50, p99) = w.run_while(passes, || true)?;
    recs.push(TierRecord {
        case: DESTAGE_CASES[2].into(),
        secs,
        ops: n,
        per_sec: n as f64 / secs.max(1e-9),
        unit: "writes/s".into(),
        p50_us: Some(p50),
        p99_us: Some(p99),
        disk: env.disk().since(&d0),
        ..TierRecord::default()
    });
    w.quit();
    Ok(recs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postmark_reports_are_read_for_failed_operations() {
        let ok = "Files:\n\t45051 created (45051 per second)\n\t\tCreation alone: 30000 files\n\t45051 deleted (1 per second)\n";
        assert_eq!(postmark_count(ok, " created ("), Some(45051));
        assert_eq!(postmark_count(ok, " deleted ("), Some(45051));
        let failed = "\t44973 created (2044 per second)\n\t40483 deleted (1840 per second)\n";
        assert_ne!(postmark_count(failed, " created ("), postmark_count(failed, " deleted ("));
        assert_eq!(postmark_count("nothing", " created ("), None);
    }

    #[test]
    fn postmark_settings_are_table_1_scaled() {
        let mut o = PaperOptions::full(PathBuf::from("farcache"));
        let full = postmark_cases(&o);
        assert_eq!(
            full.iter().map(|c| (c.name, c.lo, c.hi, c.files, c.transactions)).collect::<Vec<_>>(),
            POSTMARK_TABLE_1.to_vec()
        );
        o.postmark_scale = 0.1;
        let c = &postmark_cases(&o)[0];
        assert_eq!((c.files, c.transactions), (30_000, 30_000), "the working set stays the paper's");
        o.postmark_files_scale = 0.1;
        let c = &postmark_cases(&o)[0];
        assert_eq!((c.files, c.transactions), (3_000, 30_000));
        let s = postmark_script(c, Path::new("/m/work"), 7);
        assert!(s.contains("set location /m/work\n") && s.contains("set size 5000 20000\n"), "{s}");
        assert!(
            s.contains("set number 3000\n") && s.contains("set transactions 30000\n") && s.ends_with("run\nquit\n")
        );
    }

    #[test]
    fn tier_experiments_run_in_their_own_configurations() {
        for e in [Experiment::Postmark, Experiment::Dfsio, Experiment::Durable] {
            assert!(e.of_the_tier() && e.runs_in(ConfigKind::TierDram) && !e.runs_in(ConfigKind::Farcache));
            assert_eq!(e.name().parse::<Experiment>().unwrap(), e);
        }
        assert!(!Experiment::Randread.runs_in(ConfigKind::TierSsd));
        assert_eq!("tier-dram".parse::<ConfigKind>().unwrap(), ConfigKind::TierDram);
        assert_eq!(serde_json::to_string(&ConfigKind::TierSsd).unwrap(), "\"tier-ssd\"");
    }
}
