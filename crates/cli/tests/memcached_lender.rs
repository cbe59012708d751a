//! A real memcached as a lender behind a real FUSE mount (`--server memcached://...`), side
//! by side with a real farcache lender: every read byte-for-byte the file's, before and after
//! writes through the mount, after memcached evicts everything (`flush_all`) and after it
//! dies; blocks sealed on it and keyed by tenant; refused without a block key unless
//! plaintext is accepted explicitly, at start and when added at run time. (The lying and
//! protocol-breaking memcached is in hostile_lender.rs.)

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use farcache_testkit::{
    fuse_mounted, pattern, run_bin, run_with_timeout, text, DirectReader, MemcachedProcess, MountProcess,
    ServerProcess, LENDERS_FIRST,
};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// One request to memcached's text protocol, the answer up to `END\r\n`.
fn mc_ask(addr: SocketAddr, cmd: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(cmd.as_bytes()).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while !out.ends_with(b"END\r\n") && !out.ends_with(b"OK\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "memcached closed: {}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn mc_stat(addr: SocketAddr, name: &str) -> u64 {
    let s = mc_ask(addr, "stats\r\n");
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .unwrap_or_else(|| panic!("no {name} in {s}"))
        .trim()
        .parse()
        .unwrap()
}

fn mount_stats(mnt: &Path) -> serde_json::Value {
    let mut cmd = Command::new(bin());
    cmd.args(["stats", mnt.to_str().unwrap(), "--json"]);
    let out = run_with_timeout(cmd, Duration::from_secs(10)).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn lender<'a>(s: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    s["lenders"].as_array().unwrap().iter().find(|l| l["addr"] == addr).unwrap_or_else(|| panic!("{addr} in {s}"))
}

fn keygen(path: &Path) {
    let out = run_bin(bin(), &["keygen", "--out", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Wait (at most 5 s) until `cond`.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < end, "not within 5 s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until the mount is connected to every lender it names: a fill made before that is
/// dropped (a miss, as it should be), which would leave a lender short of what a test counts.
fn all_connected(mnt: &Path) {
    eventually("connected to every lender", || {
        mount_stats(mnt)["lenders"].as_array().unwrap().iter().all(|l| l["connected"] == true)
    });
}

const BLOCKS: u64 = 256;

#[test]
fn a_mount_borrows_from_a_real_memcached_beside_a_farcache_lender() {
    let mut mc = MemcachedProcess::start(64);
    let fc = ServerProcess::start(bin(), &[], Some("[server]\ncapacity = \"64MiB\"\nslot_bytes = 4136\n"));
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let key = root.path().join("key");
    keygen(&key);
    let mut data = pattern((BLOCKS * 4096) as usize, 5);
    fs::write(backing.join("f"), &data).unwrap();
    let (mc_url, fc_addr) = (mc.url(), fc.addr().to_string());
    let m = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &[
            "--server",
            &mc_url,
            "--server",
            &fc_addr,
            "--key-file",
            key.to_str().unwrap(),
            "--tenant",
            "db-7",
            LENDERS_FIRST[0],
            LENDERS_FIRST[1],
        ],
        &root.path().join("log"),
    );
    all_connected(&mnt);
    let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 97) % BLOCKS).collect();
    let mut r = DirectReader::open(&mnt.join("f"));
    r.pass(&order, &data);
    // Both lenders were filled (rendezvous placement spreads blocks over both).
    eventually("fills on both lenders", || {
        let s = mount_stats(&mnt);
        lender(&s, &mc_url)["puts"].as_u64().unwrap() > 0 && lender(&s, &fc_addr)["puts"].as_u64().unwrap() > 0
    });
    // The fills still on their way land between a count and a dump: compare the dump with a
    // count that did not move across it (bounded: 50 tries, 100 ms apart).
    let (items, dump) = (0..50)
        .find_map(|_| {
            let before = mc_stat(mc.addr(), "curr_items");
            let dump = mc_ask(mc.addr(), "lru_crawler metadump all\r\n");
            let after = mc_stat(mc.addr(), "curr_items");
            std::thread::sleep(Duration::from_millis(100));
            (before == after).then_some((after, dump))
        })
        .expect("memcached's item count settles once the reads stop");
    assert!(items > 0 && items < BLOCKS, "memcached holds its share: {items}");
    // Sealed (4096 + 40 bytes), keyed by tenant: fc:<tenant>:<file>:<block>:<epoch>.
    let keys: Vec<&str> = dump.lines().filter(|l| l.starts_with("key=")).collect();
    assert_eq!(keys.len() as u64, items, "{dump}");
    assert!(keys.iter().all(|l| l.starts_with("key=fc%3Adb-7%3A")), "{dump}");
    std::thread::sleep(Duration::from_millis(200));

    r.pass(&order, &data);
    let s = mount_stats(&mnt);
    let mc_hits = lender(&s, &mc_url)["hits"].as_u64().unwrap();
    assert!(mc_hits > 0, "no hit from memcached: {s}");
    assert!(lender(&s, &fc_addr)["hits"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["remote"]["auth_failures"].as_u64(), Some(0), "{s}");
    assert!(mc_stat(mc.addr(), "get_hits") >= mc_hits);

    // A write through the mount: the next reads see it (the copies on memcached are
    // retired with the old version).
    {
        let w = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
        for b in [1u64, 77, 200] {
            let new = vec![0x5a; 300];
            w.write_at(&new, b * 4096 + 11).unwrap();
            data[(b * 4096 + 11) as usize..(b * 4096 + 311) as usize].copy_from_slice(&new);
        }
    }
    r.pass(&order, &data);
    r.pass(&order, &data);

    // memcached evicts everything: misses, never wrong data.
    assert!(mc_ask(mc.addr(), "flush_all\r\n").starts_with("OK"));
    r.pass(&order, &data);
    // memcached dies: its reads go to the disk. Whether a read finds the connection still up
    // (a miss on it) or already gone (not asked at all) is a race; either way it hits nothing
    // more there and the disk answers.
    let before = mount_stats(&mnt);
    mc.kill();
    r.pass(&order, &data);
    r.pass(&order, &data);
    let s = mount_stats(&mnt);
    assert_eq!(lender(&s, &mc_url)["hits"], lender(&before, &mc_url)["hits"], "{s}");
    let disk_reads = |s: &serde_json::Value| s["engine"]["disk_reads"].as_u64().unwrap();
    assert!(disk_reads(&s) > disk_reads(&before), "{s}");
    assert!(fuse_mounted(&mnt));
    drop(r);
    assert_eq!(fs::read(backing.join("f")).unwrap(), data);
    let log = m.stop();
    assert!(log.contains("memcached lenders") && log.contains("blocks sealed"), "{log}");
}

#[test]
fn memcached_without_a_block_key_is_refused_unless_plaintext_is_accepted() {
    let mc = MemcachedProcess::start(16);
    let fc = ServerProcess::start(bin(), &["--capacity", "16MiB"], None);
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let data = pattern(64 * 4096, 9);
    fs::write(backing.join("f"), &data).unwrap();
    let url = mc.url();
    let log = root.path().join("log");

    // At start: refused, naming the key and both fixes.
    let e = match MountProcess::try_start(bin(), &backing, &mnt, &["--server", &url], &log) {
        Ok(m) => panic!("mounted a memcached lender without a block key:\n{}", m.stop()),
        Err(e) => e,
    };
    for want in ["cache.key_file", "farcache keygen", "memcached_plaintext", &url] {
        assert!(e.contains(want), "{want:?} not in {e}");
    }

    // Added at run time to a mount without a key: refused, the mount unchanged.
    let fc_addr = fc.addr().to_string();
    let m = MountProcess::start(bin(), &backing, &mnt, &["--server", &fc_addr], &log);
    let out = run_bin(bin(), &["lenders", mnt.to_str().unwrap(), "--add", &url]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("not added") && err.contains("memcached_plaintext"), "{err}");
    assert_eq!(mount_stats(&mnt)["lenders"].as_array().unwrap().len(), 1);
    drop(m);

    // Accepted explicitly: blocks stored as they are, still byte-for-byte.
    let m = MountProcess::start(
        bin(),
        &backing,
        &mnt,
        &["--server", &url, "--memcached-plaintext", LENDERS_FIRST[0], LENDERS_FIRST[1]],
        &log,
    );
    all_connected(&mnt);
    let order: Vec<u64> = (0..64).map(|i| (i * 13) % 64).collect();
    let mut r = DirectReader::open(&mnt.join("f"));
    r.pass(&order, &data);
    eventually("fills on memcached", || mc_stat(mc.addr(), "curr_items") >= 64);
    std::thread::sleep(Duration::from_millis(200));
    r.pass(&order, &data);
    assert!(lender(&mount_stats(&mnt), &url)["hits"].as_u64().unwrap() > 0);
    drop(r);
    let log = m.stop();
    assert!(log.contains("stored in plaintext there"), "{log}");
}
