//! `farcache mount BACKING_DIR MOUNTPOINT`: show the backing directory through FUSE, in the
//! foreground, until SIGINT/SIGTERM (then unmount and exit 0) or until someone else unmounts
//! it (`fusermount3 -u MOUNTPOINT`, `umount`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use farcache_engine::DirectPath;
use farcache_fuse::{Mount, MountConfig, Unmounted};

#[derive(clap::Args)]
pub struct Args {
    /// Directory whose whole tree the mount shows: the truth, on the (slow) disk.
    backing_dir: PathBuf,
    /// Existing directory to mount on (outside the backing directory, or the backing
    /// directory itself).
    mountpoint: PathBuf,
    /// No remote tier: a plain passthrough, the baseline every benchmark compares against.
    #[arg(long)]
    no_remote: bool,
    /// Configuration file (TOML); its [mount] table applies.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn load(path: Option<&Path>) -> anyhow::Result<MountConfig> {
    let cfg = crate::config::Config::load(path)?.mount;
    cfg.validate()?;
    Ok(cfg)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = load(a.config.as_deref())?;
    if a.no_remote {
        tracing::info!("no remote tier (--no-remote): plain passthrough");
    } else {
        tracing::info!("remote tiers arrive with the cache engine; serving as a plain passthrough for now");
    }
    let data = Arc::new(DirectPath::new());

    // Signal handlers go in before the mount: a SIGTERM between the mount going live and a
    // handler being installed would kill the daemon and leave a dead mount behind.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut term, mut int) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _in_rt = rt.enter();
        (
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        )
    };

    let mut mount = Mount::new(&a.backing_dir, &a.mountpoint, &cfg, data.clone())?;
    let mut unmounter = mount.unmounter();
    // The one line on stdout, once the mount is live: scripts and tests wait for it.
    println!("farcache mounted {} on {}", a.backing_dir.display(), mount.mountpoint().display());
    std::io::stdout().flush()?;

    let grace = cfg.shutdown_grace.get();
    std::thread::Builder::new().name("farcache-signals".into()).spawn(move || {
        rt.block_on(async move {
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!("{which}: unmounting");
            let code = match unmounter.unmount() {
                Ok(Unmounted::Done | Unmounted::NotMounted) => 0,
                Ok(Unmounted::Detached) => {
                    tracing::warn!("the mount was busy: detached it; waiting up to {grace:?} for its users");
                    0
                }
                Err(e) => {
                    tracing::error!("unmount failed: {e}");
                    1
                }
            };
            // `Mount::run` returns (and the process exits) as soon as the kernel ends the
            // session. If users still hold files after the grace period, or a second signal
            // comes, exit anyway: closing /dev/fuse aborts the connection.
            tokio::select! {
                _ = tokio::time::sleep(grace) => tracing::warn!("still in use after {grace:?}; exiting"),
                _ = term.recv() => tracing::warn!("second signal: exiting now"),
                _ = int.recv() => tracing::warn!("second signal: exiting now"),
            }
            std::process::exit(code);
        })
    })?;

    mount.run()?;
    let c = data.counters().snapshot();
    tracing::info!(
        "backing I/O: {} direct and {} buffered reads ({} bytes), {} writes ({} bytes), \
         {} fsyncs; {} files lost their last name",
        c.reads_direct,
        c.reads_buffered,
        c.read_bytes,
        c.writes,
        c.write_bytes,
        c.fsyncs,
        c.forgets
    );
    Ok(())
}
