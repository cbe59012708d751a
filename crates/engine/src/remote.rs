//! The lenders, seen from the borrower: connections kept up in the background, blocks placed
//! by rendezvous hashing, and every operation bounded in time so that a dead, hung or cut-off
//! lender costs misses and never an error or a wait past `fetch_timeout`.
//!
//! Runs on a small tokio runtime of its own; the FUSE threads call in synchronously
//! (`Handle::block_on` from outside the runtime). Stores (fills) and deletions
//! (invalidations) are fire-and-forget through the [`Outbox`] (`outbox.rs`), which coalesces
//! them into one batch per lender per millisecond and bounds what is queued or in flight:
//! past the bound, new ones are dropped and counted — the disk still has the data.
//!
//! # A lender set that changes at run time
//! The set of lenders is an immutable `LenderSet` behind a lock held only long enough to
//! clone an `Arc`: every operation takes one snapshot and places all its keys over it, so
//! a read never sees half a change. [`Remote::add_lender`] and [`Remote::remove_lender`]
//! build a new set and swap it in; at most `max_lenders` lenders at once. Placement is
//! rendezvous hashing over per-address seeds, so a change moves only the changed lender's
//! share of the blocks.
//!
//! Why a change can never serve stale data: a block is named by its versioned key (file key,
//! block, version), and a write moves every block it touched to a version never used for it
//! before, retiring all its older keys for good (see `index.rs`). A copy stored under a key
//! that a lookup can return is therefore right, on whichever lender it sits. After a change,
//! a block the index marks remote may be looked up on a lender that never had it: that is a
//! miss, the bit is cleared, and the read refills the block to its new lender (under the
//! key the index gives now). Copies left on a lender that no longer owns them are asked for
//! again only if the set changes back — under keys that still name the disk's bytes, since a
//! block written in between has a new key — or age out of its memory.
//!
//! Removing a lender swaps it out of the set, stops its connection keeper and closes its
//! connection, which also fails at once the requests still in flight to it (a hung lender
//! releases its waiting readers then, not at `fetch_timeout`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::index::BlockKey;
use crate::latency::{Latency, LatencySnapshot};
use crate::outbox::{newest_fill, Batch, FillPace, Outbox, PendingPut};
pub use crate::outbox::{FILL_HORIZON, MIN_PUT_BOUND, STANDING_INTERVAL};
use crate::seal::{BlockSeal, Plaintext};
use bytes::Bytes;
use farcache_client::{ClientConfig, ClientError, Key, LenderAddr, LenderClient, PutStatus};
use farcache_policy::placement;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

/// At most one authentication-failure warning per lender per this interval.
pub const AUTH_WARN_INTERVAL: Duration = Duration::from_secs(10);
const NEVER: u64 = u64::MAX;

/// Most blocks in one PUT request of the outbox's: a fetch behind it on a 1 Gbit/s link
/// waits at most about 0.3 ms.
pub const PUT_REQUEST_BLOCKS: usize = 8;
/// Most PUT requests in flight to one lender at once: fills are paced so that a fetch
/// finds at most this many of them ahead of it on the link (64 KiB: 0.5 ms at 1 Gbit/s),
/// not a whole batch of queued fills (up to `max_pending_puts` blocks: 0.27 s at 1 Gbit/s).
/// Measured on the cloud profile before the pacing: a lender hit took a mean 350 µs, 4 KiB
/// fetches 900 µs, while a first pass filled the lenders — slower than the disk it was to
/// replace.
pub const PUT_REQUESTS_IN_FLIGHT: usize = 2;

/// Default for [`RemoteConfig::max_pending_puts`]: 32 MiB of fills, enough for the bursts a
/// rate-limited disk answers a stream in while the link drains them (2048 dropped 25–35% of
/// a stream's fills over 10 Gbit/s; BENCHMARKS.md, "Session 48").
pub const DEFAULT_MAX_PENDING_PUTS: usize = 8192;
/// Default for [`RemoteConfig::max_lenders`].
pub const DEFAULT_MAX_LENDERS: usize = 64;
/// Default for [`RemoteConfig::fetch_connections`].
pub const DEFAULT_FETCH_CONNECTIONS: usize = 8;
/// Default for [`RemoteConfig::fetch_poll`]: off. On two CPUs, polling 50 µs made a lone
/// reader's lender hit 11% faster on an idle machine and 12% slower on a busy one, cost the
/// daemon 15% more CPU under concurrent random reads for no time, and made TPC-H over
/// 10 Gbit/s 4-18% slower when every fetch polled; gated as it is now, two rounds of TPC-H
/// against no polling were no faster (load 1.07x the time, power 1.02x, throughput 0.98x the
/// queries) for 13% more of the daemon's CPU (BENCHMARKS.md, "Session 62").
pub const DEFAULT_FETCH_POLL: Duration = Duration::ZERO;

/// A connection on which the reading thread itself fetches: a current-thread runtime of its
/// own drives the client's reader and writer tasks inside `block_on` on the caller's thread,
/// so a lender hit costs no hand-off to the remote runtime and back (two thread wake-ups of
/// 5–20 µs each here). One thread uses it at a time (checked out of the lender's pool); a
/// connection that failed or timed out is dropped, not returned.
struct FastConn {
    rt: Option<tokio::runtime::Runtime>,
    client: LenderClient,
    /// Its entry in the lender's `fast_all`.
    id: u64,
    /// When it last answered: one idle longer than [`FAST_IDLE_MAX`] is not used again (the
    /// lender may have closed it: `server.idle_timeout`).
    used: Instant,
}

/// A fetch connection's answer: the values, the connection's error, or the deadline passed.
type FastAnswer = Result<Result<Vec<Option<Bytes>>, ClientError>, tokio::time::error::Elapsed>;

/// Counts a fetch in flight until dropped; `now` is the count it entered at, itself included.
struct InFlight<'a> {
    count: &'a AtomicUsize,
    now: usize,
}

impl InFlight<'_> {
    fn enter(count: &AtomicUsize) -> InFlight<'_> {
        InFlight { count, now: count.fetch_add(1, Ordering::Relaxed) + 1 }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether polling for a lender's answers pays: the share of polled fetches whose answer came
/// within the window, an average over about the last eight. Below a quarter (a lender
/// farther than the window: polling would spend CPU for nothing) only one fetch in
/// [`POLL_PROBE_EVERY`] polls, to notice when answers come sooner again.
struct PollGate {
    /// The share, of [`POLL_SCORE_ONE`].
    score: AtomicU32,
    fetches: AtomicU32,
}

const POLL_SCORE_ONE: u32 = 1024;
const POLL_SCORE_MIN: u32 = POLL_SCORE_ONE / 4;
const POLL_PROBE_EVERY: u32 = 16;

