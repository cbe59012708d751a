//! Helpers shared by the engine's integration tests: an in-process lender, a TCP proxy that
//! can freeze (a lender hung as if by SIGSTOP, its connections open), a listener that accepts
//! and never answers, and a disk made slow by a `DataPath` wrapper.
#![allow(dead_code)] // each test binary uses its own part

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farcache_engine::cached::CachedPath;
use farcache_engine::remote::{Remote, RemoteConfig};
use farcache_engine::{
    BackingCountersSnapshot, BackingFile, BackingOptions, Bytes, DataPath, DirectPath, FileId, Identities, ReadTime,
    Router,
};

/// A lender: the server library on a loopback port, on a runtime of its own.
pub struct Lender {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lender {
    pub fn start(capacity: &str) -> Lender {
        Lender::with_slots(capacity, 4096)
    }

    /// A lender whose slots hold values of up to `slot_bytes` (sealed blocks need 4136).
    pub fn with_slots(capacity: &str, slot_bytes: u32) -> Lender {
        let cfg = farcache_server::ServerConfig {
            capacity: capacity.parse().unwrap(),
            shards: 4,
            slot_bytes,
            ..Default::default()
        };
        let server = farcache_server::Server::new(cfg).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (atx, arx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                atx.send(l.local_addr().unwrap()).unwrap();
                farcache_server::run(l, server, async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            });
        });
        Lender { addr: arx.recv().unwrap(), stop: Some(tx), thread: Some(thread) }
    }

    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Lender {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A backing file with `data`, open read-write, in `dir`.
pub fn backing(dir: &tempfile::TempDir, data: &[u8]) -> BackingFile {
    std::fs::File::create(dir.path().join("f")).unwrap().write_all(data).unwrap();
    reopened(dir, libc::O_RDWR)
}

/// The backing file `f` in `dir` ([`backing`]'s) opened again, with access mode `accmode`.
pub fn reopened(dir: &tempfile::TempDir, accmode: i32) -> BackingFile {
    let f = std::fs::OpenOptions::new()
        .read(accmode != libc::O_WRONLY)
        .write(accmode != libc::O_RDONLY)
        .open(dir.path().join("f"))
        .unwrap();
    let id = Identities::new().identify(&f).unwrap();
    BackingFile::new(id, f, accmode, &BackingOptions { direct_io: true, direct_writes: false })
}

pub fn remote(servers: Vec<SocketAddr>, tweak: impl FnOnce(&mut RemoteConfig)) -> Remote {
    let mut cfg = RemoteConfig::new(servers);
    // Long enough that a loaded machine (CI: two cores, every test binary at once) never
    // turns a hit into a fallback where a test counts hits; the tests of slow or hung
    // lenders set their own.
    cfg.fetch_timeout = Duration::from_secs(5);
    tweak(&mut cfg);
    Remote::start(cfg).unwrap()
}

pub fn engine<D: DataPath>(disk: D, servers: Vec<SocketAddr>, router: impl Into<Router>) -> CachedPath<D> {
    CachedPath::new(disk, remote(servers, |_| {}), router)
}

/// Every fill handed to the remote tier has been stored, failed or dropped.
pub fn fills_settled<D: DataPath>(e: &CachedPath<D>) -> bool {
    let r = e.remote().counters().snapshot();
    r.puts + r.puts_failed + r.puts_dropped == e.counters().snapshot().fills
}

/// Read every whole block of `data` through `e` (in a scattered order) and check it.
pub fn read_all<D: DataPath>(e: &CachedPath<D>, file: &BackingFile, data: &[u8]) {
    let n = (data.len() / 4096) as u64;
    for i in 0..n {
        let b = (i * 37) % n; // 37 is prime to the block counts the tests use
        let got = e.read(file, b * 4096, 4096).unwrap();
        assert_eq!(&got[..], &data[(b * 4096) as usize..((b + 1) * 4096) as usize], "block {b}");
    }
}

/// Read `data` (verified) until the adaptive rule sends every random read to the lenders:
/// it starts with all of them on the disk, and a disk slower than the lenders hands them
/// over within a few of its 500 ms windows.
pub fn until_lenders_take_every_read<D: DataPath>(e: &CachedPath<D>, file: &BackingFile, data: &[u8]) {
    let t = std::time::Instant::now();
    while e.stats().routing.adaptive.expect("the adaptive rule").disk_share > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(30), "the disk kept a share: {:?}", e.stats().routing);
        read_all(e, file, data);
    }
}

