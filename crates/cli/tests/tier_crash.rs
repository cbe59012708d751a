//! The write-back tier against real crashes and real backing faults (issue 12).
//!
//! `acknowledged_writes_survive_sigkill` (and `..._with_an_ssd_tier`; `unsynced_writes_survive_sigkill_with_an_ssd_tier`:
//! the same with no fdatasync, a write acknowledged when it returns): writers write 4 KiB blocks through a real
//! `farcache mount --tier` (on tmpfs: it survives the daemon) and fdatasync each one, logging
//! what was acknowledged; the daemon is SIGKILLed at a random point; the mount is remounted
//! with the same tier (recovery writes everything back first) and every block must show its
//! last acknowledged write — or the write in flight at the kill — never an older one and never
//! a mix of two (each block carries one tag throughout). Half the cycles run with the
//! embedded lender in the stack, half without. Once, a mount without the tier must refuse the
//! dirty backing directory. At the end a clean unmount must leave the backing complete and
//! unmarked. `unsynced_writes_and_streams_past_an_ssd_tier_survive_sigkill`: the unsynced
//! case with writers that also sweep their files in order past a 64 KiB
//! `--tier-sequential-cutoff`, so that writes to the same blocks land in the tier and on the
//! disk by turns.
//!
//! `a_full_backing_keeps_the_data_dirty_and_the_mount_up`: the backing is a 1 MiB tmpfs; a
//! 3 MiB file written through the tier cannot be destaged (ENOSPC): the mount stays up, reads
//! see the data, `farcache stats` and `farcache flush` say why; once the backing grows, the
//! flush succeeds and the backing holds every byte.
//!
//! `a_stalled_backing_is_reported_and_loses_nothing`: the backing directory is an ext4 on a
//! loop device, and the kernel's blkio throttle lets the mount daemon write one request and
//! 4 KiB a second to it while the tier writes a 1 MiB file back: a disk that all but stopped.
//! The stall is logged, counted and named in `farcache stats` after `tier.stall_warning`; the
//! mount keeps serving the newest data from the tier and takes an fdatasync'd write; once the
//! throttle is lifted, the end of the stall is logged, a flush succeeds and the disk holds
//! the newest version of every file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farcache_testkit::{require_fuse, require_root, MountProcess, TierScratch};

const BLOCK: usize = 4096;
const BLOCKS: u64 = 64;
const WRITERS: usize = 4;
/// Kill cycles in CI; `FARCACHE_TIER_CRASH_CYCLES` overrides (`make test-long`: 1,000).
const CYCLES: usize = 20;

fn cycles() -> usize {
    std::env::var("FARCACHE_TIER_CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(CYCLES)
}

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

type Dirs = TierScratch;

fn dirs(name: &str) -> Dirs {
    TierScratch::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("tier-{name}"))
}

/// One block's contents: (writer, block, seq) repeated.
fn block_of(w: u32, b: u32, seq: u64) -> Vec<u8> {
    let mut rec = [0u8; 16];
    rec[..4].copy_from_slice(&w.to_le_bytes());
    rec[4..8].copy_from_slice(&b.to_le_bytes());
    rec[8..].copy_from_slice(&seq.to_le_bytes());
    rec.iter().copied().cycle().take(BLOCK).collect()
}

/// The seq a block carries (0 for zeros), or `None` if it mixes contents.
fn seq_of(data: &[u8], w: u32, b: u32) -> Option<u64> {
    if data.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let first = &data[..16];
    if !data.chunks(16).all(|c| c == first) {
        return None;
    }
    let (fw, fb) =
        (u32::from_le_bytes(first[..4].try_into().unwrap()), u32::from_le_bytes(first[4..8].try_into().unwrap()));
    (fw == w && fb == b).then(|| u64::from_le_bytes(first[8..].try_into().unwrap()))
}

