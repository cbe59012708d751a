//! `farcache bench restart`: the stall an application sees when the mount daemon is upgraded
//! in place or crashes (issue 15).
//!
//! A real `farcache mount --supervise` (this binary) on a backing directory here, a reader
//! (4 KiB `O_DIRECT` random reads, queue depth 1) and a writer (4 KiB `O_DIRECT` random
//! writes, queue depth 1) through it, every request's start and latency recorded. Then, in
//! turn, `events` upgrades (SIGHUP to the supervisor: `--takeover` of a new daemon) and
//! `events` crashes (SIGKILL of the daemon, restarted by the supervisor), each after the load
//! has run undisturbed for [`BASELINE`]. Per event:
//!
//! - **stall**: the longest request that was under way at any moment of the event — from the
//!   signal until the harness sees the replacement done (the old daemon gone and the new one
//!   running) — reader and writer alike: requests that meet no daemon wait in the kernel, so
//!   the ones in flight across the gap carry it whole;
//! - **back to 95%**: from the signal until the first [`WINDOW`], starting once those requests
//!   are answered, whose throughput (reads and writes) is at least 95% of the [`BASELINE`]
//!   before the event, looking at most [`OBSERVE`] ahead.
//!
//! The mount runs `--no-remote` (no lender): what is measured is the daemon's replacement,
//! not a cold cache refilling. `O_DIRECT` keeps the page cache out of the way, so every
//! request reaches the daemon. Everything is bounded: events, the time each may take, the
//! recorded requests (the recorder stops recording past [`MAX_SAMPLES`] and says so).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::IoContext;
use crate::{BenchError, Result};

const BLOCK: usize = 4096;
/// Undisturbed load before each event: its throughput is the event's baseline.
pub const BASELINE: Duration = Duration::from_secs(1);
/// The window in which throughput counts as back.
pub const WINDOW: Duration = Duration::from_millis(200);
/// How far after an event recovery is looked for. Longer than the 2 s target, so that an
/// event back late is told from one never back, and the last second shows where the load
/// settled (see [`EventResult::settled_ratio`]).
pub const OBSERVE: Duration = Duration::from_secs(5);
/// Requests recorded per thread, at most (16 bytes each).
pub const MAX_SAMPLES: usize = 8 << 20;
/// How long a new daemon may take to appear, and the mount to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Targets of issue 15.
pub const UPGRADE_P99_TARGET: Duration = Duration::from_millis(100);
pub const CRASH_P99_TARGET: Duration = Duration::from_secs(1);
pub const RECOVERY_TARGET: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct RestartBenchOptions {
    /// The `farcache` binary (this one).
    pub exe: PathBuf,
    /// Where the backing directory, mount point and logs go (ext4 or another file system
    /// whose file handles carry the inode number: see docs/SEMANTICS.md).
    pub dir: PathBuf,
    /// Upgrades, and as many crashes.
    pub events: usize,
    /// Size of the file read and of the file written.
    pub file_bytes: u64,
}

impl RestartBenchOptions {
    pub fn full(exe: PathBuf, dir: PathBuf) -> Self {
        RestartBenchOptions { exe, dir, events: 30, file_bytes: 256 << 20 }
    }
    pub fn quick(exe: PathBuf, dir: PathBuf) -> Self {
        RestartBenchOptions { exe, dir, events: 3, file_bytes: 16 << 20 }
    }
}

/// One event's figures.
#[derive(Clone, Debug, Serialize)]
pub struct EventResult {
    pub kind: &'static str,
    /// Requests per second, reads and writes, in the [`BASELINE`] before.
    pub baseline_ops_per_s: f64,
    pub stall_us: u64,
    /// `None`: not back to 95% within [`OBSERVE`].
    pub recovery_us: Option<u64>,
    /// Throughput in the last second of [`OBSERVE`] over the baseline: where the load settled
    /// long after the event. An event not back whose settled ratio is also under 0.95 had a
    /// baseline above what the undisturbed load then ran at.
    pub settled_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub kind: &'static str,
    pub events: usize,
    pub stall_us_p50: u64,
    pub stall_us_p99: u64,
    pub stall_us_max: u64,
    /// An event not back within [`OBSERVE`] counts as [`NOT_BACK`] here.
    pub recovery_us_p50: u64,
    pub recovery_us_p99: u64,
    pub recovery_us_max: u64,
    /// Events not back to 95% within [`OBSERVE`].
    pub not_back: usize,
}