/// Read until every block of `data` is on a lender (fills can be dropped under load; a pass
/// refills what is missing).
pub fn fill_all<D: DataPath>(e: &CachedPath<D>, file: &BackingFile, data: &[u8]) {
    let n = (data.len() / 4096) as u64;
    for _ in 0..20 {
        read_all(e, file, data);
        wait("fills", || fills_settled(e));
        if e.index().remote_blocks() == n {
            return;
        }
    }
    panic!("only {} of {n} blocks on lenders after 20 passes", e.index().remote_blocks());
}

/// A TCP proxy in front of a lender. Frozen, it forwards nothing in either direction and
/// reads nothing, with its connections left open: the lender looks hung, as under SIGSTOP.
pub struct Proxy {
    pub addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    /// Milliseconds each chunk from the lender waits before it is passed on (0: none).
    delay_ms: Arc<AtomicU64>,
    live: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, live, stop) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (f, l, s, d) = (frozen.clone(), live.clone(), stop.clone(), delay_ms.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let Ok(up) = TcpStream::connect(upstream) else { continue };
                l.fetch_add(1, Ordering::SeqCst);
                let (c2, u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                let (f1, f2, s1, s2, l1, d2) = (f.clone(), f.clone(), s.clone(), s.clone(), l.clone(), d.clone());
                std::thread::spawn(move || {
                    pump(client, up, &f1, &s1, None);
                    l1.fetch_sub(1, Ordering::SeqCst);
                });
                std::thread::spawn(move || pump(u2, c2, &f2, &s2, Some(&d2)));
            }
        });
        Proxy { addr, frozen, delay_ms, live, stop }
    }

    /// Hold each chunk the lender sends for `ms` milliseconds before passing it on: a slow
    /// lender, not a hung one.
    pub fn slow(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::SeqCst);
    }

    /// Client connections open through the proxy.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.frozen.store(false, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool, stop: &AtomicBool, delay_ms: Option<&AtomicU64>) {
    from.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        if frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // A chunk that came in while the proxy froze is held until it thaws: a read
                // already waiting when `freeze` was called must not pass on what was sent
                // after it (CI of session 62: ten fills reached a "frozen" lender).
                while frozen.load(Ordering::SeqCst) && !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let ms = delay_ms.map_or(0, |d| d.load(Ordering::SeqCst));
                if ms > 0 {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Accepts connections and never answers (not even the handshake); counts connections
/// accepted and connections the other side closed.
pub struct SilentListener {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl SilentListener {
    pub fn start() -> SilentListener {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (accepted.clone(), closed.clone());
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        SilentListener { addr, accepted, closed }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

/// A disk that sleeps `delay` before every read (a throttled or busy device).
pub struct SlowDisk {
    inner: DirectPath,
    delay: Duration,
    /// Answers at once instead, and says each read took `delay` ([`SlowDisk::reporting`]).
    reports: bool,
    pub reads: AtomicU64,
}

impl SlowDisk {
    pub fn new(delay: Duration) -> SlowDisk {
        SlowDisk { inner: DirectPath::new(), delay, reports: false, reads: AtomicU64::new(0) }
    }

    /// A disk that answers at once but says each read took `delay` ([`DataPath::read_timed`]),
    /// as a path that times its own reads reports them.
    pub fn reporting(delay: Duration) -> SlowDisk {
        SlowDisk { reports: true, ..SlowDisk::new(delay) }
    }
}

impl DataPath for SlowDisk {
    fn read(&self, file: &BackingFile, offset: u64, len: usize) -> std::io::Result<Bytes> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if !self.reports {
            std::thread::sleep(self.delay);
        }
        self.inner.read(file, offset, len)
    }
    fn read_timed(&self, file: &BackingFile, offset: u64, len: usize) -> std::io::Result<(Bytes, ReadTime)> {
        let start = Instant::now();
        let data = self.read(file, offset, len)?;
        let end = Instant::now();
        let start = if self.reports { end.checked_sub(self.delay).expect("the machine's uptime") } else { start };
        Ok((data, ReadTime { start, end }))
    }
    fn write(&self, file: &BackingFile, offset: u64, data: &[u8]) -> std::io::Result<usize> {
        self.inner.write(file, offset, data)
    }
    fn set_len(&self, file: &BackingFile, size: u64) -> std::io::Result<()> {
        self.inner.set_len(file, size)
    }
    fn fallocate(&self, file: &BackingFile, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.fallocate(file, mode, offset, len)
    }
    fn fsync(&self, file: &BackingFile, datasync: bool) -> std::io::Result<()> {
        self.inner.fsync(file, datasync)
    }
    fn forget(&self, id: &FileId) {
        self.inner.forget(id)
    }
    fn backing_counters(&self) -> Option<BackingCountersSnapshot> {
        self.inner.backing_counters()
    }
}