#[derive(Default)]
struct Ledger {
    /// The last acknowledged seq of each block.
    acked: HashMap<u64, u64>,
    /// The write in flight (issued, not yet acknowledged), if any.
    in_flight: Option<(u64, u64)>,
}

fn mount_args(tier: &Path, with_lender: bool, streams: bool) -> Vec<String> {
    let mut a = vec!["--tier".into(), tier.display().to_string(), "--tier-size".into(), "32MiB".into()];
    if !with_lender {
        a.push("--no-remote".into());
    }
    if streams {
        // Runs of 16 blocks go to the disk: the writers' sweeps mix both.
        a.extend([String::from("--tier-sequential-cutoff"), String::from("64KiB")]);
    }
    a
}

fn start(d: &Dirs, cycle: usize, streams: bool) -> MountProcess {
    let args = mount_args(&d.tier, cycle % 2 == 1, streams);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sock = d.base.join("ctl");
    let mut all = args.clone();
    let s = sock.display().to_string();
    all.extend(["--control-socket", &s]);
    MountProcess::start(bin(), &d.base.join("b"), &d.base.join("m"), &all, &d.base.join(format!("log{cycle}")))
}

/// Every block of every writer's file, read through `m`, against the ledgers.
fn verify(m: &MountProcess, ledgers: &[Arc<Mutex<Ledger>>], when: &str) {
    for (w, l) in ledgers.iter().enumerate() {
        let data = std::fs::read(m.m(&format!("w{w}"))).unwrap();
        assert_eq!(data.len(), BLOCKS as usize * BLOCK, "{when}: file w{w} has the wrong size");
        let l = l.lock().unwrap();
        for b in 0..BLOCKS {
            let got = &data[b as usize * BLOCK..(b as usize + 1) * BLOCK];
            let seq = seq_of(got, w as u32, b as u32)
                .unwrap_or_else(|| panic!("{when}: block {b} of w{w} mixes contents:\n{}", m.log_text()));
            let acked = l.acked.get(&b).copied().unwrap_or(0);
            let flight = l.in_flight.filter(|(fb, _)| *fb == b).map(|(_, s)| s);
            assert!(
                seq == acked || Some(seq) == flight,
                "{when}: block {b} of w{w} shows write {seq}; acknowledged {acked}, in flight {flight:?}\n{}",
                m.log_text()
            );
        }
    }
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    // The tier on tmpfs (mode dram): survives the daemon.
    kill_cycles(dirs("crash"), cycles(), true, false);
}

#[test]
fn acknowledged_writes_survive_sigkill_with_an_ssd_tier() {
    // The tier on the disk file system of the target directory (mode ssd: O_DIRECT and
    // fdatasync), fewer cycles.
    let mut d = dirs("crash-ssd");
    d.tier = d.base.join("ssd.tier");
    kill_cycles(d, 6, true, false);
}

/// With `commit = "fsync"` (the default) an ssd tier acknowledges a write before its flush:
/// a write that returned, never synced, must survive the daemon all the same (it is in the
/// tier file, which the kernel holds).
#[test]
fn unsynced_writes_survive_sigkill_with_an_ssd_tier() {
    let mut d = dirs("crash-ssd-unsynced");
    d.tier = d.base.join("ssd.tier");
    kill_cycles(d, 6, false, false);
}

/// The same with writers that also sweep their file from start to end, and a cutoff of 64
/// KiB: a sweep's later writes go to the disk (`tier.sequential_cutoff`) over blocks whose
/// earlier writes may still be in the tier — recovery must never replay one of those over
/// a newer write that went to the disk.
#[test]
fn unsynced_writes_and_streams_past_an_ssd_tier_survive_sigkill() {
    let mut d = dirs("crash-ssd-streams");
    d.tier = d.base.join("ssd.tier");
    kill_cycles(d, 6, false, true);
}

