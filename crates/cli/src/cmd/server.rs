//! `farcache server`: lend memory until SIGINT/SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use farcache_config::ByteSize;

use crate::config::Config;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on (port 0 picks a free port; the address is printed on stdout).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Memory to lend, e.g. 512MiB or 4GiB.
    #[arg(long)]
    capacity: Option<ByteSize>,
    /// Eviction policy: s3fifo or lru.
    #[arg(long)]
    policy: Option<String>,
    /// How memory is divided among tenants: shared, static, hit-ratio or mrc.
    #[arg(long)]
    allocation: Option<String>,
    /// Serve Prometheus metrics (GET /metrics over HTTP) on this IP:PORT, e.g.
    /// 127.0.0.1:7412 (overrides server.metrics_listen; "" turns it off).
    #[arg(long, value_name = "ADDR", value_parser = super::parse_metrics_listen)]
    metrics_listen: Option<String>,
    /// Configuration file (TOML); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut cfg = Config::load(a.config.as_deref())?.server;
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    if let Some(c) = a.capacity {
        cfg.capacity = c;
    }
    if let Some(p) = a.policy {
        cfg.policy = p;
    }
    if let Some(x) = a.allocation {
        cfg.allocation = x;
    }
    let metrics_origin = if a.metrics_listen.is_some() { "--metrics-listen" } else { "server.metrics_listen" };
    if let Some(m) = a.metrics_listen {
        cfg.metrics_listen = m;
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if cfg.worker_threads > 0 {
        rt.worker_threads(cfg.worker_threads as usize);
    }
    let rt = rt.enable_all().thread_name("farcache-server").build()?;
    rt.block_on(async move {
        let server = farcache_server::Server::new(cfg.clone())?;
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("cannot listen on {} (server.listen)", cfg.listen))?;
        let addr = listener.local_addr()?;
        let metrics = match farcache_config::metrics_listen("server.metrics_listen", &cfg.metrics_listen)? {
            Some(m) => {
                let l = crate::metrics::http::bind(metrics_origin, m)?;
                let s = server.clone();
                Some(crate::metrics::http::serve(l, Arc::new(move || crate::metrics::lender::render(&s)))?)
            }
            None => None,
        };
        tracing::info!(
            "lending {} on {addr}: {} slots of {} bytes, policy {}, allocation {}, {}, {}",
            cfg.capacity,
            cfg.slots(),
            cfg.slot_bytes,
            cfg.policy,
            cfg.allocation,
            if server.tenants().is_open() {
                "open mode (no tenants configured: any client is trusted)".to_string()
            } else {
                format!("{} tenants", cfg.tenants.len())
            },
            match cfg.tls_mode() {
                farcache_server::config::TlsMode::Certificates => {
                    "TLS 1.3 required with client certificates (tenant = certificate common name)"
                }
                farcache_server::config::TlsMode::Psk =>
                    "TLS 1.3 required with the pre-shared key (server.tls_psk_file)",
                farcache_server::config::TlsMode::Plain => "plain TCP (no server.tls_*: trusted networks only)",
            }
        );
        if let Some(m) = metrics {
            tracing::info!("metrics on http://{m}/metrics");
        }
        // Handlers first: a SIGTERM sent as soon as the server says it is ready (a service
        // manager stopping it at once) must stop it cleanly, not kill it.
        let signalled = shutdown_signal()?;
        // The one line on stdout: scripts and tests read the bound address from it.
        println!("farcache server listening on {addr}");
        std::io::stdout().flush()?;
        crate::notify::ready(&format!("lending {} on {addr}", cfg.capacity));
        let shutdown = async {
            signalled.await;
            crate::notify::stopping();
        };
        farcache_server::run(listener, server, shutdown).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Installs SIGINT and SIGTERM handlers now (from then on neither kills the process), and
/// returns a future that resolves on the first of them. Call it inside the runtime, before
/// announcing readiness.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}
