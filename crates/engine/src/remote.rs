//! The lenders, seen from the borrower: connections kept up in the background, blocks placed
//! by rendezvous hashing, and every operation bounded in time so that a dead, hung or cut-off
//! lender costs misses and never an error or a wait past `fetch_timeout`.
//!
//! Runs on a small tokio runtime of its own; the FUSE threads call in synchronously
//! (`Handle::block_on` from outside the runtime). Stores (fills) and deletions
//! (invalidations) are fire-and-forget, bounded by semaphores: when too many are pending,
//! new ones are dropped and counted — the disk still has the data.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use farcache_client::{Client, ClientConfig, Key, PutStatus};
use farcache_policy::placement;
use parking_lot::RwLock;
use tokio::sync::Semaphore;

use crate::index::BlockKey;

/// How the borrower reaches its lenders.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    pub servers: Vec<SocketAddr>,
    pub tenant: String,
    pub secret: Vec<u8>,
    /// The most a read waits for lenders before it goes to the disk.
    pub fetch_timeout: Duration,
    pub connect_timeout: Duration,
    /// First and last wait between reconnection attempts (doubling in between).
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Stores (fills) in flight at once; more are dropped.
    pub max_pending_puts: usize,
    /// Deletions in flight at once; more are dropped (their copies are unreachable anyway).
    pub max_pending_dels: usize,
    /// Runtime threads for the lender connections.
    pub threads: usize,
}

impl RemoteConfig {
    pub fn new(servers: Vec<SocketAddr>) -> RemoteConfig {
        RemoteConfig {
            servers,
            tenant: "default".into(),
            secret: Vec::new(),
            fetch_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(500),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            max_pending_puts: 256,
            max_pending_dels: 64,
            threads: 2,
        }
    }
}

/// Counters of the remote tier (paper 000's Table 9 and more).
#[derive(Debug, Default)]
pub struct RemoteCounters {
    pub gets: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_from_servers: AtomicU64,
    pub puts: AtomicU64,
    pub puts_dropped: AtomicU64,
    pub puts_failed: AtomicU64,
    pub bytes_to_servers: AtomicU64,
    pub invalidations: AtomicU64,
    pub invalidations_dropped: AtomicU64,
    /// Fetches that gave up at `fetch_timeout` or on a connection error.
    pub fallbacks: AtomicU64,
    /// Answers refused: wrong length.
    pub rejected: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
}

struct Lender {
    addr: SocketAddr,
    seed: u64,
    client: RwLock<Option<Client>>,
    /// The lender's instance id at the last connection (0 = never connected).
    instance: AtomicU64,
}

pub struct Remote {
    rt: tokio::runtime::Runtime,
    lenders: Vec<Arc<Lender>>,
    seeds: Vec<u64>,
    cfg: RemoteConfig,
    puts: Arc<Semaphore>,
    dels: Arc<Semaphore>,
    counters: Arc<RemoteCounters>,
}

fn to_key(k: &BlockKey) -> Key {
    Key::new(k.file, k.block, k.version)
}

/// A stable seed per lender address, so its share of blocks does not depend on the order of
/// `--server` flags.
fn seed_of(addr: &SocketAddr) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr.to_string().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    placement::mix64(h)
}

