//! `farcache mount --server` end to end: the real binary mounts with a real lender process;
//! random O_DIRECT reads (which bypass the kernel page cache, so every one reaches the daemon)
//! are served by the lender on the second pass, writes through the mount are never answered
//! with old copies, and a lender killed with SIGKILL costs only misses.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use farcache_testkit::{pattern, DirectReader, MountProcess, ServerProcess, LENDERS_FIRST};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn hits(addr: &str) -> u64 {
    let out = Command::new(bin()).args(["stats", "--server", addr, "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["hits"].as_u64().unwrap()
}

/// A lender process and a mount of a backing directory holding one file `f` of `data`, whose
/// reads ask the lender first ([`LENDERS_FIRST`]), connected to it.
struct WithLender {
    srv: ServerProcess,
    root: tempfile::TempDir,
    backing: std::path::PathBuf,
    mnt: std::path::PathBuf,
    mount: MountProcess,
}

impl WithLender {
    fn start(data: &[u8]) -> WithLender {
        let srv = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
        let addr = srv.addr().to_string();
        let root = tempfile::tempdir().unwrap();
        let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        fs::write(backing.join("f"), data).unwrap();
        let mount = MountProcess::start(
            bin(),
            &backing,
            &mnt,
            &["--server", &addr, LENDERS_FIRST[0], LENDERS_FIRST[1]],
            &root.path().join("log"),
        );
        // The mount connects to its lender in the background; fills sent before that are
        // dropped, so reads start once it is connected.
        let connected = farcache_testkit::wait_until(Duration::from_secs(30), Duration::from_millis(20), || {
            mount_stats(&mnt)["lenders"][0]["connected"].as_bool() == Some(true)
        });
        assert!(connected, "the mount never connected to its lender: {}", mount_stats(&mnt));
        WithLender { srv, root, backing, mnt, mount }
    }
}

/// The mount at `mnt`'s `farcache stats --json`.
fn mount_stats(mnt: &Path) -> serde_json::Value {
    let out = Command::new(bin()).args(["stats", mnt.to_str().unwrap(), "--json"]).output().unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()
}

#[test]
fn reads_come_from_the_lender_and_are_always_current() {
    let mut data = pattern(8 << 20, 7);
    let WithLender { mut srv, root: _root, backing, mnt, mount: m } = WithLender::start(&data);
    let addr = srv.addr().to_string();
    let stats = || mount_stats(&mnt);
    let blocks: Vec<u64> = (0..2048u64).map(|i| (i * 613) % 2048).collect();
    let mut r = DirectReader::open(&mnt.join("f"));
    for pass in 0..2 {
        for &b in &blocks {
            let o = (b * 4096) as usize;
            assert_eq!(r.read(b * 4096), &data[o..o + 4096], "pass {pass} block {b}");
        }
        if pass == 0 {
            // Fills are asynchronous: the second pass waits until the mount's index lists
            // (nearly) every block as held (on a loaded machine a fill has taken half a second).
            let held = || stats()["index"]["remote_blocks"].as_u64().unwrap_or(0);
            let filled = farcache_testkit::wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
                held() >= 2048 * 9 / 10
            });
            assert!(filled, "the lender never got the file's blocks: {} held", held());
        }
    }
    let h = hits(&addr);
    assert!(h >= 1800, "second pass should be served by the lender: {h} hits of 2048");

    // Writes through the mount, then reads: never an old copy.
    let w = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
    for round in 0..50u64 {
        let b = (round * 37) % 2048;
        let new = vec![round as u8; 512];
        let at = b * 4096 + 1000;
        w.write_at(&new, at).unwrap();
        data[at as usize..at as usize + 512].copy_from_slice(&new);
        let o = (b * 4096) as usize;
        assert_eq!(r.read(b * 4096), &data[o..o + 4096], "after write {round}");
    }
    w.sync_all().unwrap();
    assert_eq!(fs::read(backing.join("f")).unwrap(), data, "the disk has every write");

    // The lender dies: reads go on, from the disk, correct.
    srv.kill();
    let t = Instant::now();
    for &b in blocks.iter().take(500) {
        let o = (b * 4096) as usize;
        assert_eq!(r.read(b * 4096), &data[o..o + 4096]);
    }
    assert!(t.elapsed() < Duration::from_secs(20), "fallback too slow: {:?}", t.elapsed());
    drop(r);
    drop(w);
    let log = m.stop();
    assert!(log.contains("remote tier:"), "{log}");
}