/// `sync`: each write is followed by fdatasync (acknowledged once that returns); otherwise a
/// write is acknowledged once `write` returns. `streams`: the writers also sweep their files
/// in order, past a small sequential cutoff.
fn kill_cycles(d: Dirs, cycles: usize, sync: bool, streams: bool) {
    require_fuse();
    require_root("the tier crash test (FUSE mounts)");
    let t0 = Instant::now();
    for w in 0..WRITERS {
        File::create(d.base.join(format!("b/w{w}"))).unwrap().set_len(BLOCKS * BLOCK as u64).unwrap();
    }
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..WRITERS).map(|_| Arc::default()).collect();
    let mut rng = 0x5eed_u64 ^ u64::from(std::process::id()) << 16;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seq_base = 0u64;
    let mut acked_total = 0usize;
    let mut streamed = 0u64;
    for cycle in 0..cycles {
        let m = start(&d, cycle, streams);
        // What the previous run acknowledged is all there (recovery wrote it back).
        verify(&m, &ledgers, &format!("cycle {cycle}, after remount"));
        // The write in flight at the kill is now either there or not: settle it from what
        // the disk shows, so the next cycle's check is exact.
        for (w, l) in ledgers.iter().enumerate() {
            let mut l = l.lock().unwrap();
            if let Some((b, _)) = l.in_flight.take() {
                let data = std::fs::read(m.m(&format!("w{w}"))).unwrap();
                let s = seq_of(&data[b as usize * BLOCK..(b as usize + 1) * BLOCK], w as u32, b as u32).unwrap();
                l.acked.insert(b, s);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (w, l) in ledgers.iter().enumerate() {
            let (l, stop, path) = (l.clone(), stop.clone(), m.m(&format!("w{w}")));
            let base = seq_base + (w as u64) * 1_000_000;
            let mut x = next() | 1;
            handles.push(std::thread::spawn(move || {
                let Ok(f) = OpenOptions::new().read(true).write(true).open(&path) else { return 0 };
                let mut n = 0;
                let mut seq = base;
                // The next block of a sweep in progress.
                let mut sweep: Option<u64> = None;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if streams && sweep.is_none() && x % 8 == 0 {
                        sweep = Some(0);
                    }
                    let b = match sweep {
                        Some(b) => {
                            sweep = (b + 1 < BLOCKS).then_some(b + 1);
                            b
                        }
                        None => x % BLOCKS,
                    };
                    seq += 1;
                    l.lock().unwrap().in_flight = Some((b, seq));
                    let ok = f.write_all_at(&block_of(w as u32, b as u32, seq), b * BLOCK as u64).is_ok()
                        && (!sync || f.sync_data().is_ok());
                    if !ok {
                        break; // the daemon is gone: this write was never acknowledged
                    }
                    let mut g = l.lock().unwrap();
                    g.acked.insert(b, seq);
                    g.in_flight = None;
                    n += 1;
                }
                n
            }));
        }
        std::thread::sleep(Duration::from_millis(50 + next() % 250));
        if streams {
            let (mnt, sock) = (m.mnt().display().to_string(), d.base.join("ctl").display().to_string());
            let (ok, out) = farcache(&["stats", &mnt, "--control-socket", &sock, "--json"]);
            assert!(ok, "{out}");
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            streamed += v["tier"]["write_through_sequential"].as_u64().unwrap();
        }
        m.signal(libc::SIGKILL);
        m.wait_exit();
        stop.store(true, Ordering::Relaxed);
        let n: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        acked_total += n;
        seq_base += 10_000_000;
        drop(m); // unmounts the dead mount
        if cycle == 0 {
            // A mount without the tier must refuse the dirty backing directory.
            let r = MountProcess::try_start(
                bin(),
                &d.base.join("b"),
                &d.base.join("m"),
                &["--no-remote"],
                &d.base.join("refused"),
            );
            let e = r.err().expect("a mount without the tier must refuse a dirty backing directory");
            assert!(e.contains("--tier") && e.contains("fix:"), "{e}");
        }
    }
    // A clean unmount writes everything back and removes the marker.
    let m = start(&d, cycles, streams);
    verify(&m, &ledgers, "last remount");
    for (w, l) in ledgers.iter().enumerate() {
        let mut l = l.lock().unwrap();
        if let Some((b, _)) = l.in_flight.take() {
            let data = std::fs::read(m.m(&format!("w{w}"))).unwrap();
            let s = seq_of(&data[b as usize * BLOCK..(b as usize + 1) * BLOCK], w as u32, b as u32).unwrap();
            l.acked.insert(b, s);
        }
    }
    m.stop();
    assert!(
        farcache_engine::writeback::marker::read(&d.base.join("b")).unwrap().is_none(),
        "a clean unmount removes the marker"
    );
    for (w, l) in ledgers.iter().enumerate() {
        let data = std::fs::read(d.base.join(format!("b/w{w}"))).unwrap();
        let l = l.lock().unwrap();
        for b in 0..BLOCKS {
            let s = seq_of(&data[b as usize * BLOCK..(b as usize + 1) * BLOCK], w as u32, b as u32).unwrap();
            assert_eq!(s, l.acked.get(&b).copied().unwrap_or(0), "backing block {b} of w{w} after a clean unmount");
        }
    }
    assert!(acked_total >= cycles, "too few acknowledged writes to mean anything: {acked_total}");
    assert_eq!(streamed > 0, streams, "writes of sweeps sent past the tier: {streamed}");
    let mode = if d.tier.starts_with("/dev/shm") { "dram" } else { "ssd" };
    let log = std::fs::read_to_string(d.base.join(format!("log{cycles}"))).unwrap_or_default();
    assert!(
        log.contains(&format!("({mode}: a write acknowledged by it")),
        "the tier's mode is stated at start:\n{log}"
    );
    eprintln!(
        "{mode}{}{}: {cycles} kills, {acked_total} acknowledged writes, {streamed} past the tier, {:.1} s",
        if sync { "" } else { " (unsynced)" },
        if streams { " with streams" } else { "" },
        t0.elapsed().as_secs_f64()
    );
}

