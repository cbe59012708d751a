//! Paper 002 reproduced: the asynchronous direct-I/O engine under the mount (issue 11).
//!
//! - `engine`: fio, 4 KiB random reads and writes with O_DIRECT through io_uring, queue depth
//!   1/4/16/32, one job or four jobs sharing one file: `native` (ext4 on the loop disk),
//!   `passthrough` (`farcache mount --no-remote`) and `farcache` (with lenders). IOPS and
//!   completion latency per point; the ratios to native are the issue's targets.
//! - `serial`: the paper's serialization test — 1, 2, 4, 8 and 16 processes each doing
//!   synchronous 8 KiB O_DIRECT reads of one shared file — in `native`, `passthrough` and
//!   `serialized` (the mount with one FUSE thread and the synchronous engine: one request at
//!   a time, the behaviour the paper found). Besides IOPS, the loop device's mean queue depth
//!   (`time_in_queue` over wall time, /sys/block/loopN/stat): it must grow with the processes.
//!
//! Every configuration starts cold (ext4 remounted, a new memory cgroup); fio runs inside the
//! client's memory and blkio cgroups like every other load of the harness.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::progress::Progress;
use crate::{BenchError, Result};

use super::mount::MountDaemon;
use super::report::PaperReport;
use super::testbed::Testbed;
use super::{sys, ConfigKind, Experiment, PaperOptions};

/// Queue depths of the `engine` experiment.
pub const QUEUE_DEPTHS: [u32; 4] = [1, 4, 16, 32];
/// Job counts (all on one shared file).
pub const JOBS: [u32; 2] = [1, 4];
/// Process counts of the `serial` experiment.
pub const PROCESSES: [u32; 5] = [1, 2, 4, 8, 16];

/// One fio point.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EngineRecord {
    pub experiment: Option<Experiment>,
    pub config: Option<ConfigKind>,
    /// "randread" or "randwrite".
    pub rw: String,
    pub block_bytes: u64,
    pub iodepth: u32,
    pub jobs: u32,
    pub secs: f64,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The loop device's mean queue depth while it ran.
    pub disk_queue: f64,
    /// The mount daemon's CPU time (user + system, all threads) per I/O fio completed, µs;
    /// 0 without a mount. Less disturbed by other load on the machine than IOPS.
    #[serde(default)]
    pub daemon_cpu_us_per_io: f64,
    pub error: Option<String>,
}

/// One fio point: (rw, block bytes, iodepth, jobs, ioengine).
pub type Point = (&'static str, u64, u32, u32, &'static str);

impl EngineRecord {
    /// A record of point `p` of `exp` in `cfg`, its measurements still empty.
    fn at(exp: Experiment, cfg: ConfigKind, p: &Point) -> EngineRecord {
        EngineRecord {
            experiment: Some(exp),
            config: Some(cfg),
            rw: p.0.into(),
            block_bytes: p.1,
            iodepth: p.2,
            jobs: p.3,
            ..EngineRecord::default()
        }
    }
}

/// The fio points of `exp` (`quick`: the ends of each range only).
pub fn points(exp: Experiment, quick: bool) -> Vec<Point> {
    let ends = |x: &[u32]| if quick { vec![x[0], x[x.len() - 1]] } else { x.to_vec() };
    match exp {
        Experiment::Engine => {
            let (jobs, qds) = (ends(&JOBS), ends(&QUEUE_DEPTHS));
            let mut v = Vec::new();
            for rw in ["randread", "randwrite"] {
                for &j in &jobs {
                    for &q in &qds {
                        v.push((rw, 4096, q, j, "io_uring"));
                    }
                }
            }
            v
        }
        Experiment::Serial => ends(&PROCESSES).into_iter().map(|p| ("randread", 8192, 1, p, "psync")).collect(),
        _ => Vec::new(),
    }
}

/// The fio points of `exp` this run asks for (`--engine-rw`, `--engine-qds` narrow the
/// engine's matrix).
pub fn points_of(o: &PaperOptions, exp: Experiment) -> Vec<Point> {
    let mut v = points(exp, o.quick);
    if exp == Experiment::Engine {
        if !o.engine_qds.is_empty() {
            v = o.engine_qds.iter().flat_map(|&q| v.iter().map(move |p| (p.0, p.1, q, p.3, p.4))).collect();
            v.sort_by_key(|p| (p.0, p.3, p.2));
            v.dedup();
        }
        v.retain(|p| o.engine_rw.is_empty() || o.engine_rw.iter().any(|r| r == p.0));
    }
    v
}

