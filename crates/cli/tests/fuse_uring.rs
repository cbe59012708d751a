//! FUSE-over-io_uring (`mount.fuse_uring`) through the real `farcache mount --no-remote`: the
//! rings are used (the request counter in `farcache stats` moves), concurrent `O_DIRECT`
//! reads and writes come back byte for byte, `"on"` without the kernel's switch and with
//! `--supervise` is refused with the fix named, `"auto"` says which transport it took, and a
//! mount served over rings refuses to be taken over while it serves on. The POSIX suite over
//! rings is `ring_posix.rs`.
//!
//! The kernel's switch (`/sys/module/fuse/parameters/enable_uring`) is set by guards that
//! restore it, also when a test fails (`farcache_testkit::uring_on`, `uring_at`). Needs root.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use farcache_testkit::{fuse_mounted, require_root, text, MountProcess};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A fresh test directory with `backing/`, `mnt/` and a configuration file holding `mount`.
fn setup(tag: &str, mount: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    require_root("FUSE-over-io_uring's kernel switch");
    let root = farcache_testkit::fresh_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("fuse-uring-{tag}"));
    let (backing, mnt, cfg) = (root.join("backing"), root.join("mnt"), root.join("farcache.toml"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(&cfg, format!("[mount]\n{mount}")).unwrap();
    (root, backing, mnt, cfg)
}

fn start(root: &Path, backing: &Path, mnt: &Path, cfg: &Path, extra: &[&str]) -> Result<MountProcess, String> {
    let mut args = vec!["--no-remote", "--config", cfg.to_str().unwrap()];
    args.extend_from_slice(extra);
    MountProcess::try_start(bin(), backing, mnt, &args, &root.join("daemon.log"))
}

/// `farcache stats MNT --json`'s `fuse` document.
fn fuse_stats(mnt: &Path) -> Value {
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["fuse"].clone()
}

/// Wait (at most 10 s) until the rings serve: they are registered as serving starts.
fn wait_rings(mnt: &Path) -> Value {
    let t0 = Instant::now();
    loop {
        let f = fuse_stats(mnt);
        if f["mode"] == "io_uring" || t0.elapsed() > Duration::from_secs(10) {
            return f;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `farcache mount` with these arguments, which must be refused: its stderr.
fn refused(backing: &Path, mnt: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin())
        .arg("mount")
        .arg(backing)
        .arg(mnt)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "not refused: {}", text(&out.stderr));
    assert!(!fuse_mounted(mnt));
    text(&out.stderr)
}

/// Deterministic 4 KiB block contents for (writer, round, block).
fn block(w: u64, round: u64, b: u64) -> Vec<u8> {
    let mut x = (w << 40) ^ (round << 20) ^ b ^ 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(4096);
    for _ in 0..512 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// A 4 KiB-aligned buffer for O_DIRECT.
struct Aligned(Vec<u8>, usize);

impl Aligned {
    fn new() -> Aligned {
        let v = vec![0u8; 8192];
        let off = v.as_ptr().align_offset(4096);
        Aligned(v, off)
    }
    fn buf(&mut self) -> &mut [u8] {
        &mut self.0[self.1..self.1 + 4096]
    }
}

#[test]
fn rings_serve_requests_and_count_them() {
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("count", "fuse_uring = \"on\"\nfuse_uring_queue_depth = 4\n");
    fs::write(backing.join("f"), b"over the ring").unwrap();
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    let before = wait_rings(&mnt);
    assert_eq!(before["mode"], "io_uring", "{before}");
    assert_eq!(before["fuse_uring"], "on");
    // One queue per possible CPU, as the kernel makes them.
    let possible = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let cpus = possible.trim().split([',', '-']).filter_map(|t| t.parse::<u64>().ok()).max().unwrap() + 1;
    assert_eq!(before["ring_queues"], cpus, "{before}");
    assert_eq!(before["ring_entries"], 4 * cpus, "{before}");
    for _ in 0..50 {
        assert_eq!(fs::read(m.m("f")).unwrap(), b"over the ring");
        fs::metadata(m.m("nope")).unwrap_err();
    }
    let after = fuse_stats(&mnt);
    let moved = after["ring_requests"].as_u64().unwrap() - before["ring_requests"].as_u64().unwrap();
    // 50 × (open, read, flush, release, a lookup that fails...): far more than 100.
    assert!(moved >= 100, "ring requests moved by {moved}: {before} -> {after}");
    assert_eq!(after["ring_commit_errors"], 0);
    let human = text(&farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap()]).stdout);
    assert!(human.contains("fuse       FUSE-over-io_uring (mount.fuse_uring = on)"), "{human}");
    assert!(m.log_text().contains("requests by FUSE-over-io_uring"), "{}", m.log_text());
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn concurrent_o_direct_reads_and_writes_come_back_byte_for_byte() {
    const WRITERS: u64 = 4;
    const BLOCKS: u64 = 64; // per writer
    const ROUNDS: u64 = 6;
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("odirect", "fuse_uring = \"on\"\n");
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    assert_eq!(wait_rings(&mnt)["mode"], "io_uring");
    let path = m.m("shared");
    fs::File::create(&path).unwrap().set_len(WRITERS * BLOCKS * 4096).unwrap();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let path = path.clone();
            s.spawn(move || {
                let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
                let mut a = Aligned::new();
                for round in 0..ROUNDS {
                    for b in 0..BLOCKS {
                        let off = (w * BLOCKS + b) * 4096;
                        a.buf().copy_from_slice(&block(w, round, b));
                        f.write_all_at(a.buf(), off).unwrap();
                        a.buf().fill(0);
                        f.read_exact_at(a.buf(), off).unwrap();
                        assert!(a.buf() == block(w, round, b).as_slice(), "writer {w} round {round} block {b}");
                    }
                }
            });
        }
        // Readers of every region meanwhile: each block is always one round's whole block.
        for r in 0..4u64 {
            let path = path.clone();
            s.spawn(move || {
                let f = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
                let mut a = Aligned::new();
                for i in 0..1500u64 {
                    let n = (i * 7919 + r * 104_729) % (WRITERS * BLOCKS);
                    f.read_exact_at(a.buf(), n * 4096).unwrap();
                    let (w, b) = (n / BLOCKS, n % BLOCKS);
                    let ok =
                        a.buf().iter().all(|&x| x == 0) || (0..ROUNDS).any(|k| a.buf() == block(w, k, b).as_slice());
                    assert!(ok, "reader {r}: block {n} is torn or foreign");
                }
            });
        }
    });
    assert!(t0.elapsed() < Duration::from_secs(120), "took {:?}", t0.elapsed());
    let all = fs::read(backing.join("shared")).unwrap();
    for w in 0..WRITERS {
        for b in 0..BLOCKS {
            let off = ((w * BLOCKS + b) * 4096) as usize;
            assert!(all[off..off + 4096] == block(w, ROUNDS - 1, b)[..], "backing block {w}/{b}");
        }
    }
    assert!(fuse_stats(&mnt)["ring_requests"].as_u64().unwrap() > WRITERS * BLOCKS * ROUNDS * 2);
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn on_without_the_kernel_switch_is_refused_and_auto_says_read_loops() {
    let _k = farcache_testkit::uring_at(false);
    let (root, backing, mnt, cfg) = setup("off", "fuse_uring = \"on\"\n");
    let e = refused(&backing, &mnt, &["--no-remote", "--config", cfg.to_str().unwrap()]);
    assert!(e.contains("mount.fuse_uring") && e.contains("echo Y > /sys/module/fuse/parameters/enable_uring"), "{e}");
    fs::write(&cfg, "[mount]\nfuse_uring = \"auto\"\n").unwrap();
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    let f = fuse_stats(&mnt);
    assert_eq!(f["mode"], "read-loops", "{f}");
    assert!(f["reason"].as_str().unwrap().contains("enable_uring is N"), "{f}");
    assert!(m.log_text().contains("read loops (FUSE-over-io_uring is off in the kernel"), "{}", m.log_text());
    fs::write(backing.join("g"), b"x").unwrap();
    assert_eq!(fs::read(m.m("g")).unwrap(), b"x");
    assert_eq!(fuse_stats(&mnt)["ring_requests"], 0);
    drop(m);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn rings_are_never_handed_to_another_daemon() {
    let _k = farcache_testkit::uring_on();
    let (root, backing, mnt, cfg) = setup("handover", "fuse_uring = \"on\"\n");
    // "on" with --supervise: refused at start, naming the fix.
    let c = cfg.to_str().unwrap();
    let e = refused(&backing, &mnt, &["--no-remote", "--config", c, "--supervise"]);
    assert!(e.contains("cannot be combined with --supervise") && e.contains("fix:"), "{e}");
    // A mount served over rings refuses to be taken over, and serves on.
    let m = start(&root, &backing, &mnt, &cfg, &[]).unwrap();
    assert_eq!(wait_rings(&mnt)["mode"], "io_uring");
    fs::write(&cfg, "[mount]\nfuse_uring = \"auto\"\n").unwrap();
    let t0 = Instant::now();
    let args = ["--no-remote", "--config", c];
    let e = MountProcess::try_takeover(bin(), &backing, &mnt, &args, &root.join("takeover.log")).err().unwrap();
    assert!(e.contains("FUSE-over-io_uring") && e.contains("refused"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    fs::write(backing.join("h"), b"still").unwrap();
    assert_eq!(fs::read(m.m("h")).unwrap(), b"still");
    assert_eq!(fuse_stats(&mnt)["mode"], "io_uring");
    drop(m);
    // "auto" under --supervise: read loops, said in the log.
    let log = root.join("supervised.log");
    let args = ["--no-remote", "--config", c, "--supervise"];
    let s = MountProcess::try_start(bin(), &backing, &mnt, &args, &log).unwrap();
    assert_eq!(fs::read(s.m("h")).unwrap(), b"still");
    let f = fuse_stats(&mnt);
    assert_eq!(f["mode"], "read-loops", "{f}");
    assert!(s.log_text().contains("with --supervise: /dev/fuse read loops"), "{}", s.log_text());
    drop(s);
    fs::remove_dir_all(&root).unwrap();
}