impl PollGate {
    fn new() -> PollGate {
        PollGate { score: AtomicU32::new(POLL_SCORE_ONE), fetches: AtomicU32::new(0) }
    }

    fn should_poll(&self) -> bool {
        self.score.load(Ordering::Relaxed) >= POLL_SCORE_MIN
            || self.fetches.fetch_add(1, Ordering::Relaxed).is_multiple_of(POLL_PROBE_EVERY)
    }

    /// A polled fetch ended; `answered`: its answer came while polling.
    fn polled(&self, answered: bool) {
        let gain = if answered { POLL_SCORE_ONE / 8 } else { 0 };
        let _ = self.score.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| Some(s - s / 8 + gain));
    }
}

/// A fetch connection idle this long is dropped rather than used (well under the lender's
/// default `idle_timeout` of 10 minutes, so a read never meets a connection closed for it).
pub const FAST_IDLE_MAX: Duration = Duration::from_secs(60);
/// After a fetch connection failed in use, no new one is made for this long.
const FAST_RETRY_AFTER_FAILURE: Duration = Duration::from_millis(100);

impl FastConn {
    /// Connect on a new current-thread runtime (blocks the calling thread; never call it on
    /// a runtime thread).
    fn connect(addr: LenderAddr, cfg: &RemoteConfig) -> Result<FastConn, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let client =
            rt.block_on(LenderClient::connect(addr.protocol, cfg.client_config(addr))).map_err(|e| e.to_string())?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(FastConn { rt: Some(rt), client, id: NEXT_ID.fetch_add(1, Ordering::Relaxed), used: Instant::now() })
    }

    /// Ask for `keys`; the answer is awaited by polling the connection for up to `poll`
    /// (sending, then checking the socket without sleeping), then by sleeping until it comes
    /// or `deadline` passes. The second return is whether it came while polling.
    fn get(&self, keys: &[Key], deadline: Instant, poll: Duration) -> (FastAnswer, bool) {
        let rt = self.rt.as_ref().expect("runtime until drop");
        // The timer is made inside `block_on`: it needs the runtime's context.
        rt.block_on(async {
            let get = tokio::time::timeout_at(deadline.into(), self.client.get(keys));
            tokio::pin!(get);
            if !poll.is_zero() {
                let until = Instant::now() + poll;
                loop {
                    if let Poll::Ready(r) =
                        std::future::poll_fn(|cx| Poll::Ready(std::future::Future::poll(get.as_mut(), cx))).await
                    {
                        return (r, true);
                    }
                    if Instant::now() >= until {
                        break;
                    }
                    // Back to the runtime, which then checks the socket without blocking (a
                    // yielded task makes it poll its driver with a zero timeout) and runs the
                    // connection's reader if the answer is in.
                    tokio::task::yield_now().await;
                }
            }
            (get.await, false)
        })
    }
}

impl Drop for FastConn {
    fn drop(&mut self) {
        self.client.close();
        // Never blocks, so a connection may be dropped anywhere.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// How the borrower reaches its lenders.
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// The lenders to start with; [`Remote::add_lender`] and [`Remote::remove_lender`] change
    /// the set later.
    pub servers: Vec<LenderAddr>,
    pub tenant: String,
    pub secret: Vec<u8>,
    /// The most a read waits for lenders before it goes to the disk.
    pub fetch_timeout: Duration,
    pub connect_timeout: Duration,
    /// First and last wait between reconnection attempts (doubling in between).
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Blocks queued or in flight to lenders (fills) at once; more are dropped. While they
    /// form a standing queue, fewer: what the links carry in [`crate::outbox::FILL_HORIZON`].
    pub max_pending_puts: usize,
    /// Retired keys queued or in flight for deletion at once; more are dropped (their copies
    /// are unreachable anyway; lenders evict them in time).
    pub max_pending_dels: usize,
    /// Runtime threads for the lender connections.
    pub threads: usize,
    /// Most lenders in the set at once (each has a connection and a keeper task).
    pub max_lenders: usize,
    /// How blocks look on the lenders: [`Plaintext`], or sealed (encrypted and
    /// authenticated) so that a lying lender costs a miss. Fills are sealed before they
    /// leave; every answer is opened before anyone sees it.
    pub seal: Arc<dyn BlockSeal>,
    /// TLS 1.3 with a client certificate to every lender; `None` for plain TCP.
    pub tls: Option<RemoteTls>,
    /// Allow memcached lenders while blocks are not sealed (`cache.memcached_plaintext`).
    pub memcached_plaintext: bool,
    /// Connections per lender on which a reading thread fetches by itself ([`FastConn`]);
    /// 0: every fetch goes through the runtime.
    pub fetch_connections: usize,
    /// How long a reading thread polls its fetch connection for the answer before it
    /// sleeps: a blocking round trip on loopback costs 65-80 µs, a polled one 23 µs
    /// (TESTBED.md), most of the difference the sleeping thread's wake-up. Zero: no polling.
    pub fetch_poll: Duration,
}

/// How the borrower speaks TLS to its lenders.
#[derive(Clone, Debug)]
pub struct RemoteTls {
    pub config: Arc<farcache_tls::rustls::ClientConfig>,
    /// The name every lender's certificate must carry; `None`: its entry in `names`, or its IP.
    pub server_name: Option<String>,
    /// The host name each configured lender was listed under.
    pub names: Vec<(SocketAddr, String)>,
}

impl RemoteTls {
    /// The client's TLS settings for the lender at `addr`.
    pub fn for_lender(&self, addr: SocketAddr) -> farcache_client::ClientTls {
        let name =
            self.server_name.clone().or_else(|| self.names.iter().find(|(a, _)| *a == addr).map(|(_, n)| n.clone()));
        farcache_client::ClientTls { config: self.config.clone(), server_name: name }
    }
}

impl RemoteConfig {
    pub fn new<A: Into<LenderAddr>>(servers: impl IntoIterator<Item = A>) -> RemoteConfig {
        RemoteConfig {
            servers: servers.into_iter().map(Into::into).collect(),
            tenant: "default".into(),
            secret: Vec::new(),
            fetch_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(500),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            max_pending_puts: DEFAULT_MAX_PENDING_PUTS,
            max_pending_dels: 4096,
            threads: 2,
            max_lenders: DEFAULT_MAX_LENDERS,
            seal: Arc::new(Plaintext),
            tls: None,
            memcached_plaintext: false,
            fetch_connections: DEFAULT_FETCH_CONNECTIONS,
            fetch_poll: DEFAULT_FETCH_POLL,
        }
    }

