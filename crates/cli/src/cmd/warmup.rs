//! `farcache warmup MOUNTPOINT PATH...`: fill the lenders with the named files' blocks, at a
//! bounded rate, so that a restarted or new host starts warm (as `juicefs warmup` or vmtouch
//! do for their caches).
//!
//! It reads the files *through the mount*, one 4 KiB `O_DIRECT` read per read-around window:
//! each read that misses makes the mount read its window from the disk and fill the lenders
//! with all of it, exactly as an application's read would. So warm-up goes through the one
//! data path whose invariants are tested (a block is cached under the key of the bytes the disk
//! has now, whatever writes race with it), and never fills the host's page cache. The control
//! socket says whether the mount can be warmed (it has a remote tier), how wide its read-around
//! window is, and how many blocks the warm-up filled. It never outruns the lenders: past
//! [`MAX_BACKLOG_BLOCKS`] fills not yet stored it waits (bounded), whatever `--rate` says.

use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use farcache_bench::progress::{Progress, Unit};
use farcache_config::ByteSize;
use serde_json::{json, Value};

use crate::control::client::call_mount;

/// Most files one warm-up walks (directories are walked for regular files).
pub const MAX_FILES: usize = 1_000_000;
/// One plain progress line per this much time (when stderr is not a terminal).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How long to wait for the fills still queued at the end to be stored.
const DRAIN_WAIT: Duration = Duration::from_secs(5);
/// Warm-up looks at the mount's fill queue after this many bytes read...
const BACKLOG_CHECK_BYTES: u64 = 1 << 20;
/// ... and waits while more than this many of its blocks are not yet stored (or dropped or
/// failed): the queue is bounded and drops what overflows, and a warm-up must not outrun
/// the lenders whatever --rate says.
const MAX_BACKLOG_BLOCKS: u64 = 256;
/// The longest one such wait (then it goes on: the lenders are slow, not the warm-up's fault).
const BACKLOG_WAIT: Duration = Duration::from_secs(5);

/// Fills asked of the mount since `before` that are not settled yet (stored, dropped or
/// failed), in blocks.
fn backlog(before: &Value, now: &Value) -> u64 {
    let settled =
        |v: &Value| count(v, "remote", "puts") + count(v, "remote", "puts_dropped") + count(v, "remote", "puts_failed");
    let asked = count(now, "engine", "fills") - count(before, "engine", "fills");
    asked.saturating_sub(settled(now).saturating_sub(settled(before)))
}
const BLOCK: u64 = 4096;

#[derive(clap::Args)]
pub struct Args {
    /// The farcache mount the files are on.
    mountpoint: PathBuf,
    /// Files (or directories, walked for regular files) under MOUNTPOINT.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Most file bytes covered per second (each costs the disk a read of its window once).
    #[arg(long, default_value = "64MiB")]
    rate: ByteSize,
    /// The mount's control socket, if not the default one for MOUNTPOINT.
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
}

/// What the mount's counters say.
fn counters(mnt: &Path, socket: &Path) -> anyhow::Result<Value> {
    let v = call_mount(mnt, socket, &json!({ "cmd": "stats" }))?;
    Ok(v.get("stats").cloned().unwrap_or(Value::Null))
}

fn count(v: &Value, section: &str, field: &str) -> u64 {
    v[section][field].as_u64().unwrap_or(0)
}

/// The regular files `paths` name (directories walked, symbolic links not followed), each
/// checked to lie under the canonical mount point `mnt`.
fn files(mnt: &Path, paths: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = Vec::new();
    for p in paths {
        let c = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
        if !c.starts_with(mnt) {
            anyhow::bail!(
                "{} is not under the mount {}: name files or directories inside it",
                p.display(),
                mnt.display()
            );
        }
        todo.push(c);
    }
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).with_context(|| format!("{}", p.display()))?;
        if m.is_dir() {
            for e in std::fs::read_dir(&p).with_context(|| format!("{}", p.display()))? {
                todo.push(e?.path());
            }
        } else if m.is_file() {
            out.push((p, m.len()));
        }
        if out.len() + todo.len() > MAX_FILES {
            anyhow::bail!("more than {MAX_FILES} files to warm: name fewer directories at a time");
        }
    }
    out.sort();
    Ok(out)
}

/// Paces work to `rate` bytes per second: sleeps until `done` bytes are due.
struct Pace {
    start: Instant,
    rate: f64,
}

impl Pace {
    fn wait(&self, done: u64) {
        let due = Duration::from_secs_f64(done as f64 / self.rate);
        if let Some(ahead) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mnt = std::fs::canonicalize(&a.mountpoint).with_context(|| {
        format!("no farcache mount at {}: the directory cannot be resolved", a.mountpoint.display())
    })?;
    let socket = crate::control::client::socket_for(&mnt, a.control_socket.as_deref())?;
    if a.rate.bytes() < BLOCK {
        anyhow::bail!("--rate {}: set at least 4KiB (per second)", a.rate);
    }
    let before = counters(&mnt, &socket)?;
    if before["remote_tier"] == "none" {
        anyhow::bail!("{} has no remote tier (mounted with --no-remote): there are no lenders to warm", mnt.display());
    }
    // One read per read-around window; without read-around, one per block.
    let stride = before["routing"]["read_around_bytes"].as_u64().unwrap_or(0).max(BLOCK);
    let files = files(&mnt, &a.paths)?;
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    let bar = Progress::new("warmup", total, Unit::Bytes).every(PROGRESS_EVERY);
    let pace = Pace { start: Instant::now(), rate: a.rate.bytes() as f64 };
    let mut buf = vec![0u8; 2 * BLOCK as usize];
    let off = buf.as_ptr().align_offset(BLOCK as usize);
    let mut done = 0u64;
    for (path, len) in &files {
        bar.message(path.strip_prefix(&mnt).unwrap_or(path).display().to_string());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .with_context(|| format!("{}", path.display()))?;
        let mut at = 0;
        while at < *len {
            f.read_at(&mut buf[off..off + BLOCK as usize], at).with_context(|| format!("{}", path.display()))?;
            let step = stride.min(len - at);
            at += step;
            done += step;
            bar.inc(step);
            pace.wait(done);
            if done % BACKLOG_CHECK_BYTES < step {
                let t0 = Instant::now();
                while backlog(&before, &counters(&mnt, &socket)?) > MAX_BACKLOG_BLOCKS && t0.elapsed() < BACKLOG_WAIT {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    bar.finish();
    // Fills leave in the background: wait (bounded) for the queue to drain before counting.
    let filled = |v: &Value| count(v, "engine", "fills");
    let mut after = counters(&mnt, &socket)?;
    let sent = filled(&after) - filled(&before);
    let t0 = Instant::now();
    while t0.elapsed() < DRAIN_WAIT {
        if backlog(&before, &after) == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        after = counters(&mnt, &socket)?;
    }
    let d = |s: &str, f: &str| count(&after, s, f) - count(&before, s, f);
    println!(
        "warmed {} files, {} in {:.1}s: {} blocks filled ({} stored, {} dropped, {} failed); {} blocks read from lenders meanwhile",
        files.len(),
        ByteSize(total).approx(),
        pace.start.elapsed().as_secs_f64(),
        sent,
        d("remote", "puts"),
        d("remote", "puts_dropped"),
        d("remote", "puts_failed"),
        d("remote", "hits"),
    );
    std::io::stdout().flush()?;
    Ok(())
}
