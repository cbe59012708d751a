//! The mount daemon's own resident memory under large writes, end to end with the real
//! binary and a real FUSE mount (root and FUSE needed): with the kernel's write-back cache
//! the kernel sends writes of up to `max_write` (1 MiB), and once every one of the 32 FUSE
//! threads has served such a write the daemon must not keep a megabyte per thread (plus an
//! aligned copy of each write in each thread's allocator heap) for good: that memory is
//! charged to the application's memory cgroup and taken from its page cache (BENCHMARKS.md,
//! session 14). Before the fix the daemon held 123 MiB of anonymous memory after this load
//! (9 MiB idle); after it, 4.5 MiB (2 MiB idle).

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use farcache_testkit::{require_root, text, DirectReader, MountProcess, Rng};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A `KEY:   N kB` line of a /proc file, in bytes.
fn kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
        * 1024
}

/// The daemon's anonymous resident memory that the kernel cannot take back without swap:
/// `RssAnon` less what was handed back with MADV_FREE (`LazyFree`).
fn held_anon(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rollup = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let (anon, lazy) = (kib(&status, "RssAnon:"), kib(&rollup, "LazyFree:"));
    (anon - lazy, anon)
}

/// A mount of a fresh backing directory under `root` with `config` (a `[mount]` table), no
/// lenders; `prepare` fills the backing directory first.
fn mount(root: &Path, config: &str, prepare: impl FnOnce(&Path)) -> (MountProcess, std::path::PathBuf) {
    let (backing, mnt) = (root.join("b"), root.join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    prepare(&backing);
    let cfg = root.join("farcache.toml");
    fs::write(&cfg, config).unwrap();
    let args = ["--no-remote", "--config", cfg.to_str().unwrap()];
    (MountProcess::start(bin(), &backing, &mnt, &args, &root.join("mount.log")), mnt)
}

const MIB: u64 = 1 << 20;

#[test]
fn large_writes_on_every_thread_leave_the_daemon_small() {
    require_root("the daemon memory test");
    let root = tempfile::tempdir().unwrap();
    let config = "[mount]\nthreads = 32\nwriteback_cache = true\ndirect_io_backing_writes = true\n";
    let (m, mnt) = mount(root.path(), config, |_| {});
    let backing = root.path().join("b");
    let pid = m.pid();
    let (idle, _) = held_anon(pid);

    // 16 writers, each 1 MiB writes into its own 16 MiB file, fsync every 4 MiB, for 4
    // seconds or 8 passes: the kernel flushes the dirty pages as 1 MiB WRITEs, spread by
    // the kernel over all the daemon's threads.
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..16u64 {
            let path = mnt.join(format!("f{w}"));
            s.spawn(move || {
                let f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o644).open(&path).unwrap();
                let chunk = vec![w as u8 + 1; MIB as usize];
                for pass in 0..8 {
                    for i in 0..16u64 {
                        f.write_all_at(&chunk, i * MIB).unwrap();
                        if i % 4 == 3 {
                            f.sync_all().unwrap();
                        }
                    }
                    if pass > 1 && started.elapsed() > Duration::from_secs(4) {
                        break;
                    }
                }
            });
        }
    });
    // Every byte arrived (the buffer's reused pages are not lost data).
    for w in 0..16u64 {
        let got = fs::read(backing.join(format!("f{w}"))).unwrap();
        assert_eq!(got.len() as u64, 16 * MIB);
        assert!(got.iter().all(|&b| b == w as u8 + 1), "file f{w} holds wrong bytes");
    }

    let writes = {
        let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // The daemon reports its own memory.
        let rss = v["memory"]["rss_bytes"].as_u64().unwrap_or_else(|| panic!("no memory.rss_bytes in {v:#}"));
        assert!(rss > MIB && v["memory"]["anon_bytes"].as_u64().unwrap() > 0, "{:#}", v["memory"]);
        v["fuse"]["ops"]["write"].as_u64().unwrap()
    };
    let (held, anon) = held_anon(pid);
    println!(
        "daemon anon: idle {:.1} MiB held; after {writes} WRITEs {:.1} MiB held, {:.1} MiB resident",
        idle as f64 / MIB as f64,
        held as f64 / MIB as f64,
        anon as f64 / MIB as f64
    );
    assert!(writes >= 200, "only {writes} WRITE requests: the load did not reach the daemon's threads");
    // Idle ~2 MiB; after the load ~4.5 MiB: 32 threads × (64 KiB kept of the request
    // buffer) + heap. The old code: 9-20 MiB idle, 80-123 MiB after this load.
    assert!(idle < 12 * MIB, "idle daemon holds {} MiB of anonymous memory", idle / MIB);
    assert!(held < 24 * MIB, "after large writes the daemon holds {} MiB of anonymous memory for good", held / MIB);
}

