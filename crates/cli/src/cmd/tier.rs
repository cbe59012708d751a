//! The write-back tier from the command line: `farcache tier status PATH`, `farcache tier
//! recover PATH BACKING`, `farcache flush MOUNTPOINT`, and the part of `farcache mount`
//! that puts a tier in front of the data path (`wrap`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use farcache_bench::progress::{Progress, Unit};
use farcache_engine::writeback::{marker, TierConfig, TierControl, WritebackPath};
use farcache_engine::{BackingOptions, DataPath, DirectPath};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Show what a tier holds (offline: not while a mount uses it): its backing directory,
    /// mode, dirty blocks and files.
    Status {
        /// The tier's file or device.
        path: PathBuf,
        /// The raw document.
        #[arg(long)]
        json: bool,
    },
    /// Write everything a tier holds back into its backing directory (offline), then mark the
    /// backing directory complete.
    Recover {
        /// The tier's file or device.
        path: PathBuf,
        /// The backing directory it belongs to (a union's branches as DIR1:DIR2).
        backing: PathBuf,
    },
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match a.cmd {
        Sub::Status { path, json } => status(&path, json),
        Sub::Recover { path, backing } => recover(&path, &backing),
    }
}

/// Refuse anything but an existing tier: these commands never make one.
fn check_is_tier(path: &Path) -> anyhow::Result<()> {
    let mut head = vec![0u8; 2 * farcache_tier::PAGE_BYTES];
    let f = std::fs::File::open(path).with_context(|| format!("tier {}", path.display()))?;
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0)
        .with_context(|| format!("tier {}: too short to be a tier", path.display()))?;
    let magic = farcache_tier::format::SB_MAGIC;
    anyhow::ensure!(
        head[..8] == magic[..] || head[farcache_tier::PAGE_BYTES..][..8] == magic[..],
        "tier {}: not a farcache tier (no superblock); fix: name the file or device given as --tier",
        path.display()
    );
    Ok(())
}

fn open_existing(path: &Path) -> anyhow::Result<(farcache_tier::Log, farcache_tier::Recovered)> {
    let md = std::fs::metadata(path).with_context(|| format!("tier {}: cannot find it", path.display()))?;
    check_is_tier(path)?;
    let mode = farcache_tier::detect(path)?;
    let size = if md.is_file() { md.len() } else { u64::MAX };
    let medium = farcache_tier::medium::open(path, mode, size)?;
    Ok(farcache_tier::Log::open(medium, mode, None)?)
}

fn status(path: &Path, as_json: bool) -> anyhow::Result<()> {
    let in_use = farcache_engine::writeback::tier_in_use(path);
    let (log, rec) = open_existing(path)?;
    let stats = log.stats();
    let files: Vec<_> = log
        .plan(u64::MAX)
        .into_iter()
        .map(|f| {
            let name = farcache_engine::writeback::name::FileName::decode(&f.name);
            json!({ "key": f.key.0, "dirty_blocks": f.blocks.len(), "name": name })
        })
        .collect();
    let doc = json!({ "path": path, "in_use": in_use, "backing": log.backing(), "recovered": rec, "log": stats, "files": files });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("tier       {}", path.display());
    if in_use {
        println!(
            "in use     by a running mount: what follows may already be out of date (`farcache stats MOUNTPOINT`)"
        );
    }
    println!("backing    {}", log.backing());
    println!("mode       {} ({})", stats.mode, stats.durability);
    println!("capacity   {} bytes, {} used", stats.capacity_bytes, stats.used_bytes);
    println!("dirty      {} blocks ({} bytes) of {} files", stats.dirty_blocks, stats.dirty_bytes, stats.files);
    if rec.torn_tail {
        println!("tail       a torn, never acknowledged append after the end (dropped at recovery)");
    }
    for f in &files {
        println!("  {} blocks  {}", f["dirty_blocks"], f["name"]["path"].as_str().unwrap_or("?"));
    }
    Ok(())
}

