//! The cache engine against a real lender (the server library on loopback, in this process):
//! reads are served from the lender after a fill, every read returns the disk's bytes, writes
//! make old copies unreachable, and a stopped lender only costs misses.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farcache_engine::cached::CachedPath;
use farcache_engine::remote::{Remote, RemoteConfig};
use farcache_engine::{BackingFile, BackingOptions, DataPath, DirectPath, Identities};
use farcache_policy::route::Threshold;
use farcache_testkit::pattern;

struct Lender {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Lender {
    fn start(capacity: &str) -> Lender {
        let cfg =
            farcache_server::ServerConfig { capacity: capacity.parse().unwrap(), shards: 4, ..Default::default() };
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

    fn stop(&mut self) {
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

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn backing(dir: &tempfile::TempDir, data: &[u8]) -> BackingFile {
    let p = dir.path().join("f");
    std::fs::File::create(&p).unwrap().write_all(data).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let id = Identities::new().identify(&f).unwrap();
    BackingFile::new(id, f, libc::O_RDWR, &BackingOptions { direct_io: true })
}

fn engine(servers: Vec<SocketAddr>) -> CachedPath<DirectPath> {
    let mut cfg = RemoteConfig::new(servers);
    cfg.fetch_timeout = Duration::from_millis(200);
    let remote = Remote::start(cfg).unwrap();
    CachedPath::new(DirectPath::new(), remote, Threshold::PAPER)
}

#[test]
fn second_pass_is_served_by_the_lender_and_is_exact() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1 << 20, 1);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    let offsets: Vec<u64> = (0..256u64).map(|i| (i * 97 % 256) * 4096).collect();
    for &o in &offsets {
        assert_eq!(&e.read(&file, o, 4096).unwrap()[..], &data[o as usize..o as usize + 4096]);
    }
    wait("fills", || e.remote().counters().puts.load(Ordering::Relaxed) == 256);
    wait("index", || e.index().remote_blocks() == 256);
    for &o in &offsets {
        // Unaligned reads inside and across blocks too.
        assert_eq!(&e.read(&file, o + 100, 3000).unwrap()[..], &data[o as usize + 100..o as usize + 3100]);
    }
    assert_eq!(e.counters().remote_reads.load(Ordering::Relaxed), 256);
    assert_eq!(e.remote().counters().hits.load(Ordering::Relaxed), 256);
    // A large read bypasses the lenders.
    assert_eq!(&e.read(&file, 0, 256 << 10).unwrap()[..], &data[..256 << 10]);
    assert_eq!(e.counters().sequential_bypasses.load(Ordering::Relaxed), 1);
    let mem = e.index().memory_bytes();
    assert!(mem < 64 << 10, "index of 1 MiB cached: {mem} bytes");
}

#[test]
fn writes_make_cached_copies_unreachable() {
    let lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let mut data = pattern(64 << 10, 2);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    for b in 0..16u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 16);
    for round in 0..20u8 {
        let b = (round as u64 * 7) % 16;
        let new = vec![round; 100];
        e.write(&file, b * 4096 + 50, &new).unwrap();
        data[(b * 4096 + 50) as usize..(b * 4096 + 150) as usize].copy_from_slice(&new);
        for b2 in 0..16u64 {
            let got = e.read(&file, b2 * 4096, 4096).unwrap();
            assert_eq!(&got[..], &data[(b2 * 4096) as usize..((b2 + 1) * 4096) as usize], "round {round} block {b2}");
        }
    }
    assert!(e.remote().counters().invalidations.load(Ordering::Relaxed) > 0);
    // Truncate then extend: the tail reads as zeros, never as the old cached bytes.
    e.set_len(&file, 10_000).unwrap();
    e.set_len(&file, 64 << 10).unwrap();
    let got = e.read(&file, 8192, 4096).unwrap();
    assert_eq!(&got[..10_000 - 8192], &data[8192..10_000]);
    assert!(got[10_000 - 8192..].iter().all(|&b| b == 0));
    let got = e.read(&file, 12 * 4096, 4096).unwrap();
    assert!(got.iter().all(|&b| b == 0), "old block 12 must not come back");
}

#[test]
fn a_stopped_lender_costs_only_misses() {
    let mut lender = Lender::start("16MiB");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(256 << 10, 3);
    let file = backing(&dir, &data);
    let e = engine(vec![lender.addr]);
    wait("connection", || e.remote().connected() == 1);
    for b in 0..64u64 {
        e.read(&file, b * 4096, 4096).unwrap();
    }
    wait("fills", || e.index().remote_blocks() == 64);
    lender.stop();
    let t = Instant::now();
    for b in 0..64u64 {
        let got = e.read(&file, b * 4096, 4096).unwrap();
        assert_eq!(&got[..], &data[(b * 4096) as usize..((b + 1) * 4096) as usize]);
    }
    assert!(t.elapsed() < Duration::from_secs(10), "fallback took {:?}", t.elapsed());
    assert_eq!(e.counters().remote_reads.load(Ordering::Relaxed), 0);
}

#[test]
fn no_lender_at_all_is_a_plain_passthrough() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 10, 4);
    let file = backing(&dir, &data);
    // Nobody listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = engine(vec![format!("127.0.0.1:{port}").parse().unwrap()]);
    for b in 0..16u64 {
        assert_eq!(&e.read(&file, b * 4096, 4096).unwrap()[..], &data[(b * 4096) as usize..((b + 1) * 4096) as usize]);
    }
    assert_eq!(e.remote().counters().puts.load(Ordering::Relaxed), 0);
}