/// The fio command line of one point (the file exists; `secs` of measured time).
pub fn fio_args(file: &Path, p: Point, secs: u64) -> Vec<OsString> {
    let (rw, bs, qd, jobs, engine) = p;
    let mut a: Vec<OsString> =
        ["--name=engine", "--direct=1", "--time_based", "--group_reporting", "--output-format=json"]
            .into_iter()
            .map(OsString::from)
            .collect();
    let mut f = OsString::from("--filename=");
    f.push(file);
    a.push(f);
    for (k, v) in [
        ("rw", rw.to_string()),
        ("bs", bs.to_string()),
        ("iodepth", qd.to_string()),
        ("numjobs", jobs.to_string()),
        ("ioengine", engine.to_string()),
        ("runtime", secs.to_string()),
        ("ramp_time", "1".to_string()),
        ("randrepeat", "0".to_string()),
    ] {
        a.push(format!("--{k}={v}").into());
    }
    a
}

/// IOPS and completion latency percentiles (µs) of fio's JSON for `rw`.
pub fn parse_fio(json: &str, rw: &str) -> Result<(f64, f64, f64)> {
    let start = json.find('{').ok_or_else(|| BenchError::Setup(format!("fio printed no JSON: {json}")))?;
    let v: Value = serde_json::from_str(&json[start..]).map_err(|e| {
        BenchError::Setup(format!("fio's JSON does not parse ({e}): {}", &json[start..json.len().min(start + 400)]))
    })?;
    let side = if rw.contains("write") { "write" } else { "read" };
    let j = &v["jobs"][0][side];
    let iops = j["iops"].as_f64().ok_or_else(|| BenchError::Setup(format!("fio: no {side}.iops in {v}")))?;
    let pct = |k: &str| j["clat_ns"]["percentile"][k].as_f64().unwrap_or(0.0) / 1000.0;
    Ok((iops, pct("50.000000"), pct("99.000000")))
}

/// I/Os fio completed (`total_ios` of the side `rw` names), from its JSON.
fn fio_total_ios(json: &str, rw: &str) -> f64 {
    let side = if rw.contains("write") { "write" } else { "read" };
    json.find('{')
        .and_then(|start| serde_json::from_str::<Value>(&json[start..]).ok())
        .and_then(|v| v["jobs"][0][side]["total_ios"].as_f64())
        .unwrap_or(0.0)
}

/// CPU seconds (user + system, every thread) process `pid` used so far; 0 if unknown.
fn cpu_secs(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = text.rsplit_once(')').map_or("", |(_, r)| r);
    // After the command: state (field 3) first; utime and stime are fields 14 and 15.
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (field(11) + field(12)) as f64 / hz
}

/// (time_in_queue ms, wall clock) of block device `dev` now.
fn queue_clock(dev: &str) -> (u64, Instant) {
    let name = dev.trim_start_matches("/dev/");
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap_or_default();
    let f: Vec<u64> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    (f.get(10).copied().unwrap_or(0), Instant::now())
}

/// The `[mount]` table that makes the mount serve one request at a time (`serialized`).
const SERIALIZED_CONFIG: &str = "[mount]\nthreads = 1\nio_engine = \"sync\"\n";

