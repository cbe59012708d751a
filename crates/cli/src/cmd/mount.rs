//! `farcache mount BACKING_DIR MOUNTPOINT`: show the backing directory through FUSE, in the
//! foreground, until SIGINT/SIGTERM (then unmount and exit 0) or until someone else unmounts
//! it (`fusermount3 -u MOUNTPOINT`, `umount`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use farcache_engine::cached::CachedPath;
use farcache_engine::remote::{Remote, RemoteConfig};
use farcache_engine::{BackingCountersSnapshot, DataPath, DirectPath};
use farcache_fuse::{Mount, MountConfig, Unmounted};
use farcache_policy::route::Threshold;

#[derive(clap::Args)]
pub struct Args {
    /// Directory whose whole tree the mount shows: the truth, on the (slow) disk.
    backing_dir: PathBuf,
    /// Existing directory to mount on (outside the backing directory, or the backing
    /// directory itself).
    mountpoint: PathBuf,
    /// No remote tier: a plain passthrough, the baseline every benchmark compares against.
    #[arg(long, conflicts_with = "servers")]
    no_remote: bool,
    /// A lender to borrow from (repeat for several; blocks are spread by rendezvous hashing).
    /// With none, a lender runs inside this process with the [server] capacity.
    #[arg(long = "server", value_name = "HOST:PORT")]
    servers: Vec<std::net::SocketAddr>,
    /// Tenant to borrow as.
    #[arg(long, default_value = "default")]
    tenant: String,
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
    let file_cfg = crate::config::Config::load(a.config.as_deref())?;
    let cfg = load(a.config.as_deref())?;
    // The embedded lender's runtime must outlive the mount: kept here until `run` returns.
    let mut _embedded: Option<tokio::runtime::Runtime> = None;
    let mut direct: Option<Arc<DirectPath>> = None;
    let (data, cached): (Arc<dyn DataPath>, Option<Arc<CachedPath<DirectPath>>>) = if a.no_remote {
        tracing::info!("no remote tier (--no-remote): plain passthrough");
        let d = Arc::new(DirectPath::new());
        direct = Some(d.clone());
        (d, None)
    } else {
        let servers = if a.servers.is_empty() {
            let (rt, addr) = embedded_lender(file_cfg.server.clone())?;
            _embedded = Some(rt);
            tracing::info!("no --server: lending {} from this process on {addr}", file_cfg.server.capacity);
            vec![addr]
        } else {
            a.servers.clone()
        };
        let mut rc = RemoteConfig::new(servers);
        rc.tenant = a.tenant.clone();
        let remote = Remote::start(rc).context("starting the remote tier")?;
        let c = Arc::new(CachedPath::new(DirectPath::new(), remote, Threshold::PAPER));
        (c.clone(), Some(c))
    };

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
    if let Some(c) = &cached {
        let r = c.remote().counters();
        let e = c.counters();
        let l = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            "remote tier: {} hits, {} misses, {} bytes from lenders, {} bytes to lenders, {} invalidations, \
             {} fallbacks; {} reads from lenders, {} small reads from disk, {} sequential bypasses; \
             index {} bytes for {} blocks",
            l(&r.hits),
            l(&r.misses),
            l(&r.bytes_from_servers),
            l(&r.bytes_to_servers),
            l(&r.invalidations),
            l(&r.fallbacks),
            l(&e.remote_reads),
            l(&e.disk_reads),
            l(&e.sequential_bypasses),
            c.index().memory_bytes(),
            c.index().remote_blocks()
        );
    }
    let c = match (&cached, &direct) {
        (Some(c), _) => c.disk().counters().snapshot(),
        (None, Some(d)) => d.counters().snapshot(),
        (None, None) => BackingCountersSnapshot::default(),
    };
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

/// Start a lender inside this process on a loopback port: `farcache mount` on one machine.
fn embedded_lender(
    cfg: farcache_server::ServerConfig,
) -> anyhow::Result<(tokio::runtime::Runtime, std::net::SocketAddr)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("farcache-lender")
        .enable_all()
        .build()?;
    let server = farcache_server::Server::new(cfg)?;
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    rt.spawn(async move {
        if let Err(e) = farcache_server::run(listener, server, std::future::pending::<()>()).await {
            tracing::error!("embedded lender failed: {e}");
        }
    });
    Ok((rt, addr))
}