    /// How to connect to the lender at `lender`: tenant, secret, timeouts, TLS (a memcached
    /// gets neither secret nor TLS: it has no tenants and speaks plain TCP).
    pub fn client_config(&self, lender: LenderAddr) -> ClientConfig {
        let addr = lender.addr;
        let mut c = ClientConfig::new(addr, self.tenant.clone());
        c.connect_timeout = self.connect_timeout;
        c.request_timeout = self.fetch_timeout.max(Duration::from_millis(500));
        if !lender.is_memcached() {
            c.secret = self.secret.clone();
            c.tls = self.tls.as_ref().map(|t| t.for_lender(addr));
        }
        c
    }
}

/// Why the lender set was not changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LenderError {
    #[error("lender {0} is already in the set")]
    AlreadyPresent(LenderAddr),
    #[error("lender {addr} not added: the set already has {max} lenders (raise cache.max_lenders)")]
    TooMany { addr: LenderAddr, max: usize },
    #[error("lender {0} is not in the set")]
    NotPresent(LenderAddr),
    #[error(
        "lender {0} not added: memcached authenticates no one, and this mount's blocks are not sealed; \
         restart the mount with cache.key_file (--key-file), or accept plaintext with cache.memcached_plaintext = true"
    )]
    Unsealed(LenderAddr),
}

/// One lender as the borrower sees it now (for operators: `CachedPath::stats`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LenderStatus {
    /// `ip:port` for a farcache lender, `memcached://ip:port` for a memcached.
    pub addr: LenderAddr,
    /// A live connection now.
    pub connected: bool,
    /// The lender's instance id at the last connection; 0 = never connected. A new value
    /// after a reconnection means the lender restarted (its memory is new).
    pub instance_id: u64,
    /// Connections made since it joined the set.
    pub connects: u64,
    /// Blocks it delivered.
    pub hits: u64,
    /// Blocks asked of it (or placed on it while it was not connected) and not delivered.
    pub misses: u64,
    /// Blocks it stored (fills).
    pub puts: u64,
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
    /// PUT requests that failed or went unanswered within their timeout (each gives up the
    /// rest of its batch): about one timeout each, [`PUT_REQUESTS_IN_FLIGHT`] at a time.
    pub put_requests_failed: AtomicU64,
    pub bytes_to_servers: AtomicU64,
    pub invalidations: AtomicU64,
    pub invalidations_dropped: AtomicU64,
    /// Fetches that gave up at `fetch_timeout` or on a connection error.
    pub fallbacks: AtomicU64,
    /// Answers refused: wrong length.
    pub rejected: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    /// Fetch connections made ([`RemoteConfig::fetch_connections`]); `connects` counts the
    /// lenders' main connections.
    pub fetch_connects: AtomicU64,
    /// Fetches on a fetch connection whose answer came while the reading thread polled for
    /// it ([`RemoteConfig::fetch_poll`]); the others slept until it came.
    pub fetches_polled: AtomicU64,
    /// Answers of the right length that failed [`BlockSeal::open`]: a lender (or the
    /// network) returned something other than the block asked for. Each is a miss.
    pub auth_failures: AtomicU64,
    /// Time of each fetch that asked lenders for blocks, hits, misses and timeouts alike.
    pub fetch_latency: Latency,
    /// Time from a fill being queued to its lender storing it (fills stored only; not
    /// seeds, which wait for company by design).
    pub fill_latency: Latency,
}

/// A point-in-time copy of [`RemoteCounters`], field for field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteCountersSnapshot {
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes_from_servers: u64,
    pub puts: u64,
    pub puts_dropped: u64,
    pub puts_failed: u64,
    #[serde(default)]
    pub put_requests_failed: u64,
    pub bytes_to_servers: u64,
    pub invalidations: u64,
    pub invalidations_dropped: u64,
    pub fallbacks: u64,
    pub rejected: u64,
    pub connects: u64,
    pub connect_failures: u64,
    #[serde(default)]
    pub fetch_connects: u64,
    #[serde(default)]
    pub fetches_polled: u64,
    #[serde(default)]
    pub auth_failures: u64,
    #[serde(default)]
    pub fetch_latency: LatencySnapshot,
    #[serde(default)]
    pub fill_latency: LatencySnapshot,
    /// Fills queued or on their way to a lender now (a gauge, at most `puts_bound` but for
    /// those queued before the bound fell).
    #[serde(default)]
    pub puts_in_flight: u64,
    /// The bound on fills queued or in flight now: `max_pending_puts`, or while the fills'
    /// queue stands what the lenders' links carry in [`crate::outbox::FILL_HORIZON`] at
    /// their measured pace (a gauge; 0 in counters that have no outbox behind them).
    #[serde(default)]
    pub puts_bound: u64,
    /// Deletions queued or on their way now (a gauge, at most `max_pending_dels`).
    #[serde(default)]
    pub invalidations_in_flight: u64,
}