pub(super) fn run_experiment(
    tb: &mut Testbed,
    o: &PaperOptions,
    exp: Experiment,
    report: &mut PaperReport,
    progress: &mut dyn FnMut(&PaperReport),
    bar: &Progress,
) -> Result<()> {
    let size = o.engine_file_bytes;
    let name = tb.ensure_file(size)?;
    if exp == Experiment::Engine && o.engine_interleave {
        for p in points_of(o, exp) {
            for cfg in o.configs_for(exp) {
                bar.message(format!("{} {} QD {} x {}", exp.name(), cfg.name(), p.2, p.3));
                match in_config(tb, o, exp, cfg, &name, &[p]) {
                    Ok(recs) => report.engine_runs.extend(recs),
                    Err(e) if sys::interrupted() => return Err(e),
                    Err(e) => {
                        note!("paper: {} {} {} QD {} x {}: FAILED: {e}", exp.name(), cfg.name(), p.0, p.2, p.3);
                        report
                            .engine_runs
                            .push(EngineRecord { error: Some(e.to_string()), ..EngineRecord::at(exp, cfg, &p) });
                    }
                }
                progress(report);
            }
        }
        bar.inc(o.configs_for(exp).len() as u64);
        return Ok(());
    }
    for cfg in o.configs_for(exp) {
        bar.message(format!("{} {}", exp.name(), cfg.name()));
        match in_config(tb, o, exp, cfg, &name, &points_of(o, exp)) {
            Ok(recs) => report.engine_runs.extend(recs),
            Err(e) if sys::interrupted() => return Err(e),
            Err(e) => {
                note!("paper: {} {}: FAILED: {e}", exp.name(), cfg.name());
                report.engine_runs.push(EngineRecord {
                    experiment: Some(exp),
                    config: Some(cfg),
                    error: Some(e.to_string()),
                    ..EngineRecord::default()
                });
            }
        }
        progress(report);
        bar.inc(1);
    }
    Ok(())
}

fn in_config(
    tb: &mut Testbed,
    o: &PaperOptions,
    exp: Experiment,
    cfg: ConfigKind,
    name: &str,
    points: &[Point],
) -> Result<Vec<EngineRecord>> {
    tb.remount()?;
    let mem = tb.memory_cgroup(Some(o.memory_bytes))?;
    let log = tb.logs.join(format!("{}-{}.mount.log", exp.name(), cfg.name()));
    let mut lenders = match cfg {
        ConfigKind::Farcache => Some(tb.start_lenders(o.lender_capacity_bytes, o.policy.as_deref())?),
        _ => None,
    };
    let mut extra: Vec<OsString> = Vec::new();
    if cfg == ConfigKind::Serialized {
        let path = tb.logs.join("serialized.toml");
        std::fs::write(&path, SERIALIZED_CONFIG)
            .map_err(|e| BenchError::Setup(format!("write {}: {e}", path.display())))?;
        extra.extend([OsString::from("--config"), path.into_os_string()]);
    }
    // The ring transport: the kernel's switch on while this configuration runs.
    let _rings = if cfg == ConfigKind::PassthroughRing {
        extra.extend(["--fuse-uring", "on"].map(OsString::from));
        Some(KernelSwitch::on()?)
    } else {
        None
    };
    let remote = lenders.as_ref().map(|l| &l.addrs[..]);
    let mount = MountDaemon::for_config(tb, o, cfg, remote, &extra, &[&mem, &tb.blkio], &log)?;
    let file: PathBuf = if mount.is_some() { tb.mnt.join(name) } else { tb.ext4.join(name) };
    let procs = [mem.procs(), tb.blkio.procs()];
    let refs: Vec<&Path> = procs.iter().map(|p| p.as_path()).collect();
    let mut recs = Vec::new();
    for &p in points {
        sys::check_interrupt()?;
        let mut cmd = Command::new("fio");
        cmd.args(fio_args(&file, p, o.engine_secs));
        sys::confine(&mut cmd, &refs);
        let (q0, t0) = queue_clock(&tb.loopdev);
        let c0 = mount.as_ref().map(|m| cpu_secs(m.pid()));
        let out = sys::output_bounded(cmd, Duration::from_secs(o.engine_secs * 3 + 120), "fio (apt-get install fio)")?;
        let (q1, t1) = queue_clock(&tb.loopdev);
        let c1 = mount.as_ref().map(|m| cpu_secs(m.pid()));
        let (iops, p50, p99) = parse_fio(&out, p.0)?;
        let ios = fio_total_ios(&out, p.0);
        let daemon_cpu_us_per_io = match (c0, c1) {
            (Some(a), Some(b)) if ios > 0.0 => (b - a) * 1e6 / ios,
            _ => 0.0,
        };
        let r = EngineRecord {
            secs: (t1 - t0).as_secs_f64(),
            iops,
            p50_us: p50,
            p99_us: p99,
            disk_queue: q1.saturating_sub(q0) as f64 / ((t1 - t0).as_secs_f64() * 1000.0).max(1.0),
            daemon_cpu_us_per_io,
            error: None,
            ..EngineRecord::at(exp, cfg, &p)
        };
        note!(
            "paper: [{} {}] {} {} QD {} × {} jobs: {:.0} IOPS, p50 {:.0} µs, p99 {:.0} µs, disk queue {:.1}, daemon CPU \
             {:.1} µs per I/O",
            exp.name(),
            cfg.name(),
            r.rw,
            r.block_bytes,
            r.iodepth,
            r.jobs,
            r.iops,
            r.p50_us,
            r.p99_us,
            r.disk_queue,
            r.daemon_cpu_us_per_io
        );
        recs.push(r);
    }
    if let Some(mut m) = mount {
        m.stop();
    }
    if let Some(l) = lenders.as_mut() {
        l.stop();
    }
    Ok(recs)
}