/// Run `farcache` with `args`; (success, stdout + stderr).
fn farcache(args: &[&str]) -> (bool, String) {
    let o = Command::new(bin()).args(args).output().unwrap();
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

struct Tmpfs(PathBuf);
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_backing_keeps_the_data_dirty_and_the_mount_up() {
    require_fuse();
    require_root("the backing-fault test (tmpfs mounts)");
    let d = dirs("enospc");
    let b = d.base.join("b");
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1M", "farcache-test"]).arg(&b).status().unwrap();
    assert!(ok.success(), "cannot mount a tmpfs for the backing");
    let _fs = Tmpfs(b.clone());
    let sock = d.base.join("ctl").display().to_string();
    let tier = d.tier.display().to_string();
    let args = ["--no-remote", "--tier", &tier, "--tier-size", "32MiB", "--control-socket", &sock];
    let m = MountProcess::start(bin(), &b, &d.base.join("m"), &args, &d.base.join("log"));
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    {
        let f = File::create(m.m("big")).unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_data().unwrap();
    }
    let mnt = m.mnt().display().to_string();
    let (ok, out) = farcache(&["flush", &mnt, "--control-socket", &sock, "--timeout", "20s"]);
    assert!(!ok && out.contains("No space left"), "a flush onto a full backing must fail and say why: {out}");
    let (_, stats) = farcache(&["stats", &mnt, "--control-socket", &sock, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let t = &v["tier"];
    assert!(t["destage_errors"].as_u64().unwrap() > 0, "{t}");
    assert!(t["last_destage_error"].as_str().unwrap().contains("No space left"), "{t}");
    assert!(t["dirty_bytes"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(std::fs::read(m.m("big")).unwrap(), data, "the mount still serves every byte");
    assert!(m.log_text().contains("destage failed"), "the log says so");
    // The backing grows: the next flush succeeds, and the disk has everything.
    let ok = Command::new("mount").args(["-o", "remount,size=16M"]).arg(&b).status().unwrap();
    assert!(ok.success());
    let (ok, out) = farcache(&["flush", &mnt, "--control-socket", &sock, "--timeout", "60s"]);
    assert!(ok, "{out}\n{}", m.log_text());
    assert_eq!(std::fs::read(b.join("big")).unwrap(), data);
    m.stop();
}

/// Run `f` on a thread and wait for it at most `bound`: an operation that waits on the
/// throttled backing fails the test with `what` instead of hanging it.
fn within<T: Send + 'static>(bound: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound).unwrap_or_else(|_| panic!("{what}: still waiting after {bound:?} (on the stalled backing?)"))
}

fn tier_stats(mnt: &str, sock: &str) -> serde_json::Value {
    let (ok, out) = farcache(&["stats", mnt, "--control-socket", sock, "--json"]);
    assert!(ok, "{out}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["tier"].clone()
}

/// `path` opened read-write with `O_DIRECT` (created if missing).
fn direct(path: &Path) -> File {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().read(true).write(true).create(true).custom_flags(libc::O_DIRECT).open(path).unwrap()
}

/// A buffer with `len` bytes from `seed` at a block-aligned range of it.
fn aligned(len: usize, seed: u64) -> (Vec<u8>, std::ops::Range<usize>) {
    let data = farcache_testkit::pattern(len, seed);
    let mut buf = vec![0u8; len + 4096];
    let off = buf.as_ptr().align_offset(4096);
    buf[off..off + len].copy_from_slice(&data);
    (buf, off..off + len)
}

#[test]
fn a_stalled_backing_is_reported_and_loses_nothing() {
    require_fuse();
    require_root("the stalled-backing test (a loop device, a blkio cgroup)");
    let d = dirs("stall");
    // The backing directory is an ext4 of its own on a loop device, so that the kernel can
    // throttle the daemon's writes to it alone.
    let disk = farcache_testkit::LoopFs::new(&d.base, "disk");
    let conf = d.base.join("stall.toml");
    std::fs::write(&conf, "[tier]\nstall_warning = \"1s\"\n").unwrap();
    let (sock, tier, c) =
        (d.base.join("ctl").display().to_string(), d.tier.display().to_string(), conf.display().to_string());
    let args = ["--no-remote", "--tier", &tier, "--tier-size", "32MiB", "--control-socket", &sock, "--config", &c];
    let m = MountProcess::start(bin(), &disk.dir, &d.base.join("m"), &args, &d.base.join("log"));
    let mnt = m.mnt().display().to_string();
    let _dog = farcache_testkit::Watchdog::start(m.mnt(), Duration::from_secs(180));
    let raw = disk.dir.clone();

    const A: usize = 1 << 20;
    const B: usize = 64 << 10;
    let fa = Arc::new(direct(&m.m("a")));
    let fb = Arc::new(direct(&m.m("b")));
    let (a1, ra) = aligned(A, 1);
    let (b1, rb) = aligned(B, 2);
    fa.write_all_at(&a1[ra.clone()], 0).unwrap();
    fb.write_all_at(&b1[rb.clone()], 0).unwrap();
    fa.sync_data().unwrap();
    let (ok, out) = farcache(&["flush", &mnt, "--control-socket", &sock, "--timeout", "30s"]);
    assert!(ok, "{out}");
    assert_eq!(std::fs::read(raw.join("a")).unwrap(), a1[ra.clone()], "the first version is on the disk");
    assert_eq!(std::fs::read(raw.join("b")).unwrap(), b1[rb.clone()], "the first version is on the disk");

    // New versions of both, acknowledged by the tier (the first fdatasync of a file the tier
    // meets anew goes to the disk too: its inode and size must be durable there for recovery
    // to find it); then the disk all but stops taking the daemon's writes: one request and
    // 4 KiB a second (the write-back of `a` is one 1 MiB write: minutes).
    let (a2, _) = aligned(A, 3);
    let (b2, _) = aligned(B, 4);
    fa.write_all_at(&a2[ra.clone()], 0).unwrap();
    fb.write_all_at(&b2[rb.clone()], 0).unwrap();
    fa.sync_data().unwrap();
    fb.sync_data().unwrap();
    let throttle = farcache_testkit::BlkioThrottle::new("stall", m.pid(), &disk.dev_numbers(), 1, 4096);
    // The idle mount starts writing `a` back (idle_destage_after, 2 s) and the round waits.
    let stalled = farcache_testkit::wait_until(Duration::from_secs(30), Duration::from_millis(200), || {
        tier_stats(&mnt, &sock)["destage_stalled_on"].as_str().is_some_and(|f| f.ends_with('a') || f.ends_with('b'))
    });
    let t = tier_stats(&mnt, &sock);
    assert!(stalled, "stats never reported the stall: {t}\n{}", m.log_text());
    assert_eq!(t["destage_stalls"], 1, "{t}");
    assert!(t["destage_round_ms"].as_u64().unwrap() >= 1000, "{t}");
    assert!(t["dirty_bytes"].as_u64().unwrap() >= (A + B) as u64, "{t}");
    assert!(m.log_text().contains("the write-back has waited"), "the log says so:\n{}", m.log_text());
    let (ok, text) = farcache(&["stats", &mnt, "--control-socket", &sock]);
    assert!(ok && text.contains("DESTAGE STALLED"), "{text}");

    // The mount stays up: the tier serves the newest `a`, and takes a third version of `b`.
    let f = fa.clone();
    let got = within(Duration::from_secs(20), "an O_DIRECT read of a file dirty in the tier", move || {
        let (mut buf, r) = aligned(A, 0);
        f.read_exact_at(&mut buf[r.clone()], 0).unwrap();
        buf[r].to_vec()
    });
    assert!(got == a2[ra.clone()], "a read during the stall returned something other than the newest data");
    let (b3, _) = aligned(B, 5);
    let (f, w) = (fb.clone(), b3[rb.clone()].to_vec());
    within(Duration::from_secs(20), "an O_DIRECT write to the tier", move || {
        let (mut buf, r) = aligned(B, 0);
        buf[r.clone()].copy_from_slice(&w);
        f.write_all_at(&buf[r], 0).unwrap();
    });
    let f = fb.clone();
    within(Duration::from_secs(20), "an fdatasync of that file", move || f.sync_data().unwrap());
    assert!(m.wait_exit_timeout(Duration::ZERO).is_none(), "the mount daemon exited:\n{}", m.log_text());
    let t = tier_stats(&mnt, &sock);
    assert!(t["destage_stalled_on"].as_str().is_some() && t["destage_stalls"] == 1, "still the one stall: {t}");

    // The disk takes writes again: the round ends, and a flush writes everything.
    throttle.set(0, 0);
    let moved = farcache_testkit::wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
        m.log_text().contains("moves again")
    });
    assert!(moved, "the end of the stall is not logged:\n{}", m.log_text());
    let (ok, out) = farcache(&["flush", &mnt, "--control-socket", &sock, "--timeout", "60s"]);
    assert!(ok, "{out}\n{}", m.log_text());
    let t = tier_stats(&mnt, &sock);
    assert!(t["destage_stalled_on"].is_null() && t["destage_stalls"] == 1 && t["dirty_bytes"] == 0, "{t}");
    drop((fa, fb));
    m.stop();
    drop(throttle);
    assert_eq!(std::fs::read(raw.join("a")).unwrap(), a2[ra], "the newest a is on the disk");
    assert_eq!(std::fs::read(raw.join("b")).unwrap(), b3[rb], "the newest b is on the disk");
}