impl RemoteCounters {
    pub fn snapshot(&self) -> RemoteCountersSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RemoteCountersSnapshot {
            gets: l(&self.gets),
            hits: l(&self.hits),
            misses: l(&self.misses),
            bytes_from_servers: l(&self.bytes_from_servers),
            puts: l(&self.puts),
            puts_dropped: l(&self.puts_dropped),
            puts_failed: l(&self.puts_failed),
            put_requests_failed: l(&self.put_requests_failed),
            bytes_to_servers: l(&self.bytes_to_servers),
            invalidations: l(&self.invalidations),
            invalidations_dropped: l(&self.invalidations_dropped),
            fallbacks: l(&self.fallbacks),
            rejected: l(&self.rejected),
            connects: l(&self.connects),
            connect_failures: l(&self.connect_failures),
            fetch_connects: l(&self.fetch_connects),
            fetches_polled: l(&self.fetches_polled),
            auth_failures: l(&self.auth_failures),
            fetch_latency: self.fetch_latency.snapshot(),
            fill_latency: self.fill_latency.snapshot(),
            puts_in_flight: 0,
            puts_bound: 0,
            invalidations_in_flight: 0,
        }
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct Lender {
    addr: LenderAddr,
    seed: u64,
    client: RwLock<Option<LenderClient>>,
    /// The lender's instance id at the last connection (0 = never connected).
    instance: AtomicU64,
    connects: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    /// Answers from it that failed authentication.
    auth_failures: AtomicU64,
    /// When the last authentication failure was logged, in ms after `born`
    /// ([`NEVER`]: not yet): at most one warning per [`AUTH_WARN_INTERVAL`].
    auth_warned_ms: AtomicU64,
    /// Auth failures already counted in a warning.
    auth_warned_count: AtomicU64,
    /// Whether "its slots are too small for sealed blocks" was logged (once per lender).
    too_small_logged: AtomicBool,
    born: Instant,
    /// Set (under the `client` lock) when the lender leaves the set: its keeper stores no
    /// new connection after that.
    removed: AtomicBool,
    /// The connection keeper, aborted on removal.
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// PUT requests in flight to it ([`PUT_REQUESTS_IN_FLIGHT`]).
    put_slots: tokio::sync::Semaphore,
    /// How fast its full PUT requests were answered: the outbox holds fills to what the
    /// lenders' links carry in [`crate::outbox::FILL_HORIZON`].
    fill_pace: FillPace,
    /// Idle [`FastConn`]s, and how many exist (idle, in use or being made): at most
    /// `fetch_connections`.
    fast_idle: Mutex<Vec<FastConn>>,
    fast_made: AtomicUsize,
    /// The client of every fetch connection, idle or in use, so that removing the lender
    /// closes them all (releasing a reader that waits on one at once).
    fast_all: Mutex<Vec<(u64, LenderClient)>>,
    /// After a fetch connection failed: no new one before this time (ms after `born`), so a
    /// lender that drops every connection is not dialled at every read.
    fast_retry_ms: AtomicU64,
    /// When a lost fetch connection was last logged (ms after `born`; [`NEVER`]: not yet).
    fast_warned_ms: AtomicU64,
    /// Whether polling for its answers pays ([`RemoteConfig::fetch_poll`]).
    poll_gate: PollGate,
}

impl Lender {
    fn new(addr: LenderAddr) -> Lender {
        Lender {
            addr,
            seed: seed_of(&addr),
            client: RwLock::new(None),
            instance: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            auth_warned_ms: AtomicU64::new(NEVER),
            auth_warned_count: AtomicU64::new(0),
            too_small_logged: AtomicBool::new(false),
            born: Instant::now(),
            removed: AtomicBool::new(false),
            keeper: Mutex::new(None),
            put_slots: tokio::sync::Semaphore::new(PUT_REQUESTS_IN_FLIGHT),
            fill_pace: FillPace::default(),
            fast_idle: Mutex::new(Vec::new()),
            fast_made: AtomicUsize::new(0),
            fast_all: Mutex::new(Vec::new()),
            fast_retry_ms: AtomicU64::new(0),
            fast_warned_ms: AtomicU64::new(NEVER),
            poll_gate: PollGate::new(),
        }
    }

    /// An idle [`FastConn`], if there is one. With none idle and fewer than the limit made,
    /// one is made in the background (on a thread of its own: connecting never delays a
    /// read) for the next fetch.
    fn checkout_fast(self: &Arc<Self>, cfg: &Arc<RemoteConfig>, counters: &Arc<RemoteCounters>) -> Option<FastConn> {
        loop {
            let Some(c) = self.fast_idle.lock().pop() else { break };
            if c.used.elapsed() < FAST_IDLE_MAX {
                return Some(c);
            }
            self.forget_fast(c);
        }
        let limit = cfg.fetch_connections;
        if (self.born.elapsed().as_millis() as u64) < self.fast_retry_ms.load(Ordering::Relaxed) {
            return None;
        }
        if self.fast_made.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).is_ok() {
            let (lender, cfg, counters) = (self.clone(), cfg.clone(), counters.clone());
            let made = std::thread::Builder::new().name("farcache-fastconn".into()).spawn(move || {
                match FastConn::connect(lender.addr, &cfg) {
                    Ok(c) => {
                        add(&counters.fetch_connects, 1);
                        lender.fast_all.lock().push((c.id, c.client.clone()));
                        lender.checkin_fast(c, true)
                    }
                    Err(e) => {
                        tracing::debug!(lender = %lender.addr, "fetch connection not made: {e}");
                        lender.fast_failed(cfg.reconnect_min);
                        lender.fast_made.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            });
            if made.is_err() {
                self.fast_made.fetch_sub(1, Ordering::AcqRel);
            }
        }
        None
    }

    /// Give a [`FastConn`] back after use; `ok`: its last request was answered in time.
    fn checkin_fast(&self, mut c: FastConn, ok: bool) {
        if ok && !c.client.is_closed() && !self.removed.load(Ordering::Acquire) {
            c.used = Instant::now();
            self.fast_idle.lock().push(c);
        } else {
            self.forget_fast(c);
            self.fast_failed(FAST_RETRY_AFTER_FAILURE);
        }
    }

    /// Close a fetch connection and make room for another.
    fn forget_fast(&self, c: FastConn) {
        self.fast_all.lock().retain(|(id, _)| *id != c.id);
        drop(c);
        self.fast_made.fetch_sub(1, Ordering::AcqRel);
    }

    /// Close the idle fetch connections (the main connection was lost: the lender restarted
    /// or went away, and these would fail at their next use).
    fn drop_idle_fast(&self) {
        let idle = std::mem::take(&mut *self.fast_idle.lock());
        for c in idle {
            self.forget_fast(c);
        }
    }

    /// A fetch connection broke (not a timeout): say so, at most once per
    /// [`AUTH_WARN_INTERVAL`] per lender.
    fn fast_lost(&self, e: &ClientError) {
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.fast_warned_ms.load(Ordering::Relaxed);
        if last != NEVER && now.saturating_sub(last) < AUTH_WARN_INTERVAL.as_millis() as u64 {
            return;
        }
        if self.fast_warned_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            tracing::warn!(
                lender = %self.addr,
                "lost a fetch connection to lender {} ({e}); its reads went to the disk, a new one is made",
                self.addr
            );
        }
    }

    /// A fetch connection failed or could not be made: make no new one for `after`.
    fn fast_failed(&self, after: Duration) {
        let at = self.born.elapsed().as_millis() as u64 + after.as_millis() as u64;
        self.fast_retry_ms.store(at, Ordering::Relaxed);
    }

    /// Count an answer that failed authentication; warn, naming the lender, at most once
    /// per [`AUTH_WARN_INTERVAL`].
    fn auth_failed(&self, seal: &str) {
        let total = self.auth_failures.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.auth_warned_ms.load(Ordering::Relaxed);
        if last != NEVER && now.saturating_sub(last) < AUTH_WARN_INTERVAL.as_millis() as u64 {
            return;
        }
        if self.auth_warned_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return; // another thread warns for this interval
        }
        let before = self.auth_warned_count.swap(total, Ordering::Relaxed);
        tracing::warn!(
            lender = %self.addr,
            "lender {} answered {} block(s) that failed authentication ({seal}) since the last warning, {total} in all: \
             another block, an old version, or altered bytes; served from the disk instead",
            self.addr,
            total - before
        );
    }