fn recover(path: &Path, backing: &Path) -> anyhow::Result<()> {
    let cfg = TierConfig { path: path.display().to_string(), ..TierConfig::default() };
    anyhow::ensure!(path.exists(), "tier {}: not found", path.display());
    check_is_tier(path)?;
    let opts = BackingOptions { direct_io: false, direct_writes: false };
    let branches = farcache_fuse::split_branches(&backing.to_string_lossy());
    let (t, root) = if branches.len() > 1 {
        // A union's tier: its interrupted moves finished first, so the files are found
        // where they are.
        let u = farcache_fuse::union::OpenUnion::open(&branches, &farcache_fuse::MountConfig::default())?;
        let shown = u.branches().iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(":");
        (WritebackPath::open_union(DirectPath::new(), &cfg, u.branches(), opts, u.files())?, PathBuf::from(shown))
    } else {
        let root = backing.canonicalize().with_context(|| format!("backing directory {}", backing.display()))?;
        (WritebackPath::open(DirectPath::new(), &cfg, &root, opts)?, root)
    };
    let s = t.stats();
    let clean = t.shutdown(Duration::from_secs(24 * 3600));
    anyhow::ensure!(clean, "tier {}: not everything could be written back (see the log above)", path.display());
    println!(
        "recovered {} blocks of {} files into {}; the backing directory is complete",
        s.destaged_blocks,
        s.recovered.files,
        root.display()
    );
    Ok(())
}

/// A running tier, as the mount's control socket and exit path hold it.
pub type Tier = Arc<dyn TierControl>;

/// What `farcache mount` does with `[tier]`: refuse a backing directory whose tier is dirty
/// but not given (or another tier); with a tier, wrap `data` in it.
pub fn wrap(
    cfg: &TierConfig,
    backing: &Path,
    direct_io: bool,
    data: Arc<dyn DataPath>,
) -> anyhow::Result<(Arc<dyn DataPath>, Option<Tier>)> {
    wrap_waiting(cfg, backing, direct_io, data, Duration::ZERO)
}

/// [`wrap`], waiting up to `wait` for the process that holds the tier to let go of it (a
/// daemon handing the mount over to this one).
pub fn wrap_waiting(
    cfg: &TierConfig,
    backing: &Path,
    direct_io: bool,
    data: Arc<dyn DataPath>,
    wait: Duration,
) -> anyhow::Result<(Arc<dyn DataPath>, Option<Tier>)> {
    let Some((root, cfg)) = precheck(cfg, backing)? else { return Ok((data, None)) };
    let t = Arc::new(WritebackPath::open_waiting(
        data,
        &cfg,
        &root,
        BackingOptions { direct_io, direct_writes: false },
        wait,
    )?);
    Ok((t.clone(), Some(t)))
}

/// What [`wrap_union`] gives: the data path, the tier, and the union opened for it.
pub type Wrapped = (Arc<dyn DataPath>, Option<Tier>, Option<farcache_fuse::union::OpenUnion>);

/// [`wrap`] for a mount of several backing directories (`branches`): every branch's marker
/// checked; with a tier, the union is opened first — the moves a crash interrupted
/// finished — so that the tier finds its files where they are, and handed back for the mount.
pub fn wrap_union(
    cfg: &TierConfig,
    branches: &[PathBuf],
    mount: &farcache_fuse::MountConfig,
    data: Arc<dyn DataPath>,
) -> anyhow::Result<Wrapped> {
    let Some(cfg) = precheck_union(cfg, branches)? else { return Ok((data, None, None)) };
    let opened = farcache_fuse::union::OpenUnion::open(branches, mount)?;
    let opts = BackingOptions { direct_io: mount.direct_io_backing, direct_writes: false };
    let t = Arc::new(WritebackPath::open_union(data, &cfg, opened.branches(), opts, opened.files())?);
    Ok((t.clone(), Some(t), Some(opened)))
}

/// [`wrap_waiting`] for a mount of several backing directories whose union is open already
/// (`files`: a daemon taking the mount over opened it, its journal replayed, with the mount).
pub fn wrap_union_waiting(
    cfg: &TierConfig,
    branches: &[PathBuf],
    direct_io: bool,
    data: Arc<dyn DataPath>,
    files: Arc<dyn farcache_engine::UnionFiles>,
    wait: Duration,
) -> anyhow::Result<(Arc<dyn DataPath>, Option<Tier>)> {
    let Some(cfg) = precheck_union(cfg, branches)? else { return Ok((data, None)) };
    let roots = branches.iter().map(|b| b.canonicalize()).collect::<Result<Vec<_>, _>>()?;
    let opts = BackingOptions { direct_io, direct_writes: false };
    let t = Arc::new(WritebackPath::open_union_waiting(data, &cfg, &roots, opts, files, wait)?);
    Ok((t.clone(), Some(t)))
}

/// [`precheck`] of every branch of a union: the settings with the tier's absolute path when
/// there is a tier.
pub fn precheck_union(cfg: &TierConfig, branches: &[PathBuf]) -> anyhow::Result<Option<TierConfig>> {
    let all = branches.iter().map(|b| b.display().to_string()).collect::<Vec<_>>().join(":");
    let mut prepared = None;
    for b in branches {
        prepared = precheck_named(cfg, b, &all)?.map(|(_, c)| c).or(prepared);
    }
    Ok(prepared)
}