impl Remote {
    /// Start the runtime and one connection keeper per lender. Returns at once: lenders that
    /// are not up yet are retried in the background.
    pub fn start(cfg: RemoteConfig) -> std::io::Result<Remote> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads.max(1))
            .thread_name("farcache-remote")
            .enable_all()
            .build()?;
        let counters = Arc::new(RemoteCounters::default());
        let lenders: Vec<Arc<Lender>> = cfg
            .servers
            .iter()
            .map(|a| {
                Arc::new(Lender { addr: *a, seed: seed_of(a), client: RwLock::new(None), instance: AtomicU64::new(0) })
            })
            .collect();
        for l in &lenders {
            rt.spawn(keep_connected(l.clone(), cfg.clone(), counters.clone()));
        }
        Ok(Remote {
            seeds: lenders.iter().map(|l| l.seed).collect(),
            lenders,
            puts: Arc::new(Semaphore::new(cfg.max_pending_puts)),
            dels: Arc::new(Semaphore::new(cfg.max_pending_dels)),
            cfg,
            rt,
            counters,
        })
    }

    pub fn counters(&self) -> &RemoteCounters {
        &self.counters
    }

    /// Lenders with a live connection now.
    pub fn connected(&self) -> usize {
        self.lenders.iter().filter(|l| l.client.read().as_ref().is_some_and(|c| !c.is_closed())).count()
    }

    fn lender_of(&self, k: &BlockKey) -> Option<usize> {
        let h = placement::mix64((k.file as u64) ^ ((k.file >> 64) as u64).rotate_left(17) ^ k.block.rotate_left(41));
        placement::rendezvous(h, &self.seeds)
    }

    fn client(&self, i: usize) -> Option<Client> {
        self.lenders[i].client.read().as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Fetch `keys` (all of `block_len` bytes), in order; `None` for anything not delivered
    /// correctly within `fetch_timeout`. Never fails. Call from outside the runtime.
    pub fn get(&self, keys: &[BlockKey], block_len: usize) -> Vec<Option<Bytes>> {
        let mut out = vec![None; keys.len()];
        if self.lenders.is_empty() || keys.is_empty() {
            return out;
        }
        self.counters.gets.fetch_add(keys.len() as u64, Ordering::Relaxed);
        // Group by lender; a lender without a connection answers nothing.
        let mut by_lender: Vec<Vec<usize>> = vec![Vec::new(); self.lenders.len()];
        for (i, k) in keys.iter().enumerate() {
            if let Some(l) = self.lender_of(k) {
                by_lender[l].push(i);
            }
        }
        let groups: Vec<(Client, Vec<usize>)> = by_lender
            .into_iter()
            .enumerate()
            .filter(|(_, idx)| !idx.is_empty())
            .filter_map(|(l, idx)| self.client(l).map(|c| (c, idx)))
            .collect();
        let deadline = Instant::now() + self.cfg.fetch_timeout;
        let results = self.rt.handle().block_on(async {
            let futs = groups.into_iter().map(|(client, idx)| {
                let ks: Vec<Key> = idx.iter().map(|&i| to_key(&keys[i])).collect();
                async move {
                    let r = tokio::time::timeout_at(deadline.into(), client.get(&ks)).await;
                    (idx, r)
                }
            });
            join_all(futs).await
        });
        for (idx, r) in results {
            match r {
                Ok(Ok(values)) => {
                    for (i, v) in idx.into_iter().zip(values) {
                        match v {
                            Some(v) if v.len() == block_len => {
                                self.counters.bytes_from_servers.fetch_add(v.len() as u64, Ordering::Relaxed);
                                out[i] = Some(v);
                            }
                            Some(_) => {
                                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                            }
                            None => {}
                        }
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let hits = out.iter().filter(|v| v.is_some()).count() as u64;
        self.counters.hits.fetch_add(hits, Ordering::Relaxed);
        self.counters.misses.fetch_add(keys.len() as u64 - hits, Ordering::Relaxed);
        out
    }

    /// Store `value` under `key` in the background; `done(true)` runs once its lender has
    /// it. Dropped (and `done` never runs) when too many stores are pending or no lender is
    /// connected.
    pub fn put_async(&self, key: BlockKey, value: Bytes, done: impl FnOnce() + Send + 'static) {
        let Some(client) = self.lender_of(&key).and_then(|l| self.client(l)) else {
            self.counters.puts_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Ok(permit) = self.puts.clone().try_acquire_owned() else {
            self.counters.puts_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let counters = self.counters.clone();
        let timeout = self.cfg.fetch_timeout.max(Duration::from_millis(500));
        self.rt.spawn(async move {
            let r = tokio::time::timeout(timeout, client.put(&[(to_key(&key), &value[..])])).await;
            match r {
                Ok(Ok(s)) if s.first() == Some(&PutStatus::Stored) => {
                    counters.puts.fetch_add(1, Ordering::Relaxed);
                    counters.bytes_to_servers.fetch_add(value.len() as u64, Ordering::Relaxed);
                    done();
                }
                _ => {
                    counters.puts_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            drop(permit);
        });
    }

    /// Delete copies that can no longer be named (to free lenders' memory). Best effort.
    pub fn del_async(&self, keys: Vec<BlockKey>) {
        if keys.is_empty() || self.lenders.is_empty() {
            return;
        }
        self.counters.invalidations.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let Ok(permit) = self.dels.clone().try_acquire_owned() else {
            self.counters.invalidations_dropped.fetch_add(keys.len() as u64, Ordering::Relaxed);
            return;
        };
        let mut by_lender: Vec<Vec<Key>> = vec![Vec::new(); self.lenders.len()];
        for k in &keys {
            if let Some(l) = self.lender_of(k) {
                by_lender[l].push(to_key(k));
            }
        }
        let groups: Vec<(Client, Vec<Key>)> = by_lender
            .into_iter()
            .enumerate()
            .filter(|(_, ks)| !ks.is_empty())
            .filter_map(|(l, ks)| self.client(l).map(|c| (c, ks)))
            .collect();
        let timeout = self.cfg.fetch_timeout.max(Duration::from_millis(500));
        self.rt.spawn(async move {
            for (client, ks) in groups {
                let _ = tokio::time::timeout(timeout, client.del(&ks)).await;
            }
            drop(permit);
        });
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        for l in &self.lenders {
            if let Some(c) = l.client.write().take() {
                c.close();
            }
        }
    }
}

/// Keep one lender connected: connect, wait for the connection to end, back off, repeat.
async fn keep_connected(l: Arc<Lender>, cfg: RemoteConfig, counters: Arc<RemoteCounters>) {
    let mut backoff = cfg.reconnect_min;
    loop {
        let mut c = ClientConfig::new(l.addr, cfg.tenant.clone());
        c.secret = cfg.secret.clone();
        c.connect_timeout = cfg.connect_timeout;
        c.request_timeout = cfg.fetch_timeout.max(Duration::from_millis(500));
        match Client::connect(c).await {
            Ok(client) => {
                counters.connects.fetch_add(1, Ordering::Relaxed);
                let instance = client.hello().instance_id;
                let before = l.instance.swap(instance, Ordering::Relaxed);
                if before != 0 && before != instance {
                    tracing::info!(lender = %l.addr, "lender restarted: its memory is new");
                } else {
                    tracing::info!(lender = %l.addr, "connected to lender");
                }
                *l.client.write() = Some(client.clone());
                backoff = cfg.reconnect_min;
                client.wait_closed().await;
                l.client.write().take();
                tracing::warn!(lender = %l.addr, "lost the lender; reads of its blocks go to the disk");
            }
            Err(e) => {
                counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(lender = %l.addr, "cannot connect: {e}");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(cfg.reconnect_max);
    }
}

/// Await futures concurrently on the current task (few of them: one per lender).
async fn join_all<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|v| v.expect("all ready")).collect()
}