    /// Say once per lender that it cannot hold sealed blocks, and what to set.
    fn slots_too_small(&self, max_value_bytes: u32, sealed_bytes: usize) {
        if !self.too_small_logged.swap(true, Ordering::Relaxed) {
            let fix = if self.addr.is_memcached() {
                "start it with a larger item size (memcached -I)".to_string()
            } else {
                format!("set server.slot_bytes >= {sealed_bytes} on it")
            };
            tracing::error!(
                lender = %self.addr,
                "lender {} stores values of at most {max_value_bytes} bytes, but sealed blocks are {sealed_bytes} bytes: \
                 it can cache nothing for this mount; {fix} (or turn block encryption off with cache.key_file = \"\")",
                self.addr
            );
        }
    }

    fn live_client(&self) -> Option<LenderClient> {
        self.client.read().as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Out of the set: close the connection (failing requests in flight at once) and stop
    /// the keeper. Never blocks.
    fn retire(&self) {
        {
            let mut c = self.client.write();
            self.removed.store(true, Ordering::Release);
            if let Some(c) = c.take() {
                c.close();
            }
        }
        if let Some(k) = self.keeper.lock().take() {
            k.abort();
        }
        for (_, c) in std::mem::take(&mut *self.fast_all.lock()) {
            c.close();
        }
        let idle = std::mem::take(&mut *self.fast_idle.lock());
        self.fast_made.fetch_sub(idle.len(), Ordering::AcqRel);
    }

    fn status(&self) -> LenderStatus {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LenderStatus {
            addr: self.addr,
            connected: self.live_client().is_some(),
            instance_id: l(&self.instance),
            connects: l(&self.connects),
            hits: l(&self.hits),
            misses: l(&self.misses),
            puts: l(&self.puts),
        }
    }
}

/// The lenders at one moment. Immutable: a change builds a new set.
struct LenderSet {
    lenders: Vec<Arc<Lender>>,
    /// `lenders[i].seed`, contiguous for placement.
    seeds: Vec<u64>,
}

impl LenderSet {
    fn new(lenders: Vec<Arc<Lender>>) -> LenderSet {
        LenderSet { seeds: lenders.iter().map(|l| l.seed).collect(), lenders }
    }