#[test]
fn without_a_server_the_mount_lends_from_its_own_process() {
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let data = pattern(1 << 20, 9);
    fs::write(backing.join("f"), &data).unwrap();
    let m = MountProcess::start(bin(), &backing, &mnt, &LENDERS_FIRST, &root.path().join("log"));
    let mut r = DirectReader::open(&mnt.join("f"));
    for _ in 0..2 {
        for b in 0..256u64 {
            let o = (b * 4096) as usize;
            assert_eq!(r.read(b * 4096), &data[o..o + 4096]);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(r);
    let log = m.stop();
    assert!(log.contains("lending") && log.contains("from this process"), "{log}");
    let hits: u64 = log
        .lines()
        .find(|l| l.contains("remote tier:"))
        .and_then(|l| l.split("remote tier: ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counters in {log}"));
    assert!(hits >= 200, "{hits} hits: {log}");
}

/// `farcache stats MOUNTPOINT --watch`: one JSON document per line, each stamped with the
/// mount's clock at least the interval apart, the counters moving with the reads between
/// them; an interval below the floor is refused by name; and a watch ends, with an error
/// naming the mount, once the mount it watches is gone.
#[test]
fn a_watch_of_a_mount_prints_its_series_and_ends_with_the_mount() {
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let data = pattern(1 << 20, 5);
    fs::write(backing.join("f"), &data).unwrap();
    let m = MountProcess::start(bin(), &backing, &mnt, &LENDERS_FIRST, &root.path().join("log"));
    let m_str = mnt.to_str().unwrap();

    let refused = Command::new(bin()).args(["stats", m_str, "--watch", "10ms", "--count", "2"]).output().unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("--watch 10ms") && err.contains("at least 100ms"), "{err}");

    // A watch of three answers, with reads through the mount while it runs.
    let watch = Command::new(bin())
        .args(["stats", m_str, "--json", "--watch", "300ms", "--count", "3"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = DirectReader::open(&mnt.join("f"));
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(900) {
        for b in 0..256u64 {
            let o = (b * 4096) as usize;
            assert_eq!(r.read(b * 4096), &data[o..o + 4096]);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let docs: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(docs.len(), 3, "{docs:?}");
    for w in docs.windows(2) {
        let (a, b) = (w[0]["uptime_ms"].as_u64().unwrap(), w[1]["uptime_ms"].as_u64().unwrap());
        assert!(b >= a + 300, "answers {a} ms and {b} ms: less than the interval apart");
        assert_eq!(w[0]["pid"], w[1]["pid"], "one mount's series");
    }
    let reads = |d: &serde_json::Value| d["fuse"]["ops"]["read"].as_u64().unwrap_or(0);
    assert!(reads(&docs[2]) > reads(&docs[0]), "the reads between the answers do not show: {docs:?}");
    drop(r);

    // A watch with no count ends when the mount does, saying which mount stopped answering.
    let mut endless = Command::new(bin())
        .args(["stats", m_str, "--json", "--watch", "100ms"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    m.stop();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = endless.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = endless.kill();
            panic!("the watch went on for 20 s after its mount stopped");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = endless.wait_with_output().unwrap();
    assert!(!status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no farcache mount answers at") && err.contains(m_str), "{err}");
    assert!(!out.stdout.is_empty(), "the watch printed nothing before its mount stopped");
}

/// The mount's own writes take the file's change stamp when the handle that made them closes,
/// not after each write: opens while that handle is open keep the cache (the writes are the
/// mount's), and once it has closed, a change made directly in the backing directory is
/// noticed at the next open — the lender's older copies are never read again.
#[test]
fn a_change_behind_the_mount_after_its_writer_closed_is_noticed_at_the_next_open() {
    let mut data = pattern(1 << 20, 11);
    let WithLender { srv, root: _root, backing, mnt, mount: m } = WithLender::start(&data);
    let stats = || mount_stats(&mnt);
    let n = |v: &serde_json::Value, a: &str, b: &str| v[a][b].as_u64().unwrap_or(0);
    let wait = |what: &str, ok: &dyn Fn(&serde_json::Value) -> bool| {
        let done = farcache_testkit::wait_until(Duration::from_secs(30), Duration::from_millis(20), || ok(&stats()));
        assert!(done, "{what}: {}", stats());
    };
    let block = |d: &[u8], b: u64| d[(b * 4096) as usize..(b * 4096 + 4096) as usize].to_vec();

    // A writer opened through the mount writes; the file is read in and filled meanwhile.
    let w = OpenOptions::new().read(true).write(true).open(mnt.join("f")).unwrap();
    w.write_at(&[1; 100], 0).unwrap();
    data[..100].fill(1);
    let mut r = DirectReader::open(&mnt.join("f"));
    for b in 0..256u64 {
        assert!(r.read(b * 4096) == &block(&data, b)[..], "block {b} is not the file's");
    }
    wait("the lender never got the file's blocks", &|s| n(s, "index", "remote_blocks") >= 230);
    w.write_at(&[2; 100], 5 * 4096).unwrap();
    data[5 * 4096..5 * 4096 + 100].fill(2);
    // Opens while the writer is open, and after it closed: the mount's own writes are not
    // changes behind its back, and the lender keeps serving.
    drop(r);
    let mut r = DirectReader::open(&mnt.join("f"));
    assert!(r.read(5 * 4096) == &block(&data, 5)[..], "block 5 is not the mount's write");
    let released = |s: &serde_json::Value| s["fuse"]["ops"]["release"].as_u64().unwrap_or(0);
    let before = released(&stats());
    drop(w);
    drop(r);
    // close(2) returns before the kernel's RELEASE reaches the daemon: wait for both.
    wait("the daemon never saw the handles closed", &|s| released(s) >= before + 2);
    let held = n(&stats(), "index", "remote_blocks");
    let mut r = DirectReader::open(&mnt.join("f"));
    assert!(r.read(10 * 4096) == &block(&data, 10)[..], "block 10 is not the file's");
    let s = stats();
    assert_eq!(n(&s, "engine", "changed_behind"), 0, "the mount's own writes taken for a change behind it: {s}");
    assert!(n(&s, "index", "remote_blocks") >= held, "an open after the writer closed dropped the cache: {s}");
    drop(r);
    wait("the daemon never saw the reader closed", &|s| released(s) >= before + 3);

    // Another program rewrites block 10 in place while nothing has the file open through the
    // mount. (A pause first: a change stamp is a change time, and one within the same clock
    // tick as the mount's last change could not be told apart on a file system with coarse
    // timestamps.)
    std::thread::sleep(Duration::from_millis(50));
    let other = OpenOptions::new().write(true).open(backing.join("f")).unwrap();
    other.write_all_at(&[0xAB; 4096], 10 * 4096).unwrap();
    drop(other);
    data[10 * 4096..11 * 4096].fill(0xAB);
    let mut r = DirectReader::open(&mnt.join("f"));
    for b in 0..256u64 {
        assert!(
            r.read(b * 4096) == &block(&data, b)[..],
            "block {b} after the change behind the mount is not the file's (an old copy from the lender?)"
        );
    }
    let s = stats();
    assert_eq!(n(&s, "engine", "changed_behind"), 1, "the change behind the mount went unnoticed: {s}");
    drop(r);
    m.stop();
    drop(srv);
}
