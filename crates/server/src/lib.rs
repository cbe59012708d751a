//! The farcache lender: a block store in RAM reserved up front, served over TCP.
//!
//! Entry point: [`Server::new`] validates a [`ServerConfig`] and builds the store;
//! [`run`] serves a bound listener until `shutdown` resolves (mini-redis's `server::run`).
//! This crate does not depend on the client-side engine; it speaks only `farcache-wire`.

pub mod alloc;
pub mod config;
mod conn;
pub mod stats;
pub mod store;
pub mod tenants;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farcache_config::ConfigError;
use farcache_wire::Limits;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

pub use config::{ServerConfig, TenantConfig};
pub use stats::ServerStats;
pub use store::{Store, StoreConfig, TenantCounters, TenantId};
pub use tenants::Tenants;

/// Connection-level counters (the store counts the rest).
#[derive(Default)]
pub struct ConnCounters {
    pub active: AtomicU64,
    pub total: AtomicU64,
    /// Refused with ERROR Busy at `max_connections`.
    pub refused: AtomicU64,
    /// Closed for malformed input, failed handshakes or protocol violations.
    pub protocol_errors: AtomicU64,
    /// Closed for idleness, slow frames or a client that does not read.
    pub timeouts: AtomicU64,
}

/// Most connections being refused at once: past this, extra connections are just dropped.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;
/// How long a refused client is given to read its ERROR Busy.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long connections get to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub struct Server {
    cfg: ServerConfig,
    store: Store,
    /// The division of memory among tenants (`server.allocation`).
    allocation: alloc::Allocation,
    tenants: Tenants,
    conns: ConnCounters,
    /// The limits requests are decoded with after the handshake.
    limits: Limits,
    /// Buffer memory connections may borrow beyond their base buffers, in KiB permits.
    buffers: Arc<Semaphore>,
    instance_id: u64,
    started: Instant,
    /// Set when `server.tls_*` are: every connection must then be TLS 1.3 with a client
    /// certificate signed by `server.tls_client_ca`.
    tls: Option<farcache_tls::TlsAcceptor>,
}

impl Server {
    /// Validate the configuration and reserve the store.
    pub fn new(cfg: ServerConfig) -> Result<Arc<Server>, ConfigError> {
        cfg.validate()?;
        let shards = cfg.shards;
        let mut store = Store::new(StoreConfig {
            shards,
            slots_per_shard: (cfg.slots() / shards as u64) as u32,
            slot_bytes: cfg.slot_bytes,
            policy: cfg.policy_kind(),
            max_tenants: cfg.max_tenants,
        });
        let allocation = alloc::Allocation::new(cfg.allocation_kind(), cfg.allocation_interval.get());
        store.set_enforce_targets(allocation.is_dynamic());
        if allocation.kind() == farcache_policy::alloc::AllocationKind::Mrc {
            store.enable_sampling(cfg.max_tenants);
            store.set_fill_unused(true);
        }
        let tenants = Tenants::from_config(&cfg, &store)?;
        let tls = cfg.tls_server_config()?.map(farcache_tls::TlsAcceptor::from);
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| ConfigError::invalid("(random)", e.to_string(), "check /dev/urandom"))?;
        let limits = Limits {
            max_frame_bytes: cfg.max_frame_bytes.bytes() as u32,
            max_batch: effective_max_batch(&cfg),
            max_value_bytes: cfg.slot_bytes,
        };
        let buffer_permits = (cfg.max_buffer_bytes.bytes() / 1024) as usize;
        let server = Arc::new(Server {
            cfg,
            store,
            allocation,
            tenants,
            conns: ConnCounters::default(),
            limits,
            buffers: Arc::new(Semaphore::new(buffer_permits)),
            instance_id: u64::from_le_bytes(id),
            started: Instant::now(),
            tls,
        });
        // The first targets (and, under `shared`, the only ones) before any connection.
        server.allocation.tick(&server);
        Ok(server)
    }

    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    pub fn allocation(&self) -> &alloc::Allocation {
        &self.allocation
    }

    pub fn conn_counters(&self) -> &ConnCounters {
        &self.conns
    }

    pub fn instance_id(&self) -> u64 {
        self.instance_id
    }

    /// Whether clients must speak TLS.
    pub fn tls_required(&self) -> bool {
        self.tls.is_some()
    }
}

/// The batch size a server grants: its configured maximum, lowered so that the answer to a
/// full GET batch (every key a hit) and a full PUT batch both fit in one frame.
pub fn effective_max_batch(cfg: &ServerConfig) -> u16 {
    farcache_wire::fitting_batch(cfg.max_frame_bytes.bytes() as u32, cfg.slot_bytes, cfg.max_batch)
}

/// Serve `listener` until `shutdown` resolves, then close every connection (waiting up to a
/// short grace period) and return.
pub async fn run(
    listener: TcpListener,
    server: Arc<Server>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let conn_slots = Arc::new(Semaphore::new(server.cfg.max_connections as usize));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let (close_tx, close_rx) = watch::channel(false);
    let mut last_refusal_log: Option<Instant> = None;
    if server.allocation.is_dynamic() {
        tokio::spawn(alloc::run(server.clone(), close_rx.clone()));
    }
    tokio::pin!(shutdown);
    loop {
        let (sock, peer) = tokio::select! {
            _ = &mut shutdown => break,
            res = listener.accept() => match res {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = sock.set_nodelay(true);
        match conn_slots.clone().try_acquire_owned() {
            Ok(permit) => {
                server.conns.active.fetch_add(1, Ordering::Relaxed);
                server.conns.total.fetch_add(1, Ordering::Relaxed);
                let server = server.clone();
                let close_rx = close_rx.clone();
                tokio::spawn(async move {
                    conn::serve(&server, sock, peer, close_rx).await;
                    server.conns.active.fetch_sub(1, Ordering::Relaxed);
                    drop(permit);
                });
            }
            Err(_) => {
                server.conns.refused.fetch_add(1, Ordering::Relaxed);
                if last_refusal_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(%peer, "refusing connection: {} connections open (server.max_connections)", server.cfg.max_connections);
                    last_refusal_log = Some(Instant::now());
                }
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, conn::refuse_busy(sock)).await;
                        drop(permit);
                    });
                }
            }
        }
    }
    tracing::info!("shutting down: closing {} connections", server.conns.active.load(Ordering::Relaxed));
    let _ = close_tx.send(true);
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    while server.conns.active.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