    /// Which lender of this set holds `k`.
    fn lender_of(&self, k: &BlockKey) -> Option<usize> {
        let h = placement::mix64((k.file as u64) ^ ((k.file >> 64) as u64).rotate_left(17) ^ k.block.rotate_left(41));
        placement::rendezvous(h, &self.seeds)
    }
}

/// The remote tier: the lender set, its connections, and the runtime they live on.
pub struct Remote {
    rt: tokio::runtime::Runtime,
    /// Swapped whole on a change; operations clone the `Arc` once and work on that snapshot.
    set: Arc<RwLock<Arc<LenderSet>>>,
    cfg: Arc<RemoteConfig>,
    /// Fills and deletions on their way, flushed by one task on `rt`.
    outbox: Arc<Outbox>,
    counters: Arc<RemoteCounters>,
    /// Fetches asking lenders now, on any thread (counted while `fetch_poll` is set).
    fetching: AtomicUsize,
    /// A reading thread polls for its answer only while at most this many fetches are in
    /// flight, its own included: one per two CPUs (none on one CPU), so that polling never
    /// keeps the CPUs from the other readers, the application and a lender on this machine.
    /// Measured: eight readers at once on two CPUs, every one polling, made a 4 KiB lender
    /// hit cost the daemon 26% more CPU and the pass 9% more time (BENCHMARKS.md, "Session 62").
    max_polling: usize,
}

/// What one fetch did (for the engine's measurements).
pub(crate) struct Fetched {
    /// One entry per key asked, in order.
    pub values: Vec<Option<Bytes>>,
    /// Keys sent to a connected lender: 0 means no lender was asked (the fetch took no time
    /// on the network and measures nothing).
    pub asked: usize,
    /// A lender failed: no answer within `fetch_timeout`, its connection broke, or it had
    /// none when asked.
    pub failed: bool,
}

fn to_key(k: &BlockKey) -> Key {
    Key::new(k.file, k.block, k.version)
}

/// A stable seed per lender address, so its share of blocks does not depend on the order of
/// `--server` flags.
fn seed_of(addr: &LenderAddr) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr.to_string().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    placement::mix64(h)
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

impl Remote {
    /// Start the runtime and one connection keeper per lender in `cfg.servers`. Returns at
    /// once: lenders that are not up yet are retried in the background. Fails if
    /// `cfg.servers` names a lender twice or more than `cfg.max_lenders` lenders.
    pub fn start(cfg: RemoteConfig) -> std::io::Result<Remote> {
        if cfg.servers.len() > cfg.max_lenders {
            return Err(invalid(format!(
                "{} lenders given, at most {} allowed (max_lenders)",
                cfg.servers.len(),
                cfg.max_lenders
            )));
        }
        for (i, a) in cfg.servers.iter().enumerate() {
            if cfg.servers[..i].contains(a) {
                return Err(invalid(format!("lender {a} is named twice")));
            }
            if a.is_memcached() && cfg.seal.sealed_len(0) == 0 && !cfg.memcached_plaintext {
                return Err(invalid(LenderError::Unsealed(*a).to_string()));
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.threads.max(1))
            .thread_name("farcache-remote")
            .enable_all()
            .build()?;
        let remote = Remote {
            rt,
            set: Arc::new(RwLock::new(Arc::new(LenderSet::new(Vec::new())))),
            outbox: Arc::new(Outbox::new(cfg.max_pending_puts.max(1), cfg.max_pending_dels.max(1))),
            counters: Arc::new(RemoteCounters::default()),
            cfg: Arc::new(cfg),
            fetching: AtomicUsize::new(0),
            max_polling: std::thread::available_parallelism().map_or(1, |n| n.get()) / 2,
        };
        let lenders: Vec<Arc<Lender>> = remote.cfg.servers.iter().map(|a| remote.spawn_lender(*a)).collect();
        *remote.set.write() = Arc::new(LenderSet::new(lenders));
        remote.rt.spawn(flush_outbox(
            remote.outbox.clone(),
            remote.set.clone(),
            remote.cfg.clone(),
            remote.counters.clone(),
        ));
        Ok(remote)
    }

    pub fn counters(&self) -> &RemoteCounters {
        &self.counters
    }

    /// The counters, with the fills and deletions queued or in flight now.
    pub fn stats(&self) -> RemoteCountersSnapshot {
        let (puts, dels) = self.outbox.outstanding();
        RemoteCountersSnapshot {
            puts_in_flight: puts as u64,
            puts_bound: self.outbox.put_limit() as u64,
            invalidations_in_flight: dels as u64,
            ..self.counters.snapshot()
        }
    }

    /// The configuration the tier was started with (`servers` is the initial set).
    pub fn config(&self) -> &RemoteConfig {
        &self.cfg
    }

    fn snapshot(&self) -> Arc<LenderSet> {
        self.set.read().clone()
    }

    /// A lender record with its keeper running.
    fn spawn_lender(&self, addr: LenderAddr) -> Arc<Lender> {
        let l = Arc::new(Lender::new(addr));
        let keeper = self.rt.spawn(keep_connected(l.clone(), self.cfg.clone(), self.counters.clone()));
        *l.keeper.lock() = Some(keeper);
        l
    }

    /// Add a lender to the set. Returns at once; it is connected in the background, and
    /// takes its share of new placements from now on (blocks that move to it are misses
    /// until refilled there).
    pub fn add_lender(&self, addr: impl Into<LenderAddr>) -> Result<(), LenderError> {
        let addr = addr.into();
        self.check_memcached(addr)?;
        let mut set = self.set.write();
        if set.lenders.iter().any(|l| l.addr == addr) {
            return Err(LenderError::AlreadyPresent(addr));
        }
        if set.lenders.len() >= self.cfg.max_lenders {
            return Err(LenderError::TooMany { addr, max: self.cfg.max_lenders });
        }
        let mut lenders = set.lenders.clone();
        lenders.push(self.spawn_lender(addr));
        *set = Arc::new(LenderSet::new(lenders));
        drop(set);
        tracing::info!(lender = %addr, "lender added to the set");
        Ok(())
    }

    /// Remove a lender from the set: its keeper stops and its connection closes (requests in
    /// flight to it fail at once and their reads go to the disk). Returns at once, also for
    /// a hung lender. Its blocks are placed on the remaining lenders from now on.
    pub fn remove_lender(&self, addr: impl Into<LenderAddr>) -> Result<(), LenderError> {
        let addr = addr.into();
        let mut set = self.set.write();
        let Some(pos) = set.lenders.iter().position(|l| l.addr == addr) else {
            return Err(LenderError::NotPresent(addr));
        };
        let mut lenders = set.lenders.clone();
        let gone = lenders.remove(pos);
        *set = Arc::new(LenderSet::new(lenders));
        drop(set);
        gone.retire();
        tracing::info!(lender = %addr, "lender removed from the set");
        Ok(())
    }

    /// A memcached lender needs sealed blocks unless plaintext was accepted.
    fn check_memcached(&self, addr: LenderAddr) -> Result<(), LenderError> {
        if addr.is_memcached() && self.cfg.seal.sealed_len(0) == 0 && !self.cfg.memcached_plaintext {
            return Err(LenderError::Unsealed(addr));
        }
        Ok(())
    }

    /// The lenders in the set now, in the order they joined.
    pub fn lenders(&self) -> Vec<LenderStatus> {
        self.snapshot().lenders.iter().map(|l| l.status()).collect()
    }

    /// Lenders with a live connection now.
    pub fn connected(&self) -> usize {
        self.snapshot().lenders.iter().filter(|l| l.live_client().is_some()).count()
    }

    /// Fetch `keys` (blocks of `block_len` bytes), in order, opened with the configured
    /// [`BlockSeal`]; `None` for anything not delivered within `fetch_timeout`, of another
    /// length than a sealed block of `block_len` bytes, or failing authentication. Never
    /// fails. Call from outside the runtime.
    pub fn get(&self, keys: &[BlockKey], block_len: usize) -> Vec<Option<Bytes>> {
        self.fetch(keys, block_len).values
    }

    /// [`Remote::get`], also saying whether any lender was asked.
    pub(crate) fn fetch(&self, keys: &[BlockKey], block_len: usize) -> Fetched {
        let mut out = vec![None; keys.len()];
        let set = self.snapshot();
        if set.lenders.is_empty() || keys.is_empty() {
            return Fetched { values: out, asked: 0, failed: false };
        }
        add(&self.counters.gets, keys.len() as u64);
        // Group by lender; a lender without a connection answers nothing.
        let mut by_lender: Vec<Vec<usize>> = vec![Vec::new(); set.lenders.len()];
        for (i, k) in keys.iter().enumerate() {
            if let Some(l) = set.lender_of(k) {
                by_lender[l].push(i);
            }
        }
        let mut groups: Vec<(usize, LenderClient, Vec<usize>)> = Vec::new();
        // A lender that holds blocks asked for but has no connection has failed too.
        let mut failed = false;
        for (l, idx) in by_lender.into_iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            match set.lenders[l].live_client() {
                Some(c) => groups.push((l, c, idx)),
                None => {
                    add(&set.lenders[l].misses, idx.len() as u64);
                    failed = true;
                }
            }
        }
        let asked = groups.iter().map(|(_, _, idx)| idx.len()).sum();
        // Counted only where it decides anything: with polling off (the default) a fetch
        // touches no counter shared by every reading thread.
        let fetching = (!self.cfg.fetch_poll.is_zero()).then(|| InFlight::enter(&self.fetching));
        let seal = &self.cfg.seal;
        let sealed_len = seal.sealed_len(block_len);
        let started = Instant::now();
        let deadline = started + self.cfg.fetch_timeout;
        // One lender to ask (the usual case: a small read, or one lender): ask it on this
        // thread if one of its fetch connections is free.
        let fast = match &groups[..] {
            [(l, _, _)] => set.lenders[*l].checkout_fast(&self.cfg, &self.counters),
            _ => None,
        };
        let results = if let Some(fc) = fast {
            let (l, _, idx) = groups.pop().expect("one group");
            let ks: Vec<Key> = idx.iter().map(|&i| to_key(&keys[i])).collect();
            let gate = &set.lenders[l].poll_gate;
            let poll = match &fetching {
                Some(f) if f.now <= self.max_polling && gate.should_poll() => self.cfg.fetch_poll,
                _ => Duration::ZERO,
            };
            let (r, polled) = fc.get(&ks, deadline, poll);
            let answered = polled && matches!(r, Ok(Ok(_)));
            if !poll.is_zero() {
                gate.polled(answered);
            }
            if answered {
                add(&self.counters.fetches_polled, 1);
            }
            if let Ok(Err(e)) = &r {
                set.lenders[l].fast_lost(e);
            }
            set.lenders[l].checkin_fast(fc, matches!(r, Ok(Ok(_))));
            vec![(l, idx, r)]
        } else {
            self.rt.handle().block_on(async {
                let futs = groups.into_iter().map(|(l, client, idx)| {
                    let ks: Vec<Key> = idx.iter().map(|&i| to_key(&keys[i])).collect();
                    async move {
                        let r = tokio::time::timeout_at(deadline.into(), client.get(&ks)).await;
                        (l, idx, r)
                    }
                });
                join_all(futs).await
            })
        };
        if asked > 0 {
            self.counters.fetch_latency.record(started.elapsed());
        }
        for (l, idx, r) in results {
            let lender = &set.lenders[l];
            let mut hits = 0;
            let asked_here = idx.len() as u64;
            match r {
                Ok(Ok(values)) => {
                    for (i, v) in idx.into_iter().zip(values) {
                        match v {
                            Some(v) if v.len() == sealed_len => {
                                add(&self.counters.bytes_from_servers, v.len() as u64);
                                match seal.open_bytes(&keys[i], v) {
                                    Ok(plain) if plain.len() == block_len => {
                                        out[i] = Some(plain);
                                        hits += 1;
                                    }
                                    _ => {
                                        add(&self.counters.auth_failures, 1);
                                        lender.auth_failed(seal.name());
                                    }
                                }
                            }
                            Some(_) => add(&self.counters.rejected, 1),
                            None => {}
                        }
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    add(&self.counters.fallbacks, 1);
                    failed = true;
                }
            }
            add(&lender.hits, hits);
            add(&lender.misses, asked_here - hits);
        }
        let hits = out.iter().filter(|v| v.is_some()).count() as u64;
        add(&self.counters.hits, hits);
        add(&self.counters.misses, keys.len() as u64 - hits);
        Fetched { values: out, asked, failed }
    }

    /// Store `value` under `key` in the background, sealed (on the runtime, off the caller's
    /// thread) with the configured [`BlockSeal`]; `done()` runs once its lender has it.
    /// Queued in the [`Outbox`] and sent within [`crate::outbox::FLUSH_WINDOW`] in one batch
    /// with the others for its lender — a `seed` within [`crate::outbox::SEED_WINDOW`]. Dropped
    /// (and `done` never runs) when `max_pending_puts` blocks are already on their way or its
    /// lender is not connected. A lender whose slots are too small for a sealed block gets one
    /// error line.
    pub fn put_async(&self, key: BlockKey, value: Bytes, seed: bool, done: impl FnOnce() + Send + 'static) {
        let set = self.snapshot();
        if set.lender_of(&key).is_none_or(|l| set.lenders[l].live_client().is_none()) {
            add(&self.counters.puts_dropped, 1);
            return;
        }
        if self.outbox.put(PendingPut { key, value, done: Box::new(done), queued: Instant::now(), seed }).is_err() {
            add(&self.counters.puts_dropped, 1);
        }
    }

    /// Delete copies that can no longer be named (to free lenders' memory). Best effort:
    /// queued in the [`Outbox`] and sent, coalesced with the others, to each key's lender in
    /// the set at the time; dropped past `max_pending_dels` keys on their way.
    pub fn del_async(&self, keys: Vec<BlockKey>) {
        if keys.is_empty() || self.snapshot().lenders.is_empty() {
            return;
        }
        let n = keys.len() as u64;
        add(&self.counters.invalidations, n);
        if !self.outbox.del(keys) {
            add(&self.counters.invalidations_dropped, n);
        }
    }
}

/// The outbox's flusher: each batch is split by lender (in the set as it is when the batch
/// leaves) and sent as one PUT and one DEL request per lender, each in a task of its own so
/// that a slow lender holds back only its own share.
async fn flush_outbox(
    outbox: Arc<Outbox>,
    set: Arc<RwLock<Arc<LenderSet>>>,
    cfg: Arc<RemoteConfig>,
    counters: Arc<RemoteCounters>,
) {
    let timeout = cfg.fetch_timeout.max(Duration::from_millis(500));
    loop {
        let Batch { puts, dels } = outbox.next_batch().await;
        let set = set.read().clone();
        let n = set.lenders.len();
        let mut puts_by: Vec<Vec<PendingPut>> = (0..n).map(|_| Vec::new()).collect();
        for p in puts {
            match set.lender_of(&p.key) {
                Some(l) => puts_by[l].push(p),
                None => {
                    add(&counters.puts_dropped, 1);
                    outbox.puts_sent(1);
                }
            }
        }
        let mut dels_by: Vec<Vec<Key>> = vec![Vec::new(); n];
        for k in &dels {
            match set.lender_of(k) {
                Some(l) => dels_by[l].push(to_key(k)),
                None => outbox.dels_sent(1),
            }
        }
        for (l, (puts, dels)) in puts_by.into_iter().zip(dels_by).enumerate() {
            if puts.is_empty() && dels.is_empty() {
                continue;
            }
            let lender = set.lenders[l].clone();
            let Some(client) = lender.live_client() else {
                add(&counters.puts_dropped, puts.len() as u64);
                outbox.puts_sent(puts.len());
                outbox.dels_sent(dels.len());
                continue;
            };
            let (outbox, counters, seal, set) = (outbox.clone(), counters.clone(), cfg.seal.clone(), set.clone());
            tokio::spawn(async move {
                if !puts.is_empty() {
                    let sealed: Vec<(Key, Bytes)> =
                        puts.iter().map(|p| (to_key(&p.key), seal.seal_bytes(&p.key, p.value.clone()))).collect();
                    let entries: Vec<(Key, &[u8])> = sealed.iter().map(|(k, v)| (*k, &v[..])).collect();
                    // Small requests, at most PUT_REQUESTS_IN_FLIGHT of them on the link to
                    // this lender at once: a fetch waits behind those, not behind a whole
                    // batch (1 MiB is 8 ms on 1 Gbit/s). The timeout runs from the moment a
                    // request has its slot, so a slow lender takes a batch at its own pace
                    // (the batch's tail waiting its turn is not a failure); the first request
                    // that times out or fails gives up the rest of the batch, so a stalled
                    // lender holds it about one timeout.
                    let (client, slots, gave_up) = (&client, &lender.put_slots, &AtomicBool::new(false));
                    let pace = &lender.fill_pace;
                    let (failed_requests, queue, set) = (&counters.put_requests_failed, &*outbox, &*set);
                    // When each request's newest fill was queued.
                    let newest: Vec<Option<Instant>> = puts.chunks(PUT_REQUEST_BLOCKS).map(newest_fill).collect();
                    let requests = entries.chunks(PUT_REQUEST_BLOCKS).zip(newest);
                    let parts = join_all(requests.map(|(part, part_newest)| async move {
                        let _slot = slots.acquire().await.ok()?;
                        if gave_up.load(Ordering::Relaxed) {
                            return None;
                        }
                        let started = Instant::now();
                        if let Some(newest) = part_newest {
                            queue.left_queue(started.saturating_duration_since(newest));
                        }
                        let answer = tokio::time::timeout(timeout, client.put(part)).await;
                        // A full request's time is what the link carries; one that timed out
                        // counts too (its timeout): a stalling link carries less. One that
                        // failed at once (a lost connection) says nothing of the link.
                        if part.len() == PUT_REQUEST_BLOCKS && !matches!(answer, Ok(Err(_))) {
                            pace.record(part.len(), started.elapsed(), timeout);
                            // At once, not at the next batch: a queue standing behind a
                            // slow link may get no new batch for a while.
                            queue.pace(links_pace(set));
                        }
                        let stored = answer.ok().and_then(|r| r.ok());
                        if stored.is_none() {
                            gave_up.store(true, Ordering::Relaxed);
                            add(failed_requests, 1);
                        }
                        stored
                    }))
                    .await;
                    let mut statuses = Vec::with_capacity(entries.len());
                    for (part, s) in entries.chunks(PUT_REQUEST_BLOCKS).zip(parts) {
                        let s = s.unwrap_or_default();
                        let got = s.len();
                        statuses.extend(s.into_iter().map(Some));
                        // A failed request: its blocks failed.
                        statuses.extend(std::iter::repeat_n(None, part.len() - got.min(part.len())));
                    }
                    let count = puts.len();
                    for (i, p) in puts.into_iter().enumerate() {
                        match statuses.get(i).copied().flatten() {
                            Some(PutStatus::Stored) => {
                                add(&counters.puts, 1);
                                add(&lender.puts, 1);
                                add(&counters.bytes_to_servers, sealed[i].1.len() as u64);
                                if !p.seed {
                                    counters.fill_latency.record(p.queued.elapsed());
                                }
                                (p.done)();
                            }
                            Some(PutStatus::TooLarge) => {
                                add(&counters.puts_failed, 1);
                                lender.slots_too_small(client.max_value_bytes(), sealed[i].1.len());
                            }
                            _ => add(&counters.puts_failed, 1),
                        }
                    }
                    outbox.puts_sent(count);
                }
                if !dels.is_empty() {
                    let _ = tokio::time::timeout(timeout, client.del(&dels)).await;
                    outbox.dels_sent(dels.len());
                }
            });
        }
        outbox.pace(links_pace(&set));
    }
}

/// Blocks a second the connected lenders' links store, at the pace of their last full PUT
/// requests; `None` while one of them is unmeasured (or none is connected): the outbox then
/// keeps `max_pending_puts`.
fn links_pace(set: &LenderSet) -> Option<f64> {
    let mut total = None;
    for l in set.lenders.iter().filter(|l| l.live_client().is_some()) {
        total = Some(total.unwrap_or(0.0) + l.fill_pace.blocks_per_sec(PUT_REQUESTS_IN_FLIGHT)?);
    }
    total
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote").field("lenders", &self.lenders()).field("tenant", &self.cfg.tenant).finish()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        for l in &self.snapshot().lenders {
            l.retire();
        }
    }
}