/// The checks of [`wrap`] that need not open the tier: the backing root's marker against
/// the tier given, and the tier's settings. `Some` (the canonical root and the settings with
/// the tier's absolute path) when there is a tier to open.
pub fn precheck(cfg: &TierConfig, backing: &Path) -> anyhow::Result<Option<(PathBuf, TierConfig)>> {
    precheck_named(cfg, backing, &backing.display().to_string())
}

/// [`precheck`] of one branch of several (`all`: DIR1:DIR2, for the fix the error names).
fn precheck_named(cfg: &TierConfig, backing: &Path, all: &str) -> anyhow::Result<Option<(PathBuf, TierConfig)>> {
    // A backing directory that is missing or not a directory: `Mount::new` says so, in its words.
    let Some(root) = backing.canonicalize().ok().filter(|r| r.is_dir()) else { return Ok(None) };
    let tier_path = if cfg.enabled() { std::path::absolute(&cfg.path)?.display().to_string() } else { String::new() };
    marker::check_named(&root, &tier_path, all).map_err(anyhow::Error::msg)?;
    if !cfg.enabled() {
        return Ok(None);
    }
    cfg.validate()?;
    Ok(Some((root, TierConfig { path: tier_path, ..cfg.clone() })))
}

/// Set while the mount writes its tier back on the way out: the signal thread's grace
/// period does not cut that short (a second signal still does; what is left is recovered
/// at the next start).
static DRAINING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The clean-unmount write-back: everything, however long it takes (a second SIGTERM or
/// SIGINT while it runs on the main thread exits the daemon, and the next mount recovers the
/// rest).
pub fn shutdown(t: &Tier) {
    DRAINING.store(true, std::sync::atomic::Ordering::SeqCst);
    t.shutdown(Duration::from_secs(365 * 24 * 3600));
    DRAINING.store(false, std::sync::atomic::Ordering::SeqCst);
}

/// Resolves once no tier is being written back.
pub async fn drained() {
    while DRAINING.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `grace`, then however long a tier write-back on the way out still takes.
pub async fn after_grace(grace: Duration) {
    tokio::time::sleep(grace).await;
    drained().await;
}

#[derive(clap::Args)]
pub struct FlushArgs {
    /// The mount point of a running `farcache mount` with a tier.
    mountpoint: PathBuf,
    /// Give up after this long (e.g. 10m).
    #[arg(long, default_value = "1h")]
    timeout: farcache_config::HumanDuration,
    /// Control socket of the mount (see `farcache stats --help`).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<PathBuf>,
}

/// `farcache flush MOUNTPOINT`: destage everything, with progress on stderr, and wait.
pub fn flush(a: FlushArgs) -> anyhow::Result<()> {
    let socket = crate::control::client::socket_for(&a.mountpoint, a.control_socket.as_deref())?;
    let t0 = Instant::now();
    // Progress over the bytes dirty at the first answer (a bar on a terminal, plain lines
    // otherwise); more written meanwhile only moves the bar back.
    let mut bar: Option<(Progress, u64)> = None;
    // What the tier held at the first ask: the later asks wait for the same records, not for
    // what writers add meanwhile (a flush beside a steady writer ends).
    let mut through: Option<u64> = None;
    loop {
        let wait = crate::control::MAX_FLUSH_WAIT.as_millis() as u64;
        let mut ask = json!({"cmd":"flush","wait_ms":wait});
        if let Some(t) = through {
            ask["through"] = json!(t);
        }
        let v = crate::control::client::call_mount(&a.mountpoint, &socket, &ask)?;
        through = through.or(v["through"].as_u64());
        if v["done"].as_bool() == Some(true) {
            if let Some((p, total)) = &bar {
                p.set(*total);
                p.finish();
            }
            eprintln!(
                "flushed: everything written before the flush is on the backing directory ({:.1} s)",
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        let left = v["dirty_bytes"].as_u64().unwrap_or(0);
        let (p, total) =
            bar.get_or_insert_with(|| (Progress::new("flush", left, Unit::Bytes).every(Duration::from_secs(2)), left));
        p.set(total.saturating_sub(left));
        anyhow::ensure!(t0.elapsed() < a.timeout.get(), "flush: timed out after {} with {left} bytes dirty", a.timeout);
    }
}