/// `/sys/module/fuse/parameters/enable_uring`, on while this lives, then as it was.
struct KernelSwitch {
    before: String,
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

impl KernelSwitch {
    fn on() -> Result<KernelSwitch> {
        let before = std::fs::read_to_string(ENABLE_URING)
            .map_err(|e| BenchError::Setup(format!("{ENABLE_URING}: {e} (passthrough-ring needs Linux 6.14+)")))?;
        std::fs::write(ENABLE_URING, "Y").map_err(|e| BenchError::Setup(format!("writing {ENABLE_URING}: {e}")))?;
        Ok(KernelSwitch { before: before.trim().to_string() })
    }
}

impl Drop for KernelSwitch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(ENABLE_URING, &self.before) {
            note!("paper: could not restore {ENABLE_URING} to {}: {e}", self.before);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_cover_the_issues_matrix() {
        let e = points(Experiment::Engine, false);
        assert_eq!(e.len(), 2 * JOBS.len() * QUEUE_DEPTHS.len());
        assert!(e.contains(&("randwrite", 4096, 32, 4, "io_uring")));
        assert_eq!(points(Experiment::Engine, true).len(), 8);
        assert_eq!(points(Experiment::Serial, true).iter().map(|p| p.3).collect::<Vec<_>>(), [1, 16]);
        let s = points(Experiment::Serial, false);
        assert_eq!(s.iter().map(|p| p.3).collect::<Vec<_>>(), PROCESSES.to_vec());
        assert!(s.iter().all(|p| p.1 == 8192 && p.2 == 1 && p.4 == "psync"));
        let a = fio_args(Path::new("/m/f"), e[0], 7);
        let a: Vec<String> = a.iter().map(|x| x.to_string_lossy().to_string()).collect();
        for want in ["--filename=/m/f", "--rw=randread", "--iodepth=1", "--runtime=7", "--direct=1"] {
            assert!(a.iter().any(|x| x == want), "{want} in {a:?}");
        }
    }

    #[test]
    fn reads_a_process_cpu_time() {
        // Spin until this thread has had 300 ms of CPU by its own clock (not 300 ms of wall
        // time: on a loaded machine that may be a few ms of CPU), bounded by 20 s of wall time.
        let thread_cpu = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: clock_gettime writes the timespec it is given.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
        };
        let before = cpu_secs(std::process::id());
        let (t0, c0) = (Instant::now(), thread_cpu());
        let mut x = 0u64;
        while thread_cpu() - c0 < 0.3 && t0.elapsed() < Duration::from_secs(20) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
        assert!(x != 1);
        let spun = thread_cpu() - c0;
        assert!(spun >= 0.3, "only {spun} s of CPU in 20 s of wall time");
        // The process's time (all its threads, in clock ticks) holds at least this thread's.
        let spent = cpu_secs(std::process::id()) - before;
        assert!(spent >= spun - 0.05 && spent < spun + 5.0, "{spent} s for the process, {spun} s spun");
    }

    #[test]
    fn reads_fios_json() {
        let json = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs":[{"read":{"iops":1234.5,"clat_ns":{"percentile":{"50.000000":55000,"99.000000":120000}}},
          "write":{"iops":0.0}}]}"#;
        let (iops, p50, p99) = parse_fio(json, "randread").unwrap();
        assert_eq!((iops, p50, p99), (1234.5, 55.0, 120.0));
        assert!(parse_fio(json, "randwrite").unwrap().0 == 0.0);
        assert!(parse_fio("fio: no such file", "randread").is_err());
    }

    #[test]
    fn the_serialized_mount_is_one_thread_and_the_sync_engine() {
        let lines: Vec<&str> = SERIALIZED_CONFIG.lines().collect();
        assert_eq!(lines, ["[mount]", "threads = 1", "io_engine = \"sync\""]);
    }
}