/// Keep one lender connected: connect, wait for the connection to end, back off, repeat —
/// until the lender leaves the set.
async fn keep_connected(l: Arc<Lender>, cfg: Arc<RemoteConfig>, counters: Arc<RemoteCounters>) {
    let mut backoff = cfg.reconnect_min;
    let mut last_failure: Option<String> = None;
    while !l.removed.load(Ordering::Acquire) {
        match LenderClient::connect(l.addr.protocol, cfg.client_config(l.addr)).await {
            Ok(client) => {
                let instance = client.instance_id();
                {
                    let mut slot = l.client.write();
                    // Checked under the lock `retire` takes: a lender removed while this
                    // connection was being made never gets it stored.
                    if l.removed.load(Ordering::Acquire) {
                        client.close();
                        return;
                    }
                    *slot = Some(client.clone());
                }
                add(&counters.connects, 1);
                add(&l.connects, 1);
                let sealed = cfg.seal.sealed_len(crate::index::BLOCK_BYTES as usize);
                if (client.max_value_bytes() as usize) < sealed {
                    l.slots_too_small(client.max_value_bytes(), sealed);
                }
                let before = l.instance.swap(instance, Ordering::Relaxed);
                if before != 0 && before != instance {
                    tracing::info!(lender = %l.addr, "lender restarted: its memory is new");
                } else {
                    tracing::info!(lender = %l.addr, "connected to lender");
                }
                backoff = cfg.reconnect_min;
                last_failure = None;
                client.wait_closed().await;
                {
                    let mut slot = l.client.write();
                    if l.removed.load(Ordering::Acquire) {
                        return;
                    }
                    slot.take();
                }
                l.drop_idle_fast();
                tracing::warn!(lender = %l.addr, "lost the lender; reads of its blocks go to the disk");
            }
            Err(e) => {
                add(&counters.connect_failures, 1);
                // A TLS failure is a configuration problem an operator must see; say it once
                // per streak of the same failure, not at every retry.
                let tls_failure = cfg.tls.is_some()
                    && matches!(e, ClientError::Tls(_) | ClientError::Connect(_) | ClientError::AuthFailed(_));
                let text = e.to_string();
                if tls_failure && last_failure.as_deref() != Some(text.as_str()) {
                    tracing::warn!(lender = %l.addr, "TLS connection to lender failed, reads of its blocks go to the disk: {text}");
                } else {
                    tracing::debug!(lender = %l.addr, "cannot connect: {e}");
                }
                last_failure = Some(text);
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
                    Poll::Ready(v) => out[i] = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|v| v.expect("all ready")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls of `n` fetches through `gate`, each answered within the window or not.
    fn polls(gate: &PollGate, n: usize, answered: bool) -> usize {
        (0..n)
            .filter(|_| {
                let poll = gate.should_poll();
                if poll {
                    gate.polled(answered);
                }
                poll
            })
            .count()
    }

    #[test]
    fn polling_stops_for_a_lender_that_answers_too_late_and_resumes_when_it_is_near() {
        let gate = PollGate::new();
        // Near: every fetch polls.
        assert_eq!(polls(&gate, 100, true), 100);
        // Far: a dozen misses bring the share under a quarter; then one fetch in sixteen.
        let far = polls(&gate, 1600, false);
        assert!((100..=120).contains(&far), "{far} of 1600 polled for a far lender");
        // Near again: the probes see it, and every fetch polls within a few hundred.
        polls(&gate, 400, true);
        assert_eq!(polls(&gate, 100, true), 100);
        // Half the answers in time keeps polling (above a quarter).
        let half = (0..200).filter(|i| polls(&gate, 1, i % 2 == 0) == 1).count();
        assert_eq!(half, 200);
    }
}