/// What an event not back within [`OBSERVE`] counts as in the percentiles.
pub const NOT_BACK: u64 = u64::MAX;

#[derive(Clone, Debug, Serialize)]
pub struct RestartReport {
    pub events: Vec<EventResult>,
    pub summaries: Vec<Summary>,
    /// Requests between events with no event (the undisturbed longest request), in µs.
    pub quiet_longest_us: u64,
    pub samples_dropped: bool,
}

/// One recorded request: start (µs since the run's origin) and latency (µs).
#[derive(Clone, Copy)]
struct Sample {
    start_us: u64,
    lat_us: u64,
}

struct Recorder {
    samples: Mutex<Vec<Sample>>,
    dropped: AtomicBool,
    errors: Mutex<Vec<String>>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder { samples: Mutex::new(Vec::new()), dropped: AtomicBool::new(false), errors: Mutex::new(Vec::new()) }
    }
}

/// A supervised mount, unmounted and reaped when dropped (also on error).
struct Supervised {
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
}

impl Supervised {
    fn start(o: &RestartBenchOptions, backing: &Path, mnt: &Path) -> Result<Supervised> {
        let log = o.dir.join("supervisor.log");
        let ctl = o.dir.join("ctl.sock");
        let err = File::create(&log).ctx(|| format!("create {}", log.display()))?;
        let child = Command::new(&o.exe)
            .args(["mount", "--supervise", "--restart-limit", "1000", "--restart-window", "1", "--no-remote"])
            .arg("--control-socket")
            .arg(&ctl)
            .arg(backing)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .ctx(|| format!("start {} mount --supervise", o.exe.display()))?;
        let s = Supervised { child, mnt: mnt.to_path_buf(), log };
        let t0 = Instant::now();
        while !fuse_mounted(mnt) {
            if t0.elapsed() > START_TIMEOUT {
                return Err(BenchError::Setup(format!(
                    "the mount did not come up within {START_TIMEOUT:?}; its log ends:\n{}",
                    s.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(s)
    }

    fn log_tail(&self) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let l: Vec<&str> = t.lines().collect();
        l[l.len().saturating_sub(20)..].join("\n")
    }

    /// The daemon the supervisor runs now, other than `not`, once there is exactly one.
    fn daemon(&self, not: Option<u32>) -> Result<u32> {
        let t0 = Instant::now();
        loop {
            let c = children(self.child.id());
            if c.len() == 1 && Some(c[0]) != not {
                return Ok(c[0]);
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(BenchError::Setup(format!(
                    "no single new daemon under the supervisor after {START_TIMEOUT:?} (children {c:?}); its log \
                     ends:\n{}",
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our unreaped child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if fuse_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out
}

fn fuse_mounted(mnt: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.to_str().unwrap_or_default().replace(' ', "\\040");
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-");
        f.len() > 4 && f[4] == want && sep.is_some_and(|i| f.get(i + 1).is_some_and(|t| t.starts_with("fuse")))
    })
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// An aligned 4 KiB buffer for `O_DIRECT`.
fn aligned() -> (Vec<u8>, usize) {
    let buf = vec![0u8; 2 * BLOCK];
    let off = buf.as_ptr().align_offset(BLOCK);
    (buf, off)
}

/// Closed-loop requests on `file` until `stop`: reads, or writes, of 4 KiB at random blocks.
fn load(file: File, blocks: u64, write: bool, origin: Instant, stop: Arc<AtomicBool>, rec: Arc<Recorder>) {
    let (mut buf, off) = aligned();
    let mut x = if write { 99u64 } else { 7 };
    let mut local = Vec::with_capacity(1 << 16);
    let flush = |local: &mut Vec<Sample>| {
        let mut s = rec.samples.lock().unwrap_or_else(|e| e.into_inner());
        let room = MAX_SAMPLES.saturating_sub(s.len());
        if local.len() > room {
            rec.dropped.store(true, Ordering::Relaxed);
        }
        s.extend(local.drain(..).take(room));
    };
    while !stop.load(Ordering::Relaxed) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = ((x >> 33) % blocks) * BLOCK as u64;
        let b = &mut buf[off..off + BLOCK];
        let t0 = Instant::now();
        let r = if write {
            b[..8].copy_from_slice(&x.to_le_bytes());
            file.write_at(b, at)
        } else {
            file.read_at(b, at)
        };
        let lat = t0.elapsed();
        match r {
            Ok(n) if n == BLOCK => {}
            Ok(n) => rec.errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("short transfer: {n} bytes")),
            Err(e) => {
                rec.errors.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{e}"));
                return;
            }
        }
        local.push(Sample { start_us: t0.duration_since(origin).as_micros() as u64, lat_us: lat.as_micros() as u64 });
        if local.len() == local.capacity() {
            flush(&mut local);
        }
    }
    flush(&mut local);
}

/// Run the benchmark; the caller prints the report.
pub fn run(o: &RestartBenchOptions, say: &dyn Fn(&str)) -> Result<RestartReport> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(BenchError::Setup(
            "bench restart needs root (mounting, and open_by_handle_at for a crashed daemon's node ids): run it with \
             sudo"
                .into(),
        ));
    }
    let backing = o.dir.join("backing");
    let mnt = o.dir.join("mnt");
    for d in [&backing, &mnt] {
        std::fs::create_dir_all(d).ctx(|| format!("create {}", d.display()))?;
    }
    let blocks = o.file_bytes / BLOCK as u64;
    for name in ["read", "written"] {
        let p = backing.join(name);
        let f = File::create(&p).ctx(|| format!("create {}", p.display()))?;
        // Real blocks, not a hole: the backing reads hit the disk (or its cache) as data.
        let chunk = vec![0x5au8; 1 << 20];
        for i in 0..o.file_bytes.div_ceil(chunk.len() as u64) {
            f.write_all_at(&chunk, i * chunk.len() as u64).ctx(|| format!("write {}", p.display()))?;
        }
        f.sync_all().ctx(|| format!("fsync {}", p.display()))?;
    }
    let sup = Supervised::start(o, &backing, &mnt)?;
    let open = |name: &str, write: bool| {
        let p = mnt.join(name);
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .ctx(|| format!("open {} through the mount", p.display()))
    };
    let (reader, writer) = (open("read", false)?, open("written", true)?);
    let origin = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let rec = Arc::new(Recorder::new());
    let threads: Vec<_> = [(reader, false), (writer, true)]
        .into_iter()
        .map(|(f, w)| {
            let (stop, rec) = (stop.clone(), rec.clone());
            std::thread::spawn(move || load(f, blocks, w, origin, stop, rec))
        })
        .collect();
    let stopper = StopOnDrop(stop.clone());

    // The events: all upgrades, then all crashes (a crash's cold start does not then weigh
    // on the next upgrade's baseline).
    let mut marks: Vec<(&'static str, u64, u64)> = Vec::new();
    let mut daemon = sup.daemon(None)?;
    let kinds = std::iter::repeat_n("upgrade", o.events).chain(std::iter::repeat_n("crash", o.events));
    for (i, kind) in kinds.enumerate() {
        std::thread::sleep(BASELINE);
        let at = origin.elapsed().as_micros() as u64;
        if kind == "upgrade" {
            // SAFETY: kill(2) on our unreaped child.
            unsafe { libc::kill(sup.child.id() as i32, libc::SIGHUP) };
        } else {
            // SAFETY: kill(2) on the supervisor's child, which it has not reaped (it waits
            // for it).
            unsafe { libc::kill(daemon as i32, libc::SIGKILL) };
        }
        let next = sup.daemon(Some(daemon))?;
        let t0 = Instant::now();
        while alive(daemon) && t0.elapsed() < START_TIMEOUT {
            std::thread::sleep(Duration::from_millis(1));
        }
        marks.push((kind, at, origin.elapsed().as_micros() as u64));
        daemon = next;
        // Observe the recovery before the next baseline begins.
        std::thread::sleep(OBSERVE);
        if let Some(e) = rec.errors.lock().unwrap_or_else(|e| e.into_inner()).first() {
            return Err(BenchError::Setup(format!(
                "a request through the mount failed during event {i} ({kind}): {e}; the supervisor's log ends:\n{}",
                sup.log_tail()
            )));
        }
        say(&format!("event {}/{}: {kind}", i + 1, 2 * o.events));
    }
    drop(stopper);
    for t in threads {
        let _ = t.join();
    }
    drop(sup);

    let mut samples = std::mem::take(&mut *rec.samples.lock().unwrap_or_else(|e| e.into_inner()));
    samples.sort_unstable_by_key(|s| s.start_us);
    let events: Vec<EventResult> = marks.iter().map(|&(kind, at, done)| measure(&samples, kind, at, done)).collect();
    let quiet_longest_us = quiet_longest(&samples, &marks);
    let summaries = ["upgrade", "crash"].iter().map(|k| summarize(k, &events)).collect();
    Ok(RestartReport { events, summaries, quiet_longest_us, samples_dropped: rec.dropped.load(Ordering::Relaxed) })
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Requests completed in `[from, to)` µs, from samples sorted by start.
fn completed(samples: &[Sample], from: u64, to: u64) -> usize {
    // A request completes at start + latency; none lasts longer than the whole run, so only
    // those started before `to` can count.
    let end = samples.partition_point(|s| s.start_us < to);
    samples[..end].iter().filter(|s| (from..to).contains(&(s.start_us + s.lat_us))).count()
}

/// One event: signalled at `at`, replacement seen done at `done` (µs since the origin).
fn measure(samples: &[Sample], kind: &'static str, at: u64, done: u64) -> EventResult {
    let base_us = BASELINE.as_micros() as u64;
    let baseline = completed(samples, at.saturating_sub(base_us), at) as f64 / BASELINE.as_secs_f64();
    // Under way at some moment of the event: started before it was done, ended after it began.
    let end = samples.partition_point(|s| s.start_us <= done);
    let across = samples[..end].iter().filter(|s| s.start_us + s.lat_us >= at);
    let (stall_us, resumed) = across.fold((0, at), |(m, r), s| (m.max(s.lat_us), r.max(s.start_us + s.lat_us)));
    let win_us = WINDOW.as_micros() as u64;
    let need = 0.95 * baseline * WINDOW.as_secs_f64();
    let mut recovery_us = None;
    let mut t = resumed;
    while t + win_us <= at + OBSERVE.as_micros() as u64 {
        if completed(samples, t, t + win_us) as f64 >= need {
            recovery_us = Some(t - at);
            break;
        }
        t += 5_000;
    }
    let obs_end = at + OBSERVE.as_micros() as u64;
    let settled = completed(samples, obs_end - 1_000_000, obs_end) as f64;
    let settled_ratio = if baseline > 0.0 { settled / baseline } else { 0.0 };
    EventResult { kind, baseline_ops_per_s: baseline, stall_us, recovery_us, settled_ratio }
}

/// The longest request that overlapped no event (from a signal to [`OBSERVE`] after it).
fn quiet_longest(samples: &[Sample], marks: &[(&str, u64, u64)]) -> u64 {
    let obs = OBSERVE.as_micros() as u64;
    samples
        .iter()
        .filter(|s| marks.iter().all(|&(_, at, _)| s.start_us + s.lat_us < at || s.start_us > at + obs))
        .map(|s| s.lat_us)
        .max()
        .unwrap_or(0)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn summarize(kind: &'static str, events: &[EventResult]) -> Summary {
    let of: Vec<&EventResult> = events.iter().filter(|e| e.kind == kind).collect();
    let mut stalls: Vec<u64> = of.iter().map(|e| e.stall_us).collect();
    stalls.sort_unstable();
    let mut rec: Vec<u64> = of.iter().map(|e| e.recovery_us.unwrap_or(NOT_BACK)).collect();
    rec.sort_unstable();
    Summary {
        kind,
        events: of.len(),
        stall_us_p50: percentile(&stalls, 50.0),
        stall_us_p99: percentile(&stalls, 99.0),
        stall_us_max: stalls.last().copied().unwrap_or(0),
        recovery_us_p50: percentile(&rec, 50.0),
        recovery_us_p99: percentile(&rec, 99.0),
        recovery_us_max: rec.last().copied().unwrap_or(0),
        not_back: of.iter().filter(|e| e.recovery_us.is_none()).count(),
    }
}

/// The report as a table, with each target and whether it was met.
pub fn render(r: &RestartReport) -> String {
    let ms = |us: u64| format!("{:.1} ms", us as f64 / 1000.0);
    let opt = |us: u64| if us == NOT_BACK { format!("> {OBSERVE:?}") } else { ms(us) };
    let mut out = String::from(
        "| event | n | stall p50 | stall p99 | stall max | back to 95% p50 | p99 | max | targets |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.summaries {
        let stall_target = if s.kind == "upgrade" { UPGRADE_P99_TARGET } else { CRASH_P99_TARGET };
        let met = Duration::from_micros(s.stall_us_p99) < stall_target
            && s.recovery_us_p99 != NOT_BACK
            && Duration::from_micros(s.recovery_us_p99) <= RECOVERY_TARGET;
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | stall p99 < {stall_target:?}, back ≤ {RECOVERY_TARGET:?}: {} |\n",
            s.kind,
            s.events,
            ms(s.stall_us_p50),
            ms(s.stall_us_p99),
            ms(s.stall_us_max),
            opt(s.recovery_us_p50),
            opt(s.recovery_us_p99),
            opt(s.recovery_us_max),
            if met { "met" } else { "NOT met" }
        );
    }
    for s in r.summaries.iter().filter(|s| s.not_back > 0) {
        out += &format!("\n{} of {} {}s: not back to 95% within {OBSERVE:?}", s.not_back, s.events, s.kind);
    }
    for e in r.events.iter().filter(|e| e.recovery_us.is_none_or(|us| Duration::from_micros(us) > RECOVERY_TARGET)) {
        let back = e.recovery_us.map_or(format!("not back in {OBSERVE:?}"), |us| format!("back in {}", ms(us)));
        out += &format!(
            "\n{} {back}: baseline {:.0} requests/s, last second of {OBSERVE:?} at {:.2}× the baseline",
            e.kind, e.baseline_ops_per_s, e.settled_ratio
        );
    }
    out += &format!("\nlongest request outside any event: {}\n", ms(r.quiet_longest_us));
    if r.samples_dropped {
        out += &format!("(more than {MAX_SAMPLES} requests per run: later ones were not recorded)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start_us: u64, lat_us: u64) -> Sample {
        Sample { start_us, lat_us }
    }

    /// A steady 1 request per ms, a 300 ms hole at the event with one request spanning it:
    /// the stall is that request, throughput is back right after the hole.
    #[test]
    fn the_stall_is_the_longest_request_across_the_event_and_recovery_follows_the_hole() {
        let at = 2_000_000;
        let mut v: Vec<Sample> = (0..at / 1000).map(|i| s(i * 1000, 900)).collect();
        v.push(s(at - 100, 300_000));
        v.extend((0..5000).map(|i| s(at + 300_000 + i * 1000, 900)));
        v.sort_by_key(|x| x.start_us);
        let e = measure(&v, "crash", at, at + 50_000);
        assert_eq!(e.stall_us, 300_000);
        // The first window with 95% of the baseline may begin up to 5% of a window (10 ms)
        // before the hole ends.
        let r = e.recovery_us.unwrap();
        assert!((285_000..=305_000).contains(&r), "{r}");
        assert!((e.baseline_ops_per_s - 1000.0).abs() < 2.0);
        assert!((e.settled_ratio - 1.0).abs() < 0.01, "{}", e.settled_ratio);
        assert_eq!(quiet_longest(&v, &[("crash", at, at + 50_000)]), 900);
    }

    #[test]
    fn never_back_is_none_and_percentiles_are_nearest_rank() {
        let at = 1_000_000;
        let v: Vec<Sample> = (0..at / 1000).map(|i| s(i * 1000, 500)).collect();
        let e = measure(&v, "upgrade", at, at);
        assert_eq!((e.recovery_us, e.settled_ratio), (None, 0.0));
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!((percentile(&sorted, 50.0), percentile(&sorted, 99.0)), (50, 99));
        assert_eq!(percentile(&[7], 99.0), 7);
    }
}