/// The same for reads: 32 readers of a 128 MiB file, each `O_DIRECT` reads of every size
/// from 4 KiB to 1 MiB at random places, for 3 seconds. Each read reaches the daemon as one
/// request and needs a buffer of its size; before the pool of read buffers
/// (`crates/engine/src/aligned.rs`) the allocator kept what each thread freed for up to a
/// second and the daemon held ~300 MiB of anonymous memory under this load (it was
/// OOM-killed under TPC-C in a 128 MiB cgroup); with it, ~40 MiB at the peak (the buffers of
/// 32 reads in flight and 16 MiB kept idle). Every read is checked, so a buffer reused while
/// still in use would show as wrong bytes.
#[test]
fn reads_of_every_size_on_every_thread_leave_the_daemon_small() {
    require_root("the daemon memory test");
    let root = tempfile::tempdir().unwrap();
    const FILE: u64 = 128 * MIB;
    // Each 8-byte word holds its own offset: any read can be checked.
    let word_at = |off: u64| off.to_le_bytes();
    let (m, mnt) = mount(root.path(), "[mount]\nthreads = 32\n", |backing| {
        let f = fs::File::create(backing.join("f")).unwrap();
        let chunk_words = MIB / 8;
        for c in 0..FILE / MIB {
            let buf: Vec<u8> = (0..chunk_words).flat_map(|i| word_at(c * MIB + i * 8)).collect();
            f.write_all_at(&buf, c * MIB).unwrap();
        }
        f.sync_all().unwrap();
    });
    let pid = m.pid();
    let reads = std::sync::atomic::AtomicU64::new(0);
    let mut peak = 0u64;
    std::thread::scope(|s| {
        for t in 0..32u64 {
            let (path, reads) = (mnt.join("f"), &reads);
            s.spawn(move || {
                let mut f = DirectReader::with_capacity(&path, MIB as usize);
                let mut rng = Rng::new(t + 1);
                let started = Instant::now();
                while started.elapsed() < Duration::from_secs(3) {
                    // 1 to 256 blocks, at an aligned place where they fit.
                    let blocks = rng.below(256) + 1;
                    let at = rng.below(FILE / 4096 - blocks + 1) * 4096;
                    let got = f.read_len(at, (blocks * 4096) as usize);
                    assert_eq!(got.len() as u64, blocks * 4096, "a short read at {at}");
                    for w in [0, blocks * 256, blocks * 512 - 1] {
                        let o = (w * 8) as usize;
                        assert_eq!(got[o..o + 8], word_at(at + o as u64), "read at {at}+{o}: wrong bytes");
                    }
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        // Watch the daemon while they read.
        let watched = Instant::now();
        while watched.elapsed() < Duration::from_millis(3200) {
            peak = peak.max(held_anon(pid).0);
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let out = farcache_testkit::run_bin(bin(), &["stats", mnt.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "farcache stats: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mem = &v["memory"];
    let field = |k: &str| mem[k].as_u64().unwrap_or_else(|| panic!("no memory.{k} in {mem:#}"));
    let reads = reads.into_inner();
    println!("{reads} reads; daemon anon held at the peak {:.1} MiB; pool {mem}", peak as f64 / MIB as f64);
    assert!(reads >= 500, "only {reads} reads: the load did not reach the daemon's threads");
    assert!(peak < 80 * MIB, "under reads of every size the daemon held {} MiB of anonymous memory", peak / MIB);
    // The pool served the reads: buffers came back and went out again, none is held now,
    // and it keeps no more than its bound idle.
    assert!(field("io_buffers_reused") > field("io_buffers_mapped"), "{mem:#}");
    assert_eq!(field("io_buffers_bytes"), 0, "no read is in flight: {mem:#}");
    assert!(field("io_buffers_idle_bytes") <= field("io_buffers_idle_max_bytes"), "{mem:#}");
    assert_eq!(field("io_buffers_idle_max_bytes"), 16 * MIB, "{mem:#}");
}
